"""ResNet-50 trained in bf16 autocast with the default NCHW layout, batch 128 of 224x224 images already
on the GPU, SGD with momentum: cuDNN's fastest 16-bit convolutions want channels-last tensors, so
layout conversions run around the convolutions."""
import torch
import torch.nn.functional as F

from _common import GRAPHS_FIX, half_dtype, reduce_overhead, reordered, rows, setup
from _convnets import resnet50

FIXES = {
    "layout_transposes": "model.to(memory_format=torch.channels_last) and the images converted likewise",
    "launch_bound": GRAPHS_FIX,
    "optimizer_unfused": "torch.optim.SGD(..., fused=True)",
}

SIZES = {"tiny": dict(width=8, depths=(1, 1, 1, 1), image=64, classes=10, batch=8),
         "full": dict(width=64, depths=(3, 4, 6, 3), image=224, classes=1000, batch=128)}
N_BATCHES = 4


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    model = resnet50(cfg["classes"], cfg["width"], cfg["depths"], device=device)
    if fix == "layout_transposes":
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4,
                          fused=True if fix == "optimizer_unfused" else None)
    dtype = half_dtype(device)

    B, S = cfg["batch"], cfg["image"]
    g = torch.Generator(device=device).manual_seed(seed)
    images = torch.randn(N_BATCHES * B, 3, S, S, device=device, generator=g)
    labels = torch.randint(0, cfg["classes"], (N_BATCHES * B,), device=device, generator=g)
    perm = rows(B, reorder)
    k = 0

    forward, mark = reduce_overhead(model, device) if fix == "launch_bound" else (model, lambda: None)

    def step():
        nonlocal k
        i = (k % N_BATCHES) * B
        x, y = reordered(perm, images[i:i + B], labels[i:i + B])
        if fix == "layout_transposes":
            x = x.contiguous(memory_format=torch.channels_last)
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
