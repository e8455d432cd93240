"""Reference answers to notebook 15's free-text exercises (diagnosing a training step)."""
from __future__ import annotations

import contextlib

import torch

import gpulab
from gpulab.core.device import pick_device
from gpulab.exercises.answers import ROOT, Answer, one_thread_on_cpu
from gpulab.lessons.l15_your_training_step import Options, TrainingStep, config, measured_gain

RECORD = ROOT / "results" / "zoo" / "2026-12-02-h200-run-h" / "records-h200-2026-12-02-h" / "lstm_fp32.json.gz"   # exercise 5's record


def _where(scale: str) -> dict:
    return {"device": pick_device().type, "scale": scale}


def _diagnosed(options: Options, cfg: dict, device: torch.device, width: int | None = None,
               passes: int | None = None, label: str = ""):
    """The panel's run: a `TrainingStep` with `options`, diagnosed, closed. Returns (diagnosis, width, passes)."""
    step = TrainingStep(options, cfg, device, width=width, passes=passes)
    try:
        d = gpulab.diagnose(step, warmup=cfg["warmup"], steps=cfg["steps"], label=label)
    finally:
        step.close()
    return d, step.width, step.passes


def _spread(d) -> float:
    return d.step_spread_ms / d.step_ms


def _verdict(d, rule: str):
    return next((v for v in d.verdicts if v.rule == rule), None)


def _host_top(d, n: int = 3) -> str:
    causes = sorted(d.idle_by_cause.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{c} {ms:.3g} ms" for c, ms in causes if ms > 0) or "none"


# -- 1. the order of the verdicts -------------------------------------------------------------------
def _order(scale: str) -> dict:
    device = pick_device()
    d, _, _ = _diagnosed(Options(), config(scale), device, label="slow step")
    out = {**_where(scale), "step ms": d.step_ms, "verdicts, in order": " > ".join(v.rule for v in d.verdicts) or "none",
           "skipped rules": len(d.skipped)}
    for i, v in enumerate(d.verdicts, 1):
        out[f"{i}. {v.rule}"] = f"share {v.share:.2f}, expected {v.expected_gain:.3g}x, at most {v.bound:.3g}x"
    out["verdicts expecting more than their bound"] = sum(v.expected_gain > v.bound * (1 + 1e-9) for v in d.verdicts)
    out["verdicts"] = len(d.verdicts)
    return out


def _order_claim(f: dict) -> str | None:
    if not f["verdicts"]:
        return "no verdict at all: not even compute_bound, which shows when no fix fired"
    if f["verdicts expecting more than their bound"]:
        return "a verdict expected more than its own bound allows"
    return None


# -- 2. pinning -------------------------------------------------------------------------------------
def _pinned(scale: str) -> dict:
    device = pick_device()
    cfg = config(scale)
    slow, width, passes = _diagnosed(Options(), cfg, device, label="slow step")
    pinned, _, _ = _diagnosed(Options(pinned=True), cfg, device, width, passes, "pinned")
    both, _, _ = _diagnosed(Options(workers=8, pinned=True, precision="16-bit"), cfg, device, width, passes,
                            "8 workers, pinned, 16-bit")
    out = {**_where(scale), "slow step ms": slow.step_ms, "pinned ms": pinned.step_ms,
           "8 workers + pinned + 16-bit ms": both.step_ms,
           "host time, pinned (0 workers)": _host_top(pinned), "host time, 8 workers + pinned + 16-bit": _host_top(both)}
    v = _verdict(slow, "pageable_copy")
    if v is None:
        out["pageable_copy verdict"] = "did not fire on the slow step"
    else:
        g = measured_gain(slow.step_ms, pinned.step_ms, v.bound, _spread(slow), _spread(pinned), expected=v.expected_gain)
        out.update({"pageable_copy bound": v.bound, "pageable_copy expected": v.expected_gain,
                    "pinning's speed-up": g["speedup"], "within the bound": g["within"], "enough": g["enough"]})
    return out


def _pinned_claim(f: dict) -> str | None:
    if f.get("within the bound") is False:
        return "pinning saved more than the pageable-copy verdict's bound allows, beyond the steps' spread"
    return None


# -- 3. .item() every step --------------------------------------------------------------------------
def _item(scale: str) -> dict:
    device = pick_device()
    cfg = config(scale)
    fast = dict(workers=8, pinned=True, precision="16-bit")
    on, width, passes = _diagnosed(Options(log_every_step=True, **fast), cfg, device, label="log every step")
    off, _, _ = _diagnosed(Options(log_every_step=False, **fast), cfg, device, width, passes, "no log")
    out = {**_where(scale), "log every step ms": on.step_ms, "no log ms": off.step_ms,
           ".item() per step ms": on.step_ms - off.step_ms, "spread ms (both)": on.step_spread_ms + off.step_spread_ms,
           "host time, log every step": _host_top(on), "host time, no log": _host_top(off)}
    v = _verdict(on, "host_sync")
    if v is not None:
        g = measured_gain(on.step_ms, off.step_ms, v.bound, _spread(on), _spread(off), expected=v.expected_gain)
        out.update({"host_sync expected": v.expected_gain, "host_sync bound": v.bound, "within the bound": g["within"]})
    return out


def _item_claim(f: dict) -> str | None:
    if f["no log ms"] > f["log every step ms"] + f["spread ms (both)"]:
        return "the step without .item() was slower, beyond the two steps' spread"
    if f.get("within the bound") is False:
        return "dropping .item() saved more than the host_sync verdict's bound allows"
    return None


# -- 4. your own step -------------------------------------------------------------------------------
def _my_step(device: torch.device, fused: bool = False, half: torch.dtype | None = None):
    """Section 4's step (its MLP and AdamW), with the fixes the diagnosis may name: a fused AdamW, autocast."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True if fused else None)

    def my_step():
        x = torch.randn(256, 512, device=device)
        with torch.autocast(device.type, dtype=half, enabled=half is not None) if half else contextlib.nullcontext():
            loss = (model(x) - x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return my_step


def _fix_for(rule: str, device: torch.device) -> dict | None:
    if rule == "optimizer_unfused":
        return {"fused": True}
    if rule == "fp32_matmuls" and device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False):
        return {"half": torch.bfloat16}             # bf16 needs no GradScaler (lesson 06)
    return None


def _own(scale: str) -> dict:
    device = pick_device()
    cfg = config(scale)
    # tiny: a shorter unprofiled window than diagnose's default (the CPU run only shows the code path)
    kw = dict(warmup=cfg["warmup"], steps=cfg["steps"], **({"window_s": 0.3} if scale == "tiny" else {}))
    before = gpulab.diagnose(_my_step(device), label="my step", **kw)
    top = next((v for v in before.verdicts if v.actionable), None)
    out = {**_where(scale), "step ms": before.step_ms, "top verdict": top.rule if top else "none actionable",
           "verdicts": " > ".join(v.rule for v in before.verdicts) or "none"}
    fix = _fix_for(top.rule, device) if top else None
    if top is not None and fix is None:
        out["fix"] = f"none written here for {top.rule}: {top.fix}"
    if fix is not None:
        after = gpulab.diagnose(_my_step(device, **fix), label="my step, fixed", **kw)
        g = measured_gain(before.step_ms, after.step_ms, top.bound, _spread(before), _spread(after),
                          expected=top.expected_gain)
        out.update({"fix": ", ".join(fix), "fixed step ms": after.step_ms, "expected": top.expected_gain,
                    "bound": top.bound, "speed-up": g["speedup"], "enough": g["enough"], "within": g["within"]})
    return out


def _own_claim(f: dict) -> str | None:
    if f.get("within") is False:
        return "the fix saved more than its verdict's bound, beyond the steps' spread: the rule missed time it removed"
    return None


# -- 5. a threshold -------------------------------------------------------------------------------
def _threshold(scale: str) -> dict:
    from gpulab.diagnose import kernel_rules as rules      # fp32_matmuls reads its threshold from its own module
    from gpulab.diagnose.core import Diagnosis, from_record
    d = from_record(str(RECORD))
    fp32 = _verdict(d, "fp32_matmuls")
    old = rules.FP32_GEMM_SHARE_MIN
    new = 0.9                                  # fp32 products must be 90 % of the step before 16-bit is suggested
    again = Diagnosis.from_facts(d.facts, device=d.device, step_spread_ms=d.step_spread_ms)   # as recorded
    try:
        rules.FP32_GEMM_SHARE_MIN = new
        moved = Diagnosis.from_facts(d.facts, device=d.device, step_spread_ms=d.step_spread_ms)
    finally:
        rules.FP32_GEMM_SHARE_MIN = old
    names = lambda x: " > ".join(v.rule for v in x.verdicts) or "none"     # noqa: E731
    return {**_where(scale), "record": RECORD.name, "FP32_GEMM_SHARE_MIN": f"{old} -> {new}",
            "fp32_matmuls share": fp32.share if fp32 else "-", f"verdicts at {old}": names(d),
            f"verdicts at {old}, analysed again": names(again), f"verdicts at {new}": names(moved)}


def _threshold_claim(f: dict) -> str | None:
    old, new = (s.strip() for s in f["FP32_GEMM_SHARE_MIN"].split("->"))
    if f[f"verdicts at {old}"] != f[f"verdicts at {old}, analysed again"]:
        return "the same record at the same threshold gave other verdicts"
    share = f["fp32_matmuls share"]
    if isinstance(share, float) and share < float(new) and "fp32_matmuls" in f[f"verdicts at {new}"]:
        return "fp32_matmuls still fired with its share under the raised threshold"
    return None


ANSWERS = [
    Answer("15", 1, run=one_thread_on_cpu(_order), expect=_order_claim, text=(
        "Diagnose the slow step (`gpulab.diagnose(TrainingStep(Options(), cfg, device))`) and read its verdicts "
        "in order: they are ranked by the gain a variant measured where one ran (confirm.py), else by the expected "
        "gain, and each verdict's evidence gives the share of the step it found (a wait in `next(loader)`, "
        "a blocking copy, `.item()`, fp32 products). A guess goes wrong where a habit costs less or more on this "
        "machine than you thought: a fast host makes the batches keep up, a slow GPU makes fp32 products the "
        "largest share. Each expected gain stays within its bound, 1 / (1 - share): the run checks that. On the "
        "CPU the GPU-only rules are skipped, and the chain stops at the first verdict without a fix.")),
    Answer("15", 2, needs="cuda", run=one_thread_on_cpu(_pinned), expect=_pinned_claim, text=(
        "Diagnose the slow step, then `pinned=True` alone, then with 8 workers and 16-bit, and judge pinning's "
        "speed-up with `measured_gain` against the pageable-copy verdict's bound. With 0 workers the pinning copy "
        "runs in the main thread inside `next(loader)`, so the diagnosis moves that time from 'pageable copy' to "
        "'input' rather than removing it: pinning alone buys less than its bound promised. With workers the "
        "DataLoader's pin-memory thread does it beside the step, and the host's time goes to issuing GPU work. "
        "The run checks that pinning did not save more than the bound allows, beyond the steps' spread.")),
    Answer("15", 3, needs="cuda", run=one_thread_on_cpu(_item), expect=_item_claim, text=(
        "With 8 workers, `pinned` and 16-bit, diagnose the step with `log_every_step` on and off: the difference "
        "is what `.item()` cost per step. `.item()` blocks the host until the GPU has finished the step's queued "
        "work, so the host cannot queue the next step's kernels in the meantime and the GPU then idles while it "
        "does. The idle time is about the host's own work per step (fetching the batch, launching), a fixed "
        "cost, so it is a larger share of a fast step than of a slow one. The run checks that the step without "
        "`.item()` is not slower beyond the spread, and within the host_sync verdict's bound where it fired.")),
    Answer("15", 4, run=one_thread_on_cpu(_own), expect=_own_claim, text=(
        "Diagnose section 4's step, take its top actionable verdict, apply that one fix (here: a fused AdamW for "
        "`optimizer_unfused`, bf16 autocast for `fp32_matmuls`), diagnose again and call `measured_gain(before_ms, "
        "after_ms, v.bound, spread_before, spread_after, expected=v.expected_gain)`. 'enough' says the fix saved "
        "at least half of what the verdict expected; 'within' says it saved no more than the bound allows, give "
        "or take the spread. A fix that is not 'enough' left part of the cause, or another part of the step now "
        "sets its pace; one not 'within' removed time the rule did not count. On the CPU usually no rule with a "
        "fix fires, and the run says so.")),
    Answer("15", 5, run=one_thread_on_cpu(_threshold), expect=_threshold_claim, text=(
        "For example, raise `FP32_GEMM_SHARE_MIN` from 0.10 to 0.90, arguing that 16-bit changes numerics and "
        "should be suggested only when fp32 products are almost the whole step. Analyse the recorded H200 LSTM "
        "again with `from_record(...)`: the rules run on the recorded facts, so the same threshold gives the same "
        "verdicts, and a changed one moves exactly the verdicts whose share crosses it. Here fp32_matmuls' share "
        "is below 0.90, so it disappears and compute_bound, shown when no fix fires, takes its place. The run "
        "changes the threshold only inside itself and restores it.")),
]
