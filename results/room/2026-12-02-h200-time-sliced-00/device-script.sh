#!/bin/bash
# Next session (issue 25): seven learners at once under h200-1g, notebook 00 at full size (alone: results/h200-2026-12-02-room-a, same notebook code); nvidia-smi every 5 s.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
rm -rf /tmp/r7; mkdir -p /tmp/r7
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,mig.mode.current,compute_mode --format=csv; date -u; } > /tmp/r7/gpu.txt 2>&1
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw,clocks.sm --format=csv -l 5 > /tmp/r7/smi.csv 2>&1 &
S=$!
L=$(( 575 - ($(date +%s) - T0) ))
timeout $L python3 -m gpulab.tools.roomrun --learners 7 --profile h200-1g --notebooks 00 --scale full --out /tmp/r7 --no-alone --timeout $((L-15)) > /tmp/r7/roomrun.log 2>&1
echo "rc=$? $(date -u +%T)" >> /tmp/r7/gpu.txt
kill $S
python3 -m gpulab.tools.roomrun --summarize-only --out /tmp/r7 >> /tmp/r7/roomrun.log 2>&1
tar -cf $OUT/r7.tar -C /tmp r7
tail -12 /tmp/r7/roomrun.log; cat /tmp/r7/gpu.txt
