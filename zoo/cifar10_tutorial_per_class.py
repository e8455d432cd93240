"""The CIFAR-10 classifier of PyTorch's beginner tutorial (pytorch/tutorials, beginner_source/blitz/cifar10_tutorial.py):
its Net (conv 3->6 5x5, max pool, conv 6->16 5x5, fc 400 -> 120 -> 84 -> 10), CrossEntropyLoss, SGD with lr 0.001
and momentum 0.9, fp32, on the GPU as its "Training on GPU" section moves it, with the training loop's
`running_loss += loss.item()`. The tutorial counts accuracy per class after training, one image at a time
(`for label, prediction in zip(labels, predictions): if label == prediction: correct_pred[classes[label]] += 1`);
here that loop runs on every training batch, as people add it to watch each class's training accuracy: each
`label == prediction` and each `classes[label]` reads a value back from the GPU, twice per image. Batch 128 of
32x32 images, already on the GPU."""
import torch
import torch.nn as nn
import torch.nn.functional as F

from _common import GRAPHS_FIX, reduce_overhead, reordered, rows, setup

FIXES = {
    "host_sync": "the counts kept on the GPU (index_add_ of ones, and of the correct ones, into 10 bins: no "
                 "torch.bincount, which reads its input's max back on a GPU, and no boolean mask, whose size is read "
                 "back) and the running loss summed there, both read every 100 steps",
    "launch_bound": GRAPHS_FIX,
    "optimizer_unfused": "torch.optim.SGD(..., fused=True)",
    "host_code": "the per-class counting loop run over Python ints, the labels and predictions read back once per "
                 "step (.tolist()), not over the GPU tensors image by image",
}

SIZES = {"tiny": dict(batch=8), "full": dict(batch=128)}
CLASSES = ("plane", "car", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
N_BATCHES = 8


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = torch.flatten(x, 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    B = SIZES[scale]["batch"]
    net = Net().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.001, momentum=0.9,
                                fused=True if fix == "optimizer_unfused" else None)
    forward, mark = reduce_overhead(net, device) if fix == "launch_bound" else (net, lambda: None)
    g = torch.Generator(device=device).manual_seed(seed)
    images = torch.randn(N_BATCHES * B, 3, 32, 32, device=device, generator=g)
    targets = torch.randint(0, 10, (N_BATCHES * B,), device=device, generator=g)
    perm = rows(B, reorder)
    correct_pred = {name: 0 for name in CLASSES}
    total_pred = {name: 0 for name in CLASSES}
    counts = torch.zeros(2, 10, dtype=torch.long, device=device)
    state = {"i": 0, "running_loss": torch.zeros((), device=device) if fix == "host_sync" else 0.0}

    def step():
        i = state["i"]
        j = (i % N_BATCHES) * B
        inputs, labels = reordered(perm, images[j:j + B], targets[j:j + B])
        optimizer.zero_grad()
        mark()
        outputs = forward(inputs)
        loss = F.cross_entropy(outputs, labels)
        loss.backward()
        optimizer.step()
        _, predictions = torch.max(outputs.detach(), 1)
        if fix == "host_sync":
            state["running_loss"] += loss.detach()
            counts[0].index_add_(0, labels, torch.ones_like(labels))
            counts[1].index_add_(0, labels, (predictions == labels).long())
            if (i + 1) % 100 == 0:
                state["per_class"] = (counts[1] / counts[0].clamp(min=1)).tolist()
                state["loss"] = state["running_loss"].item() / 100
                state["running_loss"].zero_()
        else:
            state["running_loss"] += loss.item()
            # the host_code fix: also one read-back per step in place of one per image (host_sync's ground too)
            pairs = zip(labels.tolist(), predictions.tolist()) if fix == "host_code" else zip(labels, predictions)
            for label, prediction in pairs:
                if label == prediction:
                    correct_pred[CLASSES[label]] += 1
                total_pred[CLASSES[label]] += 1
        state["i"] += 1
        return loss.detach()

    step.model = net
    return step
