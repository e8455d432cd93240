"""An MLP (1024 features, 6 hidden layers of 4096, 1000 classes: about 90 M parameters) trained with
DistributedDataParallel, bf16 autocast and fused AdamW, accumulating gradients over 4 micro-batches of
256 rows per optimizer step. Every micro-batch's backward runs DDP's all-reduce of all the gradients,
though only the last one's result is used."""
from contextlib import nullcontext
import time

import torch
import torch.distributed as dist
from torch import nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from _common import half_dtype, reordered, rows, setup

FIXES = {
    "no_sync_accumulation": "`with model.no_sync():` around the forward and backward of all but the last micro-batch",
}
NEEDS_GPUS = 2

SIZES = {"tiny": dict(features=32, hidden=64, layers=2, classes=10, micro=16),
         "full": dict(features=1024, hidden=4096, layers=6, classes=1000, micro=256)}
ACCUM = 4
N_BATCHES = 4


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    own_group = not dist.is_initialized()
    if own_group:        # run alone: a one-process group
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rank = dist.get_rank()
    dims = [cfg["features"]] + [cfg["hidden"]] * cfg["layers"]
    layers = []
    for a, b in zip(dims, dims[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    net = nn.Sequential(*layers, nn.Linear(dims[-1], cfg["classes"])).to(device)
    model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    dtype = half_dtype(device)

    M = cfg["micro"]
    B = ACCUM * M                # this rank's rows per optimizer step
    g = torch.Generator(device=device).manual_seed(seed * 1000 + rank)
    X = torch.randn(N_BATCHES * B, cfg["features"], device=device, generator=g)
    Y = torch.randint(0, cfg["classes"], (N_BATCHES * B,), device=device, generator=g)
    perm = rows(M, reorder)
    k = 0

    def step():
        nonlocal k
        i = (k % N_BATCHES) * B
        k += 1
        opt.zero_grad(set_to_none=True)
        for m in range(ACCUM):
            x, y = reordered(perm, X[i + m * M:i + (m + 1) * M], Y[i + m * M:i + (m + 1) * M])
            last = m == ACCUM - 1
            with model.no_sync() if fix == "no_sync_accumulation" and not last else nullcontext():
                with torch.autocast(device.type, dtype=dtype):
                    loss = F.cross_entropy(model(x), y) / ACCUM
                loss.backward()
        opt.step()
        return loss

    def close():
        if own_group and dist.is_initialized():
            time.sleep(0.2)      # gloo's workers finish their work items (they need the GIL) before the group
            dist.destroy_process_group()   # goes: gpulab.diagnose.cases' DDP case hung CI without this

    step.model = net
    step.close = close
    return step
