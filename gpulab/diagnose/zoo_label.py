"""The zoo labeller's additions to `zoo.label_step` (issue 41): fixes made to any step from outside, the step as
written timed again after its fixes, and when two fixes' gains are a tie.

- `GENERIC`, `WithGeneric`, `with_generic`: the fixes a diagnosis makes from outside (`confirm.py`), so that a label
  can name the fix of every verdict the rules could give a step (item 5) without editing the frozen step files.
  `elementwise_unfused`: the step's model (`step.model`) compiled in place with torch.compile's default mode (the
  pointwise chains fused, no CUDA graphs; `model_variants.compiled_in_place`), on a step whose own code compiles nothing
  and whose file has no fix of its own for that rule, with the zoo's backend (`zoo/_common.compile_backend`).
- `retime`, `warmed_by_the_fixes`: every variant starts from the same batches, so a cache of the process that the
  first timing filled (each new shape's first run) makes later variants read faster; timed again where it did.
- `within_spread`: a fix whose gain is within TIE_MAX of the best's, and within the two timings' spreads.
"""
from __future__ import annotations

import torch

GENERIC = {"elementwise_unfused": "torch.compile(model) (default mode: its pointwise chains fused, no CUDA graphs), "
                                  "made from outside the step: its model compiled in place"}


def _compile_backend(device: torch.device) -> str:
    """The zoo's own choice (`zoo/_common.py`'s compile_backend), imported from there."""
    from gpulab.diagnose.zoo import ZOO, load
    return load(ZOO / "_common.py").compile_backend(device)


class WithGeneric:
    """A zoo step module with `rules` of GENERIC added to its FIXES; everything else is the module's."""

    def __init__(self, module, rules):
        self._module = module
        self._generic = [r for r in rules if r in GENERIC and r not in module.FIXES]
        self.FIXES = {**module.FIXES, **{r: GENERIC[r] for r in self._generic}}

    def __getattr__(self, name):
        return getattr(self._module, name)

    def make_step(self, fix=None, **kwargs):
        if fix not in self._generic:
            return self._module.make_step(fix, **kwargs)
        from gpulab.diagnose.model_variants import compiled_in_place

        step = self._module.make_step(None, **kwargs)
        model = getattr(step, "model", None)
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"{fix}: the step exposes no model (step.model) to compile")
        own_close = getattr(step, "close", None)
        compiled = compiled_in_place(model, backend=_compile_backend(next(model.parameters()).device))
        compiled.__enter__()

        def close():
            try:
                if own_close is not None:
                    own_close()
            finally:
                compiled.__exit__(None, None, None)     # the model's own forward back, torch.compile's state reset

        try:
            step.close = close
        except AttributeError:
            close()
            raise
        return step


def probe(module, scale: str, device: torch.device) -> tuple[bool, bool]:
    """(whether the step as written exposes its model as `step.model`, whether one step of it compiles anything)."""
    from gpulab.core.memory import release
    from gpulab.diagnose.core import compile_counters

    step = module.make_step(None, scale=scale, device=device)
    try:
        if not isinstance(getattr(step, "model", None), torch.nn.Module):
            return False, False
        before = compile_counters().get("graphs", 0)
        step()
        return True, compile_counters().get("graphs", 0) != before
    finally:
        close = getattr(step, "close", None)
        if close is not None:
            close()
        del step
        torch.compiler.reset()
        release(device)


def with_generic(module, as_written: dict, scale: str, device: torch.device):
    """`module` with GENERIC's fixes where its step as written exposes its model and compiles nothing. `as_written`
    is its timing (`zoo.step_time`): where it settled, its graph count and whether it had a model answer without
    building the step again; else `probe` runs one step."""
    graphs = (as_written.get("settle") or {}).get("graphs")
    if graphs is not None and "has_model" in as_written:
        model, compiled = as_written["has_model"], graphs > 0
    else:
        model, compiled = probe(module, scale, device)
    return WithGeneric(module, GENERIC) if model and not compiled else module


def warmed_by_the_fixes(first: dict, again: dict) -> bool:
    """Whether the step as written ran faster after its fixes' timings than before them, beyond TUNED_GAIN_MAX
    and the two timings' spreads: the fixes' runs filled a cache of the process that the first timing paid for
    (a step whose shapes change: each new shape's first run; every variant starts again from the same batches)."""
    from gpulab.diagnose.zoo import TUNED_GAIN_MAX

    ratio = first["ms"] / again["ms"]
    return ratio > max(TUNED_GAIN_MAX, 1 + first.get("spread", 0.0) + again.get("spread", 0.0))


def retime(module, out: dict, scale: str, device: torch.device, window_s: float, settled: bool, say=print) -> None:
    """Time the step as written again after its fixes (`as_written_again`). Where it ran faster
    (`warmed_by_the_fixes`), the first timings paid one-time costs that a training run pays once: every variant is
    timed a second time, in the same order, and the label uses the second pass (the first kept as `first_pass`).
    On the H100 (2026-12-06, labels of results/zoo/2026-12-06-h100-issue41/) hf_trainer_dynamic_padding read 126 ms
    as written, timed first, and 12.6 ms with only its optimizer fused, timed after three other variants had run
    its batches' lengths: every fix read 2.5x to 16x."""
    from gpulab.diagnose.zoo import step_time, time_fix

    again = step_time(module, None, scale, device, window_s, settled)
    out["as_written_again"] = again
    if not warmed_by_the_fixes(out["as_written"], again):
        return
    out["first_pass"] = {"as_written": out["as_written"],
                         "fixes": {r: {k: f[k] for k in ("ms", "gain") if k in f} for r, f in out["fixes"].items()}}
    say(f"{module.__name__.removeprefix('zoo_')}: {out['as_written']['ms']:.3g} ms as written first, "
        f"{again['ms']:.3g} ms after its fixes: every variant timed again")
    out["as_written"] = again
    for rule, row in out["fixes"].items():
        if "gain" not in row:
            continue
        time_fix(module, rule, row, again["ms"], scale, device, window_s, settled, when=" when timed again")


def within_spread(fixes: dict, rule: str, best: str) -> bool:
    """Whether fix `rule` ties with the best: itself worth a verdict (TUNED_GAIN_MAX), and the best's gain within
    TIE_MAX of its own and within the two timings' spreads (relative). On the H100 labels (2026-12-06) compiling a
    GPU-bound model with and without CUDA graphs is such a pair; a noisy timing does not widen it past TIE_MAX."""
    from gpulab.diagnose.zoo import TIE_MAX, TUNED_GAIN_MAX

    a, b = fixes.get(rule, {}), fixes.get(best, {})
    if "gain" not in a or "gain" not in b or a["gain"] < TUNED_GAIN_MAX:
        return False
    return b["gain"] <= a["gain"] * (1 + min(a.get("spread", 0.0) + b.get("spread", 0.0), TIE_MAX))
