"""A residual MLP (24 blocks of LayerNorm, Linear 512->2048, GELU, Linear 2048->512; about 50 M
parameters) trained in bf16 autocast with fused AdamW on data already on the GPU, batch 4096, keeping a
history of per-step records. A `gc.collect()` left in the loop from an earlier hunt for a memory leak
walks every Python object of the process each step."""
import gc
import time

import torch
from torch import nn
import torch.nn.functional as F

from _common import GRAPHS_FIX, half_dtype, reduce_overhead, reordered, rows, setup

FIXES = {
    "host_code": "the gc.collect() line removed",
    "launch_bound": GRAPHS_FIX,
}

SIZES = {"tiny": dict(features=32, width=32, blocks=2, classes=10, batch=32),
         "full": dict(features=512, width=512, blocks=24, classes=1000, batch=4096)}
N_BATCHES = 4


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    d = cfg["width"]
    model = nn.Sequential(nn.Linear(cfg["features"], d), *[Block(d) for _ in range(cfg["blocks"])],
                          nn.LayerNorm(d), nn.Linear(d, cfg["classes"])).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")
    dtype = half_dtype(device)

    g = torch.Generator(device=device).manual_seed(seed)
    B = cfg["batch"]
    X = torch.randn(N_BATCHES * B, cfg["features"], device=device, generator=g)
    Y = torch.randint(0, cfg["classes"], (N_BATCHES * B,), device=device, generator=g)
    perm = rows(B, reorder)
    history = []
    k = 0

    forward, mark = reduce_overhead(model, device) if fix == "launch_bound" else (model, lambda: None)

    def step():
        nonlocal k
        i = (k % N_BATCHES) * B
        x, y = reordered(perm, X[i:i + B], Y[i:i + B])
        k += 1
        mark()
        with torch.autocast(device.type, dtype=dtype):
            loss = F.cross_entropy(forward(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        history.append({"step": k, "lr": opt.param_groups[0]["lr"], "time": time.time()})
        if fix != "host_code":
            gc.collect()
        return loss

    step.model = model
    return step
