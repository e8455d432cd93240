"""A small GPT language model (4 layers, 8 heads, 512 wide, 256 tokens, vocab 8192, batch 16) trained in
fp16 autocast with a GradScaler and AdamW left at its defaults (the multi-tensor "foreach" kernels), on
token batches drawn on the GPU. With a foreach optimizer the scaler unscales the gradients in a pass of
its own and reads its found-inf flag back to the host before every step."""
import torch
import torch.nn.functional as F

from _common import compile_backend, reordered, rng, rows, setup
from _transformers import GPT

FIXES = {
    "optimizer_unfused": "AdamW(..., fused=True): one fused kernel that also unscales and skips on inf, on the GPU",
    "launch_bound": 'torch.compile(model, mode="reduce-overhead") (CUDA graphs of the forward and backward), with '
                    "torch.compiler.cudagraph_mark_step_begin() before each step (CPU: the plain compile)",
}

SIZES = {"tiny": dict(vocab=512, layers=2, heads=2, width=64, seq=32, batch=4),
         "full": dict(vocab=8192, layers=4, heads=8, width=512, seq=256, batch=16)}


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    B, T, V = cfg["batch"], cfg["seq"], cfg["vocab"]
    model = GPT(V, cfg["layers"], cfg["heads"], cfg["width"], T, device=device)
    forward = model
    if fix == "launch_bound":
        mode = "reduce-overhead" if device.type == "cuda" else None      # CUDA graphs exist only on a GPU
        forward = torch.compile(model, backend=compile_backend(device), mode=mode)
    if fix == "optimizer_unfused":
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    scaler = torch.amp.GradScaler(device.type)        # fp16 autocast and GradScaler("cpu") also run on the CPU
    g = torch.Generator(device=device)
    perm = rows(B, reorder)
    k = 0

    def step():
        nonlocal k
        g.manual_seed(int(rng(seed, k).integers(2**62)))
        data = torch.randint(0, V, (B, T + 1), device=device, generator=g)
        k += 1
        x, y = reordered(perm, data[:, :-1], data[:, 1:])
        if fix == "launch_bound" and device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device.type, dtype=torch.float16):
            logits = forward(x)
            loss = F.cross_entropy(logits.view(-1, V), y.reshape(-1))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    step.model = model
    return step
