"""Lesson 09, activation checkpointing: its knobs, its correctness check and its headline measurement.

Notebook 09 shows the model (`gpulab.models.transformer.TransformerStack`, whose `checkpoint_every`
is the switch) and the memory arithmetic (`gpulab.models.sizing`); this module holds what the notebook
and `gpulab bench` share: the sizes (`CONFIG`, `config`), `checkpointing_check` (the same loss and
gradients with checkpointing as without, in fp32) and `headline`, the peak memory of a training step
checkpointing every block against none.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from gpulab.core.device import float32_matmul, pick_device, resolve_scale
from gpulab.core.measured import Measured, Skipped
from gpulab.core.memory import GiB, MiB
from gpulab.core.predict import Plan, Work
from gpulab.core.timing import benchmark
from gpulab.models.precision import half_dtype
from gpulab.models.sizing import largest_batch, predicted_batch, predicted_memory, training_peak
from gpulab.models.step import GRAD_TOL, fp32_loss_and_grads, train_step, worst_difference
from gpulab.models.transformer import STACK, TransformerStack, make_batch

# -- knobs ------------------------------------------------------------------------------------------
TITLE = "activation checkpointing"
HEADLINE = "peak memory, every block / none"      # the metric bands.toml judges
CONFIG = {
    # the model: transformer.STACK (12 GPT blocks; n_blocks, width, heads, seq), shared with lesson 10
    # batch: of the measured steps (halved on a smaller GPU by `predicted_batch`)
    # check_batch: of the fp32 correctness check
    # budget_cap, search_step: section 7's largest-batch search: its memory cap and its resolution
    "tiny": dict(**STACK["tiny"], batch=4, check_batch=2, budget_cap=256 * MiB, search_step=1),
    "full": dict(**STACK["full"], batch=32, check_batch=2, budget_cap=24 * GiB, search_step=8),
}


def config(scale: str | None = None) -> dict:
    """This lesson's knobs at a scale ('tiny' or 'full'; default: the course's, `GPULAB_SCALE`)."""
    return dict(CONFIG[resolve_scale(scale)])


# -- how long notebook 09 takes (gpulab.core.predict) -------------------------------------------------
# seconds no GPU changes: the reference run below (40.9 s) less its GPU work there (17.1 s); the tiny scale
# keeps the same figure (its GPU work is a few ms, its start-up and imports are not smaller)
HOST_S = 23.8
HOST_SOURCE = ("wall time of notebook 09 in results/h200-2026-11-30-course-timings.tsv (H200, torch 2.11, "
               "2026-11-30) minus its GPU work at that run's ceilings")
RECOMPUTE = 4 / 3       # a checkpointed step runs each block's forward twice: 4 forwards' work instead of 3


def stack_params(n_blocks: int, width: int, **_) -> int:
    """Parameters of `TransformerStack(n_blocks, width, ...)`: 12 C^2 + 13 C per block, C^2 + 3 C for the
    final LayerNorm and head (152 M at full size). Pure arithmetic, for the plans of notebooks 09 and 10."""
    return n_blocks * (12 * width**2 + 13 * width) + width**2 + 3 * width


def stack_step_flops(n_blocks: int, width: int, seq: int, **_) -> int:
    """FLOPs of one sample's training step (forward and backward: 3 forwards) through `TransformerStack`, as
    FlopCounterMode counts them: per token 2 per weight of the products (12 C^2 per block, C^2 the head)
    and attention's two products (4 seq C per block). 1.06 T at full size. Notebooks 09 and 10."""
    return 3 * seq * (2 * (n_blocks * 12 * width**2 + width**2) + 4 * n_blocks * seq * width)


def search_plan(cfg: dict, k: int) -> tuple[int, int]:
    """(largest batch, samples trained in all its trials) of `largest_batch`'s search at the budget
    `cfg["budget_cap"]`, checkpointing every k blocks, each trial deciding as `predicted_memory` does: an
    upper bound, as the notebook's budget is min(that cap, half the free memory). The plans of notebooks
    09 and 10 (cfg: n_blocks, width, seq, budget_cap, search_step)."""
    params = stack_params(**cfg)

    def fits(b: int) -> tuple[bool, int]:
        peak = predicted_memory(cfg["n_blocks"], b, cfg["seq"], cfg["width"], params, k)[1]
        return peak <= cfg["budget_cap"], peak

    best, trials = largest_batch(fits, start=1, limit=1024, resolution=cfg["search_step"])
    return best, sum(b for b, _, _ in trials)


def plan(scale: str | None = None) -> Plan:
    """What notebook 09 asks of the GPU at `scale` (gpulab.core.predict): its 16-bit (bf16) training steps at
    the config's batch (an upper bound: `predicted_batch` halves it on a smaller GPU), the fp32 correctness
    checks, and section 7's largest-batch searches. `benchmark`'s time budget beyond its 2 warm-up, probe
    and 3 timed calls is host time. Share 0.6: what a step reached on the reference run (09's step_ms in
    results/h200-2026-11-30-course.json: 35 TFLOP in 83 ms, 0.61 of bf16's 686 TFLOP/s)."""
    cfg = config(scale)
    batch, sample = cfg["batch"], stack_step_flops(**cfg)
    timed = 1 + 2 + 1 + 3       # training_peak's step, then benchmark: 2 warm-up, its probe, 3 timed
    experiment = 1 + timed      # checkpoint_experiment: + the step that counts what is kept
    # steps at `batch` in bf16: none / checkpointed (each RECOMPUTE steps' work)
    plain = (experiment         # section 6: k = 0
             + timed            # the headline's k = 0
             + experiment)      # the panel's run(k=0)
    checkpointed = (6 * experiment          # section 6: k = 1, 2, 3, 4, 6, 12
                    + experiment            # section 6: the seed's form (every block inside a checkpoint)
                    + timed                 # the headline's k = 1
                    + 2 * experiment)       # the panel: its default (k = 1), then run(k=5)
    bf16 = (plain + RECOMPUTE * checkpointed) * batch * sample
    # section 7: largest_batch for k = 0 and k = 1, one step per trial
    search = (search_plan(cfg, 0)[1] + RECOMPUTE * search_plan(cfg, 1)[1]) * sample
    # fp32 (TF32 off) checks on `check_batch` samples, each a forward and backward: section 4 (none and
    # k = 1, 2, 5, 12), section 5 (none and the seed's form), the headline's (none and k = 1)
    fp32 = (3 + (4 + 1 + 1) * RECOMPUTE) * cfg["check_batch"] * sample
    n_steps = plain + checkpointed
    return Plan(host_s=HOST_S, host_source=HOST_SOURCE, work=[
        Work("matmul_bf16", bf16, 0.6, f"{n_steps} bf16 steps of batch {batch} ({checkpointed} checkpointed)"),
        Work("matmul_bf16", search, 0.6, "bf16 steps of the two largest-batch searches"),
        Work("matmul_fp32", fp32, 0.7, f"fp32 checks: {3 + 4 + 1 + 1} forward+backward of batch {cfg['check_batch']}"),
    ])


def checkpointing_check(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                        ks: Sequence[int] = (1, 2, 5, 12)) -> tuple[float, dict[int, tuple[float, float]]]:
    """Same weights, same batch, plain fp32 (TF32 off): the loss and gradients of `model` checkpointing
    every k blocks, for each k in `ks`, against none. Notebook 09.

    Returns (the loss without checkpointing, {k: (loss, worst gradient difference)}), the difference
    being the largest |g_k - g| of a parameter relative to that parameter's largest |g|. The model is
    left without checkpointing and without gradients.
    """
    out = {}
    try:
        with float32_matmul("ieee"):
            model.checkpoint_every = 0
            ref_loss, ref = fp32_loss_and_grads(model, x, y)
            for k in ks:
                model.checkpoint_every = k
                loss, grads = fp32_loss_and_grads(model, x, y)
                out[k] = (loss, worst_difference(grads, ref))
    finally:
        model.checkpoint_every = 0
        model.zero_grad(set_to_none=True)
    return ref_loss, out


def headline(scale: str | None = None) -> Measured:
    """Peak memory of a training step of `config(scale)`'s model and batch, checkpointing every block
    against none (`TransformerStack`, `training_peak`), under bf16 (fp16 where bf16 is not native)
    autocast; the fp32 loss and gradients are checked equal first, as in notebook 09."""
    device = pick_device()
    if device.type != "cuda":
        raise Skipped("peak memory is read from CUDA's caching allocator; the CPU has none")
    cfg = config(scale)
    dtype = half_dtype()
    torch.manual_seed(0)
    model = TransformerStack(cfg["n_blocks"], cfg["width"], cfg["heads"], cfg["seq"], device=device)
    params = sum(p.numel() for p in model.parameters())
    batch = predicted_batch(cfg["n_blocks"], cfg["batch"], cfg["seq"], cfg["width"], params, device=device)
    x, y = make_batch(model, cfg["check_batch"], seed=1)
    ref_loss, checked = checkpointing_check(model, x, y, ks=(1,))    # correct before fast, as notebook 09
    loss, diff = checked[1]
    correct = abs(loss - ref_loss) <= GRAD_TOL * abs(ref_loss) and diff <= GRAD_TOL
    del x, y
    peak, step_ms = {}, {}
    try:
        for k in (0, 1):
            model.checkpoint_every = k
            peak[k] = training_peak(model, batch, dtype)
            x, y = make_batch(model, batch)
            step_ms[k] = benchmark(lambda: train_step(model, x, y, precision=dtype), warmup=2).median_ms
            del x, y
    finally:
        model.zero_grad(set_to_none=True)
    return Measured(peak[0] / GiB, peak[1] / GiB, "GiB", peak[1] / peak[0], correct,
                    f"fp32 loss and gradients, every block vs none: worst relative difference {diff:.1e} "
                    f"(<= {GRAD_TOL:.0e})",
                    f"no checkpointing, batch {batch}", "checkpoint every block",
                    notes=f"step time every block / none: {step_ms[1] / step_ms[0]:.2f}x")
