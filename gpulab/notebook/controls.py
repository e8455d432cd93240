"""The controls of a panel, and the one vocabulary lessons validate their settings with.

`Choice(options)`, `Toggle()` and `IntRange(min, max, step)` each `validate(name, value)`: the value
back (a whole-number string or float is turned into an int), or ValueError saying what is allowed.
The widget panel (`notebook.widgets.Panel`) refuses bad input with that message, and a lesson's
options (the capstone's `Options`) check their fields with the same controls, so a toggle means the
same thing in a panel and in code. `widget(name, value)` builds the ipywidget (imported only then).

`matmul_sizes(min, max, ...)` is the IntRange for the n of an n x n x n matrix product, its max lowered
to what this device runs within a time budget (and, on a GPU, in its free memory), with the reason.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Choice:
    """One of a fixed set of values (shown as toggle buttons)."""

    options: tuple
    label: str = ""

    def validate(self, name: str, value: Any) -> Any:
        if value not in self.options:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, self.options))} "
                             f"(got {value!r}).")
        return value

    def widget(self, name: str, value: Any) -> Any:
        import ipywidgets as W

        return W.ToggleButtons(options=list(self.options), value=value,
                               description=self.label or name, style={"button_width": "auto"})


@dataclass(frozen=True)
class Toggle:
    """On or off."""

    label: str = ""

    def validate(self, name: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False (got {value!r}).")
        return value

    def widget(self, name: str, value: Any) -> Any:
        import ipywidgets as W

        return W.Checkbox(value=bool(value), description=self.label or name, indent=False)


@dataclass(frozen=True)
class IntRange:
    """An integer between min and max (inclusive); typed into a box, so it can be wrong."""

    min: int
    max: int
    step: int = 1
    label: str = ""
    why: str = ""        # why max is where it is (it depends on the device): added to the refusal of a
                         # larger value; a smaller one is refused as "at least min", the same everywhere

    def __post_init__(self) -> None:
        for what, v in (("min", self.min), ("max", self.max), ("step", self.step)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"IntRange {what} must be a whole number (got {v!r}).")
        if self.step < 1:
            raise ValueError(f"IntRange step must be 1 or more (got {self.step}).")
        if self.min > self.max:
            raise ValueError(f"IntRange min {self.min} is above max {self.max}.")

    def validate(self, name: str, value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError(f"{name} must be a whole number (got {value!r}).")
        if not isinstance(value, int):
            try:
                as_float = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"{name} must be a whole number (got {value!r}).") from None
            if not as_float.is_integer():
                raise ValueError(f"{name} must be a whole number (got {value!r}).")
            value = int(as_float)
        if self.why and value < self.min:
            # max depends on the device (see `why`): a value below min is refused without it
            raise ValueError(f"{name} must be at least {self.min} (got {value}).")
        if not self.min <= value <= self.max:
            why = f" {self.why}" if self.why else ""
            raise ValueError(f"{name} must be between {self.min} and {self.max} (got {value}).{why}")
        if (value - self.min) % self.step:
            raise ValueError(f"{name} must be {self.min} plus a multiple of {self.step} "
                             f"(got {value}).")
        return value

    def widget(self, name: str, value: Any) -> Any:
        import ipywidgets as W

        # A free text box, not a slider: the learner can type any size, and a
        # wrong one gets a message instead of being silently clamped.
        box = W.IntText(value=value, description=self.label or name, step=self.step)
        box.tooltip = f"{self.min} to {self.max}" + (f": {self.why}" if self.why else "")
        return box


def matmul_n_limit(flop_per_s: float, calls: int, budget_s: float, free_bytes: int | None = None,
                   operands: int = 3, bytes_per_element: int = 4) -> tuple[int, str]:
    """The largest n whose `calls` n x n x n products (2 n^3 FLOP each) take at most `budget_s` seconds at
    `flop_per_s`, and, given `free_bytes`, whose `operands` n x n matrices fit in half of it; with the
    reason for the binding limit, in words."""
    by_time = int((budget_s * flop_per_s / (2 * calls)) ** (1 / 3))
    limits = [(by_time, f"a run times {calls} products, and at {flop_per_s / 1e12:.3g} TFLOP/s those of a "
                        f"larger n take more than {budget_s:g} s")]
    if free_bytes is not None:
        by_memory = int(math.sqrt(0.5 * free_bytes / (operands * bytes_per_element)))
        limits.append((by_memory, f"{operands} matrices of a larger n in {bytes_per_element}-byte elements need "
                                  f"more than half of the {free_bytes / 2**30:.3g} GiB the GPU has free"))
    n, why = min(limits)
    if n >= 256:
        n -= n % 64                      # a size one would type
    return n, why


def matmul_sizes(low: int, high: int, precisions=("fp32",), calls: int = 7, budget_s: float = 10.0,
                 operands: int = 3, label: str = "") -> IntRange:
    """IntRange(low, max) for the n of a panel's matrix products, max = the smallest of `high` and what this
    device runs in `budget_s` seconds per panel run (`calls` products) and, on a GPU, in half its free memory.

    The speed is notebook 00's measured TFLOP/s for the slowest of `precisions` (`gpulab.core.ceilings`:
    a datasheet figure where nothing was measured); without either, one product timed here and now. The
    refusal of a larger n says which limit applies and why.
    """
    import torch
    from gpulab.core.ceilings import ceilings
    from gpulab.core.device import pick_device
    from gpulab.core.memory import free_memory
    from gpulab.core.timing import benchmark

    device = pick_device()
    found = [c for c in (ceilings().get(f"matmul_{p}") for p in precisions) if c is not None and c.value > 0]
    if found:
        slowest = min(found, key=lambda c: c.value)
        rate, source = slowest.value * 1e12, f"{slowest.name[7:]}, {slowest.source}"
    else:
        n0 = 2048 if device.type == "cuda" else 256
        a = torch.randn(n0, n0, device=device)
        t = benchmark(lambda: a @ a, budget_s=0.1)
        del a
        rate, source = t.per_second(2 * n0**3), f"fp32 at n={n0}, timed just now: notebook 00 has not run here"
    free = free_memory(device)
    if free is not None:
        free = free[0] + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    n, why = matmul_n_limit(rate, calls, budget_s, free, operands)
    where = "this GPU" if device.type == "cuda" else "the CPU"
    if n >= high:      # this device runs every size offered; the max still depends on the device, so say so
        return IntRange(low, high, label=label,
                        why=f"{where[0].upper()}{where[1:]} runs every size up to {high} within the limits ({source}).")
    n = max(n, low)
    return IntRange(low, n, label=label, why=f"Larger sizes are refused on {where}: {why} ({source}).")
