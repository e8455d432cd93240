"""A small MLP (8 layers of 256 with LayerNorm and GELU, batch 64, fp32, SGD with momentum) trained
eagerly on data already on the GPU: each step is a hundred or so kernels of a few microseconds."""
import torch
from torch import nn
import torch.nn.functional as F

from _common import compile_backend, reordered, rows, setup

FIXES = {
    "launch_bound": 'torch.compile(model, mode="reduce-overhead") (CUDA graphs), with '
                    "torch.compiler.cudagraph_mark_step_begin() before each step (CPU: the plain compile)",
    "optimizer_unfused": "torch.optim.SGD(..., fused=True)",
}

SIZES = {"tiny": dict(features=32, hidden=32, layers=3, classes=10, batch=16),
         "full": dict(features=256, hidden=256, layers=8, classes=10, batch=64)}
N_BATCHES = 8


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    blocks = [nn.Linear(cfg["features"], cfg["hidden"])]
    for _ in range(cfg["layers"] - 1):
        blocks += [nn.LayerNorm(cfg["hidden"]), nn.GELU(), nn.Linear(cfg["hidden"], cfg["hidden"])]
    model = nn.Sequential(*blocks, nn.GELU(), nn.Linear(cfg["hidden"], cfg["classes"])).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9,
                          fused=True if fix == "optimizer_unfused" else None)
    forward = model
    if fix == "launch_bound":
        mode = "reduce-overhead" if device.type == "cuda" else None      # CUDA graphs exist only on a GPU
        forward = torch.compile(model, backend=compile_backend(device), mode=mode)

    g = torch.Generator(device=device).manual_seed(seed)
    B = cfg["batch"]
    X = torch.randn(N_BATCHES * B, cfg["features"], device=device, generator=g)
    Y = torch.randint(0, cfg["classes"], (N_BATCHES * B,), device=device, generator=g)
    perm = rows(B, reorder)
    k = 0

    def step():
        nonlocal k
        i = (k % N_BATCHES) * B
        x, y = reordered(perm, X[i:i + B], Y[i:i + B])
        k += 1
        if fix == "launch_bound" and device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        loss = F.cross_entropy(forward(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    step.model = model
    return step
