#!/bin/bash
# Next session (issues 24, 25): notebooks 09-15 under h200-1g alone, then 11, 12, 14, 15 under v100 and rtx4090 one profile at a time.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
mkdir -p /tmp/Q
run() {  # tag profile notebook
  L=$(( 370 - ($(date +%s) - T0) )); if [ $L -lt 30 ]; then echo "not run (time): $1 $3" >> /tmp/Q/log.txt; return; fi
  echo "== $1 $3 $(date -u +%T) left $L" >> /tmp/Q/log.txt
  GPULAB_SCALE=full GPULAB_PROFILE=$2 GPULAB_RESULTS=/tmp/Q/$1-store.json GPULAB_CHECKS=/tmp/Q/$1-checks.jsonl GPULAB_TIMINGS=/tmp/Q/$1-timings.tsv \
    timeout $L python3 -m pytest --nbval-lax --nbval-current-env -p no:cacheprovider -q notebooks/$3* > /tmp/Q/nb-$1-$3.txt 2>&1
  echo "rc=$? $(date -u +%T)" >> /tmp/Q/log.txt; tail -2 /tmp/Q/nb-$1-$3.txt >> /tmp/Q/log.txt
}
for nb in 09 10 11 12 13 14 15; do run h200-1g h200-1g $nb; done
for nb in 11 12 15 14 09; do run v100 v100 $nb; run rtx4090 rtx4090 $nb; done
tar -cf $OUT/q.tar -C /tmp Q
grep -v "^$" /tmp/Q/log.txt | tail -40
