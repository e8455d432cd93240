"""Lesson 10, gradient accumulation: its knobs, its correctness check and its headline measurement.

The accumulation itself is `gpulab.models.step.train_step(..., accumulation=steps)`, on lesson 09's
model (`gpulab.models.transformer.TransformerStack`, `STACK`). This module holds what notebook 10 and
`gpulab bench` share: the sizes (`CONFIG`, `config`), `accumulation_check` (accumulated gradients equal
the big batch's, in fp32, and what not dividing does) and `headline`, the peak memory of one big batch
against the same batch in accumulated micro-batches.
"""
from __future__ import annotations

import torch
from torch import nn

from gpulab.core.device import float32_matmul, pick_device, resolve_scale
from gpulab.core.measured import Measured, Skipped
from gpulab.core.memory import GiB, MiB, track_peak
from gpulab.models.precision import half_dtype
from gpulab.models.sizing import predicted_batch
from gpulab.models.step import GRAD_TOL, train_step
from gpulab.models.transformer import STACK, TransformerStack, make_batch, param_bytes

# -- knobs ------------------------------------------------------------------------------------------
TITLE = "gradient accumulation"
HEADLINE = "peak memory, one big batch / accumulated"      # the metric bands.toml judges
CONFIG = {
    # the model: transformer.STACK (lesson 09's 12 GPT blocks; n_blocks, width, heads, seq)
    # micro: the micro-batch (halved on a smaller GPU by `predicted_batch`)
    # steps: micro-batches per effective batch, of the headline and of the fp32 check
    # check_micro: the fp32 check's micro-batch; sweep_steps: section 4's numbers of micro-batches
    # budget_cap, search_step: lesson 09's memory budget cap, and the largest-batch search's resolution
    "tiny": dict(**STACK["tiny"], micro=4, steps=4, check_micro=2, sweep_steps=[1, 2, 4, 8],
                 budget_cap=256 * MiB, search_step=1),
    "full": dict(**STACK["full"], micro=8, steps=4, check_micro=2, sweep_steps=[1, 2, 4, 8, 16],
                 budget_cap=24 * GiB, search_step=16),
}


def config(scale: str | None = None) -> dict:
    """This lesson's knobs at a scale ('tiny' or 'full'; default: the course's, `GPULAB_SCALE`)."""
    return dict(CONFIG[resolve_scale(scale)])


def accumulation_check(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> dict[str, float]:
    """Plain fp32 (TF32 off): the gradients of one batch (x, y) against the same batch in `steps` equal
    micro-batches, accumulated with each loss divided by `steps` (`accumulate`) and without. Notebook 10.

    Returns {"divided": largest |difference| of any entry / the norm of the whole big-batch gradient,
    "undivided": norm of the undivided gradients / the big batch's (the classic mistake: `steps`)}.
    The model is left without gradients.
    """
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
    """Peak memory of one big batch of `config(scale)`'s micro x steps samples against the same batch
    accumulated over `steps` micro-batches (`train_step(..., accumulation=steps)`, `track_peak`), under
    bf16 (fp16 where bf16 is not native) autocast; the fp32 gradients are checked equal first."""
    device = pick_device()
    if device.type != "cuda":
        raise Skipped("peak memory is read from CUDA's caching allocator; the CPU has none")
    cfg = config(scale)
    steps = cfg["steps"]
    dtype = half_dtype()
    torch.manual_seed(0)
    model = TransformerStack(cfg["n_blocks"], cfg["width"], cfg["heads"], cfg["seq"], device=device)
    params = sum(p.numel() for p in model.parameters())
    micro = predicted_batch(cfg["n_blocks"], cfg["micro"], cfg["seq"], cfg["width"], params, times=steps,
                            device=device)     # one big batch of micro x steps is run too
    x, y = make_batch(model, cfg["check_micro"] * steps, seed=1)     # correct first, in fp32, as notebook 10
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
