"""Correct before fast, for notebook 13's runs: does a run with some toggles train the same model as its fp32
reference, from the same weights on the same batches?

A run keeps a `Sample` of itself: for at most SAMPLE entries of every parameter tensor, always at the same
positions (`sample_positions`), the starting weights, the gradients of its first update and the weights after
k updates (k = the lesson's LOSS_STEPS). An update GradScaler skips (fp16's scale starts at 2^16 and halves on
an overflow, by design) is tried again on its batch until it is applied, and counted: both runs then made k
updates on the same k batches. A reference run keeps its noise floors too. Four comparisons, each a `Part`
that says its numbers, and fails with them:

- `losses`: the k losses against the reference's, within a relative tolerance. It sees a run gone wrong, not
  a dropped gradient: zeroing every FP8 weight gradient of the tiny GPT moved its loss by 0.2 % on the CPU
  (test_l13_capstone.py::test_zeroing_every_fp8_weight_gradient_hardly_moves_the_loss).
- `movement` (every run): how far the k updates moved each tensor, over how far they moved it in the reference,
  within [1 / MOVE_MAX, MOVE_MAX]. AdamW moves every weight by about its learning rate per update whatever the
  size and rounding of its gradient (its update is m / sqrt(v)), so 16-bit rounding, which changes a gradient's
  direction, hardly changes how far a tensor moves: 0.85 to 1.29 times as far as fp32 (bf16; the tiny GPT and
  CNN and 4x wider ones, CPU, torch 2.13). A dropped gradient, or an update skipped for one layer, leaves a
  tensor where weight decay alone takes it: under 1 % as far.
- `systems` (the systems tier: channels_last, aligned, fused, loader, compile, cuda_graphs, checkpointing,
  accumulation): the run's systems toggles on the fp32 reference, in fp32, where no 16-bit rounding can hide a
  difference. Its parameters after k updates against the noise floor of the reference with its batch rows
  reordered, and where that alone does not pass, of itself reordered too (`gpulab.models.same.compare`'s
  distances), within SYSTEMS_MAX times the floor.
- `numerics` (the numerics tier: tf32, amp, fp8): the gradients of the first update, tensor by tensor, against
  the reference's from the same weights on the same batch, within NUMERICS_MAX times the reference's own
  rounding to the run's coarsest format: how far the reference's gradients move when its own step is computed
  in that format (`runner.format_gradients`: its weights rounded to it, `round_weights`, and its products
  and activations too, under autocast or TF32's math mode), or one rounding of the format where that is
  larger. Gradients, not parameters after k updates: after three AdamW updates 16-bit rounding alone moved
  some tensors by most of their movement (81 % of a GPT bias's, 94 % of a CNN BatchNorm weight's), which is
  what a dropped gradient does; one update's gradients differ by the format's rounding.

The floor rounds the activations as the run does, not only the weights: a gradient that is a sum with
cancellation (a BatchNorm bias's, a convolution's before BatchNorm) is a small difference of large terms, and
the rounding of the activations inside it counts: fp16 autocast moved the tiny CNN's blocks.3.bn3.bias
gradient by 5.2 % of its size, where rounding the weights alone moved it by 0.5 % (CPU, torch 2.13), and a
floor of the weights alone failed correct fp16 runs. The floor is the reference model's own step in
`train_step`, with no optimizer and no GradScaler, so what the check tests is what the run's toggles change
around the format: the loss scaling and unscaling, the FP8 layers, the systems toggles under 16 bits. Where the
rounding alone changes a tensor's gradient by 1 / NUMERICS_MAX of its size or more (most tensors of the tiny CNN
in bf16), the numerics allowance reaches the whole gradient: that comparison cannot see a dropped gradient
there, and says which tensors; the movement comparison still can.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
from torch import nn

from gpulab.models import precision as P
from gpulab.models.same import FLOOR_MAX, SAME_ABS, compare, distance

SAMPLE = 4096          # entries kept per parameter tensor (all of a smaller one); a distance over 4096 random
                       # entries estimates the whole tensor's within about 1 % where the difference is spread
MOVE_MAX = 2.0         # each tensor moves between half and twice as far as in the reference (see above)
# The systems tier's allowance over the noise floor. Reordering a batch's rows reorders the sums over the batch;
# a toggle that reorders the sums inside every product (channels_last's convolution kernels) moves three AdamW
# updates further: 7x the reference's floor for the tiny CNN on two threads, 8x the larger of the reference's
# and its own for a smaller CNN on one thread (CPU, torch 2.13), where gpulab.models.same (SAME_MAX_FLOOR)
# allows 4. A dropped gradient lands far above: one LayerNorm weight of the tiny GPT, 350 times the floor.
SYSTEMS_MAX = 16.0
# The numerics tier's allowance over the reference's own rounding (its own step computed in the format). Per
# tensor, correct runs' gradients were 1.00 to 1.23 times as far from fp32's as the floor's (bf16 and fp16, alone
# and with aligned, fused, checkpointing, accumulation, compile run eagerly, channels_last: the same rounding,
# the sums in another order), FP8's 1.45 to 1.61 (its e4m3 and e5m2 products are the run's alone; the tiny GPT
# and CNN and 4x wider ones, CPU, torch 2.13, one and two threads). 8 leaves room for the kernels a GPU picks
# for a toggle (channels_last's convolutions, compiled code that keeps fused intermediates in fp32) and for
# atomic adds in backward kernels.
NUMERICS_MAX = 8.0
BLIND = 1.0            # an allowance this share of a gradient or more cannot tell it from a dropped one (1.0 off)
ROWS_SEED = 12345      # the fixed permutation of each batch's rows that measures the noise floor
FLOOR_SCALE = 2.0**16  # fp16's floor multiplies its loss by this first, as GradScaler's scale starts
UNIT_ROUNDOFF = {"tf32": 2.0**-11, "fp16": 2.0**-11, "bf16": 2.0**-8, "fp8": 2.0**-4}   # half an ulp, relative
FORMATS = tuple(UNIT_ROUNDOFF)


# -- what a run keeps ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sample:
    """A run's parameters and gradients at SAMPLE fixed positions per tensor (fp32, on the host): `p0` before
    any update, `g1` the first applied update's gradients, `pk` after k updates. A reference run keeps its
    floors: `reordered`, its `pk` with each batch's rows reordered; `rounded[fmt]`, its `g1` computed in fmt
    (`runner.format_gradients`). NumPy arrays, not tensors: host numbers kept for the comparisons, on every device (a
    memory check that counts the CPU's tensors, standing in for a GPU's memory, leaves them out)."""

    p0: list[np.ndarray]
    g1: list[np.ndarray]
    pk: list[np.ndarray]
    reordered: list[np.ndarray] | None = None
    rounded: dict[str, list[np.ndarray]] = field(default_factory=dict)


Positions = list[tuple[np.ndarray, np.ndarray]]     # (rows, columns) per tensor: `sample_positions`


def sample_positions(shapes: Sequence[Sequence[int]], n: int = SAMPLE, seed: int = 0) -> Positions:
    """(rows, columns) of the entries `take` keeps of tensors of `shapes` (the unpadded model's: a padded
    vocabulary's extra rows are never taken): every entry of a tensor of at most n, else n drawn at random
    (with a fixed seed, so every run of a job keeps the same ones). Columns index a row flattened."""
    rng = np.random.default_rng(seed)
    out = []
    for shape in shapes:
        rows = int(shape[0]) if len(shape) else 1
        cols = math.prod(int(s) for s in shape[1:]) if len(shape) > 1 else 1
        if rows * cols <= n:
            out.append((np.repeat(np.arange(rows), cols), np.tile(np.arange(cols), rows)))
        else:
            out.append((rng.integers(rows, size=n), rng.integers(cols, size=n)))
    return out


def take(tensors: Sequence[torch.Tensor | None], positions: Positions) -> list[np.ndarray]:
    """The entries at `positions` of each tensor (a missing gradient reads as zeros), in fp32 on the host."""
    out = []
    for t, (r, c) in zip(tensors, positions):
        if t is None:
            out.append(np.zeros(len(r), dtype=np.float32))
            continue
        t = t.detach()
        m = t.reshape(1, 1) if t.dim() == 0 else t.reshape(t.shape[0], -1)
        picked = m[torch.from_numpy(r).to(t.device), torch.from_numpy(c).to(t.device)]
        out.append(picked.float().cpu().numpy().copy())         # a copy: the array must not keep a tensor alive
    return out


def _tensors(arrays: Sequence[np.ndarray]) -> list[torch.Tensor]:
    """Sampled arrays as tensors (no copy), for `gpulab.models.same`'s distances."""
    return [torch.from_numpy(a) for a in arrays]


def rows_order(n: int, chunks: int = 1) -> torch.Tensor:
    """The fixed permutation of n batch rows the noise floor trains on: within each of `chunks` equal
    micro-batches (a micro-batch keeps its rows: the CNN's BatchNorm normalizes each micro-batch by its own
    statistics, and rows moved between micro-batches would change the arithmetic, not only its order)."""
    g = torch.Generator().manual_seed(ROWS_SEED)
    return torch.cat([c[torch.randperm(len(c), generator=g)] for c in torch.arange(n).chunk(chunks)])


def tf32_round(x: torch.Tensor) -> torch.Tensor:
    """fp32 `x` rounded to TF32's 10 mantissa bits (to nearest, ties away from zero), still stored as fp32."""
    bits = x.detach().float().contiguous().view(torch.int32)
    return ((bits + 0x1000) & -0x2000).view(torch.float32)


def round_weights(model: nn.Module, fmt: str) -> None:
    """Round every parameter of `model` to `fmt` in place, as the run in that format first sees it: "tf32",
    "fp16", "bf16"; "fp8": the linear layers of `model.blocks` that FP8 takes to e4m3 with one scale per tensor
    (`precision.to_fp8`, as the fp8 toggle does), every other weight to bf16 (fp8 runs under bf16 autocast)."""
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {', '.join(FORMATS)} (got {fmt!r})")
    fp8 = set()
    if fmt == "fp8":
        fp8 = {id(m.weight) for m in getattr(model, "blocks", nn.Module()).modules()
               if type(m) is nn.Linear and P.fp8_linear_refusal(m) is None}
    with torch.no_grad():
        for p in model.parameters():
            if id(p) in fp8:
                x8, s = P.to_fp8(p)
                p.copy_(x8.float() * s)
            elif fmt == "tf32":
                p.copy_(tf32_round(p))
            else:
                p.copy_(p.to(torch.float16 if fmt == "fp16" else torch.bfloat16).float())


# -- the comparisons ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Part:
    """One comparison of a run with its reference: `used` is the measured value as a share of what is allowed
    (at most 1 passes; inf where a value is not finite), `why` the sentence with the numbers."""

    name: str           # "losses", "movement", "systems", "numerics"
    ok: bool
    used: float
    why: str


def losses(reference: Sequence[float], run: Sequence[float], tol: float, tol_why: str) -> Part:
    """The run's losses against the reference's, step by step, relatively: each within `tol`."""
    n = min(len(reference), len(run))
    if n == 0:
        raise ValueError("no losses to compare")
    worst = 0.0
    for b, c in zip(reference[:n], run[:n]):
        worst = max(worst, abs(c - b) / max(abs(b), 1e-12) if math.isfinite(b) and math.isfinite(c) else math.inf)
    ok = worst <= tol
    return Part("losses", ok, worst / tol, f"losses of {n} updates: largest relative difference {worst:.1e}, "
                f"{'within' if ok else 'MORE than'} {tol:.0e} ({tol_why})")


def movement(p0: list, reference: list, run: list, names: Sequence[str]) -> Part:
    """How far the updates moved each tensor, over how far they moved it in the reference: within
    [1 / MOVE_MAX, MOVE_MAX] (a tensor neither run moved reads 1)."""
    ratios = []
    for name, a, r, q in zip(names, _tensors(p0), _tensors(reference), _tensors(run)):
        ref, mine = distance([r], [a]), distance([q], [a])
        ratios.append((name, mine / ref if ref > 0 else 1.0 if mine == 0 else math.inf))
    worst = max(ratios, key=lambda nr: abs(math.log(nr[1])) if 0 < nr[1] < math.inf else math.inf)
    low, high = min(r for _, r in ratios), max(r for _, r in ratios)
    used = abs(math.log(worst[1])) / math.log(MOVE_MAX) if 0 < worst[1] < math.inf else math.inf
    ok = used <= 1.0
    why = (f"each tensor moved {low:.2f} to {high:.2f} times as far as in the reference, "
           + (f"within {1 / MOVE_MAX:g} to {MOVE_MAX:g}" if ok else
              f"{worst[0]} {worst[1]:.2g} times: OUTSIDE {1 / MOVE_MAX:g} to {MOVE_MAX:g} (a dropped gradient or a "
              "skipped update leaves a tensor where it was)"))
    return Part("movement", ok, used, why)


def systems(p0: list, reference: list, run: list, floors: list[tuple[list, list]], k: int, what: str) -> Part:
    """The run's parameters after k updates against the reference's, within SYSTEMS_MAX times the noise floor
    `floors` measure (a run against itself with its rows reordered): `gpulab.models.same.compare`'s distances
    and floor, judged at this tier's multiple."""
    v = compare(_tensors(p0), _tensors(reference), _tensors(run), [(_tensors(a), _tensors(b)) for a, b in floors], k,
                floor_is="each with its batch rows reordered", what=what)
    diff, floor = v["diff"], v["floor"]
    ok = math.isfinite(diff) and (diff <= SYSTEMS_MAX * floor or diff <= SAME_ABS) and floor < FLOOR_MAX
    used = (diff / (SYSTEMS_MAX * floor) if floor > 0 else 0.0 if diff <= SAME_ABS else math.inf)
    why = (f"after {k} updates {what} differs by {diff:.2e} of the parameters' movement from the reference's; noise "
           f"floor {floor:.2e} (each with its batch rows reordered); "
           + (f"the floor is {floor:.2g} of the movement itself: noise this large cannot tell two models apart"
              if floor >= FLOOR_MAX else f"{'within' if ok else 'MORE than'} {SYSTEMS_MAX:g}x the floor"))
    return Part("systems", ok, used if math.isfinite(diff) else math.inf, why)


def numerics(reference: list, run: list, floor: list, names: Sequence[str], fmt: str) -> Part:
    """The first update's gradients, tensor by tensor, against the reference's: each relative difference
    within NUMERICS_MAX times the larger of that tensor's floor (how far the reference's gradient moves when its
    own step is computed in `fmt`: `floor`, `runner.format_gradients`) and one rounding of `fmt` (its unit
    roundoff: no gradient computed in `fmt` is closer)."""
    u = UNIT_ROUNDOFF[fmt]
    rows, blind = [], []
    for name, r, q, f in zip(names, _tensors(reference), _tensors(run), _tensors(floor)):
        size, diff = distance([r], [torch.zeros_like(r)]), distance([q], [r])
        rel = diff / size if size > 0 else 0.0 if diff == 0 else math.inf
        allowed = NUMERICS_MAX * max(distance([f], [r]) / size if size > 0 else 0.0, u)
        rows.append((name, rel, allowed))
        if allowed >= BLIND:
            blind.append(name)
    name, diff, allowed = max(rows, key=lambda row: row[1] / row[2])
    used = diff / allowed
    ok = all(d <= a for _, d, a in rows) and math.isfinite(used)
    why = (f"first update's gradients against the reference's, tensor by tensor: {name} differs by {diff:.2e} of its "
           f"size, {'the closest to' if ok else 'MORE than'} its allowance {allowed:.2e} ({NUMERICS_MAX:g}x the "
           f"larger of the reference's own {fmt} rounding, its gradient with its own step computed in {fmt}, and one "
           f"{fmt} rounding, 2^{math.log2(u):.0f})")
    if blind:
        named = ", ".join(blind[:3]) + (", ..." if len(blind) > 3 else "")
        why += (f"; blind in {len(blind)} of {len(rows)} tensors ({named}): "
                f"there {fmt} rounding alone changes the gradient by 1/{NUMERICS_MAX:g} of its size or more, and a "
                "dropped gradient is left to the movement check")
    return Part("numerics", ok, used, why)


def skipped_text(skipped: Sequence[int], first_scale: float | None) -> str:
    """What GradScaler skipped, for a check's message: how many updates, at which of the k steps, from what scale."""
    if not skipped:
        return ""
    steps = sorted(set(skipped))
    where = ", ".join(f"step {s + 1}" + (f" {skipped.count(s)} times" if skipped.count(s) > 1 else "") for s in steps)
    scale = "" if first_scale is None else f" (its scale started at 2^{math.log2(first_scale):.0f} and halved at each)"
    return (f"GradScaler skipped {len(skipped)} update(s): {where}{scale}; each was tried again on its batch until "
            "applied, so both runs made the same updates on the same batches")
