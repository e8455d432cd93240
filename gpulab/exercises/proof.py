"""The exercises' own proof, on a GPU (issue 39's "done means"): for every graded exercise, the lesson's fix
passes, the code as given fails the target, and each generic cheat is rejected; one submission graded several
times gives ratios within a few percent of their median.

    python -m gpulab.exercises.proof --out DIR [--tasks 01.sync,12.fusion] [--repeat 5] [--budget 10]

Writes DIR/exercises-proof.json (every verdict) and DIR/exercises-proof.md (the table: exercise, the reference's
ratio, the target, the code as given, the cheats, grading times). The cheats here are built from each task's slow
code, so they apply to any exercise; `tests/exercises/test_cheats.py` holds the specific ones, on the CPU.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from gpulab.core.results import FILE_KINDS
from gpulab.exercises.exercise import exercise
from gpulab.exercises.registry import tasks

_HEAD = "import torch\nfrom {module} import {name} as _slow\n"

# (name, applies to "function" | "training" | "any", source after _HEAD; the entry is the last def)
CHEATS = [
    ("cached output", "function", """
_cache = {}
def cheat(*args):
    if "out" not in _cache:
        _cache["out"] = _slow(*args)
    return _cache["out"]
"""),
    ("inputs changed in place", "function", """
def cheat(*args):
    out = _slow(*args)
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            a.mul_(0.5)
            break
    return out
"""),
    ("side stream, unsynchronized", "function", """
def cheat(*args):
    if not torch.cuda.is_available():
        return _slow(*args)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(5_000_000)
        out = _slow(*args)
    return out
"""),
    ("downcast", "function", """
def cheat(*args):
    low = [a.to(torch.float16) if isinstance(a, torch.Tensor) and a.dtype == torch.float32 else a for a in args]
    out = _slow(*low)
    return out.float() if isinstance(out, torch.Tensor) else out
"""),
    ("update undone", "training", """
def cheat(model, optimizer):
    step = _slow(model, optimizer)
    def run(*batch):
        saved = [p.detach().clone() for p in model.parameters()]
        out = step(*batch)
        with torch.no_grad():
            for p, q in zip(model.parameters(), saved):
                p.copy_(q)
        return out
    return run
"""),
    ("stops updating once timed", "training", """
def cheat(model, optimizer):
    step = _slow(model, optimizer)
    calls = []
    def run(*batch):
        calls.append(1)
        saved = [p.detach().clone() for p in model.parameters()] if len(calls) > 12 else None
        out = step(*batch)
        if saved is not None:
            with torch.no_grad():
                for p, q in zip(model.parameters(), saved):
                    p.copy_(q)
        return out
    return run
"""),
    ("downcast", "training", """
def cheat(model, optimizer):
    step = _slow(model, optimizer)
    kind = "cuda" if torch.cuda.is_available() else "cpu"
    low = torch.bfloat16 if kind == "cpu" or torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    def run(*batch):
        with torch.autocast(kind, dtype=low):
            return step(*batch)
    return run
"""),
    ("patched timer", "any", """
import time
time.perf_counter = lambda: 0.0
def cheat(*args):
    return _slow(*args)
"""),
]


def kind_of(task) -> str:
    """"training" (a factory of steps from a model and its optimizer, compared by parameters), "function", or
    "other" (a factory of something else, e.g. lesson 03's DataLoader: the generic cheats do not apply)."""
    import inspect
    import torch
    if task.build("tiny", torch.device("cpu")).reorder is None:
        return "function"
    return "training" if list(inspect.signature(task.slow).parameters)[:2] == ["model", "optimizer"] else "other"


def cheats_for(task) -> list[tuple[str, str]]:
    kind = kind_of(task)
    if kind == "training" and task.tier == "numerics":     # its fix already autocasts: a downcast is no cheat there
        chosen = [c for c in CHEATS if c[1] in (kind, "any") and c[0] != "downcast"]
    else:
        chosen = [c for c in CHEATS if c[1] in (kind, "any")]
    head = _HEAD.format(module=task.slow.__module__, name=task.slow.__name__)
    return [(name, head + body) for name, _, body in chosen]


def prove(names: list[str], *, scale: str, repeat: int, budget_s: float, repeat_task: str | None, log=print,
          timeout_s: float = 150.0, cheats: bool = True, deadline_s: float | None = None, save=None) -> dict:
    """`save(result)` is called after every exercise, so a run stopped by its time limit still leaves what it did;
    past `deadline_s` (seconds from the start) the exercises not yet begun are listed as not run."""
    rows = []
    start = time.perf_counter()
    not_run = []
    for name in names:
        if deadline_s is not None and time.perf_counter() - start > deadline_s:
            not_run.append(name)
            continue
        ex = exercise(name)
        row = {"task": name, "tier": ex.task.tier}
        t0 = time.perf_counter()
        ref = ex.check(ex.task.reference, scale=scale, budget_s=budget_s, quiet=True, who="reference", timeout_s=timeout_s)
        slow = ex.check(ex.task.slow, scale=scale, budget_s=budget_s, quiet=True, who="as given", timeout_s=timeout_s)
        row["reference"], row["as_given"] = ref.detail, slow.detail
        log(ref.text())
        log(slow.text())
        row["cheats"] = {}
        for cheat, source in (cheats_for(ex.task) if cheats else []):
            v = ex.check(source, scale=scale, budget_s=budget_s, quiet=True, who=f"cheat: {cheat}", timeout_s=timeout_s)
            row["cheats"][cheat] = {"state": v.state, "why": v.why[-1] if v.why else "", "grading_s": v.grading_s}
            log(f"  cheat {cheat!r}: {v.state}: {v.why[-1] if v.why else ''}")
        row["seconds"] = time.perf_counter() - t0
        rows.append(row)
        if save:
            save({"rows": rows, "stability": None, "scale": scale, "not_run": not_run})
    stability = None
    if repeat_task and repeat > 1 and not (deadline_s is not None and time.perf_counter() - start > deadline_s):
        ex = exercise(repeat_task)
        ratios = []
        for _ in range(repeat):
            v = ex.check(ex.task.reference, scale=scale, budget_s=budget_s, quiet=True, who="reference (repeat)")
            ratios.append(v.ratio)
            log(f"  repeat {repeat_task}: {v.state} {v.ratio}")
        good = [r for r in ratios if r is not None]
        med = statistics.median(good) if good else None
        stability = {"task": repeat_task, "ratios": ratios, "median": med,
                     "worst_off_median": max(abs(r / med - 1) for r in good) if med else None}
    result = {"rows": rows, "stability": stability, "scale": scale, "not_run": not_run}
    if save:
        save(result)
    return result


def table(result: dict) -> str:
    lines = ["| exercise | tier | reference (fix / as given) | target | as given | cheats rejected | grading s (fix, as given) |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        ref, slow = r["reference"], r["as_given"]
        fmt = lambda v: "n/a" if v is None else f"{v:.2f}"      # noqa: E731
        rejected = sum(c["state"] in ("failed", "suspicious") for c in r["cheats"].values())
        lines.append(f"| {r['task']} | {r['tier']} | {fmt(ref.get('reference_ratio'))}x, {ref.get('state')} | "
                     f"{fmt(ref.get('target'))}x | {fmt(slow.get('ratio'))}x, {slow.get('state')} | "
                     f"{rejected} of {len(r['cheats'])} | {fmt(ref.get('grading_s'))}, {fmt(slow.get('grading_s'))} |")
    s = result.get("stability")
    if s:
        lines.append("")
        lines.append(f"{s['task']}'s fix graded {len(s['ratios'])} times: ratios "
                     + ", ".join("n/a" if r is None else f"{r:.3f}" for r in s["ratios"])
                     + (f"; the farthest {s['worst_off_median']:.1%} from their median {s['median']:.3f}"
                        if s["median"] else ""))
    if result.get("not_run"):
        lines.append("")
        lines.append("Not run (the run's deadline had passed): " + ", ".join(result["not_run"]))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--tasks", default="")
    p.add_argument("--scale", default=None)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--repeat-task", default="01.sync")
    p.add_argument("--budget", type=float, default=10.0)
    p.add_argument("--no-cheats", action="store_true", help="the fix and the code as given only")
    p.add_argument("--speedrun", nargs="?", const="both", choices=("both", "as-given", "reference"),
                   help="also notebook 13's speedrun: the script as given, then the fix (or one of them)")
    p.add_argument("--deadline", type=float, default=None,
                   help="seconds: exercises not begun by then are listed as not run (for a run with a time limit)")
    a = p.parse_args(argv)
    from gpulab.core.device import resolve_scale
    names = [n for n in a.tasks.split(",") if n] or sorted(tasks())
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "exercises-proof" + ("" if not a.tasks else "-" + "-".join(n.split(".")[0] for n in names)[:40])

    def save(result):
        (out / f"{stem}.json").write_text(json.dumps({"kind": FILE_KINDS["proof"], **result}, indent=1, default=str))
        (out / f"{stem}.md").write_text(table(result))
    result = prove(names, scale=resolve_scale(a.scale), repeat=a.repeat, budget_s=a.budget,
                   repeat_task=a.repeat_task or None, log=lambda s: print(s, flush=True),
                   cheats=not a.no_cheats, deadline_s=a.deadline, save=save)
    if a.speedrun:
        from gpulab.exercises import speedrun as S
        runs = {}
        chosen = {"both": ("as given", "reference"), "as-given": ("as given",), "reference": ("reference",)}[a.speedrun]
        for who, factory in (("as given", S.make_train), ("reference", S.make_train_fixed)):
            if who not in chosen:
                continue
            r = S.speedrun(factory, scale=resolve_scale(a.scale), quiet=False, who=who)
            runs[who] = r.detail
            result["speedrun"] = runs
            save(result)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
