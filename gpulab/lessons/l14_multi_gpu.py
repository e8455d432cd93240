"""Lesson 14's multi-process experiments: DataParallel against DistributedDataParallel, NCCL
all-reduce bandwidth, DDP's gradient buckets (their overlap with backward, and a profile of what the
GPU ran) and `no_sync()`, and a two-stage pipeline.

Everything a worker process runs lives here (importable), so the notebook only starts it:

    result = launch("allreduce", nproc=2, backend="nccl", timeout_s=120, sizes=[2**20, 2**26])

`launch` runs `python -m torch.distributed.run --standalone --nproc-per-node N -m gpulab.lessons.l14_multi_gpu
EXPERIMENT ...` in a child process with a time limit (`gpulab.core.launcher`: NVLink multicast off, NCCL_NVLS_ENABLE=0),
and returns rank 0's JSON. A failure or a timeout raises `LaunchError` with the failing rank's
error and the last lines the processes printed; the notebook kernel never joins a process group.

`placement()` says where each part runs here: NCCL on every GPU when there are two or more; otherwise
gloo on 2 CPU processes at the tiny size (DataParallel and DDP on one GPU where there is one).

Every experiment checks its result (gradients against a single-device step, the all-reduced
values) before it times anything; a wrong result raises `Mismatch` in the worker.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence
import torch
import torch.distributed as dist
from torch import nn
from gpulab.core.predict import Plan, Work
from gpulab.core.device import float32_matmul, pick_device, resolve_scale, scale
# LaunchError, launch_env and FIXED_ENV stay importable from here for the lesson's callers
from gpulab.core.launcher import (BACKENDS, FIXED_ENV, OUT, LaunchError, die_with_parent, launch_env,  # noqa: F401
                                   torchrun, write_rank_error)
from gpulab.core.timing import (Timing, benchmark, gpu_kernels, intersect, merge_intervals, release_cupti, stopwatch,
                                 summarize)
from gpulab.models.transformer import TransformerStack, loss_fn


MiB = 2**20


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


GRAD_TOL = 1e-5     # largest |difference| of any gradient entry / norm of the reference gradient


# -- arithmetic -----------------------------------------------------------------------------
def algbw_gbps(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth: the buffer's bytes over the time of one all-reduce (GB/s, 1e9)."""
    if seconds <= 0:
        raise ValueError(f"time must be positive (got {seconds})")
    return nbytes / seconds / 1e9


def busbw_gbps(algbw: float, n: int) -> float:
    """Bus bandwidth of an all-reduce over n ranks: algbw * 2(n-1)/n (nccl-tests, doc/PERFORMANCE.md).

    A ring all-reduce moves 2(n-1)/n of the buffer through each rank's link, so busbw is what
    each link carried: comparable across rank counts and with the link's peak.
    """
    if n < 1:
        raise ValueError(f"need at least one rank (got {n})")
    return algbw * 2 * (n - 1) / n


def ring_bytes_per_gpu(nbytes: float, n: int) -> float:
    """Bytes each GPU sends (and receives) in a ring all-reduce of an nbytes buffer: 2(n-1)/n * nbytes."""
    if n < 1:
        raise ValueError(f"need at least one rank (got {n})")
    return nbytes * 2 * (n - 1) / n


def dp_bytes_gpu0(param_bytes: float, n: int) -> float:
    """Bytes GPU 0 sends, and receives, per DataParallel step over n GPUs (inputs and outputs not counted).

    `nn.DataParallel` replicates the module every step with `torch.nn.parallel.comm.broadcast_coalesced`
    and sums the replicas' gradients onto GPU 0 with `comm.reduce_add_coalesced`: an NCCL broadcast and
    an NCCL reduce (in chunks of up to 10 MiB) when NCCL is available, as in every CUDA build of PyTorch.
    NCCL runs both along a ring, so GPU 0 sends the weights once and receives the summed gradients once,
    whatever n: `param_bytes` each way (0 on one GPU, where nothing is replicated). Without NCCL the
    fallback copies from GPU 0 to each other GPU and back: n - 1 times as much.
    """
    if n < 1:
        raise ValueError(f"need at least one GPU (got {n})")
    return float(param_bytes) if n > 1 else 0.0


# fp32 training with AdamW: bytes per parameter of each part of the training state
WEIGHT_B, GRAD_B, ADAM_B = 4, 4, 8


# Explicit prefetching in exp_fsdp's fourth variant: each unit's forward issues the all-gathers of this many
# next units (its backward, of the previous ones). One is FSDP2's own default overlap, issued earlier; two
# overlap more and hold one more gathered unit (FSDPModule.set_modules_to_forward_prefetch's documentation).
FSDP_PREFETCH = 2


def state_bytes_per_gpu(params: int, n: int, strategy: str, largest_unit: int = 0, prefetch: int = 1) -> dict[str, float]:
    """Bytes of fp32 AdamW training state one GPU holds, by part, under each strategy (activations apart):

    - "ddp": every GPU holds every weight, gradient and moment (16 bytes a parameter), and DDP's gradient
      buckets, a second copy of the gradients (`gradient_as_bucket_view=False`, the default), persist;
    - "fsdp": `fully_shard` keeps 1/n of the weights, of the gradients and of AdamW's moments on each GPU;
      while a unit (here: a block) runs, its weights are all-gathered whole, and the next unit's may be
      gathered already (prefetch), and in backward a unit's whole gradient exists until its reduce-scatter:
      at least two units' weights and one unit's gradient (`largest_unit` parameters each), the transient
      (with explicit prefetching of `prefetch` units, 1 + `prefetch` units' weights);
    - "fsdp-keep": `reshard_after_forward=False`: the gathered weights of every unit stay from its forward
      to its backward, so at the end of the forward all of them are whole (params x 4 bytes) at once.
    At rest (after a step, gradients freed) only weights, optimizer and buckets remain.
    Returns {"weights", "gradients", "optimizer", "buckets", "transient", "total", "rest"} in bytes."""
    if n < 1:
        raise ValueError(f"need at least one GPU (got {n})")
    if strategy == "ddp":
        parts = dict(weights=WEIGHT_B * params, gradients=GRAD_B * params, optimizer=ADAM_B * params,
                     buckets=GRAD_B * params if n > 1 else 0.0, transient=0.0)
    elif strategy in ("fsdp", "fsdp-keep"):
        if prefetch < 1:
            raise ValueError(f"prefetch counts the units gathered ahead, at least 1 (got {prefetch})")
        gathered = WEIGHT_B * (params if strategy == "fsdp-keep" else (1 + prefetch) * largest_unit)
        parts = dict(weights=WEIGHT_B * params / n, gradients=GRAD_B * params / n, optimizer=ADAM_B * params / n,
                     buckets=0.0, transient=gathered + GRAD_B * largest_unit)
    else:
        raise ValueError(f"strategy must be 'ddp', 'fsdp' or 'fsdp-keep' (got {strategy!r})")
    parts = {k: float(v) for k, v in parts.items()}
    parts["total"] = sum(parts.values())
    parts["rest"] = parts["weights"] + parts["optimizer"] + parts["buckets"]
    return parts


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """GPipe's idle share of a pipeline step: (p-1)/(m+p-1) (Huang et al. 2019, arXiv:1811.06965)."""
    if stages < 1 or micro_batches < 1:
        raise ValueError(f"need stages >= 1 and micro_batches >= 1 (got {stages}, {micro_batches})")
    return (stages - 1) / (micro_batches + stages - 1)


def measured_bubble(busy_ms: float, wall_ms: float) -> float:
    """A stage's idle share of one step: 1 - (time it computed) / (the step's wall time)."""
    if wall_ms <= 0:
        raise ValueError(f"wall time must be positive (got {wall_ms})")
    return 1.0 - busy_ms / wall_ms


def overlap_fraction(compute_ms: float, comm_ms: float, step_ms: float) -> float | None:
    """Share of the all-reduce time hidden under backward: (compute + comm - step) / comm, in [0, 1].

    1: the step costs no more than its compute; 0: compute and communication ran one after the
    other (or worse). None when there is no communication time to hide.
    """
    if comm_ms <= 0:
        return None
    return min(1.0, max(0.0, (compute_ms + comm_ms - step_ms) / comm_ms))


def kernel_kind(name: str) -> str:
    """What a GPU kernel of a DDP step is: "nccl" (a collective), "copy" (memcpy, memset, copy and fill
    kernels: DDP's gradient copies into its buckets among them) or "compute" (everything else)."""
    low = name.lower()
    if "nccl" in low:
        return "nccl"
    if low.startswith(("memcpy", "memset")) or "copy" in low or "fill" in low:
        return "copy"
    return "compute"


def kernel_breakdown(kernels: Sequence[tuple[str, float, float]], steps: int = 1) -> dict[str, float]:
    """From a profile's GPU kernels, (name, start us, end us), over `steps` steps: per step, the time (ms)
    kernels of each kind ran (`kernel_kind`; the union of their intervals, so concurrent ones count once),
    the time any kernel ran (`busy_ms`), `nccl_beside_compute_ms`, how long NCCL kernels ran while a
    compute or copy kernel ran too, and the number of kernels."""
    def length(spans) -> float:
        return sum(b - a for a, b in spans) / 1e3 / steps

    by_kind: dict[str, list] = {"nccl": [], "copy": [], "compute": []}
    for name, a, b in kernels:
        by_kind[kernel_kind(name)].append((a, b))
    both = intersect(merge_intervals(by_kind["nccl"]), merge_intervals(by_kind["copy"] + by_kind["compute"]))
    out = {f"{kind}_ms": length(merge_intervals(spans)) for kind, spans in by_kind.items()}
    out.update(busy_ms=length(merge_intervals([(a, b) for _, a, b in kernels])),
               nccl_beside_compute_ms=length(both), kernels=len(kernels) / steps)
    return out


def check_micro_batches(batch: int, micro_batches: int) -> None:
    """ValueError unless the batch splits into `micro_batches` equal micro-batches."""
    if micro_batches < 1 or batch % micro_batches:
        raise ValueError(f"micro_batches must divide the batch of {batch} into equal parts "
                         f"(got {micro_batches}).")


# -- correctness ----------------------------------------------------------------------------
class Mismatch(AssertionError):
    """A distributed result differs from the single-device reference beyond its tolerance."""


def grad_rel_diff(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> float:
    """Largest |got - want| over every entry, divided by the norm of the whole `want` gradient."""
    if len(got) != len(want):
        raise ValueError(f"{len(got)} gradients against {len(want)}")
    norm = math.sqrt(sum(float((w.double() ** 2).sum()) for w in want)) or 1.0
    worst = max(float((g.double() - w.double()).abs().max()) for g, w in zip(got, want))
    return worst / norm


def check_grads(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor], tol: float, what: str,
                against: str = "the single-device step") -> float:
    """grad_rel_diff, or Mismatch when it exceeds tol."""
    diff = grad_rel_diff(got, want)
    if not diff <= tol:
        raise Mismatch(f"{what}: gradients differ from {against}'s by {diff:.2e} of the "
                       f"gradient norm (tolerance {tol:.0e}).")
    return diff


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


# -- the launcher (gpulab.core.launcher) ----------------------------------------------------
def launch(experiment: str, nproc: int, backend: str, timeout_s: float = 120, **params: Any) -> dict:
    """Run `experiment` in `nproc` processes (torchrun) and return rank 0's result.

    Adds `launch_s` (the whole launch, process start-up included) and, for NCCL, `nccl`
    (version and transports from NCCL's log). Raises LaunchError on failure or timeout.
    """
    if experiment not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {experiment!r}; choose from {', '.join(EXPERIMENTS)}.")
    return torchrun("gpulab.lessons.l14_multi_gpu", [experiment, "--backend", backend, "--out", OUT,
                                                     "--params", json.dumps(params)],
                    nproc, backend, timeout_s, what=f"{experiment} ({nproc} x {backend})")


def as_timing(d: dict) -> Timing:
    """A Timing back from the JSON a worker wrote (`samples_ms`, `device`, `method`)."""
    return summarize(list(d["samples_ms"]), d["device"], d["method"])


def samples_per_s(d: dict) -> float:
    """Throughput of a timed step: samples per step over the median step time."""
    return d["samples"] / (as_timing(d).median_ms / 1e3)


# -- inside the workers ---------------------------------------------------------------------
@dataclass
class Ctx:
    rank: int
    world: int
    local_rank: int
    device: torch.device
    backend: str

    def gather(self, obj: Any) -> list:
        """Every rank's obj, in rank order (on every rank)."""
        out: list = [None] * self.world
        dist.all_gather_object(out, obj)
        return out


def _timing_dict(t: Timing, samples: int = 0) -> dict:
    return {"samples_ms": list(t.samples_ms), "device": t.device, "method": t.method,
            "median_ms": t.median_ms, "samples": samples}


def build_model(cfg: dict, device: torch.device, seed: int = 0) -> TransformerStack:
    """Lesson 09's GPT block stack, initialised on the CPU from `seed` (identical in every process)."""
    torch.manual_seed(seed)
    return TransformerStack(**cfg).to(device)


def global_batch(cfg: dict, batch: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The same (x, y) batch in every process: random embeddings and each position's next one (CPU)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(batch, cfg["seq"] + 1, cfg["width"], generator=g)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def _step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, divide: int = 1) -> torch.Tensor:
    loss = loss_fn(model(x), y) / divide
    loss.backward()
    return loss.detach()


def _grads(params: Sequence[nn.Parameter]) -> list[torch.Tensor]:
    """A copy of each gradient; one sharded by FSDP2 (a DTensor) gathered whole (a collective: every rank
    must call it)."""
    return [(p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone() for p in params]


def _speed_mode(device: torch.device):
    """TF32 matrix products for timed steps on a GPU; the checks run in plain fp32."""
    return float32_matmul("tf32") if device.type == "cuda" else contextlib.nullcontext()


def _sync_all(n: int) -> None:
    for d in range(n):
        torch.cuda.synchronize(d)


def exp_hello(ctx: Ctx, fail: bool = False, sleep_s: float = 0.0) -> dict:
    """Smoke test of a launch: one checked all-reduce. `fail`, `sleep_s`: the launcher's error paths."""
    if sleep_s:
        time.sleep(sleep_s)
    t = torch.tensor([ctx.rank + 1.0], device=ctx.device)
    dist.all_reduce(t)
    expected = ctx.world * (ctx.world + 1) / 2
    if t.item() != expected:
        raise Mismatch(f"all-reduce gave {t.item()}, expected {expected}")
    if fail and ctx.rank == ctx.world - 1:
        raise ValueError(f"rank {ctx.rank} was asked to fail (fail=True)")
    return {"sum": t.item(), "expected": expected,
            "ranks": ctx.gather({"rank": ctx.rank, "device": str(ctx.device), "pid": os.getpid()})}


def exp_dp(ctx: Ctx, model: dict, batch: int, gpus: int, warmup: int, repeat: int,
           tol: float = GRAD_TOL, process_group=None) -> dict:
    """One process: the plain model, DDP with one process, and DataParallel over `gpus` GPUs.

    Each variant's gradients are first checked against the plain model's on the same batch.
    `process_group`: a group of this process alone, when it runs inside a larger launch (`exp_suite`).
    """
    dev = ctx.device
    net = build_model(model, dev)
    ddp_net, dp_net = copy.deepcopy(net), copy.deepcopy(net)
    ddp = nn.parallel.DistributedDataParallel(ddp_net, device_ids=[dev.index] if dev.type == "cuda" else None,
                                              process_group=process_group)
    dp = nn.DataParallel(dp_net, device_ids=list(range(gpus)) if gpus else None)
    global_n = batch * max(gpus, 1)
    xg, yg = (t.to(dev) for t in global_batch(model, global_n))
    checks = {}
    with float32_matmul("ieee"):
        _step(net, xg, yg)
        ref = _grads(list(net.parameters()))
        _step(ddp, xg, yg)
        checks["DDP, 1 process"] = check_grads(_grads(list(ddp_net.parameters())), ref, tol, "DDP, 1 process")
        if gpus:
            _step(dp, xg, yg)
            checks[f"DataParallel, {gpus} GPU(s)"] = check_grads(_grads(list(dp_net.parameters())), ref, tol,
                                                                  f"DataParallel over {gpus} GPU(s)")
    x1, y1 = xg[:batch], yg[:batch]

    def plain_step():
        net.zero_grad(set_to_none=True)
        _step(net, x1, y1)

    def ddp_step():
        ddp.zero_grad(set_to_none=True)
        _step(ddp, x1, y1)

    def dp_step():
        dp.zero_grad(set_to_none=True)
        _step(dp, xg, yg)
        _sync_all(gpus)                      # every GPU's share is done, not only GPU 0's

    timings = {}
    with _speed_mode(dev):
        timings["1 device, plain"] = _timing_dict(benchmark(plain_step, warmup=warmup, repeat=repeat, device=dev), batch)
        timings["DDP, 1 process"] = _timing_dict(benchmark(ddp_step, warmup=warmup, repeat=repeat, device=dev), batch)
        if gpus:
            timings[f"DataParallel, {gpus} GPU(s)"] = _timing_dict(
                benchmark(dp_step, warmup=warmup, repeat=repeat, device=dev), global_n)
    return {"gpus": gpus, "batch_per_device": batch, "checks": checks, "tol": tol, "timings": timings,
            "dp_device_ids": list(dp.device_ids),
            "param_bytes": sum(p.numel() * p.element_size() for p in net.parameters())}


def bucket_layout(param_bytes: Sequence[int], cap_bytes: int) -> list[int]:
    """Bytes of each gradient bucket, as DDP forms them: parameters in reverse order (about the
    order backward produces their gradients), kept whole, a bucket closed once it reaches the cap."""
    if cap_bytes <= 0:
        raise ValueError(f"bucket cap must be positive (got {cap_bytes})")
    sizes, current = [], 0
    for nbytes in reversed(list(param_bytes)):
        current += nbytes
        if current >= cap_bytes:
            sizes.append(current)
            current = 0
    if current:
        sizes.append(current)
    return sizes


def bucket_buffers(sizes: Sequence[int], device: torch.device) -> list[torch.Tensor]:
    """One fp32 buffer per bucket size, to time the communication alone."""
    return [torch.zeros(max(1, n // 4), device=device) for n in sizes]


def exp_ddp(ctx: Ctx, model: dict, batch: int, warmup: int, repeat: int, buckets_mb: Sequence[float | None],
            accum_steps: int, accum_micro: int, tol: float = GRAD_TOL, corrupt: bool = False,
            gradient_as_bucket_view: bool = False, profile_steps: int = 0) -> dict:
    """DDP: gradients checked, throughput, `no_sync()` accumulation, and each bucket cap of `buckets_mb`
    (`bucket_run`: checked, then DDP step, compute only and communication only; the middle cap
    profiled over `profile_steps` steps on GPUs).

    `corrupt=True` skips the all-reduce of the checked step (each rank keeps its own gradient):
    the check must then fail. It exists to show that the check can fail.
    """
    dev, r, n = ctx.device, ctx.rank, ctx.world
    ids = [dev.index] if dev.type == "cuda" else None
    base = build_model(model, dev)
    params_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    ref_net = copy.deepcopy(base)
    net = copy.deepcopy(base)
    ddp = nn.parallel.DistributedDataParallel(net, device_ids=ids)
    xg, yg = (t.to(dev) for t in global_batch(model, batch * n))
    xs, ys = xg[r * batch:(r + 1) * batch], yg[r * batch:(r + 1) * batch]
    k, mb = accum_steps, accum_micro
    xa, ya = (t.to(dev) for t in global_batch(model, k * mb * n, seed=2))
    mine = slice(r * k * mb, (r + 1) * k * mb)
    micro = list(zip(xa[mine].chunk(k), ya[mine].chunk(k)))

    def accumulate(use_no_sync: bool) -> None:
        ddp.zero_grad(set_to_none=True)
        for i, (x, y) in enumerate(micro):
            skip = use_no_sync and i < k - 1
            with ddp.no_sync() if skip else contextlib.nullcontext():
                _step(ddp, x, y, divide=k)          # only the last backward all-reduces with no_sync

    checks = {}
    with float32_matmul("ieee"):
        ddp.zero_grad(set_to_none=True)
        with ddp.no_sync() if corrupt else contextlib.nullcontext():
            _step(ddp, xs, ys)
        got = _grads(list(net.parameters()))
        ref = ref_acc = None      # rank 0: the single-device step on every process's samples
        if r == 0:
            _step(ref_net, xg, yg)
            ref = _grads(list(ref_net.parameters()))
            checks["DDP step"] = check_grads(got, ref, tol, f"DDP over {n} processes, rank 0")
        for use in (True, False):
            accumulate(use)
            got = _grads(list(net.parameters()))
            if r == 0:
                if ref_acc is None:
                    ref_net.zero_grad(set_to_none=True)
                    _step(ref_net, xa, ya)
                    ref_acc = _grads(list(ref_net.parameters()))
                name = f"{k} micro-steps " + ("with no_sync" if use else "without no_sync")
                checks[name] = check_grads(got, ref_acc, tol, name)
        del ref_acc                # ref stays: each bucket cap below is checked against it
    ref_net.zero_grad(set_to_none=True)

    def ddp_step(d, x=xs, y=ys):
        d.zero_grad(set_to_none=True)
        _step(d, x, y)

    def bench(fn):
        return benchmark(fn, warmup=warmup, repeat=repeat, device=dev)

    out: dict[str, Any] = {"world": n, "batch_per_device": batch, "param_bytes": params_bytes, "checks": checks,
                           "tol": tol, "accum_steps": k, "accum_micro": mb}
    with _speed_mode(dev):
        t = bench(lambda: ddp_step(ddp))
        out["throughput"] = _timing_dict(t, batch * n)
        out["step_ms_by_rank"] = ctx.gather(t.median_ms)
        t_sync = bench(lambda: accumulate(False))
        t_nosync = bench(lambda: accumulate(True))
        out["accumulation"] = {"without no_sync": _timing_dict(t_sync, k * mb * n),
                               "with no_sync": _timing_dict(t_nosync, k * mb * n)}
        del ddp, net
        middle = buckets_mb[len(buckets_mb) // 2]
        out["buckets"] = [bucket_run(ctx, base, xs, ys, ref, cap, gradient_as_bucket_view, warmup, repeat, tol,
                                     profile_steps if cap == middle else 0) for cap in buckets_mb]
    return out


def bucket_run(ctx: Ctx, base: nn.Module, xs: torch.Tensor, ys: torch.Tensor, ref: Sequence[torch.Tensor] | None,
               cap: float | None, gradient_as_bucket_view: bool, warmup: int, repeat: int, tol: float = GRAD_TOL,
               profile_steps: int = 0) -> dict:
    """DDP on a copy of `base` with gradient buckets of `cap` MiB (None: one bucket for the whole model):
    its gradients checked against `ref` (rank 0's single-device step on every process's samples), then
    three timings on the same batch: the DDP step; compute only (the same step under `no_sync()`); the
    communication alone (one all-reduce per bucket, laid out as DDP lays them out, started back to back
    as DDP starts them). With `profile_steps`, on GPUs, also a profile of both steps (`profile_steps_of`).

    `gradient_as_bucket_view=True` makes each `.grad` a view into its bucket, so backward writes the
    gradients where the all-reduce reads them instead of being copied there; the views survive only
    if the gradients are zeroed in place (`zero_grad(set_to_none=False)`), which is what the steps do then.
    """
    dev = ctx.device
    ids = [dev.index] if dev.type == "cuda" else None
    sizes_of_params = [p.numel() * p.element_size() for p in base.parameters()]
    params_bytes = sum(sizes_of_params)
    cap_mb = cap if cap is not None else params_bytes / MiB * 1.01 + 1     # one bucket: the whole model
    label = "whole model" if cap is None else f"{cap:g} MiB"
    m = copy.deepcopy(base)
    d = nn.parallel.DistributedDataParallel(m, device_ids=ids, bucket_cap_mb=cap_mb,
                                            gradient_as_bucket_view=gradient_as_bucket_view)

    def ddp_step():
        d.zero_grad(set_to_none=not gradient_as_bucket_view)
        _step(d, xs, ys)

    def compute_only():
        d.zero_grad(set_to_none=not gradient_as_bucket_view)
        with d.no_sync():
            _step(d, xs, ys)

    with float32_matmul("ieee"):
        for _ in range(2):                 # the second step runs in the rebuilt buckets (and, as views, in them)
            ddp_step()
        diff = check_grads(_grads(list(m.parameters())), ref, tol, f"DDP, {label} buckets") if ref is not None else None
    bufs = bucket_buffers(bucket_layout(sizes_of_params, int(cap_mb * MiB)), dev)

    def comm():
        works = [dist.all_reduce(b, async_op=True) for b in bufs]   # as DDP issues them
        for w in works:
            w.wait()

    with _speed_mode(dev):
        t_ddp = benchmark(ddp_step, warmup=warmup, repeat=repeat, device=dev)
        t_comp = benchmark(compute_only, warmup=warmup, repeat=repeat, device=dev)
        t_comm = benchmark(comm, warmup=warmup, repeat=repeat, device=dev)
        if profile_steps and dev.type == "cuda":
            profile = profile_steps_of({"DDP step": ddp_step, "compute only": compute_only}, profile_steps, dev)
        else:
            profile = None if profile_steps == 0 else {
                "skipped": "the profile reads CUDA kernels: with gloo on CPU processes the all-reduce runs on the host"}
    row = {"cap_mb": cap_mb, "label": label, "n_buckets": len(bufs), "gradient_as_bucket_view": gradient_as_bucket_view,
           "grad_diff": diff, "ddp_ms": t_ddp.median_ms, "compute_ms": t_comp.median_ms, "comm_ms": t_comm.median_ms,
           "overlap": overlap_fraction(t_comp.median_ms, t_comm.median_ms, t_ddp.median_ms),
           "ddp_ms_by_rank": ctx.gather(t_ddp.median_ms), "profile": profile}
    return row                  # d, m and the buffers go with this frame


def profile_steps_of(fns: dict[str, Callable[[], None]], steps: int, device: torch.device) -> dict:
    """`steps` calls of each fn under `torch.profiler` (CUDA activity), their kernels sorted by
    `kernel_breakdown`, and the wall time per step (host clock, synchronized; the profiler adds a little).
    Every rank runs it (the steps' collectives need all of them) and runs the steps even if the profiler
    fails, so the ranks stay in step; the failure is reported as {"error": ...}."""
    from torch.profiler import ProfilerActivity, profile

    out: dict[str, Any] = {}
    errors = []
    for label, fn in fns.items():
        fn()
        torch.cuda.synchronize(device)
        prof, error = None, None
        try:
            prof = profile(activities=[ProfilerActivity.CUDA])
            prof.start()
        except Exception as err:            # noqa: BLE001 - the steps must run on every rank regardless
            prof, error = None, f"{type(err).__name__}: {err}"
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        torch.cuda.synchronize(device)
        wall = time.perf_counter() - t0
        try:
            if prof is not None:
                prof.stop()
                release_cupti()
                kernels = gpu_kernels(prof)
                out[label] = dict(kernel_breakdown(kernels, steps), wall_ms=wall * 1e3 / steps)
        except Exception as err:            # noqa: BLE001
            error = f"{type(err).__name__}: {err}"
        if error:
            errors.append(f"{label}: {error}")
    return {"error": "; ".join(errors)} if errors else out


def exp_buckets(ctx: Ctx, model: dict, batch: int, warmup: int, repeat: int, bucket_cap_mb: float,
                gradient_as_bucket_view: bool = False, profile_steps: int = 0, tol: float = GRAD_TOL) -> dict:
    """One bucket cap, with or without `gradient_as_bucket_view` (`bucket_run`): the notebook's bucket panel."""
    dev, r, n = ctx.device, ctx.rank, ctx.world
    base = build_model(model, dev)
    xg, yg = (t.to(dev) for t in global_batch(model, batch * n))
    ref = None
    if r == 0:
        ref_net = copy.deepcopy(base)
        with float32_matmul("ieee"):
            _step(ref_net, xg, yg)
        ref = _grads(list(ref_net.parameters()))
        del ref_net
    row = bucket_run(ctx, base, xg[r * batch:(r + 1) * batch], yg[r * batch:(r + 1) * batch], ref,
                     bucket_cap_mb, gradient_as_bucket_view, warmup, repeat, tol, profile_steps)
    return {"world": n, "tol": tol, "bucket": row}


def link_info(devices: Sequence[int]) -> dict[str, Any]:
    """How two GPUs are connected, from CUDA (peer access) and NVML (NVLink, PCIe topology)."""
    from gpulab.core import monitor

    from gpulab.core.device import profile

    prof = profile()
    if prof is not None and not prof.p2p:
        return {"summary": f"a MIG slice ({prof.key}: {prof.mig}): no P2P or NVLink to another GPU, and one "
                           "slice per process; two slices talk through host memory (NCCL's SHM or sockets)",
                "peer_access": False, "nvlink_active": 0, "nvlink_p2p": False, "pcie_ancestor": None,
                "nvml": "not used: the profile says what a slice has"}
    if len(devices) < 2 or not torch.cuda.is_available():
        return {"summary": "gloo over loopback (CPU)", "peer_access": None, "nvlink_active": None,
                "nvlink_p2p": None, "pcie_ancestor": None, "nvml": "not used on the CPU"}
    a, b = devices[0], devices[1]
    info: dict[str, Any] = {"peer_access": bool(torch.cuda.can_device_access_peer(a, b)),
                            "nvlink_active": None, "nvlink_p2p": None, "pcie_ancestor": None}
    ok, why = monitor.nvml_status()
    info["nvml"] = why
    if ok:
        pynvml = monitor.import_pynvml()
        pynvml.nvmlInit()
        try:
            ha = monitor.nvml_handle(pynvml, torch.device("cuda", a))
            hb = monitor.nvml_handle(pynvml, torch.device("cuda", b))
            names = {0: "same board", 10: "one PCIe switch", 20: "several PCIe switches",
                     30: "a PCIe host bridge", 40: "the same CPU (NUMA node)", 50: "across CPU sockets (SYSTEM)"}
            with contextlib.suppress(pynvml.NVMLError):
                level = pynvml.nvmlDeviceGetTopologyCommonAncestor(ha, hb)
                info["pcie_ancestor"] = names.get(int(level), str(level))
            with contextlib.suppress(pynvml.NVMLError, AttributeError):
                status = pynvml.nvmlDeviceGetP2PStatus(ha, hb, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)
                info["nvlink_p2p"] = status == pynvml.NVML_P2P_STATUS_OK
            active = 0
            for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    active += pynvml.nvmlDeviceGetNvLinkState(ha, link) == pynvml.NVML_FEATURE_ENABLED
                except pynvml.NVMLError:
                    continue
            info["nvlink_active"] = active
        finally:
            pynvml.nvmlShutdown()
    if info["nvlink_p2p"] or info["nvlink_active"]:
        kind = f"NVLink ({info['nvlink_active']} links active on GPU {a})"
    elif info["nvml"] and not ok:
        kind = "unknown: NVML is not usable (" + why + ")"
    else:
        kind = "PCIe" + (f" through {info['pcie_ancestor']}" if info["pcie_ancestor"] else "")
    info["summary"] = f"{kind}; CUDA peer access {'yes' if info['peer_access'] else 'no'}"
    return info


def exp_allreduce(ctx: Ctx, sizes: Sequence[int], warmup: int, repeat: int) -> dict:
    """All-reduce (sum, fp32) bandwidth against message size; each size checked once first."""
    dev, n = ctx.device, ctx.world
    link = (link_info(list(range(min(n, torch.cuda.device_count())))) if dev.type == "cuda"
            else link_info([])) if ctx.rank == 0 else None
    expected = n * (n + 1) / 2
    rows = []
    for nbytes in sizes:
        t = torch.full((max(1, int(nbytes) // 4),), float(ctx.rank + 1), device=dev)
        dist.all_reduce(t)
        if not bool(torch.all(t == expected)):
            raise Mismatch(f"all-reduce of {nbytes} bytes: rank {ctx.rank} got values other than {expected}")
        t.zero_()            # zeros stay zeros: repeated sums cannot overflow while timing
        timing = benchmark(lambda: dist.all_reduce(t), warmup=warmup, repeat=repeat, device=dev)
        seconds = timing.median_ms / 1e3
        alg = algbw_gbps(t.numel() * 4, seconds)
        rows.append({"bytes": t.numel() * 4, **_timing_dict(timing), "algbw_gbps": alg,
                     "busbw_gbps": busbw_gbps(alg, n)})
        del t
    return {"world": n, "rows": rows, "link": link}


def exp_pipeline(ctx: Ctx, model: dict, batch: int, micro_batches: Sequence[int], warmup: int, repeat: int,
                 tol: float = GRAD_TOL) -> dict:
    """A pipeline of `world` stages, one per process, GPipe schedule (all forwards, then all backwards).

    m = 1 is the naive split. Each stage's busy time is the sum of its forward and backward pieces
    (host clock, device synchronized around each piece); the step's wall time runs from a common
    barrier to the barrier after the last backward. Plain fp32 throughout (TF32 off).
    """
    dev, r, p = ctx.device, ctx.rank, ctx.world
    if p < 2:
        raise ValueError("a pipeline needs at least 2 processes")
    if model["n_blocks"] % p:
        raise ValueError(f"{model['n_blocks']} blocks do not split into {p} equal stages")
    for m in micro_batches:
        check_micro_batches(batch, m)
    first, last = r == 0, r == p - 1
    full = build_model(model, dev)                # every process builds the whole model, identically
    ref = copy.deepcopy(full)
    per = model["n_blocks"] // p
    blocks = list(full.blocks)[r * per:(r + 1) * per]
    prefixes = tuple(f"blocks.{i}." for i in range(r * per, (r + 1) * per)) + (("ln_f.", "head.") if last else ())
    mine = [(name, q) for name, q in full.named_parameters() if name.startswith(prefixes)]
    ref_params = dict(ref.named_parameters())
    x, y = (t.to(dev) for t in global_batch(model, batch))
    shape = (batch, model["seq"], model["width"])

    def stage(h: torch.Tensor) -> torch.Tensor:
        for blk in blocks:
            h = blk(h)
        return full.head(full.ln_f(h)) if last else h

    def pipe_step(m: int) -> dict:
        mshape = (shape[0] // m,) + shape[1:]
        xs, ys = x.chunk(m), y.chunk(m)
        full.zero_grad(set_to_none=True)
        busy = 0.0
        ins, outs = [], []
        dist.barrier()                                       # a common start
        with stopwatch(device=dev) as wall:
            for i in range(m):                               # all forwards
                if first:
                    h = xs[i]
                else:
                    h = torch.empty(mshape, device=dev)
                    dist.recv(h, src=r - 1)
                    h.requires_grad_()
                with stopwatch(device=dev) as piece:
                    out = stage(h)
                    if last:
                        out = loss_fn(out, ys[i]) / m        # the batch loss is the mean of the micro-batch means
                busy += piece.ms
                ins.append(h)
                outs.append(out)
                if not last:
                    dist.send(out.detach(), dst=r + 1)
            for i in reversed(range(m)):                     # all backwards, last micro-batch first
                grad = None
                if not last:
                    grad = torch.empty(mshape, device=dev)
                    dist.recv(grad, src=r + 1)
                with stopwatch(device=dev) as piece:
                    outs[i].backward(grad)
                busy += piece.ms
                if not first:
                    dist.send(ins[i].grad, dst=r - 1)
            dist.barrier()                                   # the step ends when the last stage is done
        loss = sum(float(o) for o in outs) if last else None
        return {"busy_ms": busy, "wall_ms": wall.ms, "loss": loss}

    results = {}
    with float32_matmul("ieee"):
        ref_loss = float(_step(ref, x, y))
        want = [ref_params[name].grad for name, _ in mine]
        for m in micro_batches:
            first_step = pipe_step(m)
            diff = check_grads([q.grad for _, q in mine], want, tol, f"pipeline stage {r}, m={m}")
            if last and abs(first_step["loss"] - ref_loss) > tol * abs(ref_loss):
                raise Mismatch(f"pipeline loss {first_step['loss']!r} differs from the unsplit model's {ref_loss!r}")
            for _ in range(warmup - 1):
                pipe_step(m)
            steps = [pipe_step(m) for _ in range(repeat)]
            results[m] = {"diff": diff, "busy_ms": [s["busy_ms"] for s in steps],
                          "wall_ms": [s["wall_ms"] for s in steps], "loss": first_step["loss"]}
    everyone = ctx.gather(results)
    out = []
    for m in micro_batches:
        walls = [max(ranks[m]["wall_ms"][j] for ranks in everyone) for j in range(repeat)]
        stages = []
        for s, ranks in enumerate(everyone):
            bubbles = sorted(measured_bubble(b, w) for b, w in zip(ranks[m]["busy_ms"], walls))
            stages.append({"stage": s, "busy_ms": sorted(ranks[m]["busy_ms"])[repeat // 2],
                           "bubble": bubbles[repeat // 2], "grad_diff": ranks[m]["diff"]})
        out.append({"micro_batches": m, "wall_ms": sorted(walls)[repeat // 2], "stages": stages,
                    "bubble_formula": bubble_fraction(p, m),
                    "bubble_measured": sum(st["bubble"] for st in stages) / p,
                    "loss": everyone[-1][m]["loss"]})
    return {"stages": p, "batch": batch, "rows": out, "ref_loss": ref_loss, "tol": tol,
            "activation_bytes": batch * model["seq"] * model["width"] * 4}


def exp_fsdp(ctx: Ctx, model: dict, batch: int, warmup: int, repeat: int, updates: int = 3, lr: float = 1e-3,
             tol: float = GRAD_TOL, corrupt: bool = False) -> dict:
    """FSDP2 against DDP on the same model and data. `fully_shard` wraps each block, then the whole model
    (the head and final LayerNorm form the root's unit); both train with AdamW from the same weights on each
    rank's slice of the same batches (a fourth variant prefetches FSDP_PREFETCH units explicitly). Checked first: the first step's gradients (FSDP2's gathered from their
    shards) against DDP's, within `tol` of the norm (AdamW would hide a gradient off by a constant factor);
    then, after `updates` steps, the weights, by the course's one comparison (`cases.compare`: within
    SAME_MAX_FLOOR times the noise floor measured on rank 0, DDP against one process on the whole batch). Then each is timed, `reshard_after_forward` True and False,
    with each rank's memory at rest (after a step, gradients freed) and at peak, on GPUs. The starting
    weights and the batches stay on the CPU, so the GPU holds only what the variant being timed holds.

    `corrupt=True` scales the last rank's batch by 2 in the FSDP2 run's checked steps: the check must fail."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from gpulab.models.same import compare, parameters

    cpu = torch.device("cpu")
    dev, r, n = ctx.device, ctx.rank, ctx.world
    ids = [dev.index] if dev.type == "cuda" else None
    mesh = init_device_mesh(dev.type, (n,))
    base = build_model(model, cpu)                       # on the CPU: each variant copies it to the device
    start = parameters(base)
    count = sum(p.numel() for p in base.parameters())
    unit = max(sum(p.numel() for p in b.parameters()) for b in base.blocks)

    def on_device() -> nn.Module:
        return copy.deepcopy(base).to(dev)

    def sharded(reshard: bool, prefetch: int = 0) -> nn.Module:
        net = on_device()
        for block in net.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(net, mesh=mesh, reshard_after_forward=reshard)
        if prefetch:       # explicit: each block issues the all-gathers of the next `prefetch` blocks (backward: the previous)
            blocks = list(net.blocks)
            for i, block in enumerate(blocks):
                block.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + prefetch])
                block.set_modules_to_backward_prefetch(blocks[max(0, i - prefetch):i][::-1])
        return net

    def data(k: int, whole: bool = False, scale_mine: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = global_batch(model, batch * n, seed=10 + k)             # on the CPU; only what is used moves
        if not whole:
            x, y = x[r * batch:(r + 1) * batch] * scale_mine, y[r * batch:(r + 1) * batch]
        return x.to(dev), y.to(dev)

    checks: dict[str, Any] = {}
    with float32_matmul("ieee"):
        ddp = nn.parallel.DistributedDataParallel(on_device(), device_ids=ids)
        ddp_opt = torch.optim.AdamW(ddp.parameters(), lr=lr)
        fsdp = sharded(True)
        fsdp_opt = torch.optim.AdamW(fsdp.parameters(), lr=lr)
        for k in range(updates):
            for net, opt, mine in ((ddp, ddp_opt, 1.0), (fsdp, fsdp_opt, 2.0 if corrupt and r == n - 1 else 1.0)):
                opt.zero_grad(set_to_none=True)
                _step(net, *data(k, scale_mine=mine))
            if k == 0:
                got, want = _grads(list(fsdp.parameters())), _grads(list(ddp.module.parameters()))   # every rank
                if r == 0:
                    checks["grads"] = check_grads(got, want, tol, f"FSDP2 over {n} processes, first step", "DDP")
                del got, want
            ddp_opt.step()
            fsdp_opt.step()
        got, want = ([t.cpu() for t in parameters(m)] for m in (fsdp, ddp.module))   # every rank: a collective
        if r == 0:
            ref = on_device()
            ref_opt = torch.optim.AdamW(ref.parameters(), lr=lr)
            for k in range(updates):
                ref_opt.zero_grad(set_to_none=True)
                _step(ref, *data(k, whole=True))
                ref_opt.step()
            same = compare(start, want, got, [(want, [t.cpu() for t in parameters(ref)])], k=updates,
                           floor_is="DDP against one process on the whole batch", what="FSDP2")
            checks.update(updates=updates, **same)
            if not same["ok"]:
                raise Mismatch(f"FSDP2 over {n} processes against DDP: {same['why']}")
            del ref, ref_opt
        del fsdp, fsdp_opt, got, want, ddp, ddp_opt
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()

    out: dict[str, Any] = {"world": n, "batch_per_device": batch, "params": count, "largest_unit": unit,
                           "checks": checks, "tol": tol, "variants": {}}
    makers = {"DDP": lambda: nn.parallel.DistributedDataParallel(on_device(), device_ids=ids),
              "FSDP2, reshard_after_forward=True": lambda: sharded(True),
              "FSDP2, reshard_after_forward=False": lambda: sharded(False),
              f"FSDP2, reshard_after_forward=True, prefetch {FSDP_PREFETCH} units": lambda: sharded(True, FSDP_PREFETCH)}
    x, y = data(0)
    with _speed_mode(dev):
        for name, make in makers.items():
            net = make()
            opt = torch.optim.AdamW(net.parameters(), lr=lr)

            def step(net=net, opt=opt):
                opt.zero_grad(set_to_none=True)
                _step(net, x, y)
                opt.step()

            step()                                   # AdamW's moments exist from here on
            opt.zero_grad(set_to_none=True)
            row: dict[str, Any] = {}
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
                row["rest_bytes"] = ctx.gather(torch.cuda.memory_allocated(dev))
                torch.cuda.reset_peak_memory_stats(dev)
            t = benchmark(step, warmup=warmup, repeat=repeat, device=dev)
            if dev.type == "cuda":
                row["peak_bytes"] = ctx.gather(torch.cuda.max_memory_allocated(dev))
            row["timing"] = _timing_dict(t, batch * n)
            row["step_ms_by_rank"] = ctx.gather(t.median_ms)
            out["variants"][name] = row
            del net, opt, step
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return out


def exp_suite(ctx: Ctx, ddp: dict, allreduce: dict, pipeline: dict | None = None, dp: dict | None = None,
              fsdp: dict | None = None) -> dict:
    """(With `dp` given) `dp` on rank 0 alone, then `ddp`, `allreduce` and (each when given) `pipeline` and
    `fsdp`, in one set of processes.

    Each launch pays seconds of start-up (Python, PyTorch, the process group) before any
    measurement; running the parts in one launch pays it once. Each part's own time is kept.
    `dp` runs while the other ranks wait (DataParallel drives every GPU from one process), with its
    one-process DDP on a group of rank 0 alone. They wait at a gloo barrier, on the host: an NCCL
    barrier would leave a kernel spinning on their GPU, taking SMs from DataParallel's replica there.
    """
    out: dict[str, Any] = {"dp": None}
    if dp is not None:
        alone = dist.new_group([0])                   # every rank takes part in creating each group
        on_host = dist.new_group(backend="gloo")
        if ctx.rank == 0:
            t0 = time.perf_counter()
            out["dp"] = dict(exp_dp(ctx, **dp, process_group=alone), work_s=time.perf_counter() - t0)
        dist.barrier(group=on_host)
    for name, fn, params in (("ddp", exp_ddp, ddp), ("allreduce", exp_allreduce, allreduce),
                             ("pipeline", exp_pipeline, pipeline), ("fsdp", exp_fsdp, fsdp)):
        if params is None:
            out[name] = None
            continue
        dist.barrier()                      # every rank starts the part together
        t0 = time.perf_counter()
        out[name] = dict(fn(ctx, **params), work_s=time.perf_counter() - t0)
    return out


EXPERIMENTS: dict[str, Callable[..., dict]] = {
    "hello": exp_hello, "dp": exp_dp, "ddp": exp_ddp, "buckets": exp_buckets, "allreduce": exp_allreduce,
    "pipeline": exp_pipeline, "suite": exp_suite, "fsdp": exp_fsdp,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpulab.lessons.l14_multi_gpu",
                                description="One of lesson 14's experiments, in each process torchrun starts.")
    p.add_argument("experiment", choices=sorted(EXPERIMENTS))
    p.add_argument("--backend", choices=BACKENDS, default="gloo")
    p.add_argument("--out", default=None, help="rank 0 writes its JSON result here")
    p.add_argument("--params", default="{}", help="the experiment's arguments, as JSON")
    a = p.parse_args(argv)
    die_with_parent()
    params = json.loads(a.params)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if "MASTER_ADDR" not in os.environ:                  # started without torchrun: a group of one
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000),
                          RANK="0", WORLD_SIZE="1")
    device = torch.device("cuda", local) if a.backend == "nccl" else torch.device("cpu")
    t0 = time.perf_counter()
    try:
        if device.type == "cuda":
            torch.cuda.set_device(device)
            dist.init_process_group(a.backend, device_id=device)
        else:
            dist.init_process_group(a.backend)
        ctx = Ctx(rank, world, local, device, a.backend)
        t1 = time.perf_counter()
        result = EXPERIMENTS[a.experiment](ctx, **params)
    except Exception as err:
        if a.out:
            write_rank_error(a.out, rank, err)
        raise
    result = dict(result, experiment=a.experiment, backend=a.backend, world_size=world, device=device.type,
                  torch=torch.__version__, init_s=t1 - t0, work_s=time.perf_counter() - t1)
    if rank == 0 and a.out:
        tmp = f"{a.out}.tmp"
        Path(tmp).write_text(json.dumps(result))
        os.replace(tmp, a.out)
    del result, ctx
    gc.collect()                 # DDP reducers and pending work go before their process group
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


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
        host_source="wall time of notebook 14 in results/h200-2026-11-30-course-2/h200-2026-11-30-course-2-timings.tsv (one H200, "
                    "torch 2.11, 2026-11-30) minus its GPU work at the ceilings in results/h200-2026-11-30-course/h200-2026-11-30-course.json",
    )
