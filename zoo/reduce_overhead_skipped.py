"""A residual MLP regressor (6 blocks of 512, batch 64, 256 features) under
torch.compile(mode="reduce-overhead"), trained in bf16 autocast with fused AdamW on batches drawn on the
GPU. The step is small enough that launching its kernels costs more than running them, which is what
the CUDA graphs of reduce-overhead are for; but the forward standardizes its input in place
(`x.sub_(mean).div_(std)`), and inductor does not replay a graph that mutates an input it did not
allocate ("skipping cudagraphs due to mutated inputs"): the forward's kernels are launched one by one,
every step."""
import torch
from torch import nn
import torch.nn.functional as F

from _common import compile_backend, half_dtype, reordered, rng, rows, setup

FIXES = {
    "cudagraphs_skipped": "the input standardized out of place, x = (x - mean) / std, so the graphs are used",
}

SIZES = {"tiny": dict(features=16, width=32, depth=2, batch=8),
         "full": dict(features=256, width=512, depth=6, batch=64)}


class ResMLP(nn.Module):
    def __init__(self, features, width, depth, in_place=True):
        super().__init__()
        self.in_place = in_place
        self.register_buffer("mean", torch.linspace(-1, 1, features))     # the features' statistics
        self.register_buffer("std", torch.linspace(0.5, 2, features))
        self.inp = nn.Linear(features, width)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())
                                    for _ in range(depth))
        self.out = nn.Linear(width, 1)

    def forward(self, x):
        if self.in_place:
            x.sub_(self.mean).div_(self.std)
        else:
            x = (x - self.mean) / self.std
        h = self.inp(x)
        for block in self.blocks:
            h = h + block(h)
        return self.out(h).squeeze(-1)


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    B, D = cfg["batch"], cfg["features"]
    model = ResMLP(D, cfg["width"], cfg["depth"], in_place=fix != "cudagraphs_skipped").to(device)
    mode = "reduce-overhead" if device.type == "cuda" else None      # CUDA graphs exist only on a GPU
    compiled = torch.compile(model, backend=compile_backend(device), mode=mode)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    dtype = half_dtype(device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    g = torch.Generator(device=device)
    w = torch.randn(D, generator=torch.Generator().manual_seed(seed)).to(device)   # the target's weights
    perm = rows(B, reorder)
    k = 0

    def step():
        nonlocal k
        g.manual_seed(int(rng(seed, k).integers(2**62)))
        x = torch.randn(B, D, device=device, generator=g) * 2 + 0.5
        k += 1
        y = torch.tanh(x @ w / D ** 0.5)
        x, y = reordered(perm, x, y)
        with torch.autocast(device.type, dtype=dtype):
            loss = F.mse_loss(compiled(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    step.model = model
    return step
