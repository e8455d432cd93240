#!/bin/bash
# Issue 25: 7 learners at once under h200-1g (no alone run: call h2 has it, same code), notebooks 01,04 at full size; nvidia-smi sampled every 5 s.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
rm -rf /tmp/r4; mkdir -p /tmp/r4
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,mig.mode.current,compute_mode --format=csv; date -u; } > /tmp/r4/gpu.txt 2>&1
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw,clocks.sm --format=csv -l 5 > /tmp/r4/smi.csv 2>&1 &
S=$!
L=$(( 560 - ($(date +%s) - T0) ))
timeout $L python3 -m gpulab.tools.roomrun --learners 7 --profile h200-1g --notebooks 01,04 --scale full --out /tmp/r4 --no-alone --timeout $((L-15)) > /tmp/r4/roomrun.log 2>&1
echo "rc=$? $(date -u +%T)" >> /tmp/r4/gpu.txt
kill $S
python3 -m gpulab.tools.roomrun --summarize-only --out /tmp/r4 >> /tmp/r4/roomrun.log 2>&1
tar -cf $OUT/r4.tar -C /tmp r4
tail -25 /tmp/r4/roomrun.log; cat /tmp/r4/gpu.txt
