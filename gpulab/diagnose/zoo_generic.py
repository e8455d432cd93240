"""Fixes the zoo's labeller makes to any step from outside, as the diagnosis's variants do (`confirm.py`), so that a
label can name the fix of every verdict the rules could give a step (issue 41, item 5) without editing the frozen
step files.

- `elementwise_unfused`: the step's model (`step.model`) compiled in place with torch.compile's default mode (the
  pointwise chains fused, no CUDA graphs; `confirm.compiled_in_place`), on a step whose own code compiles nothing
  and whose file has no fix of its own for that rule. The backend is the zoo's (`zoo/_common.compile_backend`:
  inductor on a GPU, aot_eager on the CPU or where ZOO_COMPILE_BACKEND says).
"""
from __future__ import annotations

import os

import torch

GENERIC = {"elementwise_unfused": "torch.compile(model) (default mode: its pointwise chains fused, no CUDA graphs), "
                                  "made from outside the step: its model compiled in place"}


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
        from gpulab.diagnose.confirm import compiled_in_place

        step = self._module.make_step(None, **kwargs)
        model = getattr(step, "model", None)
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"{fix}: the step exposes no model (step.model) to compile")
        device = next(model.parameters()).device
        backend = os.environ.get("ZOO_COMPILE_BACKEND") or ("inductor" if device.type == "cuda" else "aot_eager")
        compiled = compiled_in_place(model, backend=backend)
        compiled.__enter__()
        own_close = getattr(step, "close", None)

        def close():
            if own_close is not None:
                own_close()
            compiled.__exit__(None, None, None)       # the model's own forward back, torch.compile's state reset

        step.close = close
        return step


def probe(module, scale: str, device: torch.device, graphs: int | None = None) -> tuple[bool, bool]:
    """(whether the step as written exposes its model as `step.model`, whether it compiles anything): `graphs`, the
    graphs its settled timing compiled, where the labeller settled it; else one step is run to see."""
    from gpulab.diagnose.core import compile_counters

    step = module.make_step(None, scale=scale, device=device)
    try:
        if not isinstance(getattr(step, "model", None), torch.nn.Module):
            return False, graphs is not None and graphs > 0
        if graphs is not None:
            return True, graphs > 0
        before = compile_counters().get("graphs", 0)
        step()
        return True, compile_counters().get("graphs", 0) != before
    finally:
        close = getattr(step, "close", None)
        if close is not None:
            close()
        torch.compiler.reset()


def with_generic(module, as_written: dict, scale: str, device: torch.device):
    """`module` with GENERIC's fixes where its step as written exposes its model and compiles nothing (`as_written`:
    its timing, whose `settle` counted the graphs it compiled where the labeller settled it)."""
    model, compiled = probe(module, scale, device, (as_written.get("settle") or {}).get("graphs"))
    return WithGeneric(module, GENERIC) if model and not compiled else module
