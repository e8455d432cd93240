"""A small BERT-style encoder classifier (2 layers, 8 heads, 512 wide, vocab 30522, up to 512 tokens,
batch 32, 2 classes) under torch.compile with static shapes, trained in bf16 autocast with fused AdamW.
The sequences have lengths of their own (log-normal, like reviews) and each batch is padded to its
longest sequence, so nearly every batch has a new length: each new length compiles the model again,
until torch.compile's recompile limit is reached and the lengths it has not seen run eagerly.

Its compile_recompiles fix was the padding alone until 2026-12-07 (labels of 2026-12-06 and -07, b); the verdict
that fires here (compile_recompiles before launch_bound: a few shapes, then CUDA graphs) promises what the graphs buy
once the shapes are few, so the fix is now both (zoo/README.md, issue 41 item 5: a label is only as good as its
fix list)."""
import numpy as np
import torch
import torch.nn.functional as F

from _common import compile_backend, half_dtype, reordered, rng, rows, setup
from _transformers import Encoder

FIXES = {
    "compile_recompiles": "every batch padded to a multiple of 128 tokens, so the model sees at most 4 lengths, and "
                          'each length under CUDA graphs: torch.compile(model, dynamic=False, mode="reduce-overhead"), '
                          "torch.compiler.cudagraph_mark_step_begin() before each step (the verdict's whole fix: a "
                          "few shapes, then the graphs; CPU: the padding and the plain compile)",
    "launch_bound": 'torch.compile(model, dynamic=False, mode="reduce-overhead") (CUDA graphs, one per length), '
                    "torch.compiler.cudagraph_mark_step_begin() before each step; the lengths left as they are",
}

SIZES = {"tiny": dict(vocab=1000, layers=2, heads=2, width=64, max_len=64, batch=4, classes=2, median=20, bucket=16),
         "full": dict(vocab=30522, layers=2, heads=8, width=512, max_len=512, batch=32, classes=2, median=150,
                      bucket=128)}
PAD, CLS = 0, 101


def collate(seqs, length):
    ids = np.full((len(seqs), length), PAD, dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = s
    return torch.from_numpy(ids)


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    B, L = cfg["batch"], cfg["max_len"]
    model = Encoder(cfg["vocab"], cfg["layers"], cfg["heads"], cfg["width"], L, cfg["classes"],
                    pad_id=PAD, device=device)
    graphs = fix in ("launch_bound", "compile_recompiles") and device.type == "cuda"
    compiled = torch.compile(model, backend=compile_backend(device), dynamic=False,   # static shapes: fastest kernels
                             mode="reduce-overhead" if graphs else None)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.01, fused=True)
    dtype = half_dtype(device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    perm = rows(B, reorder)
    k = 0

    def step():
        nonlocal k
        r = rng(seed, k)
        lengths = np.clip(r.lognormal(np.log(cfg["median"]), 0.6, B).astype(int), 8, L)
        seqs = [np.concatenate([[CLS], r.integers(CLS + 1, cfg["vocab"], n - 1)]) for n in lengths]
        labels = torch.from_numpy(r.integers(0, cfg["classes"], B))
        k += 1
        longest = int(lengths.max())
        if fix == "compile_recompiles":
            longest = min(L, -(-longest // cfg["bucket"]) * cfg["bucket"])
        ids, labels = collate(seqs, longest).to(device), labels.to(device)
        ids, labels = reordered(perm, ids, labels)
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.autocast(device.type, dtype=dtype):
            loss = F.cross_entropy(compiled(ids), labels)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    step.model = model
    return step
