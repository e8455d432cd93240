"""Models and batches the lessons train. Introduced in notebook 09; reused from 10 on.

- `TransformerStack`: GPT-style blocks (pre-LayerNorm, causal SDPA attention, 4x GELU MLP)
  with activation checkpointing every k blocks as a switch (`checkpoint_every`).
- `make_batch`, `loss_fn`, `autocast`, `train_step`: a deterministic batch and one training step.
- `saved_for_backward`: the bytes autograd keeps between forward and backward (works on the CPU).
- `predicted_memory`: the back-of-envelope for the above, before anything runs.
- `memory_budget`, `training_peak`, `fits_budget`, `largest_batch`: the memory of a step, and the
  largest batch that fits a budget, found by measuring (never by filling the whole GPU).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from gpulab.memory import free_memory, release, track_peak


class Block(nn.Module):
    """One pre-LayerNorm GPT block: x + attention(LN(x)), then x + MLP(LN(x)). Notebook 09."""

    def __init__(self, width: int, heads: int, device: torch.device | None = None):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} is not a multiple of heads {heads}")
        self.heads = heads
        self.ln1 = nn.LayerNorm(width, device=device)
        self.qkv = nn.Linear(width, 3 * width, device=device)
        self.proj = nn.Linear(width, width, device=device)
        self.ln2 = nn.LayerNorm(width, device=device)
        self.fc = nn.Linear(width, 4 * width, device=device)
        self.out = nn.Linear(4 * width, width, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TransformerStack(nn.Module):
    """n_blocks GPT blocks, a final LayerNorm and a linear head; (batch, seq, width) in and out. Notebook 09.

    `checkpoint_every = k` groups the blocks into runs of k and checkpoints each run:
    only its input is kept for backward, its inside is recomputed then. k = 0: no checkpointing.
    """

    def __init__(self, n_blocks: int, width: int, heads: int, seq: int, checkpoint_every: int = 0,
                 device: torch.device | None = None):
        super().__init__()
        self.width, self.seq, self.checkpoint_every = width, seq, checkpoint_every
        self.blocks = nn.Sequential(*(Block(width, heads, device) for _ in range(n_blocks)))
        self.ln_f = nn.LayerNorm(width, device=device)
        self.head = nn.Linear(width, width, device=device)

    def run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """The blocks on x; with checkpoint_every = k > 0, each run of k blocks is one checkpointed segment."""
        k = self.checkpoint_every
        if k < 0:
            raise ValueError(f"checkpoint_every must be 0 (none) or a positive number of blocks (got {k}).")
        if k == 0:
            return self.blocks(x)            # every block keeps all its activations
        for start in range(0, len(self.blocks), k):
            segment = self.blocks[start:start + k]                 # k blocks (fewer at the end)
            x = checkpoint(segment, x, use_reentrant=False)        # keeps x; recomputes inside
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln_f(self.run_blocks(x)))


def param_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters. Notebook 09."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def make_batch(model: TransformerStack, batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Random embeddings (batch, seq, width) and, as target, each position's next embedding. Notebook 09."""
    device = next(model.parameters()).device
    g = torch.Generator(device=device).manual_seed(seed)
    tokens = torch.randn(batch, model.seq + 1, model.width, generator=g, device=device)
    return tokens[:, :-1], tokens[:, 1:]


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean squared error, computed in fp32. Notebook 09."""
    return F.mse_loss(out.float(), y)


def autocast(device: torch.device, dtype: torch.dtype | None):
    """`torch.amp.autocast` on `device` in `dtype`; plain fp32 (no autocast) when dtype is None. Notebook 09."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.amp.autocast(device.type, dtype=dtype)


def train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
               dtype: torch.dtype | None = None) -> torch.Tensor:
    """Forward, loss, backward; gradients land in .grad (earlier ones are dropped). Notebook 09."""
    model.zero_grad(set_to_none=True)
    with autocast(x.device, dtype):
        loss = loss_fn(model(x), y)
    loss.backward()
    return loss.detach()


@dataclass
class Saved:
    """Filled in by `saved_for_backward`: distinct storages autograd keeps, by address."""

    storages: dict[int, int] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())


@contextlib.contextmanager
def saved_for_backward(model: nn.Module) -> Iterator[Saved]:
    """Count the bytes autograd saves for backward inside the block, weights excluded. Notebook 09.

    Each storage is counted once (q, k and v are views of one tensor). Inside a
    checkpointed segment PyTorch's own hooks take over, so what a segment does not
    keep is not counted: this is what stays in memory between forward and backward.
    """
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = Saved()

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in weights:
            saved.storages[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield saved


def predicted_memory(n_blocks: int, batch: int, seq: int, width: int, params: int, k: int = 0,
                     half: bool = True) -> tuple[int, int]:
    """Back-of-envelope bytes (kept for backward, peak of a step) when checkpointing every k blocks. Notebook 09.

    Per element of (batch, seq, width): a block keeps 36 bytes under 16-bit autocast (64 in fp32);
    a checkpointed segment keeps only its fp32 input (4); final LayerNorm, head and loss keep 10 (12).
    The peak adds one segment rebuilt during backward, and per parameter the fp32 weight,
    its gradient and, under autocast, its 16-bit copy: 10 bytes (8 in fp32).
    """
    per_block, head, per_param = (36, 10, 10) if half else (64, 12, 8)
    elements = batch * seq * width
    if k == 0:
        kept, rebuilt = n_blocks * per_block * elements, 0
    else:
        kept, rebuilt = -(-n_blocks // k) * 4 * elements, min(k, n_blocks) * per_block * elements
    kept += head * elements
    return kept, kept + rebuilt + per_param * params


def memory_budget(cap: int, fraction: float = 0.5, device: torch.device | None = None) -> int | None:
    """min(cap, fraction x the GPU's free memory now), in bytes; None on the CPU. Notebook 09."""
    free = free_memory(device)
    return None if free is None else int(min(cap, fraction * free[0]))


def training_peak(model: nn.Module, batch: int, dtype: torch.dtype | None = None) -> int | None:
    """Peak bytes of one training step: weights + batch + activations + gradients (None on the CPU). Notebook 09."""
    model.zero_grad(set_to_none=True)
    with track_peak(next(model.parameters()).device) as mem:
        x, y = make_batch(model, batch)
        train_step(model, x, y, dtype)
        del x, y
        model.zero_grad(set_to_none=True)
    return None if mem.peak is None else param_bytes(model) + mem.peak_above_start


def fits_budget(model: nn.Module, batch: int, budget: int,
                dtype: torch.dtype | None = None) -> tuple[bool, int | None]:
    """(fits, peak bytes) of one step at `batch`; out of memory counts as not fitting. Notebook 09.

    On the CPU nothing can be measured: (False, None).
    """
    try:
        peak = training_peak(model, batch, dtype)
    except torch.OutOfMemoryError:
        peak = None               # the failed step's tensors are freed when the except block ends
    model.zero_grad(set_to_none=True)
    release()
    return peak is not None and peak <= budget, peak


def largest_batch(fits: Callable[[int], tuple[bool, int | None]], start: int = 1, limit: int = 1024,
                  resolution: int = 1, max_tries: int = 20) -> tuple[int, list[tuple[int, bool, int | None]]]:
    """Largest batch in [start, limit] that fits: double until one does not, then bisect. Notebook 09.

    Returns the batch (0 if even `start` does not fit) and every trial (batch, fits, peak).
    Doubling means a trial needs at most about twice the memory of one that fitted.
    """
    trials: list[tuple[int, bool, int | None]] = []

    def ok(b: int) -> bool:
        trials.append((b, *fits(b)))
        return trials[-1][1]

    if not ok(start):
        return 0, trials
    lo, hi = start, None
    while hi is None and lo < limit and len(trials) < max_tries:
        b = min(2 * lo, limit)
        lo, hi = (b, None) if ok(b) else (lo, b)
    while hi is not None and hi - lo > resolution and len(trials) < max_tries:
        mid = lo + (hi - lo) // 2 // resolution * resolution
        if mid == lo:
            break
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo, trials
