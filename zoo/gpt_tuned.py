"""A GPT-2-small-wide model (6 layers, 12 heads, 768 wide, 1024 tokens, vocab 50304, batch 16) trained the
way nanoGPT does it: bf16 autocast, fused scaled_dot_product_attention, fused AdamW, the model under
torch.compile, token batches drawn on the GPU. Large matrix products keep the GPU busy."""
import torch
import torch.nn.functional as F

from _common import compile_backend, half_dtype, reordered, rng, rows, setup
from _transformers import GPT

FIXES = {
    "launch_bound": "torch.compile(mode='reduce-overhead'): the step replayed as CUDA graphs",
}

SIZES = {"tiny": dict(vocab=512, layers=2, heads=2, width=64, seq=64, batch=4),
         "full": dict(vocab=50304, layers=6, heads=12, width=768, seq=1024, batch=16)}


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    B, T, V = cfg["batch"], cfg["seq"], cfg["vocab"]
    model = GPT(V, cfg["layers"], cfg["heads"], cfg["width"], T, device=device)
    mode = "reduce-overhead" if fix == "launch_bound" and device.type == "cuda" else None
    compiled = torch.compile(model, backend=compile_backend(device), mode=mode)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
    dtype = half_dtype(device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    g = torch.Generator(device=device)
    perm = rows(B, reorder)
    k = 0

    def step():
        nonlocal k
        g.manual_seed(int(rng(seed, k).integers(2**62)))
        data = torch.randint(0, V, (B, T + 1), device=device, generator=g)
        k += 1
        x, y = reordered(perm, data[:, :-1], data[:, 1:])
        with torch.autocast(device.type, dtype=dtype):
            logits = compiled(x)
            loss = F.cross_entropy(logits.view(-1, V), y.reshape(-1))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    step.model = model
    return step
