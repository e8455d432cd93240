"""Which committed zoo records the periodic_stall bound (rules.periodic_stall, StallFacts.every_chunk) changes.

    python scripts/zoo_stall_bound_on_records.py

The records predate `every_chunk`; it is derived here from their host steps in chunks of `diagnose`'s default
`steps` (5), the first chunk benchmark's probe, as `core.stall_facts` derives it, and each record is analysed by
these rules with and without it. Prints one line per record whose verdicts change, then the count."""
import gzip
import inspect
import json
import sys
import tempfile
from pathlib import Path

from gpulab.diagnose.core import diagnose, from_record, open_record, stall_facts

ROOT = Path(__file__).resolve().parents[1]
STEPS = inspect.signature(diagnose).parameters["steps"].default


def main() -> int:
    paths = sorted({p.resolve() for p in (ROOT / "results" / "zoo").rglob("*.json.[gx]z")})
    seen = changed = 0
    for p in paths:
        with open_record(p) as f:
            data = json.load(f)
        if not data.get("stalls"):
            continue
        seen += 1
        per = data["stalls"]["step_ms"]
        chunks_steps = [per[i:i + STEPS] for i in range(0, len(per), STEPS)]
        s = stall_facts(chunks_steps, [sum(c) / len(c) for c in chunks_steps[1:]])
        data["stalls"]["every_chunk"] = bool(s and s.every_chunk)
        with tempfile.TemporaryDirectory() as tmp:
            again = Path(tmp) / "r.json.gz"
            with gzip.open(again, "wt") as f:
                json.dump(data, f)
            before, after = from_record(str(p)), from_record(str(again))
        a = [(v.rule, round(v.share, 3)) for v in before.verdicts]
        b = [(v.rule, round(v.share, 3)) for v in after.verdicts]
        if a != b:
            changed += 1
            print(f"{p.relative_to(ROOT)}: every_chunk {data['stalls']['every_chunk']}; {a} -> {b}")
    print(f"{changed} of {seen} records with timed steps change (chunks of {STEPS})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
