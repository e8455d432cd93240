#!/bin/bash
# Issue 25: learner alone, then 7 at once under h200-1g, notebooks 08,03 at full size; nvidia-smi every 5 s.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
rm -rf /tmp/r6; mkdir -p /tmp/r6
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,mig.mode.current,compute_mode --format=csv; date -u; } > /tmp/r6/gpu.txt 2>&1
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw,clocks.sm --format=csv -l 5 > /tmp/r6/smi.csv 2>&1 &
S=$!
L=$(( 330 - ($(date +%s) - T0) ))
timeout $L python3 -m gpulab.tools.roomrun --learners 7 --profile h200-1g --notebooks 08,03 --scale full --out /tmp/r6 --timeout $(((L-15)/2)) > /tmp/r6/roomrun.log 2>&1
echo "rc=$? $(date -u +%T)" >> /tmp/r6/gpu.txt
kill $S
python3 -m gpulab.tools.roomrun --summarize-only --out /tmp/r6 >> /tmp/r6/roomrun.log 2>&1
tar -cf $OUT/r6.tar -C /tmp r6
tail -25 /tmp/r6/roomrun.log; cat /tmp/r6/gpu.txt
