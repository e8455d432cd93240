"""timm's training loop (huggingface/pytorch-image-models, train.py, train_one_epoch) with its defaults: a ResNet-26
(Bottleneck blocks, 2 per stage) on 160x160 images, batch 128, NCHW (`--channels-last` off), AMP in timm's
default fp16 with its NativeScaler (a GradScaler), SGD as timm's `create_optimizer_v2('sgd')` makes it
(Nesterov momentum 0.9, weight decay, the default multi-tensor kernels), and a ModelEmaV3 of the weights
updated after every step with `torch._foreach_lerp_`. The batches come already on the GPU as timm's
PrefetchLoader hands them out: uint8 images normalized there (`.float().sub_(mean).div_(std)`). Every step
the loss meter is updated with `loss.item()` (`losses_m.update(loss.item() * accum_steps, input.size(0))`),
so the host waits for the step to finish."""
import copy

import torch
import torch.nn.functional as F

from _common import GRAPHS_FIX, half_dtype, reduce_overhead, reordered, rows, setup
from _convnets import resnet50

FIXES = {
    "host_sync": "the loss meter fed loss.detach() (summed on the GPU), read at the log interval (every 50 updates), "
                 "and SGD(..., fused=True), so that GradScaler reads no found-inf value back (the verdict's fix names "
                 "both reads)",
    "optimizer_unfused": "torch.optim.SGD(..., nesterov=True, fused=True)",
    "launch_bound": GRAPHS_FIX,
    "layout_transposes": "--channels-last: model.to(memory_format=torch.channels_last) and the input likewise",
}

SIZES = {"tiny": dict(width=8, depths=(1, 1, 1, 1), image=32, classes=10, batch=8),
         "full": dict(width=64, depths=(2, 2, 2, 2), image=160, classes=1000, batch=128)}
N_BATCHES = 4
LOG_INTERVAL = 50


class AverageMeter:
    def __init__(self):
        self.sum, self.count = 0.0, 0

    def update(self, val, n=1):
        self.sum += val * n
        self.count += n


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    model = resnet50(cfg["classes"], cfg["width"], cfg["depths"], device=device)
    channels_last = fix == "layout_transposes"
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=2e-5,
                          fused=True if fix in ("optimizer_unfused", "host_sync") else None)
    half = half_dtype(device)
    dtype = torch.float16 if device.type == "cuda" and half != torch.float32 else half     # timm's --amp-dtype
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    ema = copy.deepcopy(model).eval().requires_grad_(False)
    forward, mark = reduce_overhead(model, device) if fix == "launch_bound" else (model, lambda: None)

    B, S = cfg["batch"], cfg["image"]
    g = torch.Generator(device=device).manual_seed(seed)
    images = torch.randint(0, 256, (N_BATCHES * B, 3, S, S), dtype=torch.uint8, device=device, generator=g)
    labels = torch.randint(0, cfg["classes"], (N_BATCHES * B,), device=device, generator=g)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255
    perm = rows(B, reorder)
    losses_m = AverageMeter()
    running = torch.zeros((), device=device)
    state = {"k": 0}

    def ema_update(decay=0.9998):
        ema_p = [v for v in ema.state_dict().values() if v.is_floating_point()]
        model_p = [v for v in model.state_dict().values() if v.is_floating_point()]
        torch._foreach_lerp_(ema_p, model_p, weight=1.0 - decay)

    def step():
        k = state["k"]
        i = (k % N_BATCHES) * B
        x, y = reordered(perm, images[i:i + B], labels[i:i + B])
        x = x.float().sub_(mean).div_(std)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        mark()
        with torch.autocast(device.type, dtype=dtype):
            output = forward(x)
            loss = F.cross_entropy(output, y, label_smoothing=0.1)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if fix == "host_sync":
            running.add_(loss.detach())
            if (k + 1) % LOG_INTERVAL == 0:
                losses_m.update(running.item() / LOG_INTERVAL, B)
                running.zero_()
        else:
            losses_m.update(loss.item(), x.size(0))
        opt.zero_grad()
        ema_update()
        state["k"] += 1
        return loss.detach()

    step.model = model
    return step
