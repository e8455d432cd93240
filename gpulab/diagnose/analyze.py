"""Facts from events: what the rules in `rules.py` read.

- **Windows.** Each profiled step is its "gpulab.step" host range, extended to the end of the last GPU
  event launched inside it: the host returns from `step()` while the GPU is still working.
- **Busy and idle.** Busy is the union of all GPU work in the windows, every stream merged (a moment
  with two kernels running counts once); idle is the rest of the windows.
- **What the host spent the step on.** The GPU idles because the host did not queue work in time, so
  the host's own timeline is the evidence: the thread that runs the step is cut into what it did, by
  cause (`host_causes`): making the batch (a DataLoader's `__next__`, a "gpulab.data" range, and
  everything the host did before it copied the batch to the GPU: data made in the main thread needs no
  annotation), blocked in a synchronizing call (`.item()`, `.cpu()`, a blocking copy), staging a
  pageable copy, in the allocator, issuing GPU work (PyTorch's ops and the framework's Python), or
  running the user's own Python (found with the profiler's stacks). A fix that takes a cause's time off
  the host's path can save at most that time, and at most the GPU's idle time (`Facts.idle`): the step
  cannot get shorter than the GPU's own work. Each cause keeps the lines of the user's code it came from.
- **Kernel classes.** By the kernel's name (cuBLAS / cuBLASLt / CUTLASS / cuDNN naming) and by the
  launching op's dtypes and the TF32 switches (see `kernel_class`).
- **GEMMs.** Per matrix-product op: GPU time, FLOPs, dtype, shapes, and whether its M, N, K suit the
  Tensor Cores (see `misaligned`).

On the CPU there is no GPU to be idle: the device is the host itself, so "busy" is the time the step's
threads spent inside aten ops (outside data loading) and the rest is idle, charged the same way.
Every figure in `Facts` is per profiled step (the profiled steps' total divided by their number).
"""
from __future__ import annotations

import bisect
import math
import os
import statistics
from collections.abc import Iterable, Sequence
from collections import Counter
from dataclasses import dataclass, field

from gpulab.core.timing import intersect, merge_intervals, subtract
from gpulab.diagnose.events import (
    HARNESS,
    GPU,
    OP,
    PY,
    RUNTIME,
    STEP_RANGE,
    Event,
    fmt_site,
    step_ranges,
)
from gpulab.diagnose.facts import (  # noqa: F401 - the contract, re-exported: analyze.Facts is what rules read
    CAUSES, CLASSES, Facts, GemmFact, MemoryFacts, StallFacts, changes)
from gpulab.diagnose.gaps import (SYNC_GRACE_US, OpsByThread, after_sync, data_dependent, is_compile, queue_full,
                                  runs_span, set_apart, shape_changes, sync_kind)
from gpulab.diagnose.kernels import (ALLOC_CALLS, ATTENTION_MIN_T, BLOCKING_CALLS, CONV_OPS, INPUT_RANGES,  # noqa: F401
                                     SCALAR_READS, SOFTMAX_OPS, attention_by_hand, conv_flops, dtype_of, gemm_flops,
                                     kernel_class, kernel_math, misaligned, mnk)



# Host calls that launch one kernel each (the runtime's and the driver's; cuBLAS and Triton use the
# driver's). A replayed CUDA graph launches all its kernels with one cudaGraphLaunch, not counted here.
KERNEL_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                   "cudaLaunchCooperativeKernel")
# Host calls that put any work on the GPU's queue: a kernel, a copy, a memset, a graph replay.
QUEUEING = KERNEL_LAUNCHES + ("cudaMemcpyAsync", "cudaMemsetAsync", "cudaGraphLaunch", "cuMemcpyAsync",
                              "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuMemsetD8Async", "cuGraphLaunch")


# -- thresholds of the analysis (the rules' own are in rules.py) -----------------------------------
# SYNC_GRACE_US (gaps.py): how late a synchronizing call may have returned and still have caused a gap
# A kernel launched onto an idle stream starts a few microseconds after its launch call returns (the
# launch latency, ~5 us on current GPUs, plus the clocks' disagreement above): a wait shorter than this
# is the launch itself, not work standing ready behind something else (see `waited_on`).
LAUNCH_GRACE_US = 20.0
# Python between two PyTorch calls (module __call__, attribute look-ups, the loop) is part of issuing
# the step's work: a stretch the profiler saw nothing in, shorter than this, counts as "launch". Its
# order is the per-op host cost lesson 11 measures (tens of microseconds); a longer one is "other".
GLUE_GAP_US = 100.0
# A PyTorch op that queues no GPU work and runs longer than this computes on the CPU (a view or a
# dispatch takes a few microseconds): the user's own CPU work, not issuing the GPU's.
CPU_OP_US = 50.0
# The batch's copy to the GPU: the first host-to-device copy of a step at least this large. A scalar
# made on the GPU from a Python number (a learning rate, a step count) is a copy of a few bytes.
BATCH_COPY_MIN_BYTES = 1024
# A pageable copy smaller than this is a read-back of a value (`.cpu()` of a metric): its cost is the
# synchronization, not the staging (lesson 05: copies under about 64 KiB are latency-bound, and pinning
# them buys nothing measurable).
PAGEABLE_MIN_BYTES = 64 * 1024
# -- interval helpers ------------------------------------------------------------------------------
def length_us(intervals: Iterable[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


# -- windows ---------------------------------------------------------------------------------------
def step_windows(events: Sequence[Event], name: str = STEP_RANGE) -> list[tuple[float, float]]:
    """Each step's host range, extended to the end of the last GPU event launched inside it. A GPU
    event's launch time is its runtime call's start (same `corr`), else its own start."""
    ranges = step_ranges(events, name)
    launch = {e.corr: e.start_us for e in events if e.kind == RUNTIME and e.corr}
    windows = []
    for lo, hi in ranges:
        end = hi
        for e in events:
            if e.kind == GPU and lo <= launch.get(e.corr, e.start_us) <= hi:
                end = max(end, e.end_us)
        windows.append((lo, end))
    return windows


def is_pageable(e: Event) -> bool:
    """A copy from or to pageable host memory ("Memcpy HtoD (Pageable -> Device)")."""
    return e.kind == GPU and e.name.lower().startswith("memcpy") and "pageable" in e.name.lower()


# -- the host's timeline ------------------------------------------------------------------------------
def is_op(e: Event) -> bool:
    """A PyTorch operator ("aten::mm", "c10d::allreduce_"), not a record_function range ("gpulab.step")."""
    return e.kind == OP and "::" in e.name


def innermost_frames(frames: Sequence[Event]) -> list[tuple[float, float, Event, bool]]:
    """The Python frames of one thread cut into (start, end, innermost frame, under a library frame):
    frames nest, and at each moment the innermost one is what runs. `under a library frame`: the frame
    runs inside a call into a library (the user's `forward`, called by `model(x)`), so its time is part
    of issuing the library's work rather than the user's own."""
    out, stack, t = [], [], None

    def emit(upto: float) -> None:
        nonlocal t
        if stack and t is not None and upto > t:
            out.append((t, upto, stack[-1][0], stack[-1][1]))
        t = upto

    for f in sorted(frames, key=lambda e: (e.start_us, -e.end_us)):
        while stack and stack[-1][0].end_us <= f.start_us:
            emit(stack[-1][0].end_us)
            stack.pop()
        emit(f.start_us)
        parent = stack[-1] if stack else None
        # a harness frame (diagnose() running the step) starts afresh: what runs the harness (pytest, ipykernel: a
        # library) does not make the user's step "inside a library"
        under = parent is not None and not is_harness(parent[0]) and (parent[1] or not parent[0].user)
        stack.append((f, under))
    while stack:
        emit(stack[-1][0].end_us)
        stack.pop()
    return out


def is_harness(frame: Event) -> bool:
    """A frame of gpulab's own harness (`diagnose()` called from the user's script or notebook): the user's
    step inside it is not "inside a library"."""
    return bool(frame.code) and any(h.replace(os.sep, "/") in frame.code[0].replace(os.sep, "/") for h in HARNESS)


def frame_site(frame: Event) -> tuple:
    """Where time inside `frame` belongs in the user's code: the user's own function (file, its first line,
    its name), or the user's line that called into a library or C function."""
    return frame.code if frame.user and frame.code else frame.site


def labelled_overlaps(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]):
    """(start, end, index into b) for every overlap of two sorted lists of disjoint intervals."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append((lo, hi, j))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _outermost(events: Sequence[Event]) -> list[Event]:
    """The events (of one thread) not inside another."""
    out, end = [], -math.inf
    for e in sorted(events, key=lambda e: (e.start_us, -e.end_us)):
        if e.start_us >= end:
            out.append(e)
            end = e.end_us
        else:
            end = max(end, e.end_us)
    return out


def queued_in(gpu: Sequence[Event], calls: dict, spans: Sequence[tuple[float, float]]) -> list[Event]:
    """The GPU events whose launch call (`calls`: correlation id -> the call) started inside one of `spans`
    (host intervals): the work a range of host code queued."""
    merged = merge_intervals(spans)
    starts = [a for a, _ in merged]

    def inside(t: float) -> bool:
        i = bisect.bisect_right(starts, t) - 1
        return i >= 0 and t <= merged[i][1]
    return [g for g in gpu if g.corr in calls and inside(calls[g.corr].start_us)]


def _spans(events: Iterable[Event]) -> list[tuple[float, float]]:
    return merge_intervals((e.start_us, e.end_us) for e in events if e.end_us > e.start_us)


def _contains(outer: Sequence[Event], points: Sequence[float]) -> list[Event]:
    """The events of `outer` (disjoint, sorted) that contain at least one of the sorted `points`."""
    out, j = [], 0
    for e in outer:
        while j < len(points) and points[j] < e.start_us:
            j += 1
        if j < len(points) and points[j] <= e.end_us:
            out.append(e)
    return out


@dataclass
class HostTimeline:
    """The step's host thread cut into causes (`host_causes`): merged intervals per cause, the user's lines
    each cause's time came from, the synchronizations and pageable copies one by one."""

    by_cause: dict                  # cause -> sorted disjoint (start, end) us
    sites: dict                     # cause -> {(site, via): us}
    syncs: dict                     # (site, via) -> [us blocked, calls]
    pageable: dict                  # site -> [us host, bytes]
    precopy_us: float
    sync_kinds: dict = field(default_factory=dict)     # (site, via) -> what made it wait (`gaps.sync_kind`)
    pinnable: tuple = ()            # the lines of every host-to-device copy from pageable memory, of any size


def host_causes(events: Sequence[Event], windows: Sequence[tuple[float, float]], span: list,
                gpu: Sequence[Event], step_name: str = STEP_RANGE, on_gpu: bool = True, busy=None,
                idle=None) -> HostTimeline:
    """What the thread that runs the step spent `span` on, by cause (`gaps` says why these), in this order:

    1. "input": inside a DataLoader's `__next__` or a "gpulab.data" range;
    2. "pageable_copy": staging a copy from or to pageable memory (of at least PAGEABLE_MIN_BYTES),
       its wait included;
    3. "sync": blocked in a call that waits for the GPU (BLOCKING_CALLS: `.item()`, `.cpu()`, a blocking
       copy's stream synchronize, `torch.cuda.synchronize()`);
    4. "allocator": in cudaMalloc / cudaFree and their relatives;
       "compile": in torch.compile's own compiling (`gaps.is_compile`);
       "queue_full": in a launch call of at least QUEUE_FULL_US while the GPU was `busy` (a full launch queue);
    5. "input" again: anything else before the step copies its batch to the GPU (its first host-to-device
       copy of at least BATCH_COPY_MIN_BYTES) that queues no GPU work: the batch made in the main thread;
    6. "launch": in PyTorch ops that queue GPU work;
    7. "host_code": the user's own Python (a function of the user's code, not called from inside a
       library) and PyTorch ops that compute on the CPU (longer than CPU_OP_US, queueing nothing);
    8. "launch": the rest of PyTorch and the framework's Python (module calls, the optimizer's loop, the
       autograd engine working on its own thread while this one waits in `backward()`), and stretches
       the profiler saw nothing in shorter than GLUE_GAP_US;
    9. "other": longer stretches the profiler saw nothing in.
    Then, given the GPU's `idle` gaps: "after_sync", the launch and other time of every gap that began while
    the host was blocked in a synchronization (`gaps.after_sync`).

    On the CPU (`on_gpu` False) the ops are the device's work, not the host's: they count in no cause.

    Syncs, allocator calls and pageable copies on another thread (autograd's, during `backward()`) count
    too: this thread waits for that one then."""
    mains = {e.stream for e in events if e.kind == OP and e.name == step_name}
    working = mains | {e.stream for e in events if e.kind == RUNTIME}
    on_main = [e for e in events if e.stream in mains and e.kind in (OP, RUNTIME, PY)]
    ops = {e.corr: e for e in events if e.kind == OP and e.corr}
    calls = {e.corr: e for e in events if e.kind == RUNTIME and e.corr}
    inside = lambda e: bool(intersect(span, [(e.start_us, max(e.end_us, e.start_us + 1e-3))]))   # noqa: E731
    runtime = [e for e in events if e.kind == RUNTIME and e.stream in working and inside(e)]
    frames = [e for e in on_main if e.kind == PY]
    segments = innermost_frames(frames)

    def site_at(thread: int, t: float) -> tuple:
        if thread not in mains:
            return ()
        for a, b, f, _ in segments:          # few segments contain t; a linear scan is fine per call
            if a <= t < b:
                return frame_site(f)
        return ()

    # pageable copies: their launch calls and the ops that made them (which wait for them)
    pageable_gpu = [e for e in gpu if is_pageable(e) and (e.nbytes == 0 or e.nbytes >= PAGEABLE_MIN_BYTES)
                    and ops.get(e.op_id, Event(OP, "", 0, 0)).name not in SCALAR_READS]
    def copy_host(e: Event) -> tuple[list, str]:
        """A copy's host events on the step's threads (its launch call, the op that made it), and its line."""
        op = ops.get(e.op_id)
        host = [x for x in (calls.get(e.corr), op) if x is not None and x.stream in working]
        return host, fmt_site(op.site if op is not None and op.site else
                              site_at(host[0].stream, host[0].start_us) if host else ())

    pageable_host, pageable = [], {}
    for e in pageable_gpu:
        host, site = copy_host(e)
        pageable_host += host
        row = pageable.setdefault(site, [0.0, 0])
        row[0] += max((x.dur_us for x in host), default=0.0)
        row[1] += e.nbytes
    # every host-to-device copy from pageable memory, of any size: pinned and copied with non_blocking=True, its
    # wait goes too (the pageable_copy rule's bound)
    pinnable = {copy_host(e)[1] for e in gpu if is_pageable(e) and "htod" in e.name.lower()}
    blocking = [e for e in runtime if e.name in BLOCKING_CALLS]
    syncs, kinds, keyed = {}, {}, []
    running = OpsByThread(e for e in events if is_op(e) and e.stream in working)
    for e in blocking:
        op = ops.get(e.op_id)
        key = (fmt_site(op.site if op is not None and op.site else site_at(e.stream, e.start_us)),
               fmt_site(op.via) if op is not None else "")
        row = syncs.setdefault(key, [0.0, 0])
        row[0] += e.dur_us
        row[1] += 1
        kinds.setdefault(key, Counter())[sync_kind(running.at(e.stream, e.start_us))] += 1
        keyed.append((e.start_us, e.end_us, key))

    main_ops = [e for e in on_main if is_op(e)]
    top_ops = _outermost(main_ops)
    queue_points = sorted(e.start_us for e in runtime if e.stream in mains and e.name in QUEUEING)
    launching = _contains(top_ops, queue_points)
    calling = {id(e) for e in _contains(top_ops, sorted(e.start_us for e in runtime if e.stream in mains))}
    cpu_ops = [e for e in top_ops if id(e) not in calling and e.dur_us >= CPU_OP_US]

    # the batch's copy: each step's first host-to-device copy of some size, launched from this thread
    # The batch is made from the step's start to its copy; where the model's matrix products were queued before the
    # copy (a loop that prefetches its next batch after the forward, as nanoGPT's does), from the end of the last call
    # that queued GPU work before it: the forward's launches and host code are not the batch's making
    precopy = []
    queued = sorted((e.start_us, e.end_us) for e in runtime if e.stream in mains and e.name in QUEUEING)
    products = sorted(calls[g.corr].start_us for g in gpu if g.corr in calls and calls[g.corr].stream in mains
                      and kernel_class(g.name, ops[g.op_id].name if g.op_id in ops else g.op).startswith("gemm"))
    for lo, hi in windows:
        firsts = [calls[g.corr].start_us for g in gpu if "htod" in g.name.lower() and g.corr in calls
                  and calls[g.corr].stream in mains and lo <= calls[g.corr].start_us <= hi
                  and (g.nbytes == 0 or g.nbytes >= BATCH_COPY_MIN_BYTES)]
        if firsts:
            copy = min(firsts)
            start = lo
            if any(lo <= t < copy for t in products):
                start = max((b for a, b in queued if lo <= a < copy and b <= copy), default=lo)
            precopy.append((start, copy))

    user_top = merge_intervals((a, b) for a, b, f, under in segments if f.user and not under)
    framework = merge_intervals((a, b) for a, b, f, under in segments if not (f.user and not under))
    inputs = _spans(e for e in on_main if e.kind == OP and e.name.startswith(INPUT_RANGES))

    rest, by_cause = list(span), {c: [] for c in CAUSES}

    def take(cause: str, intervals) -> None:
        nonlocal rest
        piece = intersect(rest, merge_intervals(intervals))
        if piece:
            by_cause[cause] = merge_intervals(by_cause[cause] + piece)
            rest = subtract(rest, piece)

    take("input", inputs)
    take("pageable_copy", _spans(pageable_host))
    take("sync", _spans(blocking))
    take("allocator", _spans(e for e in runtime if e.name in ALLOC_CALLS))
    take("compile", _spans(e for e in on_main if is_compile(e)))
    if not on_gpu:
        rest = subtract(rest, _spans(main_ops))
    take("queue_full", queue_full((e for e in runtime if e.name in QUEUEING), busy or []))
    launch_spans = _spans(launching)
    take("launch", intersect(precopy, launch_spans))
    take("input", precopy)
    take("launch", launch_spans)
    take("host_code", merge_intervals(_spans(cpu_ops) + user_top))
    take("launch", merge_intervals(framework + _spans(main_ops) + _spans(e for e in runtime if e.stream in mains)))
    take("launch", [(a, b) for a, b in rest if b - a <= GLUE_GAP_US])
    take("other", rest)

    moved = after_sync(idle, keyed, by_cause) if idle is not None else {}
    sites: dict = {c: {} for c in CAUSES}
    labelled = [(a, b) for a, b, _, _ in segments]
    for cause, intervals in by_cause.items():
        if cause in ("sync", "after_sync"):
            continue
        for lo, hi, i in labelled_overlaps(intervals, labelled):
            key = (fmt_site(frame_site(segments[i][2])), "")
            sites[cause][key] = sites[cause].get(key, 0.0) + (hi - lo)
    for key, (us, _) in syncs.items():
        sites["sync"][key] = sites["sync"].get(key, 0.0) + us
    sites["after_sync"] = moved
    # the batch made in the main thread: the time before its copy, outside a DataLoader's __next__ (a step
    # that waits for its loader there is waiting for workers, not making the batch itself)
    return HostTimeline(by_cause, sites, syncs, pageable, length_us(subtract(merge_intervals(precopy), inputs)),
                        {k: c.most_common(1)[0][0] for k, c in kinds.items()}, tuple(sorted(pinnable)))


# -- the analysis ----------------------------------------------------------------------------------
def analyze(events: Sequence[Event], *, on_gpu: bool = True, step_name: str = STEP_RANGE,
            tf32_matmul: bool = False, tf32_cudnn: bool = False, tf32_supported: bool = True,
            memory: MemoryFacts | None = None,
            step_ms: float | None = None, flops_per_step: float | None = None,
            peak_tflops: float | None = None, peak_source: str = "",
            kernel_ceiling_tflops: float | None = None, hidden_syncs: tuple = (), compile: dict | None = None,
            stalls: StallFacts | None = None, light_busy_ms: float | None = None,
            light_step_ms: float | None = None) -> Facts:
    """Facts from the events of the profiled steps (each inside a `step_name` host range)."""
    events = list(events)
    profiled = step_windows(events, step_name)
    if not profiled:
        raise ValueError(f"no {step_name!r} ranges among the events: profile each step inside "
                         f"torch.profiler.record_function({step_name!r}) (diagnose() does)")
    mains = {e.stream for e in events if e.kind == OP and e.name == step_name}
    main_ops = [e for e in events if is_op(e) and e.stream in mains]
    changes = shape_changes(main_ops, profiled)
    windows, first, new_shapes = set_apart(events, main_ops, profiled, changes, stalls,       # first runs (gaps.py)
                                           host_shapes=not data_dependent(main_ops, len(profiled)))
    steps, span = len(windows), runs_span(profiled, windows)      # a span per run of steps: they run back to back
    if new_shapes:  # the settled step: the timed steps without first runs; the rules read no stalls, no light profile
        step_ms, stalls, light_busy_ms, light_step_ms = new_shapes["settled_ms"], None, None, None
        main_ops = [e for e in main_ops if any(lo <= e.start_us <= hi for lo, hi in span)]
    host = [e for e in events if e.kind in (OP, RUNTIME)]
    threads = _working_threads(host, step_name)
    host = [e for e in host if e.stream in threads]
    gpu = [e for e in events if e.kind == GPU and e.end_us > e.start_us and intersect(span, [(e.start_us, e.end_us)])]
    work = gpu if on_gpu else _cpu_work(host)
    busy = _union(work, span)
    idle = subtract(span, busy)

    # the host's time is read inside the steps' own host ranges: diagnose's synchronize after the last step
    # (while the GPU finishes) is not the step's
    host_span = intersect(merge_intervals(step_ranges(events, step_name)), span)
    timeline = host_causes(events, windows, host_span, gpu, step_name, on_gpu, busy=busy,
                           idle=idle if on_gpu else None)
    idle_by = {c: length_us(intersect(idle, timeline.by_cause[c])) for c in CAUSES}
    idle_by["other"] += max(length_us(idle) - sum(idle_by.values()), 0.0)
    pieces = sorted((a, b, c) for c, iv in timeline.by_cause.items() for a, b in iv)

    ops = {e.corr: e for e in events if e.kind == OP and e.corr}
    calls = {e.corr: e for e in events if e.kind == RUNTIME and e.corr}
    classes = {e: _class_of(e, ops, tf32_matmul, tf32_cudnn) for e in gpu}
    comm = _union([e for e in gpu if classes[e] == "communication"], span)
    rest = _union([e for e in gpu if classes[e] != "communication"], span)
    waiting = waited_on(gpu, {e.corr: e.end_us for e in host if e.kind == RUNTIME and e.corr},
                        lambda e: classes[e] != "communication")
    kernels = [e.dur_us for e in gpu if classes[e] != "copy"]
    per_step = 1e3 * steps      # us in total -> ms per step

    def top(rows: dict, n: int = 5) -> tuple:
        return tuple((site, via, us / per_step) for (site, via), us in
                     sorted(rows.items(), key=lambda kv: -kv[1])[:n] if us > 0)

    patterns = _patterns(events, gpu, classes, ops, calls, windows, span, step_name)
    attention_ops = patterns.pop("attention_ops")
    return Facts(
        on_gpu=on_gpu, steps=steps, window_ms=length_us(span) / per_step,
        busy_ms=length_us(busy) / per_step, idle_ms=length_us(idle) / per_step,
        idle_by_cause={c: v / per_step for c, v in idle_by.items()},
        busy_by_class={c: length_us(_union([e for e in gpu if classes[e] == c], span)) / per_step for c in CLASSES},
        kernels_per_step=len(kernels) / steps,
        launches_per_step=sum(1 for e in host if e.kind == RUNTIME and e.name in KERNEL_LAUNCHES
                              and any(a <= e.start_us <= b for a, b in span)) / steps,
        median_kernel_us=statistics.median(kernels) if kernels else None,
        pageable_copy_ms=length_us(_union([e for e in gpu if is_pageable(e)], span)) / per_step,
        comm_ms=length_us(comm) / per_step, comm_exposed_ms=length_us(intersect(subtract(comm, rest), waiting)) / per_step,
        gemms=tuple(_gemm_facts(gpu, classes, ops, steps, tf32_matmul, tf32_cudnn, attention_ops)), tf32_matmul=tf32_matmul, tf32_cudnn=tf32_cudnn,
        tf32_supported=tf32_supported, memory=memory, step_ms=step_ms, light_busy_ms=light_busy_ms, light_step_ms=light_step_ms, flops_per_step=flops_per_step, peak_tflops=peak_tflops,
        peak_source=peak_source, kernel_ceiling_tflops=kernel_ceiling_tflops,
        host_by_cause={c: length_us(iv) / per_step for c, iv in timeline.by_cause.items()},
        host_sites={c: top(rows) for c, rows in timeline.sites.items()},
        syncs=tuple((site, via, us / per_step, n / steps) for (site, via), (us, n) in
                    sorted(timeline.syncs.items(), key=lambda kv: -kv[1][0])),
        hidden_syncs=tuple(hidden_syncs),
        sync_kinds=tuple((*k, kind, timeline.syncs[k][1] / steps) for k, kind in timeline.sync_kinds.items()),
        data_dependent=data_dependent(main_ops, steps), shape_changes=changes, new_shapes=new_shapes,
        pageable_copies=tuple((site, us / per_step, nbytes / steps) for site, (us, nbytes) in
                              sorted(timeline.pageable.items(), key=lambda kv: -kv[1][0])),
        precopy_ms=timeline.precopy_us / per_step,
        pinnable_sites=timeline.pinnable,
        compile=dict(compile or {}), stalls=stalls,
        **{k: (v / per_step if k.endswith("_ms") else v) for k, v in patterns.items()},
        intervals={"windows": windows, "busy": busy, "idle": [(a, b, "idle") for a, b in idle], "host": pieces,
                   "work": [(e.stream, e.start_us, e.end_us) for e in work]},
    )


# -- patterns of the later lessons --------------------------------------------------------------------
# cuDNN's layout conversions around a convolution whose tensors are NCHW while its fast kernels want NHWC
# (Tensor Core convolutions in 16-bit): kernel names, lower case.
TRANSPOSE_NAMES = ("nchwtonhwc", "nhwctonchw", "nchw2nhwc", "nhwc2nchw")
OPTIMIZER_RANGE = "Optimizer.step#"
DDP_FORWARD = "DistributedDataParallel.forward"
COMPILED_REGION = "Torch-Compiled Region"
COMPILED_BACKWARD = "CompiledFunctionBackward"
RNN_OPS = ("aten::_cudnn_rnn", "aten::_cudnn_rnn_backward", "aten::lstm", "aten::gru", "aten::rnn_tanh",
           "aten::rnn_relu", "aten::_thnn_fused_lstm_cell", "aten::_thnn_fused_gru_cell", "aten::miopen_rnn",
           "aten::miopen_rnn_backward")
# A copy worth overlapping: at least a MiB (a smaller one is over in microseconds).
OVERLAP_COPY_MIN_BYTES = 2**20


def _patterns(events, gpu, classes, ops, calls, windows, span, step_name) -> dict:
    """GPU time (us in total) and counts of the later lessons' patterns; `analyze` divides by the steps."""
    steps = len(windows)
    mains = {e.stream for e in events if e.kind == OP and e.name == step_name}
    inside = lambda e: any(lo <= e.start_us <= hi for lo, hi in span)    # noqa: E731 - not the unmarked first step's
    annotations = [e for e in events if e.kind == OP and e.stream in mains and "::" not in e.name and inside(e)]
    out = {}
    out["transpose_ms"] = length_us(_union([e for e in gpu if any(t in e.name.lower() for t in TRANSPOSE_NAMES)], span))
    # attention by hand (kernels.attention_by_hand): the work on its score matrix and the operands' copies
    attention, tails = attention_by_hand(gpu, ops)
    out["attention_math_ms"] = length_us(_union(attention, span))
    counted = out["attention_ops"] = {e.op_id for e in attention if classes[e].startswith("gemm")}
    out["attention_math_flops"] = sum(gemm_flops(ops[i].name, ops[i].shapes) for i in counted if i in ops) / steps
    out["attention_shape"] = max(tails, default=())
    # the optimizer: its range on the host and the kernels queued inside it
    ranges = [e for e in annotations if e.name.startswith(OPTIMIZER_RANGE)]
    spans = _spans(ranges)
    queued = queued_in(gpu, calls, spans)
    out["optimizer_host_ms"] = length_us(spans)
    out["optimizer_gpu_ms"] = length_us(_union(queued, span))
    out["optimizer_kernels"] = len(queued) / steps
    out["optimizer_fused"] = (any("fused" in g.name.lower() for g in queued) if ranges else None)
    out["optimizer_name"] = (ranges[0].name[len(OPTIMIZER_RANGE):].split(".")[0] if ranges else "")
    out["optimizer_ops"] = tuple(sorted({ops[g.op_id].name for g in queued if g.op_id in ops}))
    # GradScaler's unscale and inf checks (ops called from torch/amp/grad_scaler.py): a fused optimizer takes
    # the scale and the inf flag into its own kernel, so this work and its .item() go with the fix
    scaler_ops = _outermost([op for op in ops.values() if op.stream in mains and "::" in op.name and inside(op)
                             and "grad_scaler" in (op.via[0] if op.via else "")])
    scaler_spans = _spans(scaler_ops)
    out["scaler_host_ms"] = length_us(scaler_spans)
    out["scaler_gpu_ms"] = length_us(_union(queued_in(gpu, calls, scaler_spans), span))
    # copies that no kernel runs beside (not pageable: that is its own rule)
    big = [g for g in gpu if classes[g] == "copy" and g.name.lower().startswith("memcpy") and not is_pageable(g)
           and (g.nbytes == 0 or g.nbytes >= OVERLAP_COPY_MIN_BYTES) and ("htod" in g.name.lower() or "dtoh" in g.name.lower())]
    compute = _union([g for g in gpu if classes[g] != "copy"], span)
    out["copy_exposed_ms"] = length_us(subtract(_union(big, span), compute))
    # DDP: forwards per step, and communication queued before a step's last forward (all-reduce per micro-batch)
    forwards = [e for e in annotations if e.name.startswith(DDP_FORWARD)]
    out["ddp_forwards"] = len(forwards) / steps
    early = []
    for lo, hi in windows:
        starts = [f.start_us for f in forwards if lo <= f.start_us <= hi]
        if len(starts) > 1:
            last = max(starts)
            early += [g for g in gpu if classes[g] == "communication" and g.corr in calls
                      and lo <= calls[g.corr].start_us < last]
    out["comm_early_ms"] = length_us(_union(early, span))
    # nn.DataParallel: the host inside its forward (replicate, scatter, parallel_apply, gather)
    dp = [e for e in events if e.kind == PY and e.code and e.code[2] == "forward"
          and e.code[0].replace(os.sep, "/").endswith("nn/parallel/data_parallel.py")]
    out["data_parallel_ms"] = length_us(_union(dp, span))
    # recurrent layers (nn.LSTM, nn.GRU, nn.RNN): Dynamo runs them eagerly (torch._dynamo.config.allow_rnn is
    # off by default), so the host time inside their ops stays outside any CUDA graph torch.compile makes
    rnn = [op for op in ops.values() if op.name in RNN_OPS]
    out["rnn_host_ms"] = length_us(intersect(_spans(rnn), span))
    # torch.compile: regions entered per step, and the host time between two of them inside a step
    regions = [e for e in annotations if e.name.startswith(COMPILED_REGION)]
    out["compiled_regions"] = len(regions) / steps
    between = 0.0
    for lo, hi in windows:
        inside = _outermost([r for r in regions if lo <= r.start_us <= hi])
        between += sum(max(b.start_us - a.end_us, 0.0) for a, b in zip(inside, inside[1:]))
    out["between_regions_ms"] = between
    # the host time inside compiled code (the forward's regions and the compiled backward): all that a
    # replayed CUDA graph of it could take off the host
    backward = [op for op in ops.values() if op.name == COMPILED_BACKWARD]
    out["compiled_host_ms"] = length_us(intersect(_spans(regions + backward), span))
    # the part of it a replayed graph does take off the host: in each compiled region (or backward), from
    # its first call that queues GPU work to the end of its last (inductor's launches and its Python between
    # them). Before the first and after the last run dynamo's guards and AOTAutograd's wrappers, which
    # reduce-overhead's graphs run too (cudagraph trees add their own checks and input copies).
    queue = {}
    for e in events:
        if e.kind == RUNTIME and e.name in QUEUEING:
            queue.setdefault(e.stream, []).append((e.start_us, e.end_us))
    for calls_ in queue.values():
        calls_.sort()
    launching = []
    for r in regions + backward:
        calls_ = queue.get(r.stream, [])
        i = bisect.bisect_left(calls_, (r.start_us, -math.inf))
        inside = []
        while i < len(calls_) and calls_[i][0] <= r.end_us:
            inside.append(calls_[i])
            i += 1
        if inside:
            launching.append((inside[0][0], min(max(b for _, b in inside), r.end_us)))
    out["compiled_launch_ms"] = length_us(intersect(merge_intervals(launching), span))
    # the GPU time of the kernels queued in that stretch: a replayed graph still runs them, so the stretch
    # cannot shrink below it
    out["compiled_launch_busy_ms"] = length_us(_union(queued_in(gpu, calls, launching), span))
    return out


def waited_on(gpu: Sequence[Event], launched: dict, counts) -> list[tuple[float, float]]:
    """The time work stood ready but did not run: for each GPU event e for which counts(e) holds, from
    the moment it could have started - its launch call had returned (`launched`: correlation id -> the
    call's end) and the work queued before it on its stream had finished - to its start.

    This is what makes communication "exposed": the compute stream waits on the all-reduce (DDP makes
    it wait before the optimizer's first kernel), so the kernels queued behind it stand ready while only
    the collective runs. A collective that merely spins in a gap the host left (its kernel waits for the
    other GPU while this host is still launching) keeps nothing waiting: the next kernel starts as soon
    as it is launched, and that gap is the host's, not the communication's. Work without a recorded
    launch counts from its stream's previous end, and the first work on a stream without one never
    waits. A kernel starts some microseconds after its launch call returns even on an idle GPU, and the
    two clocks differ by a few: the first LAUNCH_GRACE_US of every wait do not count."""
    out = []
    free: dict[int, float] = {}                     # stream -> when its last work ended
    for e in sorted((e for e in gpu if counts(e)), key=lambda e: e.start_us):
        ready = max(launched.get(e.corr, -math.inf), free.get(e.stream, -math.inf)) + LAUNCH_GRACE_US
        if math.isfinite(ready) and e.start_us > ready:
            out.append((ready, e.start_us))
        free[e.stream] = max(free.get(e.stream, -math.inf), e.end_us)
    return merge_intervals(out)


def _union(events: Iterable[Event], span) -> list[tuple[float, float]]:
    """The time at least one of `events` ran, inside `span` (sorted disjoint intervals)."""
    return intersect(merge_intervals((e.start_us, e.end_us) for e in events), span)


def _working_threads(host: Sequence[Event], step_name: str) -> set:
    """The host threads that run a step or issue GPU work (autograd runs backward on its own thread)."""
    return {e.stream for e in host if e.name == step_name or e.kind == RUNTIME}


def _cpu_work(host: Sequence[Event]) -> list[Event]:
    """On the CPU the device is the host: its work is the aten ops outside data loading."""
    loading = merge_intervals((e.start_us, e.end_us) for e in host if e.kind == OP and e.name.startswith(INPUT_RANGES))
    out = []
    for e in host:
        if e.kind == OP and e.name.startswith("aten::"):
            for a, b in subtract([(e.start_us, e.end_us)], loading):
                out.append(Event(GPU, e.name, a, b, stream=e.stream))
    return out


def _tf32_for(op: Event | None, name: str, tf32_matmul: bool, tf32_cudnn: bool) -> bool:
    """Whether TF32 was allowed for this op: cuBLAS's switch as the profiler recorded it for the op (a step
    may switch it itself); for a convolution cuDNN's switch as read when diagnose ran (the kernel's name,
    read first, settles it where it says tf32 or fp32)."""
    if name in CONV_OPS:
        return tf32_cudnn
    return op.tf32 if op is not None and op.tf32 is not None else tf32_matmul


def _class_of(e: Event, ops: dict, tf32_matmul: bool, tf32_cudnn: bool) -> str:
    op = ops.get(e.op_id)
    name = op.name if op is not None else e.op
    dtype = dtype_of(op.dtypes) if op is not None else ""
    return kernel_class(e.name, name, dtype, _tf32_for(op, name, tf32_matmul, tf32_cudnn))


def _gemm_facts(gpu: Sequence[Event], classes: dict, ops: dict, steps: int, tf32_matmul: bool = False,
                tf32_cudnn: bool = False, attention: set = frozenset()) -> list[GemmFact]:
    """GEMM kernels grouped by their launching op instance, then by (op, dtype, shapes, math, whether they are the
    products of attention by hand: `attention`, their ops)."""
    per_op: dict = {}
    for e in gpu:
        if classes[e].startswith("gemm"):
            key = e.op_id if e.op_id in ops else ("?", e.op, e.name)
            per_op.setdefault(key, []).append(e)
    convs = conv_flops(ops)
    groups: dict = {}
    for key, kernels in per_op.items():
        op = ops.get(key) if not isinstance(key, tuple) else None
        name = op.name if op is not None else kernels[0].op
        shapes = op.shapes if op is not None else ()
        dtype = dtype_of(op.dtypes) if op is not None else ""
        flops = (op.flops or gemm_flops(name, shapes) or convs.get(op.corr, 0.0)) if op is not None else 0.0
        tc = all(classes[k] == "gemm_tensor_core" for k in kernels)
        tf32 = _tf32_for(op, name, tf32_matmul, tf32_cudnn)
        maths = {kernel_math(k.name, dtype, tf32) for k in kernels}
        math_ = maths.pop() if len(maths) == 1 else ""
        g = groups.setdefault((name, dtype, shapes, tc, math_, key in attention), [0, 0.0, 0.0])
        g[0] += 1
        g[1] += length_us(merge_intervals((k.start_us, k.end_us) for k in kernels))
        g[2] += flops
    return [GemmFact(op=name, dtype=dtype, shapes=shapes, calls=n / steps, gpu_ms=t / 1e3 / steps,
                     flops=f / steps, tensor_cores=tc, misaligned=misaligned(name, shapes, dtype), math=m, attention=at)
            for (name, dtype, shapes, tc, m, at), (n, t, f) in sorted(groups.items(), key=lambda kv: -kv[1][1])]


def stall_site(typical: Sequence[Event], slow: Sequence[Event]) -> tuple[str, float]:
    """(the user's line, ms) whose time grew most from a typical step to a slow one: each step's Python
    frames cut into innermost pieces, their time summed by the user's line they belong to."""
    def per_site(events) -> dict:
        out: dict = {}
        frames = [e for e in events if e.kind == PY]
        for thread in {e.stream for e in frames}:
            for a, b, f, _ in innermost_frames([e for e in frames if e.stream == thread]):
                key = fmt_site(frame_site(f))
                out[key] = out.get(key, 0.0) + (b - a)
        return out
    grew = changes(per_site(typical), per_site(slow))
    grew = [(k, us) for k, us in grew if k and us > 0]
    return (grew[0][0], grew[0][1] / 1e3) if grew else ("", 0.0)
