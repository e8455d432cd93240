"""A GPT (6 layers, 12 heads, 768 wide, 1024 tokens, batch 8) with GPT-2's own vocabulary of 50257 tokens,
trained in bf16 autocast with fused AdamW on token batches drawn on the GPU. The tied output head, a
(8192 x 768) @ (768 x 50257) matrix product, and its two products in the backward pass carry the odd
dimension 50257: the logits' rows are not 16-byte aligned and the tiles of the product do not divide it."""
import torch
import torch.nn.functional as F

from _common import GRAPHS_FIX, half_dtype, reduce_overhead, reordered, rng, rows, setup
from _transformers import GPT

FIXES = {
    "misaligned_gemm": "the vocabulary padded to 50304 (a multiple of 64); the loss over the first 50257 logits, "
                       "as the data never uses the padding tokens",
    "launch_bound": GRAPHS_FIX,
}

SIZES = {"tiny": dict(vocab=50257, layers=1, heads=2, width=32, seq=32, batch=4),
         "full": dict(vocab=50257, layers=6, heads=12, width=768, seq=1024, batch=8)}


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    B, T, V = cfg["batch"], cfg["seq"], cfg["vocab"]
    vocab = 50304 if fix == "misaligned_gemm" else V
    model = GPT(vocab, cfg["layers"], cfg["heads"], cfg["width"], T, device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
    dtype = half_dtype(device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    g = torch.Generator(device=device)
    perm = rows(B, reorder)
    k = 0

    forward, mark = reduce_overhead(model, device) if fix == "launch_bound" else (model, lambda: None)

    def step():
        nonlocal k
        g.manual_seed(int(rng(seed, k).integers(2**62)))
        data = torch.randint(0, V, (B, T + 1), device=device, generator=g)
        k += 1
        x, y = reordered(perm, data[:, :-1], data[:, 1:])
        mark()
        with torch.autocast(device.type, dtype=dtype):
            logits = forward(x)
            if vocab != V:                     # the padding tokens never occur: no place in the softmax
                logits = logits[..., :V]
            loss = F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    step.model = model
    return step
