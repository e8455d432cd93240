"""The proof of `gpulab.diagnose`'s rules: every labelled case of `cases.py` diagnosed, bad and fixed.

    from gpulab.diagnose.suite import run_suite
    result = run_suite()             # this device, the course's scale
    print(result.matrix_text())      # which rule fired on which step, and the share it would remove
    for name, ok, why in result.checks():
        print("PASS" if ok else "skip" if ok is None else "FAIL", name, why)

For each case: its pair is built, checked (the fixed step computes what the bad one does: correct before
fast), and each step diagnosed (`diagnose`). A fix's measured gain is the ratio of the two diagnoses'
unprofiled step times, which `diagnose` takes over steps run back to back between two synchronizations,
as a training loop runs them: a synchronization after every step would itself remove what some fixes
buy, such as the host preparing the next batch while the GPU still trains on this one.

The checks:
- each rule fires on its bad case and stays silent on its fixed case;
- the top verdict names the case's lesson on at least 90 % of the bad cases;
- on lesson 13's fastest GPT step no verdict that proposes a fix promises more than 10 % (bound <= 1.10);
- for each bad case the fix's measured gain (step time bad / fixed) is at most the Amdahl bound of the
  case's verdict (within the timings' own spread) and saves at least half of what that bound promised.
A check that cannot run here (no GPU, one GPU) says `None` and why: skipped, never passed.

`python -m gpulab.diagnose.suite [--scale full] [--cases a,b] [--json out.json]` runs it from a shell.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import NamedTuple

import torch

from gpulab.core.results import FILE_KINDS
from gpulab.core.device import pick_device, resolve_scale
from gpulab.diagnose import RULES, diagnose
from gpulab.diagnose.facts import changes
from gpulab.diagnose.cases import CASES, Case
from gpulab.models.same import K_UPDATES, compare, distance, loss_value, parameters
from gpulab.diagnose.rules import PROMISE_KEPT_MIN, SHORT, judge_gain   # SHORT: the matrix's column heads

RULE_NAMES = tuple(r.__name__ for r in RULES)
# The top verdict must name the case's lesson on at least this share of the bad cases (issue 17).
LESSON_HITS_MIN = 0.90
# On the capstone no verdict that proposes a fix may promise more than 10 % (bound 1 / (1 - 0.1) ~ 1.11;
# the issue states it as "more than 10 %" of speed, so the bound itself is held to 1.10).
CAPSTONE_BOUND_MAX = 1.10


# -- what the suite keeps of a diagnosis ------------------------------------------------------------
# -- correct before fast: a case's fixed step trains the same model ---------------------------------
def _outputs(out) -> list[torch.Tensor]:
    """A step's returned tensors (its loss, and its gradients where it returns them), copied."""
    items = out if isinstance(out, (tuple, list)) else [out]
    return [t.detach().float().clone().reshape(-1) for t in items if isinstance(t, torch.Tensor)]


def _trained(case: Case, scale: str, device: torch.device, reorder: bool, k: int) -> tuple[list, list, list, list, list]:
    """(the bad model's parameters at the start, after k bad steps, after k fixed steps, and the last bad and
    fixed step's returned tensors) of a fresh pair."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Aa]utocast.*")
        torch.manual_seed(0)           # every build the same weights and the same random batches
        pair = case.build(scale, device, reorder=reorder)
        try:
            p0 = parameters(pair.models[0])
            for _ in range(k):
                out_bad = _outputs(pair.bad())
            for _ in range(k):
                out_fixed = _outputs(pair.fixed())
            return p0, parameters(pair.models[0]), parameters(pair.models[-1]), out_bad, out_fixed
        finally:
            pair.cleanup()


def same_model(case: Case, scale: str, device: torch.device, k: int = K_UPDATES) -> tuple[bool, str]:
    """Correct before fast: does the case's fixed step train the same model as its bad step? Parameters
    after k updates (`compare`); for a step that updates nothing (it returns its gradients), the gradients
    it returns. (True, why) for a case without a fixed step where its loss is finite."""
    from gpulab.models.precision import fp32_only

    if case.rule is None:
        pair = case.build(scale, device)
        try:
            loss = loss_value(pair.bad())
        finally:
            pair.cleanup()
        return math.isfinite(loss), f"first loss {loss:.6g} ({'finite' if math.isfinite(loss) else 'NOT finite'}); nothing to compare with"
    p0, bad, fixed, out_bad, out_fixed = _trained(case, scale, device, False, k)
    _, bad_r, fixed_r, out_bad_r, out_fixed_r = _trained(case, scale, device, True, k)
    with fp32_only():
        _, bad_32, fixed_32, out_bad_32, out_fixed_32 = _trained(case, scale, device, False, k)
    if distance(bad, p0) > 0:
        result = compare(p0, bad, fixed, [(bad_r, bad), (fixed_r, fixed), (bad_32, bad), (fixed_32, fixed)], k)
    else:                           # no update: its gradients, relative to their size
        zero = [torch.zeros_like(t) for t in out_bad]
        result = compare(zero, out_bad, out_fixed, [(out_bad_r, out_bad), (out_fixed_r, out_fixed),
                                                    (out_bad_32, out_bad), (out_fixed_32, out_fixed)], k)
        result["why"] = result["why"].replace("the parameters' movement", "the gradients' size")
    return result["ok"], result["why"]


@dataclass
class Outcome:
    """One step's diagnosis, as the suite keeps it."""

    label: str
    step_ms: float                  # diagnose's unprofiled step: steps back to back, host clock
    step_spread: float              # its spread, relative to step_ms
    profiled_step_ms: float
    verdicts: list = field(default_factory=list)     # Verdict.to_dict(), ranked
    skipped: dict = field(default_factory=dict)      # rule -> why it did not run here
    mfu: float | None = None
    report: str = ""
    busy_by_class: dict = field(default_factory=dict)   # ms of GPU time per kernel class, profiled

    @classmethod
    def of(cls, d) -> Outcome:
        spread = d.step_spread_ms / d.step_ms if d.step_ms else 0.0
        return cls(d.label, d.step_ms, spread, d.profiled_step_ms, [v.to_dict() for v in d.verdicts],
                   dict(d.skipped), d.mfu, d.report(), dict(d.busy_by_class))

    def fired(self) -> dict[str, dict]:
        return {v["rule"]: v for v in self.verdicts}

    @property
    def top(self) -> dict | None:
        return self.verdicts[0] if self.verdicts else None


@dataclass
class CaseResult:
    """A case on this device: "ran" (both steps diagnosed), "skipped" (why), "error" (what raised)
    or "incorrect" (the fixed step computed something else, so nothing was timed)."""

    name: str
    rule: str | None
    lesson: str
    status: str
    why: str = ""                   # skipped / error / incorrect: the reason; ran: the correctness check
    sizes: dict = field(default_factory=dict)
    note: str = ""
    bad: Outcome | None = None
    fixed: Outcome | None = None
    memory: str = ""                # whether the GPU memory came back after the case

    @classmethod
    def from_dict(cls, d: dict) -> CaseResult:
        out = cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})
        out.bad = Outcome(**d["bad"]) if d.get("bad") else None
        out.fixed = Outcome(**d["fixed"]) if d.get("fixed") else None
        return out


class Check(NamedTuple):
    name: str
    ok: bool | None                 # None: could not run here (skipped), with why
    why: str


# -- the checks (pure functions of CaseResults, so they can be tested on hand-made ones) --------------
def _not_run(c: CaseResult, name: str) -> Check | None:
    """Check `name`'s answer when the case did not run: skipped (None) or failed (an error, a wrong result)."""
    if c.status == "skipped":
        return Check(name, None, f"skipped: {c.why}")
    if c.status != "ran":
        return Check(name, False, f"{c.status}: {c.why}")
    return None


def _fmt(v: dict) -> str:
    bound = "inf" if v.get("bound") is None else f"{v['bound']:.3g}x"
    return f"{v['rule']} {100 * v['share']:.0f} % (bound {bound}, lesson {v['lesson']})"


def _not_read(c: CaseResult, name: str, outcome_of) -> Check | None:
    """`_not_run`, or skipped where the case's rule did not run on the step `outcome_of(c)` (why)."""
    early = _not_run(c, name)
    if early:
        return early
    step = outcome_of(c)
    if c.rule in step.skipped:
        return Check(name, None, f"skipped: {step.skipped[c.rule]}")
    return None


def check_fires(c: CaseResult) -> Check:
    name = f"{c.rule} fires on {c.name}/bad"
    early = _not_read(c, name, lambda c: c.bad)
    if early:
        return early
    v = c.bad.fired().get(c.rule)
    if v is None:
        seen = ", ".join(_fmt(x) for x in c.bad.verdicts) or "nothing"
        return Check(name, False, f"{c.rule} stayed silent; fired: {seen}")
    top = c.bad.top
    rank = "the top verdict" if top["rule"] == c.rule else f"below the top verdict {_fmt(top)}"
    return Check(name, True, f"{_fmt(v)}, {rank}")


def check_silent(c: CaseResult) -> Check:
    name = f"{c.rule} silent on {c.name}/fixed"
    early = _not_read(c, name, lambda c: c.fixed)
    if early:
        return early
    v = c.fixed.fired().get(c.rule)
    if v is not None:
        return Check(name, False, f"fired on the fixed step: {_fmt(v)}")
    others = ", ".join(_fmt(x) for x in c.fixed.verdicts) or "nothing"
    return Check(name, True, f"silent; fired: {others}")


def check_lessons(results: list[CaseResult]) -> Check:
    name = f"top verdict names the right lesson on >= {LESSON_HITS_MIN:.0%} of bad cases"
    labelled = [c for c in results if c.rule is not None]
    ran = [c for c in labelled if c.status == "ran"]
    if not ran:
        why = "; ".join(f"{c.name}: {c.status} ({c.why})" for c in labelled) or "no labelled case"
        return Check(name, None if all(c.status == "skipped" for c in labelled) else False,
                     f"no bad case ran here: {why}")
    misses = [f"{c.name}: top {c.bad.top['rule'] + ' (lesson ' + c.bad.top['lesson'] + ')' if c.bad.top else 'none'}"
              f", wants lesson {c.lesson}" for c in ran if not (c.bad.top and c.bad.top["lesson"] == c.lesson)]
    hits = len(ran) - len(misses)
    ok = hits / len(ran) >= LESSON_HITS_MIN
    rest = [c.name for c in labelled if c.status != "ran"]
    why = f"{hits} of {len(ran)} bad cases that ran" + (f" ({', '.join(rest)} did not run)" if rest else "")
    return Check(name, ok, why + (f"; missed: {'; '.join(misses)}" if misses else ""))


def check_capstone(results: list[CaseResult]) -> Check:
    name = f"capstone: no verdict promises more than {CAPSTONE_BOUND_MAX - 1:.0%} (bound <= {CAPSTONE_BOUND_MAX:.2f})"
    cap = next((c for c in results if c.name == "capstone"), None)
    if cap is None:
        return Check(name, None, "skipped: the capstone case was not in this run")
    early = _not_run(cap, name)
    if early:
        return early
    fixes = [v for v in cap.bad.verdicts if v.get("actionable", True)]
    left = [v for v in cap.bad.verdicts if not v.get("actionable", True)]
    over = [v for v in fixes if v.get("bound") is None or v["bound"] > CAPSTONE_BOUND_MAX]
    why = ("no fix proposed" if not fixes else "fixes: " + ", ".join(_fmt(v) for v in fixes))
    if left:
        why += ("; not a fix but what is left (not held to the bound): "
                + ", ".join(f"{_fmt(v)}: {v['evidence']}" for v in left))
    return Check(name, not over, why)


def check_gain(c: CaseResult) -> Check:
    """The fix's measured gain against its verdict's Amdahl bound: at most the bound (within the
    timings' spread) and at least half of the time the bound promised."""
    name = f"{c.name}: measured gain within the bound, at least half its promise"
    early = _not_read(c, name, lambda c: c.bad)
    if early:
        return early
    v = c.bad.fired().get(c.rule)
    if v is None:
        return Check(name, False, f"{c.rule} did not fire on the bad step: no bound to hold the fix to")
    t_bad, t_fixed = c.bad.step_ms, c.fixed.step_ms
    if not t_bad or not t_fixed:
        return Check(name, False, "no step time measured")
    g = judge_gain(t_bad, t_fixed, v.get("bound"), c.bad.step_spread, c.fixed.step_spread)
    e = judge_gain(t_bad, t_fixed, v.get("expected_gain", v.get("bound")), c.bad.step_spread, c.fixed.step_spread)
    within, enough = g["within"], e["enough"]
    why = (f"{t_bad:.3g} -> {t_fixed:.3g} ms per step: gain {g['speedup']:.3g}x against the bound {g['bound']:.3g}x "
           f"({'within' if within else 'ABOVE'} it, spread {g['noise']:.0%}); saved {e['saved_ms']:.3g} of the "
           f"{e['promised_ms']:.3g} ms expected ({e['of_promised']:.0%}, {'at least' if enough else 'LESS than'} "
           f"{PROMISE_KEPT_MIN:.0%})")
    if not enough:
        why += _slower_kernels(c)
    if c.bad.top and c.bad.top["rule"] != c.rule:
        why += f"; note: the top verdict was {_fmt(c.bad.top)}"
    return Check(name, within and enough, why)


# A kernel class "grew" in the fixed step when its GPU time rose by more than this share: the profiled
# times of one class repeat within a few percent from run to run.
GREW_MIN = 0.05


def _slower_kernels(c: CaseResult) -> str:
    """Where a promise went: the kernel classes that took longer in the fixed step than in the bad one,
    other than communication (the work a fix hides, not work it should leave alone). A bound assumes
    the rest of the step is unchanged by the fix; work running beside the hidden part may slow down."""
    bad = c.bad.busy_by_class
    grew = [(k, ms) for k, ms in changes(bad, c.fixed.busy_by_class)
            if k != "communication" and ms > GREW_MIN * bad.get(k, 0.0) and ms > 0]
    if not grew:
        return ""
    parts = ", ".join(f"{k} +{ms:.3g} ms" for k, ms in grew)
    return (f"; the fixed step's own kernels took longer (profiled GPU time per step: {parts}), "
            "which the bound takes as unchanged")


def check_correct(c: CaseResult) -> Check:
    name = f"{c.name}: the fixed step computes what the bad one does"
    if c.status == "skipped":
        return Check(name, None, f"skipped: {c.why}")
    if c.status in ("error",):
        return Check(name, False, f"error: {c.why}")
    return Check(name, c.status == "ran", c.why)


# -- the result -------------------------------------------------------------------------------------
@dataclass
class SuiteResult:
    """Every case's outcome on one device at one scale; the confusion matrix and the checks."""

    scale: str
    device: str
    gpus: int
    cases: list[CaseResult]
    rules: tuple = RULE_NAMES
    torch: str = torch.__version__
    when: str = ""
    seconds: float = 0.0

    def cell(self, c: CaseResult, which: str, rule: str) -> str:
        """share % if `rule` fired on that step, '.' if silent, 'skip' if it did not run, 'err' if the
        case failed; '(x%)' for compute_bound, which is what is left rather than a fix."""
        if c.status == "skipped":
            return "skip"
        if c.status != "ran":
            return "err"
        out = getattr(c, which)
        if rule in out.skipped:
            return "skip"
        v = out.fired().get(rule)
        if v is None:
            return "."
        share = f"{100 * v['share']:.0f}%"
        return share if v.get("actionable", True) else f"({share})"

    def rows(self) -> list[tuple[str, list[str], str]]:
        """(row label, one cell per rule, the top verdict's lesson) for every step of every case."""
        out = []
        for c in self.cases:
            for which in ("bad", "fixed") if c.rule is not None else ("bad",):
                label = f"{c.name}/{which}" if c.rule is not None else f"{c.name}/step"
                cells = [self.cell(c, which, r) for r in self.rules]
                if c.rule in self.rules and cells[self.rules.index(c.rule)] not in ("skip", "err"):
                    i = self.rules.index(c.rule)
                    cells[i] = f"[{cells[i]}]"           # the cell the case is about
                step = getattr(c, which) if c.status == "ran" else None
                top = step.top["lesson"] if step is not None and step.top else "-"
                out.append((label, cells, top if c.status == "ran" else ""))
        return out

    def matrix_text(self) -> str:
        heads = [SHORT.get(r, r) for r in self.rules]
        rows = self.rows()
        first = max([len("case/step")] + [len(label) for label, _, _ in rows])
        widths = [max([len(h)] + [len(cells[i]) for _, cells, _ in rows]) for i, h in enumerate(heads)]
        line = lambda a, cells, top: "  ".join([a.ljust(first)] + [x.rjust(w) for x, w in zip(cells, widths)]
                                               + [top.rjust(3)])
        lines = [f"gpulab.diagnose suite: {self.device}, {self.gpus} GPU(s), scale {self.scale}, torch {self.torch}",
                 line("case/step", heads, "top")]
        lines += [line(label, cells, top) for label, cells, top in rows]
        lines.append("cells: share of the step the rule's fix removes at most; '.' silent; 'skip' not run here; "
                     "'err' failed; [ ] the case's own rule; ( ) compute_bound: what is left, not a fix; "
                     "top: the lesson of the top verdict")
        lines.append("columns: " + ", ".join(f"{SHORT.get(r, r)} = {r}" for r in self.rules if SHORT.get(r, r) != r))
        for c in self.cases:
            if c.status != "ran":
                lines.append(f"{c.name}: {c.status}: {c.why}")
            elif c.note:
                lines.append(f"{c.name}: note: {c.note}")
        return "\n".join(lines)

    def checks(self) -> list[Check]:
        labelled = [c for c in self.cases if c.rule is not None]
        out = [check_correct(c) for c in self.cases]
        for c in labelled:
            out += [check_fires(c), check_silent(c)]
        out.append(check_lessons(self.cases))
        out.append(check_capstone(self.cases))
        out += [check_gain(c) for c in labelled]
        return out

    def to_dict(self) -> dict:
        """Everything as plain JSON values (for the committed record): cases, matrix, checks."""
        out = asdict(self)
        out["matrix"] = [{"row": label, "cells": dict(zip(self.rules, cells)), "top": top}
                         for label, cells, top in self.rows()]
        out["checks"] = [{"name": c.name, "ok": c.ok, "why": c.why} for c in self.checks()]
        return json.loads(json.dumps(out, default=_plain))


def _plain(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, torch.dtype):
        return str(x)
    return str(x)


# -- running it -------------------------------------------------------------------------------------
def diagnose_pair(case: Case, scale: str, device: torch.device, progress=None, profile: bool = True) -> CaseResult:
    """Build `case` here, check it (correct before fast) and diagnose both steps; the pair's cleanup
    runs whatever happens. `profile=False`: the same steps, unrecorded (the other ranks of a
    multi-process case; `diagnose`'s `profile`), and no outcomes."""
    say = progress or (lambda _: None)
    pair = None
    result = CaseResult(case.name, case.rule, case.lesson, "error")
    try:
        say(f"{case.name}: checking that the fixed step trains the same model, at {scale} scale")
        ok, why = same_model(case, scale, device)
        result.why = why
        if not ok:
            result.status = "incorrect"
            return result
        say(f"{case.name}: building at {scale} scale")
        pair = case.build(scale, device)
        result.sizes, result.note = dict(pair.sizes), pair.note
        outcomes = {}
        for which in ("bad", "fixed"):
            step = getattr(pair, which)
            if step is None:
                continue
            say(f"{case.name}: diagnosing the {which} step")
            d = diagnose(step, device=device, flops_per_step=pair.flops_per_step, label=f"{case.name}/{which}",
                         profile=profile)
            if d is not None:
                outcomes[which] = Outcome.of(d)
            del d
        result.bad, result.fixed = outcomes.get("bad"), outcomes.get("fixed")
        result.status = "ran"
    except Exception as err:                     # noqa: BLE001 - one failing case must not stop the suite
        result.status, result.why = "error", f"{type(err).__name__}: {err}"
    finally:
        if pair is not None:
            try:
                pair.cleanup()
            except Exception as err:             # noqa: BLE001
                result.note = (result.note + "; " if result.note else "") + f"cleanup failed: {err}"
        del pair
    return result


def run_case(case: Case, scale: str, device: torch.device, gpus: int, progress=None) -> CaseResult:
    """One case: skipped with why where it cannot show its effect; across processes where it needs
    several GPUs; else here, with the GPU memory checked to come back to where it was."""
    from gpulab.core.memory import memory_guard

    why = case.unable(device, gpus)
    if why:
        return CaseResult(case.name, case.rule, case.lesson, "skipped", why)
    if case.needs_gpus > 1:
        return run_distributed(case, scale, case.needs_gpus, progress)
    with memory_guard(quiet=True, device=device) as guard:
        result = diagnose_pair(case, scale, device, progress)
    result.memory = guard.message()
    return result


def run_suite(scale: str | None = None, cases=None, progress: Callable[[str], None] | None = None) -> SuiteResult:
    """Every case (`cases`: names or Case objects; default all of CASES) on this device at `scale`
    ("tiny" or "full"; None: the course's). `progress(text)` hears what is running."""
    t0 = time.perf_counter()
    scale = resolve_scale(scale)
    device = pick_device()
    gpus = torch.cuda.device_count() if device.type == "cuda" else 0
    chosen = [CASES[c] if isinstance(c, str) else c for c in (cases if cases is not None else CASES.values())]
    results = [run_case(c, scale, device, gpus, progress) for c in chosen]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return SuiteResult(scale, name, gpus, results, when=datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), seconds=time.perf_counter() - t0)


# -- several GPUs: one process each ------------------------------------------------------------------
def run_distributed(case: Case, scale: str, nproc: int, progress=None, timeout_s: float = 900) -> CaseResult:
    """`case` in `nproc` processes, one per GPU (`gpulab.core.launcher.torchrun`: NCCL, NVLink multicast off,
    the processes stopped at the time limit); every rank runs the steps, rank 0 alone under the profiler, and
    reports. A failure becomes an "error" result that names the first rank's error."""
    from gpulab.core.launcher import OUT, LaunchError, torchrun

    (progress or (lambda _: None))(f"{case.name}: {nproc} processes")
    try:
        result = torchrun("gpulab.diagnose.suite", ["--worker", case.name, "--scale", scale, "--json", OUT],
                          nproc, "nccl", timeout_s, what=f"{case.name} ({nproc} x nccl)")
    except LaunchError as err:
        first, *rest = str(err).strip().splitlines()
        printed = [ln for ln in rest if ln.strip("= ") and not ln.startswith("Last lines")]
        why = first if ": rank " in first or not printed else f"{first} | {printed[-1]}"   # the rank's error, or the last line
        return CaseResult(case.name, case.rule, case.lesson, "error", why)
    return CaseResult.from_dict(result)          # its fields; the launch's own (launch_s, nccl) are left out


def _worker(name: str, scale: str, out: str) -> int:
    """One rank of `run_distributed`: this process's GPU, the process group, the case; rank 0 writes. A failing
    rank leaves its error beside `out` for the launcher's message."""
    import os

    import torch.distributed as dist

    from gpulab.core.launcher import die_with_parent, write_rank_error

    die_with_parent()
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    try:
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    except Exception as err:
        write_rank_error(out, rank, err)
        raise
    try:
        result = diagnose_pair(CASES[name], scale, device, profile=rank == 0)
        if rank == 0:
            Path(out).write_text(json.dumps(asdict(result), default=_plain))
        dist.barrier()
    except Exception as err:
        write_rank_error(out, rank, err)
        raise
    finally:
        dist.destroy_process_group()
    return 0


# what `--json` files say they are (gpulab room skips them: diagnoses, not a lesson's measurements)
SUITE_KIND = FILE_KINDS["suite"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpulab.diagnose.suite",
                                description="Diagnose every labelled case, bad and fixed; print the matrix and checks.")
    p.add_argument("--scale", choices=("tiny", "full", "auto"), default=None)
    p.add_argument("--cases", default=None, help="comma-separated case names (default: all)")
    p.add_argument("--json", default=None, help="write the result here as JSON")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)      # one rank of a multi-GPU case
    a = p.parse_args(argv)
    if a.worker:
        return _worker(a.worker, resolve_scale(a.scale), a.json)
    result = None
    for name in a.cases.split(",") if a.cases else CASES:           # one at a time: the record grows as it runs
        one = run_suite(a.scale, [name], progress=lambda s: print(s, flush=True))
        if result is not None:
            one.cases, one.seconds = result.cases + one.cases, result.seconds + one.seconds
        result = one
        if a.json:
            Path(a.json).write_text(json.dumps({"kind": SUITE_KIND, **result.to_dict()}, indent=1))
    print(result.matrix_text())
    for name, ok, why in result.checks():
        print(f"{'PASS' if ok else 'skip' if ok is None else 'FAIL'}  {name}: {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
