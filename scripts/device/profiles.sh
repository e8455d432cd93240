#!/bin/bash
# usage: bash scripts/device/profiles.sh SECONDS PROFILE:NN,NN,... PROFILE:NN,...    one lane per argument, all at once on one GPU;
# each lane runs its notebooks in order in one store (put 00 first in a lane to size the rest from its ceilings).
# Everything a lane writes goes into $OUT/lanes.tgz (a call returns at most eight files).
set -u
LIMIT=$1; shift
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 GPULAB_SCALE=full
W=/tmp/lanes; rm -rf $W; mkdir -p $W
python3 scripts/device/split13.py > $W/split13.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv; python3 -c 'import torch; print(torch.__version__)'; } > $W/env.txt
lane() {
  local prof=${1%%:*} list=${1#*:} n=$2
  for nn in ${list//,/ }; do
    case $nn in 13a) nb=notebooks/13_capstone_a.ipynb;; 13b) nb=notebooks/13_capstone_b.ipynb;; 13) nb=notebooks/13_capstone.ipynb;;
      *) nb=$(ls notebooks/${nn}_*.ipynb);; esac
    left=$((LIMIT - SECONDS)); if [ $left -lt 20 ]; then echo "$prof $nb NOT RUN (time)" >> $W/lanes.txt; continue; fi
    GPULAB_PROFILE=$prof GPULAB_RESULTS=$W/$prof-$n.json GPULAB_CHECKS=$W/$prof-$n-checks.jsonl \
    GPULAB_TIMINGS=$W/$prof-$n-timings.tsv GPULAB_OUTPUTS=$W/$prof-$n-outputs.jsonl \
      timeout $left python3 -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env $nb > $W/$prof-$n-$nn.log 2>&1
    echo "$prof $nb rc=$? $(tail -1 $W/$prof-$n-$nn.log)" >> $W/lanes.txt
  done
}
i=0; for spec in "$@"; do i=$((i+1)); lane $spec $i & done; wait
tar czf $OUT/lanes.tgz -C $W . ; cat $W/lanes.txt
