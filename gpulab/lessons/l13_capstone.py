"""Lesson 13, the capstone: two training jobs with every optimization of the course as a toggle.

Notebook 13 (`notebooks/13_capstone.ipynb`) and `gpulab bench` share what is here: the sizes and
timing budgets (`CONFIG`, `config(scale)`, `job_config(job, scale)`), the runs, and `headline(scale, runs)`.

- `JOBS`, `job_config`: a ResNet-50-shaped CNN on images and a GPT language model (`gpulab.models.cnn`
  and `gpulab.models.gpt`, lessons 06 and 07), trained with AdamW; their sizes at each scale.
- `Options`: the toggles (TF32, AMP, channels_last, aligned vocabulary, fused AdamW, input pipeline,
  torch.compile, CUDA graphs, checkpointing, accumulation); `check` refuses impossible combinations,
  `refusal` says why this device cannot run one.
- `run_job`: build a job from one seed, train a few steps (the loss trajectory), then time steps with
  `gpulab.core.timing.benchmark` for as long as the scale's budget allows: throughput, model TFLOP/s, peak
  memory, GPU busy %. Each step is `gpulab.models.step.train_step` (autocast, GradScaler, accumulation,
  CUDA-graph marks).
- `Runs`, `Checked` (and `gpulab.lessons.capstone.checks`): correct before fast; every run (at one scale) is
  memoized and checked against the fp32 baseline from the same weights on the same batches: its losses, how
  far each tensor moved, its systems toggles in fp32 against a measured noise floor, its numerics toggles'
  gradients against the baseline's own rounding; GradScaler's skipped updates retried and counted.
- `waterfall`, `attribute`: toggles added one at a time; each one's share of the total speed-up (in log
  space, so the shares add to 100%) and of the memory saved.
- `mfu`, `datasheet_peak`: model FLOPs utilization (PaLM's), against the datasheet's 16-bit peak;
  `peak_fraction`, `bf16_peak`: the fraction of measured peak, against notebook 00's measured 16-bit peak.
- `training_step`: a job's step with given toggles as a callable, for `gpulab.diagnose` (what keeps the
  fastest GPT step from the peak).
- `time_to_loss`, `LossCurve`: speed tied to quality: a byte-level GPT trained on the stdlib's source to the
  validation loss the fp32 baseline reaches in a fixed time (`gpulab.models.text`).
- `fp8_crossover`, `crossover`: FP8 products (e4m3, one scale per tensor) against bf16 by size, where the
  GPU has FP8 (Ada, Hopper and newer).
- `SEED_V100`, `SEED_4090`, `seed_v100_rows`, `seed_4090_rows`: the seed articles' tables redone here.
- `headline_numbers(job, scale, runs)`: a job's fp32 baseline against everything this device accepts
  (`all_on`), with its loss check and MFU; `headline(scale, runs)`: the GPT's, as the `Measured` that
  `gpulab bench` and notebook 13's self-check read (given the notebook's `runs`, it reuses their runs).

What each toggle does, and where the course measured it alone:

| toggle | what changes | lesson |
|---|---|---|
| tf32 | fp32 matrix products and convolutions on TF32 Tensor Cores | 06 |
| amp | autocast in bf16, or fp16 with a GradScaler | 06 |
| channels_last | NHWC layout of the CNN's weights and images | 07 |
| aligned | the GPT's vocabulary padded to a multiple of 64 | 07 |
| fused | `torch.optim.AdamW(fused=True)`: the whole update in a few multi-tensor launches | 12 |
| loader | batches from DataLoader workers, pinned, copied with non_blocking | 03, 05 |
| compile | `torch.compile` of the forward and the loss (inductor) | 12 |
| cuda_graphs | `torch.compile(mode="reduce-overhead")`: the compiled forward and backward replayed from CUDA graphs (not the optimizer) | 11 |
| checkpointing | every block checkpointed (lesson 09's `run_blocks`) | 09 |
| accumulation | the batch split into equal micro-batches, gradients summed | 10 |
"""
from __future__ import annotations

import contextlib
import copy
import functools
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.data import Dataset
from gpulab.models import precision as P
from gpulab.models.step import train_step
from gpulab.core.ceilings import Ceiling, ceilings
from gpulab.core.device import DeviceFacts, device_facts, pick_device, resolve_scale
from gpulab.core.memory import memory_guard, track_peak
from gpulab.core.timing import Timing, benchmark, interleaved, stopwatch
from gpulab.models import text
from gpulab.models.gpt import GPT, padded_copy, token_batches
from gpulab.models.cnn import ResNetish, image_batches
from gpulab.models.transformer import TransformerStack
from gpulab.models.sizing import count_flops, fit_batch, memory_budget
from gpulab.core.measured import Measured
from gpulab.core.predict import Plan, StepCap, Work
from gpulab.lessons.l11_cuda_graphs import cudagraph_skips
from gpulab.lessons.capstone import checks as K
from gpulab.lessons.capstone.checks import MOVE_MAX, NUMERICS_MAX, SYSTEMS_MAX     # the checks' allowances (section 5)


# -- knobs ------------------------------------------------------------------------------------------
TITLE = "capstone"
HEADLINE = "GPT tokens/s, every toggle / fp32"      # the metric bands.toml judges
CONFIG: dict[str, dict[str, Any]] = {
    "tiny": dict(
        gpt=dict(vocab=251, n_blocks=2, width=64, heads=4, seq=32, batch=8),
        cnn=dict(depths=(1, 1, 1, 1), width=8, classes=10, image=32, batch=16),
        budget_s=0.05,              # seconds of timed steps per run (`benchmark`'s budget)
        monitor_budget_s=0.05,      # the same, while GPU busy % is sampled
        max_repeat=5,               # at most this many timed steps per run
        seed_4090_batch=4,          # seed 004's first batch, doubled row by row
        fp8_sizes=(32, 64),         # n of the n x n x n products FP8 and bf16 are compared at (`fp8_crossover`)
        # time to a loss (`time_to_loss`): a byte-level GPT on the stdlib's source; the fp32 baseline trains for
        # budget_s seconds, its last validation loss is the target, a variant gets cap x that long to reach it
        ttl=dict(gpt=dict(vocab=256, n_blocks=2, width=64, heads=4, seq=64, batch=16), budget_s=1.0, cap=1.5,
                 eval_every=5, eval_batches=4, text_bytes=2**20),
        step_s=None,                # no time cap on the CPU (no ceilings to predict a step with)
    ),
    "full": dict(
        # GPT: 8 blocks of width 2048 (16 heads of 128), sequences of 1024 tokens, GPT-2's vocabulary of 50257.
        # Width 2048, not 1024: on the course's H200 (torch 2.11, 2026-11-29) a bf16 step of 12 x 1024 reached
        # 386 model TFLOP/s compiled (57% of the measured peak), 12 x 2048 reached 480 (71%): bigger products
        # and 128-wide attention heads keep the Tensor Cores busier, and the rest of the step weighs less.
        # 8 blocks, not 12, keep the notebook (and torch.compile's first call) inside the course's time budget.
        gpt=dict(vocab=50257, n_blocks=8, width=2048, heads=16, seq=1024, batch=8),
        # CNN: ResNet-50's layer shapes (25.6 M parameters) on 224 x 224 images, 1000 classes.
        cnn=dict(depths=(3, 4, 6, 3), width=64, classes=1000, image=224, batch=128),
        budget_s=0.3,
        monitor_budget_s=0.6,       # NVML averages busy % over windows of up to a second
        max_repeat=15,
        seed_4090_batch=32,         # the seed's own first batch (SEED_4090)
        # from launch-bound products to ones that fill any GPU with FP8 (1.1 TFLOP at 8192, 8.8 at 16384)
        fp8_sizes=(256, 512, 1024, 2048, 4096, 8192, 16384),
        # 6 blocks of 512 (19 M weights), 32 x 512 bytes a step: about 1.8 TFLOP, so a GPU's fp32 baseline
        # takes thousands of steps' worth of budget only where fp32 is fast; 16 MiB of text (train + held out)
        ttl=dict(gpt=dict(vocab=256, n_blocks=6, width=512, heads=8, seq=512, batch=32), budget_s=30.0, cap=1.5,
                 eval_every=20, eval_batches=16, text_bytes=16 * 2**20),
        # the most an fp32 baseline step may take, predicted from this GPU's fp32 matmul ceiling
        # (`Runs.fit_batches`): on the course's H200 a GPT step of batch 8 takes about 1 s, so an H200
        # keeps every batch, and a T4 (fp32 about 8 TFLOP/s on its datasheet) lowers the GPT's to fit
        step_s=1.5,
    ),
}


def config(scale: str | None = None) -> dict[str, Any]:
    """This lesson's knobs at a scale ('tiny' or 'full'; default: the course's, `GPULAB_SCALE`): each job's
    sizes ("gpt", "cnn"; copies, as `job_config` gives them) and how long each run is timed."""
    return {k: dict(v) if isinstance(v, dict) else v for k, v in CONFIG[resolve_scale(scale)].items()}


# -- how long notebook 13 takes (gpulab.core.predict) -------------------------------------------------
RESNET50_FLOPS_PER_IMAGE = 3 * 8.2e9   # forward 4.1 G multiply-adds at 224 x 224 (He et al. 2016, table 1), x 3
HOST_S = 274.9          # the reference run below, less its GPU work (compiling, loaders, budgets, time to loss)
HOST_SOURCE = ("wall time of notebook 13 (298.7 s as gpulab.tools.coursetime reads it; sections 12b, 12c, 13, 14 "
               "and 14b included) in results/course/2026-12-03-h200-00-to-15/h200-2026-12-03-course-timings.tsv (one H200, "
               "torch 2.11, 2026-12-03, the whole course at 7027931) minus its GPU work as this plan counts it "
               "(23.8 s) at the ceilings in results/course/2026-12-03-h200-00-to-15/h200-2026-12-03-course.json; section 14's "
               "and 14b's time-to-loss runs are budgeted in seconds, and each batch of the ladder and each FP8 step "
               "compiles afresh, so they count as host time. On a GPU without FP8 section 14b is skipped: the "
               "prediction there is high by its share (81 s of that run: a gradient check, two compiles and a time-to-loss run)")


def plan(scale: str | None = None) -> Plan:
    """What notebook 13 asks of the GPU at `scale` (gpulab.core.predict), at the config's batches, lowered as
    `Runs.fit_batches` lowers them where a GPU's fp32 step would take over `step_s` (a `StepCap` per job; the
    memory budget may lower them further). A timed run is at least 8 steps (3 loss steps, 1 warm-up,
    `benchmark`'s probe and 3 timed); its time budget beyond them is host time. Runs by precision, from
    the notebook's default waterfalls (`ORDERS`), seed tables and memory toggles: per job one fp32 run, one
    TF32 run, the rest 16-bit; `fit_batches` adds two small untimed fp32 runs (at 1/8 and 1/4 of the
    config's batch, before any cap); the batch ladder (section 12c) one 16-bit run at each of its larger batches.
    The checks (`Runs.checked`) add, per job, the fp32 baseline's noise floors (its loss steps again with its
    rows reordered, one step per format) and one untimed fp32 run of LOSS_STEPS steps for each systems toggle
    of the default waterfalls. HOST_S was measured before the checks: their host time (building each model, a
    second compile of the GPT, in fp32) is not in it."""
    cfg = config(scale)
    gpt, cnn = cfg["gpt"], cfg["cnn"]
    gpt_step = gpt_flops_per_token(**gpt)["total"] * gpt["seq"] * gpt["batch"]
    cnn_step = RESNET50_FLOPS_PER_IMAGE * (cnn["image"] / 224) ** 2 * cnn["batch"]
    steps, share = 8, 0.5
    work, caps = [], {}
    for name, flops, half_runs in (("GPT", gpt_step, 9), ("CNN", cnn_step, 8)):     # GPT: section 14b's FP8 step too
        probes = LOSS_STEPS * flops * (1 / 8 + 1 / 4)        # two untimed runs of LOSS_STEPS steps each
        systems = len([t for t in ORDERS[name.lower()] if t not in NUMERICS_TOGGLES]) + len(MEMORY_TOGGLES)
        work += [Work("matmul_fp32", probes, share, f"{name}: two untimed probe runs (fit_batches)"),
                 Work("matmul_fp32", steps * flops, share, f"{name}: fp32 baseline", job=name),
                 Work("matmul_fp32", (LOSS_STEPS + len(K.FORMATS)) * flops, share,
                      f"{name}: the baseline's noise floors (rows reordered, each format's rounding)", job=name),
                 Work("matmul_fp32", systems * LOSS_STEPS * flops, share,
                      f"{name}: {systems} untimed fp32 runs of the systems toggles (their checks)", job=name),
                 Work("matmul_tf32", steps * flops, share, f"{name}: TF32 run", job=name),
                 Work("matmul_bf16", half_runs * steps * flops, share, f"{name}: {half_runs} 16-bit runs", job=name)]
        if cfg.get("step_s"):
            caps[name] = StepCap("matmul_fp32", flops, STEP_SHARE, cfg["step_s"])
    work.append(Work("matmul_bf16", steps * gpt_step * sum(LADDER), share, "GPT: the batch ladder (section 12c)",
                     job="GPT"))
    return Plan(host_s=HOST_S, work=work, host_source=HOST_SOURCE, caps=caps)


MEMORY_CAP = 64 * 2**30   # the most memory a job's step is sized to take, below half the free GPU memory
STEP_SHARE = 0.5          # share of the fp32 matmul ceiling an fp32 training step is predicted to reach
STATE_SHARE = 0.5         # share of the memory budget the fp32 training state (16 bytes a parameter) may take
LR = 1e-3              # AdamW's learning rate for both jobs


POOL = 4               # distinct batches per run, cycled (the first LOSS_STEPS are the loss check's)


LOSS_STEPS = 3         # steps from the starting weights whose losses are compared with the baseline's


ALIGN = 64             # `aligned` pads the vocabulary to a multiple of this (lesson 07)


ACCUMULATION = 4       # micro-batches per step when a waterfall adds `accumulation`


LOADER_WORKERS = 4     # DataLoader worker processes when `loader` is on


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


# -- the toggles -------------------------------------------------------------------------------------
AMPS = ("none", "bf16", "fp16")


AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


SPEED_TOGGLES = ("tf32", "amp", "fp8", "channels_last", "aligned", "fused", "loader", "compile", "cuda_graphs")


NUMERICS_TOGGLES = ("tf32", "amp", "fp8")      # the numerics tier of the checks; the rest are the systems tier


MEMORY_TOGGLES = ("checkpointing", "accumulation")


TOGGLES = SPEED_TOGGLES + MEMORY_TOGGLES


# The waterfalls notebook 13 runs by default. compile is last (one compile per job); the CNN leaves it out
# and neither adds cuda_graphs, to keep the notebook inside its time budget (each compile costs tens of
# seconds at full size). Both stay toggles of the panel.
ORDERS = {"gpt": ("tf32", "amp", "aligned", "fused", "loader", "compile"),
          "cnn": ("tf32", "amp", "channels_last", "fused", "loader")}


@dataclass(frozen=True)
class Options:
    """The toggles of one run. `Options()` is the baseline: fp32 with TF32 off, PyTorch's defaults elsewhere."""

    tf32: bool = False
    amp: str = "none"                 # "none", "bf16", or "fp16" (always with a GradScaler)
    fp8: bool = False                 # GPT only, with amp bf16: the blocks' linear layers in FP8 (section 14b)
    channels_last: bool = False       # CNN only
    aligned: bool = False             # GPT only
    fused: bool = False
    loader: bool = False
    compile: bool = False
    cuda_graphs: bool = False         # needs compile: mode="reduce-overhead"
    checkpointing: bool = False
    accumulation: int = 1             # micro-batches per step; must divide the batch

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "amp":
                if value not in AMPS:
                    raise ValueError(f"amp must be one of {', '.join(map(repr, AMPS))} (got {value!r}).")
            elif f.name == "accumulation":
                if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 64:
                    raise ValueError(f"accumulation must be a whole number of micro-batches from 1 to 64 "
                                     f"(got {value!r}).")
            elif not isinstance(value, bool):
                raise ValueError(f"{f.name} must be True or False (got {value!r}).")

    def adding(self, toggle: str, half: str = "bf16") -> "Options":
        """These options with `toggle` switched on (amp: `half`; accumulation: ACCUMULATION micro-batches)."""
        if toggle not in TOGGLES:
            raise ValueError(f"unknown toggle {toggle!r}; the toggles are {', '.join(TOGGLES)}.")
        value = half if toggle == "amp" else ACCUMULATION if toggle == "accumulation" else True
        return dataclasses.replace(self, **{toggle: value})

    def without(self, *toggles: str) -> "Options":
        """These options with `toggles` back at their baseline values."""
        base = Options()
        return dataclasses.replace(self, **{t: getattr(base, t) for t in toggles})

    def on(self) -> list[str]:
        """The toggles that differ from the baseline, as short labels."""
        out = []
        for t in TOGGLES:
            v = getattr(self, t)
            if v != getattr(Options(), t):
                out.append(v if t == "amp" else f"accumulation x{v}" if t == "accumulation" else t)
        return out

    @property
    def label(self) -> str:
        return " + ".join(self.on()) or "fp32 baseline"

    @property
    def compile_mode(self) -> str:
        """torch.compile's mode: "reduce-overhead" (CUDA graphs) with cuda_graphs, else "default"."""
        return "reduce-overhead" if self.cuda_graphs else "default"


def check(job: str, options: Options, batch: int | None = None) -> None:
    """ValueError, with the reason, for a combination no device can run. Says nothing about this device:
    see `refusal`."""
    if job not in JOBS:
        raise ValueError(f"job must be one of {', '.join(JOBS)} (got {job!r}).")
    if not isinstance(options, Options):
        raise ValueError(f"options must be a gpulab.lessons.l13_capstone.Options (got {type(options).__name__}).")
    if options.channels_last and job != "cnn":
        raise ValueError("channels_last applies to the CNN only: it is a memory layout for 4-D image tensors "
                         "(N, C, H, W), and the GPT has none.")
    if options.aligned and job != "gpt":
        raise ValueError(f"aligned applies to the GPT only: it pads the vocabulary to a multiple of {ALIGN}. "
                         "The CNN's channel counts are multiples of 64 already.")
    if options.fp8 and job != "gpt":
        raise ValueError("fp8 applies to the GPT only: FP8 training (torchao's, and this course's) converts linear "
                         "layers, and the CNN's products are convolutions.")
    if options.fp8 and options.amp != "bf16":
        raise ValueError("fp8 needs amp bf16: FP8 training runs the linear layers' products in FP8 and everything "
                         "else under bf16 autocast (FP8 GPUs all have bf16).")
    if options.cuda_graphs and not options.compile:
        raise ValueError("cuda_graphs needs compile: here CUDA graphs come from torch.compile(mode="
                         "\"reduce-overhead\"), which records the compiled step's kernels once and replays "
                         "them; switch compile on too (lesson 11 captures a graph by hand).")
    if options.cuda_graphs and options.accumulation > 1:
        raise ValueError("cuda_graphs with accumulation: each micro-batch's gradients are outputs of a CUDA-graph "
                         "replay, and the next micro-batch's replay reuses that memory before they are summed "
                         "(PyTorch issue 169545); use one or the other.")
    if batch is not None:
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a whole number >= 1 (got {batch!r}).")
        if batch % options.accumulation:
            raise ValueError(f"accumulation {options.accumulation} does not divide the batch {batch}: each step "
                             "splits its batch into equal micro-batches.")


def refusal(options: Options, facts: DeviceFacts | None = None, backend: str | None = None) -> str | None:
    """Why this device cannot run `options` in a meaningful way ("toggle: reason"), or None if it can.

    `backend` is torch.compile's backend here (default: `gpulab.lessons.l12_kernel_fusion.compile_backend()`), asked only
    when compile is on and the device is a GPU.
    """
    facts = facts or device_facts()
    gpu = facts.on_gpu          # what runs the code: a GPU profile on the CPU still has no copy engine
    reasons = {}
    if options.tf32:
        reasons["tf32"] = P.refusal("tf32", facts)
    if options.amp != "none":
        reasons["amp"] = P.refusal(options.amp, facts)
    if options.fp8:
        reasons["fp8"] = P.fp8_refusal(facts)
    if options.loader and not gpu:
        reasons["loader"] = ("pinned (page-locked) memory and non_blocking copies speed up copies to a GPU; "
                             "on the CPU there is no copy to speed up.")
    if options.compile and not gpu:
        reasons["compile"] = ("skipped on the CPU: the first compile of each job (C++ code generation) takes "
                              "tens of seconds on a small machine, more than this lesson's CPU budget.")
    elif options.compile:
        if backend is None:
            from gpulab.lessons.l12_kernel_fusion import compile_backend
            backend, why = compile_backend()
        else:
            why = backend
        if backend != "inductor":
            reasons["compile"] = f"torch.compile would not fuse anything here: {why}"
    if options.cuda_graphs and not gpu:
        reasons["cuda_graphs"] = "CUDA graphs record CUDA kernel launches: they need a CUDA GPU."
    for toggle, why in reasons.items():
        if why:
            return f"{toggle}: {why}"
    return None


def problem(job: str, options: Options, batch: int | None = None, facts: DeviceFacts | None = None,
            backend: str | None = None) -> str | None:
    """`check`'s reason, else `refusal`'s, else None: why `options` cannot run here."""
    try:
        check(job, options, batch)
    except ValueError as err:
        return str(err)
    return refusal(options, facts, backend)


# -- checkpointing ------------------------------------------------------------------------------------
class CheckpointedBlocks(nn.Module):
    """A model's `blocks` (an nn.Sequential) run with lesson 09's activation checkpointing: every
    `every` blocks form one checkpointed segment (`TransformerStack.run_blocks`, reused as it is).

    For the CNN, BatchNorm in a recomputed segment updates its running statistics a second time during
    backward; the training loss uses the batch's own statistics, so it does not change.
    """

    run_blocks = TransformerStack.run_blocks

    def __init__(self, blocks: nn.Sequential, every: int = 1):
        super().__init__()
        self.blocks, self.checkpoint_every = blocks, every

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.run_blocks(x)


# -- the input pipeline ------------------------------------------------------------------------------
class HostBatches(Dataset):
    """Ready-made batches in host memory, served in order, round and round: a dataset already decoded
    into RAM, so the input path costs only the copy to the GPU (lesson 03 measures decoding).

    It lives in this importable module because DataLoader workers must find its class by name.
    """

    def __init__(self, pool: Sequence[tuple[torch.Tensor, torch.Tensor]], length: int = 10**6):
        if not pool:
            raise ValueError("the pool needs at least one batch")
        self.pool, self.length = list(pool), length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pool[i % len(self.pool)]


class Inputs:
    """The batches of one run, in order, copied to the device.

    loader off: each batch is copied from pageable host memory with a plain `.to(device)` (the host
    waits for the copy). loader on: LOADER_WORKERS DataLoader workers serve the batches, a pinning
    thread copies them into page-locked memory, and `.to(device, non_blocking=True)` returns at once
    (lessons 03 and 05). Same batches either way, so the losses match.
    """

    def __init__(self, pool: list, device: torch.device, loader: bool = False, channels_last: bool = False):
        self.pool, self.device, self.loader, self.channels_last = pool, device, loader, channels_last
        self._i = 0
        self._it = None

    def __enter__(self) -> "Inputs":
        if self.loader:
            from gpulab.lessons.l03_input_pipeline import make_loader
            self._it = iter(make_loader(HostBatches(self.pool), batch_size=None, num_workers=LOADER_WORKERS,
                                        pin_memory=self.device.type == "cuda"))
        return self

    def __exit__(self, *exc) -> None:
        self._it = None                     # the iterator's finalizer stops its workers
        self.pool = []                      # and the batches go: a name still bound to this object holds none

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._it is not None:
            x, y = next(self._it)
        else:
            x, y = self.pool[self._i % len(self.pool)]
            self._i += 1
        x = x.to(self.device, non_blocking=self.loader)
        y = y.to(self.device, non_blocking=self.loader)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y


# -- one run -----------------------------------------------------------------------------------------
SKIP_RETRIES = 24      # an update GradScaler skips is tried again on its batch at most this often (2^16 -> 2^-8)


@dataclass(frozen=True)
class JobResult:
    """What `run_job` measured. `time` is per optimizer step (None for an untimed run, or one whose check
    failed)."""

    job: str
    options: Options
    batch: int
    losses: tuple[float, ...]
    time: Timing | None
    unit: str
    items_per_step: int
    flops_per_step: float
    peak_bytes: int | None
    first_step_ms: float
    busy_pct: float | None = None
    monitor_status: str = ""
    notes: tuple[str, ...] = ()
    device: str = "cpu"
    skipped_updates: tuple[int, ...] = ()     # the loss step (from 0) of each update GradScaler skipped, then retried
    first_scale: float | None = None          # GradScaler's scale before the first update (fp16)
    sample: K.Sample | None = None            # what the correctness checks compare (`capstone.checks`)
    parts: tuple[K.Part, ...] = ()            # the checks made during the run, before it was timed

    @property
    def items_per_s(self) -> float | None:
        return None if self.time is None else self.time.per_second(self.items_per_step)

    @property
    def tflops(self) -> float | None:
        """Model FLOPs per second, in TFLOP/s (recomputation under checkpointing does not count)."""
        return None if self.time is None else self.time.per_second(self.flops_per_step) / 1e12

    @property
    def step_ms(self) -> float | None:
        return None if self.time is None else self.time.median_ms


_FLOPS: dict[tuple, float] = {}
_SAMPLED: dict[tuple, tuple[list, list[str]]] = {}


def _sizes_key(job: str, config: dict) -> tuple:
    return (job, tuple(sorted((k, tuple(v) if isinstance(v, (list, tuple)) else v)
                              for k, v in config.items() if k != "batch")))


def sampled(job: str, config: dict) -> tuple[K.Positions, list[str]]:
    """(the positions `checks.take` keeps of each parameter tensor, the tensors' names) for `job` at sizes
    `config`, from the model without toggles (built on the meta device: no memory)."""
    key = _sizes_key(job, config)
    if key not in _SAMPLED:
        named = list(JOBS[job].build(config, torch.device("meta")).named_parameters())
        _SAMPLED[key] = (K.sample_positions([p.shape for _, p in named]), [n for n, _ in named])
    return _SAMPLED[key]


def model_flops(job: str, config: dict, batch: int, device: torch.device | None = None) -> float:
    """FLOPs of one training step (forward, loss and backward) of `job` at `batch`, counted by PyTorch's
    FlopCounterMode (`gpulab.models.sizing.count_flops`: matrix products, convolutions and attention, causal
    attention counted in full) once per configuration, on a step of 2 samples, and scaled to `batch`.
    Counted on the unpadded model: padding the vocabulary adds arithmetic, not model FLOPs. On the CPU,
    attention is counted through its math path (its flash kernel there has no FLOP formula)."""
    device = device or pick_device()
    key = (*_sizes_key(job, config), str(device))
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


Check = Callable[[tuple, tuple, "K.Sample", "Callable[[], K.Sample] | None"], Sequence["K.Part"]]


def run_job(job: str, options: Options = Options(), batch: int | None = None, *, config: dict | None = None,
            loss_steps: int = LOSS_STEPS, timed: bool = True, warmup: int | None = None,
            budget_s: float | None = None, max_repeat: int | None = None, monitor: bool = False,
            floors: Sequence[str] = (), check: Check | None = None, own_floor: bool = False,
            device: torch.device | None = None, seed: int = 0, scale: str | None = None) -> JobResult:
    """Train `job` with `options` from the weights seed `seed` gives: `loss_steps` updates whose losses are
    kept, then (if `timed`) `benchmark` times further steps: `warmup` untimed, then as many as fit about
    `budget_s` seconds (at most `max_repeat`). Inside `memory_guard`: GPU memory goes back to where it was.

    `scale` ("tiny" or "full"; None: the course's) picks the defaults: `config` (the job's sizes,
    `job_config(job, scale)`), `budget_s` and `max_repeat` (`config(scale)`); `batch` defaults to the
    config's batch. With `monitor`, a `GpuMonitor` samples GPU busy % during the timed steps (then
    `budget_s` defaults to `monitor_budget_s`, longer at full size: NVML averages busy % over windows of
    up to a second). The loss steps warm up the step (the first compiles it, the next ones record CUDA
    graphs), so `warmup` defaults to one more.

    Correct before fast: the run keeps a `checks.Sample` (its parameters before and after the loss steps and
    its first update's gradients, at fixed positions). An update GradScaler skips (inf or NaN gradients) is
    tried again on its batch until it is applied (at most SKIP_RETRIES times), and counted in
    `skipped_updates`, so every run makes `loss_steps` updates on the same batches. `floors` (a reference
    run's, `checks`): "reorder", the same updates again from the same weights with each batch's rows in
    another order, and formats of `checks.FORMATS`, the first update's gradients with the weights rounded to
    each. `check(losses, skipped, sample, own_floor)` returns the comparisons (`checks.Part`) before anything is
    timed; a run that fails one is not timed (`time` None, and a note says why). With `own_floor`, the run keeps
    its starting weights, and `own_floor()` (None without) gives its sample with its own "reorder" floor,
    measured only if the check asks for it. A combination no device runs, or one this device cannot, raises
    ValueError with the reason.
    """
    device = device or pick_device()
    size = resolve_scale(scale)
    knobs = CONFIG[size]                          # not `config(scale)`: the argument `config` hides it here
    cfg = dict(config or job_config(job, size))
    batch = batch or cfg["batch"]
    if loss_steps < 1:
        raise ValueError(f"loss_steps must be >= 1 (got {loss_steps}).")
    unknown = [f for f in floors if f != "reorder" and f not in K.FORMATS]
    if unknown:
        raise ValueError(f"floors: {unknown} are not 'reorder' or one of {', '.join(K.FORMATS)}.")
    warmup = 1 if warmup is None else warmup
    budget_s = knobs["monitor_budget_s" if monitor else "budget_s"] if budget_s is None else budget_s
    max_repeat = knobs["max_repeat"] if max_repeat is None else max_repeat
    flops = model_flops(job, cfg, batch, device)
    sampled(job, cfg)                             # the checks' positions, once per configuration (cached)
    with _run(job, options, batch, device) as guard:
        out = _train(job, options, batch, cfg, loss_steps, timed, warmup, budget_s, max_repeat, monitor,
                     tuple(floors), check, own_floor, device, seed)
    notes = out.pop("notes")
    if not guard.ok:
        notes.append(guard.message())
    return JobResult(job=job, options=options, batch=batch, unit=JOBS[job].unit,
                     items_per_step=batch * JOBS[job].items(cfg), flops_per_step=flops, notes=tuple(notes),
                     device=str(device), **out)


@contextlib.contextmanager
def _run(job: str, options: Options, batch: int, device: torch.device):
    """What every run of a job shares (`run_job`, `training_step`, `time_to_loss`): refused with `problem`'s
    reason where it cannot run here; inside, the run's fp32 math mode and `memory_guard` (yielded: GPU memory
    goes back to where it was); on the way out, the run's compiled code and CUDA graphs forgotten (and
    their memory)."""
    why = problem(job, options, batch, device_facts(device))
    if why:
        raise ValueError(why)
    with memory_guard(quiet=True, device=device) as guard, P.fp32_math("tf32" if options.tf32 else "ieee"):
        try:
            yield guard
        finally:
            if options.compile:
                torch.compiler.reset()


@dataclass
class Trainer:
    """A job's model as `options` change it, its AdamW, its GradScaler (fp16) and `train(x, y)`: one update."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    train: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _built(job: str, options: Options, cfg: dict, batch: int, device: torch.device, seed: int):
    """`job`'s model from the weights seed `seed` gives, its POOL batches (made on the device from the model
    as built, kept in host memory), then `_trainer`'s changes: (Trainer, pool)."""
    torch.manual_seed(seed)
    model = JOBS[job].build(cfg, device)
    pool = [(x.cpu(), y.cpu()) for x, y in JOBS[job].batches(model, batch, POOL)]
    return _trainer(job, options, model, device), pool


def _trainer(job: str, options: Options, model: nn.Module, device: torch.device) -> Trainer:
    """`model` as `options` change it (the padded vocabulary, checkpointed blocks, channels_last), its
    GradScaler (fp16) and `train(x, y)`: one `train_step` with AdamW (fused or not), autocast, the compiled
    loss (torch.compile, with CUDA graphs under reduce-overhead) and accumulation."""
    spec = JOBS[job]
    if options.aligned:
        model = padded_copy(model, ALIGN)            # same weights, zero rows for the padding tokens
    if options.fp8:
        P.to_fp8_training(model.blocks)              # the blocks' linear products; the head stays in autocast's bf16
    if options.checkpointing:
        model.blocks = CheckpointedBlocks(model.blocks)
    if options.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, fused=True if options.fused else None)
    scaler = P.make_scaler("fp16", device) if options.amp == "fp16" else None

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return spec.loss_fn(model, x, y)

    if options.compile:
        loss_of = torch.compile(loss_of, mode=options.compile_mode)

    def train(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return train_step(model, x, y, loss=lambda _, xs, ys: loss_of(xs, ys), optimizer=optimizer,
                          precision=AMP_DTYPES[options.amp], scaler=scaler,
                          accumulation=options.accumulation, graphs=options.cuda_graphs)
    return Trainer(model, optimizer, scaler, train)


def _update(trainer: Trainer, x: torch.Tensor, y: torch.Tensor, step: int, skipped: list[int]) -> float:
    """One update on (x, y), its loss. An update GradScaler skips (its scale falls) is tried again on the
    same batch, at most SKIP_RETRIES times; `step` is appended to `skipped` for each skip."""
    for _ in range(SKIP_RETRIES + 1):
        before = trainer.scaler.get_scale() if trainer.scaler is not None else None
        loss = trainer.train(x, y).item()
        if before is None or trainer.scaler.get_scale() >= before:
            break
        skipped.append(step)
    return loss


def _train(job: str, options: Options, batch: int, cfg: dict, loss_steps: int, timed: bool, warmup: int,
           budget_s: float, max_repeat: int, monitor: bool, floors: tuple[str, ...], check: Check | None,
           own_floor: bool, device: torch.device, seed: int) -> dict:
    notes: list[str] = []
    skips = cudagraph_skips()
    allocated = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    positions, _ = sampled(job, cfg)
    with track_peak(device) as mem:
        trainer, pool = _built(job, options, cfg, batch, device, seed)
        params = list(trainer.model.parameters())
        if len(params) != len(positions):
            raise RuntimeError(f"{options.label}: the model has {len(params)} parameter tensors where {job}'s has "
                               f"{len(positions)}: a toggle changed the model's parameters, which the checks compare")
        first_scale = trainer.scaler.get_scale() if trainer.scaler is not None else None
        start = [p.detach().to("cpu", copy=True) for p in params] if floors or own_floor else None
        p0 = K.take(params, positions)
        monitor_status, busy, parts, skipped = "", None, (), []
        with Inputs(pool, device, options.loader, options.channels_last) as inputs:
            with stopwatch(device=device) as first:
                losses = [_update(trainer, *inputs.next(), 0, skipped)]     # the first step compiles, if compile is on
            g1 = K.take([p.grad for p in params], positions)
            losses += [_update(trainer, *inputs.next(), i, skipped) for i in range(1, loss_steps)]
            sample = K.Sample(p0, g1, K.take(params, positions))
            floor = functools.partial(_floor_samples, trainer, start=start, batches=pool[:loss_steps], device=device,
                                      channels_last=options.channels_last, chunks=options.accumulation,
                                      positions=positions)
            if floors:
                sample = floor(sample, floors=floors)

            def with_own_floor() -> K.Sample:
                nonlocal sample
                if sample.reordered is None:
                    sample = floor(sample, floors=("reorder",))
                return sample
            if check is not None:
                parts = tuple(check(tuple(losses), tuple(skipped), sample, with_own_floor if own_floor else None))
                failed = [p for p in parts if not p.ok]
                if failed:
                    timed = False
                    notes.append("not timed: " + "; ".join(p.why for p in failed))
            del start, floor                # the host copies of the starting weights
            t = None
            if timed:
                mon = None
                if monitor:
                    from gpulab.core.monitor import GpuMonitor
                    mon = GpuMonitor(interval_s=0.05, pcie=False, device=device).start()
                try:
                    t = benchmark(lambda: trainer.train(*inputs.next()), warmup=warmup, budget_s=budget_s,
                                  max_repeat=max_repeat, device=device)
                finally:
                    if mon is not None:
                        mon.stop()
                        busy, monitor_status = mon.mean("busy_pct"), mon.status
        trainer.model.zero_grad(set_to_none=True)
    if options.cuda_graphs and cudagraph_skips() > skips:
        notes.append(f"CUDA graphs NOT applied: torch.compile skipped them {cudagraph_skips() - skips} time(s) "
                     "(its log above says why); this row ran compiled code without graphs.")
    peak = None if mem.peak is None else mem.peak - allocated
    return {"losses": tuple(losses), "time": t, "peak_bytes": peak, "first_step_ms": first.ms,
            "busy_pct": busy, "monitor_status": monitor_status, "notes": notes, "skipped_updates": tuple(skipped),
            "first_scale": first_scale, "sample": sample, "parts": parts}


def _floor_samples(trainer: Trainer, sample: K.Sample, *, start: list, batches: list, floors: tuple[str, ...],
                   device: torch.device, channels_last: bool, chunks: int, positions: list) -> K.Sample:
    """`sample` with a reference run's noise floors (`checks`), each from the starting weights `start` (host
    copies; the optimizer's state cleared, the gradients dropped): "reorder", the same updates on `batches`
    with each batch's rows in another order (`checks.rows_order`, within each of `chunks` micro-batches), and
    its parameters after them (added to `sample`'s); each format,
    the first update's gradients with the weights rounded to it (`checks.round_weights`). The loader is not
    used: the floors are the arithmetic's, and the batches are the same."""
    params = list(trainer.model.parameters())

    def restart() -> None:
        with torch.no_grad():
            for p, w in zip(params, start):
                p.copy_(w)
        trainer.optimizer.state.clear()
        trainer.model.zero_grad(set_to_none=True)

    def on_device(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = x.to(device), y.to(device)
        return (x.contiguous(memory_format=torch.channels_last) if channels_last else x), y

    reordered, rounded = sample.reordered, dict(sample.rounded)
    if "reorder" in floors:
        restart()
        perm = K.rows_order(batches[0][0].shape[0], chunks)
        for i, (x, y) in enumerate(batches):
            _update(trainer, *on_device(x[perm], y[perm]), i, [])
        reordered = K.take(params, positions)
    for fmt in (f for f in floors if f != "reorder"):
        restart()
        K.round_weights(trainer.model, fmt)
        trainer.train(*on_device(*batches[0]))
        rounded[fmt] = K.take([p.grad for p in params], positions)
    return dataclasses.replace(sample, reordered=reordered, rounded=rounded)


# -- correct before fast -----------------------------------------------------------------------------
def loss_tolerance(job: str, options: Options) -> tuple[float, str]:
    """(largest accepted relative loss difference to the fp32 reference, why) over the first LOSS_STEPS steps.

    - 16-bit autocast: products round their inputs to 8 (bf16) or 11 (fp16) significant bits, up to 4e-3
      each; through tens of layers and two AdamW updates the loss moves by a few of those: 3e-2.
    - TF32 (10-bit mantissa inputs, fp32 sums): 1e-2.
    - FP8 (the blocks' linear products on e4m3 inputs and e5m2 gradients, one scale per tensor):
      `precision.FP8_TOLERANCE`, a single forward product's bound, 6e-2.
    - fp32 throughout: only the order of sums changes (memory layout, fused kernels, compiled code): 2e-3.

    Loose on purpose, and the weakest of the four comparisons (`Runs.parts`): the losses see a run gone wrong,
    not a dropped gradient (zeroing every FP8 weight gradient moved the tiny GPT's loss by 0.2 %).
    """
    if options.fp8:
        return P.FP8_TOLERANCE, ("FP8 rounds each linear product's inputs to 3 mantissa bits: a product is off by "
                                 "up to about 6 %")
    if options.amp != "none":
        return 3e-2, f"{options.amp} autocast rounds products to 16 bits"
    if options.tf32:
        return 1e-2, "TF32 rounds product inputs to 10 mantissa bits"
    return 2e-3, "fp32 throughout: only the order of sums differs"


def reference_options(job: str, options: Options) -> Options:
    """The fp32 run `options` is compared with: the baseline, except that the CNN keeps its accumulation.
    BatchNorm normalizes each micro-batch with that micro-batch's own statistics, so for the CNN splitting
    the batch changes the arithmetic (by several percent at the tiny size) and belongs to the model; the GPT
    has no batch statistics, and its split batch is checked against the whole one."""
    return Options(accumulation=options.accumulation) if job == "cnn" else Options()


def systems_only(options: Options) -> Options:
    """`options` with its numerics toggles off (TF32, autocast, FP8): its systems toggles alone, in fp32."""
    return dataclasses.replace(options, tf32=False, amp="none", fp8=False)


def numerics_format(options: Options) -> str | None:
    """The coarsest number format `options` computes in (`checks.FORMATS`), None for fp32 throughout."""
    return "fp8" if options.fp8 else options.amp if options.amp != "none" else "tf32" if options.tf32 else None


TIERS = ("The checks, each against the fp32 reference from the same weights on the same batches "
         f"(`capstone.checks`): losses of the first {LOSS_STEPS} updates; how far each tensor moved (within "
         f"{1 / K.MOVE_MAX:g} to {K.MOVE_MAX:g} times the reference's); systems toggles, in fp32, their parameters "
         f"after {LOSS_STEPS} updates within {K.SYSTEMS_MAX:g}x the noise floor of the runs with their batch rows "
         f"reordered; numerics toggles (tf32, amp, fp8), the first update's gradients within {K.NUMERICS_MAX:g}x "
         "the reference's own rounding to the run's format. Each figure is the share of its allowance used "
         "(at most 1 passes).")


@dataclass(frozen=True)
class Checked:
    """A run and its checks against its fp32 reference (`Runs.parts`) on the same batches."""

    result: JobResult | None
    status: str                  # "baseline", "ok", "mismatch", "out of memory", "skipped: ..."
    parts: tuple[K.Part, ...] = ()
    why: str = ""

    @property
    def counted(self) -> bool:
        """Whether its time counts: the baseline itself, or a run that passed every check."""
        return self.status in ("baseline", "ok")

    @property
    def summary(self) -> str:
        """Each check's share of its allowance, for a table cell ("-" without checks)."""
        return ", ".join(f"{p.name} {p.used:.2g}" for p in self.parts) or "-"

    def part(self, name: str) -> K.Part | None:
        return next((p for p in self.parts if p.name == name), None)


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


class Runs:
    """Every run of a notebook, memoized by (job, options, batch, ...): a configuration runs once.

        runs = Runs()
        runs("gpt", Options(amp="bf16"))                 # a JobResult
        runs.checked("gpt", Options(amp="bf16"))         # the same, with its checks

    `checked` compares the run with its fp32 reference at the same batch (`reference_options`: its timed run
    if there is one, else an untimed run), which keeps its noise floors, and keeps every check in `checks`.
    A run with systems toggles under 16-bit or TF32 has them checked in fp32 first, by an untimed run.

    All runs are at one `scale` ("tiny" or "full"; None: the course's, read once here): it gives the
    jobs' sizes that `configs` leaves out, and every run's timing budget (`run_job(..., scale=)`).
    """

    def __init__(self, configs: dict[str, dict] | None = None, runner: Callable[..., JobResult] = run_job,
                 scale: str | None = None, **run_kw: Any):
        self.scale = resolve_scale(scale)
        self.configs = {job: dict((configs or {}).get(job) or job_config(job, self.scale)) for job in JOBS}
        self.runner, self.run_kw = runner, run_kw
        self.results: dict[tuple, JobResult] = {}
        self.checks: list[tuple[str, Checked]] = []
        self.lowered: dict[str, str] = {}          # job -> why `fit_batches` lowered its batch
        self._formats: dict[str, tuple[str, ...]] = {}

    def batch(self, job: str, batch: int | None = None) -> int:
        return batch or self.configs[job]["batch"]

    def floors(self, job: str) -> tuple[str, ...]:
        """The noise floors a reference run of `job` keeps (`checks`): its rows reordered, and its rounding to
        each format the notebook trains `job` in here: TF32 where it runs, the 16-bit type `best_half` picks,
        FP8 for the GPT where it runs. Another format (fp16 on a GPU with bf16, in the panel) is measured when a
        run asks for it (`rounded`)."""
        if job not in self._formats:
            facts = device_facts()
            fmts = [f for f in ("tf32", P.best_half(facts)) if P.refusal(f, facts) is None]
            if job == "gpt" and P.fp8_refusal(facts) is None:
                fmts.append("fp8")
            self._formats[job] = ("reorder", *fmts)
        return self._formats[job]

    def fit_batches(self, jobs: Sequence[str] | None = None, cap: int = MEMORY_CAP) -> int | None:
        """Fit each job to this GPU, on a GPU (None on the CPU, where nothing changes; else the memory
        budget, min(cap, half the free GPU memory)), saying in `lowered` what changed and why:

        1. the model: while its fp32 training state (weights, gradients and AdamW's two moments: 16
           bytes a parameter) would take over STATE_SHARE of the budget, halve its width (and heads,
           so a head stays 128 wide) down to 1024, then its blocks down to 2 (`fit_model`): the
           full GPT's 0.6 G parameters need 9.8 GB before any activation, more than half a T4's;
        2. the batch: halved until the fp32 baseline step fits the budget, extrapolated from two small
           untimed steps (`sizing.fit_batch`, at 1/8 and 1/4 of the batch);
        3. the time: halved while that step, its FLOPs (counted on the small steps) over STEP_SHARE of
           this GPU's fp32 matmul ceiling, would take longer than the scale's `step_s`, so a slow
           GPU finishes the notebook in about the time a fast one does.
        """
        budget = memory_budget(cap=cap)
        if budget is None:
            return None
        step_s = CONFIG[self.scale].get("step_s")
        fp32 = ceilings().get("matmul_fp32") if step_s else None
        for job in jobs or tuple(self.configs):
            why = []
            fitted, said = fit_model(job, self.configs[job], int(STATE_SHARE * budget))
            if said:
                self.configs[job] = fitted
                why.append(said)
            wanted = self.configs[job]["batch"]
            probe = max(1, wanted // 8)
            batch = fit_batch(lambda b: self(job, Options(), b, timed=False).peak_bytes, wanted, budget, probe=probe)
            if batch < wanted:
                why.append(f"batch {wanted} -> {batch}: memory budget {budget / 2**30:.1f} GiB")
            if fp32 is not None:
                small = self(job, Options(), probe, timed=False)          # fit_batch's first probe, memoized
                per_sample = small.flops_per_step / small.batch
                seconds = lambda b: b * per_sample / (STEP_SHARE * fp32.value * 1e12)
                before = batch
                while batch > 1 and seconds(batch) > step_s:
                    batch //= 2
                if batch < before:
                    why.append(f"batch {before} -> {batch}: an fp32 step of {before} would take about "
                               f"{seconds(before):.1f} s at {STEP_SHARE:.0%} of this GPU's {fp32.value:.1f} "
                               f"TFLOP/s fp32 ({fp32.source}), over {step_s} s")
            self.configs[job]["batch"] = batch
            if why:
                self.lowered[job] = "; ".join(why)
        return budget

    def __call__(self, job: str, options: Options = Options(), batch: int | None = None, *, timed: bool = True,
                 monitor: bool = False, floors: Sequence[str] = (), check: Check | None = None,
                 own_floor: bool = False) -> JobResult:
        """The run's result, run now if it has not run before (`floors`, `check`, `own_floor`: `run_job`'s)."""
        batch = self.batch(job, batch)
        key = (job, options, batch, timed, monitor, tuple(floors), own_floor)
        if key not in self.results:
            self.results[key] = self.runner(job, options, batch, config=self.configs[job], scale=self.scale,
                                            timed=timed, monitor=monitor, floors=tuple(floors), check=check,
                                            own_floor=own_floor, **self.run_kw)
        return self.results[key]

    def reference(self, job: str, batch: int | None = None, options: Options = Options()) -> JobResult:
        """The fp32 reference run of `options` (`reference_options`) at `batch`, with its noise floors
        (`floors`): a timed run if there is one, else an untimed run of LOSS_STEPS steps."""
        batch = self.batch(job, batch)
        ref, floors = reference_options(job, options), self.floors(job)
        for (j, o, b, timed, _, f, _), r in self.results.items():
            if (j, o, b, f) == (job, ref, batch, floors) and timed:
                return r
        return self(job, ref, batch, timed=False, floors=floors)

    def rounded(self, job: str, ref: JobResult, fmt: str) -> list | None:
        """The reference's first-update gradients with its weights rounded to `fmt` (the numerics floor): kept
        by the reference run where `floors` names `fmt`, else measured now by an untimed run of it."""
        if ref.sample is None:
            return None
        if fmt not in ref.sample.rounded:
            extra = self(job, ref.options, ref.batch, timed=False, floors=(fmt,))
            return extra.sample.rounded[fmt] if extra.sample is not None else None
        return ref.sample.rounded[fmt]

    def parts(self, job: str, options: Options, ref: JobResult, losses: Sequence[float], sample: K.Sample | None,
              systems: K.Part | None = None, own_floor: Callable[[], K.Sample] | None = None) -> list[K.Part]:
        """The checks of a run with `options` against its reference `ref` (`capstone.checks`): its losses;
        with samples (a test's runner keeps none), how far each tensor moved; its systems toggles (`systems`,
        found by an fp32 run of them, or measured here where this run is that fp32 run: against the reference's
        noise floor, and its own too (`own_floor`) where the first alone does not pass); its numerics toggles."""
        tol, tol_why = loss_tolerance(job, options)
        out = [K.losses(ref.losses, losses, tol, tol_why)]
        if sample is None or ref.sample is None:
            return out + ([systems] if systems else [])
        _, names = sampled(job, self.configs[job])
        out.append(K.movement(ref.sample.p0, ref.sample.pk, sample.pk, names))
        if systems is None and systems_only(options) == options:
            systems = self.systems_part(ref, sample, options, own_floor)
        if systems is not None:
            out.append(systems)
        fmt = numerics_format(options)
        if fmt is not None:
            floor = self.rounded(job, ref, fmt)
            out.append(K.numerics(ref.sample.g1, sample.g1, floor, names, fmt) if floor is not None else
                       K.Part("numerics", False, math.inf, f"the reference kept no {fmt} floor"))
        return out

    def systems_part(self, ref: JobResult, sample: K.Sample, fp32: Options,
                     own_floor: Callable[[], K.Sample] | None = None) -> K.Part:
        """`checks.systems`: an fp32 run's parameters after LOSS_STEPS updates against the reference's, within
        SYSTEMS_MAX times the noise floor of the reference with its batch rows reordered; where that alone
        does not pass, the run's own floor too (`own_floor()`: the run measures it then). A toggle that
        reorders the sums inside every product (channels_last's convolution kernels) moves the parameters
        further than reordering the batch's rows does, and the run with its own rows reordered measures that."""
        what = f"the fp32 run with {' + '.join(fp32.on())}"
        part = K.systems(ref.sample.p0, ref.sample.pk, sample.pk, [(ref.sample.reordered, ref.sample.pk)],
                         LOSS_STEPS, what)
        if part.ok or own_floor is None:
            return part
        sample = own_floor()
        return K.systems(ref.sample.p0, ref.sample.pk, sample.pk, [(ref.sample.reordered, ref.sample.pk),
                                                                   (sample.reordered, sample.pk)], LOSS_STEPS, what)

    def checked(self, job: str, options: Options = Options(), batch: int | None = None, *,
                monitor: bool = False) -> Checked:
        """The run, checked against its fp32 reference (`parts`) before it is timed; out of memory becomes a
        status. A run with systems toggles under 16-bit or TF32 has them checked first, by an untimed fp32 run
        of them alone (`systems_only`): in 16-bit, rounding would hide what they change."""
        try:
            ref_options = reference_options(job, options)
            if options == ref_options:
                out = Checked(self(job, options, batch, monitor=monitor, floors=self.floors(job)), "baseline",
                              why="the fp32 reference itself")
            else:
                ref = self.reference(job, batch, options)
                fp32, systems = systems_only(options), None
                if fp32 not in (options, ref_options):
                    def systems_check(losses: tuple, skipped: tuple, sample: K.Sample, own) -> list[K.Part]:
                        return [] if ref.sample is None else [self.systems_part(ref, sample, fp32, own)]
                    s = self(job, fp32, batch, timed=False, own_floor=True, check=systems_check)
                    systems = s.parts[0] if s.parts else None

                def check(losses: tuple, skipped: tuple, sample: K.Sample, own) -> list[K.Part]:
                    return self.parts(job, options, ref, losses, sample, systems, own)
                result = self(job, options, batch, monitor=monitor, own_floor=fp32 == options, check=check)
                parts = result.parts or tuple(self.parts(job, options, ref, result.losses, result.sample, systems))
                said = K.skipped_text(result.skipped_updates, result.first_scale)
                failed = [p.why for p in parts if not p.ok]
                why = "; ".join(([said] if said else []) + (failed or [p.why for p in parts]))
                out = Checked(result, "mismatch" if failed else "ok", parts, why)
        except torch.OutOfMemoryError as err:
            out = Checked(None, "out of memory", why=str(err).splitlines()[0])
            del err
        self.checks.append((f"{job}: {options.label} (batch {self.batch(job, batch)})", out))
        return out

    def mismatches(self) -> list[str]:
        """Every checked run that did not train the same model as its reference (`checked`'s "mismatch")."""
        return [name for name, c in self.checks if c.status == "mismatch"]


# -- the waterfall -----------------------------------------------------------------------------------
@dataclass
class Step:
    """One row of a waterfall: a toggle added to the options of the row before."""

    label: str
    options: Options
    checked: Checked
    speedup: float | None = None         # throughput / the first row's
    gain: float | None = None            # throughput / the previous counted row's
    share_pct: float | None = None       # share of the total speed-up, log space
    memory_saved: int | None = None      # peak bytes: previous counted row's minus this one's
    memory_share_pct: float | None = None

    @property
    def status(self) -> str:
        return self.checked.status

    @property
    def result(self) -> JobResult | None:
        return self.checked.result

    @property
    def counted(self) -> bool:
        return self.checked.counted


def waterfall(job: str, order: Sequence[str] | None = None, runs: Runs | None = None, base: Options = Options(),
              batch: int | None = None, facts: DeviceFacts | None = None, half: str | None = None,
              backend: str | None = None, monitor: bool = False) -> list[Step]:
    """Start from `base` and add each toggle of `order` in turn (cumulative), one run per row.

    A toggle this device or job cannot take is a "skipped: why" row and is not kept; a run that does not
    train the same model as its fp32 reference (`Runs.checked`) is a "mismatch" row: its time is not counted
    and its toggle is not kept. With `monitor`, every row's GPU busy % is sampled while it is timed (NVML;
    `accumulation_notes` reads it). Then `attribute` fills in speed-ups and shares.
    """
    runs = runs or Runs()
    facts = facts or device_facts()
    half = half or P.best_half(facts)
    order = ORDERS[job] if order is None else tuple(order)
    batch = runs.batch(job, batch)
    first = runs.checked(job, base, batch, monitor=monitor)
    steps = [Step("baseline" if base == Options() else base.label, base, first)]
    current = base
    for toggle in order:
        candidate = current.adding(toggle, half)
        why = problem(job, candidate, batch, facts, backend)
        if why:
            steps.append(Step(f"+ {toggle}", candidate, Checked(None, f"skipped: {why}")))
            continue
        c = runs.checked(job, candidate, batch, monitor=monitor)
        steps.append(Step(f"+ {toggle}", candidate, c))
        if c.counted:
            current = candidate
    return attribute(steps)


def attribute(steps: list[Step]) -> list[Step]:
    """Fill in each counted row's speed-up, gain and share of the total speed-up and memory saved.

    Shares of speed are taken in log space: with gains g_i from one counted row to the next, the total
    is their product, so log g_i / log total add up to 100% (a row that slows things down has a negative
    share). Memory shares are plain differences of peak memory over the total difference. A share is None
    where the total is too close to 1 (or 0 bytes) to divide by.
    """
    counted = [s for s in steps if s.counted and s.result is not None and s.result.items_per_s]
    if not counted:
        return steps
    base_rate = counted[0].result.items_per_s
    total = counted[-1].result.items_per_s / base_rate
    peaks = [s.result.peak_bytes for s in counted]
    have_memory = all(p is not None for p in peaks)
    memory_total = peaks[0] - peaks[-1] if have_memory else None
    previous = None
    for s in counted:
        rate = s.result.items_per_s
        s.speedup = rate / base_rate
        if previous is None:
            previous = s
            continue
        s.gain = rate / previous.result.items_per_s
        s.share_pct = 100 * math.log(s.gain) / math.log(total) if abs(math.log(total)) > 1e-9 else None
        if have_memory:
            s.memory_saved = previous.result.peak_bytes - s.result.peak_bytes
            s.memory_share_pct = 100 * s.memory_saved / memory_total if memory_total else None
        previous = s
    return steps


def fastest(steps: Sequence[Step]) -> Step:
    """The counted row with the highest throughput."""
    counted = [s for s in steps if s.counted and s.result is not None and s.result.items_per_s]
    if not counted:
        raise ValueError("no counted rows")
    return max(counted, key=lambda s: s.result.items_per_s)


def all_on(job: str, batch: int | None = None, facts: DeviceFacts | None = None, order: Sequence[str] | None = None,
           half: str | None = None, backend: str | None = None) -> Options:
    """Every toggle of `order` (default: the job's waterfall) this device and job accept, added in turn."""
    facts = facts or device_facts()
    half = half or P.best_half(facts)
    options = Options()
    for toggle in ORDERS[job] if order is None else order:
        candidate = options.adding(toggle, half)
        if problem(job, candidate, batch, facts, backend) is None:
            options = candidate
    return options


# -- a bigger batch: the per-step part amortized -------------------------------------------------------
LADDER = (4, 8)          # the batches `batch_ladder` adds: these multiples of the waterfall's batch
LADDER_TOLERANCE = 0.15  # a predicted row's measured time within this share of the line's prediction


@dataclass
class LadderRow:
    """One batch of `batch_ladder`: its run (None where it did not run, with `why`), the time the line through
    the rows before it predicted (None for the rows that draw the line), and the memory it was expected to take."""

    batch: int
    result: JobResult | None
    predicted_ms: float | None = None
    predicted_bytes: float | None = None
    why: str = ""

    @property
    def ratio(self) -> float | None:
        """Measured over predicted step time (None without both)."""
        if self.result is None or self.result.step_ms is None or not self.predicted_ms:
            return None
        return self.result.step_ms / self.predicted_ms


def step_line(rows: Sequence[LadderRow]) -> tuple[float, float] | None:
    """(ms per step, ms per sample) of the line t(B) = per_step + B x per_sample through the first two rows
    that ran: a step's time is a part that does not grow with the batch (AdamW reading and writing every
    weight, its gradient and both moments; autocast's casts of the weights; the host's launches where
    they are not hidden) and a part that does (every product, norm and activation). None with fewer than two."""
    ran = [r for r in rows if r.result is not None and r.result.step_ms is not None][:2]
    if len(ran) < 2 or ran[0].batch == ran[1].batch:
        return None
    (b0, t0), (b1, t1) = ((r.batch, r.result.step_ms) for r in ran)
    per_sample = (t1 - t0) / (b1 - b0)
    return t0 - b0 * per_sample, per_sample


def batch_ladder(runs: "Runs", options: Options, job: str = "gpt", factors: Sequence[int] = LADDER,
                 budget: int | None = None, step_s: float | None = None) -> list[LadderRow]:
    """The step of `options` at the runs' batch B and at B x each of `factors`: the same code, so the loss
    check of B stands for all (the batch changes how many samples a step averages, not the arithmetic per
    sample). A batch runs only where it is expected to fit `budget` bytes (peak memory extrapolated along a
    line through the rows before it; from one row, the fp32 training state (`state_bytes`) fixed and the rest
    in proportion) and, with `step_s`, where its step is expected to take at most that long. From the third row on,
    the time `step_line` predicts from the first two is kept beside the measured one."""
    base = runs.batch(job)
    rows = [LadderRow(base, runs(job, options))]
    for f in factors:
        b = base * f
        done = [r for r in rows if r.result is not None and r.result.step_ms is not None]
        line = step_line(rows)
        predicted = None if line is None else line[0] + b * line[1]
        mem = [(r.batch, r.result.peak_bytes) for r in done if r.result.peak_bytes]
        if len(mem) >= 2:
            (m0b, m0), (m1b, m1) = mem[-2:]
            need = m1 + (b - m1b) * (m1 - m0) / (m1b - m0b)
        elif mem:           # from one row: the training state stays, the rest grows with the batch
            fixed = min(state_bytes(job, runs.configs[job]), mem[-1][1])
            need = fixed + (mem[-1][1] - fixed) * b / mem[-1][0]
        else:
            need = None
        guess = predicted if predicted is not None else (done[-1].result.step_ms * b / done[-1].batch if done else None)
        if budget is not None and need is not None and need > budget:
            rows.append(LadderRow(b, None, predicted, need, f"expected to need {need / 2**30:.1f} GiB, over the "
                                                          f"memory budget of {budget / 2**30:.1f} GiB"))
            continue
        if step_s is not None and guess is not None and guess > 1e3 * step_s:
            rows.append(LadderRow(b, None, predicted, need, f"a step expected to take {guess / 1e3:.2g} s, over "
                                                          f"{step_s} s"))
            continue
        try:
            rows.append(LadderRow(b, runs(job, options, b), predicted, need))
        except torch.OutOfMemoryError as err:
            rows.append(LadderRow(b, None, predicted, need, "out of memory: " + str(err).splitlines()[0]))
            del err
    return rows


def ladder_rows(rows: Sequence[LadderRow], peak: Ceiling | None, sheet_peak: float | None = None) -> list[tuple]:
    """The ladder as table rows: batch, step ms, predicted ms, tokens (or images) per second, model TFLOP/s,
    its fraction of the measured peak (`peak`) and its MFU (of the datasheet's `sheet_peak`)."""
    out = []
    for r in rows:
        res = r.result
        if res is None or res.time is None:
            out.append((r.batch, "-", "-" if r.predicted_ms is None else f"{r.predicted_ms:.4g}", "-", "-", "-", "-",
                        r.why or "not timed"))
            continue
        share, sheet = peak_fraction(res, peak), mfu(res, sheet_peak)
        out.append((r.batch, f"{res.step_ms:.4g}", "-" if r.predicted_ms is None else f"{r.predicted_ms:.4g}",
                    f"{res.items_per_s:,.0f}", f"{res.tflops:,.4g}", _pct(None if share is None else 100 * share),
                    _pct(None if sheet is None else 100 * sheet), _gib(res.peak_bytes)))
    return out


LADDER_HEADER = ("batch", "step ms", "predicted ms", "per s", "model TFLOP/s", "of measured peak",
                 "MFU (of datasheet)", "peak memory / why not")


# -- FP8 in the step: its gradients first ------------------------------------------------------------
# The worst relative difference of a block weight's gradient, FP8 against bf16 from the same weights on one
# batch (`fp8_gradients`). e4m3 inputs and e5m2 gradients gave 8 % (2 blocks, 64 wide) and 10 % (6 blocks,
# 256 wide) on the CPU (torch 2.13); a zero, transposed or mis-scaled gradient gives 50 % and more. The loss
# check cannot tell: two AdamW updates moved the tiny GPT's loss by 1.4 %, and zeroing every FP8 weight
# gradient changed it by 0.2 %.
FP8_GRAD_CHECK = 0.3


def fp8_gradients(options: Options, batch: int = 2, *, config: dict | None = None, scale: str | None = None,
                  seed: int = 0, device: torch.device | None = None) -> float:
    """The worst relative difference (norm of the difference over the bf16 gradient's norm) between the GPT's
    block weight gradients with `options` (fp8 on) and with the same options without fp8: the same weights
    (seed `seed`), one batch of `batch` sequences, one backward each, eager. Inside `_run`: refused with its
    reason where `options` cannot run here, GPU memory back where it was."""
    if not options.fp8:
        raise ValueError("fp8_gradients compares a run with fp8 on against the same without it: switch fp8 on")
    device = device or pick_device()
    cfg = dict(config or job_config("gpt", scale))
    with _run("gpt", options, batch, device):
        torch.manual_seed(seed)
        model = JOBS["gpt"].build(cfg, device)
        if options.aligned:
            model = padded_copy(model, ALIGN)
        fp8 = copy.deepcopy(model)
        P.to_fp8_training(fp8.blocks)
        x, y = JOBS["gpt"].batches(model, batch, 1)[0]
        for m in (model, fp8):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                JOBS["gpt"].loss_fn(m, x, y).backward()
        worst = 0.0
        for (name, p), (_, q) in zip(model.blocks.named_parameters(), fp8.blocks.named_parameters()):
            if p.dim() == 2:
                worst = max(worst, ((q.grad - p.grad).norm() / p.grad.norm().clamp(min=1e-30)).item())
        del model, fp8, x, y
    return worst


# -- what keeps a step from the peak -----------------------------------------------------------------
class _Step:
    """The step `training_step` yields; released on the way out, so a name still bound to it holds no model."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self):
        if self.fn is None:
            raise RuntimeError("this training step was released when its `with training_step(...)` block ended")
        return self.fn()


@contextlib.contextmanager
def training_step(job: str, options: Options, batch: int | None = None, *, scale: str | None = None,
                  seed: int = 0, device: torch.device | None = None, cfg: dict | None = None):
    """`job`'s training step with `options`, as a callable with no arguments (fetch a batch, forward,
    backward, update), the step `run_job` times: for `gpulab.diagnose`, which says where its time goes.
    `cfg`: the job's configuration (the one `Runs` fitted to this GPU, `runs.configs[job]`; default: the
    scale's). Inside `memory_guard`; the model and compiled code are released on the way out (issue 40: a
    notebook name left bound to the step held a 611 M-parameter GPT for the rest of notebook 13). ValueError
    where it cannot run."""
    device = device or pick_device()
    cfg = dict(cfg) if cfg is not None else job_config(job, scale)
    batch = batch or cfg["batch"]
    with _run(job, options, batch, device):
        trainer, pool = _built(job, options, cfg, batch, device, seed)
        with Inputs(pool, device, options.loader, options.channels_last) as inputs:
            step = _Step(lambda: trainer.train(*inputs.next()))
            try:
                yield step
            finally:
                step.fn = None
                del trainer, pool


# -- FP8: from which size it beats bf16 --------------------------------------------------------------
FP8_ROUNDS = 4          # interleaved rounds (bf16 and the FP8 variants, in turns) per size
FP8_MARGIN = 1.05       # FP8 counts as faster from 5 % up: a ratio of two medians of a dozen samples each moves by a few %
FP8_DATASHEET_SHARE = 0.6   # the self-check: the largest FP8 product reaches this share of the datasheet's FP8 / bf16


@dataclass
class Fp8Row:
    """One n x n x n product in bf16 and in FP8 (e4m3, one scale per tensor): TFLOP/s of each, and the
    errors against fp32."""

    n: int
    bf16_tflops: float
    fp8_tflops: float               # the FP8 product alone, its inputs already in e4m3 (the Tensor Cores' rate)
    fp8_eager_tflops: float         # with both inputs scaled and cast first by `to_fp8`, eager (several kernels each)
    fp8_compiled_tflops: float | None   # the same with `to_fp8` compiled (two kernels each); None where not compiled
    fp8_error: float                # FP8 product against fp32 on the same bf16 inputs: e4m3's rounding
    bf16_error: float               # bf16 product against the same

    @property
    def speedup(self) -> float:
        return self.fp8_tflops / self.bf16_tflops

    @property
    def scaling(self) -> str:
        """Which scaling was faster here: "compiled" or "eager" (only eager where none was compiled)."""
        return "compiled" if (self.fp8_compiled_tflops or 0.0) > self.fp8_eager_tflops else "eager"

    @property
    def scaled_speedup(self) -> float:
        """With its scaling, the faster of the compiled and the eager one: what FP8 training pays per product
        when its scaling is done as well as this run managed."""
        best = self.fp8_compiled_tflops if self.scaling == "compiled" else self.fp8_eager_tflops
        return best / self.bf16_tflops


def fp8_crossover(sizes: Sequence[int] | None = None, rounds: int = FP8_ROUNDS, compiled: bool | None = None) -> list[Fp8Row]:
    """bf16 against FP8 products (`precision.fp8_matmul`) at each n of `sizes` (default: the scale's
    `fp8_sizes`, multiples of 16): A (n x n) @ W.T (n x n), the layout of a linear layer. Each FP8 product is
    first checked against the product of its own dequantized inputs (`precision.FP8_KERNEL_TOLERANCE`) and
    against fp32 (`precision.FP8_TOLERANCE`), AssertionError if not; then the variants are timed in turns
    (`timing.interleaved`): bf16, the FP8 product alone, and with its inputs' scaling, eager and (`compiled`,
    by default on a GPU) through torch.compile. ValueError where this device has no FP8 (`precision.fp8_refusal`)."""
    why = P.fp8_refusal()
    if why:
        raise ValueError(why)
    sizes = tuple(config()["fp8_sizes"] if sizes is None else sizes)
    if not sizes or any(n < 16 or n % 16 for n in sizes):
        raise ValueError(f"sizes must be multiples of 16, at least 16 (got {sizes})")
    device = pick_device()
    compiled = device.type == "cuda" if compiled is None else compiled
    # static shapes, compiled afresh for each n. With one compile reused across sizes, the compiled scaling ran
    # slower than the eager one from n = 4096 up on the H200 (588 against 741 TFLOP/s at 16384; 2026-12-02,
    # results/course/2026-12-02-h200-00-13), its overhead at a near-constant ~0.3 TB/s whatever n: the signature of
    # a kernel with a fixed number of blocks. The likely cause: the compile turns dynamic at the second size
    # and keeps the amax's split chosen from that compile's size hint (what pytorch/pytorch#155941 addresses,
    # with an opt-in minimum split). Not confirmed by inductor's output code; a static compile per size avoids it
    to_fp8_compiled = torch.compile(P.to_fp8, dynamic=False) if compiled else None
    rows = []
    with memory_guard(device=device):
        try:
            for n in sizes:
                rows.append(_fp8_row(n, device, rounds, to_fp8_compiled))
                if compiled:
                    torch.compiler.reset()
        finally:
            if compiled:
                torch.compiler.reset()
    return rows


def _fp8_row(n: int, device: torch.device, rounds: int, to_fp8_compiled) -> Fp8Row:
    g = torch.Generator(device=device).manual_seed(n)
    a = torch.randn(n, n, device=device, generator=g, dtype=torch.bfloat16)
    w = torch.randn(n, n, device=device, generator=g, dtype=torch.bfloat16)
    a8, sa = P.to_fp8(a)
    w8, sw = P.to_fp8(w)
    out = P.fp8_matmul(a8, sa, w8, sw).float()
    rel = lambda c, ref: float(torch.linalg.norm(c - ref) / torch.linalg.norm(ref))
    with P.fp32_math("ieee"):
        kernel_err = rel(out, (a8.float() * sa) @ (w8.float() * sw).t())
        ref = a.float() @ w.float().t()
    fp8_err, bf16_err = rel(out, ref), rel((a @ w.t()).float(), ref)
    del out, ref
    if not kernel_err <= P.FP8_KERNEL_TOLERANCE:
        raise AssertionError(f"the FP8 product of {n} x {n} is wrong: relative error {kernel_err:.2e} against its own "
                             f"dequantized inputs' product, more than {P.FP8_KERNEL_TOLERANCE:.0e} (a scale or an operand's layout)")
    if not fp8_err <= P.FP8_TOLERANCE:
        raise AssertionError(f"the FP8 product of {n} x {n} is off by {fp8_err:.2e} against fp32, more than "
                             f"{P.FP8_TOLERANCE} (e4m3's rounding of scaled inputs gives about 4e-2): the inputs "
                             "were not scaled as to_fp8 scales them")
    variants = {"bf16": lambda: a @ w.t(),
                "fp8": lambda: P.fp8_matmul(a8, sa, w8, sw),
                "fp8 eager scaling": lambda: P.fp8_matmul(*P.to_fp8(a), *P.to_fp8(w))}
    if to_fp8_compiled is not None:
        variants["fp8 compiled scaling"] = lambda: P.fp8_matmul(*to_fp8_compiled(a), *to_fp8_compiled(w))
    t = interleaved(variants, rounds=rounds, repeat=3, warmup=2)
    rate = lambda name: t[name].per_second(2 * n ** 3) / 1e12 if name in t else None
    return Fp8Row(n, rate("bf16"), rate("fp8"), rate("fp8 eager scaling"), rate("fp8 compiled scaling"), fp8_err, bf16_err)


def crossover(rows: Sequence[Fp8Row], scaled: bool = True, margin: float = FP8_MARGIN) -> int | None:
    """The smallest n from which FP8 (with its scaling, or the product alone) is at least `margin` x bf16 at
    every larger size measured; None if it is not at the largest."""
    found = None
    for r in sorted(rows, key=lambda r: -r.n):
        if (r.scaled_speedup if scaled else r.speedup) >= margin:
            found = r.n
        else:
            break
    return found


def fp8_table(rows: Sequence[Fp8Row], on_gpu: bool) -> None:
    """Notebook 13's table of `fp8_crossover`'s rows, and its plot (TFLOP/s against n, both axes log)."""
    from gpulab.core import plots
    from IPython.display import HTML, display
    f = lambda v: "-" if v is None else v
    display(HTML(plots.table_html([(r.n, r.bf16_tflops, r.fp8_tflops, r.fp8_eager_tflops, f(r.fp8_compiled_tflops),
                        f"{r.speedup:.2f}x", f"{r.scaled_speedup:.2f}x", f"{r.fp8_error:.1e}", f"{r.bf16_error:.1e}")
                       for r in rows],
                      header=("n", "bf16 TFLOP/s", "FP8 alone", "FP8 + eager scaling", "FP8 + compiled scaling",
                              "alone / bf16", "scaled / bf16", "FP8 error", "bf16 error"),
                      notes=["scaled / bf16: with the faster of the two scalings (compiled where it ran, eager); error: "
                             "||C - C_fp32|| / ||C_fp32|| on the same bf16 inputs (FP8 rounds them to 3 mantissa bits first)"]
                      + ([] if on_gpu else ["CPU run: the code path, not a GPU's rates; no compiled scaling"]))))
    series = {"bf16": [r.bf16_tflops for r in rows], "FP8 product alone": [r.fp8_tflops for r in rows],
              "FP8 + eager scaling": [r.fp8_eager_tflops for r in rows]}
    if any(r.fp8_compiled_tflops for r in rows):
        series["FP8 + compiled scaling"] = [r.fp8_compiled_tflops for r in rows]
    plots.sweep_plot([r.n for r in rows], series, xlabel="n (an n x n x n product)", ylabel="TFLOP/s",
                     logx=True, logy=True, title="FP8 against bf16, by product size")


# -- speed tied to quality: time to a validation loss ------------------------------------------------
@dataclass
class LossCurve:
    """A byte-level GPT trained on the stdlib's source (`gpulab.models.text`) with `options`: its validation
    loss after each `eval_every` steps, against the seconds of training so far (host clock, synchronized;
    validation not counted; the first step, which compiles when compile is on, counted apart)."""

    options: Options
    points: list[tuple[int, float, float]]      # (steps, training seconds, validation loss)
    first_step_s: float
    tokens_per_step: int
    target: float | None = None
    reached: tuple[int, float] | None = None    # (steps, seconds) of the first evaluation at or below the target
    notes: tuple[str, ...] = ()

    @property
    def final_loss(self) -> float:
        return self.points[-1][2]

    @property
    def tokens_per_s(self) -> float | None:
        steps, seconds = self.points[-1][0] - 1, self.points[-1][1]      # the first step is not in the seconds
        return steps * self.tokens_per_step / seconds if seconds > 0 else None


def validation_loss(model: nn.Module, batches: Sequence[tuple[torch.Tensor, torch.Tensor]], options: Options,
                    device: torch.device) -> float:
    """Mean next-byte loss over the held-out `batches`, in eval mode without gradients, in the run's precision."""
    was = model.training
    model.eval()
    dtype = AMP_DTYPES[options.amp]
    try:
        with torch.no_grad(), torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            return sum(float(P.language_model_loss(model, x.to(device), y.to(device))) for x, y in batches) / len(batches)
    finally:
        model.train(was)


def time_to_loss(options: Options = Options(), target: float | None = None, *, budget_s: float | None = None,
                 scale: str | None = None, seed: int = 0, device: torch.device | None = None) -> LossCurve:
    """Train the byte-level GPT of `config(scale)["ttl"]` from the weights seed `seed` gives, on random
    windows of the stdlib's source (the same windows in the same order for every `options`), and evaluate
    it on held-out files every `eval_every` steps. Without `target`: for `budget_s` seconds of training (the
    baseline, whose last loss is then the target). With it: until an evaluation is at or below it, or
    `cap` x `budget_s` seconds. The loader toggle is left out (the windows are cut in this loop); a
    combination this device cannot run raises ValueError with the reason."""
    device = device or pick_device()
    knobs = config(scale)["ttl"]
    cfg = dict(knobs["gpt"])
    notes = []
    if options.loader:
        options = options.without("loader")
        notes.append("loader left out: the windows are cut from the text in the training loop")
    budget_s = knobs["budget_s"] if budget_s is None else budget_s
    limit_s = budget_s * (knobs["cap"] if target is not None else 1.0)
    train_text, val_text = text.stdlib_source(knobs["text_bytes"])
    val = [text.windows(val_text, cfg["batch"], cfg["seq"], torch.Generator().manual_seed(10_000 + i))
           for i in range(knobs["eval_batches"])]
    g = torch.Generator().manual_seed(seed)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        x, y = text.windows(train_text, cfg["batch"], cfg["seq"], g)
        return x.to(device), y.to(device)

    with _run("gpt", options, cfg["batch"], device):
        torch.manual_seed(seed)
        trainer = _trainer("gpt", options, JOBS["gpt"].build(cfg, device), device)
        model, train = trainer.model, trainer.train
        with stopwatch(device=device) as first:
            train(*batch())
        steps, seconds, reached = 1, 0.0, None
        points = [(steps, seconds, validation_loss(model, val, options, device))]
        while seconds < limit_s:
            with stopwatch(device=device) as segment:
                for _ in range(knobs["eval_every"]):
                    train(*batch())
            steps, seconds = steps + knobs["eval_every"], seconds + segment.ms / 1e3
            points.append((steps, seconds, validation_loss(model, val, options, device)))
            if target is not None and points[-1][2] <= target:
                reached = (steps, seconds)
                break
        del model, train, trainer              # before the memory check at the block's end: nothing held
    return LossCurve(options, points, first.ms / 1e3, cfg["batch"] * cfg["seq"], target, reached, tuple(notes))


# -- model FLOPs utilization, and the fraction of measured peak -------------------------------------------
# Two ratios, one name each. MFU (PaLM, Chowdhery et al. 2022, appendix B): model FLOP/s over the theoretical
# peak, the datasheet's dense 16-bit rate. The fraction of measured peak: model FLOP/s over the 16-bit peak notebook
# 00 measured on this GPU (the best of its sweep over shapes), what this GPU's products really reach.
def bf16_peak(store=None) -> Ceiling | None:
    """The 16-bit matrix-product peak notebook 00 measured on this GPU (bf16, fp16 on a GPU without bf16), which
    the fraction of measured peak divides by; None if it has not measured one (a datasheet figure is MFU's)."""
    found = ceilings(store)
    peak = found.get("matmul_bf16") or found.get("matmul_fp16")
    return peak if peak is not None and peak.source.startswith("measured") else None


def peak_is_measured(peak: Ceiling | None) -> bool:
    """True for a peak notebook 00 measured at full size on this GPU (not at the tiny size)."""
    return peak is not None and peak.source.startswith("measured") and "(full)" in peak.source


def datasheet_peak(facts: DeviceFacts | None = None) -> float | None:
    """This GPU's datasheet dense 16-bit TFLOP/s (bf16 where native, else fp16), which MFU divides by; None on
    the CPU, under a GPU profile (its datasheet is not the GPU running it) or for a GPU not in the table."""
    facts = facts or device_facts()
    sheet = None if facts.profile or not facts.on_gpu else facts.datasheet
    return getattr(sheet, P.best_half(facts), None) if sheet is not None else None


def _tflops(tflops: float | JobResult | None) -> float | None:
    return tflops.tflops if isinstance(tflops, JobResult) else tflops


def peak_fraction(tflops: float | JobResult | None, peak: Ceiling | None) -> float | None:
    """The fraction of measured peak: model TFLOP/s over notebook 00's measured 16-bit peak (`bf16_peak`), a
    fraction; None without both. Not MFU, which divides by the datasheet's."""
    tflops = _tflops(tflops)
    if tflops is None or peak is None or peak.value <= 0:
        return None
    return tflops / peak.value


def mfu(tflops: float | JobResult | None, sheet_tflops: float | None) -> float | None:
    """Model FLOPs utilization as PaLM defines it: model TFLOP/s over the datasheet's dense 16-bit TFLOP/s
    (`datasheet_peak`), a fraction; None without both."""
    tflops = _tflops(tflops)
    if tflops is None or not sheet_tflops:
        return None
    return tflops / sheet_tflops


# -- the seeds' tables -------------------------------------------------------------------------------
# Seed 000 (V100), "benchmark comparison on a V100": memory (GB), training speed (iter/s), speed-up.
SEED_V100 = (
    ("Baseline (FP32)", 12.4, 45, 1.0),
    ("AMP (FP16/FP32 mixed)", 6.8, 120, 2.67),
    ("AMP + Tensor Core", 6.8, 138, 3.07),
    ("AMP + memory pooling", 5.9, 135, 3.0),
)


# Seed 004 (RTX 4090): batch size, throughput (img/s), GPU utilization (%).
SEED_4090 = (
    ("Baseline", 32, 125, 58),
    ("+AMP", 64, 214, 72),
    ("+Checkpointing", 128, 187, 68),
    ("All combined", 256, 362, 89),
)


NO_POOLING = ("no toggle corresponds: PyTorch's caching allocator already pools GPU memory in every run; "
              "lesson 02 compares allocator settings, each in a fresh process")


@dataclass(frozen=True)
class SeedRow:
    """One row of a seed's table beside the configuration that corresponds to it on this GPU."""

    seed: tuple
    options: Options | None
    batch: int | None
    checked: Checked | None
    why: str = ""


def seed_v100_rows(runs: Runs, job: str = "gpt", batch: int | None = None, half: str = "bf16") -> list[SeedRow]:
    """Seed 000's rows on `job`: fp32; AMP; AMP + "Tensor Core" (sizes aligned: the GPT's vocabulary);
    "memory pooling" has no counterpart (NO_POOLING)."""
    amp = Options(amp=half)
    configs = [Options(), amp, amp.adding("aligned") if job == "gpt" else amp.adding("channels_last"), None]
    out = []
    for seed, options in zip(SEED_V100, configs):
        if options is None:
            out.append(SeedRow(seed, None, None, None, NO_POOLING))
        else:
            out.append(SeedRow(seed, options, runs.batch(job, batch), runs.checked(job, options, batch)))
    return out


def seed_4090_rows(runs: Runs, best: Options, job: str = "cnn", batch: int | None = None,
                   half: str = "bf16") -> list[SeedRow]:
    """Seed 004's rows on `job`, its batches doubling from `batch` (default: the seed's 32) as the seed's
    did: fp32; AMP at 2x; AMP + checkpointing at 4x; `best` (every speed toggle) + checkpointing at 8x.
    GPU busy % is sampled during each timed run (NVML), like the seed's utilization column."""
    b = batch or SEED_4090[0][1]
    configs = [(Options(), b), (Options(amp=half), 2 * b), (Options(amp=half, checkpointing=True), 4 * b),
               (dataclasses.replace(best, checkpointing=True), 8 * b)]
    return [SeedRow(seed, o, n, runs.checked(job, o, n, monitor=True)) for seed, (o, n) in zip(SEED_4090, configs)]


# -- for `gpulab bench` ------------------------------------------------------------------------------
def headline_numbers(job: str = "gpt", scale: str | None = None, runs: Runs | None = None) -> dict[str, Any]:
    """Baseline (fp32) against everything this device accepts (`all_on`), for one job at `scale`.

    `runs`: runs already made (notebook 13's), reused; they carry their own scale, so `scale` is then
    ignored. Without them, a fresh `Runs(scale=scale)`. The optimized run is checked against the baseline
    before its time counts (`Runs.checked`). Returns the throughputs, their ratio, the check, the model FLOPs
    utilization (`mfu`, against the datasheet) and the fraction of measured peak (`peak_fraction`).
    """
    if runs is None:
        runs = Runs(scale=scale)
        runs.fit_batches((job,))
    best = all_on(job, runs.batch(job))
    base = runs.checked(job, Options())
    top = runs.checked(job, best)
    if top.result is None or base.result is None:
        raise RuntimeError(f"{job}: a run did not complete ({top.status}: {top.why})")
    peak, sheet = bf16_peak(), datasheet_peak()
    unit = JOBS[job].unit
    return {
        "baseline": base.result.items_per_s, "optimized": top.result.items_per_s, "unit": unit,
        "ratio": top.result.items_per_s / base.result.items_per_s, "correct": top.status == "ok",
        "check": f"{top.status} against fp32 ({top.summary} of each allowance): {top.why}",
        "baseline_label": "fp32 baseline", "optimized_label": best.label,
        "baseline_ms": base.result.step_ms, "optimized_ms": top.result.step_ms,
        "tflops": top.result.tflops, "mfu": mfu(top.result, sheet), "peak_fraction": peak_fraction(top.result, peak),
        "datasheet_peak": None if sheet is None else f"{sheet:.4g} TFLOP/s (datasheet)",
        "peak": None if peak is None else f"{peak.value:.4g} TFLOP/s ({peak.source})",
        "notes": "; ".join(top.result.notes),
    }


# -- tables and plots for the notebook ----------------------------------------------------------------
def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.3g}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}%"


STEP_HEADER = ("step", "status", "ms per step", "throughput", "speed-up", "this step", "share of speed-up",
               "peak GiB", "memory saved GiB", "share of memory saved", "model TFLOP/s",
               "checks (share of allowance)", "first step ms", "notes")


def _short_status(s: Step) -> str:
    """A step's status for a table cell: the word before the reason ("skipped", ...); the reason goes below."""
    return s.status.split(":")[0] + (" (see below)" if ":" in s.status or s.status == "mismatch" else "")


def step_rows(steps: Sequence[Step], shares: bool = True) -> list[tuple]:
    """One table row per waterfall step (STEP_HEADER): what ran, whether it counted, and its shares.

    A skipped step's reason is not in its row (a sentence in one column of this wide table is squeezed to a
    word per line) but in `step_notes`. `shares=False` (on the CPU) leaves the share of speed-up out: "n/a".
    """
    rows = []
    for s in steps:
        r, c = s.result, s.checked
        if r is None or r.time is None:
            rows.append((s.label, _short_status(s)) + ("-",) * (len(STEP_HEADER) - 3)
                        + ("; ".join(n for n in r.notes if not n.startswith("not timed:")) if r else "",))
            continue
        share = _pct(s.share_pct) if shares else ("n/a" if s.share_pct is not None else "-")
        rows.append((s.label, s.status, f"{r.step_ms:.4g}", f"{r.items_per_s:,.0f} {r.unit}",
                     "-" if s.speedup is None else f"{s.speedup:.2f}x", "-" if s.gain is None else f"{s.gain:.2f}x",
                     share, _gib(r.peak_bytes),
                     "-" if s.memory_saved is None else _gib(s.memory_saved), _pct(s.memory_share_pct),
                     f"{r.tflops:.3g}", c.summary, f"{r.first_step_ms:,.0f}", "; ".join(r.notes)))
    return rows


CPU_SHARES = ("share of speed-up: n/a on the CPU. The toggles target GPU hardware (Tensor Cores, pinned copies, "
              "fused kernels), so their CPU gains are small and noisy, and a share of a total near 1x divides by "
              "almost zero: it comes out at hundreds of percent, positive and negative.")


def step_notes(steps: Sequence[Step], shares: bool = True) -> list[str]:
    """The lines below a `step_rows` table: why each step that did not count did not, the updates GradScaler
    skipped, what the checks column holds (TIERS) and, with `shares=False`, why the shares are not shown."""
    notes = []
    for s in steps:
        if ":" in s.status:
            word, why = s.status.split(":", 1)
            toggle = s.label.removeprefix("+ ").strip()
            why = why.strip().removeprefix(f"{toggle}:").strip()
            notes.append(f"{s.label} {word}: {why}")
        elif s.status == "mismatch":
            notes.append(f"{s.label} mismatch, not timed: {s.checked.why}")
        elif s.result is not None and s.result.skipped_updates:
            notes.append(f"{s.label}: {K.skipped_text(s.result.skipped_updates, s.result.first_scale)}")
    return notes + [TIERS] + ([] if shares else [CPU_SHARES])


HOST_PACED_BUSY = 90.0    # a timed run whose GPU was busy less than this % of the time (NVML) waited on the host


def accumulation_notes(steps: Sequence[Step]) -> list[str]:
    """What this run's numbers say about each counted row that splits the batch into more micro-batches than
    the counted row before it: its step and micro-batch times against the whole batch in one pass, and, where
    GPU busy % was sampled (`waterfall(monitor=True)`, NVML), who set the pace. A micro-batch launches the same
    kernels as the whole batch, each on fewer samples: where the GPU finishes them sooner than the host launches
    them, the GPU waits between kernels (busy under HOST_PACED_BUSY %) and the step is host-bound (lesson 11);
    where it stays busy, the smaller products themselves took longer per sample (lesson 04)."""
    out = []
    counted = [s for s in steps if s.counted and s.result is not None and s.result.step_ms]
    for before, s in zip(counted, counted[1:]):
        n = s.options.accumulation // before.options.accumulation
        if n <= 1:
            continue
        r, b = s.result, before.result
        micro = r.step_ms / s.options.accumulation
        whole = b.step_ms / before.options.accumulation
        line = (f"{s.label}: {r.step_ms:.4g} ms a step, {micro:.3g} ms for each of its {s.options.accumulation} "
                f"micro-batches of {r.batch // s.options.accumulation}, against {whole:.3g} ms for "
                f"{b.batch // before.options.accumulation} in one pass in the row before: 1/{n} of the samples took "
                f"{micro / whole:.0%} of the time")
        if micro / whole <= 1.1 / n:
            line += ": about its share, so splitting the batch cost nothing measurable here"
        elif r.busy_pct is None or b.busy_pct is None:
            line += (f". GPU busy % was not sampled ({r.monitor_status or b.monitor_status or 'no monitor'}), so "
                     "whether the host or the GPU set that pace is not measured here")
        elif r.busy_pct < HOST_PACED_BUSY:
            line += (f". The GPU was busy {r.busy_pct:.0f} % of the time (NVML) against {b.busy_pct:.0f} % before: it "
                     "waited between kernels for the host, which launches as many kernels per micro-batch as for "
                     "the whole batch. This step is host-bound (lesson 11: CUDA graphs or compile remove launches)")
        else:
            line += (f". The GPU was busy {r.busy_pct:.0f} % of the time (NVML) against {b.busy_pct:.0f} % before: "
                     "not waiting for the host; the smaller products took longer per sample on the GPU itself")
        out.append(line + ".")
    return out


def waterfall_figure(steps: Sequence[Step], title: str = "", memory: bool = False, shares: bool = True):
    """`plots.waterfall_plot` of the steps: cumulative speed-up (or, with `memory`, peak GiB), each step's
    gain and share written above its bar (`shares=False`, on the CPU: the gain only); steps that did not
    count drawn grey."""
    from gpulab.core import plots

    if memory:
        values = [None if not s.counted or s.result is None or s.result.peak_bytes is None
                  else s.result.peak_bytes / 2**30 for s in steps]
        notes = [("" if s.memory_share_pct is None else f"{s.memory_share_pct:.0f}%") if v is not None
                 else s.status.split(":")[0] for s, v in zip(steps, values)]
        return plots.waterfall_plot(list(zip((s.label for s in steps), values)), notes, ylabel="peak memory (GiB)",
                                    title=title, logy=False, total_label="end", higher_is_better=False)
    values = [s.speedup if s.counted else None for s in steps]
    notes = [("" if s.gain is None else f"{s.gain:.2f}x" + ("" if s.share_pct is None or not shares
                                                             else f", {s.share_pct:.0f}%")) if v is not None
             else s.status.split(":")[0] for s, v in zip(steps, values)]
    return plots.waterfall_plot(list(zip((s.label for s in steps), values)), notes, title=title)


SEED_V100_HEADER = ("seed row (V100)", "seed GB", "seed iter/s", "seed speed-up", "here: configuration",
                    "here: peak GiB", "here: steps/s", "here: speed-up", "here: memory vs fp32", "seed memory vs fp32")


SEED_4090_HEADER = ("seed row (RTX 4090)", "seed batch", "seed img/s", "seed speed-up", "seed GPU util.",
                    "here: configuration", "here: batch", "here: img/s", "here: speed-up", "here: GPU busy")


def seed_v100_table(rows: Sequence[SeedRow]) -> list[tuple]:
    """SEED_V100_HEADER rows: the seed's figures and ratios beside ours (ratios to each table's first row)."""
    base = rows[0].checked.result if rows[0].checked else None
    out = []
    for r in rows:
        name, gb, its, x = r.seed
        seed = (name, gb, its, f"{x:.2f}x")
        seed_mem = f"{gb / rows[0].seed[1]:.2f}x"
        res = r.checked.result if r.checked else None
        if res is None or res.time is None or base is None or not r.checked.counted:
            why = "none (see below)" if r.why else (r.checked.status.split(":")[0] if r.checked else "-")
            out.append(seed + (why, "-", "-", "-", "-", seed_mem))
            continue
        steps = 1e3 / res.step_ms
        mem = "-" if res.peak_bytes is None or not base.peak_bytes else f"{res.peak_bytes / base.peak_bytes:.2f}x"
        out.append(seed + (res.options.label, _gib(res.peak_bytes), f"{steps:.3g}",
                           f"{res.items_per_s / base.items_per_s:.2f}x", mem, seed_mem))
    return out


def seed_4090_table(rows: Sequence[SeedRow]) -> list[tuple]:
    """SEED_4090_HEADER rows: the seed's figures and speed-ups beside ours, with GPU busy % from NVML."""
    base = rows[0].checked.result if rows[0].checked else None
    out = []
    for r in rows:
        name, b, rate, util = r.seed
        seed = (name, b, rate, f"{rate / rows[0].seed[2]:.2f}x", f"{util}%")
        res = r.checked.result if r.checked else None
        if res is None or res.time is None or base is None or not r.checked.counted:
            out.append(seed + (r.options.label if r.options else "-", r.batch, r.checked.status, "-", "-"))
            continue
        busy = f"{res.busy_pct:.0f}%" if res.busy_pct is not None else "n/a (see below)"
        out.append(seed + (res.options.label, r.batch, f"{res.items_per_s:,.0f}",
                           f"{res.items_per_s / base.items_per_s:.2f}x", busy))
    return out


def seed_notes(rows: Sequence[SeedRow]) -> list[str]:
    """The lines below a seed table: each reason its cells only point to, once."""
    notes = []
    for r in rows:
        res = r.checked.result if r.checked else None
        if r.why:
            line = f"{r.seed[0]}: {r.why}"
        elif r.checked and ":" in r.checked.status:
            line = f"{r.seed[0]}: {r.checked.status}"
        elif res is not None and res.time is not None and res.busy_pct is None and r.checked.counted:
            line = f"here: GPU busy: n/a ({res.monitor_status or 'no NVML'})"
        else:
            continue
        if line not in notes:
            notes.append(line)
    return notes


def headline(scale: str | None = None, runs: Runs | None = None) -> Measured:
    """The GPT job, fp32 against every toggle this device accepts (`headline_numbers`), as a `Measured`:
    what notebook 13's self-check (with its `runs`, so nothing runs twice) and `gpulab bench` read."""
    h = headline_numbers("gpt", scale, runs)
    notes = "; ".join([f"MFU {100 * h['mfu']:.0f}% of the datasheet's {h['datasheet_peak']}" if h["mfu"] is not None
                       else "MFU: no datasheet 16-bit peak for this device",
                       f"{100 * h['peak_fraction']:.0f}% of the measured peak, {h['peak']}"
                       if h["peak_fraction"] is not None else "fraction of measured peak: notebook 00 has not measured one"])
    return Measured(h["baseline"], h["optimized"], h["unit"], h["ratio"], h["correct"], h["check"],
                    h["baseline_label"], h["optimized_label"], notes=notes)
