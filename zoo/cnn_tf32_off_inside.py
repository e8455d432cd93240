"""A ResNet-26 (the Bottleneck ResNet with two blocks a stage) trained in fp32 on 224x224 images,
batch 64, SGD with momentum, images made on the GPU from a seeded generator. For "reproducibility" the
training step turns cuDNN's TF32 off before it runs (torch.backends.cudnn.conv.fp32_precision =
"ieee"), so every convolution runs in full fp32 on the CUDA cores."""
import torch
import torch.nn.functional as F

from _common import GRAPHS_FIX, half_dtype, reduce_overhead, reordered, rows, setup
from _convnets import resnet50

FIXES = {
    "fp32_matmuls": "the forward and loss in bf16 autocast (the TF32 line left as it is)",
    "launch_bound": GRAPHS_FIX,
    "optimizer_unfused": "torch.optim.SGD(..., fused=True)",
}

SIZES = {"tiny": dict(width=8, depths=(1, 1, 1, 1), image=64, classes=10, batch=8),
         "full": dict(width=64, depths=(2, 2, 2, 2), image=224, classes=1000, batch=64)}
N_BATCHES = 4


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    model = resnet50(cfg["classes"], cfg["width"], cfg["depths"], device=device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4,
                          fused=True if fix == "optimizer_unfused" else None)
    dtype = half_dtype(device)
    before = torch.backends.cudnn.conv.fp32_precision

    B, S = cfg["batch"], cfg["image"]
    g = torch.Generator(device=device).manual_seed(seed)
    images = torch.randn(N_BATCHES * B, 3, S, S, device=device, generator=g)
    labels = torch.randint(0, cfg["classes"], (N_BATCHES * B,), device=device, generator=g)
    perm = rows(B, reorder)
    k = 0

    forward, mark = reduce_overhead(model, device) if fix == "launch_bound" else (model, lambda: None)

    def step():
        nonlocal k
        torch.backends.cudnn.conv.fp32_precision = "ieee"     # bit-for-bit reproducible convolutions
        i = (k % N_BATCHES) * B
        x, y = reordered(perm, images[i:i + B], labels[i:i + B])
        k += 1
        mark()
        with torch.autocast(device.type, dtype=dtype, enabled=fix == "fp32_matmuls"):
            loss = F.cross_entropy(forward(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    def close():
        torch.backends.cudnn.conv.fp32_precision = before

    step.model = model
    step.close = close
    return step
