#!/bin/bash
# Call 2: zoo steps h1 did not reach (run H), records; then the room (issue 25) with the time left: 7 learners under h200-1g, notebooks 00,01,04.
set -u
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache
mkdir -p /tmp/H/logs /tmp/H/rec
MISSING=$(python3 - <<'P'
import json, pathlib
from gpulab.diagnose.zoo import step_files, load
p = pathlib.Path("/tmp/H/diag.json")
done = {r["name"] for r in json.loads(p.read_text())["steps"] if "error" not in r} if p.exists() else set()
print(",".join(f.stem for f in step_files() if f.stem not in done and getattr(load(f), "NEEDS_GPUS", 1) == 1))
P
)
echo "missing: $MISSING" > $OUT/h2-log.txt
if [ -n "$MISSING" ]; then
  GPULAB_RESULTS=/tmp/gpulab-results.json timeout 200 python3 -m gpulab.diagnose.zoo diagnose --own-process --only "$MISSING" --out /tmp/H/diag-2.json --records /tmp/H/rec --window 0.8 > /tmp/H/logs/diagnose-2.log 2>&1
  echo "diag-2 rc=$? $(date -u +%T)" >> $OUT/h2-log.txt; cp /tmp/H/diag-2.json $OUT/ 2>/dev/null; cp /tmp/H/diag.json $OUT/diag-1.json 2>/dev/null
fi
tar -cf /tmp/H/rec.tar -C /tmp/H rec logs && split -b 15M /tmp/H/rec.tar $OUT/records.tar.
L=$(( 580 - ($(date +%s) - T0) ))
echo "room timeout $L $(date -u +%T)" >> $OUT/h2-log.txt
rm -rf /tmp/r1; mkdir -p /tmp/r1
{ nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit,mig.mode.current --format=csv; date -u; } > /tmp/r1/gpu.txt 2>&1
timeout $L python3 -m gpulab.tools.roomrun --learners 7 --profile h200-1g --notebooks 00,01,04 --scale full --out /tmp/r1 --timeout $(((L-20)/2)) > /tmp/r1/roomrun.log 2>&1
echo "rc=$? $(date -u +%T)" >> /tmp/r1/gpu.txt
python3 -m gpulab.tools.roomrun --summarize-only --out /tmp/r1 >> /tmp/r1/roomrun.log 2>&1
tar -cf $OUT/r1.tar -C /tmp r1
cat $OUT/h2-log.txt; tail -30 /tmp/r1/roomrun.log; cat /tmp/r1/gpu.txt
