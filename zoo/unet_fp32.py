"""A UNet (4 levels, width 64) for semantic segmentation of 256x256 images into 6 classes, batch 8,
trained in fp32 with PyTorch's defaults (NCHW layout) and Adam; images and masks already on the GPU."""
import torch
import torch.nn.functional as F

from _common import GRAPHS_FIX, half_dtype, reduce_overhead, reordered, rows, setup
from _convnets import UNet

FIXES = {
    "fp32_matmuls": "the forward and loss in bf16 autocast",
    "launch_bound": GRAPHS_FIX,
    "optimizer_unfused": "torch.optim.Adam(..., fused=True)",
    "layout_transposes": "model.to(memory_format=torch.channels_last) and the images converted likewise",
}

SIZES = {"tiny": dict(width=4, depth=2, image=32, classes=3, batch=4),
         "full": dict(width=64, depth=4, image=256, classes=6, batch=8)}
N_BATCHES = 4


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    model = UNet(3, cfg["classes"], cfg["width"], cfg["depth"], device=device)
    if fix == "layout_transposes":
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3,
                           fused=True if fix == "optimizer_unfused" else None)
    dtype = half_dtype(device)

    B, S = cfg["batch"], cfg["image"]
    g = torch.Generator(device=device).manual_seed(seed)
    images = torch.randn(N_BATCHES * B, 3, S, S, device=device, generator=g)
    masks = torch.randint(0, cfg["classes"], (N_BATCHES * B, S, S), device=device, generator=g)
    perm = rows(B, reorder)
    k = 0

    forward, mark = reduce_overhead(model, device) if fix == "launch_bound" else (model, lambda: None)

    def step():
        nonlocal k
        i = (k % N_BATCHES) * B
        x, y = reordered(perm, images[i:i + B], masks[i:i + B])
        if fix == "layout_transposes":
            x = x.contiguous(memory_format=torch.channels_last)
        k += 1
        mark()
        with torch.autocast(device.type, dtype=dtype, enabled=fix == "fp32_matmuls"):
            loss = F.cross_entropy(forward(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    step.model = model
    return step
