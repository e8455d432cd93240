"""Lesson 14's face: what notebook 14 imports. DataParallel against DistributedDataParallel, NCCL all-reduce
bandwidth, DDP's gradient buckets (their overlap with backward, and a profile of what the GPU ran) and
`no_sync()`, a two-stage pipeline, and FSDP2 against DDP.

Everything a worker process runs lives in `gpulab.lessons.multigpu` (importable), so the notebook only starts it:

    result = launch("allreduce", nproc=2, backend="nccl", timeout_s=120, sizes=[2**20, 2**26])

`launch` runs `python -m torch.distributed.run --standalone --nproc-per-node N -m gpulab.lessons.multigpu.cli
EXPERIMENT ...` in a child process with a time limit (`gpulab.core.launcher`: NVLink multicast off,
NCCL_NVLS_ENABLE=0), and returns rank 0's JSON. A failure or a timeout raises `LaunchError` with the failing
rank's error and the last lines the processes printed; the notebook kernel never joins a process group.

`placement()` says where each part runs here: NCCL on every GPU when there are two or more; otherwise
gloo on 2 CPU processes at the tiny size (DataParallel and DDP on one GPU where there is one).

Every experiment checks its result (gradients against a single-device step, the all-reduced
values) before it times anything; a wrong result raises `Mismatch` in the worker.

The package `gpulab.lessons.multigpu`, each module readable alone:
- `arithmetic`: bandwidths, bytes per GPU, the bubble, overlap, a profile's kernels, the gradient check;
- `worker`: what every worker shares (`Ctx`, the model, the batch, one forward and backward);
- `ddp` (sections 2 and 4), `allreduce` (3), `pipeline` (5), `fsdp` (6): the experiments;
- `cli`: the command torchrun starts in each process, and `exp_suite` (several experiments in one launch).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch

from gpulab.core.device import pick_device, resolve_scale, scale
from gpulab.core.launcher import OUT, LaunchError, torchrun
from gpulab.core.predict import Plan, Work
from gpulab.core.timing import Timing, summarize
# what notebook 14 imports from here besides this module's own names
from gpulab.lessons.multigpu.allreduce import exp_allreduce
from gpulab.lessons.multigpu.arithmetic import (HIDDEN_JUDGED, HIDDEN_LOW, HIDDEN_WHY_NOT, bubble_fraction,
                                                dp_bytes_gpu0, ring_bytes_per_gpu, state_bytes_per_gpu)
from gpulab.lessons.multigpu.cli import EXPERIMENTS
from gpulab.lessons.multigpu.ddp import bucket_run, exp_ddp, exp_dp
from gpulab.lessons.multigpu.fsdp import exp_fsdp
from gpulab.lessons.multigpu.pipeline import exp_pipeline

__all__ = ["SIZES", "Placement", "placement", "launch", "LaunchError", "as_timing", "samples_per_s", "plan",
           "exp_dp", "exp_ddp", "bucket_run", "exp_allreduce", "exp_pipeline", "exp_fsdp",
           "HIDDEN_LOW", "HIDDEN_JUDGED", "HIDDEN_WHY_NOT",
           "bubble_fraction", "dp_bytes_gpu0", "ring_bytes_per_gpu", "state_bytes_per_gpu"]

WORKER = "gpulab.lessons.multigpu.cli"       # the module torchrun starts in each process


# Problem sizes. "tiny" runs on 2 CPU processes (gloo) in seconds; "full" is for 2+ GPUs.
# buckets_mb: section 4's bucket caps (None: one bucket for the whole model; the middle one is the default
# cap's place); panel_buckets_mb: the caps the notebook's bucket panel offers (the largest holds the whole
# model); profile_steps: DDP steps profiled (CUDA kernels) at the middle cap, on GPUs only.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": dict(
        model=dict(n_blocks=2, width=32, heads=2, seq=16), batch=4, warmup=2, repeat=5,
        buckets_mb=(0.01, 0.025, None), panel_buckets_mb=(0.01, 0.025, 0.05, 1.0), profile_steps=3,
        accum_steps=4, accum_micro=1,
        allreduce_bytes=(2**12, 2**16, 2**20), allreduce_warmup=2, allreduce_repeat=5,
        pipe_model=dict(n_blocks=4, width=32, heads=2, seq=16), pipe_batch=8,
        pipe_micro=(1, 2, 4, 8), pipe_warmup=1, pipe_repeat=3, timeout_s=120),
    "full": dict(
        model=dict(n_blocks=6, width=1024, heads=16, seq=512), batch=8, warmup=3, repeat=15,
        buckets_mb=(1, 25, None), panel_buckets_mb=(1, 5, 25, 100, 400), profile_steps=5,
        accum_steps=4, accum_micro=2,
        allreduce_bytes=tuple(2**k for k in range(13, 31, 2)) + (2**30,),   # 8 KiB .. 1 GiB
        allreduce_warmup=5, allreduce_repeat=20,
        pipe_model=dict(n_blocks=8, width=1024, heads=16, seq=512), pipe_batch=32,
        pipe_micro=(1, 2, 4, 8), pipe_warmup=1, pipe_repeat=3, timeout_s=300),
}


# -- where each part runs -------------------------------------------------------------------
@dataclass(frozen=True)
class Placement:
    """Where lesson 14's parts run on this machine."""

    gpus: int            # CUDA GPUs the course may use
    backend: str         # multi-process parts: "nccl" or "gloo"
    nproc: int           # ... with this many processes
    device: str          # ... on "cuda" or "cpu"
    size: str            # ... at this size ("tiny" or "full")
    dp_device: str       # the single-process part (DataParallel, 1-process DDP)
    dp_gpus: int         # GPUs DataParallel spreads over (0: the CPU, where it does nothing)
    dp_size: str
    notes: tuple[str, ...] = ()

    @property
    def dp_backend(self) -> str:
        return "nccl" if self.dp_device == "cuda" else "gloo"

    @property
    def dp_joins_suite(self) -> bool:
        """True when the single-process part can ride in the multi-process launch (rank 0 runs it
        while the others wait): same device kind, backend and size, so one start-up is saved."""
        return (self.dp_device, self.dp_backend, self.dp_size) == (self.device, self.backend, self.size)

    def describe(self) -> str:
        multi = (f"{self.nproc} processes, {self.backend} on "
                 + (f"{self.nproc} GPUs" if self.device == "cuda" else "the CPU") + f", {self.size} size")
        single = ("one process on the CPU" if self.dp_device == "cpu" else
                  f"one process over {self.dp_gpus} GPU(s)") + f", {self.dp_size} size"
        lines = [f"GPUs visible: {self.gpus}.", f"DataParallel part: {single}.",
                 f"multi-process parts: {multi}."]
        return "\n".join(lines + [f"- {n}" for n in self.notes])


def placement(device_count: int | None = None) -> Placement:
    """Which backend, process count, device and size each part uses here.

    Two or more GPUs: NCCL, one process per GPU, the course's scale. One GPU: DataParallel and
    1-process DDP on it; the multi-process parts on 2 CPU processes with gloo at the tiny size.
    No GPU (or GPULAB_DEVICE=cpu): everything on the CPU at the tiny size.
    """
    if device_count is None:
        device_count = torch.cuda.device_count() if pick_device().type == "cuda" else 0
    size = scale()
    if device_count >= 2:
        return Placement(device_count, "nccl", device_count, "cuda", size, "cuda", device_count, size)
    needs = ("needs 2 or more GPUs, so it runs here with gloo on 2 CPU processes at the tiny size "
             "(the numbers show that the code works, not how fast GPUs are)")
    notes = (f"DDP across GPUs {needs}.",
             f"NCCL all-reduce bandwidth {needs}; the link between GPUs is not measured.",
             f"The two-stage pipeline {needs}.")
    if device_count == 1:
        return Placement(1, "gloo", 2, "cpu", "tiny", "cuda", 1, size,
                    ("DataParallel over 2 GPUs needs a second GPU: here it runs over one, which is the "
                     "plain model.",) + notes)
    return Placement(0, "gloo", 2, "cpu", "tiny", "cpu", 0, "tiny",
                ("DataParallel needs CUDA GPUs: on the CPU it wraps nothing and is not timed.",) + notes)


def launch(experiment: str, nproc: int, backend: str, timeout_s: float = 120, **params: Any) -> dict:
    """Run `experiment` in `nproc` processes (torchrun) and return rank 0's result.

    Adds `launch_s` (the whole launch, process start-up included) and, for NCCL, `nccl`
    (version and transports from NCCL's log). Raises LaunchError on failure or timeout.
    """
    if experiment not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {experiment!r}; choose from {', '.join(EXPERIMENTS)}.")
    return torchrun(WORKER, [experiment, "--backend", backend, "--out", OUT, "--params", json.dumps(params)],
                    nproc, backend, timeout_s, what=f"{experiment} ({nproc} x {backend})")


def as_timing(d: dict) -> Timing:
    """A Timing back from the JSON a worker wrote (`samples_ms`, `device`, `method`)."""
    return summarize(list(d["samples_ms"]), d["device"], d["method"])


def samples_per_s(d: dict) -> float:
    """Throughput of a timed step: samples per step over the median step time."""
    return d["samples"] / (as_timing(d).median_ms / 1e3)


def plan(scale: str | None = None) -> Plan:
    """What notebook 14 asks of the GPU at `scale` on ONE GPU (gpulab.core.predict): the one-process
    "dp" launch at the course's scale (the plain model, 1-process DDP, DataParallel over that one GPU),
    each step checked once in fp32 and timed `warmup + repeat` times in TF32. The multi-process parts
    (DDP, all-reduce sweep, pipeline) run on 2 CPU processes with gloo at the tiny size: host time,
    as are the launches' start-up (Python, torch, process groups) and model building on the CPU.
    With 2+ GPUs everything runs with NCCL at the course's scale in one launch: DataParallel over all
    GPUs (global batch x GPUs), DDP throughput, accumulation with and without no_sync, three bucket
    caps (DDP step, compute only, all-reduce alone each), the all-reduce sweep to 1 GiB and the
    two-stage pipeline (8 blocks, batch 32, 4 micro-batch counts); that plan is not counted here."""
    s = SIZES[resolve_scale(scale)]
    m = s["model"]
    L, C, seq = m["n_blocks"], m["width"], m["seq"]
    params = L * (12 * C * C + 13 * C) + C * C + 3 * C        # blocks, final LayerNorm, head (76.6 M at full)
    tokens = s["batch"] * seq                                  # one GPU: global batch = per-device batch
    # forward + backward: 6 FLOPs per parameter per token, plus attention's scores and weighted sums
    # (4 seq C per token per block forward, twice that backward; causal masking counted in full)
    step = 6 * params * tokens + 12 * L * seq * C * tokens
    checked = 3                                   # plain, DDP and DataParallel once each, plain fp32 (ieee)
    timed = 3 * (s["warmup"] + s["repeat"])       # the same three, warm-up + timed steps, TF32
    return Plan(
        host_s=60.6,   # full: wall minus GPU work on the H200; tiny keeps it
        work=[Work("matmul_fp32", checked * step, 0.45, f"{checked} fp32 training steps checked, {tokens} tokens"),
              Work("matmul_tf32", timed * step, 0.45, f"{timed} TF32 training steps timed, {tokens} tokens")],
        host_source="wall time of notebook 14 in results/course/2026-11-30-h200-10-to-14-at-775ae4a/h200-2026-11-30-course-2-timings.tsv (one H200, "
                    "torch 2.11, 2026-11-30) minus its GPU work at the ceilings in results/course/2026-11-30-h200-00-to-09-at-775ae4a/h200-2026-11-30-course.json",
    )
