"""Masked-autoencoder pre-training as MAE's loop runs it (facebookresearch/mae, engine_pretrain.py,
`train_one_epoch`, with models_mae.py's random masking and util/misc.py's NativeScalerWithGradNormCount): a ViT
encoder (6 layers, 384 wide, 6 heads, 16x16 patches of 224x224 images) sees a random quarter of the patches
(`torch.rand` noise, `argsort`, `gather`), a light decoder (2 layers, 256 wide) reconstructs the rest, and the
loss is the per-patch normalized pixel error on the masked patches. Batch 64 in fp16 autocast with a
GradScaler, AdamW (betas 0.9 and 0.95, the default multi-tensor kernels), the learning rate set every
iteration (half-cycle cosine after warm-up). Every step reads `loss_value = loss.item()`, checks
`math.isfinite(loss_value)`, and calls `torch.cuda.synchronize()` after the update, as engine_pretrain.py does.
The masking noise is drawn with each batch (a generator of the batch's own) and passed in, so every variant of
the step masks the same patches."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from _common import GRAPHS_FIX, half_dtype, reduce_overhead, reordered, rng, rows, setup
from _transformers import Block

FIXES = {
    "host_sync": "no torch.cuda.synchronize(); the loss checked with torch._assert_async(torch.isfinite(loss)) and "
                 "read for the log every 20 steps (print_freq)",
    "optimizer_unfused": "torch.optim.AdamW(..., fused=True) (GradScaler's inf check then runs inside its kernel)",
    "launch_bound": GRAPHS_FIX,
    "host_code": "the gradient norm (NativeScalerWithGradNormCount's, which no update uses) computed every 20 steps "
                 "(print_freq), not every step",
}

SIZES = {"tiny": dict(image=32, patch=8, width=32, depth=2, heads=2, dec_width=32, dec_depth=1, batch=4),
         "full": dict(image=224, patch=16, width=384, depth=6, heads=6, dec_width=256, dec_depth=2, batch=64)}
MASK_RATIO, BASE_LR, WARMUP, TOTAL = 0.75, 1.5e-4, 40, 800
N_BATCHES = 4


class MaskedAutoencoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        p, n = cfg["patch"], (cfg["image"] // cfg["patch"]) ** 2
        self.p, self.n = p, n
        self.patch_embed = nn.Conv2d(3, cfg["width"], p, stride=p)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg["width"]))
        self.pos_embed = nn.Parameter(torch.randn(1, n + 1, cfg["width"]) * 0.02)
        self.blocks = nn.ModuleList(Block(cfg["width"], cfg["heads"], max_len=n + 1) for _ in range(cfg["depth"]))
        self.norm = nn.LayerNorm(cfg["width"])
        self.decoder_embed = nn.Linear(cfg["width"], cfg["dec_width"])
        self.mask_token = nn.Parameter(torch.zeros(1, 1, cfg["dec_width"]))
        self.decoder_pos_embed = nn.Parameter(torch.randn(1, n + 1, cfg["dec_width"]) * 0.02)
        self.decoder_blocks = nn.ModuleList(Block(cfg["dec_width"], 4 if cfg["dec_width"] % 4 == 0 else 1,
                                                  max_len=n + 1) for _ in range(cfg["dec_depth"]))
        self.decoder_norm = nn.LayerNorm(cfg["dec_width"])
        self.decoder_pred = nn.Linear(cfg["dec_width"], p * p * 3)

    def patchify(self, imgs):
        n, p = imgs.shape[0], self.p
        h = w = imgs.shape[2] // p
        x = imgs.reshape(n, 3, h, p, w, p)
        return torch.einsum("nchpwq->nhwpqc", x).reshape(n, h * w, p * p * 3)

    def forward(self, imgs, noise):
        x = self.patch_embed(imgs).flatten(2).transpose(1, 2) + self.pos_embed[:, 1:, :]
        N, L, D = x.shape                                                    # random_masking
        len_keep = int(L * (1 - MASK_RATIO))
        ids_shuffle = torch.argsort(noise, dim=1)
        ids_restore = torch.argsort(ids_shuffle, dim=1)
        ids_keep = ids_shuffle[:, :len_keep]
        x = torch.gather(x, 1, ids_keep.unsqueeze(-1).repeat(1, 1, D))
        mask = torch.ones([N, L], device=x.device)
        mask[:, :len_keep] = 0
        mask = torch.gather(mask, 1, ids_restore)
        cls = (self.cls_token + self.pos_embed[:, :1, :]).expand(N, -1, -1)
        x = torch.cat((cls, x), dim=1)
        for blk in self.blocks:
            x = blk(x)
        x = self.decoder_embed(self.norm(x))                                 # forward_decoder
        mask_tokens = self.mask_token.repeat(N, ids_restore.shape[1] + 1 - x.shape[1], 1)
        x_ = torch.cat([x[:, 1:, :], mask_tokens], dim=1)
        x_ = torch.gather(x_, 1, ids_restore.unsqueeze(-1).repeat(1, 1, x.shape[2]))
        x = torch.cat([x[:, :1, :], x_], dim=1) + self.decoder_pos_embed
        for blk in self.decoder_blocks:
            x = blk(x)
        pred = self.decoder_pred(self.decoder_norm(x))[:, 1:, :]
        target = self.patchify(imgs)                                        # forward_loss, norm_pix_loss
        mean, var = target.mean(dim=-1, keepdim=True), target.var(dim=-1, keepdim=True)
        target = (target - mean) / (var + 1.0e-6) ** 0.5
        loss = ((pred.float() - target) ** 2).mean(dim=-1)
        return (loss * mask).sum() / mask.sum()


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    cuda = device.type == "cuda"
    model = MaskedAutoencoder(cfg).to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=BASE_LR, betas=(0.9, 0.95), fused=True if fix == "optimizer_unfused" else None)
    half = half_dtype(device)
    dtype = torch.float16 if cuda and half != torch.float32 else half         # fp16 on CUDA: the reference code's autocast default
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    forward, mark = reduce_overhead(model, device) if fix == "launch_bound" else (model, lambda: None)
    B, S = cfg["batch"], cfg["image"]
    g = torch.Generator(device=device).manual_seed(seed)
    images = torch.randn(N_BATCHES * B, 3, S, S, device=device, generator=g)
    perm = rows(B, reorder)
    state = {"k": 0, "running": torch.zeros((), device=device)}

    def step():
        k = state["k"]
        lr = BASE_LR * (k + 1) / WARMUP if k < WARMUP else \
            BASE_LR * 0.5 * (1.0 + math.cos(math.pi * (k - WARMUP) / (TOTAL - WARMUP)))
        for group in opt.param_groups:                                      # lr_sched.adjust_learning_rate
            group["lr"] = lr
        i = (k % N_BATCHES) * B
        g.manual_seed(int(rng(seed, k).integers(2**62)))
        noise = torch.rand(B, model.n, device=device, generator=g)
        samples, noise = reordered(perm, images[i:i + B], noise)
        mark()
        with torch.autocast(device.type, dtype=dtype):
            loss = forward(samples, noise)
        if fix == "host_sync":
            torch._assert_async(torch.isfinite(loss))
            state["running"] += loss.detach()
            if (k + 1) % 20 == 0:
                state["logged"] = state["running"].item() / 20
                state["running"].zero_()
        else:
            loss_value = loss.item()
            if not math.isfinite(loss_value):
                raise SystemExit(f"Loss is {loss_value}, stopping training")
        scaler.scale(loss).backward()                                       # loss_scaler(...)
        scaler.unscale_(opt)
        # the host_code fix; it also drops the norm's two small kernels per parameter (launches, not only Python)
        if fix != "host_code" or (k + 1) % 20 == 0:
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            state["norm"] = torch.norm(torch.stack([torch.norm(g_.detach(), 2.0) for g_ in grads]), 2.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        if fix != "host_sync" and cuda:
            torch.cuda.synchronize()
        state["k"] += 1
        return loss.detach()

    step.model = model
    return step
