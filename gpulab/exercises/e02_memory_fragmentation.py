"""Notebook 02's graded exercise: a training step that empties the caching allocator's cache every step.

`torch.cuda.empty_cache()` hands every cached block that no tensor uses back to the driver (cudaFree). After
a step, that is every activation and temporary of the step: the next step must ask the driver for all of them
again (cudaMalloc), on the host, while the GPU waits; and cudaFree synchronizes the device, so the host can no
longer queue step i+1 while the GPU runs step i. The caching allocator exists to avoid exactly this (lesson 02):
without the call, each step reuses the blocks of the last one and never talks to the driver.

Sizing (full): an MLP of LAYERS fp32 layers whose batch is BATCH_PER_WIDTH times its width, the width chosen by
`width_for` so that a step takes about STEP_MS at this GPU's measured fp32 rate. A long, thin batch makes the
activations large for the FLOPs (each activation its own segment of batch x width x 4 bytes), so each step's
cudaMalloc/cudaFree of them costs host time comparable to the GPU's step, and the step is short enough that
the synchronization (the host's launches no longer overlap the GPU) counts too.

Prediction (to be measured on an H200): on the H200 (52.7 TFLOP/s fp32 measured) width 512, batch 16,384,
32 MiB activations, ~2.5 ms of GPU work a step; the diagnosis suite measured its allocator at about 1.3 ms
of host time per GiB freed and allocated again (results/h200-2026-12-01-diagnose-suite-e, memory_pressure);
here ~0.35 GiB a step, ~0.5 ms, plus the ~0.3 ms of launches the sync no longer hides: the reference about
1.3x to 1.6x faster than the slow step. On a T4 (~8 TFLOP/s fp32, 320 GB/s) the width comes out 256-320, the
GPU's step takes longer against the same host costs: about 1.2x to 1.4x.
"""
from __future__ import annotations

import torch

from gpulab.exercises.e01_measuring_time import mlp
from gpulab.exercises.task import Task, training, width_for

LAYERS = 4
STEP_MS = 2.0              # the GPU's step at this GPU's fp32 rate
BATCH_PER_WIDTH = 32       # a long batch: large activations for the FLOPs


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
        width, why = width_for(device, STEP_MS, LAYERS, tiny=64, batch_per_width=BATCH_PER_WIDTH)
        batch = width * BATCH_PER_WIDTH if device.type == "cuda" else width
    else:
        width, batch, why = 64, 64, "tiny"

    def draw(gen):
        return torch.randn(batch, width, generator=gen), torch.randn(batch, width, generator=gen)
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
