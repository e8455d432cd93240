"""A text classifier fine-tuned the way Hugging Face's Trainer runs it (huggingface/transformers,
src/transformers/trainer.py, `_inner_training_loop` and `training_step`) with its defaults: a small BERT
(4 layers, 4 heads, 256 wide: bert-mini's size) in bf16 autocast (`bf16=True`), AdamW as `optim="adamw_torch"`
makes it (the multi-tensor kernels), the linear schedule with warm-up stepped every update, gradients clipped
to `max_grad_norm=1.0`, batch 32. Its DataCollatorWithPadding pads each batch to its own longest sentence
(reviews of log-normal length, median 60 tokens, up to 256), in the main process (`dataloader_num_workers=0`),
so nearly every batch has a new length. After every step the loop filters the loss for NaN and inf as the
Trainer does with `logging_nan_inf_filter=True`: `if torch.isnan(tr_loss_step) or torch.isinf(tr_loss_step)`,
two branches on values the GPU computed; it also adds `float(self.floating_point_ops(inputs))`."""
import os

import numpy as np
import torch
import torch.nn.functional as F

from _common import GRAPHS_FIX, half_dtype, reduce_overhead, reordered, rng, rows, setup
from _transformers import Encoder

FIXES = {
    "varying_shapes": "DataCollatorWithPadding(pad_to_multiple_of=64) (at most 4 lengths) and the model under "
                      'CUDA graphs: torch.compile(model, mode="reduce-overhead"), cudagraph_mark_step_begin() '
                      "(CPU: the plain compile)",
    "host_sync": "logging_nan_inf_filter=False: the loss added to tr_loss on the GPU, no branch on its value",
    "launch_bound": GRAPHS_FIX + "; the lengths left as they are",
    "optimizer_unfused": 'optim="adamw_torch_fused": AdamW(..., fused=True)',
    "input_bound": "dataloader_num_workers=4: the same batches collated by a DataLoader's workers, pinned",
}

SIZES = {"tiny": dict(vocab=1000, layers=2, heads=2, width=32, max_len=64, batch=4, median=20, multiple=16),
         "full": dict(vocab=30522, layers=4, heads=4, width=256, max_len=256, batch=32, median=60, multiple=64)}
PAD, CLS, SEP = 0, 101, 102
WARMUP, TOTAL = 100, 10_000


def features(seed, k, cfg):
    """Batch k's tokenized examples (what the Dataset hands the collator): lists of ids and a label each."""
    r = rng(seed, k)
    lengths = np.clip(r.lognormal(np.log(cfg["median"]), 0.6, cfg["batch"]).astype(int), 8, cfg["max_len"])
    return [{"input_ids": [CLS] + r.integers(SEP + 1, cfg["vocab"], n - 2).tolist() + [SEP],
             "label": int(r.integers(0, 2))} for n in lengths]


def collate(feats, multiple=None):
    """DataCollatorWithPadding: pad to the longest in the batch (to a multiple of `multiple` if given)."""
    longest = max(len(f["input_ids"]) for f in feats)
    if multiple:
        longest = -(-longest // multiple) * multiple
    ids = [f["input_ids"] + [PAD] * (longest - len(f["input_ids"])) for f in feats]
    mask = [[1] * len(f["input_ids"]) + [0] * (longest - len(f["input_ids"])) for f in feats]
    return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask),
            "labels": torch.tensor([f["label"] for f in feats])}


class Examples(torch.utils.data.Dataset):
    def __init__(self, seed, cfg):
        self.seed, self.cfg = seed, cfg

    def __len__(self):
        return 1 << 30

    def __getitem__(self, k):
        return collate(features(self.seed, k, self.cfg))


def make_step(fix=None, *, scale=None, device=None, seed=0, reorder=False):
    device, scale = setup(device, scale, seed)
    cfg = SIZES[scale]
    model = Encoder(cfg["vocab"], cfg["layers"], cfg["heads"], cfg["width"], cfg["max_len"], 2, pad_id=PAD,
                    device=device)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=5e-5, fused=True if fix == "optimizer_unfused" else None)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: s / WARMUP if s < WARMUP else max(0.0, (TOTAL - s) / (TOTAL - WARMUP)))
    graphs = fix in ("varying_shapes", "launch_bound")
    forward, mark = reduce_overhead(model, device) if graphs else (model, lambda: None)
    multiple = cfg["multiple"] if fix == "varying_shapes" else None
    dtype = half_dtype(device)
    perm = rows(cfg["batch"], reorder)
    loader = None
    if fix == "input_bound":
        workers = max(1, min(4, (os.cpu_count() or 2) - 1))
        loader = iter(torch.utils.data.DataLoader(Examples(seed, cfg), batch_size=None, num_workers=workers,
                                                  pin_memory=device.type == "cuda", persistent_workers=True))
    tr_loss = torch.zeros((), device=device)
    state = {"k": 0, "flos": 0.0, "last_logged": 0}

    def step():
        k = state["k"]
        inputs = next(loader) if loader is not None else collate(features(seed, k, cfg), multiple)
        inputs = {name: t.to(device) for name, t in inputs.items()}
        ids, labels = reordered(perm, inputs["input_ids"], inputs["labels"])
        mark()
        with torch.autocast(device.type, dtype=dtype):                 # training_step
            loss = F.cross_entropy(forward(ids), labels)
        loss.backward()
        tr_loss_step = loss.detach()
        if fix != "host_sync" and (torch.isnan(tr_loss_step) or torch.isinf(tr_loss_step)):
            tr_loss.add_(tr_loss / (1 + k - state["last_logged"]))
        else:
            tr_loss.add_(tr_loss_step)
        state["flos"] += float(6 * ids.numel() * sum(p.numel() for p in model.parameters()))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        model.zero_grad(set_to_none=True)
        state["k"] += 1
        return tr_loss_step

    def close():
        if loader is not None:
            loader._shutdown_workers()

    step.model = model
    step.close = close
    return step
