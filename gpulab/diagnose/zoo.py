"""The zoo (the repository's `zoo/` folder): training steps `gpulab.diagnose` was not tuned on, labelled by
measurement, and the diagnosis judged against the labels.

    python -m gpulab.diagnose.zoo label --out labels.json            # time each step as written and fixed
    python gpulab/diagnose/zoo.py diagnose --out verdicts.json       # diagnose each step (any gpulab version)
    python -m gpulab.diagnose.zoo judge labels.json verdicts.json    # the confusion matrix and the checks

**Labels.** Each step's file lists the fixes a performance engineer would try by hand (`FIXES`, rule ->
fix). `label` checks that each fix trains the same model as the step as written (`same_model`: the
parameters after K_UPDATES updates, against the noise floor of the same step with its batch rows in
another order), then times the step as written and with each fix (`step_time`: steps back to back, the
host clock around chunks, the mean over at least LABEL_WINDOW_S), then the step as written again
(`zoo_label.retime`: where the fixes' runs made it faster, every variant is timed a second time). A step that
exposes its model and compiles nothing also gets the fixes a diagnosis makes from outside (`zoo_label.GENERIC`: the
model compiled), checked by `check` on the CPU like the file's own (or on the device where the checks file lacks
one). The label is the fix with the
largest gain if it makes the step at least TUNED_GAIN_MAX faster; else the step is *tuned*.

**Judging.** `diagnose` runs `gpulab.diagnose` on each step as written. The script runs with whichever
`gpulab` is importable (it uses only `diagnose(step, label=...)` and `Verdict.to_dict()`), so the same
file diagnoses the zoo with the rules before a change (an older checkout on PYTHONPATH) and after.
`judge` holds the verdicts to the labels:

- the top verdict (the report's first fix, demoted or not where it measured at least TUNED_GAIN_MAX) names
  the best fix's rule on at least TOP_HITS_MIN of the steps with a label (a fix within
  TIE_MAX of the best, `zoo_label.within_spread`, is shown as a tie and not counted);
- on the tuned steps no verdict that proposes a fix expects more than TUNED_GAIN_MAX (a demoted one: measured);
- every fired verdict whose gain was measured (by `gpulab.diagnose.confirm`, or by a fix of the zoo for
  its rule) saved at least half of what it expected, or it was demoted with its measurement shown. A verdict
  blocked by another (`blocked_by`: CUDA graphs behind a sync in the forward) promises what its fix buys once
  the other's is made; the zoo's fix, made alone, does not measure that, so it is listed as not measured.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from gpulab.core.results import FILE_KINDS

ZOO = Path(__file__).resolve().parents[2] / "zoo"
# A fix that buys less than this is not worth a verdict: the "no verdict promises more than 10 %" bar of
# the tuned steps, and the least gain that makes a fix a step's label.
TUNED_GAIN_MAX = 1.10
# The top verdict must name the best fix's rule on this share of the labelled steps (issue 23).
TOP_HITS_MIN = 0.90
# A top verdict whose fix the label timed within this of the best's gain (and within the two timings' spreads) is a
# tie: shown in the matrix, not counted as a hit. Set before any diagnosis was judged with it.
TIE_MAX = 0.05
# Correctness: `gpulab.diagnose.cases.compare` (parameters after K_UPDATES updates against the noise
# floor), the one comparison the suite's cases use too.
LABEL_WINDOW_S = 1.5
LABEL_CHUNK = 5
# `label --settle`: at most this long compiling before the timed window (see `settle`).
SETTLE_MAX_S = 90.0
SETTLE_QUIET = 2            # chunks in a row without a new graph (a rare length can skip one chunk)
# Old rule names, for judging an older version's verdicts.
RENAMED = {"fp32_no_tensor_cores": "fp32_matmuls"}


# -- the steps ------------------------------------------------------------------------------------------
def step_files(folder: Path = ZOO) -> list[Path]:
    """The zoo's step files (not the shared `_*.py` parts), by name; those that compile come last (they
    take longest: a run cut short by its time limit loses the fewest steps)."""
    return sorted((p for p in folder.glob("*.py") if not p.name.startswith("_")),
                  key=lambda p: ("torch.compile(" in p.read_text(), p.name))


def load(path: Path):
    """The step module at `path` (its folder on sys.path, for its shared parts)."""
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(f"zoo_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    # registered under its name: torch.compile imports the module of a class it traces (a model defined in the
    # step's own file), and fails with ModuleNotFoundError otherwise
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def group(files: list, spec: str) -> list:
    """The K-th of N groups ("K/N") of `files`: every N-th from the K-th, so the compiling steps (last in
    `step_files`' order) spread over the groups."""
    try:
        k, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise SystemExit(f"--group takes K/N (e.g. 1/3), got {spec!r}") from None
    if not 1 <= k <= n:
        raise SystemExit(f"--group {spec}: K must be between 1 and N")
    return files[k - 1::n]


def held_out(name: str) -> bool:
    """The half of the zoo kept out of development: the rules were not looked at on these before the
    final run. A fixed split by name (its characters' codes, summed, odd)."""
    return sum(map(ord, name)) % 2 == 1


def _close(step) -> None:
    close = getattr(step, "close", None)
    if close is not None:
        close()


def _release(device: torch.device) -> None:
    """gpulab.core.memory.release (garbage, cuBLAS's workspaces, the allocator's cache), after dropping
    torch.compile's graphs: a variant must not inherit another's compiled graphs or spent recompiles."""
    from gpulab.core.memory import release

    torch.compiler.reset()
    release(device)


def _run_k(module, fix, scale, device, reorder: bool, k: int | None = None) -> tuple[list, list]:
    import warnings

    from gpulab.models.same import K_UPDATES, trained      # here: `records` runs with older gpulabs too
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Aa]utocast.*")
        try:
            return trained(module.make_step(fix, scale=scale, device=device, seed=0, reorder=reorder), k or K_UPDATES)
        finally:
            _release(device)


@contextlib.contextmanager
def _environ(**values):
    old = {k: os.environ.get(k) for k in values}
    os.environ.update({k: v for k, v in values.items() if v is not None})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def same_model(module, fix: str, device: torch.device, scale: str = "tiny") -> dict:
    """Does `fix` train the same model as the step as written? Both from the same weights on the same
    batches for K_UPDATES updates; their distance, relative to how far the parameters moved, against a
    noise floor: the larger of (a) each variant against itself with the batch rows reordered (the order
    of the reductions over the batch) and (b) each variant against itself in fp32 (ZOO_FP32: how far its
    16-bit rounding alone moves the parameters). So a fix that changes only the rounding (16-bit autocast,
    a fused attention kernel) passes, and one that changes anything else fails. Run at `scale` (the code
    paths are the fix's at any size); compiled steps use the aot_eager backend here, which costs no
    inductor compile."""
    from gpulab.models.same import compare

    with _environ(ZOO_COMPILE_BACKEND="aot_eager"):
        p0, pb = _run_k(module, None, scale, device, False)
        _, pr = _run_k(module, None, scale, device, True)
        _, pf = _run_k(module, fix, scale, device, False)
        _, prf = _run_k(module, fix, scale, device, True)
        with _environ(ZOO_FP32="1"):
            _, pb32 = _run_k(module, None, scale, device, False)
            _, pf32 = _run_k(module, fix, scale, device, False)
    result = compare(p0, pb, pf, [(pr, pb), (prf, pf), (pb32, pb), (pf32, pf)])
    result.update(reorder_floor=max(compare(p0, pb, pr, [])["diff"], compare(p0, pf, prf, [])["diff"]),
                  rounding_floor=max(compare(p0, pb, pb32, [])["diff"], compare(p0, pf, pf32, [])["diff"]))
    return result


def settle(step, limit_s: float = SETTLE_MAX_S) -> dict:
    """Run `step` in chunks of LABEL_CHUNK until SETTLE_QUIET chunks in a row compile no new graph
    (torch.compile's count), at most `limit_s`: a compiled step's label is its time once its shapes have
    compiled, not the compiles of its first steps, a one-time cost however long the run (on the H200,
    2026-12-01, bert_variable_lengths_compile's 1.5 s window after 3 warm-up steps read a mean of 151 ms per
    step against a median of 75 ms). Returns {"steps": run, "graphs": compiled meanwhile, "settled": whether
    the last chunks compiled nothing}."""
    from gpulab.diagnose.core import compile_counters

    t0, steps, quiet = time.perf_counter(), 0, 0
    first = last = compile_counters().get("graphs", 0)
    while True:
        for _ in range(LABEL_CHUNK):
            step()
        steps += LABEL_CHUNK
        now = compile_counters().get("graphs", 0)
        quiet = quiet + 1 if now == last else 0
        last = now
        if quiet >= SETTLE_QUIET or time.perf_counter() - t0 > limit_s:
            return {"steps": steps, "graphs": now - first, "settled": quiet >= SETTLE_QUIET}


def step_time(module, fix, scale: str, device: torch.device, window_s: float = LABEL_WINDOW_S,
              settled: bool = False) -> dict:
    """ms per step (the mean over chunks of LABEL_CHUNK steps back to back, at least `window_s`, after 3
    warm-up steps; with `settled`, after `settle` too), and the chunks' spread."""
    from gpulab.core.timing import benchmark

    step = module.make_step(fix, scale=scale, device=device)
    try:
        settling = settle(step) if settled else None
        timing = benchmark(step, warmup=3, repeat=None, budget_s=window_s, max_repeat=60, calls=LABEL_CHUNK,
                           clock="host", device=device)
        samples = timing.samples_ms
        return {"ms": sum(samples) / len(samples), "median_ms": timing.median_ms, "spread": timing.spread_ms / timing.median_ms,
                "chunks": len(samples), "has_model": isinstance(getattr(step, "model", None), torch.nn.Module),
                **({"settle": settling} if settling else {})}
    finally:
        _close(step)
        del step
        _release(device)


def time_fix(module, rule: str, row: dict, base_ms: float, scale: str, device: torch.device, window_s: float,
             settled: bool, when: str = "") -> bool:
    """Time `module`'s step with fix `rule` into `row` (`step_time`) and its gain over `base_ms`; False, with the
    row's `error` and no gain, where it failed (out of memory, a compile error) or a fix made from outside compiled
    nothing (the step calls another module than step.model)."""
    try:
        row.update(step_time(module, rule, scale, device, window_s, settled))
        if (row.get("settle") or {}).get("graphs") == 0 and rule in getattr(module, "_generic", ()):
            raise ValueError("compiling step.model compiled nothing: the step calls another module")
        row["gain"] = base_ms / row["ms"]
        return True
    except Exception as err:        # noqa: BLE001 - one fix that fails must not stop the step's label
        row.pop("gain", None)
        row["error"] = f"{type(err).__name__}{when}: {str(err)[:300]}"
        return False


def label_step(path: Path, scale: str, device: torch.device, say=print, checks: dict | None = None,
               window_s: float = LABEL_WINDOW_S, settled: bool = False) -> dict:
    """One step's label: its time as written and with each fix (each checked first: here, or in `checks`,
    {step: {rule: same_model's answer}} from an earlier run), and the best fix."""
    module = load(path)
    out = {"name": path.stem, "held_out": held_out(path.stem), "fixes": {}, "doc": (module.__doc__ or "").strip()}
    need = getattr(module, "NEEDS_GPUS", 1)
    have = torch.cuda.device_count() if device.type == "cuda" else 0
    if need > 1 and need > have:              # a one-GPU step runs on the CPU too (its code, not its effect)
        out["skipped"] = f"needs {need} GPUs, this machine has {have}"
        return out
    try:
        t0 = time.perf_counter()
        out["as_written"] = step_time(module, None, scale, device, window_s, settled)
        from gpulab.diagnose.zoo_label import retime, with_generic     # here: `diagnose` runs with older gpulabs too
        module = with_generic(module, out["as_written"], scale, device)      # fixes made from outside
        for rule, text in module.FIXES.items():
            check = (checks or {}).get(path.stem, {}).get(rule)
            if check is None:                   # not in the checks file (a fix added since): checked here
                try:
                    check = same_model(module, rule, device)
                except Exception as err:        # noqa: BLE001 - as `check` records it: the row stays untimed
                    check = {"ok": False, "why": f"{type(err).__name__}: {str(err)[:300]}"}
            row = {"fix": text, "check": check}
            if check["ok"] and not time_fix(module, rule, row, out["as_written"]["ms"], scale, device, window_s, settled):
                say(f"{path.stem} / {rule}: ERROR {row['error']}")
            out["fixes"][rule] = row
        retime(module, out, scale, device, window_s, settled, say)     # zoo_label: timed again where warmed
        timed = {r: f["gain"] for r, f in out["fixes"].items() if "gain" in f}
        best = max(timed, key=timed.get) if timed else None
        out["best"] = best if best and timed[best] >= TUNED_GAIN_MAX else None
        out["best_gain"] = timed.get(best, 1.0) if best else 1.0
        out["seconds"] = time.perf_counter() - t0
        say(f"{path.stem}: {out['as_written']['ms']:.3g} ms; "
            + ", ".join(f"{r} {g:.2f}x" for r, g in timed.items()) + f" -> {out['best'] or 'tuned'}")
    except Exception as err:        # noqa: BLE001 - one failing step must not stop the zoo
        out["error"] = f"{type(err).__name__}: {err}"
        say(f"{path.stem}: ERROR {out['error']}")
    return out


def diagnose_step(path: Path, device: torch.device, record_dir: Path | None = None, say=print, **kwargs) -> dict:
    """The diagnosis of one step as written (whichever gpulab is importable), as plain values."""
    import gpulab

    module = load(path)
    out = {"name": path.stem}
    step = None
    try:
        step = module.make_step()
        t0 = time.perf_counter()
        if record_dir is not None:
            kwargs["record_to"] = str(record_dir / f"{path.stem}.json.gz")
        try:
            d = gpulab.diagnose(step, label=path.stem, **kwargs)
        except Exception as err:    # noqa: BLE001 - once more without the confirmations (a variant may be what broke)
            if "confirm" not in kwargs:
                raise
            out["first_error"] = f"{type(err).__name__}: {err}"
            _close(step)
            step = module.make_step()
            d = gpulab.diagnose(step, label=path.stem, **{**kwargs, "confirm": False})
        out.update(verdicts=[v.to_dict() for v in d.verdicts], step_ms=d.step_ms, report=d.report(),
                   seconds=time.perf_counter() - t0)
        top = d.verdicts[0].rule if d.verdicts else "none"
        say(f"{path.stem}: {d.step_ms:.3g} ms, top {top} ({out['seconds']:.0f} s)")
    except Exception as err:        # noqa: BLE001
        out["error"] = f"{type(err).__name__}: {err}"
        say(f"{path.stem}: ERROR {out['error']}")
    finally:
        if step is not None:
            _close(step)
        del step
        _release(device)
    return out


def with_confirmations(row: dict, live: dict | None) -> dict:
    """A re-analysed record's verdicts with the measurements its live diagnosis made (`confirm` runs the step,
    which a record cannot): each verdict whose rule the live run confirmed gets the same measured gain and is
    demoted, or not, against its own (perhaps new) expectation (`rules.demote`; a launch verdict measured through
    graph breaks and kept is no longer blocked: `model_variants.through_block`), then ranked (`rules.rank`);
    the live run's launch verdict made from a measurement alone is kept where its conditions hold on the record.
    Needs this gpulab's rules."""
    import dataclasses

    from gpulab.diagnose.confirm import after_fusing_wants_graphs
    from gpulab.diagnose.model_variants import through_block
    from gpulab.diagnose.rules import Verdict, demote, rank

    if not live or "verdicts" not in row:
        return row
    measured = {v["rule"]: v for v in live.get("verdicts", []) if v.get("measured") is not None}
    names = {f.name for f in dataclasses.fields(Verdict)}
    out = []
    for d in row["verdicts"]:
        v = Verdict(**{k: x for k, x in d.items() if k in names})
        m = measured.get(v.rule)
        if m is not None and m.get("actionable") and not v.actionable:     # a note the live run measured and ranked
            v = dataclasses.replace(v, actionable=True, expected=m.get("expected", v.expected))
        if m is not None:
            how = m.get("confirmation", "").split("; demoted:")[0]
            v = through_block(demote(v, m["measured"], f"{how} (in the live run)"))
        out.append(v)
    # the launch verdict the live run made from a measurement alone (`confirm.graphs_after_fusing`: the elementwise
    # note measured, no launch verdict fired), which no rule fires on a record: kept where the same holds here
    g = measured.get("launch_bound")
    made_after_fusing = g is not None and "compiled alone" in g.get("confirmation", "")    # graphs_after_fusing's
    if made_after_fusing and g.get("actionable") and after_fusing_wants_graphs(out):
        out.append(Verdict(**{k: x for k, x in g.items() if k in names}))
    return {**row, "verdicts": [v.to_dict() for v in rank(out)]}


def diagnose_record(path: Path) -> dict:
    """A recorded diagnosis (`diagnose(..., record_to=)`) analysed by whichever gpulab is importable:
    the rules as they were before a change (an older checkout on PYTHONPATH) on exactly the profile the
    new ones read. Python frames and the call-site fields the older parser does not know are dropped."""
    import dataclasses
    import gzip

    A = importlib.import_module("gpulab.diagnose.analyze")      # the package's `analyze` is the function
    E = importlib.import_module("gpulab.diagnose.events")
    core = importlib.import_module("gpulab.diagnose.core")
    Diagnosis = core.Diagnosis
    if hasattr(core, "from_record"):                            # this version reads its own records whole
        d = core.from_record(str(path))
        return {"name": path.name.split(".")[0], "verdicts": [v.to_dict() for v in d.verdicts], "step_ms": d.step_ms,
                "report": d.report()}

    opener = importlib.import_module("lzma") if str(path).endswith(".xz") else gzip      # core.open_record's choice
    with opener.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    known = {f.name for f in dataclasses.fields(E.Record)}
    records = []
    for row in data["rows"]:
        r = dict(zip(data["fields"], row))
        if r["activity"] == "python_frame":
            continue
        r = {k: v for k, v in r.items() if k in known}
        r["shapes"] = tuple(tuple(x) for x in r["shapes"])
        r["dtypes"] = tuple(r["dtypes"])
        records.append(E.Record(**r))
    inputs, meta = data["inputs"], data["meta"]
    mem_known = {f.name for f in dataclasses.fields(A.MemoryFacts)}
    memory = A.MemoryFacts(**{k: v for k, v in data["memory"].items() if k in mem_known}) if data.get("memory") else None
    args = {k: inputs[k] for k in ("on_gpu", "tf32_matmul", "tf32_cudnn", "step_ms", "flops_per_step", "peak_tflops",
                                   "peak_source", "kernel_ceiling_tflops") if k in inputs}
    facts = A.analyze(E.parse(records, data["trace_start_ns"] or None), memory=memory, **args)
    d = Diagnosis.from_facts(facts, device=meta["device"], step_spread_ms=meta["step_spread_ms"], label=meta["label"])
    return {"name": path.name.split(".")[0], "verdicts": [v.to_dict() for v in d.verdicts], "step_ms": d.step_ms,
            "report": d.report()}


# -- judging ------------------------------------------------------------------------------------------------
def _rule(v: dict) -> str:
    return RENAMED.get(v["rule"], v["rule"])


def _expected(v: dict) -> float:
    """A verdict's expected gain (an older version's verdicts have only the bound)."""
    if v.get("expected_gain") is not None:
        return v["expected_gain"]
    return v["bound"] if v.get("bound") is not None else math.inf


def _promise(v: dict) -> float:
    """What a verdict promises in the report: a demoted one what it measured, else its expected gain."""
    if v.get("demoted") and v.get("measured") is not None:
        return v["measured"]
    return _expected(v)


def _rank_key(v: dict) -> tuple:
    """`rules.rank_key` of a verdict read from JSON: ranked by what it measured, else what it expects."""
    from gpulab.diagnose.rules import rank_key
    gain = v["measured"] if v.get("measured") is not None else _expected(v)
    return rank_key(gain if gain is not None else math.inf, _rule(v))


def read_steps(paths) -> list[dict]:
    """The step rows of zoo JSON files (a run in groups), one per step: where a step is in several files (labelled
    or diagnosed again), the last file's row, in the place of its first."""
    return list({r["name"]: r for p in paths for r in json.loads(Path(p).read_text())["steps"]}.values())


def judge(labels: list[dict], diagnoses: list[dict], only: str | None = None) -> dict:
    """The confusion matrix (step x rule: the expected share where the rule fired), the top verdict against
    the label, and the checks. `only`: "held_out" or "dev" to judge half the zoo."""
    from gpulab.diagnose.zoo_label import within_spread

    by_name = {d["name"]: d for d in diagnoses}
    rows, checks, hits, ties, untimed, labelled, tuned_over, measured = [], [], 0, 0, 0, 0, [], []
    for lab in labels:
        if only and (lab.get("held_out") != (only == "held_out")):
            continue
        d = by_name.get(lab["name"])
        if "skipped" in lab or "error" in lab or d is None or "error" in d:
            why = lab.get("skipped") or lab.get("error") or (d or {}).get("error") or "not diagnosed"
            rows.append({"name": lab["name"], "status": "skipped" if "skipped" in lab else "error", "why": why})
            continue
        fixes = [v for v in d["verdicts"] if v.get("actionable", True)]
        # the report's first fix: `rules.rank` ranks a demoted fix by what it measured, and the report shows it first
        # where no other fix ranks before it by `rules.rank_key` (an older version's records list a demoted verdict
        # where it stood before); a demoted fix is a fix only where what it measured clears the zoo's own bar for
        # one (TUNED_GAIN_MAX)
        top = fixes[0] if fixes else None
        if top is not None and top.get("demoted") and (_promise(top) < TUNED_GAIN_MAX or any(
                _rank_key(v) < _rank_key(top) for v in fixes[1:] if not v.get("demoted"))):
            top = next((v for v in fixes if not v.get("demoted")), None)
        best = lab.get("best")
        row = {"name": lab["name"], "label": best or "tuned", "label_gain": lab.get("best_gain", 1.0),
               "top": _rule(top) if top else "none", "fired": {_rule(v): v for v in d["verdicts"]},
               "held_out": lab.get("held_out", False)}
        if best:
            labelled += 1
            row["hit"] = top is not None and _rule(top) == best
            row["tie"] = not row["hit"] and top is not None and within_spread(lab["fixes"], _rule(top), best)
            # the step's fixes lack the top's: its label cannot say the top is wrong (still counted as a miss); a fix
            # the label ran that failed (an error, a failed correctness check) is a miss on evidence, said apart
            miss = top is not None and not row["hit"] and not row["tie"]
            row["untimed"] = miss and _rule(top) not in lab["fixes"]
            row["fix_failed"] = miss and "gain" not in lab["fixes"].get(_rule(top), {"gain": None})
            hits += row["hit"]
            ties += row["tie"]
            untimed += row["untimed"]
        else:
            # a demoted verdict promises what it measured (the report ranks it so, and says DEMOTED)
            over = [v for v in fixes if _promise(v) > TUNED_GAIN_MAX]
            row["over"] = [f"{_rule(v)} " + (f"measured {_promise(v):.3g}x, demoted" if v.get("demoted") else
                                             f"expects {_expected(v):.3g}x") for v in over]
            if over:
                tuned_over.append(lab["name"])
        for v in fixes:
            gain, how = v.get("measured"), "confirmed"
            zoo_fix = lab["fixes"].get(_rule(v), {})
            if gain is None and v.get("blocked_by"):
                # its promise holds once the blocker's fix is made: the zoo's fix, made alone, does not measure it
                measured.append((lab["name"], _rule(v), None, f"blocked by {v['blocked_by']}: the zoo's fix is made "
                                 "without it", v.get("demoted", False)))
                continue
            if gain is None and "gain" in zoo_fix:
                gain, how = zoo_fix["gain"], "the zoo's fix"
            if gain is None:
                measured.append((lab["name"], _rule(v), None, "not measured", v.get("demoted", False)))
                continue
            expected = _expected(v)
            promised = 1 - 1 / expected if math.isfinite(expected) and expected > 0 else 1.0
            kept = (1 - 1 / gain) / promised if promised > 0 else math.inf
            measured.append((lab["name"], _rule(v), gain, how, v.get("demoted", False) or kept >= 0.5, kept))
        rows.append(row)
    ok_top = hits / labelled >= TOP_HITS_MIN if labelled else None
    checks.append(("top verdict names the best fix", ok_top, f"{hits} of {labelled} labelled steps" + (
        f"; {ties} more a fix within {TIE_MAX:.0%} of the best (shown, not counted)" if ties else "") + (
        f"; on {untimed} the label never timed the top's fix (counted as misses)" if untimed else "")))
    checks.append(("tuned steps: no verdict expects more than 10 %", not tuned_over if rows else None,
                   f"over: {', '.join(tuned_over) or 'none'}"))
    judged = [m for m in measured if m[2] is not None]
    bad = [f"{m[0]}/{m[1]}: {m[2]:.3g}x kept {m[5]:.0%}" for m in judged if not m[4]]
    checks.append(("every measured verdict kept half its expectation, or was demoted", not bad if judged else None,
                   f"{len(judged)} measured, {len(measured) - len(judged)} not measured; failing: {'; '.join(bad) or 'none'}"))
    return {"rows": rows, "checks": checks, "measured": measured}


def matrix_text(result: dict) -> str:
    rules = sorted({r for row in result["rows"] if "fired" in row for r in row["fired"]})
    short = lambda r: r.replace("_", "")[:8]          # noqa: E731
    first = max([len(r["name"]) for r in result["rows"]] + [4])
    lines = ["  ".join(["step".ljust(first)] + [short(r).rjust(8) for r in rules] + ["label".rjust(20), "top".rjust(20)])]
    for row in result["rows"]:
        if "fired" not in row:
            lines.append(f"{row['name'].ljust(first)}  {row['status']}: {row['why']}")
            continue
        cells = []
        for r in rules:
            v = row["fired"].get(r)
            if v is None:
                cells.append(".")
            else:
                share = v.get("expected", v.get("share", 0.0))
                mark = "d" if v.get("demoted") else ""
                cell = f"{100 * share:.0f}%{mark}"
                cells.append(f"[{cell}]" if r == row["label"] else cell)
        label = f"{row['label']} {row['label_gain']:.2f}x" if row["label"] != "tuned" else "tuned"
        hit = "" if "hit" not in row else (" ok" if row["hit"] else " tie" if row.get("tie") else
                                           " untimed" if row.get("untimed") else
                                           " MISS (fix failed)" if row.get("fix_failed") else " MISS")
        lines.append("  ".join([row["name"].ljust(first)] + [c.rjust(8) for c in cells]
                               + [label.rjust(20), (row["top"] + hit).rjust(20)]))
    lines.append("cells: the share of the step the rule's fix is expected to remove; [ ] the label's rule; d demoted")
    for name, ok, why in result["checks"]:
        lines.append(f"{'PASS' if ok else 'skip' if ok is None else 'FAIL'}  {name}: {why}")
    return "\n".join(lines)


def _diagnose_in_child(path: Path, a, say=print) -> dict:
    """One step's `diagnose` row from a child process (`python -m gpulab.diagnose.zoo diagnose --only`)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "one.json"
        cmd = [sys.executable, "-m", "gpulab.diagnose.zoo", "diagnose", "--only", path.stem, "--out", str(out)]
        if a.records:
            cmd += ["--records", a.records]
        if a.window:
            cmd += ["--window", str(a.window)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        for line in done.stdout.splitlines():
            say(line)
        if done.returncode != 0 or not out.exists():
            return {"name": path.stem, "error": f"the child process ended with {done.returncode}: "
                                                + (done.stderr.strip().splitlines() or ["no output"])[-1][:300]}
        rows = json.loads(out.read_text())["steps"]
        return rows[0] if rows else {"name": path.stem, "error": "the child process diagnosed nothing"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpulab.diagnose.zoo", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    lab = sub.add_parser("label")
    lab.add_argument("--out", required=True)
    lab.add_argument("--only", default=None, help="comma-separated step names")
    lab.add_argument("--scale", default=None)
    lab.add_argument("--checks", default=None, help="the correctness checks of earlier `check` runs (JSON, comma-separated)")
    lab.add_argument("--window", type=float, default=LABEL_WINDOW_S)
    lab.add_argument("--settle", action="store_true",
                     help="time each variant once torch.compile has stopped compiling new graphs (see `settle`)")
    chk = sub.add_parser("check")
    chk.add_argument("--out", required=True)
    chk.add_argument("--only", default=None)
    chk.add_argument("--rules", default=None, help="comma-separated: check only these fixes (e.g. elementwise_unfused)")
    dia = sub.add_parser("diagnose")
    dia.add_argument("--out", required=True)
    dia.add_argument("--only", default=None)
    dia.add_argument("--records", default=None, help="a folder: keep each diagnosis's record (new gpulab only)")
    dia.add_argument("--half", choices=("dev", "held_out"), default=None)
    dia.add_argument("--window", type=float, default=None)
    dia.add_argument("--own-process", action="store_true",
                     help="each step in a process of its own, as `gpulab diagnose script.py` runs it: what one "
                          "diagnosis leaves in a process (CUDA modules, the allocator's cache, CUPTI) does not "
                          "slow the next step's launches")
    jud = sub.add_parser("judge")
    jud.add_argument("labels", help="labels JSON; several comma-separated (a run in groups; a step's last row counts)")
    jud.add_argument("diagnoses", help="diagnoses JSON; several comma-separated")
    jud.add_argument("--only", choices=("dev", "held_out"), default=None)
    jud.add_argument("--names", default=None, help="judge only these steps (comma-separated): the steps of one issue")
    jud.add_argument("--json", default=None)
    sub.add_parser("probe").add_argument("--out", required=True)
    rec = sub.add_parser("records", help="analyse recorded diagnoses with the gpulab importable here")
    rec.add_argument("folder")
    rec.add_argument("--out", required=True)
    rec.add_argument("--confirmations", default=None,
                     help="the live diagnoses (JSON, several comma-separated) whose measured gains the re-analysed "
                          "verdicts take")
    for sub_ in (lab, chk, dia):
        sub_.add_argument("--group", default=None,
                          help="K/N: only the K-th of N groups of the steps (every N-th, from the K-th), so that each "
                               "group's run fits one device call; judge reads the groups' files together")
    a = p.parse_args(argv)
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    files = step_files()
    if getattr(a, "only", None) and a.cmd != "judge":
        wanted = set(a.only.split(","))
        files = [f for f in files if f.stem in wanted]
    if getattr(a, "group", None):
        files = group(files, a.group)
    stamp = {"kind": f"{FILE_KINDS['zoo']} {a.cmd}",
             "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "torch": torch.__version__, "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU"}
    if a.cmd == "label":
        rows = []
        checks = None
        for name in (a.checks.split(",") if a.checks else []):     # several files: the later adds to the earlier
            checks = checks or {}
            for stem, rules in json.loads(Path(name).read_text())["checks"].items():
                checks.setdefault(stem, {}).update(rules)
        for f in files:
            rows.append(label_step(f, a.scale, device, say=lambda s: print(s, flush=True), checks=checks,
                                   window_s=a.window, settled=a.settle))
            Path(a.out).write_text(json.dumps({**stamp, "checks_from": a.checks, "settled": a.settle, "steps": rows}, indent=1))
        return 0
    if a.cmd == "check":
        out: dict = {}
        from gpulab.diagnose.zoo_label import WithGeneric, GENERIC
        for f in files:
            module = WithGeneric(load(f), GENERIC)      # the fixes made from outside too (a step without a model: none run)
            for rule in [r for r in module.FIXES if not a.rules or r in a.rules.split(",")]:
                try:
                    out.setdefault(f.stem, {})[rule] = same_model(module, rule, device)
                except Exception as err:       # noqa: BLE001
                    out.setdefault(f.stem, {})[rule] = {"ok": False, "why": f"{type(err).__name__}: {err}"}
                print(f"{f.stem} / {rule}: {out[f.stem][rule]['why']}", flush=True)
                Path(a.out).write_text(json.dumps({**stamp, "checks": out}, indent=1))
        return 0
    if a.cmd == "diagnose":
        import gpulab
        rows, records = [], Path(a.records) if a.records else None
        if records is not None:
            records.mkdir(parents=True, exist_ok=True)
        if a.half:
            files = [f for f in files if held_out(f.stem) == (a.half == "held_out")]
        extra = {"window_s": a.window} if a.window else {}
        if a.records:
            extra["confirm"] = True
        for f in files:
            lab = load(f)
            need = getattr(lab, "NEEDS_GPUS", 1)
            if need > 1 and need > (torch.cuda.device_count() if device.type == "cuda" else 0):
                rows.append({"name": f.stem, "error": "skipped: needs more GPUs"})
                continue
            if a.own_process:
                rows.append(_diagnose_in_child(f, a, say=lambda s: print(s, flush=True)))
            else:
                rows.append(diagnose_step(f, device, records, say=lambda s: print(s, flush=True), **extra))
            Path(a.out).write_text(json.dumps({**stamp, "gpulab": str(Path(gpulab.__file__).parent), "steps": rows},
                                              indent=1))
        return 0
    if a.cmd == "judge":
        labels, diagnoses = read_steps(a.labels.split(",")), read_steps(a.diagnoses.split(","))
        if a.names:
            wanted = set(a.names.split(","))
            labels = [row for row in labels if row["name"] in wanted]
        result = judge(labels, diagnoses, a.only)
        print(matrix_text(result))
        if a.json:
            Path(a.json).write_text(json.dumps({"kind": f"{FILE_KINDS['zoo']} judge", **result}, indent=1, default=str))
        return 0
    if a.cmd == "records":
        rows = []
        live = {r["name"]: r for r in read_steps(a.confirmations.split(","))} if a.confirmations else {}
        for path in sorted([*Path(a.folder).glob("*.json.gz"), *Path(a.folder).glob("*.json.xz")]):
            try:
                rows.append(with_confirmations(diagnose_record(path), live.get(path.name.split(".")[0])))
            except Exception as err:       # noqa: BLE001
                rows.append({"name": path.name.split(".")[0], "error": f"{type(err).__name__}: {err}"})
            print(rows[-1]["name"], rows[-1].get("error") or [v["rule"] for v in rows[-1]["verdicts"]], flush=True)
        import gpulab
        Path(a.out).write_text(json.dumps({**stamp, "gpulab": str(Path(gpulab.__file__).parent), "from_records": a.folder,
                                           "confirmations_from": a.confirmations,
                                           "steps": rows}, indent=1))
        return 0
    if a.cmd == "probe":
        from gpulab.diagnose.probe import probe_kernels
        out = probe_kernels(device)
        Path(a.out).write_text(json.dumps({**stamp, "kernels": out}, indent=1))
        for k, v in out.items():
            print(k, "->", "; ".join(v)[:400])
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
