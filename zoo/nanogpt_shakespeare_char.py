"""nanoGPT's training loop (karpathy/nanoGPT, train.py) at its shakespeare_char size: a character GPT (6 layers,
6 heads, 384 wide, 256 tokens, vocab 65, batch 64) under torch.compile (train.py's default), fused AdamW with
nanoGPT's two parameter groups (decay on the matrices only), bf16 autocast, a GradScaler that is on only for
fp16, the learning rate set by hand every iteration (warm-up, then cosine), gradients clipped to 1.0 after
`scaler.unscale_`. `get_batch` slices the uint16 token array (nanoGPT's np.memmap of train.bin) at random
offsets, stacks the slices as int64 and copies them pinned and non_blocking; as in train.py the next batch
is fetched right after the forward. Every 10th iteration the loop reads `loss.item()` and estimates MFU
from the host clock for its log line. Dropout (0.2 in that config) is left out: the zoo's correctness check
compares parameters, and a compiled variant draws other masks."""
import logging
import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from _common import compile_backend, half_dtype, reordered, rng, rows, setup
from _transformers import GPT

FIXES = {
    "launch_bound": 'torch.compile(model, mode="reduce-overhead") instead of the default mode (CUDA graphs), '
                    "torch.compiler.cudagraph_mark_step_begin() before each step (CPU: the plain compile)",
    "input_bound": "the same batches made by a DataLoader (item k is batch k) with 2 workers and pinned memory",
    "host_sync": "the loss read back (.item()) for the log every 100 iterations instead of every 10",
}
log = logging.getLogger(__name__)

SIZES = {"tiny": dict(vocab=65, layers=2, heads=2, width=32, seq=32, batch=4, tokens=20_000, accum=1),
         "full": dict(vocab=65, layers=6, heads=6, width=384, seq=256, batch=64, tokens=1_000_000, accum=1)}
LR, MIN_LR, WARMUP, DECAY_ITERS = 1e-3, 1e-4, 100, 5000
LOG_INTERVAL = 10


def get_lr(it):
    if it < WARMUP:
        return LR * (it + 1) / (WARMUP + 1)
    ratio = min((it - WARMUP) / (DECAY_ITERS - WARMUP), 1.0)
    return MIN_LR + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (LR - MIN_LR)


def slices(data, r, batch, seq):
    ix = r.integers(0, len(data) - seq - 1, batch)
    x = torch.stack([torch.from_numpy(data[i:i + seq].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + seq].astype(np.int64)) for i in ix])
    return x, y


class Batches(Dataset):
    def __init__(self, data, seed, batch, seq):
        self.data, self.seed, self.batch, self.seq = data, seed, batch, seq

    def __len__(self):
        return 1 << 30

    def __getitem__(self, k):
        return slices(self.data, rng(self.seed, k), self.batch, self.seq)


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    B, T, accum = cfg["batch"], cfg["seq"], cfg["accum"]
    data = np.random.default_rng(seed).integers(0, cfg["vocab"], cfg["tokens"], dtype=np.uint16)
    model = GPT(cfg["vocab"], cfg["layers"], cfg["heads"], cfg["width"], T, device=device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(0.9, 0.99), fused=device.type == "cuda")
    cuda = device.type == "cuda"
    mode = "reduce-overhead" if fix == "launch_bound" and cuda else None
    compiled = torch.compile(model, backend=compile_backend(device), mode=mode)
    dtype = half_dtype(device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    perm = rows(B, reorder)
    it = None
    if fix == "input_bound":
        it = iter(DataLoader(Batches(data, seed, B, T), batch_size=None, num_workers=2, pin_memory=cuda,
                             persistent_workers=True, prefetch_factor=4))
    log_every = 100 if fix == "host_sync" else LOG_INTERVAL
    state = {"k": 0, "micro": 0, "t0": time.time(), "mfu": -1.0}

    def get_batch():
        if it is not None:
            x, y = next(it)
        else:
            x, y = slices(data, rng(seed, state["micro"]), B, T)
        state["micro"] += 1
        if cuda:
            x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return reordered(perm, x, y)

    X, Y = get_batch()

    def step():
        nonlocal X, Y
        k = state["k"]
        for group in opt.param_groups:
            group["lr"] = get_lr(k)
        for _ in range(accum):
            if mode:
                torch.compiler.cudagraph_mark_step_begin()
            with torch.autocast(device.type, dtype=dtype):
                logits = compiled(X)
                loss = F.cross_entropy(logits.view(-1, logits.size(-1)), Y.reshape(-1)) / accum
            X, Y = get_batch()
            scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        t1 = time.time()
        dt, state["t0"] = t1 - state["t0"], t1
        if k % log_every == 0:
            lossf = loss.item() * accum
            flops = 6 * sum(p.numel() for p in model.parameters()) * B * T * accum
            mfu = flops / max(dt, 1e-9) / 312e12        # nanoGPT's estimate_mfu divides by the A100's bf16 peak
            state["mfu"] = mfu if state["mfu"] < 0 else 0.9 * state["mfu"] + 0.1 * mfu
            log.info("iter %d: loss %.4f, time %.2fms, mfu %.2f%%", k, lossf, dt * 1000, state["mfu"] * 100)
        state["k"] += 1
        return loss.detach()

    def close():
        if it is not None:
            it._shutdown_workers()

    step.model = model
    step.close = close
    return step
