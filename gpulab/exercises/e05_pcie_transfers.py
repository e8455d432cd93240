"""Notebook 05's graded exercise: a training step that copies each batch from pageable host memory.

The batch arrives in ordinary (pageable) host memory, as a loader without `pin_memory` serves it. A blocking
`.to(device)` from there makes the driver stage it through its own pinned buffer with one CPU thread, and the
copy first waits for the stream's earlier work: the host stops for the whole copy, the GPU idles while it
runs, and the link runs at the pageable rate (notebook 05's sweep). The lesson's fix copies the batch into a
pinned buffer allocated once (PyTorch's copy, on all of the CPU's threads) and sends it with
`non_blocking=True`: a DMA at the link's pinned rate, queued behind the step before it, while the host goes on.
A reused pinned buffer must not be overwritten before its last copy has finished: the host waits on an event
recorded after that copy (notebook 05; conventions.md), not on the whole GPU.

Sizing (full): the batch (x and y, fp32) is as many bytes as this GPU's measured pageable host->device rate
moves in COPY_MS (`ceilings()["h2d_pageable"]`, notebook 00; measured by the grader with the lesson's
`transfer_bandwidth` where notebook 00 has not run); the MLP's width is chosen so that its step's
FLOPs at the measured fp32 rate take about as long as the pinned copy of the batch (`h2d_pinned`), so the GPU,
not the host, is the limit of the fixed step (and a buffer overwritten too early shows in the losses).

Prediction (to be measured on an H200): 8.3 GB/s pageable, 55 GB/s pinned, 52.7 TFLOP/s fp32 (notebook 00
there): a batch of ~65 MB (width 640, 12,800 rows); slow ~8-10 ms of copy plus ~1.5-2 ms of step, fixed
~1.2 ms of DMA plus the same step (the staging copy, ~1 ms on 16 threads, overlaps the GPU): the reference
about 3x to 4x faster. On a T4 (PCIe 3: ~5 GB/s pageable, ~12 pinned) width 256: its 2 host cores stage the
batch at about the GPU's pace (copy and step), so about 1.4x to 1.8x.
"""
from __future__ import annotations

import torch

from gpulab.exercises.e01_measuring_time import mlp
from gpulab.exercises.task import Task, matmul_rate, training
from gpulab.lessons.l05_pcie_transfers import transfer_bandwidth

LAYERS = 2
COPY_MS = 8.0              # the batch's pageable copy at this GPU's measured rate
TINY = {"width": 64, "rows": 256}


def make_step(model, optimizer):
    """The step as given: the batch is copied from pageable host memory with a blocking .to(device)."""
    device = next(model.parameters()).device

    def step(x, y):
        x, y = x.to(device), y.to(device)        # pageable: the driver stages it, the host waits for the copy
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss
    return step


def make_step_fixed(model, optimizer):
    """The lesson's fix: a pinned staging buffer, allocated once, and non_blocking copies from it. Before
    refilling the buffer the host waits only for its last copy (an event), not for the GPU's step. On the CPU
    there is no pinned memory and no copy: the batch is used where it is."""
    device = next(model.parameters()).device
    pinned = {}

    def step(x, y):
        if device.type == "cuda":
            if not pinned:
                pinned.update(x=torch.empty_like(x, pin_memory=True), y=torch.empty_like(y, pin_memory=True),
                              copied=torch.cuda.Event())
            pinned["copied"].synchronize()          # the buffer's last copy has finished: safe to overwrite
            pinned["x"].copy_(x)
            pinned["y"].copy_(y)
            x = pinned["x"].to(device, non_blocking=True)
            y = pinned["y"].to(device, non_blocking=True)
            pinned["copied"].record()               # after both copies, on the stream that runs them
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss
    return step


def link_rate(name: str, device: torch.device) -> tuple[float, str]:
    """(GB/s, source) of a host->device copy: notebook 00's ceiling `name` ("h2d_pageable", "h2d_pinned"), else
    measured now with the lesson's `transfer_bandwidth` on a 64 MiB copy."""
    from gpulab.core.ceilings import ceilings
    c = ceilings().get(name)
    if c is not None:
        return c.value, c.source
    gbps = transfer_bandwidth(64 * 2**20, "h2d", pinned=name.endswith("pinned"), device=device, budget_s=0.1)["GB/s"]
    return gbps, "measured by the grader (no notebook 00 record)"


def sizes_for(device: torch.device) -> tuple[int, int, str]:
    """(width, rows, why): the batch's bytes from the pageable rate, the width from the pinned rate and fp32's."""
    rate, source = matmul_rate(device, "fp32")
    if rate is None:
        return TINY["width"], TINY["rows"], source
    (pageable, _), (pinned, pinned_source) = link_rate("h2d_pageable", device), link_rate("h2d_pinned", device)
    # a step's FLOPs (6 x LAYERS x rows x width^2) at the fp32 rate ~ the pinned copy of 8 x rows x width bytes
    width = int(min(4096, max(256, round(8 * rate * 1e12 / (6 * LAYERS * pinned * 1e9) / 64) * 64)))
    rows = int(max(256, COPY_MS / 1e3 * pageable * 1e9 / (8 * width) // 256 * 256))
    return width, rows, (f"batch of {COPY_MS:g} ms at {pageable:.1f} GB/s pageable; width: FLOPs at "
                         f"{rate:.1f} TFLOP/s ({source}) ~ the copy at {pinned:.1f} GB/s pinned ({pinned_source})")


def build(scale: str, device: torch.device):
    width, rows, why = sizes_for(device) if scale == "full" else (TINY["width"], TINY["rows"], "tiny")

    def draw(gen):
        return (torch.randn(rows, width, generator=gen, device=gen.device),
                torch.randn(rows, width, generator=gen, device=gen.device))
    wl = training(lambda: mlp(width, LAYERS), lambda m: torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9),
                  draw, device, sizes={"width": width, "rows": rows, "layers": LAYERS,
                                       "batch_mib": round(8 * rows * width / 2**20, 1), "sized by": why})
    # the batch arrives in pageable host memory (drawn on the GPU, copied back outside the timed calls)
    wl.to_device = lambda batch: tuple(t.cpu() for t in batch)
    return wl


TASKS = [Task(
    name="05.pinned", lesson="05", title="every batch copied from pageable memory", tier="systems",
    slow=make_step, reference=make_step_fixed, build=build,
    what=("make_step(model, optimizer) returns a training step that receives each batch in pageable host "
          "memory and copies it to the GPU with a blocking .to(device). Make the copy cheap for the host and "
          "fast on the link, without ever training on a half-overwritten batch. Your function takes the same "
          "arguments and returns a step(x, y) that returns the loss."),
    hints=("Where does the driver put a pageable batch before the GPU can read it, who copies it there, and "
           "what must the host wait for before .to(device) returns?",
           "Allocate pinned buffers once (torch.empty_like(x, pin_memory=True)), copy each batch into them and "
           "send them with .to(device, non_blocking=True); record a torch.cuda.Event after the copies and "
           "synchronize on it before you overwrite the buffers for the next batch."),
)]
