"""An MLP classifier (8 hidden layers of 4096 on 1024 features, batch 256) trained in bf16 autocast with
fused AdamW on data that lives on the GPU. The loop logs the batch accuracy every step, reading it back
with `.cpu()` into a list of metrics, so every step waits for the GPU to finish."""
import torch
from torch import nn
import torch.nn.functional as F

from _common import compile_backend, half_dtype, reordered, rows, setup

FIXES = {
    "host_sync": "the accuracy summed on the GPU and read back (then reset) every 100 steps",
    "launch_bound": 'torch.compile(model, mode="reduce-overhead") (CUDA graphs of the forward and backward), with '
                    "torch.compiler.cudagraph_mark_step_begin() before each step (CPU: the plain compile)",
}

SIZES = {"tiny": dict(features=32, hidden=64, layers=2, classes=10, batch=32),
         "full": dict(features=1024, hidden=4096, layers=8, classes=1000, batch=256)}
N_BATCHES = 8        # the synthetic training set: this many batches, cycled


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    dims = [cfg["features"]] + [cfg["hidden"]] * cfg["layers"]
    layers = []
    for a, b in zip(dims, dims[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(dims[-1], cfg["classes"])).to(device)
    forward = model
    if fix == "launch_bound":
        mode = "reduce-overhead" if device.type == "cuda" else None      # CUDA graphs exist only on a GPU
        forward = torch.compile(model, backend=compile_backend(device), mode=mode)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=device.type == "cuda")
    dtype = half_dtype(device)

    g = torch.Generator(device=device).manual_seed(seed)
    B = cfg["batch"]
    X = torch.randn(N_BATCHES * B, cfg["features"], device=device, generator=g)
    Y = torch.randint(0, cfg["classes"], (N_BATCHES * B,), device=device, generator=g)
    perm = rows(B, reorder)
    metrics = []
    correct = torch.zeros((), device=device)
    k = 0

    def step():
        nonlocal k
        i = (k % N_BATCHES) * B
        x, y = reordered(perm, X[i:i + B], Y[i:i + B])
        if fix == "launch_bound" and device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device.type, dtype=dtype):
            logits = forward(x)
            loss = F.cross_entropy(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if fix == "host_sync":
            correct.add_((logits.argmax(1) == y).float().mean())
            if (k + 1) % 100 == 0:
                metrics.append((correct / 100).cpu())
                correct.zero_()
        else:
            acc = (logits.argmax(1) == y).float().mean().cpu()
            metrics.append(acc)
        k += 1
        return loss

    step.model = model
    return step
