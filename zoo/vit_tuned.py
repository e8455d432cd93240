"""A ViT of ViT-B/16's width (224 x 224 images, 16 x 16 patches, 6 layers, 12 heads, 768 wide, 1000
classes, batch 128) trained the way a tuned recipe does it: bf16 autocast, scaled_dot_product_attention,
fused AdamW, the model under torch.compile, images drawn on the GPU. Large matrix products keep the GPU
busy."""
import torch
import torch.nn.functional as F

from _common import compile_backend, half_dtype, reordered, rng, rows, setup
from _transformers import ViT

FIXES = {
    "launch_bound": "torch.compile(mode='reduce-overhead'): the step replayed as CUDA graphs",
}

SIZES = {"tiny": dict(image=32, patch=8, layers=2, heads=2, width=64, classes=10, batch=8),
         "full": dict(image=224, patch=16, layers=6, heads=12, width=768, classes=1000, batch=128)}


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    B, S = cfg["batch"], cfg["image"]
    model = ViT(S, cfg["patch"], cfg["layers"], cfg["heads"], cfg["width"], cfg["classes"], device=device)
    mode = "reduce-overhead" if fix == "launch_bound" and device.type == "cuda" else None
    compiled = torch.compile(model, backend=compile_backend(device), mode=mode)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05, fused=True)
    dtype = half_dtype(device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    g = torch.Generator(device=device)
    perm = rows(B, reorder)
    k = 0

    def step():
        nonlocal k
        g.manual_seed(int(rng(seed, k).integers(2**62)))
        images = torch.randn(B, 3, S, S, device=device, generator=g)
        labels = torch.randint(0, cfg["classes"], (B,), device=device, generator=g)
        k += 1
        images, labels = reordered(perm, images, labels)
        with torch.autocast(device.type, dtype=dtype):
            loss = F.cross_entropy(compiled(images), labels)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    step.model = model
    return step
