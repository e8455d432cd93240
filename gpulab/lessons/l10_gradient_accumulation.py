"""Lesson 10, gradient accumulation: its knobs, its correctness check and its headline measurement.

The accumulation itself is `gpulab.models.step.train_step(..., accumulation=steps)`, on lesson 09's
model (`gpulab.models.transformer.TransformerStack`, `STACK`). This module holds what notebook 10 and
`gpulab bench` share: the sizes (`CONFIG`, `config`), `accumulation_check` (accumulated gradients equal
the big batch's, in fp32, and what not dividing does), `time_pair` (what the time check compares),
`update_ratio` (what not dividing does to one
SGD or AdamW update) and `headline`, the peak memory of one big batch against the same batch in
accumulated micro-batches.
"""
from __future__ import annotations

import copy
import math

import torch
from torch import nn

from gpulab.core.device import float32_matmul, pick_device, resolve_scale
from gpulab.core.measured import Measured, Skipped
from gpulab.core.memory import GiB, MiB, track_peak
from gpulab.core.predict import Plan, Work
from gpulab.lessons.l09_activation_checkpointing import RECOMPUTE, search_plan, stack_params, stack_step_flops
from gpulab.models.precision import half_dtype
from gpulab.models.sizing import predicted_batch, predicted_memory
from gpulab.models.step import GRAD_TOL, train_step, worst_difference
from gpulab.models.transformer import STACK, TransformerStack, make_batch, param_bytes

# -- knobs ------------------------------------------------------------------------------------------
TITLE = "gradient accumulation"
HEADLINE = "peak memory, one big batch / accumulated"      # the metric bands.toml judges
CONFIG = {
    # the model: transformer.STACK (lesson 09's 12 GPT blocks; n_blocks, width, heads, seq)
    # micro: the micro-batch (halved on a smaller GPU by `predicted_batch`)
    # steps: micro-batches per effective batch, of the headline and of the fp32 check
    # check_micro: the fp32 check's micro-batch; sweep_steps: section 4's numbers of micro-batches
    # budget_cap, search_step: lesson 09's memory budget cap, and the largest-batch search's resolution
    "tiny": dict(**STACK["tiny"], micro=4, steps=4, check_micro=2, sweep_steps=[1, 2, 4, 8],
                 budget_cap=256 * MiB, search_step=1),
    "full": dict(**STACK["full"], micro=8, steps=4, check_micro=2, sweep_steps=[1, 2, 4, 8, 16],
                 budget_cap=24 * GiB, search_step=16),
}


def config(scale: str | None = None) -> dict:
    """This lesson's knobs at a scale ('tiny' or 'full'; default: the course's, `GPULAB_SCALE`)."""
    return dict(CONFIG[resolve_scale(scale)])


# -- how long notebook 10 takes (gpulab.core.predict) -------------------------------------------------
# seconds no GPU changes: the reference run below (36.5 s) less its GPU work there (17.1 s); the tiny scale
# keeps the same figure (its GPU work is a few ms, its start-up and imports are not smaller)
HOST_S = 19.4
HOST_SOURCE = ("wall time of notebook 10 in results/course/2026-11-30-h200-10-to-14-at-775ae4a/h200-2026-11-30-course-2-timings.tsv (H200, torch 2.11, "
               "2026-11-30) minus its GPU work at the ceilings in results/course/2026-11-30-h200-00-to-09-at-775ae4a/h200-2026-11-30-course.json")


def plan(scale: str | None = None) -> Plan:
    """What notebook 10 asks of the GPU at `scale` (gpulab.core.predict): lesson 09's model trained on
    samples of `stack_step_flops` each, in bf16, at the config's micro-batch (an upper bound:
    `predicted_batch` halves it on a smaller GPU); the fp32 checks; the largest-batch searches. Which big
    batches fit the budget is decided as `predicted_memory` does, at `budget_cap` (an upper bound too).
    `benchmark`'s time budget beyond its warm-up, probe and 3 timed calls is host time. Shares: lesson 09's
    0.6 for the big batches and the searches; 0.5 for the micro-batches (notebook 10's reference run:
    micro-batches of 8 took 1.15x the time per sample of one batch of 32)."""
    cfg = config(scale)
    micro, sample = cfg["micro"], stack_step_flops(**cfg)
    params = stack_params(**cfg)

    def fits(batch: int) -> bool:
        return predicted_memory(cfg["n_blocks"], batch, cfg["seq"], cfg["width"], params)[1] <= cfg["budget_cap"]

    timed = 1 + 1 + 3          # benchmark(warmup=1): warm-up, its probe, 3 timed calls
    # micro-batch samples (bf16): section 4's accumulation runs (one with the peak tracked, then timed) over
    # `sweep_steps`; the panel's default run (4 steps) and run(micro_batch=4 micro, steps=1)
    accumulated = (1 + timed) * micro * (sum(cfg["sweep_steps"]) + 4 + 4)
    # one big batch of micro x s, for s in `sweep_steps` until one does not fit: fits_budget's step, then
    # timed; the headline's one batch of micro x steps, once whole and once accumulated
    big = 0
    for s in cfg["sweep_steps"]:
        fit = fits(micro * s)
        big += micro * s * (1 + timed if fit else 1)
        if not fit:
            break               # as the notebook: twice the batch would not fit either
    big += 2 * micro * cfg["steps"]
    if not any(fits(micro * s) for s in cfg["sweep_steps"] if s > 1):
        accumulated += (1 + timed) * micro      # the time check's halves of a micro-batch, accumulated (`time_pair`)
    # section 5: largest_batch with k = 0 and k = 1 (each trial one step; a checkpointed one RECOMPUTE
    # steps' work), then 1 warm-up + 3 timed steps at the batch found
    searched = 0.0
    for k, work in ((0, 1.0), (1, RECOMPUTE)):
        best, samples = search_plan(cfg, k)
        searched += work * (samples + 4 * best)
    # fp32 (TF32 off): accumulation_check in section 3 and in the headline, each 3 steps of check_micro x steps;
    # update_ratio for SGD and AdamW in section 3, each 2 steps of the same batch
    fp32 = (2 * 3 + 2 * 2) * cfg["check_micro"] * cfg["steps"]
    return Plan(host_s=HOST_S, host_source=HOST_SOURCE, work=[
        Work("matmul_bf16", accumulated * sample, 0.5, f"{accumulated} samples in bf16 micro-batches of {micro}"),
        Work("matmul_bf16", big * sample, 0.6, f"{big} samples in bf16 big batches"),
        Work("matmul_bf16", searched * sample, 0.6, "bf16 steps of the two largest-batch searches, then timed"),
        Work("matmul_fp32", fp32 * sample, 0.7, f"fp32 checks: {fp32} samples"),
    ])


def accumulation_check(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int) -> dict[str, float]:
    """Plain fp32 (TF32 off): the gradients of one batch (x, y) against the same batch in `steps` equal
    micro-batches, accumulated with each loss divided by `steps` (`accumulate`) and without. Notebook 10.

    Returns {"divided": the worst difference of the accumulated gradients from the big batch's, per parameter
    (`step.worst_difference`: the largest |difference| of a parameter's entries over its largest big-batch entry,
    the worst parameter; lesson 09's measure, under the same GRAD_TOL), "undivided": norm of the undivided
    gradients / the big batch's (the classic mistake: `steps`)}. The model is left without gradients.
    """
    def gradients() -> list[torch.Tensor]:
        return [p.grad.clone() for p in model.parameters()]

    def norm(grads: list[torch.Tensor]) -> float:
        return torch.sqrt(sum((g.double() ** 2).sum() for g in grads)).item()

    if steps < 1 or x.shape[0] % steps:
        raise ValueError(f"the batch ({x.shape[0]}) must split into {steps} equal micro-batches")
    try:
        with float32_matmul("ieee"):
            train_step(model, x, y)                   # the big batch, lesson 09's step
            big = gradients()
            train_step(model, x, y, accumulation=steps)
            accumulated = gradients()
            train_step(model, x, y, accumulation=steps, divide=False)
            undivided = gradients()
    finally:
        model.zero_grad(set_to_none=True)
    big_norm = norm(big)
    return {"divided": worst_difference(accumulated, big), "undivided": norm(undivided) / big_norm}


def time_pair(micro: int, big_ms: dict[int, float | None]) -> tuple[int, int, int, str] | None:
    """What notebook 10's time check compares, given the micro-batch and section 4's big batches (`big_ms`: for each
    number of micro-batches s tried, one batch of micro x s's ms per sample, None where it did not fit the budget):
    (micro-batch, steps, the one batch's size, why), the accumulated micro-batch x steps against one batch of the
    same size:

    - the largest s > 1 whose one batch fitted: `micro` x s against one batch of micro x s (s = 1 is the same step);
    - where none did (a 16 GB card: one batch of two micro-batches is over the budget), the micro-batch itself is
      the one batch, against its halves accumulated: micro // 2 x 2 (micro // 2 x 2 = micro for an even micro);
    - None where there is nothing to compare (a micro-batch of 1 and no larger batch fitted)."""
    both = [s for s, ms in sorted(big_ms.items()) if s > 1 and ms is not None]
    if both:
        s = both[-1]
        return micro, s, micro * s, f"the largest effective batch timed both ways, {micro * s}"
    if big_ms.get(1) is not None and micro >= 2:
        return (micro // 2, 2, micro, f"no batch of two micro-batches of {micro} fitted the memory budget: one "
                                      f"micro-batch of {micro} against its halves, {micro // 2} x 2, accumulated")
    return None


OPTIMIZERS = {"SGD": torch.optim.SGD, "AdamW": torch.optim.AdamW}


def update_ratio(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int, optimizer: str,
                 lr: float = 1e-3) -> float:
    """Plain fp32 (TF32 off): the size (norm over every weight) of one `optimizer` update made from the
    undivided accumulated gradients (the classic mistake, `steps` times too large), over the size of
    the update from the correctly divided ones. Both start from the same weights with a fresh optimizer
    (its defaults, learning rate `lr`); the model's weights are put back and left without gradients.
    Notebook 10.

    SGD moves each weight by lr x gradient: the ratio is `steps`, as if lr were `steps` times larger.
    AdamW's first update is lr x m / (sqrt(v) + eps), with m and v running means of the gradient and
    of its square: a gradient `steps` times larger cancels out, and the ratio is 1 up to eps (its
    decoupled weight decay does not see the gradient at all).
    """
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)} (got {optimizer!r})")
    params = list(model.parameters())
    start = copy.deepcopy(model.state_dict())
    sizes = []
    try:
        with float32_matmul("ieee"):
            for divide in (True, False):
                model.load_state_dict(start)
                before = [p.detach().clone() for p in params]
                opt = OPTIMIZERS[optimizer](params, lr=lr)
                train_step(model, x, y, optimizer=opt, accumulation=steps, divide=divide)
                sizes.append(math.sqrt(sum(float(((p.detach() - b).double() ** 2).sum())
                                           for p, b in zip(params, before))))
                del opt, before
    finally:
        model.load_state_dict(start)
        model.zero_grad(set_to_none=True)
    return sizes[1] / sizes[0]


# How far the measured AdamW ratio may sit from its prediction: the updates are fp32 differences of weights
# about 1000x larger (lr 1e-3), so each carries a rounding error near 1e-4 of its size; 0.1 % is ten times that.
ADAMW_PREDICTION_TOL = 1e-3


def adamw_predicted_ratio(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int,
                          lr: float = 1e-3) -> float:
    """What `update_ratio(..., "AdamW")` should measure, predicted from the gradients themselves (plain fp32,
    TF32 off). AdamW's first update of a weight w with gradient g is lr * (wd * w + g / (|g| + eps)) (its
    bias-corrected moments are g and g squared); the undivided gradients are `steps` * g. Where |g| is
    much larger than eps the two updates match, and the ratio is 1; where a weight's gradient is near eps
    or zero (a bias whose gradient cancels), the undivided update is larger: the ratio is a little above
    1, by an amount this computes rather than a band guessed around 1. Notebook 10."""
    params = list(model.parameters())
    defaults = torch.optim.AdamW(params, lr=lr).defaults
    eps, wd = defaults["eps"], defaults["weight_decay"]
    model.zero_grad(set_to_none=True)
    try:
        with float32_matmul("ieee"):
            train_step(model, x, y, accumulation=steps, divide=True)
        right = wrong = 0.0
        for p in params:
            if p.grad is None:
                continue
            g, w = p.grad.detach().double(), p.detach().double()
            right += float(((wd * w + g / (g.abs() + eps)) ** 2).sum())
            wrong += float(((wd * w + steps * g / (steps * g.abs() + eps)) ** 2).sum())
    finally:
        model.zero_grad(set_to_none=True)
    return math.sqrt(wrong / right)


def headline(scale: str | None = None) -> Measured:
    """Peak memory of one big batch of `config(scale)`'s micro x steps samples against the same batch
    accumulated over `steps` micro-batches (`train_step(..., accumulation=steps)`, `track_peak`), under
    bf16 (fp16 where bf16 is not native) autocast; the fp32 gradients are checked equal first."""
    device = pick_device()
    if device.type != "cuda":
        raise Skipped("peak memory is read from CUDA's caching allocator; the CPU has none")
    cfg = config(scale)
    steps = cfg["steps"]
    dtype = half_dtype()
    torch.manual_seed(0)
    model = TransformerStack(cfg["n_blocks"], cfg["width"], cfg["heads"], cfg["seq"], device=device)
    params = sum(p.numel() for p in model.parameters())
    micro = predicted_batch(cfg["n_blocks"], cfg["micro"], cfg["seq"], cfg["width"], params, times=steps,
                            device=device)     # one big batch of micro x steps is run too
    x, y = make_batch(model, cfg["check_micro"] * steps, seed=1)     # correct first, in fp32, as notebook 10
    diff = accumulation_check(model, x, y, steps)["divided"]
    del x, y
    try:
        xb, yb = make_batch(model, micro * steps)
        with track_peak() as one:
            train_step(model, xb, yb, precision=dtype)
        model.zero_grad(set_to_none=True)
        with track_peak() as accumulated:
            train_step(model, xb, yb, precision=dtype, accumulation=steps)
        del xb, yb
    finally:
        model.zero_grad(set_to_none=True)
    base = param_bytes(model)
    big_peak, acc_peak = base + one.peak_above_start, base + accumulated.peak_above_start
    return Measured(big_peak / GiB, acc_peak / GiB, "GiB", big_peak / acc_peak, diff < GRAD_TOL,
                    f"fp32 gradients, {steps} micro-batches vs one batch: worst difference per parameter {diff:.1e} "
                    f"(< {GRAD_TOL:.0e})",
                    f"one batch of {micro * steps}", f"{steps} x {micro} accumulated")
