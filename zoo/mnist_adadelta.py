"""PyTorch's MNIST example (pytorch/examples, mnist/main.py, `train()`) with its defaults: the example's Net (two
3x3 convolutions of 32 and 64 channels, max pool, fc 9216 -> 128 -> 10, log_softmax), batch 64, fp32,
Adadelta with lr 1.0 (torch.optim has no fused Adadelta) and StepLR per epoch. The batches come from a
DataLoader with the example's CUDA settings (`num_workers=1, pin_memory=True`) over 28x28 uint8 images that each
sample converts and normalizes as `ToTensor()` and `Normalize((0.1307,), (0.3081,))` do; each batch is copied
with `data.to(device)`. Every 10th batch the loop prints `loss.item()`. Dropout (0.25, 0.5) is left out: the
zoo's correctness check compares parameters, and a compiled variant draws other masks."""
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Sampler

from _common import GRAPHS_FIX, reduce_overhead, reordered, rng, rows, setup

FIXES = {
    "input_bound": "DataLoader(num_workers=4, pin_memory=True, persistent_workers=True) over the same batches",
    "launch_bound": GRAPHS_FIX,
    "host_sync": "the loss read back (.item()) for the log every 100 batches instead of every 10, and the batch "
                 "copied with non_blocking=True from the loader's pinned memory (the verdict's fix names both)",
}

SIZES = {"tiny": dict(batch=8, images=512, workers=1), "full": dict(batch=64, images=60_000, workers=1)}
LOG_INTERVAL = 10


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv2(F.relu(self.conv1(x))))
        x = torch.flatten(F.max_pool2d(x, 2), 1)
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


class Digits(Dataset):
    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        img = torch.from_numpy(self.images[i]).float().div(255).unsqueeze(0)       # ToTensor
        return (img - 0.1307) / 0.3081, int(self.labels[i])                          # Normalize


class Shuffled(Sampler):
    """shuffle=True, with batch k's indices drawn from a generator of k's own: every variant sees the same batches."""

    def __init__(self, n, batch, seed):
        self.n, self.batch, self.seed = n, batch, seed

    def __iter__(self):
        k = 0
        while True:
            yield rng(self.seed, k).choice(self.n, self.batch, replace=False).tolist()
            k += 1


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    model = Net().to(device)
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    forward, mark = reduce_overhead(model, device) if fix == "launch_bound" else (model, lambda: None)
    r = np.random.default_rng(seed)
    data = Digits(r.integers(0, 256, (cfg["images"], 28, 28), dtype=np.uint8), r.integers(0, 10, cfg["images"]))
    workers = max(1, min(4, (os.cpu_count() or 2) - 1)) if fix == "input_bound" else cfg["workers"]
    loader = DataLoader(data, batch_sampler=Shuffled(len(data), cfg["batch"], seed), num_workers=workers,
                        pin_memory=device.type == "cuda", persistent_workers=fix == "input_bound")
    batches = iter(loader)
    perm = rows(cfg["batch"], reorder)
    log_every = 100 if fix == "host_sync" else LOG_INTERVAL
    state = {"batch_idx": 0}

    def step():
        data, target = next(batches)
        copy = fix == "host_sync"
        data, target = data.to(device, non_blocking=copy), target.to(device, non_blocking=copy)
        data, target = reordered(perm, data, target)
        opt.zero_grad()
        mark()
        output = forward(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        opt.step()
        if state["batch_idx"] % log_every == 0:
            state["log"] = f"Train Epoch: 1 [{state['batch_idx'] * len(data)}]\tLoss: {loss.item():.6f}"
        state["batch_idx"] += 1
        return loss.detach()

    def close():
        batches._shutdown_workers()

    step.model = model
    step.close = close
    return step
