"""Notebook 01's graded exercise: a training loop that reads its loss back to the host every step.

`loss.item()` copies one number from the GPU, and to do so the host waits until every kernel queued before it
has finished. The host then cannot queue step i+1 while the GPU runs step i: each step costs the host's launch
time plus the GPU's time, one after the other. Keeping the loss on the GPU (and reading the log once, at the
end) lets the two overlap. The MLP is sized so its step takes about as long on the GPU as the host takes to
launch it: that is where the synchronization costs most (up to 2x).
"""
from __future__ import annotations

import torch

from gpulab.exercises.task import Task, training, width_for


def make_step(model, optimizer):
    """The step as given: it logs the loss as a Python float every step."""
    log = []

    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        log.append(loss.item())        # the host waits here for the whole step to finish on the GPU
        return loss
    return step


def make_step_fixed(model, optimizer):
    """The lesson's fix: the log keeps the loss tensors on the GPU; nothing waits until the log is read."""
    log = []

    def step(x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        log.append(loss.detach())      # no copy to the host: the GPU's queue keeps running
        return loss
    return step


def mlp(width: int, layers: int) -> torch.nn.Module:
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods[:-1])


def build(scale: str, device: torch.device):
    layers = 4
    width, why = width_for(device, 0.3, layers, tiny=64) if scale == "full" else (64, "tiny")
    batch = width

    def draw(gen):
        return torch.randn(batch, width, generator=gen), torch.randn(batch, width, generator=gen)
    return training(lambda: mlp(width, layers), lambda m: torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9),
                    draw, device, sizes={"width": width, "batch": batch, "layers": layers, "sized by": why})


TASKS = [Task(
    name="01.sync", lesson="01", title="a loss read back to the host every step", tier="systems",
    slow=make_step, reference=make_step_fixed, build=build,
    what=("make_step(model, optimizer) returns a training step that logs its loss with loss.item(). Keep the log, "
          "but stop the host from waiting for the GPU every step. Your function takes the same arguments and "
          "returns a step(x, y) that returns the loss."),
    hints=("Which call in the step copies a number from the GPU to the host, and what must the GPU have finished "
           "before that number exists?",
           "Append loss.detach() to the log instead of loss.item(): a tensor on the GPU. Read the log (e.g. "
           "torch.stack(log).tolist()) only when you print it."),
)]
