"""The rules: which bottleneck is yours, and the most fixing it can buy.

Each rule is a small function `rule(facts) -> Verdict | None` that reads `Facts` (analyze.py) and fires
when its evidence crosses a threshold. Every threshold is a named constant with its reason.

A fired rule names the share of the (unprofiled) step its fix can remove at most (`share`), so the step
can get at most `bound = 1 / (1 - share)` times faster (Amdahl's law). Each rule's docstring says why its
share is an upper bound by construction. Measured gains can still exceed it: by the timings' own noise,
and where a fix also speeds up what the rule did not count (16-bit autocast also halves the bytes of the
elementwise kernels between the matrix products). `gpulab bench`'s suite measures how often.

`run_rules(facts)` runs them all (skipping, with the reason, those that need a GPU when there is none)
and ranks what fired by its bound, largest first; "compute_bound" is not a fix but what is left, so it
comes last and only when nothing else fired.
"""
from __future__ import annotations

import math

from collections.abc import Callable
from dataclasses import dataclass

from gpulab.core.memory import fmt_bytes
from gpulab.diagnose.analyze import Facts

# -- thresholds ------------------------------------------------------------------------------------
# A DataLoader wait of 5 % of the step or more: the TensorBoard PyTorch profiler plugin
# (torch_tb_profiler, RunProfile.analyze) recommends DataLoader workers when "X % of the step time is in
# DataLoader" exceeds 5 %; below it, tuning the pipeline buys too little to be worth a lesson.
INPUT_SHARE_MIN = 0.05
# The same 5 % for idle time behind a synchronizing call: the host stops queueing work while it waits,
# so the GPU idles once per sync; as for input, a smaller share is not worth chasing first.
SYNC_SHARE_MIN = 0.05
# Pageable copies (their GPU time plus the GPU's idle wait while the host staged them) above 5 %: the
# same "worth fixing" share; the fix (pinned memory, non_blocking=True) is one line (lesson 05).
PAGEABLE_SHARE_MIN = 0.05
# Host-side launch overhead above 10 % of the step. The fix (CUDA graphs, torch.compile) changes how the
# step is built, so it must buy more than the one-line fixes above before it is suggested.
LAUNCH_SHARE_MIN = 0.10
# ...and only when the median kernel is shorter than this: a kernel shorter than the host's cost of
# issuing the next one (the dispatcher plus cudaLaunchKernel, tens of microseconds per op with Python
# around it; lesson 11 measures it) lets the GPU run dry; with longer kernels the queue stays ahead.
LAUNCH_KERNEL_US_MAX = 20.0
# ...and only when the host launched most kernels one at a time: at least half as many launch calls as
# kernels. A step replayed from a CUDA graph (one cudaGraphLaunch for all its kernels) already has the
# fix; what idles it is the loop around it, not kernel launches.
LAUNCHES_PER_KERNEL_MIN = 0.5
# fp32 matrix products without Tensor Cores above 10 % of the step: TF32 or 16-bit autocast speeds them
# up (lesson 06 measures by how much on this GPU) but changes numerics, so it must be a real share.
FP32_GEMM_SHARE_MIN = 0.10
# Misaligned 16-bit GEMMs above 5 %: padding a dimension to a multiple of 8 (or 64, lesson 07) is a
# one-line change, so the "worth fixing" share of the one-line fixes applies.
MISALIGNED_SHARE_MIN = 0.05
# The GPU idle inside cudaMalloc/cudaFree above 5 % of the step: the same "worth fixing" share.
ALLOCATOR_SHARE_MIN = 0.05
# Peak reserved memory at or above 90 % of the GPU's: a judgement, not a measured edge - with under a
# tenth left, the allocator has little room to find blocks and retries (frees its cache, synchronizes)
# as soon as the allocation pattern shifts; lesson 09's checkpointing frees room.
PEAK_RESERVED_FRAC_MAX = 0.90
# Communication not hidden behind compute above 10 % of the step: bucketing and overlap (DDP's
# defaults, lesson 14) restructure the backward pass, so as for launch overhead the bar is 10 %.
COMM_EXPOSED_SHARE_MIN = 0.10
# The GPU busy at least 90 % of the step: the host keeps it fed, so what is left is the kernels' own
# speed (MFU). Below it, idle time is a larger lever than any kernel.
COMPUTE_BUSY_MIN = 0.90


@dataclass(frozen=True)
class Verdict:
    """A fired rule: the bottleneck, where the course teaches it, and what fixing it can buy at most."""

    rule: str
    bottleneck: str           # a human name
    lesson: str               # "03"
    share: float              # the share of the step the fix can remove (0..1), an upper bound
    bound: float              # 1 / (1 - share): the most the step can speed up
    evidence: str             # the numbers that fired it
    fix: str                  # what to change, one line
    actionable: bool = True   # False for "compute_bound": the ceiling that is left, not a fix

    def to_dict(self) -> dict:
        """Plain values; an infinite bound (a share of 1) becomes None."""
        return {"rule": self.rule, "bottleneck": self.bottleneck, "lesson": self.lesson, "share": self.share,
                "bound": self.bound if self.bound != float("inf") else None, "evidence": self.evidence,
                "fix": self.fix, "actionable": self.actionable}


def verdict(rule: str, bottleneck: str, lesson: str, share: float, evidence: str, fix: str,
            actionable: bool = True) -> Verdict:
    """A Verdict with its Amdahl bound: a step that loses `share` of its time runs 1 / (1 - share) faster."""
    share = min(max(share, 0.0), 1.0)
    bound = 1.0 / (1.0 - share) if share < 1.0 else float("inf")
    return Verdict(rule, bottleneck, lesson, share, bound, evidence, fix, actionable)


def pct(x: float) -> str:
    return f"{100 * x:.1f} %"


# -- a fix against its promise -----------------------------------------------------------------------
# A fix must save at least this share of what its verdict promised (issue 17).
PROMISE_KEPT_MIN = 0.5
# The gain may exceed the bound by the step timings' own spread (before + after, relative), and by at
# least this floor: a judgement, since three chunks of a few steps on the host clock rarely repeat closer.
NOISE_FLOOR = 0.01


def judge_gain(before_ms: float, after_ms: float, bound: float | None, spread_before: float = 0.0,
               spread_after: float = 0.0) -> dict:
    """A fix's measured gain against its verdict's Amdahl bound (None: no bound, infinite), from two
    unprofiled step times and their relative spreads. In time: `promised_ms` = before - before / bound
    (what the bound allowed the fix to save), `saved_ms` = before - after, `of_promised` their ratio.
    `within`: it saved at most the promise, give or take the steps' spread (the ratio before / after
    magnifies a small error in `after` when the promise is most of the step); `enough`: it saved at
    least PROMISE_KEPT_MIN of the promise; `of_promised_max`: the largest `of_promised` still within."""
    bound = math.inf if bound is None else bound
    promised = before_ms - before_ms / bound
    saved = before_ms - after_ms
    noise = max(spread_before + spread_after, NOISE_FLOOR)
    of_promised = saved / promised if promised > 0 else math.inf
    return {"speedup": before_ms / after_ms, "bound": bound, "promised_ms": promised, "saved_ms": saved,
            "of_promised": of_promised, "noise": noise,
            "of_promised_max": 1 + noise * before_ms / promised if promised > 0 else math.inf,
            "within": saved <= promised + noise * before_ms, "enough": of_promised >= PROMISE_KEPT_MIN}


# -- the rules -------------------------------------------------------------------------------------
def input_bound(f: Facts) -> Verdict | None:
    """The GPU waits for the next batch. Share: that idle time, and the launch gaps after it: once the GPU
    has waited, its queue is empty and the rest of the step runs at the pace the host issues work, gaps a
    pipeline that keeps up also removes. A faster input pipeline can at best remove both, never more."""
    share = f.share(f.idle("input"))
    if share < INPUT_SHARE_MIN:
        return None
    share = f.share(f.idle("input") + f.idle("launch"))
    return verdict("input_bound", "input pipeline (waiting for the DataLoader)", "03", share,
                   f"GPU idle {f.idle('input'):.3g} ms per step ({pct(f.share(f.idle('input')))}) while the host "
                   f"waited for the next batch (threshold {pct(INPUT_SHARE_MIN)}), and {f.idle('launch'):.3g} ms "
                   "of launch gaps",
                   "DataLoader(num_workers>0, pin_memory=True, persistent_workers=True, prefetch_factor)")


def host_sync(f: Facts) -> Verdict | None:
    """The host waits for the GPU (`.item()`, `print(tensor)`, `torch.cuda.synchronize()`), so the
    queue runs empty. Share: the idle time that followed such waits; removing them can at best remove it."""
    share = f.share(f.idle("sync"))
    if share < SYNC_SHARE_MIN:
        return None
    return verdict("host_sync", "host synchronization (.item(), synchronize)", "01", share,
                   f"GPU idle {f.idle('sync'):.3g} ms per step ({pct(share)}) right after the host "
                   f"waited on it (threshold {pct(SYNC_SHARE_MIN)})",
                   "keep values on the GPU (no .item()/print per step; read them every N steps)")


def pageable_copy(f: Facts) -> Verdict | None:
    """Host<->device copies from pageable memory: staged by the CPU, and they block the host. Share:
    their GPU time plus the idle time while the host staged them; pinned, asynchronous copies can at
    best hide all of it behind compute."""
    share = min(f.busy_share(f.pageable_copy_ms) + f.share(f.idle("pageable_copy")), 1.0)
    if share < PAGEABLE_SHARE_MIN:
        return None
    return verdict("pageable_copy", "pageable host<->device copies", "05", share,
                   f"pageable copies {f.pageable_copy_ms:.3g} ms on the GPU + {f.idle('pageable_copy'):.3g} ms "
                   f"GPU idle while staging, per step ({pct(share)}; threshold {pct(PAGEABLE_SHARE_MIN)})",
                   "pin the host tensors (pin_memory=True) and copy with .to(device, non_blocking=True)")


def launch_bound(f: Facts) -> Verdict | None:
    """The host cannot issue kernels as fast as the GPU runs them. Fires on the idle time while the host
    was issuing work. Share: that and the idle while the host ran its own code ("other"): a replayed CUDA
    graph runs none of the step's host work, so at best the step shrinks to its busy time."""
    ms = f.idle("launch")
    if f.share(ms) < LAUNCH_SHARE_MIN or f.median_kernel_us is None or f.median_kernel_us >= LAUNCH_KERNEL_US_MAX:
        return None
    if f.launches_per_step is not None and f.launches_per_step < LAUNCHES_PER_KERNEL_MIN * f.kernels_per_step:
        return None
    share = f.share(ms + f.idle("other"))
    return verdict("launch_bound", "kernel launch overhead (many short kernels)", "11", share,
                   f"GPU idle {ms:.3g} ms per step ({pct(f.share(ms))}) while the host issued work, "
                   f"{f.idle('other'):.3g} ms in its own code; "
                   f"{f.kernels_per_step:.0f} kernels per step, median {f.median_kernel_us:.3g} us "
                   f"(thresholds {pct(LAUNCH_SHARE_MIN)}, < {LAUNCH_KERNEL_US_MAX:g} us)",
                   "capture the step in a CUDA graph (torch.compile(mode='reduce-overhead')) or fuse small ops")


def _above_peak(ms: float, flops: float, f: Facts) -> float:
    """What remains of `ms` beyond the time `flops` take at the fastest a 16-bit matrix product can run
    (`kernel_ceiling_tflops`, the datasheet's dense peak, else the measured one): the most a faster kernel
    can save (all of `ms` when the ceiling or the FLOPs are unknown)."""
    ceiling = max(f.kernel_ceiling_tflops or 0.0, f.peak_tflops or 0.0)
    if ceiling and flops:
        return max(ms - flops / (ceiling * 1e12) * 1e3, 0.0)
    return ms


def fp32_no_tensor_cores(f: Facts) -> Verdict | None:
    """fp32 matrix products on the CUDA cores. Share: their time minus what their FLOPs take at the
    16-bit Tensor Core peak; no precision setting beats that peak, so the fix saves at most the rest."""
    ms, flops = f.gemm_ms(lambda g: g.dtype == "fp32" and not g.tensor_cores)
    if f.busy_share(ms) < FP32_GEMM_SHARE_MIN:
        return None
    share = f.busy_share(_above_peak(ms, flops, f))
    return verdict("fp32_no_tensor_cores", "Tensor Cores unused (fp32 matrix products)", "06", share,
                   f"fp32 GEMMs without Tensor Cores {ms:.3g} ms per step ({pct(f.busy_share(ms))}; threshold "
                   f"{pct(FP32_GEMM_SHARE_MIN)}); TF32 for matmuls {'on' if f.tf32_matmul else 'off'}",
                   "train under torch.amp.autocast('cuda', dtype=torch.bfloat16) (fp16 + GradScaler "
                   "without bf16), or allow TF32")


def misaligned_gemm(f: Facts) -> Verdict | None:
    """16-bit GEMMs with a dimension that is not a multiple of 8. Share: their time minus what their
    FLOPs take at the 16-bit peak: padding cannot make them faster than the peak."""
    ms, flops = f.gemm_ms(lambda g: g.misaligned)
    if f.busy_share(ms) < MISALIGNED_SHARE_MIN:
        return None
    worst = max((g for g in f.gemms if g.misaligned), key=lambda g: g.gpu_ms)
    share = f.busy_share(_above_peak(ms, flops, f))
    return verdict("misaligned_gemm", "misaligned matrix shapes (Tensor Core tiles)", "07", share,
                   f"16-bit GEMMs with M, N or K not a multiple of 8: {ms:.3g} ms per step "
                   f"({pct(f.busy_share(ms))}; threshold {pct(MISALIGNED_SHARE_MIN)}), largest {worst.op} "
                   f"{list(worst.shapes)}",
                   "pad the odd dimension (vocabulary, hidden size, batch x sequence) to a multiple of 64")


def memory_pressure(f: Facts) -> Verdict | None:
    """The caching allocator struggles: retries (cudaFree of its cache, a synchronize, cudaMalloc
    again), time in cudaMalloc/cudaFree, or almost no memory left. Share: the idle time inside the
    allocator, all a better allocation pattern can give back (0 when only the warning signs fired)."""
    m = f.memory
    ms = f.idle("allocator")
    share = f.share(ms)
    retries = m.alloc_retries if m else 0
    near_full = m is not None and m.peak_reserved_frac >= PEAK_RESERVED_FRAC_MAX
    if not (retries > 0 or share >= ALLOCATOR_SHARE_MIN or near_full):
        return None
    evidence = [f"GPU idle in the allocator {ms:.3g} ms per step ({pct(share)})"]
    if m is not None:
        evidence.append(f"{retries} allocation retries; inactive split {fmt_bytes(m.inactive_split_bytes)}; "
                        f"peak reserved {fmt_bytes(m.peak_reserved_bytes)} of {fmt_bytes(m.total_bytes)} "
                        f"({pct(m.peak_reserved_frac)})")
    if near_full:
        fix, lesson = "free room: activation checkpointing, a smaller micro-batch with accumulation", "09"
    else:
        fix, lesson = "keep shapes steady, free what you no longer need, PYTORCH_ALLOC_CONF=expandable_segments:True", "02"
    return verdict("memory_pressure", "memory pressure / fragmentation", lesson, share, "; ".join(evidence), fix)


def comm_not_overlapped(f: Facts) -> Verdict | None:
    """Collectives (NCCL) that run while no compute runs beside them. Share: that exposed time;
    overlapping communication with the backward pass can at best hide all of it."""
    share = f.busy_share(f.comm_exposed_ms)
    if share < COMM_EXPOSED_SHARE_MIN:
        return None
    return verdict("comm_not_overlapped", "communication not overlapped with compute", "14", share,
                   f"exposed communication {f.comm_exposed_ms:.3g} of {f.comm_ms:.3g} ms per step "
                   f"({pct(share)}; threshold {pct(COMM_EXPOSED_SHARE_MIN)})",
                   "let DDP overlap: gradient buckets (bucket_cap_mb), no_sync() while accumulating")


def compute_bound(f: Facts) -> Verdict | None:
    """The device is kept busy: what is left is how fast its kernels run. Share: 1 - MFU, the time the
    step would lose if it ran at the measured 16-bit peak - no kernel runs faster (0 when unknown).
    `run_rules` shows it last, and only when no other rule fired."""
    busy = f.share(f.busy_ms)
    if busy < COMPUTE_BUSY_MIN:
        return None
    gemm = f.busy_by_class["gemm_tensor_core"] + f.busy_by_class["gemm_no_tensor_core"]
    elementwise = f.busy_by_class["elementwise_norm"] > gemm
    lesson = "12" if elementwise else "13"
    if f.mfu is None:
        mfu = ("MFU unknown: run notebook 00 to measure this GPU's peak" if not f.peak_tflops
               else "MFU unknown: no FLOP count for the step")
        share = 0.0
    else:
        mfu = f"{f.tflops:.3g} TFLOP/s = MFU {pct(f.mfu)} of {f.peak_tflops:.3g} TFLOP/s ({f.peak_source})"
        share = 1.0 - min(f.mfu, 1.0)
    fix = ("fuse the elementwise and normalization kernels (torch.compile)" if elementwise
           else "larger matrix products, 16-bit math, fused attention: lesson 13's stack")
    return verdict("compute_bound", "compute-bound: the kernels themselves", lesson, share,
                   f"device busy {pct(busy)} of the step (threshold {pct(COMPUTE_BUSY_MIN)}); {mfu}", fix,
                   actionable=False)


RULES: list[Callable[[Facts], Verdict | None]] = [
    input_bound, host_sync, pageable_copy, launch_bound, fp32_no_tensor_cores, misaligned_gemm,
    memory_pressure, comm_not_overlapped, compute_bound,
]


# Rules that read what only a GPU records, and why they cannot run on the CPU.
GPU_ONLY = {
    "host_sync": "needs a GPU: on the CPU the host never waits for a device",
    "pageable_copy": "needs a GPU: on the CPU there are no host<->device copies",
    "launch_bound": "needs a GPU: on the CPU there are no kernels to launch or time",
    "fp32_no_tensor_cores": "needs a GPU: Tensor Cores and their kernel names exist only there",
    "misaligned_gemm": "needs a GPU: Tensor Core tile alignment matters only there",
    "memory_pressure": "needs a GPU: the CUDA caching allocator's statistics exist only there",
    "comm_not_overlapped": "needs a GPU: NCCL communication kernels run only there",
}


def run_rules(f: Facts, rules: list | None = None) -> tuple[list[Verdict], dict[str, str]]:
    """(verdicts ranked by bound, largest first; {rule: why it was skipped})."""
    fired, skipped = [], {}
    for rule in rules if rules is not None else RULES:
        name = rule.__name__
        if not f.on_gpu and name in GPU_ONLY:
            skipped[name] = GPU_ONLY[name]
            continue
        v = rule(f)
        if v is not None:
            fired.append(v)
    fixes = sorted((v for v in fired if v.actionable), key=lambda v: -v.bound)
    rest = [v for v in fired if not v.actionable] if not fixes else []
    return fixes + rest, skipped
