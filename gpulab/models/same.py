"""Does a faster step still train the same model? Parameters after K_UPDATES updates from the same weights on
the same batches, compared against a measured noise floor: the same step with its batch rows reordered (the
sums over the batch in another order), or its own 16-bit rounding. One home for the check that notebook 14's
DDP and FSDP2, the diagnosis's cases and zoo, notebook 15's chain and the graded exercises (`gpulab.exercises`)
all use.

    from gpulab.models.same import compare, parameters
    verdict = compare(p0, bad, fixed, floors=[(bad, bad_reordered)])
    verdict["ok"], verdict["why"]
"""
from __future__ import annotations

import math

import torch

# Correct before fast: the fixed step trains the same model as the bad one. Parameters after K_UPDATES
# updates from the same weights on the same batches; their distance, relative to how far the parameters
# moved, may be at most SAME_MAX_FLOOR times the noise floor: the larger of each step against itself with
# its batch rows in another order (the reductions over the batch in another order) and against itself in
# fp32 (`precision.fp32_only`: how far its 16-bit rounding alone moves the parameters). A fix that changes
# only the rounding passes; one that changes anything else fails. SAME_MAX_FLOOR is a judgement: two draws
# of rounding noise differ by a factor of about two. Below SAME_ABS two runs agree to fp32 precision.
K_UPDATES = 3
SAME_MAX_FLOOR = 4.0
SAME_ABS = 1e-6
# A noise floor as large as this share of the parameters' movement says nothing: the check then fails
# with that reason rather than pass everything.
FLOOR_MAX = 1.0


def parameters(model) -> list[torch.Tensor]:
    """A copy of a model's parameters, in fp32; a parameter sharded by FSDP2 (a DTensor) is gathered whole
    (a collective: every rank must call it)."""
    return [(p.full_tensor() if hasattr(p, "full_tensor") else p).detach().float().clone() for p in model.parameters()]


def distance(a: list, b: list) -> float:
    """|a - b| over two parameter lists; where a tensor differs in rows (a padded vocabulary), over the rows
    both have (the padding's rows lead nowhere the loss reads)."""
    total = 0.0
    for x, y in zip(a, b):
        if x.dim() and x.shape[0] != y.shape[0]:
            rows = min(x.shape[0], y.shape[0])
            x, y = x[:rows], y[:rows]
        total += float((x - y).double().square().sum())
    return math.sqrt(total)


def compare(p0: list, bad: list, fixed: list, floors: list[tuple[list, list]], k: int = K_UPDATES,
            floor_is: str = "its batch rows reordered, its 16-bit rounding", what: str = "the fixed step") -> dict:
    """The verdict of `same_model`'s comparison: `floors` are pairs of runs that differ only by noise (a
    step and itself reordered, a step and itself in fp32; `floor_is` says what they are, `what` what `fixed`
    is); `ok` when bad and
    fixed differ by at most SAME_MAX_FLOOR times the largest of them (or by under SAME_ABS), relative to how
    far bad moved from p0."""
    moved = distance(bad, p0)
    rel = lambda a, b: distance(a, b) / moved if moved > 0 else math.inf     # noqa: E731
    diff = rel(fixed, bad)
    floor = max((rel(a, b) for a, b in floors), default=0.0)
    ok = math.isfinite(diff) and (diff <= SAME_MAX_FLOOR * floor or diff <= SAME_ABS) and floor < FLOOR_MAX
    return {"diff": diff, "floor": floor, "ok": ok,
            "why": f"after {k} updates {what} differs by {diff:.2e} of the parameters' movement; noise floor "
                   f"{floor:.2e} ({floor_is}); "
                   + (f"the floor is {floor:.2g} of the movement itself: noise this large cannot tell two models "
                      "apart" if floor >= FLOOR_MAX else
                      f"{'within' if ok else 'MORE than'} {SAME_MAX_FLOOR:g}x the floor")}


# each tensor's movement against the reference's, where only the rounding differs: a factor of four either way, since
# with fp16 GradScaler may skip an update by design (one of three skipped leaves about half the movement under SGD with
# momentum 0.9), while a lost gradient leaves none
MOVEMENT_BAND = (0.25, 4.0)


def movement(p0: list, ref: list, new: list, band: tuple[float, float] = MOVEMENT_BAND) -> tuple[bool, str]:
    """Does every parameter tensor move about as far in `new` as in `ref` from the same start `p0` (between
    band[0] and band[1] times as far)? Not a noise floor: the check of a change of precision that a floor cannot
    give, since the 16-bit run against itself in fp32 is the very distance it would judge. A tensor whose gradient
    was flushed to zero stays where it was, one never unscaled moves about 2^16 times too far: both fail. A wrong
    gradient of about the right size passes. Tensors the reference left in place are not counted."""
    ratios = []
    for i, (a, b, c) in enumerate(zip(p0, ref, new)):
        moved = (b.double() - a.double()).norm().item()
        if moved > 0:
            ratios.append(((c.double() - a.double()).norm().item() / moved, i))
    if not ratios:
        return True, "no tensor moved in the reference: movement not compared"
    (lo, lo_i), (hi, hi_i) = min(ratios), max(ratios)
    ok = band[0] <= lo and hi <= band[1]
    text = (f"each of {len(ratios)} tensors moved {lo:.2f}-{hi:.2f}x as far as in the reference (allowed "
            f"{band[0]:g}-{band[1]:g}x)")
    if not ok:
        text += f": tensor {lo_i if lo < band[0] else hi_i} is outside it"
    return ok, text


def loss_value(out) -> float:
    """The loss a step returned, as a float (a tensor is read with .item(): only for checks)."""
    if isinstance(out, (tuple, list)):
        out = out[0]
    return float(out.item()) if isinstance(out, torch.Tensor) else float(out)


def trained(step, k: int = K_UPDATES) -> tuple[list, list]:
    """(the parameters before, after k calls of `step`) of a step that carries its model (`step.model`);
    its `close()`, if it has one, runs afterwards. The zoo's and notebook 15's correctness checks."""
    try:
        p0 = parameters(step.model)
        for _ in range(k):
            step()
        return p0, parameters(step.model)
    finally:
        close = getattr(step, "close", None)
        if close is not None:
            close()
