"""An MLP (4096 features, two hidden layers of 2048, 1000 classes, bf16 autocast, fused AdamW) fed from
large batches held in pinned host memory (32768 x 4096 bf16: 256 MB each, four of them cycled). Each
step copies its batch with non_blocking=True on the default stream, right before the forward, so the
copy and the compute take turns instead of overlapping."""
import torch
from torch import nn
import torch.nn.functional as F

from _common import GRAPHS_FIX, half_dtype, reduce_overhead, reordered, rng, rows, setup

FIXES = {
    "copy_not_overlapped": "the next batch copied on a side stream (torch.cuda.Stream) while this one trains: "
                           "wait_stream before use, record_stream on the batch",
    "launch_bound": GRAPHS_FIX,
}

SIZES = {"tiny": dict(features=64, hidden=64, classes=10, batch=64),
         "full": dict(features=4096, hidden=2048, classes=1000, batch=32768)}
N_BATCHES = 4


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    D, H, C, B = cfg["features"], cfg["hidden"], cfg["classes"], cfg["batch"]
    model = nn.Sequential(nn.Linear(D, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU(), nn.Linear(H, C)).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device.type == "cuda")
    dtype = half_dtype(device)

    cuda = device.type == "cuda"
    g = torch.Generator().manual_seed(int(rng(seed).integers(2**62)))
    inputs = [torch.randn(B, D, generator=g).to(dtype) for _ in range(N_BATCHES)]
    targets = [torch.randint(0, C, (B,), generator=g) for _ in range(N_BATCHES)]
    if cuda:
        inputs = [t.pin_memory() for t in inputs]
        targets = [t.pin_memory() for t in targets]

    def fetch(k):
        return inputs[k % N_BATCHES].to(device, non_blocking=True), targets[k % N_BATCHES].to(device, non_blocking=True)

    overlap = fix == "copy_not_overlapped" and cuda
    copy_stream = torch.cuda.Stream(device) if overlap else None
    ahead = None
    perm = rows(B, reorder)
    k = 0

    forward, mark = reduce_overhead(model, device) if fix == "launch_bound" else (model, lambda: None)

    def step():
        nonlocal k, ahead
        if overlap:
            if ahead is None:
                with torch.cuda.stream(copy_stream):
                    ahead = fetch(k)
            torch.cuda.current_stream().wait_stream(copy_stream)
            x, y = ahead
            x.record_stream(torch.cuda.current_stream())
            y.record_stream(torch.cuda.current_stream())
            with torch.cuda.stream(copy_stream):
                ahead = fetch(k + 1)
        else:
            x, y = fetch(k)
        x, y = reordered(perm, x, y)
        k += 1
        mark()
        with torch.autocast(device.type, dtype=dtype):
            loss = F.cross_entropy(forward(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    step.model = model
    return step
