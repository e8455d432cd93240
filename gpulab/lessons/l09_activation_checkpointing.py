"""TODO docstring
"""
from __future__ import annotations

from typing import Sequence
import torch
from torch import nn
from gpulab.core.device import by_scale, pick_device
from gpulab.models.precision import half_dtype
from gpulab.core.measured import Measured, Skipped
from gpulab.core.memory import GiB
from gpulab.models.step import fp32_loss_and_grads, worst_difference


# -- knobs ------------------------------------------------------------------------------------------
TITLE = "activation checkpointing"
HEADLINE = "peak memory, every block / none"      # the metric bands.toml judges


def checkpointing_check(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                        ks: Sequence[int] = (1, 2, 5, 12)) -> tuple[float, dict[int, tuple[float, float]]]:
    """Same weights, same batch, plain fp32 (TF32 off): the loss and gradients of `model` checkpointing
    every k blocks, for each k in `ks`, against none. Notebook 09.

    Returns (the loss without checkpointing, {k: (loss, worst gradient difference)}), the difference
    being the largest |g_k - g| of a parameter relative to that parameter's largest |g|. The model is
    left without checkpointing and without gradients.
    """
    from gpulab.core.device import float32_matmul

    out = {}
    try:
        with float32_matmul("ieee"):
            model.checkpoint_every = 0
            ref_loss, ref = fp32_loss_and_grads(model, x, y)
            for k in ks:
                model.checkpoint_every = k
                loss, grads = fp32_loss_and_grads(model, x, y)
                out[k] = (loss, worst_difference(grads, ref))
    finally:
        model.checkpoint_every = 0
        model.zero_grad(set_to_none=True)
    return ref_loss, out


def headline(scale: str | None = None) -> Measured:
    """Lesson 09: peak memory of a training step, checkpointing every block against none
    (`workloads.TransformerStack`, `training_peak`)."""
    from gpulab.core.timing import benchmark
    from gpulab.models.step import GRAD_TOL, train_step
    from gpulab.models.transformer import TransformerStack, make_batch
    from gpulab.lessons.l09_activation_checkpointing import checkpointing_check
    from gpulab.models.sizing import predicted_batch, training_peak

    device = pick_device()
    if device.type != "cuda":
        raise Skipped("peak memory is read from CUDA's caching allocator; the CPU has none")
    cfg = by_scale(tiny=dict(n_blocks=12, width=64, heads=4, seq=32, batch=4),
                   full=dict(n_blocks=12, width=1024, heads=16, seq=1024, batch=32), scale=scale)
    dtype = half_dtype()
    torch.manual_seed(0)
    model = TransformerStack(cfg["n_blocks"], cfg["width"], cfg["heads"], cfg["seq"], device=device)
    params = sum(p.numel() for p in model.parameters())
    batch = predicted_batch(cfg["n_blocks"], cfg["batch"], cfg["seq"], cfg["width"], params, device=device)
    x, y = make_batch(model, 2, seed=1)
    ref_loss, checked = checkpointing_check(model, x, y, ks=(1,))    # correct before fast, as notebook 09
    loss, diff = checked[1]
    correct = abs(loss - ref_loss) <= GRAD_TOL * abs(ref_loss) and diff <= GRAD_TOL
    del x, y
    peak, step_ms = {}, {}
    try:
        for k in (0, 1):
            model.checkpoint_every = k
            peak[k] = training_peak(model, batch, dtype)
            x, y = make_batch(model, batch)
            step_ms[k] = benchmark(lambda: train_step(model, x, y, precision=dtype), warmup=2).median_ms
            del x, y
    finally:
        model.zero_grad(set_to_none=True)
    return Measured(peak[0] / GiB, peak[1] / GiB, "GiB", peak[1] / peak[0], correct,
                    f"fp32 loss and gradients, every block vs none: worst relative difference {diff:.1e} "
                    f"(<= {GRAD_TOL:.0e})",
                    f"no checkpointing, batch {batch}", "checkpoint every block",
                    notes=f"step time every block / none: {step_ms[1] / step_ms[0]:.2f}x")
