"""The one training step every lesson and the capstone use (`train_step`), and the checks that make
a faster variant prove it computes the same gradients before it is timed (`GRAD_TOL`,
`fp32_loss_and_grads`, `worst_difference`; notebooks 09 and 10)."""
from __future__ import annotations

import contextlib
from typing import Iterable
import torch
from torch import nn
from typing import Sequence
from gpulab.models.precision import LossFn, SPECS, fp32_math
from gpulab.models.transformer import loss_fn




def mse_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The default loss: mean squared error of model(x) against y, in fp32 (`transformer.loss_fn`)."""
    return loss_fn(model(x), y)


def autocast(device: torch.device, dtype: torch.dtype | None):
    """`torch.amp.autocast` on `device` in `dtype`; plain fp32 (no autocast) when dtype is None. Notebook 09."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.amp.autocast(device.type, dtype=dtype)


def _precision(precision: str | torch.dtype | None) -> tuple[torch.dtype | None, str | None, bool]:
    """(autocast dtype, fp32 math mode or None to leave it as set, needs a scaler) of `precision`."""
    if precision is None or isinstance(precision, torch.dtype):
        return precision, None, precision is torch.float16
    spec = SPECS.get(precision)
    if spec is None:
        raise ValueError(f"unknown precision {precision!r}: one of {', '.join(SPECS)}, a torch dtype, or None.")
    return spec.dtype, spec.fp32_mode, spec.scaler


def train_step(model: nn.Module, x: torch.Tensor | Iterable[tuple[torch.Tensor, torch.Tensor]],
               y: torch.Tensor | None = None, *, loss: LossFn | None = None,
               optimizer: torch.optim.Optimizer | None = None, precision: str | torch.dtype | None = None,
               scaler: torch.amp.GradScaler | None = None, accumulation: int = 1, divide: bool = True,
               graphs: bool = False) -> torch.Tensor:
    """One training step: forward, loss, backward and (with an optimizer) the update. Every lesson's
    step and the capstone's is this function; returns the mean loss, detached.

    - `loss(model, x, y)`: the loss of one (micro-)batch; default `mse_loss`.
    - `optimizer`: None leaves the gradients in `.grad` (lessons 09 and 10 read them or their memory);
      otherwise `zero_grad`, then the step (through the scaler when there is one).
    - `precision`: None runs as PyTorch is set now; "fp32", "tf32", "fp16" or "bf16" (lesson 06) sets
      the fp32 math mode and the autocast dtype; a torch dtype sets only autocast.
    - `scaler` (fp16 with an optimizer; `precision.make_scaler("fp16")`): the loss is multiplied by the scale before backward,
      so small gradients stay above fp16's smallest number, and divided out again (in fp32) before the
      optimizer uses them; a step whose gradients hold inf or nan is skipped (lesson 06).
    - `accumulation` (lesson 10): x and y are split into that many equal micro-batches, each one's loss
      divided by their number (`divide=False` is the classic mistake) and backpropagated, so the gradients
      add up to the whole batch's. Instead of x and y, `x` may be an iterable of (x, y) micro-batches made
      one at a time (so only one is in memory); then `accumulation` is their number.
    - `graphs` (lesson 11, torch.compile's "reduce-overhead" mode): each micro-batch starts a new CUDA-graph step.

    Checkpointing (lesson 09) is not an argument: it changes the model's forward, so it is the model's
    switch (`TransformerStack.checkpoint_every`, capstone's `checkpointing` toggle).
    """
    dtype, fp32_mode, needs_scaler = _precision(precision)
    if needs_scaler and scaler is None and optimizer is not None:
        # an update from unscaled fp16 gradients loses the small ones; gradients alone (optimizer=None,
        # lessons 09 and 10 measuring memory) are what they are
        raise ValueError("fp16 training needs a GradScaler: pass scaler=make_scaler('fp16').")
    if isinstance(accumulation, bool) or not isinstance(accumulation, int) or accumulation < 1:
        raise ValueError(f"accumulation must be a whole number of micro-batches >= 1 (got {accumulation!r}).")
    loss = loss or mse_loss
    if isinstance(x, torch.Tensor):
        if y is None:
            raise ValueError("train_step needs targets y with a batch x (or an iterable of (x, y) micro-batches).")
        micro_batches = zip(x.chunk(accumulation), y.chunk(accumulation))
    else:
        micro_batches = x
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
    else:
        model.zero_grad(set_to_none=True)
    total = None
    with fp32_math(fp32_mode) if fp32_mode else contextlib.nullcontext():
        for xs, ys in micro_batches:
            if graphs:
                torch.compiler.cudagraph_mark_step_begin()
            with autocast(xs.device, dtype):
                value = loss(model, xs, ys)          # matmuls and convolutions in 16-bit under autocast
            if accumulation > 1 and divide:
                value = value / accumulation
            # Kept as a copy where a CUDA-graph replay, or the next micro-batch, reuses the output's memory.
            part = value.detach().clone() if graphs or accumulation > 1 else value.detach()
            total = part if total is None else total + part
            (scaler.scale(value) if scaler is not None else value).backward()
        if optimizer is not None:
            if scaler is not None:
                scaler.step(optimizer)                   # unscale; skip the step if a gradient is inf/nan
                scaler.update()                          # grow the scale, or halve it after an overflow
            else:
                optimizer.step()
    return total


# -- correct before fast: notebooks 09 and 10 (and gpulab bench) ----------------------------------
GRAD_TOL = 1e-5        # largest accepted relative difference of fp32 losses and gradients


def fp32_loss_and_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
    """The loss and a copy of the gradients of one step of `model` as configured now, without autocast
    (run it under `float32_matmul("ieee")` for plain fp32)."""
    loss = train_step(model, x, y)                    # dtype=None: no autocast
    return loss.item(), [p.grad.clone() for p in model.parameters()]


def worst_difference(grads: Sequence[torch.Tensor], ref: Sequence[torch.Tensor]) -> float:
    """The largest |g - r| of any parameter, relative to that parameter's largest |r|."""
    return max(((g - r).abs().max() / r.abs().max().clamp_min(1e-30)).item() for g, r in zip(grads, ref))
