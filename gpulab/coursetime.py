"""Where a course run's time went: `python -m gpulab.coursetime TIMINGS_FILE`.

Reads the file that `GPULAB_TIMINGS=path pytest ...` writes (the root conftest.py appends one line
per test as it finishes: seconds, test id, outcome) and prints the seconds per notebook (nbval:
the sum of its cells) and per unit-test file, the slowest cells, and the total. A run stopped by a
time limit still leaves every line up to the cell it was in.
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path


def read(path: str | Path) -> list[tuple[float, str, str]]:
    """(seconds, test id, outcome) per line; malformed lines are skipped."""
    rows = []
    for line in Path(path).read_text().splitlines():
        parts = line.split("\t")
        if len(parts) != 3:
            continue
        try:
            rows.append((float(parts[0]), parts[1], parts[2]))
        except ValueError:
            continue
    return rows


def per_file(rows: list[tuple[float, str, str]]) -> dict[str, tuple[float, int, int]]:
    """File (notebook or test module) -> (seconds, tests, failed), in the order first seen."""
    out: dict[str, list] = defaultdict(lambda: [0.0, 0, 0])
    for seconds, nodeid, outcome in rows:
        entry = out[nodeid.split("::", 1)[0]]
        entry[0] += seconds
        entry[1] += 1
        entry[2] += outcome == "failed"
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpulab.coursetime", description=__doc__.splitlines()[0])
    p.add_argument("timings", help="the file GPULAB_TIMINGS pointed to")
    p.add_argument("--slowest", type=int, default=10, help="how many of the slowest cells to list")
    a = p.parse_args(argv)
    try:
        rows = read(a.timings)
    except OSError as err:
        print(f"gpulab.coursetime: cannot read {a.timings}: {err}", file=sys.stderr)
        return 2
    if not rows:
        print(f"gpulab.coursetime: no timings in {a.timings}", file=sys.stderr)
        return 2
    files = per_file(rows)
    width = max(len(k) for k in files)
    for name, (seconds, n, failed) in files.items():
        print(f"{name:<{width}}  {seconds:7.1f} s  {n:4d} tests" + (f"  {failed} FAILED" if failed else ""))
    print(f"{'total':<{width}}  {sum(v[0] for v in files.values()):7.1f} s  {len(rows):4d} tests")
    print(f"\nslowest {a.slowest}:")
    for seconds, nodeid, _ in sorted(rows, reverse=True)[:a.slowest]:
        print(f"  {seconds:7.1f} s  {nodeid}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
