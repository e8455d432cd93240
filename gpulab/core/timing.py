"""The course's one timing function. Introduced in notebook 01.

`benchmark(fn)` warms up, times each call with CUDA events on a GPU (or the host
clock on the CPU), synchronizes, repeats, and returns a frozen `Timing`.
Nothing else in the course times device work by hand.
"""
from __future__ import annotations

import contextlib
import inspect
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence
import torch
from gpulab.core.device import pick_device, sync


@dataclass(frozen=True)
class Timing:
    """Result of `benchmark`: milliseconds per call."""

    median_ms: float
    p25_ms: float
    p75_ms: float
    min_ms: float
    max_ms: float
    n: int
    device: str
    method: str
    samples_ms: tuple[float, ...] = field(repr=False, default=())

    @property
    def spread_ms(self) -> float:
        """Interquartile range (p75 - p25) in ms: how much a typical call varies."""
        return self.p75_ms - self.p25_ms

    @property
    def spread_pct(self) -> float:
        return 100.0 * self.spread_ms / self.median_ms if self.median_ms else 0.0

    def per_second(self, amount: float) -> float:
        """`amount` per second at the median time, e.g. `t.per_second(flops) / 1e12` = TFLOP/s."""
        return amount / (self.median_ms / 1e3)

    def __str__(self) -> str:
        return (f"{self.median_ms:.4g} ms (IQR {self.spread_ms:.2g} ms, n={self.n}, "
                f"{self.method} on {self.device})")


def summarize(samples_ms: list[float], device: str, method: str) -> Timing:
    """Median, quartiles and extremes of per-call times."""
    if not samples_ms:
        raise ValueError("no samples to summarize")
    s = sorted(samples_ms)
    q1, q2, q3 = statistics.quantiles(s, n=4, method="inclusive") if len(s) > 1 else (s[0],) * 3
    return Timing(
        median_ms=q2, p25_ms=q1, p75_ms=q3,
        min_ms=s[0], max_ms=s[-1], n=len(s), device=device, method=method,
        samples_ms=tuple(samples_ms),
    )


def host_time_no_sync(fn: Callable[[], object], repeat: int) -> list[float]:
    """The WRONG way on a GPU, kept so lesson 01 can show why: host clock, no synchronize.

    CUDA calls return as soon as the work is queued, so this measures the cost
    of *launching* the work, not of doing it.
    """
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _cuda_event_times(fn: Callable[[], object], repeat: int) -> list[float]:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeat)]
    for start, end in zip(starts, ends):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends)]


def _sync(device: torch.device) -> None:
    sync(device)   # looked up at call time: `stopwatch`'s own `sync` argument hides the name


@dataclass
class Interval:
    """Filled in by `stopwatch` (host clock, seconds from time.perf_counter)."""

    start_s: float = 0.0
    end_s: float = 0.0

    @property
    def ms(self) -> float:
        return (self.end_s - self.start_s) * 1e3


@contextlib.contextmanager
def stopwatch(sync: bool = True, device: torch.device | None = None) -> Iterator[Interval]:
    """Host-clock interval of a block that cannot be repeated by `benchmark` (lesson 03's
    pass over a data loader). With `sync` the device is synchronized on entry and exit,
    so the interval holds the GPU work the block queued; `sync=False` times host work only
    (e.g. the wait inside `next(loader)`).
    """
    device = device or pick_device()
    interval = Interval()
    if sync:
        _sync(device)
    interval.start_s = time.perf_counter()
    try:
        yield interval
    finally:
        if sync:
            _sync(device)
        interval.end_s = time.perf_counter()


def _host_times(fn: Callable[[], object], repeat: int, device: torch.device) -> list[float]:
    out = []
    for _ in range(repeat):
        with stopwatch(device=device) as call:
            fn()
        out.append(call.ms)
    return out


def budget_share() -> float:
    """The share of each timing budget `benchmark` spends: GPULAB_TIMING_BUDGET, a number in (0, 1], default 1.
    For runs that test the course's control flow, not its numbers (tests/test_portability.py runs every
    branching notebook under each GPU profile with 0.1): fewer samples, the same code paths, the 3-sample floor
    kept. A learner's run never sets it. ValueError, naming the variable, for anything else."""
    import os

    raw = os.environ.get("GPULAB_TIMING_BUDGET", "").strip()
    if not raw:
        return 1.0
    try:
        share = float(raw)
    except ValueError:
        share = float("nan")
    if not 0 < share <= 1:
        raise ValueError(f"GPULAB_TIMING_BUDGET must be a number in (0, 1], the share of each timing budget to "
                         f"spend; got {raw!r}")
    return share


# The fewest calls `benchmark(fn)` makes with its defaults: 3 warm-up, 1 probe, 3 timed. A call slower than
# the budget costs this many on any GPU; lessons' plans (gpulab.core.predict) count GPU work with it.
MIN_CALLS = 3 + 1 + 3


def benchmark(
    fn: Callable[[], object],
    *,
    warmup: int = 3,
    repeat: int | None = None,
    budget_s: float = 0.5,
    max_repeat: int = 200,
    sync: bool = True,
    device: torch.device | None = None,
    clock: str = "auto",
    calls: int = 1,
) -> Timing:
    """Time `fn()`: `warmup` untimed calls, then `repeat` timed ones; median and spread.

    - On a CUDA device each call is bracketed by CUDA events and the device is
      synchronized before the times are read ("cuda events").
    - `clock="host"` times each call on the host clock between two synchronizations instead
      ("host clock, synchronized"): for work the CPU takes part in (a pageable copy's staging,
      `pin_memory()`). Events bracket a blocking call's CPU part too (the end mark is queued only
      after the call returns), but miss CPU work that overlaps GPU work queued before it (lesson 05,
      section 5).
    - On the CPU each call is timed with `time.perf_counter` ("perf_counter").
    - `repeat=None` picks a count that fits about `budget_s` seconds (3 to `max_repeat`).
    - `sync=False` is lesson 01's counter-example: host clock without synchronize
      ("host clock, no sync"). Its numbers are wrong on a GPU; never use it otherwise.
    - `calls`: each timed sample is that many back-to-back calls, reported per call: a training loop's
      steps, queued one behind the other with no synchronize between them (gpulab.diagnose).
    """
    if clock not in ("auto", "host"):
        raise ValueError(f"clock must be 'auto' or 'host', got {clock!r}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if repeat is not None and repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    if calls < 1:
        raise ValueError(f"calls must be >= 1, got {calls}")
    if calls > 1:
        one = fn

        def fn():
            for _ in range(calls):
                one()
        timing = benchmark(fn, warmup=warmup, repeat=repeat, budget_s=budget_s, max_repeat=max_repeat, sync=sync,
                           device=device, clock=clock)
        return summarize([ms / calls for ms in timing.samples_ms], timing.device,
                         f"{timing.method}, {calls} back-to-back calls per sample")
    device = device or pick_device()
    for _ in range(warmup):
        fn()
    if not sync:
        samples = host_time_no_sync(fn, repeat or 10)
        return summarize(samples, str(device), "host clock, no sync")
    events = device.type == "cuda" and clock == "auto"
    if repeat is None:
        probe = (_cuda_event_times(fn, 1) if events else _host_times(fn, 1, device))[0]
        repeat = int(min(max_repeat, max(3, budget_s * budget_share() * 1e3 / max(probe, 1e-3))))
    if clock == "host":
        return summarize(_host_times(fn, repeat, device), str(device), "host clock, synchronized")
    if events:
        return summarize(_cuda_event_times(fn, repeat), str(device), "cuda events")
    return summarize(_host_times(fn, repeat, device), str(device), "perf_counter")


def interleaved(fns: dict[str, Callable[[], object]], *, rounds: int = 6, repeat: int = 3, warmup: int = 2,
                **kwargs) -> dict[str, Timing]:
    """`benchmark` each of `fns` in turns (A B, B A, A B, ...: `rounds` rounds of `repeat` samples each),
    so that whatever else the GPU runs meanwhile (other learners on a time-sliced GPU, a MIG slice's
    neighbours' heat and power) falls on every variant alike rather than on whichever ran last. Returns
    each variant's Timing over all its samples. `kwargs` go to `benchmark` (device, clock, calls)."""
    if not fns:
        raise ValueError("nothing to time")
    if rounds < 1 or repeat < 1:
        raise ValueError(f"rounds and repeat must be >= 1, got {rounds}, {repeat}")
    names = list(fns)
    samples: dict[str, list[float]] = {n: [] for n in names}
    timings: dict[str, Timing] = {}
    for n in names:
        benchmark(fns[n], warmup=warmup, repeat=1, **kwargs)      # each variant's kernels loaded first
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            timings[n] = benchmark(fns[n], warmup=0, repeat=repeat, **kwargs)
            samples[n].extend(timings[n].samples_ms)
    return {n: summarize(samples[n], timings[n].device, f"{timings[n].method}, interleaved with "
                         f"{', '.join(m for m in names if m != n)} ({rounds} rounds)") for n in names}


def capture_graph(fn: Callable[..., object], *static_inputs: torch.Tensor, warmup: int = 3):
    """Capture `fn(*static_inputs)` into a CUDA graph; return (graph, static output). Lesson 11 teaches it;
    lesson 00 replays copies with it to time them without launches.

    As PyTorch's CUDA Graphs docs show: warm up on a side stream (so lazy initialisation, cuBLAS workspaces
    and autograd's first-call work happen outside the capture), then capture. Replaying reads the static
    inputs' memory and writes the static output's: to run on new data, `.copy_()` it into the static inputs.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn(*static_inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = fn(*static_inputs)
    return graph, static_out


# -- GPU busy time from a torch.profiler trace (lessons 11, 12, 14) --------------------------------
def release_cupti() -> None:
    """Call when a torch.profiler session that recorded CUDA activity has ended: CUPTI is detached now, not
    at the next session's start. Importing gpulab sets TEARDOWN_CUPTI=1 (see gpulab/__init__.py); Kineto
    (torch 2.11) then tears CUPTI down when the *next* session is configured, and the teardown completes at
    that session's first CUDA call, so that session records no GPU activity and until it starts every
    launch still pays CUPTI's callbacks. On the H200, twenty sessions back to back recorded 50, 0, 50, 0, ...
    kernels (results/zoo/2026-12-01-h200-cupti-probes/probe-cupti-h200-2026-12-01-b.json). An empty session here takes that teardown,
    and its synchronizations (CUDA calls, with short pauses for Kineto's teardown thread) let it finish."""
    import os

    if os.environ.get("TEARDOWN_CUPTI") != "1" or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return
    from torch.profiler import ProfilerActivity, profile

    # PROFILE_KW (acc_events=True): without it torch.profiler warns "To keep events across cycles, set
    # acc_events=True" when the session starts (torch/profiler/profiler.py, prepare_trace), and notebook 01 printed
    # that warning under a cell whose own profile passes acc_events=True
    with profile(activities=[ProfilerActivity.CUDA], **PROFILE_KW):
        for _ in range(3):
            torch.cuda.synchronize()
            time.sleep(0.002)
    for _ in range(3):
        torch.cuda.synchronize()
        time.sleep(0.002)


# Every torch.profiler session gpulab opens passes these (see `gpu_profile`); a torch older than 2.5 has no
# acc_events (and no warning about it).
PROFILE_KW = ({"acc_events": True} if "acc_events" in inspect.signature(torch.profiler.profile).parameters else {})


@contextlib.contextmanager
def gpu_profile(cpu: bool = False, **kwargs) -> Iterator[object]:
    """`torch.profiler.profile` of the GPU's activity (and the host's with `cpu=True`; `kwargs` go to it),
    with CUPTI released when it ends (`release_cupti`): what gpulab's own profiles run under, so timings
    taken after them are not slowed by the profiler.

    `acc_events` defaults to True (PROFILE_KW): torch 2.10 and 2.11 warn "To keep events across cycles, set
    acc_events=True" at the first session of a process without it, schedule or not (pytorch/pytorch#180348,
    fixed by #180387); notebooks 11 (2026-12-03 and 2026-12-06) and answer 00.4 printed it under cells whose
    profiles use no schedule. With one recording cycle, as here, accumulating across cycles changes nothing."""
    from torch.profiler import ProfilerActivity, profile

    activities = ([ProfilerActivity.CPU] if cpu else []) + [ProfilerActivity.CUDA]
    with profile(activities=activities, **{**PROFILE_KW, **kwargs}) as prof:
        yield prof
    release_cupti()


def gpu_kernels(prof) -> list[tuple[str, float, float]]:
    """(name, start us, end us) of every GPU kernel, copy or memset a finished `torch.profiler.profile`
    recorded (CUPTI's own timestamps, so the host's launch gaps are not in them)."""
    from torch.autograd import DeviceType
    return [(e.name, e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == DeviceType.CUDA]


def merge_intervals(intervals) -> list[tuple[float, float]]:
    """The union of (start, end) intervals as sorted, disjoint intervals."""
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def intersect(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The intersection of two sorted lists of disjoint intervals."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted disjoint intervals `a` minus sorted disjoint intervals `b` (one pass over both)."""
    out, j = [], 0
    for lo, hi in a:
        while j < len(b) and b[j][1] <= lo:
            j += 1
        cur, k = lo, j
        while k < len(b) and b[k][0] < hi:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < hi:
            out.append((cur, hi))
    return out


def merged_ms(intervals) -> float:
    """Total length of the union of (start, end) intervals, in their unit / 1e3 (profiler us -> ms):
    the time at least one of them was running (a GPU's busy time, concurrent kernels counted once)."""
    return sum(b - a for a, b in merge_intervals(intervals)) / 1e3


# A step whose kernels fill at least this share of it is paced by the GPU; below it the GPU waits for the host
# between kernels (launches, Python, synchronizations, data). The same line as gpulab.diagnose's compute_bound.
GPU_PACED_MIN = 0.90
# Steps `pace` profiles by default (after the step's own warm-up).
PACE_STEPS = 10


@dataclass(frozen=True)
class Pace:
    """What paces a step: the GPU's busy time per step (the union of its kernels, copies and memsets, from a
    profile that records the GPU's activity only) against the step's time on the host clock, steps back to
    back as in training."""

    busy_ms: float
    step_ms: float
    steps: int
    kernels: float = 0.0      # GPU kernels, copies and memsets per step

    @property
    def share(self) -> float:
        return min(self.busy_ms / self.step_ms, 1.0) if self.step_ms > 0 else 0.0

    @property
    def paced_by(self) -> str:
        return "the GPU" if self.share >= GPU_PACED_MIN else "the host"

    def percent(self) -> str:
        """The busy share in %, with a decimal more where it would print the same as the 90 % line."""
        pct = 100 * self.share
        return f"{pct:.1f}" if abs(pct - 100 * GPU_PACED_MIN) < 0.5 else f"{pct:.0f}"

    def text(self) -> str:
        return (f"GPU busy {self.percent()} % of the step ({self.busy_ms:.3g} of {self.step_ms:.3g} ms, "
                f"{self.steps} steps back to back under a kernel-only profile): paced by {self.paced_by}"
                + ("" if self.paced_by == "the GPU" else
                   " (the GPU waits between kernels: launches, Python, synchronizations or data)"))


def pace(fn: Callable[[], object], steps: int = PACE_STEPS, device: torch.device | None = None) -> Pace | None:
    """`fn` run `steps` times back to back under a profiler that records the GPU's activity only (no Python
    stacks, shapes or operator ranges: a few microseconds per launch), timed on the host clock between two
    synchronizations: the GPU's busy share of the step and what paces it. None off a CUDA device, and where
    the profiler refuses or records no GPU activity (unknown, not idle). Call it after the step's warm-up
    (its first steps choose kernels, compile, allocate)."""
    device = device or pick_device()
    if device.type != "cuda":
        return None
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    sync(device)
    try:
        with gpu_profile() as prof:
            sync(device)
            start = time.perf_counter()
            for _ in range(steps):
                fn()
            sync(device)
            wall_ms = (time.perf_counter() - start) * 1e3
        spans = [(a, b) for _, a, b in gpu_kernels(prof) if b > a]
    except RuntimeError:          # the profiler refused (a container without CUPTI access): unknown
        return None
    if not spans:                 # nothing recorded is not an idle GPU: the profile saw no activity at all
        return None
    return Pace(merged_ms(spans) / steps, wall_ms / steps, steps, len(spans) / steps)
