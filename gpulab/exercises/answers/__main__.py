"""Run every reference answer here and write what each measured and whether its claim held (issue 39, item 6):

    python -m gpulab.exercises.answers --scale full --out answers.json [--notebooks 04,05] [--deadline 300]

One JSON record per answer: notebook, number, seconds, the measurement, "held" (the claim held), "failed" (why it
did not, or the GPU memory it kept), "skipped" (why it could not run here) or "error" (the exception). An answer not begun by the deadline is
listed as not run. The exit status is 1 when a claim failed or an answer raised.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback

from gpulab.core.memory import memory_guard
from gpulab.core.results import FILE_KINDS
from gpulab.exercises.answers import answers


def _plain(v):
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return str(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", default="full")
    ap.add_argument("--out", required=True)
    ap.add_argument("--notebooks", default=",".join(f"{i:02d}" for i in range(16)))
    ap.add_argument("--deadline", type=float, default=float("inf"), help="seconds: answers not begun by then are not run")
    args = ap.parse_args(argv)
    start, records, bad = time.monotonic(), [], 0
    for nb in args.notebooks.split(","):
        try:
            found = answers(nb)
        except ValueError as err:
            records.append({"notebook": nb, "skipped": str(err)})
            continue
        for n, a in sorted(found.items()):
            rec: dict = {"notebook": nb, "number": n}
            if time.monotonic() - start > args.deadline:
                rec["skipped"] = f"not begun within the {args.deadline:g} s deadline"
            elif a.run is None:
                rec["skipped"] = "answered in prose only"
            elif a.missing():
                rec["skipped"] = a.missing()
            else:
                t0 = time.monotonic()
                try:
                    with memory_guard(quiet=True) as mem:          # GPU memory returns to where it was
                        found_ = a.run(args.scale)
                    if mem.leaked:
                        rec["leaked_bytes"] = mem.leaked
                    if not mem.ok:
                        rec["failed"] = f"kept {mem.leaked / 2**20:.1f} MiB of GPU memory after its run"
                        bad += 1
                    rec["measured"] = _plain(found_)
                    why = a.expect(found_) if a.expect is not None else None
                    rec["held"] = why is None
                    if why is not None:
                        rec["failed"] = why + ("; " + rec["failed"] if "failed" in rec else "")
                        bad += 1
                except Exception as err:                      # noqa: BLE001 -- recorded, the next answer runs
                    rec["error"] = f"{type(err).__name__}: {err}"
                    rec["traceback"] = traceback.format_exc(limit=6)
                    bad += 1
                rec["seconds"] = round(time.monotonic() - t0, 2)
            records.append(rec)
            state = ("held" if rec.get("held") and "failed" not in rec else "FAILED: " + rec["failed"] if "failed" in rec
                     else "ERROR: " + rec["error"] if "error" in rec else "skipped: " + rec.get("skipped", ""))
            print(f"{nb}.{n}: {state} ({rec.get('seconds', 0)} s)", flush=True)
            with open(args.out, "w", encoding="utf-8") as f:
                json.dump({"kind": FILE_KINDS["answers"], "scale": args.scale, "answers": records}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
