#!/bin/bash
# usage: bash scripts/device/course.sh SECONDS NN_name.ipynb ...   (runs each notebook at full size until SECONDS
# have passed). On the lent GPU machine, from the repository root, with the wheelhouse in .whl/. One store over
# several calls: the last call's files are carried in from .run/ (copy the call's returned files there between
# calls); CARRY names which (default: all; CARRY=store.json keeps only the store, for a new run that reuses
# notebook 00's ceilings). 13_capstone_a/b are notebook 13 split in two by split13.py (this folder).
set -u
LIMIT=$1; shift
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 GPULAB_SCALE=full
export GPULAB_RESULTS=$OUT/store.json GPULAB_CHECKS=$OUT/checks.jsonl GPULAB_TIMINGS=$OUT/timings.tsv GPULAB_OUTPUTS=$OUT/outputs.jsonl
for f in ${CARRY:-store.json checks.jsonl timings.tsv outputs.jsonl log.txt env.txt}; do [ -f .run/$f ] && cp .run/$f $OUT/$f; done
python3 scripts/device/split13.py >> $OUT/log.txt
{ echo "=== call $(date -u)"; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv;
  python3 -c 'import torch; print(torch.__version__)'; } >> $OUT/env.txt
for nb in "$@"; do
  left=$((LIMIT - SECONDS))
  if [ $left -lt 20 ]; then echo "=== NOT RUN (time): $nb" >> $OUT/log.txt; continue; fi
  echo "=== $nb $(date -u +%T) (limit ${left}s)" >> $OUT/log.txt
  timeout $left python3 -m pytest -q -p no:cacheprovider --nbval-lax --nbval-current-env notebooks/$nb >> $OUT/log.txt 2>&1
  echo "=== $nb rc=$? $(date -u +%T)" >> $OUT/log.txt
done
tail -c 3000 $OUT/log.txt
