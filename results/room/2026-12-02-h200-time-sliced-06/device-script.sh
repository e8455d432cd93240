#!/bin/bash
# Next session (issue 25): one learner alone, then seven at once under h200-1g, notebook 06 at full size; nvidia-smi every 5 s.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
rm -rf /tmp/r8; mkdir -p /tmp/r8
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,mig.mode.current,compute_mode --format=csv; date -u; } > /tmp/r8/gpu.txt 2>&1
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw,clocks.sm --format=csv -l 5 > /tmp/r8/smi.csv 2>&1 &
S=$!
L=$(( 575 - ($(date +%s) - T0) ))
timeout $L python3 -m gpulab.tools.roomrun --learners 7 --profile h200-1g --notebooks 06 --scale full --out /tmp/r8 --timeout $(((L-15)/2)) > /tmp/r8/roomrun.log 2>&1
echo "rc=$? $(date -u +%T)" >> /tmp/r8/gpu.txt
kill $S
python3 -m gpulab.tools.roomrun --summarize-only --out /tmp/r8 >> /tmp/r8/roomrun.log 2>&1
tar -cf $OUT/r8.tar -C /tmp r8
tail -12 /tmp/r8/roomrun.log; cat /tmp/r8/gpu.txt
