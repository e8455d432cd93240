"""Where a course run's time went: `python -m gpulab.tools.coursetime TIMINGS_FILE`.

Reads the file that `GPULAB_TIMINGS=path pytest ...` writes (the root conftest.py appends one line
per test as it finishes: seconds, test id, outcome, and the clock at its end, after a "start" line
for the session) and prints per notebook (nbval: one test per cell) and per unit-test file the sum
of its tests' seconds and its wall time (from the end of the file before it to the end of its last
test: kernel start-up and set-up included), the slowest cells, and the totals. A run stopped by a
time limit still leaves every line up to the cell it was in. Lines without a clock (older files)
give sums only.

`--predict RESULTS.json` also prints, per notebook, the time `gpulab.core.predict` predicted from the
lesson's plan and the ceilings notebook 00 recorded in that store (the same run's), and the error.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NamedTuple


class Row(NamedTuple):
    seconds: float
    nodeid: str
    outcome: str
    clock: float | None = None


class FileTime(NamedTuple):
    seconds: float              # sum of its tests' call times
    tests: int
    failed: int
    wall: float | None          # clock span, kernel start-up and set-up included (None: no clocks)


def read(path: str | Path) -> list[Row]:
    """One Row per line (the session's "start" line included); malformed lines are skipped."""
    rows = []
    for line in Path(path).read_text().splitlines():
        parts = line.split("\t")
        if len(parts) not in (3, 4):
            continue
        try:
            rows.append(Row(float(parts[0]), parts[1], parts[2], float(parts[3]) if len(parts) == 4 else None))
        except ValueError:
            continue
    return rows


def per_file(rows: list[Row]) -> dict[str, FileTime]:
    """File (notebook or test module) -> FileTime, in the order first seen."""
    out: dict[str, list] = {}
    last_clock = None                        # end of the previous test (or the session's start)
    for r in rows:
        if r.outcome == "start":
            last_clock = r.clock
            continue
        name = r.nodeid.split("::", 1)[0]
        entry = out.setdefault(name, [0.0, 0, 0, 0.0])
        entry[0] += r.seconds
        entry[1] += 1
        entry[2] += r.outcome == "failed"
        if entry[3] is not None and r.clock is not None and last_clock is not None:
            entry[3] += r.clock - last_clock
        else:
            entry[3] = None
        last_clock = r.clock
    return {k: FileTime(*v) for k, v in out.items()}


def store_rates(path: str) -> dict[str, float]:
    """Ceiling name -> the newest full-size value notebook 00 recorded in the store at `path`."""
    from gpulab.core.ceilings import CEILING_NAMES
    from gpulab.core.results import read_records

    rates: dict[str, float] = {}
    for r in read_records(path):
        if r.lesson == "00" and r.name in CEILING_NAMES and r.value > 0 and r.scale == "full":
            rates[r.name] = r.value
    return rates


def print_predictions(files: dict[str, FileTime], results: str, scale: str, exercises: bool = True) -> list[tuple]:
    """Per notebook: measured wall, predicted (host + GPU work), and the error; returns the rows. `exercises`:
    the run had the graded exercises (`EXERCISE_S`; the course has them since 2026-12-04)."""
    import re
    from gpulab.core.predict import EXERCISE_S, predict
    from gpulab.notebook.lesson import lesson_module

    rates = store_rates(results)
    rows = []
    print(f"{'notebook':<44}  {'wall s':>7}  {'pred s':>7}  {'gpu s':>6}  {'host s':>6}  error")
    parts: dict[str, list[str]] = {}        # a notebook run in parts (13_capstone_a, _b: a call's time limit) is one
    for name in files:
        m = re.search(r"notebooks/(\d\d)_", name)
        parts.setdefault(m.group(1) if m else name, []).append(name)
    for names in parts.values():
        name = names[0] if len(names) == 1 else " + ".join(names)
        walls = [files[n].wall for n in names]
        t = FileTime(sum(files[n].seconds for n in names), sum(files[n].tests for n in names),
                     sum(files[n].failed for n in names), None if None in walls else sum(walls))
        m = re.search(r"notebooks/(\d\d)_", names[0])
        plan = getattr(lesson_module(m.group(1)), "plan", None) if m else None
        if plan is None or t.wall is None:
            continue
        pred = predict(plan(scale), rates, exercise_s=EXERCISE_S.get(m.group(1), 0.0) if exercises else 0.0)
        if pred.seconds is None:
            print(f"{name:<44}  {t.wall:7.1f}  missing ceilings: {', '.join(pred.missing)}")
            continue
        err = pred.seconds / t.wall - 1
        rows.append((name, t.wall, pred.seconds, pred.gpu_s, pred.host_s, err))
        print(f"{name:<44}  {t.wall:7.1f}  {pred.seconds:7.1f}  {pred.gpu_s:6.1f}  {pred.host_s:6.1f}  {err:+6.0%}")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpulab.tools.coursetime", description=__doc__.splitlines()[0])
    p.add_argument("timings", help="the file GPULAB_TIMINGS pointed to")
    p.add_argument("--slowest", type=int, default=10, help="how many of the slowest cells to list")
    p.add_argument("--predict", metavar="RESULTS_JSON",
                   help="compare each notebook's wall time with its plan's prediction at the ceilings in this store")
    p.add_argument("--scale", default="full", help="the scale the plans are read at (default: full)")
    p.add_argument("--no-exercises", action="store_true",
                   help="a run from before the graded exercises (2026-12-04): predict without their seconds")
    a = p.parse_args(argv)
    try:
        rows = read(a.timings)
    except OSError as err:
        print(f"gpulab.tools.coursetime: cannot read {a.timings}: {err}", file=sys.stderr)
        return 2
    tests = [r for r in rows if r.outcome != "start"]
    if not tests:
        print(f"gpulab.tools.coursetime: no timings in {a.timings}", file=sys.stderr)
        return 2
    files = per_file(rows)
    width = max(len(k) for k in files)

    def wall(v: float | None) -> str:
        return "      -" if v is None else f"{v:7.1f}"

    print(f"{'file':<{width}}  {'tests s':>7}  {'wall s':>7}  tests")
    for name, t in files.items():
        print(f"{name:<{width}}  {t.seconds:7.1f}  {wall(t.wall)}  {t.tests:5d}"
              + (f"  {t.failed} FAILED" if t.failed else ""))
    walls = [t.wall for t in files.values()]
    print(f"{'total':<{width}}  {sum(t.seconds for t in files.values()):7.1f}  "
          f"{wall(None if None in walls else sum(walls))}  {len(tests):5d}")
    if a.predict:
        print()
        print_predictions(files, a.predict, a.scale, exercises=not a.no_exercises)
    print(f"\nslowest {a.slowest}:")
    for r in sorted(tests, key=lambda r: r.seconds, reverse=True)[:a.slowest]:
        print(f"  {r.seconds:7.1f} s  {r.nodeid}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
