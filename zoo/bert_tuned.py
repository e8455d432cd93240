"""A BERT-base-sized encoder classifier (12 layers, 12 heads, 768 wide, vocab 30522, 256 tokens, batch 32,
2 classes) trained in bf16 autocast with scaled_dot_product_attention and fused AdamW on batches of one
fixed length drawn on the GPU. Written as a tuned step: nothing waits on the host. Its fix list holds the
CUDA-graph fix because the first H200 run found the GPU idle half of the step while the host launched the
twelve eager layers: whether a fix pays is measured, not assumed."""
import torch
import torch.nn.functional as F

from _common import compile_backend, half_dtype, reordered, rng, rows, setup
from _transformers import Encoder

FIXES = {
    "launch_bound": 'torch.compile(model, mode="reduce-overhead") (CUDA graphs of the forward and backward), with '
                    "torch.compiler.cudagraph_mark_step_begin() before each step (CPU: the plain compile)",
}

SIZES = {"tiny": dict(vocab=1000, layers=2, heads=2, width=64, seq=32, batch=8, classes=2),
         "full": dict(vocab=30522, layers=12, heads=12, width=768, seq=256, batch=32, classes=2)}
PAD, CLS = 0, 101


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    B, T = cfg["batch"], cfg["seq"]
    model = Encoder(cfg["vocab"], cfg["layers"], cfg["heads"], cfg["width"], T, cfg["classes"],
                    pad_id=PAD, device=device)
    forward = model
    if fix == "launch_bound":
        mode = "reduce-overhead" if device.type == "cuda" else None      # CUDA graphs exist only on a GPU
        forward = torch.compile(model, backend=compile_backend(device), mode=mode)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01, fused=True)
    dtype = half_dtype(device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    g = torch.Generator(device=device)
    perm = rows(B, reorder)
    k = 0

    def step():
        nonlocal k
        g.manual_seed(int(rng(seed, k).integers(2**62)))
        ids = torch.randint(CLS + 1, cfg["vocab"], (B, T), device=device, generator=g)
        ids[:, 0] = CLS
        labels = torch.randint(0, cfg["classes"], (B,), device=device, generator=g)
        k += 1
        ids, labels = reordered(perm, ids, labels)
        if fix == "launch_bound" and device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device.type, dtype=dtype):
            loss = F.cross_entropy(forward(ids), labels)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    step.model = model
    return step
