"""Notebook 01's graded exercise: a training loop that reads its loss back to the host every step.

`loss.item()` copies one number from the GPU, and to do so the host waits until every kernel queued before it
has finished. Whatever the host does next for the step (here its own share of the step's work: a statistic over
host-side values, as a logging or metrics line does) then runs while the GPU sits idle, and the step costs the
GPU's time plus the host's. Keeping the loss on the GPU lets the host's work run while the GPU trains.

Predicted (before the H200 run): the GPU's part is sized to about 2 ms at this GPU's measured fp32 rate and the
host's to about 2 ms on this host, so the fix should approach 2x (1.6-1.9x with launch costs) on any GPU. (A first
version without host work measured 1.02-1.03x on the H200, 2026-12-04: a step that only launches kernels loses
little to a synchronize, because the GPU has almost caught up when the host reaches `.item()`.)
"""
from __future__ import annotations

import time

import numpy as np
import torch

from gpulab.exercises.task import Task, training, width_for


def make_step(model, optimizer):
    """The step as given: it logs the loss as a Python float every step, then does its host-side work."""
    log = []

    def step(x, y, host):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        log.append(loss.item())         # the host waits here for the whole step to finish on the GPU
        spread = float(np.percentile(host, 90) - np.percentile(host, 10))   # the host's own work for the step
        return loss, spread
    return step


def make_step_fixed(model, optimizer):
    """The lesson's fix: the log keeps the loss tensors on the GPU, so the host's work overlaps the GPU's."""
    log = []

    def step(x, y, host):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        log.append(loss.detach())       # no copy to the host: nothing waits, the GPU's queue keeps running
        spread = float(np.percentile(host, 90) - np.percentile(host, 10))
        return loss, spread
    return step


def mlp(width: int, layers: int) -> torch.nn.Module:
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods[:-1])


def host_values_for(ms: float) -> int:
    """How many values the host's statistic must read to take about `ms` on this host (measured now)."""
    probe = np.random.default_rng(0).standard_normal(1 << 16).astype(np.float32)
    t0 = time.perf_counter()
    for _ in range(5):
        np.percentile(probe, 90) - np.percentile(probe, 10)
    per = (time.perf_counter() - t0) / 5 / probe.size
    return int(min(1 << 24, max(1 << 10, ms / 1e3 / max(per, 1e-12))))


def build(scale: str, device: torch.device):
    layers = 4
    if scale == "full":
        width, why = width_for(device, 2.0, layers, tiny=64)
        values = host_values_for(2.0)
    else:
        width, why, values = 64, "tiny", 1024
    batch = width

    def draw(gen):
        host = torch.randn(values, generator=gen, device=gen.device).cpu().numpy()
        return (torch.randn(batch, width, generator=gen, device=gen.device),
                torch.randn(batch, width, generator=gen, device=gen.device), host)
    return training(lambda: mlp(width, layers), lambda m: torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9),
                    draw, device, sizes={"width": width, "batch": batch, "layers": layers, "sized by": why,
                                         "host values": values})


TASKS = [Task(
    name="01.sync", lesson="01", title="a loss read back to the host every step", tier="systems",
    slow=make_step, reference=make_step_fixed, build=build,
    what=("make_step(model, optimizer) returns a training step that logs its loss with loss.item() and then does "
          "its own host-side work (a statistic of host values). Keep the log and the statistic, but stop the host "
          "from waiting for the GPU every step. Your function takes the same arguments and returns a "
          "step(x, y, host) that returns (loss, spread)."),
    hints=("Which call in the step copies a number from the GPU to the host, and what must the GPU have finished "
           "before that number exists? What does the host do while it waits, and what after?",
           "Append loss.detach() to the log instead of loss.item(): a tensor on the GPU. Read the log (e.g. "
           "torch.stack(log).tolist()) only when you print it."),
)]
