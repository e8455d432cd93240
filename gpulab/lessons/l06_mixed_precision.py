"""TODO docstring
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Callable
import torch
from torch import nn
from gpulab.core.device import device_facts, pick_device
from gpulab.core.timing import benchmark
from gpulab.core.device import by_scale
from gpulab.core.measured import Measured
from gpulab.models.precision import check, LossFn, SPECS, fp32_math, make_scaler
from gpulab.models.step import train_step


# -- knobs ------------------------------------------------------------------------------------------
TITLE = "mixed precision"
HEADLINE = "CNN images/s, best 16-bit / fp32"      # the metric bands.toml judges


class LossCurve(tuple):
    """Losses of consecutive training steps; `skipped`: steps the GradScaler skipped (inf/nan gradients)."""

    skipped: int = 0

    def __new__(cls, losses, skipped: int = 0):
        curve = super().__new__(cls, losses)
        curve.skipped = skipped
        return curve

    def window(self, n: int) -> float:
        """Mean of the last n losses."""
        tail = self[-n:]
        return sum(tail) / len(tail)

    def __str__(self) -> str:
        skipped = f", {self.skipped} skipped" if self.skipped else ""
        return f"{len(self)} steps: {self[0]:.3g} -> {self[-1]:.3g}{skipped}"


@dataclass
class Workload:
    """A model with its starting weights, its data and its optimizer, so that every precision
    starts from the same point. Notebook 06.

    `batches(b)` makes a list of (x, y) batches of size b on the model's device; `optimizer(model)`
    a fresh optimizer; `unit` names the throughput (e.g. "img/s") and `items` how many of those
    one sample counts (1 image, or seq tokens).
    """

    name: str
    model: nn.Module
    batches: Callable[[int], list]
    loss_fn: LossFn
    optimizer: Callable[[nn.Module], torch.optim.Optimizer]
    unit: str
    items: int = 1
    init: dict = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.init = {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def reset(self) -> torch.optim.Optimizer:
        """Back to the starting weights (and BatchNorm statistics); returns a fresh optimizer."""
        self.model.load_state_dict(self.init)
        self.model.zero_grad(set_to_none=True)
        return self.optimizer(self.model)


# Largest accepted relative difference of the starting weights' loss in each precision to fp32's
# (notebook 06, section 6, and gpulab bench): 16-bit products round each input to 8 (bf16) or
# 11 (fp16) significant bits, TF32 to 11.
FIRST_LOSS_TOLERANCE = {"fp32": 0.0, "tf32": 1e-2, "fp16": 1e-2, "bf16": 2e-2}


def step_peak(work: Workload, batch: int, precision: str = "fp32") -> int | None:
    """Peak memory (bytes) of one training step of `work` from its starting weights at `batch` in
    `precision`; None on the CPU. Notebook 06 (what `workloads.fit_batch` probes) and gpulab bench."""
    from gpulab.core.memory import track_peak

    optimizer = work.reset()
    x, y = work.batches(batch)[0]
    with track_peak() as mem:
        train_step(work.model, x, y, loss=work.loss_fn, optimizer=optimizer, precision=precision,
                   scaler=make_scaler(precision, x.device))
    work.model.zero_grad(set_to_none=True)
    return mem.peak


def first_loss(work: Workload, x: torch.Tensor, y: torch.Tensor, precision: str) -> float:
    """The loss of the starting weights on (x, y) in `precision`, forward only. Notebook 06."""
    spec = check(precision)
    work.reset()
    with torch.no_grad(), fp32_math(spec.fp32_mode):
        with torch.amp.autocast(x.device.type, dtype=spec.dtype, enabled=spec.dtype is not None):
            return work.loss_fn(work.model, x, y).item()


def train_curve(model: nn.Module, optimizer: torch.optim.Optimizer, batches: list, loss_fn: LossFn,
                precision: str, scaler: torch.amp.GradScaler | None, steps: int) -> LossCurve:
    """`steps` training steps cycling through `batches`; the loss of each, and the steps the
    scaler skipped (its scale went down). Notebook 06."""
    losses, skipped = [], 0
    for i in range(steps):
        scale = scaler.get_scale() if scaler is not None else None
        x, y = batches[i % len(batches)]
        losses.append(train_step(model, x, y, loss=loss_fn, optimizer=optimizer, precision=precision, scaler=scaler).item())
        if scaler is not None and scaler.get_scale() < scale:
            skipped += 1
    return LossCurve(losses, skipped)


def precision_run(work: Workload, precision: str, batch: int, steps: int, repeat: int = 10,
                  warmup: int = 2) -> dict[str, Any]:
    """Train `work` from its starting weights in `precision`: the loss curve over `steps` steps,
    then `repeat` timed steps (after `warmup`) and their peak memory. Notebook 06.

    Returns {unit: throughput, "ms per step": Timing, "peak (GiB)": float or a note on the CPU,
    "loss curve": LossCurve}. A precision this device cannot run raises ValueError.
    """
    from gpulab.core.memory import GiB, track_peak

    check(precision)
    optimizer = work.reset()
    scaler = make_scaler(precision, next(work.model.parameters()).device)
    batches = work.batches(batch)
    try:
        curve = train_curve(work.model, optimizer, batches, work.loss_fn, precision, scaler, steps)
        cycle = itertools.cycle(batches)
        with track_peak() as mem:
            t = benchmark(lambda: train_step(work.model, *next(cycle), loss=work.loss_fn, optimizer=optimizer,
                                             precision=precision, scaler=scaler),
                          warmup=warmup, repeat=repeat)
    finally:
        work.model.zero_grad(set_to_none=True)      # also after an error: give the gradients back
    return {work.unit: t.per_second(batch * work.items), "ms per step": t,
            "peak (GiB)": "not measured on the CPU" if mem.peak is None else mem.peak / GiB,
            "loss curve": curve}


def unscaled_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn,
                       precision: str = "fp32", weight: float = 1.0, scale: float | None = None) -> torch.Tensor:
    """All parameter gradients of `weight x loss`, flattened into one fp32 vector. Notebook 06.

    Under fp16 or bf16 the forward runs in autocast, so backward computes in 16-bit. With
    `scale`, a GradScaler(init_scale=scale) scales the loss before backward and `unscale_`
    divides the gradients in fp32 afterwards, as in training; without it nothing is scaled.
    """
    spec = SPECS[precision]
    model.zero_grad(set_to_none=True)
    scaler = None
    if scale is not None:
        scaler = torch.amp.GradScaler(x.device.type, init_scale=scale)
    with fp32_math(spec.fp32_mode):
        with torch.amp.autocast(x.device.type, dtype=spec.dtype, enabled=spec.dtype is not None):
            loss = weight * loss_fn(model, x, y)
        if scaler is None:
            loss.backward()
        else:
            scaler.scale(loss).backward()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.0)   # unscale_ works per optimizer
            scaler.unscale_(optimizer)
    grads = torch.cat([p.grad.detach().float().flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return grads


def lost_fraction(grads: torch.Tensor, reference: torch.Tensor) -> float:
    """Share of the gradient entries that are non-zero in `reference` but exactly zero in `grads`."""
    alive = reference != 0
    lost = (grads == 0) & alive
    return lost.sum().item() / max(alive.sum().item(), 1)


def headline(scale: str | None = None) -> Measured:
    """Lesson 06: CNN training throughput, fastest 16-bit autocast against fp32 (`precision.precision_run`)."""
    from gpulab.models import precision as P
    from gpulab.core.memory import GiB as _GiB
    from gpulab.models.cnn import ResNetish, image_batches
    from gpulab.models.sizing import fit_batch, memory_budget

    device = pick_device()
    facts = device_facts()
    cfg = by_scale(tiny=dict(depths=(1, 1, 1, 1), width=8, classes=10, image=32, batch=32),
                   full=dict(depths=(3, 4, 6, 3), width=64, classes=1000, image=224, batch=128))
    torch.manual_seed(0)
    model = ResNetish(cfg["depths"], cfg["width"], cfg["classes"], cfg["image"], device=device)
    work = Workload("CNN", model, lambda b: image_batches(model, b, count=4, seed=1), P.classification_loss,
                      lambda m: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9), unit="img/s")

    batch = fit_batch(lambda b: step_peak(work, b, "fp32"), cfg["batch"], memory_budget(cap=64 * _GiB))
    # fp16 autocast is no fast path on the CPU (notebook 06 times it on GPUs only)
    halves = [p for p in ("fp16", "bf16") if p in P.supported(facts) and (device.type == "cuda" or p != "fp16")]
    x, y = work.batches(batch)[0]
    ref = first_loss(work, x, y, "fp32")
    diffs = {p: abs(first_loss(work, x, y, p) - ref) / abs(ref) for p in halves}
    del x, y
    correct = all(diffs[p] <= FIRST_LOSS_TOLERANCE[p] for p in halves)
    steps, repeat = by_scale(tiny=1, full=2, scale=scale), by_scale(tiny=3, full=10, scale=scale)
    rate = {p: precision_run(work, p, batch, steps, repeat)["img/s"] for p in ("fp32", *halves)}
    best = max(halves, key=rate.get)
    return Measured(rate["fp32"], rate[best], "img/s", rate[best] / rate["fp32"], correct,
                    "first loss vs fp32: " + ", ".join(f"{p} {d:.1e} (tolerance {FIRST_LOSS_TOLERANCE[p]:.0e})"
                                                       for p, d in diffs.items()),
                    f"fp32, batch {batch}", f"{best} autocast" + (" + GradScaler" if best == "fp16" else ""))
