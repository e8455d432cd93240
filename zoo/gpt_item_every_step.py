"""A small GPT (6 layers, 8 heads, 512 wide, 256 tokens, vocab 8192, batch 16) trained in bf16 autocast with
fused AdamW on token batches drawn on the GPU. The loop keeps a loss curve the simple way: every step
appends `loss.item()` to a list and formats a log line, so every step waits for the GPU to finish."""
import logging

import torch
import torch.nn.functional as F

from _common import compile_backend, half_dtype, reordered, rng, rows, setup
from _transformers import GPT

FIXES = {
    "host_sync": "the loss summed on the GPU and read back (.item()) every 50 steps",
    "launch_bound": 'torch.compile(model, mode="reduce-overhead") (CUDA graphs of the forward and backward), with '
                    "torch.compiler.cudagraph_mark_step_begin() before each step (CPU: the plain compile)",
}

log = logging.getLogger(__name__)

SIZES = {"tiny": dict(vocab=512, layers=2, heads=2, width=64, seq=32, batch=4),
         "full": dict(vocab=8192, layers=6, heads=8, width=512, seq=256, batch=16)}


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    B, T, V = cfg["batch"], cfg["seq"], cfg["vocab"]
    model = GPT(V, cfg["layers"], cfg["heads"], cfg["width"], T, device=device)
    forward = model
    if fix == "launch_bound":
        mode = "reduce-overhead" if device.type == "cuda" else None      # CUDA graphs exist only on a GPU
        forward = torch.compile(model, backend=compile_backend(device), mode=mode)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    dtype = half_dtype(device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    g = torch.Generator(device=device)
    perm = rows(B, reorder)
    history = []
    running = torch.zeros((), device=device)
    k = 0

    def step():
        nonlocal k
        g.manual_seed(int(rng(seed, k).integers(2**62)))
        data = torch.randint(0, V, (B, T + 1), device=device, generator=g)
        x, y = reordered(perm, data[:, :-1], data[:, 1:])
        if fix == "launch_bound" and device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device.type, dtype=dtype):
            logits = forward(x)
            loss = F.cross_entropy(logits.view(-1, V), y.reshape(-1))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        k += 1
        if fix == "host_sync":
            running.add_(loss.detach())
            if k % 50 == 0:
                history.append(running.item() / 50)
                log.info("step %d: loss %.4f", k, history[-1])
                running.zero_()
            return loss.detach()
        history.append(loss.item())
        log.info("step %d: loss %.4f", k, history[-1])
        return history[-1]

    step.model = model
    return step
