"""Lesson 14's arithmetic and its correctness checks, plain functions of numbers and tensors.

- bandwidth: `algbw_gbps`, `busbw_gbps` (nccl-tests' definitions), `ring_bytes_per_gpu`, `dp_bytes_gpu0`;
- memory: `state_bytes_per_gpu` (DDP and FSDP2's fp32 AdamW state per GPU);
- pipelines: `bubble_fraction` (GPipe's formula), `measured_bubble`, `check_micro_batches`;
- DDP: `bucket_layout` (its gradient buckets), `overlap_fraction` (the share of the all-reduce hidden),
  and a profile's kernels sorted by `kernel_kind` and added up by `kernel_breakdown`;
- checks: `check_grads` (a distributed step's gradients against a single-device step's), `Mismatch`.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from gpulab.core.timing import intersect, merge_intervals

MiB = 2**20

GRAD_TOL = 1e-5     # largest |difference| of any gradient entry / norm of the reference gradient

HIDDEN_LOW = 0.5    # notebook 14's self-check: at least half of DDP's all-reduce hidden (`overlap_fraction`)
# Not judged until a run on two GPUs has measured the share: 0.5 is a planning figure, and the two-H200 runs of
# 2026-11-30 (before this column existed) suggest DDP's own bucket work leaves less than that hidden.
HIDDEN_JUDGED = False
HIDDEN_WHY_NOT = ("not judged yet: no run on two GPUs has measured this share, so its threshold "
                  f"({HIDDEN_LOW:g}) is a planning figure, not a measurement")


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


def overlap_fraction(alone_ms: float, comm_ms: float, step_ms: float) -> float | None:
    """Share of the communication the step did not pay for: (alone + comm - step) / comm, clipped to [0, 1],
    where `alone_ms` is the same step without the communication and `comm_ms` the communication by itself.

    1: the step costs no more than without it; 0: the two ran one after the other (or worse). None when there
    is no communication time to hide. The answer depends on what `alone_ms` leaves out: for DDP, the step
    without its all-reduce (a comm hook that returns each bucket as it is) still copies the gradients into
    the buckets and back; a step under `no_sync()` skips those copies too, and against it they read as
    communication that was not hidden (on a fast link, as much as the whole all-reduce).
    """
    if comm_ms <= 0:
        return None
    return min(1.0, max(0.0, (alone_ms + comm_ms - step_ms) / comm_ms))


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
