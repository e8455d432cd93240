"""Lesson 09, activation checkpointing: its knobs, its correctness check and its headline measurement.

Notebook 09 shows the model (`gpulab.models.transformer.TransformerStack`, whose `checkpoint_every`
is the switch) and the memory arithmetic (`gpulab.models.sizing`); this module holds what the notebook
and `gpulab bench` share: the sizes (`CONFIG`, `config`), `checkpointing_check` (the same loss and
gradients with checkpointing as without, in fp32) and `headline`, the peak memory of a training step
checkpointing every block against none.

For the notebook alone: `CheckpointedStack`, the stack with *selective* checkpointing as a second switch
(`save_matmuls`, its policy: keep the outputs of matrix products and attention, recompute the rest), and
the memory of a step with the optimizer's update (`step_peak`; AdamW keeps `ADAMW_BYTES` per parameter)
and of what a step keeps for backward as the allocator sees it (`kept_bytes`).
"""
from __future__ import annotations

import functools
from typing import Callable, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from gpulab.core.device import float32_matmul, pick_device, resolve_scale
from gpulab.core.measured import Measured, Skipped
from gpulab.core.memory import GiB, MiB, track_peak
from gpulab.core.predict import Plan, Work
from gpulab.core.timing import benchmark
from gpulab.models.precision import half_dtype
from gpulab.models.sizing import largest_batch, predicted_batch, predicted_memory, training_peak
from gpulab.models.step import GRAD_TOL, autocast, fp32_loss_and_grads, mse_loss, train_step, worst_difference
from gpulab.models.transformer import STACK, TransformerStack, make_batch, param_bytes

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
HOST_SOURCE = ("wall time of notebook 09 in results/course/2026-11-30-h200-00-to-09-at-775ae4a/h200-2026-11-30-course-timings.tsv (H200, torch 2.11, "
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
    results/course/2026-11-30-h200-00-to-09-at-775ae4a/h200-2026-11-30-course.json: 35 TFLOP in 83 ms, 0.61 of bf16's 686 TFLOP/s)."""
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
    # issue 15: section 6's selective row (k = 1; recomputes only the cheap operations: counted as plain) and
    # the two AdamW rows (none, every block), each with one more step that creates the optimizer's state
    plain += experiment + (experiment + 1)
    checkpointed += experiment + 1
    bf16 = (plain + RECOMPUTE * checkpointed) * batch * sample
    # section 7: largest_batch for k = 0 and k = 1, one step per trial
    search = (search_plan(cfg, 0)[1] + RECOMPUTE * search_plan(cfg, 1)[1]) * sample
    # fp32 (TF32 off) checks on `check_batch` samples, each a forward and backward: section 4 (none and
    # k = 1, 2, 5, 12), section 5 (none and the seed's form), the headline's (none and k = 1)
    fp32 = (3 + (4 + 1 + 1) * RECOMPUTE + 1) * cfg["check_batch"] * sample     # + the selective check
    n_steps = plain + checkpointed
    return Plan(host_s=HOST_S, host_source=HOST_SOURCE, work=[
        Work("matmul_bf16", bf16, 0.6, f"{n_steps} bf16 steps of batch {batch} ({checkpointed} checkpointed)"),
        Work("matmul_bf16", search, 0.6, "bf16 steps of the two largest-batch searches"),
        Work("matmul_fp32", fp32, 0.7, f"fp32 checks: {3 + 4 + 1 + 1} forward+backward of batch {cfg['check_batch']}"),
    ])


def checkpointing_check(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                        ks: Sequence[int] = (1, 2, 5, 12),
                        selective: bool = False) -> tuple[float, dict[int, tuple[float, float]]]:
    """Same weights, same batch, plain fp32 (TF32 off): the loss and gradients of `model` checkpointing
    every k blocks, for each k in `ks`, against none. Notebook 09.

    With `selective` (a `CheckpointedStack`) the segments are checkpointed selectively (`save_matmuls`).
    Returns (the loss without checkpointing, {k: (loss, worst gradient difference)}), the difference
    being the largest |g_k - g| of a parameter relative to that parameter's largest |g|. The model is
    left without checkpointing and without gradients.
    """
    if selective and not hasattr(model, "selective"):
        raise ValueError("selective checkpointing needs a CheckpointedStack.")
    out = {}
    try:
        with float32_matmul("ieee"):
            model.checkpoint_every = 0
            if hasattr(model, "selective"):
                model.selective = False
            ref_loss, ref = fp32_loss_and_grads(model, x, y)
            for k in ks:
                model.checkpoint_every = k
                if selective:
                    model.selective = True
                loss, grads = fp32_loss_and_grads(model, x, y)
                out[k] = (loss, worst_difference(grads, ref))
    finally:
        model.checkpoint_every = 0
        if hasattr(model, "selective"):
            model.selective = False
        model.zero_grad(set_to_none=True)
    return ref_loss, out


# -- selective activation checkpointing (notebook 09) --------------------------------------------------
def _aten_ops(*names: str) -> frozenset:
    """The default overloads of these aten operators that this build of PyTorch has."""
    ops = []
    for name in names:
        packet = getattr(torch.ops.aten, name, None)
        if packet is not None and hasattr(packet, "default"):
            ops.append(packet.default)
    return frozenset(ops)


# What selective checkpointing keeps: the outputs of matrix products (nn.Linear runs as addmm or mm) and of
# attention (scaled_dot_product_attention runs as one of these kernels, by device and dtype). Everything
# else inside a segment (LayerNorms, GELU, autocast's casts, additions, views) is recomputed in backward.
SAVE_OPS = _aten_ops("mm", "addmm", "bmm", "_scaled_dot_product_flash_attention",
                     "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                     "_scaled_dot_product_flash_attention_for_cpu")


def save_matmuls(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    """Selective checkpointing's policy: keep what is expensive to recompute (`SAVE_OPS`), recompute the rest."""
    return CheckpointPolicy.MUST_SAVE if op in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


class CheckpointedStack(TransformerStack):
    """`TransformerStack` with a second switch, `selective`: each checkpointed segment (`checkpoint_every = k`)
    keeps the outputs of its matrix products and attention and recomputes only the cheap operations in
    backward (PyTorch's selective activation checkpointing: `create_selective_checkpoint_contexts` with the
    policy `save_matmuls`). Same weights, same results; `selective = False` is the plain stack. Notebook 09."""

    def __init__(self, *args, selective: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.selective = selective

    def run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """The blocks on x, as `TransformerStack.run_blocks`; with `selective`, each segment of k blocks is
        checkpointed with the policy `save_matmuls`."""
        if not self.selective:
            return super().run_blocks(x)
        k = self.checkpoint_every
        if k < 1:
            raise ValueError(f"selective checkpointing works on checkpointed segments: set checkpoint_every "
                             f"to 1 or more blocks (got {k}).")
        context = functools.partial(create_selective_checkpoint_contexts, save_matmuls)
        for start in range(0, len(self.blocks), k):
            x = checkpoint(self.blocks[start:start + k], x, use_reentrant=False, context_fn=context)
        return x


# -- the optimizer's share of a step's memory (notebook 09) ---------------------------------------------
ADAMW_BYTES = 8       # AdamW keeps two fp32 moments (exp_avg, exp_avg_sq) per parameter, from its first step on


def adamw_for_measuring(model: nn.Module) -> torch.optim.AdamW:
    """AdamW with lr = 0: its state, its kernels and their memory, without changing the weights that the
    notebook's other runs share. Notebook 09."""
    return torch.optim.AdamW(model.parameters(), lr=0.0)


def scaler_for(dtype: torch.dtype | None, device: torch.device) -> torch.amp.GradScaler | None:
    """The GradScaler an update under `dtype` autocast needs: one for fp16, None otherwise. Notebook 09."""
    return torch.amp.GradScaler(device.type) if dtype is torch.float16 else None


def kept_bytes(model: nn.Module, batch: int, dtype: torch.dtype | None = None) -> int | None:
    """Bytes allocated between the forward (with the loss) and the backward of one step at `batch`, read from
    CUDA's allocator: all that the step keeps for backward, including what a selective checkpoint caches
    itself (which `sizing.saved_for_backward`'s hooks do not see). None on the CPU. Notebook 09."""
    device = next(model.parameters()).device
    if device.type != "cuda":
        return None
    x, y = make_batch(model, batch)
    model.zero_grad(set_to_none=True)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    with autocast(device, dtype):
        loss = mse_loss(model, x, y)
    torch.cuda.synchronize(device)
    kept = torch.cuda.memory_allocated(device) - before
    loss.backward()
    model.zero_grad(set_to_none=True)
    del x, y, loss
    return kept


def step_peak(model: nn.Module, batch: int, dtype: torch.dtype | None = None,
              make_optimizer: Callable[[nn.Module], torch.optim.Optimizer] | None = None) -> int | None:
    """Peak bytes of one training step at `batch` on the GPU (None on the CPU). Notebook 09.

    Without `make_optimizer`: forward and backward, the update left out (`sizing.training_peak`: weights,
    batch, activations, gradients). With it, a whole training step: one step runs first, untracked, so the
    optimizer's state exists as in every step after the first; the peak counts the weights, that state and
    all the step allocates on top (under fp16 through a GradScaler)."""
    if make_optimizer is None:
        return training_peak(model, batch, dtype)
    device = next(model.parameters()).device
    if device.type != "cuda":
        return None
    optimizer = make_optimizer(model)
    scaler = scaler_for(dtype, device)
    try:
        x, y = make_batch(model, batch)
        train_step(model, x, y, precision=dtype, optimizer=optimizer, scaler=scaler)   # creates the state
        del x, y
        model.zero_grad(set_to_none=True)
        state = sum(t.numel() * t.element_size() for st in optimizer.state.values() for t in st.values()
                    if torch.is_tensor(t) and t.device.type == "cuda")
        with track_peak(device) as mem:
            x, y = make_batch(model, batch)
            train_step(model, x, y, precision=dtype, optimizer=optimizer, scaler=scaler)
            del x, y
            model.zero_grad(set_to_none=True)
    finally:
        model.zero_grad(set_to_none=True)
        del optimizer
    return param_bytes(model) + state + mem.peak_above_start


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
