"""minGPT's Trainer (karpathy/minGPT, mingpt/trainer.py) running projects/chargpt: a character GPT at minGPT's
'gpt-mini' size (6 layers, 6 heads, 192 wide, 128 tokens, batch 64) with minGPT's hand-written attention
(scores, causal mask, softmax, @ v), trained in fp32 with AdamW as `configure_optimizers` builds it (two
parameter groups, the default multi-tensor kernels, not fused). The batches come from a DataLoader over a
CharDataset (each item maps 129 characters through a dict, as `CharDataset.__getitem__` does) with 4
workers and pinned memory, and each is copied with `[t.to(self.device) for t in batch]`: a blocking copy,
so the host waits for the GPU to finish the previous step. Gradients are clipped to 1.0; the chargpt
callback prints `trainer.loss.item()` every 10 iterations with `iter_dt` from the host clock."""
import logging
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, Sampler

from _common import GRAPHS_FIX, half_dtype, reduce_overhead, reordered, rng, rows, setup
from _transformers import GPT

FIXES = {
    "launch_bound": GRAPHS_FIX,
    "optimizer_unfused": "torch.optim.AdamW(optim_groups, ..., fused=True)",
    "host_sync": "the batch copied with .to(device, non_blocking=True) and the loss read every 100 iterations",
    "attention_math": "F.scaled_dot_product_attention(..., is_causal=True) in the attention (attention='sdpa')",
    "fp32_matmuls": "the forward and loss (CharGPT's forward(idx, targets)) in bf16 autocast",
}

log = logging.getLogger(__name__)

SIZES = {"tiny": dict(layers=2, heads=2, width=32, seq=32, batch=4, chars=20_000, workers=2),
         "full": dict(layers=6, heads=6, width=192, seq=128, batch=64, chars=1_000_000, workers=4)}
ALPHABET = [chr(c) for c in range(32, 97)]          # 65 characters, the size of tiny Shakespeare's


class CharDataset(Dataset):
    def __init__(self, text, block_size):
        self.stoi = {ch: i for i, ch in enumerate(ALPHABET)}
        self.text, self.block_size = text, block_size

    def __len__(self):
        return len(self.text) - self.block_size

    def __getitem__(self, idx):
        chunk = self.text[idx:idx + self.block_size + 1]
        dix = [self.stoi[s] for s in chunk]
        return torch.tensor(dix[:-1], dtype=torch.long), torch.tensor(dix[1:], dtype=torch.long)


class Batches(Sampler):
    """minGPT samples with replacement (RandomSampler(replacement=True)); here batch k's indices come from a
    generator of k's own, so every variant of the step sees the same batches."""

    def __init__(self, n, batch, seed):
        self.n, self.batch, self.seed = n, batch, seed

    def __iter__(self):
        k = 0
        while True:
            yield rng(self.seed, k).integers(0, self.n, self.batch).tolist()
            k += 1


class CharGPT(torch.nn.Module):
    """minGPT's forward(idx, targets) -> (logits, loss)."""

    def __init__(self, gpt):
        super().__init__()
        self.gpt = gpt

    def forward(self, idx, targets):
        logits = self.gpt(idx)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    B, T = cfg["batch"], cfg["seq"]
    attention = "sdpa" if fix == "attention_math" else "manual"
    model = CharGPT(GPT(len(ALPHABET), cfg["layers"], cfg["heads"], cfg["width"], T, attention=attention,
                        device=device))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=5e-4, betas=(0.9, 0.95), fused=True if fix == "optimizer_unfused" else None)
    forward, mark = reduce_overhead(model, device) if fix == "launch_bound" else (model, lambda: None)
    text = "".join(np.random.default_rng(seed).choice(ALPHABET, cfg["chars"]))
    data = CharDataset(text, T)
    loader = DataLoader(data, batch_sampler=Batches(len(data), B, seed), pin_memory=device.type == "cuda",
                        num_workers=cfg["workers"])
    data_iter = iter(loader)
    perm = rows(B, reorder)
    log_every = 100 if fix == "host_sync" else 10
    dtype = half_dtype(device)
    state = {"iter_num": 0, "iter_time": time.time(), "iter_dt": 0.0}

    def step():
        batch = next(data_iter)
        batch = [t.to(device, non_blocking=fix == "host_sync") for t in batch]
        x, y = reordered(perm, *batch)
        mark()
        with torch.autocast(device.type, dtype=dtype, enabled=fix == "fp32_matmuls"):
            logits, loss = forward(x, y)
        model.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if state["iter_num"] % log_every == 0:           # chargpt's batch_end_callback
            log.info("iter_dt %.2fms; iter %d: train loss %.5f", state["iter_dt"] * 1000, state["iter_num"],
                     loss.item())
        state["iter_num"] += 1
        tnow = time.time()
        state["iter_dt"], state["iter_time"] = tnow - state["iter_time"], tnow
        return loss.detach()

    def close():
        data_iter._shutdown_workers()

    step.model = model
    step.close = close
    return step
