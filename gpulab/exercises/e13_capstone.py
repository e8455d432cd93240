"""Notebook 13's graded exercise: the capstone's GPT training step as a first version is written, in fp32 eager.

Every matrix product runs in IEEE fp32 (TF32 off, PyTorch's default for matmuls), the fraction of the GPU's
Tensor Core rate a 16-bit product gets; attention (SDPA) cannot use its flash kernel in fp32; AdamW updates the
parameters in PyTorch's default multi-tensor (foreach) kernels; every LayerNorm, GELU and residual add is its own
kernel. The fix is the capstone's toggles that this GPU runs: 16-bit autocast (bf16 where native, else fp16 with a
GradScaler: `best_half()`), fused AdamW, and torch.compile of the forward and loss. It changes the rounding, so the
tier is numerics: at most 4x as far from the fp32 step as the lesson's own fix is.

The model's shape is fixed (4 blocks of width 768, 12 heads of 64, sequences of 512, a vocabulary of 8192: a
multiple of 64, so lesson 07's alignment is not part of this exercise); the batch is chosen from this GPU's fp32
matmul rate so the fp32 step takes about 50 ms on any GPU (a T4 gets a batch of about 2; an H200, at its datasheet's rate, 14).

Measured on an H200 (2026-12-04, torch 2.11, batch 14 from the datasheet's fp32 rate): the reference 3.9x (IQR
0.95: fp32 40 ms a step, the fix 10.3 ms), the target 2.4x. Predicted before, 8-12x: the products go from its fp32
rate (about 50 TFLOP/s measured, 67 on the datasheet) to bf16 (several hundred), attention to flash, and
compile removes most of the elementwise kernels; what is left is a few ms of bf16 step with launch overhead in
it. On a T4 about 3-5x: fp16 Tensor Cores (65 TFLOP/s on the datasheet against 8 in fp32), but at a batch of
about 2 its step is shorter and more of it is launch overhead and the fp32 loss over the vocabulary. A learner
who stops at autocast alone is expected to get most of it (not measured): the target is half of the reference's gain.
"""
from __future__ import annotations

import torch

from gpulab.exercises.task import Task, matmul_rate, training
from gpulab.lessons.capstone.jobs import gpt_flops_per_token
from gpulab.lessons.capstone.knobs import LR
from gpulab.models.gpt import GPT
from gpulab.models.precision import best_half

FULL = dict(vocab=8192, n_blocks=4, width=768, heads=12, seq=512)
TINY = dict(vocab=251, n_blocks=2, width=64, heads=4, seq=32)
STEP_MS = 50.0      # the fp32 step's duration the batch is sized for
STEP_SHARE = 0.5    # share of the fp32 matmul ceiling an fp32 training step reaches (lesson 13's STEP_SHARE)


def make_step(model, optimizer):
    """The step as given: fp32 eager. `model.loss(x, y)` is the GPT's next-token cross-entropy; `optimizer` is
    AdamW(lr=LR) with PyTorch's defaults."""
    def step(x, y):
        loss = model.loss(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()
    return step


def make_step_tuned(model, optimizer):
    """The lesson's fix, the toggles this GPU runs: autocast to best_half() (bf16 where the GPU has it natively,
    else fp16 with a GradScaler, which it needs); AdamW with the same hyperparameters, fused into a few kernels;
    the forward and loss compiled (inductor). The weights and the optimizer's state stay fp32."""
    device = next(model.parameters()).device
    dtype = torch.bfloat16 if best_half() == "bf16" else torch.float16
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    same = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
    fused = torch.optim.AdamW(model.parameters(), **same, fused=True)
    loss_of = torch.compile(model.loss)

    def step(x, y):
        with torch.autocast(device.type, dtype=dtype):
            loss = loss_of(x, y)
        fused.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(fused)          # with fp16: unscale first, skip the update if a gradient overflowed
        scaler.update()
        return loss.detach()
    return step


def build(scale: str, device: torch.device):
    dims = dict(FULL if scale == "full" else TINY)
    rate, source = matmul_rate(device, "fp32") if scale == "full" else (None, "tiny")
    per_sequence = gpt_flops_per_token(**dims)["total"] * dims["seq"]
    if rate is None:
        batch, why = (4 if scale == "full" else 8), source
    else:
        batch = int(min(64, max(1, round(STEP_MS / 1e3 * STEP_SHARE * rate * 1e12 / per_sequence))))
        why = f"fp32 step of ~{STEP_MS:g} ms at {STEP_SHARE:.0%} of {rate:.1f} TFLOP/s ({source})"
    vocab, seq = dims["vocab"], dims["seq"]

    def draw(gen):
        tokens = torch.randint(0, vocab, (batch, seq + 1), generator=gen, device=gen.device)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    return training(lambda: GPT(**dims), lambda m: torch.optim.AdamW(m.parameters(), lr=LR), draw, device,
                    sizes={**dims, "batch": batch, "half": best_half(), "sized by": why})


TASKS = [Task(
    name="13.capstone", lesson="13", title="the GPT step in fp32 eager", tier="numerics",
    slow=make_step, reference=make_step_tuned, build=build, warmup=4,
    what=("make_step(model, optimizer) returns the capstone's GPT training step as a first version is written: "
          "fp32 eager, PyTorch's default AdamW. Apply the capstone's speed toggles that this GPU runs. It must still "
          "train the same model: as close to the fp32 step as the lesson's own 16-bit fix is (the parameters after "
          "a few updates, and the loss). Your function takes the same arguments and returns a step(x, y) that "
          "returns the loss; you may build your own optimizer over model.parameters() with the same hyperparameters."),
    hints=("Which of the capstone's waterfall toggles made the largest step, and which number format are this GPU's "
           "matrix products fastest in? Notebook 00 measured both rates.",
           "Wrap the loss in torch.autocast(device.type, dtype=torch.bfloat16) (fp16 with a torch.amp.GradScaler "
           "where the GPU has no bf16: gpulab.models.precision.best_half() says which); build "
           "torch.optim.AdamW(model.parameters(), lr=..., fused=True) with optimizer.defaults' hyperparameters; "
           "torch.compile(model.loss)."),
)]
