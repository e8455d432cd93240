"""Co-teaching on noisy labels as its authors' code trains it (bhanML/Co-teaching, main.py `train()` and loss.py
`loss_coteaching`): two CNNs (the repository's 9-conv CNN: 128/256/512 channels, BatchNorm, LeakyReLU) each
trained on the samples the other finds easiest. Per step both losses are computed per sample, read back to the
host and sorted there with numpy (`np.argsort(loss_1.data.cpu()).cuda()`), the smallest 80 % kept, and the
"pure ratio" (how many kept samples have clean labels) counted with numpy from the dataset's `noise_or_not`
array, indexed by the kept indices read back again. Both models are also scored with top-1/top-5 accuracy.
CIFAR-sized images (batch 128, 20 % of the labels flipped), handed out as the repository's DataLoader does
(no pinned memory) and copied with `.cuda()`. Adam (lr 0.001) for each model, the default multi-tensor
kernels, fp32, NCHW. Dropout left out (the zoo's correctness check compares parameters)."""
import contextlib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from _common import GRAPHS_FIX, half_dtype, reduce_overhead, reordered, rng, rows, setup

FIXES = {
    "host_sync": "torch.argsort on the GPU; the pure ratio counted there (noise_or_not as a GPU tensor) and read "
                 "every 50 steps (print_freq)",
    "launch_bound": GRAPHS_FIX + " (both models)",
    "optimizer_unfused": "torch.optim.Adam(..., fused=True) for both models",
    "pageable_copy": "the DataLoader's pin_memory=True: batches pinned, copied with .cuda(non_blocking=True)",
    "fp32_matmuls": "the forwards, accuracies and losses of both models in bf16 autocast",
    "layout_transposes": "both models .to(memory_format=torch.channels_last) and each batch converted likewise "
                         "once on the GPU",
}

SIZES = {"tiny": dict(widths=(8, 8, 16), image=16, batch=8, samples=256),
         "full": dict(widths=(128, 256, 512), image=32, batch=128, samples=50_000)}
FORGET_RATE, NOISE_RATE, CLASSES, PRINT_FREQ = 0.2, 0.2, 10, 50
N_POOL = 1024           # distinct images (the labels, their noise and the indexes are the dataset's 50,000)


def cnn(widths):
    a, b, c = widths
    layers, cin = [], 3
    for i, cout in enumerate((a, a, a, b, b, b, c, b, a)):
        k, pad = (3, 1) if i < 6 else (3, 0) if i == 6 else (1, 0)
        layers += [nn.Conv2d(cin, cout, k, padding=pad), nn.BatchNorm2d(cout), nn.LeakyReLU(0.01)]
        cin = cout
        if i in (2, 5):
            layers.append(nn.MaxPool2d(2, 2))
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(a, CLASSES))


def accuracy(logit, target, topk=(1,)):
    output = F.softmax(logit, dim=1)
    _, pred = output.topk(max(topk), 1, True, True)
    correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
    return [correct[:k].reshape(-1).float().sum(0, keepdim=True).mul_(100.0 / target.size(0)) for k in topk]


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    cuda = device.type == "cuda"
    models = nn.ModuleList([cnn(cfg["widths"]), cnn(cfg["widths"])]).to(device)
    if fix == "layout_transposes":
        models = models.to(memory_format=torch.channels_last)
    # the fp32_matmuls fix: bf16 autocast; as written, no autocast context at all (its labels are committed)
    sixteen_bit = (lambda: torch.autocast(device.type, dtype=half_dtype(device))) if fix == "fp32_matmuls" \
        else contextlib.nullcontext
    fused = True if fix == "optimizer_unfused" else None
    opts = [torch.optim.Adam(m.parameters(), lr=0.001, fused=fused) for m in models]
    if fix == "launch_bound":
        compiled = [reduce_overhead(m, device) for m in models]
        forwards, mark = [c for c, _ in compiled], compiled[0][1]
    else:
        forwards, mark = list(models), (lambda: None)
    B, S, N = cfg["batch"], cfg["image"], cfg["samples"]
    r = np.random.default_rng(seed)
    true_labels = r.integers(0, CLASSES, N)
    flip = r.random(N) < NOISE_RATE
    labels_all = np.where(flip, (true_labels + r.integers(1, CLASSES, N)) % CLASSES, true_labels)
    noise_or_not = labels_all == true_labels
    noise_gpu = torch.from_numpy(noise_or_not).to(device)
    perm = rows(B, reorder)
    pin = fix == "pageable_copy" and cuda
    state = {"i": 0, "ratios": [], "pure": torch.zeros(2, device=device), "correct": torch.zeros(2, device=device)}

    pool = torch.from_numpy(r.standard_normal((N_POOL, 3, S, S), dtype=np.float32))    # the images, pageable

    def batch(k):
        indexes = rng(seed, k).choice(N, B, replace=False)
        images = pool[torch.from_numpy(indexes % N_POOL)]          # the DataLoader's collated batch
        return images, torch.from_numpy(labels_all[indexes]), torch.from_numpy(indexes)

    def step():
        images, labels, indexes = batch(state["i"])
        images, labels, indexes = reordered(perm, images, labels, indexes)
        ind = indexes.cpu().numpy().transpose()
        if pin:
            images, labels = images.pin_memory().cuda(non_blocking=True), labels.pin_memory().cuda(non_blocking=True)
        else:
            images, labels = images.to(device), labels.to(device)
        if fix == "layout_transposes":
            images = images.contiguous(memory_format=torch.channels_last)
        mark()
        with sixteen_bit():
            logits1 = forwards[0](images)
            prec1, _ = accuracy(logits1, labels, topk=(1, 5))
            logits2 = forwards[1](images)
            prec2, _ = accuracy(logits2, labels, topk=(1, 5))
            state["correct"] += torch.cat([prec1, prec2])
            loss_1 = F.cross_entropy(logits1, labels, reduction="none")      # loss_coteaching
            loss_2 = F.cross_entropy(logits2, labels, reduction="none")
        num_remember = int((1 - FORGET_RATE) * len(loss_1))
        if fix == "host_sync":
            ind_1_sorted, ind_2_sorted = torch.argsort(loss_1.detach()), torch.argsort(loss_2.detach())
            ind_gpu = indexes.to(device)
            state["pure"] += torch.stack([noise_gpu[ind_gpu[ind_1_sorted[:num_remember]]].sum(),
                                          noise_gpu[ind_gpu[ind_2_sorted[:num_remember]]].sum()]) / num_remember
            if (state["i"] + 1) % PRINT_FREQ == 0:
                state["ratios"].append((100 * state["pure"] / PRINT_FREQ).tolist())
                state["pure"].zero_()
        else:
            ind_1_sorted = torch.from_numpy(np.argsort(loss_1.data.cpu().numpy())).to(device)
            ind_2_sorted = torch.from_numpy(np.argsort(loss_2.data.cpu().numpy())).to(device)
            pure_ratio_1 = np.sum(noise_or_not[ind[ind_1_sorted[:num_remember].cpu().numpy()]]) / float(num_remember)
            pure_ratio_2 = np.sum(noise_or_not[ind[ind_2_sorted[:num_remember].cpu().numpy()]]) / float(num_remember)
            state["ratios"].append((100 * pure_ratio_1, 100 * pure_ratio_2))
        ind_1_update, ind_2_update = ind_1_sorted[:num_remember], ind_2_sorted[:num_remember]
        with sixteen_bit():
            loss_1_update = F.cross_entropy(logits1[ind_2_update], labels[ind_2_update])
            loss_2_update = F.cross_entropy(logits2[ind_1_update], labels[ind_1_update])
        for opt, loss in zip(opts, (loss_1_update, loss_2_update)):
            opt.zero_grad()
            loss.backward()
            opt.step()
        state["i"] += 1
        return loss_1_update.detach()

    step.model = models
    return step
