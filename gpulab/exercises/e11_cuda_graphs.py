"""Notebook 11's graded exercise: a small MLP's training step that is launch-bound in eager PyTorch.

Eager, every kernel of the step (forward, backward and the optimizer's update: about sixty for lesson 11's
8-layer MLP) costs the host a few microseconds of Python, dispatch and `cudaLaunchKernel`; the MLP is sized so
its GPU work per step is much shorter than that, so the GPU waits for the host. Capturing the whole step once
into a CUDA graph (PyTorch's "whole-network capture": forward, `backward()` and `optimizer.step()` inside
`torch.cuda.graph`) and replaying it is one launch a step.

Measured on an H200 (2026-12-04, torch 2.11, width 640 from the datasheet's fp32 rate): the reference 5.2x (IQR
0.45; eager 2.76 ms a step, replayed 0.53 ms), the target 3.1x. Predicted for a T4: about 4-8x alike. Notebook 11's
H200 runs took 1.5-2.0 ms for the eager forward + backward of this MLP at width 512 and 0.22 ms replayed from a
graph; the optimizer adds a few more launches eager and almost nothing replayed. The width is chosen from the
GPU's fp32 rate so that its matmuls take about 0.1 ms on any GPU: the step stays launch-bound on a T4 as on an
H200, and the ratio follows the host's launch cost, not the GPU's speed. torch.compile(mode="reduce-overhead")
of the model alone records graphs for the forward and backward but keeps the optimizer eager and dynamo's
guards on the host: notebook 11 measured it at about half the hand-captured graph's gain, which is why the
target is half of the reference's gain.
"""
from __future__ import annotations

import torch

from gpulab.exercises.task import Task, training, width_for
from gpulab.lessons.l11_cuda_graphs import MLP

DEPTH = 8           # lesson 11's MLP: 8 Linear layers
WARM_STEPS = 2      # eager steps (on a side stream) before the capture: they train, as the slow step's do


def make_step(model, optimizer):
    """The step as given: eager PyTorch, every kernel of the forward, backward and update launched one by one
    from Python (`model(x, y)` is lesson 11's MLP: its forward returns the mean-squared-error loss)."""
    def step(x, y):
        loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()
    return step


def make_step_graphed(model, optimizer):
    """The lesson's fix: the whole step (forward, backward, optimizer) captured once into a CUDA graph, then
    replayed: one launch a step. The first WARM_STEPS calls train eagerly on a side stream (PyTorch's recipe:
    lazy state such as momentum buffers exists before capture); the next captures on static inputs and replays.
    Each call copies its batch into the static inputs. On the CPU (no CUDA graphs) the plain eager step."""
    s = {"warm": 0}

    def eager(x, y):
        optimizer.zero_grad(set_to_none=True)     # backward then writes fresh .grad tensors (in the graph's pool)
        loss = model(x, y)
        loss.backward()
        optimizer.step()
        return loss.detach()

    def step(x, y):
        if x.device.type != "cuda":
            return eager(x, y)
        if s["warm"] < WARM_STEPS:                       # eager warm-up steps, on a side stream
            s["warm"] += 1
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                loss = eager(x, y)
            torch.cuda.current_stream().wait_stream(side)
            return loss
        if "graph" not in s:                             # capture once, on static copies of this batch
            s["x"], s["y"], s["graph"] = x.clone(), y.clone(), torch.cuda.CUDAGraph()
            with torch.cuda.graph(s["graph"]):
                s["loss"] = eager(s["x"], s["y"])
        s["x"].copy_(x)                                  # this call's batch into the static inputs
        s["y"].copy_(y)
        s["graph"].replay()
        return s["loss"].clone()                         # the next replay overwrites the static loss
    return step


def build(scale: str, device: torch.device):
    # the matmuls of a step (forward and backward: 6 w^2 batch FLOP a layer) take ~0.1 ms at this GPU's fp32 rate:
    # far below the host's launch time for ~60 kernels, on any GPU
    if scale == "full":
        width, why = width_for(device, 0.1, DEPTH, tiny=64, batch_per_width=0.5, low=256, high=2048)
    else:
        width, why = 64, "tiny"
    batch = max(32, width // 2)

    def draw(gen):
        return (torch.randn(batch, width, generator=gen, device=gen.device),
                torch.randn(batch, width, generator=gen, device=gen.device))
    return training(lambda: MLP(width, DEPTH), lambda m: torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9),
                    draw, device, sizes={"width": width, "depth": DEPTH, "batch": batch, "optimizer": "SGD momentum",
                                         "sized by": why})


TASKS = [Task(
    name="11.graphs", lesson="11", title="a launch-bound training step, one kernel launch at a time", tier="systems",
    slow=make_step, reference=make_step_graphed, build=build, warmup=4,
    what=("make_step(model, optimizer) returns a training step for lesson 11's small MLP (model(x, y) is the loss) "
          "with SGD: forward, backward and update, each kernel launched from Python. The GPU finishes each kernel "
          "faster than the host can launch the next. Make the step cost the host one launch. Your function takes "
          "the same arguments and returns a step(x, y) that returns the loss; every call must train on its own "
          "batch, and the first calls must train too."),
    hints=("Per step, how many kernels does the GPU run, and how long does the host take to launch each of them, "
           "against how long the GPU takes to run them (notebook 11, section 4's profile)?",
           "Capture the whole step, optimizer.step() included, into a torch.cuda.CUDAGraph: run the first couple of "
           "steps eagerly on a side stream, then capture one step on static input tensors inside "
           "torch.cuda.graph(g); each later call copies its batch into them with .copy_() and calls g.replay(). "
           "Return a clone of the static loss. Keep the plain step when x is not on a GPU."),
)]
