#!/bin/bash
# usage: bash scripts/device/zoo.sh SECONDS SPEC [SPEC ...]      (issue 41's zoo on the lent GPU, zoo/README.md)
# On the lent GPU machine, from the repository root, with the wheelhouse in .whl/. Each SPEC is one of
#   label:K/N          python -m gpulab.diagnose.zoo label --settle --checks <the CPU fix checks> --group K/N
#   diagnose:K/N       python -m gpulab.diagnose.zoo diagnose --own-process --records records --group K/N
#   label-only:a,b     label, only those steps;  diagnose-only:a,b   diagnose, only those steps
# run in order until SECONDS have passed (a SPEC that would start with under 60 s left is not run, and said so).
# Everything lands in $OUT/zoo.tgz (a call returns at most eight files): labels-*.json, diagnoses-*.json,
# records/, log.txt, env.txt. Each command writes its file after every step, so a SPEC cut by its timeout keeps
# what it finished; run the steps it did not reach again with label-only / diagnose-only.
set -u
LIMIT=$1; shift
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
C=results/zoo/2026-12-01-cpu-fix-checks/checks-cpu.json,results/zoo/2026-12-06-cpu-generic-fix-checks/checks-cpu.json,results/zoo/2026-12-07-cpu-fix-checks/checks-cpu.json,results/zoo/2026-12-07-cpu-fix-checks-b/checks-cpu.json,results/zoo/2026-12-07-cpu-fix-checks-c/checks-cpu.json
W=/tmp/zoo; rm -rf $W; mkdir -p $W/records
{ echo "=== call $(date -u)"; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv;
  python3 -c 'import torch; print(torch.__version__)'; git log -1 --format='commit %h' 2>/dev/null; } >> $W/env.txt
for spec in "$@"; do
  kind=${spec%%:*} arg=${spec#*:} tag=$(echo "${spec#*:}" | tr '/,' '-_' | cut -c1-40)-$(date +%H%M%S)
  left=$((LIMIT - SECONDS - 10))
  if [ $left -lt 60 ]; then echo "=== NOT RUN (time): $spec" >> $W/log.txt; continue; fi
  case $kind in
    label)         cmd="label --settle --checks $C --group $arg --out $W/labels-$tag.json";;
    label-only)    cmd="label --settle --checks $C --only $arg --out $W/labels-only-$tag.json";;
    diagnose)      cmd="diagnose --own-process --records $W/records --group $arg --out $W/diagnoses-$tag.json";;
    diagnose-only) cmd="diagnose --own-process --records $W/records --only $arg --out $W/diagnoses-only-$tag.json";;
    *) echo "=== unknown spec: $spec (label:K/N, diagnose:K/N, label-only:a,b, diagnose-only:a,b)" >> $W/log.txt; continue;;
  esac
  echo "=== $spec $(date -u +%T) (limit ${left}s): $cmd" >> $W/log.txt
  timeout $left python3 -m gpulab.diagnose.zoo $cmd >> $W/log.txt 2>&1
  echo "=== $spec rc=$? $(date -u +%T)" >> $W/log.txt
done
tar czf $OUT/zoo.tgz -C $W .
tail -c 3000 $W/log.txt
