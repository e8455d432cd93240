"""A big MLP (8 layers of 8192, batch 8192, bf16 autocast, fused AdamW, data already on the GPU): every
step is a few dozen large matrix products, so the GPU's Tensor Cores set its pace."""
import torch
from torch import nn
import torch.nn.functional as F

from _common import compile_backend, half_dtype, reordered, rows, setup

FIXES = {
    "launch_bound": 'torch.compile(model, mode="reduce-overhead") (CUDA graphs; on the CPU the plain compile)',
}

SIZES = {"tiny": dict(width=64, layers=3, classes=16, batch=64),
         "full": dict(width=8192, layers=8, classes=1024, batch=8192)}
N_BATCHES = 2


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    d = cfg["width"]
    layers = []
    for _ in range(cfg["layers"]):
        layers += [nn.Linear(d, d), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(d, cfg["classes"])).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    dtype = half_dtype(device)
    forward = model
    if fix == "launch_bound":
        mode = "reduce-overhead" if device.type == "cuda" else None      # CUDA graphs exist only on a GPU
        forward = torch.compile(model, backend=compile_backend(device), mode=mode)

    g = torch.Generator(device=device).manual_seed(seed)
    B = cfg["batch"]
    X = torch.randn(N_BATCHES * B, d, device=device, generator=g)
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
        with torch.autocast(device.type, dtype=dtype):
            loss = F.cross_entropy(forward(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    step.model = model
    return step
