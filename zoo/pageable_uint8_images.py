"""A small CNN (four strided conv-BN-ReLU stages, bf16 autocast, SGD) trained on a dataset of uint8
images held in one big numpy array in host memory (4096 images of 3x224x224: about 600 MB). Each step
takes the next 256 images as a slice of the array, `torch.from_numpy(...).to(device)` from pageable
memory, and scales them to [0, 1] on the GPU. The model and images are in the default NCHW layout."""
import torch
from torch import nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from _common import GRAPHS_FIX, half_dtype, reduce_overhead, reordered, rng, rows, setup

FIXES = {
    "pageable_copy": "a pinned staging buffer allocated once: each batch is copied into it, then "
                     ".to(device, non_blocking=True) (an event keeps the next copy from overwriting it early)",
    "input_bound": "a DataLoader with 4 workers and pin_memory=True over the same array "
                   "(batch_size=None, item k is batch k)",
    "launch_bound": GRAPHS_FIX,
    "optimizer_unfused": "torch.optim.SGD(..., fused=True)",
    "layout_transposes": "model.to(memory_format=torch.channels_last) and each uint8 batch converted likewise on the "
                         "GPU, before it is scaled",
}

SIZES = {"tiny": dict(images=64, image=32, width=8, classes=10, batch=16, workers=2),
         "full": dict(images=4096, image=224, width=64, classes=1000, batch=256, workers=4)}


class Batches(Dataset):
    def __init__(self, images, batch):
        self.images, self.batch = images, batch

    def __len__(self):
        return 10**9

    def __getitem__(self, k):
        i = k % (len(self.images) // self.batch) * self.batch
        return torch.from_numpy(self.images[i:i + self.batch])


def conv_bn(cin, cout, kernel, stride):
    return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    w = cfg["width"]
    model = nn.Sequential(*conv_bn(3, w, 5, 4), *conv_bn(w, 2 * w, 3, 2), *conv_bn(2 * w, 4 * w, 3, 2),
                          *conv_bn(4 * w, 8 * w, 3, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8 * w, cfg["classes"])).to(device)
    if fix == "layout_transposes":
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9,
                          fused=True if fix == "optimizer_unfused" else None)
    dtype = half_dtype(device)

    N, B, S = cfg["images"], cfg["batch"], cfg["image"]
    data = rng(seed)
    images = data.integers(0, 256, (N, 3, S, S), dtype="uint8")
    labels = torch.from_numpy(data.integers(0, cfg["classes"], N)).to(device)
    cuda = device.type == "cuda"
    if fix == "pageable_copy" and cuda:
        staging = torch.empty((B, 3, S, S), dtype=torch.uint8, pin_memory=True)
        copied = torch.cuda.Event()
    loader = None
    if fix == "input_bound":
        loader = iter(DataLoader(Batches(images, B), batch_size=None, num_workers=cfg["workers"], pin_memory=cuda))
    perm = rows(B, reorder)
    k = 0

    forward, mark = reduce_overhead(model, device) if fix == "launch_bound" else (model, lambda: None)

    def step():
        nonlocal k
        i = k % (N // B) * B
        if fix == "pageable_copy" and cuda:
            copied.synchronize()              # the last batch has left the staging buffer
            staging.copy_(torch.from_numpy(images[i:i + B]))
            x = staging.to(device, non_blocking=True)
            copied.record()
        elif fix == "input_bound":
            x = next(loader).to(device, non_blocking=True)
        else:
            x = torch.from_numpy(images[i:i + B]).to(device)
        x, y = reordered(perm, x, labels[i:i + B])
        if fix == "layout_transposes":
            x = x.contiguous(memory_format=torch.channels_last)
        k += 1
        mark()
        with torch.autocast(device.type, dtype=dtype):
            loss = F.cross_entropy(forward(x.float() / 255), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    def close():
        nonlocal loader
        loader = None                         # shuts the workers down

    step.model = model
    step.close = close
    return step
