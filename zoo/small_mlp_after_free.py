"""A small MLP (12 layers of 256, about 3 MB of weights, batch 256, fp32, Adam) trained eagerly, in a
script that first loads something big onto the GPU (a quarter of its free memory) and frees it again:
the caching allocator keeps that memory reserved for the rest of the run. Each step is dozens of short
kernels."""
import torch
from torch import nn
import torch.nn.functional as F

from _common import compile_backend, reordered, rows, setup

FIXES = {
    "launch_bound": 'torch.compile(model, mode="reduce-overhead") (CUDA graphs), with '
                    "torch.compiler.cudagraph_mark_step_begin() before each step (CPU: the plain compile)",
    "memory_pressure": "torch.cuda.empty_cache() once after the big tensor is freed (on the CPU: nothing to do)",
    "optimizer_unfused": "torch.optim.Adam(..., fused=True)",
}

SIZES = {"tiny": dict(features=32, hidden=64, layers=2, classes=10, batch=32),
         "full": dict(features=256, hidden=256, layers=12, classes=100, batch=256)}
N_BATCHES = 8


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]

    # the "preprocessing" that came first: a big tensor, used and dropped
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        big = torch.empty(free // 4, dtype=torch.uint8, device=device)
    else:
        big = torch.empty(16 * 2**20, dtype=torch.uint8)
    big.fill_(1)
    del big
    if fix == "memory_pressure" and device.type == "cuda":
        torch.cuda.empty_cache()

    dims = [cfg["features"]] + [cfg["hidden"]] * cfg["layers"]
    layers = []
    for a, b in zip(dims, dims[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(dims[-1], cfg["classes"])).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3,
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

    def close():
        if device.type == "cuda":
            torch.cuda.empty_cache()     # hand the big reservation back before the next script

    step.model = model
    step.close = close
    return step
