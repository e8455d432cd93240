"""Notebook 15's graded exercise: a training step to diagnose, then fix as the diagnosis says.

The step is the zoo's `gc_collect_every_step` habit on lesson 15's MLP: a `gc.collect()` left in the loop from an
earlier hunt for a memory leak, beside a history of per-step records. A full collection walks every Python object
of the process (torch and its modules alone are hundreds of thousands) on the host, every step, while the GPU
has nothing queued: `gpulab.diagnose` names it `host_code` (the host's time outside PyTorch's operators). The
fix the diagnosis names is to take the line out; the records stay. It changes no arithmetic: systems tier.

`step_for_diagnosis(make_step)` builds the exercise's model, optimizer and a batch as the grader does and returns
a step with no arguments, which `gpulab.diagnose` takes.

Sizing at full size: lesson 15's MLP (4 GELU layers of width w, 10 classes) on a batch of w rows, its fp32 step
about STEP_MS at this GPU's fp32 rate (`width_for`); on the CPU, tiny.

Measured on an H200 (2026-12-04, torch 2.11, width 3008): the reference 11.6x (IQR 0.35; 178 ms a step as given,
15 ms without the collection), the target 6.3x. Predicted: about 5-15x on an H200 and on a T4. One full collection
in a process with torch, gpulab and the lessons imported took 148 ms of host time on this course's 2-core CPU
machine (the diagnosis of the step at the tiny size); a GPU server's host is faster, but a collection still
costs tens of ms whatever the GPU, against a step of about STEP_MS of GPU work. The zoo's step of this habit
gained 12x on the H200. A slower host (a T4's cloud VM) collects more slowly and gains more.
"""
from __future__ import annotations

import gc
import time

import torch

from gpulab.exercises.task import Task, training, width_for
from gpulab.lessons.l15_your_training_step import mlp

DEPTH = 4
CLASSES = 10
STEP_MS = 10.0


def make_step(model, optimizer):
    """The step as given: it keeps a record per step (its loss stays on the GPU) and, left over from a hunt for
    a memory leak, runs a full garbage collection every step."""
    history = []

    def step(x, y):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        history.append({"step": len(history), "loss": loss.detach(), "time": time.time()})
        gc.collect()
        return loss.detach()
    return step


def make_step_fixed(model, optimizer):
    """The fix the diagnosis names (host_code): the gc.collect() line taken out; the records stay."""
    history = []

    def step(x, y):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        history.append({"step": len(history), "loss": loss.detach(), "time": time.time()})
        return loss.detach()
    return step


def build(scale: str, device: torch.device, freeze: bool = True):
    if scale == "full":
        width, why = width_for(device, STEP_MS, DEPTH, tiny=64)
    else:
        # the CPU judges correctness only: the objects of the grading process (torch, gpulab) moved to gc's
        # permanent generation, so the slow step's collections walk only what it made and the grading stays short
        if freeze:
            gc.freeze()
        width, why = 64, "tiny (gc.freeze() first: a collection walks only the step's own objects)"
    batch = width

    def draw(gen):
        return (torch.randn(batch, width, generator=gen, device=gen.device),
                torch.randint(0, CLASSES, (batch,), generator=gen, device=gen.device))
    return training(lambda: mlp(width, width, DEPTH, CLASSES, torch.device("cpu")),
                    lambda m: torch.optim.SGD(m.parameters(), lr=1e-3, momentum=0.9), draw, device,
                    sizes={"width": width, "depth": DEPTH, "batch": batch, "sized by": why})


def step_for_diagnosis(make_step, scale: str | None = None, device: torch.device | None = None):
    """A step with no arguments for `gpulab.diagnose`: `make_step` (the exercise's signature) on the exercise's
    model and optimizer, training on one batch drawn as the grader draws them."""
    from gpulab.core.device import pick_device, resolve_scale
    device = device or pick_device()
    wl = build(resolve_scale(scale), device, freeze=False)
    runner = wl.instantiate(make_step)
    batch = wl.to_device(wl.draw(torch.Generator(device=device).manual_seed(0)))
    return lambda: runner.call(batch)


TASKS = [Task(
    name="15.diagnosed", lesson="15", title="a step to diagnose, then fix", tier="systems",
    slow=make_step, reference=make_step_fixed, build=build,
    what=("make_step(model, optimizer) returns a training step for lesson 15's MLP as someone else wrote it. "
          "Diagnose it (gpulab.diagnose(step_for_diagnosis(make_step)) from gpulab.exercises.e15_your_training_step), "
          "then apply the fix the top verdict names and nothing else. Your function takes the same arguments and "
          "returns a step(x, y) that returns the loss."),
    hints=("Run the diagnosis: where does the step's time go, the GPU's kernels or the host? If the host, which "
           "line of the step runs Python work that no training needs?",
           "The verdict is host_code: gc.collect() walks every Python object of the process each step. Take the "
           "line out (keep the history); if you ever need it, collect every few thousand steps or call gc.freeze() "
           "once after start-up."),
)]
