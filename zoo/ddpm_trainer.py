"""A denoising diffusion model trained the way lucidrains' Trainer does it (lucidrains/denoising-diffusion-pytorch,
denoising_diffusion_pytorch/denoising_diffusion_pytorch.py, `Trainer.train` and `GaussianDiffusion.p_losses`)
with its defaults: batch 16 of 64x64 images, fp32 (`amp=False`), Adam (lr 1e-4, betas 0.9 and 0.99, the
default multi-tensor kernels), the v-prediction objective with its SNR loss weight, gradients clipped to 1.0,
and an EMA of the weights (ema-pytorch: every 10th step, one `lerp_` per parameter in a Python loop). Each
step fetches `next(self.dl).to(device)` (a DataLoader with pinned memory: a blocking copy) and adds
`loss.item()` to `total_loss` for the progress bar, so the host waits for the GPU every step. The denoiser is
the zoo's UNet (3 levels, 64 channels) with the timestep as an extra input channel, in place of lucidrains'
Unet, in the default NCHW layout. The timesteps and the noise are drawn with each batch (a generator of the
batch's own), not inside the forward, so every variant of the step sees the same ones."""
import copy
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from _common import GRAPHS_FIX, half_dtype, reduce_overhead, reordered, rng, rows, setup
from _convnets import UNet

FIXES = {
    "host_sync": "the loss summed on the GPU and shown every 100 steps; the batch copied with non_blocking=True",
    "launch_bound": GRAPHS_FIX,
    "optimizer_unfused": "torch.optim.Adam(..., fused=True)",
    "fp32_matmuls": "amp: the forward and loss in bf16 autocast",
    "layout_transposes": "model.to(memory_format=torch.channels_last) and the batch and noise converted likewise (the "
                         "timestep channel concatenated, then the UNet's input converted)",
}

SIZES = {"tiny": dict(image=16, width=8, depth=2, batch=4, images=64),
         "full": dict(image=64, width=64, depth=3, batch=16, images=2048)}
TIMESTEPS = 1000


def cosine_alphas_cumprod(steps, s=0.008):
    t = torch.linspace(0, steps, steps + 1, dtype=torch.float64) / steps
    ac = torch.cos((t + s) / (1 + s) * math.pi * 0.5) ** 2
    ac = ac / ac[0]
    betas = torch.clip(1 - ac[1:] / ac[:-1], 0, 0.999)
    return torch.cumprod(1.0 - betas, dim=0).float()


class Images(Dataset):
    def __init__(self, images):
        self.images = images

    def __len__(self):
        return 1 << 30

    def __getitem__(self, k):
        return torch.from_numpy(self.images[k % len(self.images)]).float().div(255)


class Denoiser(torch.nn.Module):
    def __init__(self, width, depth, channels_last=False):
        super().__init__()
        self.unet = UNet(in_ch=4, classes=3, width=width, depth=depth)
        self.channels_last = channels_last

    def forward(self, x, t):
        tt = (t.float() / TIMESTEPS).view(-1, 1, 1, 1).expand(-1, 1, *x.shape[2:])
        h = torch.cat([x, tt], dim=1)
        if self.channels_last:                  # cat with the expanded timestep channel gives NCHW
            h = h.contiguous(memory_format=torch.channels_last)
        return self.unet(h)


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    channels_last = fix == "layout_transposes"
    model = Denoiser(cfg["width"], cfg["depth"], channels_last).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.99),
                           fused=True if fix == "optimizer_unfused" else None)
    ema = copy.deepcopy(model).requires_grad_(False)
    forward, mark = reduce_overhead(model, device) if fix == "launch_bound" else (model, lambda: None)
    amp = fix == "fp32_matmuls"
    dtype = half_dtype(device)
    ac = cosine_alphas_cumprod(TIMESTEPS).to(device)
    snr = ac / (1 - ac)
    loss_weight = snr / (snr + 1)                           # pred_v without min-SNR clipping
    B, S = cfg["batch"], cfg["image"]
    images = np.random.default_rng(seed).integers(0, 256, (cfg["images"], 3, S, S), dtype=np.uint8)
    dl = iter(DataLoader(Images(images), batch_size=B, shuffle=False, pin_memory=device.type == "cuda",
                         num_workers=2))
    perm = rows(B, reorder)
    g = torch.Generator(device=device)
    state = {"step": 0, "total": torch.zeros((), device=device)}

    def extract(a, t):
        return a.gather(-1, t).view(-1, 1, 1, 1)

    def step():
        k = state["step"]
        data = next(dl).to(device, non_blocking=fix == "host_sync")
        g.manual_seed(int(rng(seed, k).integers(2**62)))
        t = torch.randint(0, TIMESTEPS, (B,), device=device, generator=g)
        noise = torch.randn(data.shape, device=device, generator=g)
        data, t, noise = reordered(perm, data, t, noise)
        if channels_last:
            data, noise = (a.contiguous(memory_format=torch.channels_last) for a in (data, noise))
        mark()
        with torch.autocast(device.type, dtype=dtype, enabled=amp):
            x_start = data * 2 - 1                                                    # normalize
            x = extract(ac.sqrt(), t) * x_start + extract((1 - ac).sqrt(), t) * noise   # q_sample
            v = extract(ac.sqrt(), t) * noise - extract((1 - ac).sqrt(), t) * x_start
            model_out = forward(x, t)
            loss = F.mse_loss(model_out.float(), v, reduction="none").mean(dim=(1, 2, 3))
            loss = (loss * extract(loss_weight, t).view(-1)).mean()
        if fix == "host_sync":
            state["total"] += loss.detach()
            if (k + 1) % 100 == 0:
                state["shown"] = state["total"].item() / 100
                state["total"].zero_()
        else:
            total_loss = loss.item()                                                   # pbar.set_description
            state["shown"] = f"loss: {total_loss:.4f}"
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        state["step"] += 1
        if state["step"] % 10 == 0:                                                    # EMA(update_every=10)
            with torch.no_grad():
                for ema_p, p in zip(ema.parameters(), model.parameters()):
                    ema_p.lerp_(p, 1 - 0.995)
        return loss.detach()

    def close():
        dl._shutdown_workers()

    step.model = model
    step.close = close
    return step
