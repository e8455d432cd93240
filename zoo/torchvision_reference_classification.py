"""torchvision's classification reference (pytorch/vision, references/classification/train.py, train_one_epoch)
with its defaults: batch 32 of 224x224 images, fp32 (`--amp` off: cuDNN's default TF32 for the convolutions),
SGD with momentum 0.9 and weight decay 1e-4 (the default multi-tensor kernels), the learning rate stepped per
epoch. The model is the zoo's Bottleneck ResNet with 2 blocks per stage (a ResNet-26) in place of torchvision's
resnet18, in the default NCHW layout. The batches come from pinned host memory, as a DataLoader with
pin_memory=True hands them out, and are copied with `image.to(device)`: blocking. After each step the loop
computes top-1 and top-5 accuracy (`utils.accuracy`: topk, eq, sums) and feeds its MetricLogger `loss.item()`,
`acc1.item()` and `acc5.item()`, and images per second from the host clock."""
import time

import torch
import torch.nn.functional as F

from _common import GRAPHS_FIX, half_dtype, reduce_overhead, reordered, rows, setup
from _convnets import resnet50

FIXES = {
    "host_sync": "the batch copied with non_blocking=True and the meters fed the tensors, read every 10 steps "
                 "(print_freq)",
    "fp32_matmuls": "--amp: the forward and loss in fp16 autocast with a GradScaler",
    "optimizer_unfused": "torch.optim.SGD(..., fused=True)",
    "launch_bound": GRAPHS_FIX,
    "copy_not_overlapped": "the next batch copied on a side stream (non_blocking, wait_stream, record_stream) while "
                           "this one trains",
    "layout_transposes": "model.to(memory_format=torch.channels_last) and each batch converted likewise on the GPU",
}

SIZES = {"tiny": dict(width=8, depths=(1, 1, 1, 1), image=32, classes=10, batch=8),
         "full": dict(width=64, depths=(2, 2, 2, 2), image=224, classes=1000, batch=32)}
N_BATCHES = 4
PRINT_FREQ = 10


def accuracy(output, target, topk=(1,)):
    with torch.inference_mode():
        maxk = max(topk)
        batch_size = target.size(0)
        _, pred = output.topk(maxk, 1, True, True)
        pred = pred.t()
        correct = pred.eq(target[None])
        return [correct[:k].flatten().sum(dtype=torch.float32) * (100.0 / batch_size) for k in topk]


class SmoothedValue:
    def __init__(self):
        self.total, self.count = 0.0, 0

    def update(self, value, n=1):
        self.count += n
        self.total += value * n


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    cuda = device.type == "cuda"
    model = resnet50(cfg["classes"], cfg["width"], cfg["depths"], device=device)
    if fix == "layout_transposes":
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4,
                          fused=True if fix == "optimizer_unfused" else None)
    amp = fix == "fp32_matmuls"
    half = half_dtype(device)
    dtype = torch.float16 if cuda and half != torch.float32 else half      # fp16 on CUDA: the reference code's autocast default
    scaler = torch.amp.GradScaler(device.type, enabled=amp and dtype == torch.float16)
    forward, mark = reduce_overhead(model, device) if fix == "launch_bound" else (model, lambda: None)

    B, S = cfg["batch"], cfg["image"]
    g = torch.Generator().manual_seed(seed)
    batches = [(torch.randn(B, 3, S, S, generator=g), torch.randint(0, cfg["classes"], (B,), generator=g))
               for _ in range(N_BATCHES)]
    if cuda:
        batches = [(x.pin_memory(), y.pin_memory()) for x, y in batches]
    perm = rows(B, reorder)
    meters = {name: SmoothedValue() for name in ("loss", "acc1", "acc5", "img/s")}
    sums = torch.zeros(3, device=device)
    side = torch.cuda.Stream() if cuda and fix == "copy_not_overlapped" else None
    state = {"k": 0, "next": None}

    def copy(k):
        x, y = batches[k % N_BATCHES]
        if side is None:
            return x.to(device, non_blocking=fix == "host_sync"), y.to(device, non_blocking=fix == "host_sync")
        with torch.cuda.stream(side):
            return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    def step():
        k = state["k"]
        start_time = time.time()
        if side is not None:
            image, target = state["next"] or copy(k)
            torch.cuda.current_stream().wait_stream(side)
            image.record_stream(torch.cuda.current_stream())
            target.record_stream(torch.cuda.current_stream())
            state["next"] = copy(k + 1)
        else:
            image, target = copy(k)
        image, target = reordered(perm, image, target)
        if fix == "layout_transposes":
            image = image.contiguous(memory_format=torch.channels_last)
        mark()
        with torch.autocast(device.type, dtype=dtype, enabled=amp):
            output = forward(image)
            loss = F.cross_entropy(output, target)
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        acc1, acc5 = accuracy(output, target, topk=(1, 5))
        batch_size = image.shape[0]
        if fix == "host_sync":
            sums.add_(torch.stack([loss.detach(), acc1, acc5]))
            if (k + 1) % PRINT_FREQ == 0:
                for name, value in zip(("loss", "acc1", "acc5"), (sums / PRINT_FREQ).tolist()):
                    meters[name].update(value, n=batch_size)
                sums.zero_()
        else:
            meters["loss"].update(loss.item())
            meters["acc1"].update(acc1.item(), n=batch_size)
            meters["acc5"].update(acc5.item(), n=batch_size)
        meters["img/s"].update(batch_size / max(time.time() - start_time, 1e-9))
        state["k"] += 1
        return loss.detach()

    step.model = model
    return step
