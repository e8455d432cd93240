"""A wide MLP (1024 features, 3 hidden layers of 2048, 1000 classes: about 12 M parameters) trained in
bf16 autocast with fused AdamW on data already on the GPU, batch 8192. The loop saves a checkpoint of
the model and the optimizer (torch.save of both state dicts, about 150 MB) every 20 steps."""
import os
import shutil
import tempfile

import torch
from torch import nn
import torch.nn.functional as F

from _common import GRAPHS_FIX, half_dtype, reduce_overhead, reordered, rows, setup

FIXES = {
    "periodic_stall": "the checkpoint saved every 500 steps instead of every 20",
    "launch_bound": GRAPHS_FIX,
}

SIZES = {"tiny": dict(features=32, hidden=64, layers=2, classes=10, batch=32),
         "full": dict(features=1024, hidden=2048, layers=3, classes=1000, batch=8192)}
N_BATCHES = 4


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    dims = [cfg["features"]] + [cfg["hidden"]] * cfg["layers"]
    layers = []
    for a, b in zip(dims, dims[1:]):
        layers += [nn.Linear(a, b), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(dims[-1], cfg["classes"])).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    dtype = half_dtype(device)
    save_every = 500 if fix == "periodic_stall" else 20
    ckpt_dir = tempfile.mkdtemp(prefix="ckpt-")

    g = torch.Generator(device=device).manual_seed(seed)
    B = cfg["batch"]
    X = torch.randn(N_BATCHES * B, cfg["features"], device=device, generator=g)
    Y = torch.randint(0, cfg["classes"], (N_BATCHES * B,), device=device, generator=g)
    perm = rows(B, reorder)
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
        if k % save_every == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": k},
                       os.path.join(ckpt_dir, "last.pt"))
        return loss

    def close():
        shutil.rmtree(ckpt_dir, ignore_errors=True)

    step.model = model
    step.close = close
    return step
