"""Lesson 01, measuring GPU time right: its knobs and its headline measurement.

The notebook shows the timing code itself (`gpulab.core.timing`: `host_time_no_sync`, the CUDA-event
timer behind `benchmark`); this module holds what the notebook and `gpulab bench` share: the sizes,
and `headline`, the largest product of the notebook's sweep timed the wrong way (host clock, no
synchronize) and the right way (CUDA events after a synchronize). Section 6's measurements of where
events mislead are here too, shown in the notebook: `events_vs_kernel` (a launch-bound product, timed
with events and by the profiler's kernel time), `l2_warm_vs_flushed` (a warm-cache repeat against one
after an L2 flush), `kernel_ms_per_call` (the profiler reading both use) and `torch_timer`
(torch.utils.benchmark.Timer).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

import torch

from gpulab.core.device import pick_device, resolve_scale, sync
from gpulab.core.measured import Measured
from gpulab.core.predict import Plan, Work
from gpulab.core.timing import MIN_CALLS, benchmark, gpu_profile

# -- knobs ------------------------------------------------------------------------------------------
TITLE = "measuring time"
HEADLINE = "CUDA events / host clock without sync, ms"      # the metric bands.toml judges
CONFIG = {
    # sizes of the notebook's sweep (n x n fp32 matrix products); the headline times the largest
    # section 6: launch_n, a product too small to keep the GPU busy between launches; profiled_calls of it
    "tiny": dict(sizes=[64, 128, 256, 512], first_call_n=256, spread_n=32, profile_width=128, profile_batch=32,
                 launch_n=32, profiled_calls=20),
    "full": dict(sizes=[256, 512, 1024, 2048, 4096, 8192], first_call_n=4096, spread_n=256, profile_width=4096,
                 profile_batch=1024, launch_n=256, profiled_calls=200),
}


def config(scale: str | None = None) -> dict:
    """This lesson's knobs at a scale ('tiny' or 'full'; default: the course's, `GPULAB_SCALE`)."""
    return dict(CONFIG[resolve_scale(scale)])


def plan(scale: str | None = None) -> Plan:
    """What notebook 01 asks of the GPU at `scale` (gpulab.core.predict): fp32 products timed the wrong
    way and the right way, a fixed 100-call spread, and five profiled MLP steps."""
    cfg = config(scale)
    calls = MIN_CALLS       # benchmark()'s least; the rest of its budget is host time
    no_sync = 3 + 10         # benchmark(sync=False): 3 warm-up + 10 calls on the host clock, all run by the GPU
    both = no_sync + calls   # sync_vs_no_sync: the wrong way, then the right way
    n = cfg["first_call_n"]
    # calls of the n x n product `work` (and the panel's, same n):
    work_calls = (1 + calls          # the first call, then the steady benchmark
                  + both             # host clock without sync against CUDA events
                  + 3 + 100          # the spread: repeat=100 after 3 warm-up calls
                  + calls + no_sync)  # the panel's default run, then panel.run(synchronize=False)
    sweep = both * sum(2 * s**3 for s in cfg["sizes"])      # sync_vs_no_sync over the sweep's sizes
    check = both * 2 * cfg["sizes"][-1] ** 3                 # the self-check (headline): the largest size again
    # the profiled MLP: 1 warm-up + 5 profiled steps, each forward + backward (3x the forward's 2 products)
    w, b = cfg["profile_width"], cfg["profile_batch"]
    mlp = 6 * 3 * 2 * (2 * b * w * w)
    # (the spread's small product, spread_n, is far below 1 % of this)
    work = [
        Work("matmul_fp32", work_calls * 2 * n**3, 1.0, f"{work_calls} fp32 products n={n}"),
        Work("matmul_fp32", sweep, 1.0, f"sync / no-sync sweep, n={cfg['sizes'][0]}..{cfg['sizes'][-1]}"),
        Work("matmul_fp32", check, 1.0, f"self-check: sync / no-sync at n={cfg['sizes'][-1]}"),
        Work("matmul_fp32", mlp, 0.5, f"6 MLP training steps, width {w}, batch {b}"),
    ]
    # host_s: see host_source; tiny runs the same formulas, with the full run's host time (tiny runs on
    # the CPU, where nothing is predicted: its plan is only for completeness)
    return Plan(host_s=15.0, work=work,
                host_source="wall time of notebook 01 in results/course/2026-11-30-h200-00-to-09-at-775ae4a/h200-2026-11-30-course-timings.tsv "
                            "(H200, torch 2.11, 2026-11-30) minus its GPU work at that run's ceilings")


def sync_vs_no_sync(n: int) -> tuple[float, float]:
    """(ms timed on the host clock without synchronizing, ms timed with CUDA events) of one n x n product."""
    device = pick_device()
    x = torch.randn(n, n, device=device)
    wrong = benchmark(lambda: x @ x, sync=False).median_ms
    sync()                                           # let the queued products finish before timing again
    right = benchmark(lambda: x @ x).median_ms
    del x
    return wrong, right


def headline(scale: str | None = None) -> Measured:
    """The largest product of the sweep, timed without synchronizing (wrong) and with CUDA events (right)."""
    n = config(scale)["sizes"][-1]
    wrong, right = sync_vs_no_sync(n)
    return Measured(wrong, right, "ms", right / wrong, True,
                    "nothing to compare: both columns time the same x @ x",
                    f"host clock, no sync (fp32 n={n})", "CUDA events + sync")


# -- section 6: when CUDA events mislead --------------------------------------------------------------
def kernel_ms_per_call(fn: Callable[[], object], op: str, calls: int,
                       before: Callable[[], object] | None = None) -> float | None:
    """The GPU time of the kernels that the aten operator `op` (e.g. "aten::mm") launched, per call of
    `fn`, as torch.profiler reads it on the GPU (CUPTI: each kernel's own start and end), so the host's
    launch gaps are not in it. `before` runs ahead of each call, outside `op` (an L2 flush, say).
    The median over the calls, not the mean: PyTorch's profiler (2.11 among others, before pytorch/pytorch
    PR 193924) credits an operator's kernels once more to each of the profiler's own overhead records nested
    in it, so a call that meets one reads about twice its kernel time (the mean over ten calls read exactly
    1.10x the events in four H200 runs). None on the CPU: there are no kernels to read."""
    device = pick_device()
    if device.type != "cuda":
        return None
    if before is not None:
        before()
    fn()                                           # warm-up outside the profile
    sync(device)
    with gpu_profile(cpu=True) as prof:
        for _ in range(calls):
            if before is not None:
                before()
            fn()
        sync(device)
    times_us = [e.device_time_total for e in prof.events() if e.name == op]
    return statistics.median(times_us) / 1e3 if times_us else None


@dataclass(frozen=True)
class EventsVsKernel:
    """One n x n fp32 product: CUDA events around each call against the kernel's own time."""
    n: int
    events_ms: float            # benchmark(): median of CUDA events around each call (host clock on the CPU)
    kernel_ms: float | None     # torch.profiler: GPU time of the product's kernels per call (None on the CPU)

    @property
    def ratio(self) -> float | None:
        """events / kernel: 1 when the GPU is the bottleneck, above it when the launches are."""
        return self.events_ms / self.kernel_ms if self.kernel_ms else None


def events_vs_kernel(n: int, calls: int) -> EventsVsKernel:
    """A small product timed as `benchmark` times it (events around each call, all queued back to back)
    and by its kernel time in the profiler. Where the host needs longer to launch a product than the GPU
    needs to run it, the GPU waits between the start event and the kernel: the events hold that wait."""
    device = pick_device()
    x = torch.randn(n, n, device=device)
    events = benchmark(lambda: x @ x, repeat=calls).median_ms
    kernel = kernel_ms_per_call(lambda: x @ x, "aten::mm", calls)
    del x
    return EventsVsKernel(n, events, kernel)


def l2_bytes(device: torch.device | None = None) -> int | None:
    """This GPU's L2 cache in bytes (None on the CPU)."""
    device = device or pick_device()
    if device.type != "cuda":
        return None
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)) or None


@dataclass(frozen=True)
class WarmVsFlushed:
    """One read of `nbytes` (a sum), repeated: kernel time with the data left in L2 from the call
    before, and with L2 flushed before each call."""
    nbytes: int
    l2_bytes: int
    warm_ms: float | None
    flushed_ms: float | None

    @property
    def ratio(self) -> float | None:
        """flushed / warm: how much the warm repeat flatters the kernel."""
        return self.flushed_ms / self.warm_ms if self.warm_ms and self.flushed_ms else None


def l2_warm_vs_flushed(calls: int, share: float = 0.5) -> WarmVsFlushed | None:
    """Sum a tensor of `share` x L2's size `calls` times in a row (after the first call it is in L2),
    then the same with an L2 flush (writing a buffer twice the size of L2) before each call. Both read
    by the profiler's kernel time, so launch gaps are in neither. None on the CPU."""
    device = pick_device()
    l2 = l2_bytes(device)
    if l2 is None:
        return None
    x = torch.randn(int(l2 * share) // 4, device=device)          # fp32: 4 bytes an element
    flush = torch.empty(2 * l2 // 4, device=device)
    warm = kernel_ms_per_call(x.sum, "aten::sum", calls)
    flushed = kernel_ms_per_call(x.sum, "aten::sum", calls, before=flush.zero_)
    nbytes = x.numel() * x.element_size()
    del x, flush
    return WarmVsFlushed(nbytes, l2, warm, flushed)


def torch_timer(stmt: str, env: dict, min_run_time: float = 0.2):
    """torch.utils.benchmark.Timer(stmt).blocked_autorange(), whose Measurement has `.median` and `.iqr`
    in seconds. PyTorch handles the warm-up (its block-size estimate runs the statement first) and the
    synchronize (its clock synchronizes the GPU when read); it times *blocks* of back-to-back calls on
    the host clock and divides. It runs with this process's CPU threads: the Timer's default is one."""
    from torch.utils.benchmark import Timer

    return Timer(stmt=stmt, globals=env, num_threads=torch.get_num_threads()).blocked_autorange(
        min_run_time=min_run_time)
