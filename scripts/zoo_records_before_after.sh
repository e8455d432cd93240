#!/bin/bash
# usage: bash scripts/zoo_records_before_after.sh REV OUT_DIR
# Every committed zoo records folder analysed on the CPU by the rules at REV (a git worktree) and at the working
# tree (no live confirmations: the verdicts as the rules give them), then the records whose verdicts differ.
set -eu
REV=$1 OUT=$(realpath -m "$2"); ROOT=$(cd "$(dirname "$0")/.." && pwd); PY=${PYTHON:-python}
mkdir -p "$OUT"; W=$(mktemp -d); git -C "$ROOT" worktree add -f -q "$W/rev" "$REV"
for R in $(cd "$ROOT" && ls -d results/zoo/*/records*); do
  t=$(echo "$R" | tr '/' '_')
  # the older rules through scripts/zoo_frozen_records.py: inputs a newer record carries that REV's analyze does not
  # take are dropped and named in the log
  (cd /tmp && PYTHONPATH="$W/rev" $PY "$ROOT/scripts/zoo_frozen_records.py" "$ROOT/$R" --out "$OUT/before-$t.json") \
    > "$OUT/log-$t.txt" 2>&1
  (cd /tmp && PYTHONPATH="$ROOT" $PY -m gpulab.diagnose.zoo records "$ROOT/$R" --out "$OUT/after-$t.json") >> "$OUT/log-$t.txt" 2>&1
done
git -C "$ROOT" worktree remove --force "$W/rev"
$PY - "$OUT" <<'PY'
import glob, json, sys
n = changed = 0
for b in sorted(glob.glob(sys.argv[1] + "/before-*.json")):
    B = {s["name"]: s for s in json.load(open(b))["steps"]}
    A = {s["name"]: s for s in json.load(open(b.replace("/before-", "/after-")))["steps"]}
    for k in B:
        n += 1
        fb = [(v["rule"], round(v.get("expected_gain") or 0, 3)) for v in B[k].get("verdicts", [])]
        fa = [(v["rule"], round(v.get("expected_gain") or 0, 3)) for v in A[k].get("verdicts", [])]
        if fb != fa:
            changed += 1
            print(b.split("/before-")[1][:-5], k, "\n  before", fb, "\n  after ", fa)
print(f"{changed} of {n} records change")
PY
