"""GPT-2 small (12 layers, 12 heads, 768 wide, 1024 tokens, vocab 50304, batch 8) trained in bf16 autocast
with fused AdamW on a synthetic tokenized corpus. Each batch is made by numpy in the training loop's own
thread: every row draws documents in proportion to their length (`rng.choice(..., p=p)` over the
million documents), joins them with an EOS token and keeps the first 1025 tokens; the int64 batch is
copied to the GPU with a plain `.to(device)`."""
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from _common import GRAPHS_FIX, half_dtype, reduce_overhead, reordered, rng, rows, setup
from _transformers import GPT

FIXES = {
    "input_bound": "the same batches made by a DataLoader (item k is batch k) with 4 workers, pinned memory, "
                   "copied with non_blocking=True",
    "pageable_copy": "each batch pinned in the main thread (.pin_memory()) and copied with non_blocking=True",
    "launch_bound": GRAPHS_FIX,
}

SIZES = {"tiny": dict(vocab=512, layers=2, heads=2, width=64, seq=64, batch=4, docs=5_000, doc_len=40),
         "full": dict(vocab=50304, layers=12, heads=12, width=768, seq=1024, batch=8, docs=1_000_000, doc_len=100)}


class Corpus:
    """A tokenized corpus: one big token array cut into documents of random lengths."""

    def __init__(self, vocab, docs, doc_len, seed):
        r = np.random.default_rng(seed)
        self.eos = min(vocab - 1, 50256)
        self.lens = r.geometric(1 / doc_len, docs)
        self.starts = np.concatenate([[0], np.cumsum(self.lens)[:-1]])
        self.tokens = r.integers(0, self.eos, self.lens.sum(), dtype=np.uint16)

    def get_batch(self, r, batch, seq):
        p = self.lens / self.lens.sum()          # every token equally likely: long documents more often
        out = np.empty((batch, seq + 1), dtype=np.int64)
        for i in range(batch):
            pieces, n = [], 0
            while n < seq + 1:
                for d in r.choice(len(self.lens), size=16, p=p):
                    pieces += [self.tokens[self.starts[d]:self.starts[d] + self.lens[d]], [self.eos]]
                    n += self.lens[d] + 1
            out[i] = np.concatenate(pieces)[:seq + 1]
        return out


class Batches(Dataset):
    def __init__(self, corpus, seed, batch, seq):
        self.corpus, self.seed, self.batch, self.seq = corpus, seed, batch, seq

    def __len__(self):
        return 1 << 30

    def __getitem__(self, k):
        return torch.from_numpy(self.corpus.get_batch(rng(self.seed, k), self.batch, self.seq))


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    B, T = cfg["batch"], cfg["seq"]
    model = GPT(cfg["vocab"], cfg["layers"], cfg["heads"], cfg["width"], T, device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, weight_decay=0.1, fused=True)
    dtype = half_dtype(device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    corpus = Corpus(cfg["vocab"], cfg["docs"], cfg["doc_len"], seed)
    perm = rows(B, reorder)
    loader = it = None
    if fix == "input_bound":
        loader = DataLoader(Batches(corpus, seed, B, T), batch_size=None,
                            num_workers=max(1, min(4, (os.cpu_count() or 2) - 1)),
                            pin_memory=device.type == "cuda", persistent_workers=True, prefetch_factor=4)
        it = iter(loader)
    k = 0

    forward, mark = reduce_overhead(model, device) if fix == "launch_bound" else (model, lambda: None)

    def step():
        nonlocal k
        if fix == "input_bound":
            batch = next(it).to(device, non_blocking=True)
        else:
            batch = torch.from_numpy(corpus.get_batch(rng(seed, k), B, T))
            if fix == "pageable_copy" and device.type == "cuda":
                batch = batch.pin_memory().to(device, non_blocking=True)
            else:
                batch = batch.to(device)
        k += 1
        x, y = reordered(perm, batch[:, :-1], batch[:, 1:])
        mark()
        with torch.autocast(device.type, dtype=dtype):
            logits = forward(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    def close():
        if it is not None:
            it._shutdown_workers()

    step.model = model
    step.close = close
    return step
