"""How much memory a training step takes, and the largest batch that fits. Notebooks 06, 07, 09, 10, 13.

- `saved_for_backward`: the bytes autograd keeps between forward and backward (works on the CPU).
- `predicted_memory`, `predicted_batch`: the back-of-envelope before anything runs, and the batch it
  says fits half the free memory.
- `memory_budget`, `training_peak`, `fits_budget`, `largest_batch`: the memory of a step, and the
  largest batch that fits a budget, found by measuring (never by filling the whole GPU).
- `count_flops` (PyTorch's FlopCounterMode) and `fit_batch` (a batch that fits a memory budget,
  extrapolated from two small measured steps).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator
import torch
from torch import nn
from gpulab.core.memory import release, track_peak, usable_memory
from gpulab.models.step import train_step
from gpulab.models.transformer import make_batch, param_bytes


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
                     half: bool = True, optimizer_bytes: int = 0) -> tuple[int, int]:
    """Back-of-envelope bytes (kept for backward, peak of a step) when checkpointing every k blocks. Notebook 09.

    Per element of (batch, seq, width): a block keeps 36 bytes under 16-bit autocast (64 in fp32);
    a checkpointed segment keeps only its fp32 input (4); final LayerNorm, head and loss keep 10 (12).
    The peak adds one segment rebuilt during backward, and per parameter the fp32 weight,
    its gradient and, under autocast, its 16-bit copy: 10 bytes (8 in fp32). Under (non-reentrant)
    checkpointing a checkpointed block's products save nothing for backward, so its 16-bit weight copies
    go when autocast exits and are made again as backward recomputes the block: 8 bytes per parameter
    are held, plus the 16-bit copies of the k blocks being rebuilt (2 x k/n_blocks per parameter: the
    blocks hold nearly all of the parameters).

    `optimizer_bytes`: the optimizer's state per parameter, held between steps and so through the
    backward of every step after the first: 8 for Adam and AdamW (two fp32 moments), 4 for SGD with
    momentum, 0 (the default) for a step without the update, which is what notebooks 09 and 10 and
    `gpulab bench` measure and size their batches by (lessons 09 and 10 and gpulab bench call this
    function; with the default their figures do not change).
    """
    if optimizer_bytes < 0:
        raise ValueError(f"optimizer_bytes must be >= 0 (got {optimizer_bytes}).")
    per_block, head, per_param = (36, 10, 10) if half else (64, 12, 8)
    elements = batch * seq * width
    if k == 0:
        kept, rebuilt = n_blocks * per_block * elements, 0
    else:
        kept, rebuilt = -(-n_blocks // k) * 4 * elements, min(k, n_blocks) * per_block * elements
        if half:            # 16-bit weight copies only for the blocks being rebuilt
            per_param = 8 + 2 * min(k, n_blocks) / n_blocks
    kept += head * elements
    return kept, int(kept + rebuilt + (per_param + optimizer_bytes) * params)


def predicted_batch(n_blocks: int, batch: int, seq: int, width: int, params: int, half: bool = True,
                    times: int = 1, fraction: float = 0.5, device: torch.device | None = None) -> int:
    """`batch`, halved until the predicted peak of a step on `times` x batch samples (`predicted_memory`,
    no checkpointing) fits `fraction` of the GPU's free memory now; `batch` unchanged on the CPU.
    Notebooks 09 and 10 (and gpulab bench) size their GPU runs with it before anything is allocated."""
    free = usable_memory(device)
    if free is None:
        return batch
    while batch > 1 and predicted_memory(n_blocks, batch * times, seq, width, params, 0, half)[1] > fraction * free[0]:
        batch //= 2
    return batch


def memory_budget(cap: int, fraction: float = 0.5, device: torch.device | None = None) -> int | None:
    """min(cap, fraction x the memory this process can use now (`usable_memory`)), in bytes; None on the CPU.
    Notebooks 09 and 10."""
    free = usable_memory(device)
    return None if free is None else int(min(cap, fraction * free[0]))


def training_peak(model: nn.Module, batch: int, dtype: torch.dtype | None = None) -> int | None:
    """Peak bytes of one training step: weights + batch + activations + gradients (None on the CPU). Notebook 09."""
    model.zero_grad(set_to_none=True)
    with track_peak(next(model.parameters()).device) as mem:
        x, y = make_batch(model, batch)
        train_step(model, x, y, precision=dtype)
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


def count_flops(fn: Callable[[], object]) -> int:
    """Floating-point operations of `fn()` (e.g. a forward and backward pass), counted by PyTorch's
    FlopCounterMode: matrix products, convolutions and attention, 2 per multiply-add. Notebook 06."""
    from torch.utils.flop_counter import FlopCounterMode

    with uncompiled(), FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


def uncompiled():
    """A context in which torch.compile'd code runs eagerly (`torch.compiler.set_stance("force_eager")`),
    for running a step under a dispatch mode (FlopCounterMode, a dtype spy). Without it, Dynamo meets the
    active mode, gives the compiled frame up, and runs it eagerly from then on: a compiled model that one
    FLOP-counting step touched stayed eager for the rest of the run (torch 2.11 on the H200, torch 2.13
    on the CPU; tests/diagnose/test_core.py holds it). A no-op context where set_stance does not exist."""
    import contextlib
    stance = getattr(torch.compiler, "set_stance", None)
    return stance("force_eager") if stance is not None else contextlib.nullcontext()


def fit_batch(peak_at: Callable[[int], int | None], wanted: int, budget: int | None, probe: int = 4) -> int:
    """The batch to run: `wanted`, halved until the peak memory, extrapolated in a straight line
    from two measured small batches (`probe` and 2 x `probe`), fits `budget` bytes. Notebook 06.

    `peak_at(b)` runs one training step at batch b and returns its peak bytes (None on the CPU,
    where `wanted` is returned unchanged). Costs two small steps, never a large trial.
    """
    if budget is None:
        return wanted
    small, large = peak_at(probe), peak_at(2 * probe)
    if small is None or large is None:
        return wanted
    per_sample = max(large - small, 1) / probe
    fixed = small - probe * per_sample
    batch = wanted
    while batch > 1 and fixed + batch * per_sample > budget:
        batch //= 2
    return batch
