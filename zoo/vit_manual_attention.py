"""A ViT-B/16 (224 x 224 images, 16 x 16 patches, 12 layers, 12 heads, 768 wide, 1000 classes, batch 64)
trained in bf16 autocast with fused AdamW on images drawn on the GPU. Its attention is written out by
hand, as in minGPT: q @ k^T * scale, softmax, @ v, so each layer writes and reads the
(64, 12, 197, 197) score and probability tensors, forward and backward."""
import torch
import torch.nn.functional as F

from _common import GRAPHS_FIX, half_dtype, reduce_overhead, reordered, rng, rows, setup
from _transformers import ViT

FIXES = {
    "attention_math": "F.scaled_dot_product_attention (attention='sdpa'): one fused flash-attention kernel",
    "launch_bound": GRAPHS_FIX,
    "misaligned_gemm": "the 197 tokens (class token and 196 patches) padded to 200, a multiple of 8, with zeros that no "
                       "token attends to (the blocks' key mask); the class token's output, and so the loss, unchanged",
}

SIZES = {"tiny": dict(image=32, patch=8, layers=2, heads=2, width=64, classes=10, batch=8),
         "full": dict(image=224, patch=16, layers=12, heads=12, width=768, classes=1000, batch=64)}
PAD_TO = 8           # the misaligned_gemm fix: the token count padded to a multiple of this


def padded_forward(model, multiple):
    """ViT.forward with the tokens padded to a multiple of `multiple`: the padding tokens are zeros, every block
    masks them out as keys (so no token attends to them), and the head reads the class token, as before."""
    def forward(images):
        x = model.patch_embed(images).flatten(2).transpose(1, 2)
        x = torch.cat([model.cls_token.expand(x.size(0), -1, -1), x], dim=1) + model.pos_embed
        B, T, _ = x.shape
        padded = -(-T // multiple) * multiple
        x = F.pad(x, (0, 0, 0, padded - T))
        keep = (torch.arange(padded, device=x.device) < T).expand(B, padded)
        for block in model.blocks:
            x = block(x, keep)
        return model.head(model.ln(x[:, 0]))
    return forward


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    B, S = cfg["batch"], cfg["image"]
    attention = "sdpa" if fix == "attention_math" else "manual"
    model = ViT(S, cfg["patch"], cfg["layers"], cfg["heads"], cfg["width"], cfg["classes"],
                attention=attention, device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05, fused=True)
    dtype = half_dtype(device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    g = torch.Generator(device=device)
    perm = rows(B, reorder)
    k = 0

    forward, mark = reduce_overhead(model, device) if fix == "launch_bound" else (model, lambda: None)
    if fix == "misaligned_gemm":          # the key mask costs a masked_fill over the scores per layer: not free
        forward = padded_forward(model, PAD_TO)

    def step():
        nonlocal k
        g.manual_seed(int(rng(seed, k).integers(2**62)))
        images = torch.randn(B, 3, S, S, device=device, generator=g)
        labels = torch.randint(0, cfg["classes"], (B,), device=device, generator=g)
        k += 1
        images, labels = reordered(perm, images, labels)
        mark()
        with torch.autocast(device.type, dtype=dtype):
            loss = F.cross_entropy(forward(images), labels)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    step.model = model
    return step
