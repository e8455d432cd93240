#!/bin/bash
# Next session (issue 25): a room under MPS. bash .runs/room-mps.sh 06  (then 07): one learner alone, then seven at
# once under h200-1g, each an MPS client at 13 % of the SMs; nvidia-smi every 5 s; everything back in one tarball.
set -u
NB=${1:-06}; T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
R=/tmp/room-$NB; rm -rf $R; mkdir -p $R
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,mig.mode.current,compute_mode --format=csv; date -u
  cat .runs/commit.txt; which nvidia-cuda-mps-control nvidia-cuda-mps-server; } > $R/gpu.txt 2>&1
if ! which nvidia-cuda-mps-control >/dev/null 2>&1 && [ -z "${NOMPS_OK:-}" ]; then
  echo "no nvidia-cuda-mps-control on PATH; stopping before the room"; ls /usr/bin | grep -i nvidia; cat $R/gpu.txt; exit 3; fi
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw,clocks.sm --format=csv -l 5 > $R/smi.csv 2>&1 &
S=$!
L=$(( 235 - ($(date +%s) - T0) ))
timeout $L python3 -m gpulab.tools.roomrun --learners 7 --profile h200-1g --notebooks $NB --scale full --mps --out $R --timeout $(((L-20)/2)) > $R/roomrun.log 2>&1
echo "rc=$? $(date -u +%T)" >> $R/gpu.txt
kill $S; nvidia-smi >> $R/gpu.txt 2>&1
python3 -m gpulab.tools.roomrun --summarize-only --out $R >> $R/roomrun.log 2>&1
tar -czf $OUT/room-$NB.tar.gz -C /tmp room-$NB
tail -25 $R/roomrun.log; cat $R/gpu.txt | head -20
