"""Notebook 06's graded exercise: a GPT trained with every matrix product in fp32.

The step as given runs the lesson's GPT in plain fp32 (TF32 off, PyTorch's default for products): every
product runs on the GPU's fp32 units. Under 16-bit autocast the products and attention run on the Tensor
Cores, in bf16 where the GPU has it natively (Ampere on) or in fp16 with a GradScaler (Volta, Turing: a T4),
while the weights, the loss and the optimizer's update stay in fp32.

Prediction at full size (the batch is sized so the fp32 step takes ~30 ms at this GPU's fp32 rate, at least 2
sequences): on an H200 about 3.5x (notebook 06 measured this GPT's bf16 and fp16 steps at ~3.7-3.9x fp32's
tokens/s: the products run ~15x faster in 16-bit, the rest, LayerNorms, GELU, softmax and AdamW, at most ~2x);
on a T4 about 2-3x (fp16 Tensor Cores 65 against 8 TFLOP/s fp32 on the datasheet, with a larger share of
memory-bound work, and a GradScaler whose inf check reads a flag back to the host every step). Measured on an
H200 (2026-12-04, datasheet sizing: batch 10, bf16, budget_s 6): 3.3x (IQR 0.4), 40 ms against 12 ms a call.
Under GPULAB_PROFILE=t4 on the H200 the fix took the fp16 + GradScaler path and trained the same model (its
parameters 1.0e-2 of their movement from fp32's, bf16's 3.3e-2), but at the T4's batch on an H200 it was slower
than fp32 (0.79x: a host-bound step, no effect to judge); hence at least 2 sequences, so a real T4's fp16 step
has GPU work to hide its host work behind. Numerics tier: 16-bit rounding changes the parameters, so a
submission may be at most 4x as far from the fp32 code as the lesson's fix is.
"""
from __future__ import annotations

import torch

from gpulab.exercises.task import Task, matmul_rate, training
from gpulab.lessons.l06_mixed_precision import config, gpt_forward_flops_per_token
from gpulab.models.gpt import GPT
from gpulab.models.precision import half_dtype

FP32_SHARE = 0.8        # the share of the fp32 ceiling this GPT's fp32 step reached (lesson 06's SHARE["GPT"])


def make_step(model, optimizer):
    """The step as given: every product of the GPT in fp32."""
    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        loss = model.loss(x, y)            # forward and loss: all fp32
        loss.backward()
        optimizer.step()
        return loss
    return step


def make_step_amp(model, optimizer):
    """The lesson's fix: the forward under 16-bit autocast. bf16 where this GPU has it natively (`half_dtype()`,
    as torch.cuda.is_bf16_supported(including_emulation=False) says; and on the CPU); else (a T4, a V100) fp16,
    whose small gradients need a GradScaler. The weights, the loss and AdamW stay fp32."""
    device = next(model.parameters()).device
    dtype = half_dtype()
    scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None

    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        with torch.amp.autocast(device.type, dtype=dtype):
            loss = model.loss(x, y)        # products in 16-bit; the cross-entropy in fp32
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()  # scaled, so small fp16 gradients do not flush to zero
            scaler.step(optimizer)         # unscales; skips the update if a gradient overflowed
            scaler.update()
        return loss
    return step


def build(scale: str, device: torch.device):
    gpt = dict(config(scale)["gpt"])        # lesson 06's GPT: 6 blocks of width 768, vocab 8192, seq 512 at full size
    seq, vocab = gpt["seq"], gpt["vocab"]
    if scale == "full":
        rate, source = matmul_rate(device, "fp32")
        if rate is None:
            batch, why = gpt["batch"], source
        else:   # a training step is 3 forwards; the batch that makes the fp32 step ~30 ms at this GPU's rate
            step_flops = 3 * gpt_forward_flops_per_token(**gpt) * seq
            batch = int(min(64, max(2, round(0.030 * rate * 1e12 * FP32_SHARE / step_flops))))
            why = f"fp32 step of ~30 ms at {rate:.1f} TFLOP/s x {FP32_SHARE} ({source})"
    else:
        batch, why = gpt["batch"], "tiny"
    model_args = {k: gpt[k] for k in ("vocab", "n_blocks", "width", "heads", "seq")}

    def draw(gen):
        tokens = torch.randint(0, vocab, (batch, seq + 1), generator=gen, device=gen.device)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    return training(lambda: GPT(**model_args), lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3), draw, device,
                    sizes={**model_args, "batch": batch, "16-bit": str(half_dtype()).replace("torch.", ""),
                           "sized by": why})


TASKS = [Task(
    name="06.amp", lesson="06", title="a GPT trained in fp32", tier="numerics",
    slow=make_step, reference=make_step_amp, build=build,
    what=("make_step(model, optimizer) returns a training step of the lesson's GPT that runs every matrix product "
          "in fp32. Make it run its products on the Tensor Cores in 16-bit while it still trains the same model: "
          "the weights, the loss and the update stay fp32, and on a GPU without native bf16 the 16-bit format "
          "needs what section 8 showed it needs. Your function takes the same arguments and returns a step(x, y) "
          "that returns the loss."),
    hints=("Which units of this GPU run an fp32 product, and which would run the same product in bf16 or fp16? What "
           "in PyTorch picks the dtype of each operation without you casting the model?",
           "Run the forward and the loss under torch.amp.autocast(device.type, dtype=...): bf16 where "
           "gpulab.models.precision.half_dtype() says so; with fp16, wrap backward and the update in a "
           "torch.amp.GradScaler (scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update())."),
)]
