#!/usr/bin/env bash
# lane.sh NAME PROFILE DEADLINE NB... : run notebooks one pytest each into the store $W/NAME.json, under
# GPULAB_PROFILE=PROFILE ("full" = none), skipping a notebook whose estimated time no longer fits before DEADLINE
# (epoch seconds). Appends "done NB" / "left NB" lines to $W/NAME-done.txt.
set -u
name=$1 prof=$2 deadline=$3; shift 3
declare -A est=([00]=40 [01]=30 [02]=32 [03]=60 [04]=18 [05]=25 [06]=58 [07]=110 [08]=24 [09]=45 [10]=46 [11]=45 [12]=26 [13]=300 [14]=80 [15]=20)
[ "$prof" = full ] && p="" || p=$prof
for nb in "$@"; do
  left=$((deadline - $(date +%s)))
  need=${est[$nb]}; [ -n "$p" ] && need=$((need * ${SLOW:-1}))
  if [ $left -lt $need ]; then echo "== $name $nb not started: $left s left, needs ~$need"; echo "left $nb" >> $W/$name-done.txt; continue; fi
  echo "== $name $nb $(date +%T) left $left"
  GPULAB_PROFILE=$p GPULAB_SCALE=full GPULAB_RESULTS=$W/$name.json GPULAB_CHECKS=$W/$name-checks.jsonl \
    GPULAB_TIMINGS=$W/$name-timings.tsv GPULAB_OUTPUTS=$W/$name-outputs.jsonl \
    timeout $left ${PYTEST:-python3 -m pytest} -q -p no:cacheprovider --nbval-lax --nbval-current-env notebooks/${nb}_*.ipynb 2>&1 | tail -${TAILN:-6}
  rc=${PIPESTATUS[0]}
  echo "rc=$rc $(date +%T)"
  [ $rc = 0 ] && echo "done $nb" >> $W/$name-done.txt || echo "rc$rc $nb" >> $W/$name-done.txt
done
