"""Lesson 13's two jobs: a ResNet-50-shaped CNN on images and a GPT language model (`gpulab.models.cnn` and
`gpulab.models.gpt`, lessons 06 and 07), trained with AdamW. `JOBS` says how to build each, its batches and its
loss; `job_config` gives its sizes at a scale. What their steps cost: `gpt_flops_per_token` (PaLM's formula),
`model_flops` (counted by FlopCounterMode), `state_bytes` (the fp32 training state), and `fit_model`, which
narrows the GPT until that state fits a budget."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from gpulab.core.device import pick_device, resolve_scale
from gpulab.lessons.capstone.knobs import CONFIG, STATE_SHARE
from gpulab.models import precision as P
from gpulab.models.cnn import ResNetish, image_batches
from gpulab.models.gpt import GPT, token_batches
from gpulab.models.sizing import count_flops


@dataclass(frozen=True)
class Job:
    """One training job: how to build its model and batches, its loss, and what its throughput counts."""

    name: str
    title: str
    unit: str                                            # "img/s" or "tokens/s"
    build: Callable[[dict, torch.device], nn.Module]
    batches: Callable[[nn.Module, int, int], list]       # (model, batch, count) -> [(x, y)] on its device
    loss_fn: P.LossFn
    items: Callable[[dict], int]                         # images or tokens in one sample


JOBS: dict[str, Job] = {
    "gpt": Job("gpt", "GPT language model", "tokens/s",
               lambda c, d: GPT(c["vocab"], c["n_blocks"], c["width"], c["heads"], c["seq"], device=d),
               lambda m, b, n: token_batches(m, b, count=n, seed=1), P.language_model_loss,
               lambda c: c["seq"]),
    "cnn": Job("cnn", "ResNet-50-shaped CNN", "img/s",
               lambda c, d: ResNetish(tuple(c["depths"]), c["width"], c["classes"], c["image"], device=d),
               lambda m, b, n: image_batches(m, b, count=n, seed=1), P.classification_loss,
               lambda c: 1),
}


def job_config(job: str, scale: str | None = None) -> dict[str, Any]:
    """A copy of `job`'s sizes at `scale` ("tiny" or "full"; None: the course's current scale), with its batch."""
    if job not in JOBS:
        raise ValueError(f"job must be one of {', '.join(JOBS)} (got {job!r}).")
    return dict(CONFIG[resolve_scale(scale)][job])


def gpt_flops_per_token(vocab: int, n_blocks: int, width: int, seq: int, **_: Any) -> dict[str, float]:
    """Back-of-envelope FLOPs of one token's forward and backward pass through the GPT (PaLM's MFU formula,
    Chowdhery et al. 2022, appendix B): 6 N for the N weights of the matrix products (each block's
    12 width^2, the head's width x vocab; embeddings are lookups, not products) plus 12 x blocks x seq x width
    for attention's two products, counted over the whole seq x seq matrix (the causal mask is not subtracted)."""
    n = n_blocks * 12 * width**2 + width * vocab
    weights = 6 * n
    attention = 12 * n_blocks * seq * width
    return {"N": n, "weights": weights, "attention": attention, "total": weights + attention}


_FLOPS: dict[tuple, float] = {}


def sizes_key(job: str, config: dict) -> tuple:
    return (job, tuple(sorted((k, tuple(v) if isinstance(v, (list, tuple)) else v)
                              for k, v in config.items() if k != "batch")))


def model_flops(job: str, config: dict, batch: int, device: torch.device | None = None) -> float:
    """FLOPs of one training step (forward, loss and backward) of `job` at `batch`, counted by PyTorch's
    FlopCounterMode (`gpulab.models.sizing.count_flops`: matrix products, convolutions and attention, causal
    attention counted in full) once per configuration, on a step of 2 samples, and scaled to `batch`.
    Counted on the unpadded model: padding the vocabulary adds arithmetic, not model FLOPs. On the CPU,
    attention is counted through its math path (its flash kernel there has no FLOP formula)."""
    device = device or pick_device()
    key = (*sizes_key(job, config), str(device))
    if key not in _FLOPS:
        spec, probe = JOBS[job], 2
        torch.manual_seed(0)
        model = spec.build(config, device)
        x, y = spec.batches(model, probe, 1)[0]
        with contextlib.ExitStack() as stack:
            if device.type == "cpu":
                # PyTorch's CPU flash-attention kernel has no FLOP formula; its math path is counted
                stack.enter_context(sdpa_kernel(SDPBackend.MATH))
            _FLOPS[key] = count_flops(lambda: spec.loss_fn(model, x, y).backward()) / probe
        del model, x, y
    return _FLOPS[key] * batch


def state_bytes(job: str, cfg: dict) -> int:
    """Bytes of `job`'s fp32 training state at sizes `cfg`: weights, gradients and AdamW's two moments,
    16 bytes a parameter (counted on the meta device: no memory)."""
    shapes = JOBS[job].build(cfg, torch.device("meta"))
    return 16 * sum(p.numel() for p in shapes.parameters())


def fit_model(job: str, cfg: dict, limit: int) -> tuple[dict, str]:
    """`cfg`, narrowed until `state_bytes` fits `limit` bytes: width (with heads) halved down to 1024,
    then blocks down to 2; jobs without those knobs (the CNN) are left as they are. Returns the sizes
    and what changed ("" if nothing)."""
    out, before = dict(cfg), state_bytes(job, cfg)
    while state_bytes(job, out) > limit:
        if "width" in out and "heads" in out and out["width"] > 1024:
            out["width"], out["heads"] = out["width"] // 2, max(1, out["heads"] // 2)
        elif "n_blocks" in out and out["n_blocks"] > 2:
            out["n_blocks"] //= 2
        else:
            break
    if out == cfg:
        return out, ""
    changed = ", ".join(f"{k} {cfg[k]} -> {out[k]}" for k in cfg if out[k] != cfg[k])
    return out, (f"{changed}: the fp32 training state {before / 1e9:.1f} GB -> {state_bytes(job, out) / 1e9:.1f} GB, "
                 f"at most {STATE_SHARE:.0%} of the budget ({limit / STATE_SHARE / 2**30:.1f} GiB)")
