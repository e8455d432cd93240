"""Lesson 13's toggles: `Options`, one run's (TF32, autocast, FP8, channels_last, the aligned vocabulary, fused
AdamW, the input pipeline, torch.compile, CUDA graphs, checkpointing, accumulation); `check` refuses a combination
no device can run, `refusal` says why this device cannot run one, `problem` gives either reason. `ORDERS`: the
waterfalls notebook 13 runs by default; `all_on`: every toggle of one that this device takes. The checks' two
tiers: `NUMERICS_TOGGLES` (`numerics_format`) and the rest, the systems toggles (`systems_only`)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import torch

from gpulab.core.device import DeviceFacts, device_facts
from gpulab.lessons.capstone.jobs import JOBS
from gpulab.lessons.capstone.knobs import ACCUMULATION, ALIGN
from gpulab.models import precision as P


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
    if options.fp8:               # first: on a GPU without FP8 Tensor Cores (a T4) this is the reason, not its bf16
        reasons["fp8"] = P.fp8_refusal(facts)
    if options.tf32:
        reasons["tf32"] = P.refusal("tf32", facts)
    if options.amp != "none":
        reasons["amp"] = P.refusal(options.amp, facts)
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


def systems_only(options: Options) -> Options:
    """`options` with its numerics toggles off (TF32, autocast, FP8): its systems toggles alone, in fp32."""
    return dataclasses.replace(options, tf32=False, amp="none", fp8=False)


def numerics_format(options: Options) -> str | None:
    """The coarsest number format `options` computes in (`checks.FORMATS`), None for fp32 throughout."""
    return "fp8" if options.fp8 else options.amp if options.amp != "none" else "tf32" if options.tf32 else None


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
