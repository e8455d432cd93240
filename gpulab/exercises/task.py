"""What a graded exercise is: a `Task` (the slow code as given, the lesson's own fix, how to build the work
at a scale), and the `Workload` one grading builds from it.

The learner's function has the slow code's signature. The grader (`gpulab.exercises.grader`) hands the slow
code, the reference fix and the learner's function, each in turn, to `Workload.instantiate`, which returns a
`Runner`: a callable taking one call's inputs (drawn fresh by `Workload.draw` from a generator the submission
cannot read) and returning its outputs, and `state()`, the tensors that say whether it trained the same model
(the parameters; None for a function without state).

Two kinds cover the lessons:
- `training(...)`: the factory builds a training step from a model and its optimizer,
  `make_step(model, optimizer) -> step(x, y) -> loss`; every runner starts from the same weights;
- `function(...)`: a pure function of tensors, `fn(*inputs) -> tensor`.

Tiers of "the same training" (grading.md): `systems` (workers, pinning, streams, graphs, fusion, layout: the
parameters after k updates within four times the noise floor of the reference trained on reordered rows) and `numerics`
(AMP, TF32, accumulation: at most SAME_MAX_FLOOR times as far from the slow code's fp32 result as the lesson's
own fix is, and the loss likewise).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from gpulab.models.same import parameters

TIERS = ("systems", "numerics")


@dataclass
class Runner:
    """One instantiated variant: `call(inputs) -> outputs`; `state()` its parameters (or None)."""

    call: Callable[[Any], Any]
    state: Callable[[], list[torch.Tensor] | None] = lambda: None
    close: Callable[[], None] = lambda: None


@dataclass
class Workload:
    """What one grading builds from a task, at one scale on one device.

    - `instantiate(factory) -> Runner`: the same starting point for every variant (weights from a fixed seed);
    - `draw(gen) -> inputs`: one call's inputs, fresh, from the grader's secret generator, which lives on the
      device the inputs are used on (`gen.device`: the GPU, or the CPU): draw with `device=gen.device`; `to_device`
      moves what is elsewhere, outside the timed region;
    - `reorder(inputs) -> inputs`: the same inputs with the batch's rows in another order, for the systems tier's
      noise floor (None: a function task, whose floor is `rtol`/`atol`);
    - `min_bytes(inputs)`: the fewest bytes a call must move, for the physics check (None: not counted);
    - `sizes`: what was chosen and why, printed with the verdict."""

    instantiate: Callable[[Callable], Runner]
    draw: Callable[[torch.Generator], Any]
    to_device: Callable[[Any], Any]
    reorder: Callable[[Any], Any] | None = None
    min_bytes: Callable[[Any], float] | None = None
    sizes: dict = field(default_factory=dict)
    rtol: float = 1e-5          # function tasks: |sub - ref| <= atol + rtol |ref| (and 4x |slow - ref|)
    atol: float = 1e-6


@dataclass(frozen=True)
class Task:
    """A graded exercise. `slow` and `reference` are importable functions (shown in the notebook with
    `show_source`), with the signature the learner's function must have; `build(scale, device)` returns the
    `Workload`. `needs(device) -> str | None` says why this machine cannot run it (the exercise then says so);
    `share`: the learner must reach this share of the reference's measured gain on this GPU."""

    name: str                     # "01.sync": lesson, then a short name
    lesson: str
    title: str
    tier: str
    slow: Callable
    reference: Callable
    build: Callable[[str, torch.device], Workload]
    what: str                     # what to do, one paragraph
    hints: tuple[str, str]
    share: float = 0.5
    k: int = 3                    # updates before the correctness comparison
    calls: str = "updates"        # what those k calls are, as the grader says it ("epochs": 03's loader, an epoch a call)
    warmup: int = 3               # untimed calls of each variant before timing (compilation included)
    needs: Callable[[torch.device], str | None] = lambda device: None
    env: dict = field(default_factory=dict)     # environment of the grading process (set before CUDA starts)
    # the submission's peak GPU memory over its correctness calls may be at most this times the reference's
    # (lessons whose fix is about memory: checkpointing, accumulation); None: memory is not judged
    max_peak: float | None = None
    gpu_only_gain: str = "on the CPU the lesson's effect is not there to measure"

    def __post_init__(self):
        if self.tier not in TIERS:
            raise ValueError(f"{self.name}: tier must be one of {TIERS}, got {self.tier!r}")
        if not 0 < self.share <= 1:
            raise ValueError(f"{self.name}: share must be in (0, 1], got {self.share}")


def _rows(batch, order: torch.Tensor):
    return tuple(t[order] if isinstance(t, torch.Tensor) and t.dim() else t for t in batch)


def training(model_fn: Callable[[], torch.nn.Module], optimizer_fn: Callable[[torch.nn.Module], torch.optim.Optimizer],
             batch_fn: Callable[[torch.Generator], tuple], device: torch.device, *, seed: int = 0,
             min_bytes: Callable[[Any], float] | None = None, sizes: dict | None = None) -> Workload:
    """A training-step workload: each variant gets `model_fn()` built from `seed` on `device`, its optimizer, and
    builds its step with `factory(model, optimizer)`; a call is `step(x, y)` on one fresh batch."""
    def instantiate(factory: Callable) -> Runner:
        torch.manual_seed(seed)
        model = model_fn().to(device)
        opt = optimizer_fn(model)
        step = factory(model, opt)
        if not callable(step):
            raise TypeError(f"{getattr(factory, '__name__', 'the factory')}(model, optimizer) must return the step "
                            f"(a function of x, y), got {type(step).__name__}")

        def close():
            nonlocal model, opt, step
            model = opt = step = None
        return Runner(call=lambda batch: step(*batch), state=lambda: parameters(model), close=close)

    def reorder(batch):
        n = batch[0].shape[0]
        return _rows(batch, torch.arange(n - 1, -1, -1, device=batch[0].device))

    def to_device(batch):
        return tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in batch)
    return Workload(instantiate=instantiate, draw=batch_fn, to_device=to_device, reorder=reorder,
                    min_bytes=min_bytes, sizes=dict(sizes or {}))


def function(inputs_fn: Callable[[torch.Generator], tuple], device: torch.device, *, rtol: float = 1e-5,
             atol: float = 1e-6, min_bytes: Callable[[Any], float] | None = None, sizes: dict | None = None) -> Workload:
    """A pure-function workload: a call is `fn(*inputs)` on fresh inputs; outputs compared within rtol/atol."""
    def instantiate(fn: Callable) -> Runner:
        return Runner(call=lambda inputs: fn(*inputs))

    def to_device(inputs):
        return tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in inputs)
    return Workload(instantiate=instantiate, draw=inputs_fn, to_device=to_device, reorder=None, min_bytes=min_bytes,
                    sizes=dict(sizes or {}), rtol=rtol, atol=atol)


def _sheet_rate(key: str) -> tuple[float | None, str]:
    """The datasheet's figure for this GPU class: under a GPU profile, the profile's class (a size for a T4 is
    a T4's, even where an H200 emulates it), which `core.ceilings` leaves out because its timings are not."""
    from gpulab.core.device import device_facts
    facts = device_facts()
    sheet = facts.datasheet
    value = getattr(sheet, key, None) if sheet is not None else None
    return (float(value), f"datasheet{' of the profile ' + facts.profile if facts.profile else ''}: {sheet.source}") \
        if value else (None, "no ceiling measured or on the datasheet")


def matmul_rate(device: torch.device, precision: str = "fp32") -> tuple[float | None, str]:
    """(TFLOP/s, where it came from) of this GPU's products in `precision`: notebook 00's measurement, else the
    datasheet's (`core.ceilings`; under a profile, the profile's datasheet); (None, why) on the CPU. Exercises
    size their work from it, so a T4 and an H200 each get a step of about the same duration."""
    if device.type != "cuda":
        return None, "the CPU: tiny sizes"
    from gpulab.core.ceilings import ceilings
    c = ceilings().get(f"matmul_{precision}")
    return (c.value, c.source) if c is not None else _sheet_rate(precision)


def copy_rate(device: torch.device) -> tuple[float | None, str]:
    """(GB/s, where it came from) of this GPU's device-memory copy, as `matmul_rate` finds it."""
    if device.type != "cuda":
        return None, "the CPU: tiny sizes"
    from gpulab.core.ceilings import ceilings
    c = ceilings().get("copy_bandwidth")
    return (c.value, c.source) if c is not None else _sheet_rate("mem_gbps")


def width_for(device: torch.device, target_ms: float, layers: int, tiny: int, *, precision: str = "fp32",
              batch_per_width: float = 1.0, multiple: int = 64, low: int = 128, high: int = 8192) -> tuple[int, str]:
    """The width w of an MLP of `layers` w x w layers, batch w * batch_per_width, whose training step (6 w^2 batch
    FLOP a layer) takes about `target_ms` at this GPU's measured rate; `tiny` on the CPU."""
    rate, source = matmul_rate(device, precision)
    if rate is None:
        return tiny, source
    flop = target_ms / 1e3 * rate * 1e12
    w = (flop / (6 * layers * batch_per_width)) ** (1 / 3)
    w = int(min(high, max(low, round(w / multiple) * multiple)))
    return w, f"{precision} step of ~{target_ms:g} ms at {rate:.1f} TFLOP/s ({source})"
