#!/usr/bin/env bash
# Device call (2026-12-03, tenth session): notebook 13 under the rtx4090 profile (00 first under the profile, in the
# same store) and, beside it, notebooks 00 then 15 at full size with no profile. The two lanes share the GPU:
# the full-size lane checks 15 runs at this code, its timings marked shared, not a clean reference.
set -u; t0=$(date +%s)
source .runs/head.sh e1
DL=$((t0 + ${BUDGET:-560}))
bash .runs/lane.sh h200-2026-12-03-e1-rtx4090 rtx4090 $DL 00 13 > $W/rtx4090-log.txt 2>&1 &
bash .runs/lane.sh h200-2026-12-03-e1-full full $DL 00 15 > $W/full-log.txt 2>&1 &
wait; echo "done $(date +%T)" >> $W/e1-header.txt
tar czf $OUT/e1.tar.gz -C $W .; tail -12 $W/rtx4090-log.txt $W/full-log.txt
