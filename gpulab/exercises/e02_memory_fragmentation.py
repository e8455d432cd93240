"""Notebook 02's graded exercise: a training step that empties the caching allocator's cache every step.

`torch.cuda.empty_cache()` hands every cached block that no tensor uses back to the driver (cudaFree). After
a step, that is every activation and temporary of the step: the next step must ask the driver for all of them
again (cudaMalloc), on the host, while the GPU waits; and cudaFree synchronizes the device, so the host can no
longer queue step i+1 while the GPU runs step i. The caching allocator exists to avoid exactly this (lesson 02):
without the call, each step reuses the blocks of the last one and never talks to the driver.

Sizing (full): an fp32 MLP of LAYERS narrow layers on a long batch (BATCH_PER_WIDTH rows per unit of width), the
width chosen by `width_for` so that the step's FLOPs take about STEP_MS at this GPU's measured fp32 rate. What
empty_cache() costs grows with the memory the step allocates (the driver maps and unmaps it in 2 MiB pages,
and each call has a fixed cost); what the GPU spends grows with the FLOPs. A narrow layer makes little work for
the memory its output takes: every activation here is its own segment of tens of MiB, and a step allocates
about a GiB of them.

Prediction (before any GPU run of this exercise): on the H200 (52.7 TFLOP/s fp32 measured) width 128, batch
131,072, 64 MiB activations, ~1.1 GiB allocated a step, ~3 ms of GPU work (k = 128 products run below the
peak). Lesson 02's diagnosis case (results/diagnose/2026-12-01-h200-suite-at-8c0a589, memory_pressure: 1.12x there)
spent ~1.8 ms of host time in the allocator for ~2.4 GiB a step, half of it with the GPU idle: ~0.4-0.7 ms
per GiB, plus a fixed cost per cudaMalloc/cudaFree (~40 a step here). So the reference about 1.35x (1.2x to
1.5x) faster than the slow step: the code as given fails a target of ~1.17x. On a T4 (~5-8 TFLOP/s fp32,
320 GB/s) width 64 and 16 MiB activations: the same host-side costs against a GPU 13x slower per byte, about
1.1x (perhaps too little for the speed to be judged there).
"""
from __future__ import annotations

import torch

from gpulab.exercises.e01_measuring_time import mlp
from gpulab.exercises.task import Task, training, width_for

LAYERS = 8
STEP_MS = 2.0              # the step's FLOPs at this GPU's fp32 rate
BATCH_PER_WIDTH = 1024     # a long batch of narrow rows: large activations for the FLOPs


def make_step(model, optimizer):
    """The step as given: after every update it empties the caching allocator's cache, "to free memory"."""
    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        torch.cuda.empty_cache()     # every cached block back to the driver: the next step asks for it again
        return loss
    return step


def make_step_fixed(model, optimizer):
    """The lesson's fix: let the caching allocator keep its blocks. The next step reuses this step's memory
    without a cudaMalloc, and no cudaFree makes the host wait for the GPU."""
    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss
    return step


def build(scale: str, device: torch.device):
    if scale == "full":
        width, why = width_for(device, STEP_MS, LAYERS, tiny=64, batch_per_width=BATCH_PER_WIDTH, multiple=32,
                               low=64)
        batch = width * BATCH_PER_WIDTH if device.type == "cuda" else width
    else:
        width, batch, why = 64, 64, "tiny"

    def draw(gen):
        return (torch.randn(batch, width, generator=gen, device=gen.device),
                torch.randn(batch, width, generator=gen, device=gen.device))
    activation_mib = batch * width * 4 / 2**20
    return training(lambda: mlp(width, LAYERS), lambda m: torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9),
                    draw, device, sizes={"width": width, "batch": batch, "layers": LAYERS,
                                         "activation_mib": round(activation_mib, 1), "sized by": why})


TASKS = [Task(
    name="02.cache", lesson="02", title="the allocator's cache emptied every step", tier="systems",
    slow=make_step, reference=make_step_fixed, build=build,
    what=("make_step(model, optimizer) returns a training step that calls torch.cuda.empty_cache() after every "
          "update. Make the step stop paying the driver for memory every step, and train the same model. Your "
          "function takes the same arguments and returns a step(x, y) that returns the loss."),
    hints=("After empty_cache(), where does the next step's memory for its activations come from, and what "
           "does giving memory back to the driver (cudaFree) wait for?",
           "Delete the torch.cuda.empty_cache() call: the caching allocator keeps the step's blocks and the next "
           "step reuses them. (If memory is really short, call it once, outside the loop, or see the lesson's "
           "fixes for fragmentation.)"),
)]
