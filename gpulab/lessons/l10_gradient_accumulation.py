"""TODO docstring
"""
from __future__ import annotations

import torch
from torch import nn
from gpulab.core.device import by_scale, pick_device
from gpulab.models.precision import half_dtype
from gpulab.core.measured import Measured, Skipped
from gpulab.core.memory import GiB
from gpulab.models.step import train_step


# -- knobs ------------------------------------------------------------------------------------------
TITLE = "gradient accumulation"
HEADLINE = "peak memory, one big batch / accumulated"      # the metric bands.toml judges


def accumulation_check(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> dict[str, float]:
    """Plain fp32 (TF32 off): the gradients of one batch (x, y) against the same batch in `steps` equal
    micro-batches, accumulated with each loss divided by `steps` (`accumulate`) and without. Notebook 10.

    Returns {"divided": largest |difference| of any entry / the norm of the whole big-batch gradient,
    "undivided": norm of the undivided gradients / the big batch's (the classic mistake: `steps`)}.
    The model is left without gradients.
    """
    from gpulab.core.device import float32_matmul

    def gradients() -> list[torch.Tensor]:
        return [p.grad.clone() for p in model.parameters()]

    def norm(grads: list[torch.Tensor]) -> float:
        return torch.sqrt(sum((g.double() ** 2).sum() for g in grads)).item()

    if steps < 1 or x.shape[0] % steps:
        raise ValueError(f"the batch ({x.shape[0]}) must split into {steps} equal micro-batches")
    try:
        with float32_matmul("ieee"):
            train_step(model, x, y)                   # the big batch, lesson 09's step
            big = gradients()
            train_step(model, x, y, accumulation=steps)
            accumulated = gradients()
            train_step(model, x, y, accumulation=steps, divide=False)
            undivided = gradients()
    finally:
        model.zero_grad(set_to_none=True)
    big_norm = norm(big)
    return {"divided": max((a - b).abs().max().item() for a, b in zip(accumulated, big)) / big_norm,
            "undivided": norm(undivided) / big_norm}


def headline(scale: str | None = None) -> Measured:
    """Lesson 10: peak memory of one big batch against the same effective batch accumulated over
    micro-batches (`workloads.accumulate`, `track_peak`); the gradients are checked equal first."""
    from gpulab.core.memory import track_peak
    from gpulab.models.step import GRAD_TOL, train_step
    from gpulab.models.transformer import TransformerStack, make_batch, param_bytes
    from gpulab.lessons.l10_gradient_accumulation import accumulation_check
    from gpulab.models.sizing import predicted_batch

    device = pick_device()
    if device.type != "cuda":
        raise Skipped("peak memory is read from CUDA's caching allocator; the CPU has none")
    cfg = by_scale(tiny=dict(n_blocks=4, width=64, heads=4, seq=32, micro=4),
                   full=dict(n_blocks=12, width=1024, heads=16, seq=1024, micro=8), scale=scale)
    steps = 4
    dtype = half_dtype()
    torch.manual_seed(0)
    model = TransformerStack(cfg["n_blocks"], cfg["width"], cfg["heads"], cfg["seq"], device=device)
    params = sum(p.numel() for p in model.parameters())
    micro = predicted_batch(cfg["n_blocks"], cfg["micro"], cfg["seq"], cfg["width"], params, times=steps,
                            device=device)     # one big batch of micro x steps is run too
    x, y = make_batch(model, 2 * steps, seed=1)                 # correct first, in fp32, as notebook 10
    diff = accumulation_check(model, x, y, steps)["divided"]
    del x, y
    try:
        xb, yb = make_batch(model, micro * steps)
        with track_peak() as one:
            train_step(model, xb, yb, precision=dtype)
        model.zero_grad(set_to_none=True)
        with track_peak() as accumulated:
            train_step(model, xb, yb, precision=dtype, accumulation=steps)
        del xb, yb
    finally:
        model.zero_grad(set_to_none=True)
    base = param_bytes(model)
    big_peak, acc_peak = base + one.peak_above_start, base + accumulated.peak_above_start
    return Measured(big_peak / GiB, acc_peak / GiB, "GiB", big_peak / acc_peak, diff < GRAD_TOL,
                    f"fp32 gradients, {steps} micro-batches vs one batch: largest difference / norm {diff:.1e} "
                    f"(< {GRAD_TOL:.0e})",
                    f"one batch of {micro * steps}", f"{steps} x {micro} accumulated")
