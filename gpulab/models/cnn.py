"""The convolutional networks the lessons train, and their synthetic images.

- `SmallCNN`, `conv_flops`: lesson 03's small conv stack, light enough that the input pipeline shows.
- `ResNetish` (ResNet-50's layer shapes at full size) and `image_batches` (learnable synthetic images):
  lessons 06, 07 and the capstone.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SmallCNN(torch.nn.Module):
    """A plain conv stack for `size` x `size` RGB images: `blocks` stages of two 3x3 convolutions
    with BatchNorm and ReLU, each stage doubling the channels and halving the resolution
    (after the first); global average pool; a linear head."""

    def __init__(self, width: int = 32, blocks: int = 4, classes: int = 10, device: torch.device | None = None):
        super().__init__()
        nn = torch.nn
        layers, c_in = [], 3
        for i in range(blocks):
            c_out = width * 2**i
            for j in range(2):
                stride = 2 if i > 0 and j == 0 else 1
                layers += [nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False, device=device),
                           nn.BatchNorm2d(c_out, device=device), nn.ReLU(inplace=True)]
                c_in = c_out
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(c_in, classes, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(self.features(x), 1)
        return self.head(torch.flatten(x, 1))


def conv_flops(model: SmallCNN, batch: int, size: int) -> int:
    """Multiply-add FLOPs (2 per MAC) of the convolutions of one forward pass of `batch` images."""
    total, s = 0, size
    for m in model.features:
        if isinstance(m, torch.nn.Conv2d):
            s = (s + 2 - 3) // m.stride[0] + 1
            total += 2 * batch * s * s * m.out_channels * m.in_channels * 9
    return total


# -- lessons 06 and 07: a ResNet-style CNN and a small GPT language model ------------------------
# ResNet-50's configuration (lessons 06, 07 and the capstone): `ResNetish(depths, width, classes, image)`
# and the batch to train it at. Full: ResNet-50's layer shapes (25.6 M parameters) on 224 x 224 images,
# 1000 classes, batch 128. Tiny: one block per stage, width 8, 32 x 32 images, 10 classes, batch 16.
RESNET50 = {
    "tiny": dict(depths=(1, 1, 1, 1), width=8, classes=10, image=32, batch=16),
    "full": dict(depths=(3, 4, 6, 3), width=64, classes=1000, image=224, batch=128),
}


class Bottleneck(nn.Module):
    """ResNet's bottleneck block: 1x1 reduce, 3x3 (carries the stride), 1x1 expand x4, each with
    BatchNorm; a projection shortcut where the shape changes. Notebook 06."""

    expansion = 4

    def __init__(self, c_in: int, planes: int, stride: int = 1, device: torch.device | None = None):
        super().__init__()
        c_out = planes * self.expansion
        self.conv1 = nn.Conv2d(c_in, planes, 1, bias=False, device=device)
        self.bn1 = nn.BatchNorm2d(planes, device=device)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False, device=device)
        self.bn2 = nn.BatchNorm2d(planes, device=device)
        self.conv3 = nn.Conv2d(planes, c_out, 1, bias=False, device=device)
        self.bn3 = nn.BatchNorm2d(c_out, device=device)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False, device=device),
                                          nn.BatchNorm2d(c_out, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        return F.relu(self.bn3(self.conv3(out)) + self.shortcut(x))


class ResNetish(nn.Module):
    """A bottleneck ResNet for images of `image` x `image` pixels. Notebook 06; reused in 07.

    With depths=(3, 4, 6, 3), width=64 and 1000 classes it has the layer shapes and the
    parameter count (25.6 M) of ResNet-50 v1.5 (stride on the 3x3 convolution). It is
    gpulab's own code, not torchvision's model: same arithmetic, not the same implementation.
    Stem: 7x7 convolution with stride 2 and a 3x3 max-pool with stride 2; four stages, the
    last three halving the resolution; global average pool; a linear head.
    """

    def __init__(self, depths: tuple[int, ...] = (3, 4, 6, 3), width: int = 64, classes: int = 1000,
                 image: int = 224, device: torch.device | None = None):
        super().__init__()
        self.depths, self.width, self.classes, self.image = tuple(depths), width, classes, image
        self.stem = nn.Sequential(nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False, device=device),
                                  nn.BatchNorm2d(width, device=device), nn.ReLU(),
                                  nn.MaxPool2d(3, stride=2, padding=1))
        blocks, c_in = [], width
        for i, depth in enumerate(depths):
            planes = width * 2**i
            for j in range(depth):
                blocks.append(Bottleneck(c_in, planes, stride=2 if i > 0 and j == 0 else 1, device=device))
                c_in = planes * Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(c_in, classes, device=device)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def image_batches(model: ResNetish, batch: int, count: int = 4, seed: int = 0, size: int | None = None,
                  channels_last: bool = False) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`count` batches of synthetic images (batch, 3, size, size) and class labels, made on the model's device.

    Learnable on purpose, so loss curves fall: each class has a fixed random 8x8 colour pattern,
    enlarged to the image size; an image is its class's pattern plus as much Gaussian noise.
    The patterns depend only on `seed`, so batches of other sizes belong to the same task.
    Notebook 06.
    """
    device = next(model.parameters()).device
    size = size or model.image
    g = torch.Generator(device=device).manual_seed(seed)
    patterns = torch.randn(model.classes, 3, 8, 8, generator=g, device=device)
    out = []
    for _ in range(count):
        labels = torch.randint(0, model.classes, (batch,), generator=g, device=device)
        x = F.interpolate(patterns[labels], size=(size, size), mode="nearest")
        x = x + torch.randn(x.shape, generator=g, device=device)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        out.append((x, labels))
    return out
