"""Notebook 10's graded exercise: a batch accumulated over far more micro-batches than memory needs.

The step as given splits its batch into 16 micro-batches, each with its own forward and backward, and updates
once: correct accumulation (each loss divided by 16, the gradients adding up to the whole batch's), but each
micro-batch is 1/16 of the work, too small to keep the GPU busy, and pays the launch of every kernel of a
forward and a backward (section 2: "smaller micro-batches pay each step's fixed costs more often"). The
grader's budget, `max_peak` times the peak of the lesson's fix, holds the activations of half the batch: two
micro-batches are the fewest that fit; one whole batch does not.

Prediction at full size (lesson 09's blocks, 4 of them, fp32, seq 128; the width sized so the whole batch of
8 x width tokens is ~10 ms of products at this GPU's fp32 rate, the batch a multiple of 16 sequences): a
micro-batch of the step as given is 1-2 sequences, whose products take microseconds, so the step is bound by
the host launching 16 forwards and backwards; the fix's 2 micro-batches keep the GPU busy. Predicted 2-3x on an
H200 and on a T4. Measured on an H200 (2026-12-04, datasheet sizing: width 640, batch 32, budget_s 6): the fix
4.1x and 4.4x (IQR 0.8-0.9: the step as given, ~70 ms a call, is host-bound and its time varies), ~17 ms a call;
the step as given graded 1.02x against a target of 2.72x. Peak: gradients and SGD's momentum (8 bytes per
parameter) plus one micro-batch's activations (fp32, ~64 bytes per element of a block): the fix 614 MiB, the
step as given 334 MiB, one whole batch 896 MiB (1.46x, refused at `max_peak` 1.25). Numerics tier: accumulating
in other micro-batches sums the gradients in another order, so a submission may be at most 4x as far from the
step as given as the lesson's fix is.
"""
from __future__ import annotations

import torch

from gpulab.exercises.task import Task, training, width_for
from gpulab.models.transformer import TransformerStack, loss_fn

N_BLOCKS = 4
SEQ = 128               # full size; tokens per batch = 8 x width, the batch a multiple of 16 sequences
MAX_PEAK = 1.25         # the budget: the submission's peak at most this times the fix's


def make_step(model, optimizer):
    """The step as given: the batch in 16 micro-batches, each loss divided by 16, one update."""
    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for xs, ys in zip(x.chunk(16), y.chunk(16)):
            loss = loss_fn(model(xs), ys) / 16      # divided: the 16 gradients add up to the batch's
            loss.backward()                         # adds into .grad
            total = total + loss.detach()
        optimizer.step()                            # once per batch
        return total
    return step


def make_step_fewer(model, optimizer):
    """The lesson's fix: as few micro-batches as the memory budget allows, two halves of the batch. Each is 8
    times larger than before, so its products keep the GPU busy, and the step launches 2 forwards and
    backwards instead of 16."""
    def step(x, y):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for xs, ys in zip(x.chunk(2), y.chunk(2)):
            loss = loss_fn(model(xs), ys) / 2       # divided by the number of micro-batches
            loss.backward()
            total = total + loss.detach()
        optimizer.step()
        return total
    return step


def build(scale: str, device: torch.device):
    if scale == "full":
        # 12 width^2 multiply-adds per token per block (width_for: 12 "layers" a block); tokens = 8 x width
        width, why = width_for(device, 10.0, 12 * N_BLOCKS, tiny=64, precision="fp32", batch_per_width=8,
                               low=128, high=2048)
        seq = SEQ
        batch = max(16, round(8 * width / seq / 16) * 16)
        heads = max(1, width // 64)
    else:
        width, seq, batch, heads, why = 32, 16, 16, 2, "tiny"
    n_blocks = N_BLOCKS if scale == "full" else 2

    def draw(gen):    # random embeddings; the target is each position's next one (as transformer.make_batch)
        tokens = torch.randn(batch, seq + 1, width, generator=gen, device=gen.device)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    return training(lambda: TransformerStack(n_blocks, width, heads, seq),
                    lambda m: torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9), draw, device,
                    sizes={"n_blocks": n_blocks, "width": width, "heads": heads, "seq": seq, "batch": batch,
                           "micro-batches as given": 16, "dtype": "fp32", "max_peak": MAX_PEAK, "sized by": why})


TASKS = [Task(
    name="10.accumulate", lesson="10", title="sixteen micro-batches where two fit", tier="numerics",
    slow=make_step, reference=make_step_fewer, build=build, max_peak=MAX_PEAK,
    what=("make_step(model, optimizer) returns a training step that accumulates the gradients of its batch over 16 "
          "micro-batches (lesson 09's TransformerStack, fp32). The memory budget of this exercise (at most "
          f"{MAX_PEAK:g}x the peak of the lesson's fix) holds the activations of half the batch at once, not of the "
          "whole batch. Make the step faster within the budget while it still makes the same update. Your function "
          "takes the same arguments and returns a step(x, y) that returns the batch's mean loss."),
    hints=("How busy is the GPU during one micro-batch of 1/16 of the batch, and how many kernel launches does "
           "each micro-batch cost, whatever its size? How many micro-batches does the memory actually need?",
           "Use the fewest micro-batches that fit: x.chunk(2) and y.chunk(2), each loss divided by 2 (the number of "
           "micro-batches), one optimizer.step() after both backwards."),
)]
