"""Facts from events: what the rules in `rules.py` read.

- **Windows.** Each profiled step is its "gpulab.step" host range, extended to the end of the last GPU
  event launched inside it: the host returns from `step()` while the GPU is still working.
- **Busy and idle.** Busy is the union of all GPU work in the windows, every stream merged (a moment
  with two kernels running counts once); idle is the rest of the windows.
- **Why the GPU was idle.** Each idle stretch is charged to what the host was doing *when the GPU ran
  dry* (the stretch's start): the GPU ran out of work because the host was busy with that instead of
  queueing work ahead, and the time until the host queued the next kernel is that cause's cost. If the
  host then goes on to wait for something stronger (a batch, a copy, a sync, the allocator) while the
  GPU is still dry, the rest of the stretch is charged to that. See `HostActivity.cause` and `.charge`.
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
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from gpulab.core.timing import intersect, merge_intervals, subtract
from gpulab.diagnose.events import (
    DATA_RANGE,
    GPU,
    OP,
    RUNTIME,
    STEP_RANGE,
    Event,
    step_ranges,
)

CAUSES = ("input", "sync", "pageable_copy", "allocator", "launch", "other")
STRONG = ("input", "pageable_copy", "sync", "allocator")      # causes that take over an idle stretch
CLASSES = ("gemm_tensor_core", "gemm_no_tensor_core", "elementwise_norm", "copy", "communication")


# Host calls that launch one kernel each (the runtime's and the driver's; cuBLAS and Triton use the
# driver's). A replayed CUDA graph launches all its kernels with one cudaGraphLaunch, not counted here.
KERNEL_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                   "cudaLaunchCooperativeKernel")


# -- thresholds of the analysis (the rules' own are in rules.py) -----------------------------------
# A synchronizing call that returned this little before the GPU ran dry still caused it: CUPTI stamps
# GPU work on the GPU's clock and torch converts it to the host's, and a blocked thread needs a few
# microseconds to wake up; the two clocks agree to within a few microseconds, not exactly.
SYNC_GRACE_US = 20.0
# A kernel launched onto an idle stream starts a few microseconds after its launch call returns (the
# launch latency, ~5 us on current GPUs, plus the clocks' disagreement above): a wait shorter than this
# is the launch itself, not work standing ready behind something else (see `waited_on`).
LAUNCH_GRACE_US = 20.0
# Python between two PyTorch calls (module __call__, attribute look-ups, the loop) is part of issuing
# the step's work: a gap between two host events shorter than this counts as "launch". Its order is the
# per-op host cost lesson 11 measures (tens of microseconds); a longer gap is the learner's own host
# work ("other").
GLUE_GAP_US = 100.0
# 16-bit GEMMs whose M, N or K is not a multiple of 8 elements (16 bytes) miss the Tensor Cores' tile
# shape: cuBLAS before CUDA 11 did not use Tensor Cores for them at all, later versions pad and lose
# efficiency (NVIDIA, "Matrix Multiplication Background User's Guide", Tensor Core requirements).
# Lesson 07 pads the vocabulary to a multiple of 64 for the best tiles; 8 is the requirement we check.
ALIGN_ELEMENTS = 8


# -- names -----------------------------------------------------------------------------------------
INPUT_RANGES = ("enumerate(DataLoader)", DATA_RANGE)      # a DataLoader's __next__, or the learner's range
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyDtoH_v2",
              "aten::item", "aten::_local_scalar_dense")
SCALAR_READS = ("aten::item", "aten::_local_scalar_dense")
ALLOC_CALLS = ("cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync", "cudaHostAlloc", "cudaFreeHost",
               "cuMemAlloc_v2", "cuMemFree_v2", "cuMemCreate", "cuMemMap", "cuMemUnmap", "cuMemRelease",
               "cuMemAddressReserve", "cuMemAddressFree", "cuMemSetAccess")
COPY_OPS = ("aten::copy_", "aten::_copy_from", "aten::to", "aten::_to_copy")
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm", "aten::addmv",
              "aten::mv", "aten::dot", "aten::_addmm_activation")
CONV_OPS = ("aten::cudnn_convolution", "aten::cudnn_convolution_transpose", "aten::convolution_backward",
            "aten::_convolution", "aten::convolution", "aten::miopen_convolution")
ATTENTION_OPS = ("aten::_flash_attention_forward", "aten::_flash_attention_backward",
                 "aten::_efficient_attention_forward", "aten::_efficient_attention_backward",
                 "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_flash_attention",
                 "aten::_scaled_dot_product_efficient_attention")

# Kernel names (lower case) of matrix products: cuBLAS ("ampere_sgemm_128x64_nn", "gemv2T_kernel",
# "splitKreduce_kernel", "gemmSN_TN_kernel"), cuBLASLt on Hopper ("nvjet_hsh_..."), CUTLASS
# ("cutlass_80_tensorop_bf16_s16816gemm_..."), the xmma kernels of cuBLAS/cuDNN ("sm90_xmma_gemm_...",
# "sm80_xmma_fprop_implicit_gemm_..."), cuDNN's own ("implicit_convolve_sgemm", "cudnn::..."), and
# attention (flash / memory-efficient, "fmha_cutlass...").
GEMM_NAMES = ("gemm", "gemv", "splitk", "xmma", "cutlass", "nvjet", "s16816", "s1688", "h884", "h1688",
              "h16816", "hmma", "wmma", "tensorop", "dot_kernel", "convolve", "fprop", "dgrad", "wgrad",
              "flash", "fmha", "triton_tem_")
# ...that never run on Tensor Cores: fp32 SIMT kernels and matrix-vector products.
NO_TENSOR_CORE_NAMES = ("sgemm", "simt", "gemv", "dgemm", "dot_kernel", "gemmsn", "gemmk1", "convolve_sgemm")
# ...that do: the MMA instruction shapes in cuBLAS/CUTLASS names (s16816 = bf16/fp16 m16n8k16,
# s1688 = tf32 m16n8k8, h884/h1688 = Volta/Turing fp16), Hopper's nvjet, and the input precision.
TENSOR_CORE_NAMES = ("s16816", "s1688", "h884", "h1688", "h16816", "i8816", "hmma", "wmma", "tensorop",
                     "nvjet", "bf16", "f16", "fp16", "tf32", "e4m3", "e5m2", "flash", "fmha")


# -- facts -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryFacts:
    """The caching allocator around the profiled steps (torch.cuda.memory_stats, mem_get_info)."""

    alloc_retries: int              # num_alloc_retries during the steps: cudaMalloc failed, cache freed, retried
    inactive_split_bytes: int       # inactive_split_bytes.all.current after the steps: free pieces of used blocks
    peak_reserved_bytes: int        # reserved_bytes.all.peak during the steps
    total_bytes: int                # the GPU's memory (mem_get_info)

    @property
    def peak_reserved_frac(self) -> float:
        return self.peak_reserved_bytes / self.total_bytes if self.total_bytes else 0.0


@dataclass(frozen=True)
class GemmFact:
    """One kind of matrix product in the step (same op, dtype and shapes), per step."""

    op: str
    dtype: str                      # "fp32", "bf16", "fp16", "fp8", "fp64" or "" (unknown)
    shapes: tuple
    calls: float                    # per step
    gpu_ms: float                   # per step, its kernels' time
    flops: float                    # per step
    tensor_cores: bool
    misaligned: bool                # 16-bit with M, N or K not a multiple of ALIGN_ELEMENTS


@dataclass(frozen=True)
class Facts:
    """What the rules read; times are ms per profiled step (`idle(cause)`: scaled to the unprofiled step),
    shares fractions of the unprofiled step (`base_ms`)."""

    on_gpu: bool
    steps: int
    window_ms: float                # the profiled step: host range + the GPU's tail
    busy_ms: float
    idle_ms: float
    idle_by_cause: dict
    busy_by_class: dict
    kernels_per_step: float = 0.0
    launches_per_step: float | None = None   # host calls that launch kernels one at a time (None: not counted)
    median_kernel_us: float | None = None
    pageable_copy_ms: float = 0.0   # GPU time of copies from/to pageable host memory
    comm_ms: float = 0.0
    comm_exposed_ms: float = 0.0    # communication that queued work waited for (see `waited_on`)
    gemms: tuple = ()
    tf32_matmul: bool = False
    tf32_cudnn: bool = False
    memory: MemoryFacts | None = None
    step_ms: float | None = None    # unprofiled step time (steps back to back, host clock, synchronized)
    flops_per_step: float | None = None
    peak_tflops: float | None = None
    peak_source: str = ""
    # No matrix product runs faster than this (TFLOP/s, 16-bit): the datasheet's dense peak where it is
    # known, else the measured peak. A measured peak is not a ceiling for every shape (some GEMMs run
    # faster than notebook 00's best), so the rules' "time a faster kernel can save" divides by this.
    kernel_ceiling_tflops: float | None = None
    intervals: dict = field(default_factory=dict, repr=False)   # for the plot: windows, busy, idle

    @property
    def base_ms(self) -> float:
        """The step the shares are of: the unprofiled one where it was timed (the step a fix speeds up),
        else the profiled one."""
        return self.step_ms or self.window_ms

    @property
    def idle_scale(self) -> float:
        """Unprofiled idle over profiled idle. The profiler adds host time to every op, so the GPU idles
        longer under it than without it; the unprofiled step minus the busy time (kernel times barely
        change under the profiler) is the idle there is, and each cause keeps its share of it."""
        if self.idle_ms <= 0:
            return 0.0
        return max(self.base_ms - self.busy_ms, 0.0) / self.idle_ms

    def idle(self, cause: str) -> float:
        """ms per unprofiled step the GPU idled for `cause` (the profiled idle, scaled by idle_scale)."""
        return self.idle_by_cause.get(cause, 0.0) * self.idle_scale

    def share(self, ms: float) -> float:
        """`ms` as a fraction of the unprofiled step (`base_ms`), at most 1."""
        return min(ms / self.base_ms, 1.0) if self.base_ms > 0 else 0.0

    def busy_share(self, ms: float) -> float:
        """GPU time `ms` (measured under the profiler) as a fraction of the step: of the unprofiled step,
        or of the profiled busy time where that is longer (kernels can run slower under the profiler, and
        their time cannot be more of the step than all of it)."""
        base = max(self.base_ms, self.busy_ms)
        return min(ms / base, 1.0) if base > 0 else 0.0

    @property
    def tflops(self) -> float | None:
        """Model TFLOP/s at the unprofiled step time (else the profiled one)."""
        t = self.step_ms or self.window_ms
        if not self.flops_per_step or not t:
            return None
        return self.flops_per_step / (t / 1e3) / 1e12

    @property
    def mfu(self) -> float | None:
        """Model FLOP/s utilization: tflops / the 16-bit peak notebook 00 measured (None if unknown)."""
        if self.tflops is None or not self.peak_tflops:
            return None
        return self.tflops / self.peak_tflops

    def gemm_ms(self, pred) -> tuple[float, float]:
        """(GPU ms, FLOPs) per step of the GEMMs for which pred(GemmFact) holds."""
        chosen = [g for g in self.gemms if pred(g)]
        return sum(g.gpu_ms for g in chosen), sum(g.flops for g in chosen)

    def to_dict(self) -> dict:
        """The facts as plain values, without the plot's intervals (thousands of them)."""
        out = asdict(self)
        del out["intervals"]
        out.update(tflops=self.tflops, mfu=self.mfu, base_ms=self.base_ms, idle_scale=self.idle_scale)
        return out


# -- comparing two steps -----------------------------------------------------------------------------
def changes(before: dict, after: dict) -> list[tuple[str, float]]:
    """after - before for every key of either (ms per step, say), the largest change first: where a
    fix's time went between two diagnoses of the same step."""
    keys = list(dict.fromkeys([*before, *after]))
    return sorted(((k, after.get(k, 0.0) - before.get(k, 0.0)) for k in keys), key=lambda kv: -abs(kv[1]))


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


# -- kernel classes --------------------------------------------------------------------------------
def dtype_of(dtypes: Sequence[str]) -> str:
    """The precision of an op from its recorded input dtypes: that of its first tensor input."""
    names = {"float": "fp32", "c10::bfloat16": "bf16", "c10::half": "fp16", "double": "fp64"}
    for d in dtypes:
        low = str(d).lower()
        if low in names:
            return names[low]
        if "float8" in low:
            return "fp8"
    return ""


def is_gemm(name: str, op: str = "") -> bool:
    """A matrix product (or convolution / attention, which run as one), by kernel name or launching op."""
    low = name.lower()
    if low.startswith(("memcpy", "memset")) or "nccl" in low:
        return False
    return any(t in low for t in GEMM_NAMES) or (op in MATMUL_OPS + ATTENTION_OPS and "elementwise" not in low)


def uses_tensor_cores(name: str, dtype: str = "", tf32: bool = False) -> bool:
    """Whether a GEMM kernel ran on Tensor Cores: the name first where it is explicit, then the launching
    op's dtype (fp32 without TF32 cannot; 16-bit, fp8 and fp32 with TF32 do)."""
    low = name.lower()
    if any(t in low for t in NO_TENSOR_CORE_NAMES):
        return False
    if dtype in ("fp32", "fp64") and not (dtype == "fp32" and tf32):
        return False
    if any(t in low for t in TENSOR_CORE_NAMES):
        return True
    return dtype in ("bf16", "fp16", "fp8") or (dtype == "fp32" and tf32) or dtype == ""


def kernel_class(name: str, op: str = "", dtype: str = "", tf32: bool = False) -> str:
    """One of CLASSES for a GPU event. Copies by name ("Memcpy ...", "Memset ..."), NCCL collectives by
    name, GEMMs by `is_gemm` and then `uses_tensor_cores`; everything else is elementwise/normalization."""
    low = name.lower()
    if low.startswith(("memcpy", "memset")):
        return "copy"
    if "nccl" in low:
        return "communication"
    if is_gemm(name, op):
        return "gemm_tensor_core" if uses_tensor_cores(name, dtype, tf32) else "gemm_no_tensor_core"
    return "elementwise_norm"


def is_pageable(e: Event) -> bool:
    """A copy from or to pageable host memory ("Memcpy HtoD (Pageable -> Device)")."""
    return e.kind == GPU and e.name.lower().startswith("memcpy") and "pageable" in e.name.lower()


# -- GEMM shapes -----------------------------------------------------------------------------------
def mnk(op: str, shapes: Sequence[tuple]) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of a matrix-product op from its recorded input shapes; None if unknown."""
    first = {"aten::mm": 0, "aten::addmm": 1, "aten::_addmm_activation": 1, "aten::bmm": 0,
             "aten::baddbmm": 1, "aten::_scaled_mm": 0}.get(op)
    if first is None or len(shapes) < first + 2:
        return None
    a, b = shapes[first], shapes[first + 1]
    if len(a) == 2 and len(b) == 2 and a[1] == b[0]:
        return 1, a[0], b[1], a[1]
    if len(a) == 3 and len(b) == 3 and a[2] == b[1]:
        return a[0], a[1], b[2], a[2]
    return None


def gemm_flops(op: str, shapes: Sequence[tuple]) -> float:
    """2 * batch * M * N * K from the shapes (0 if unknown)."""
    dims = mnk(op, shapes)
    return 0.0 if dims is None else 2.0 * math.prod(dims)


def misaligned(op: str, shapes: Sequence[tuple], dtype: str) -> bool:
    """A 16-bit matrix product with M, N or K not a multiple of ALIGN_ELEMENTS."""
    dims = mnk(op, shapes)
    return dtype in ("bf16", "fp16") and dims is not None and any(d % ALIGN_ELEMENTS for d in dims[1:])


# -- idle attribution ------------------------------------------------------------------------------
class HostActivity:
    """What the host threads were doing over time: `cause(t)` for each moment the GPU ran dry.

    Built once per analysis; asking for non-decreasing t sweeps the events once (a learner's step can
    hold thousands of ops and as many idle stretches).
    """

    def __init__(self, host: Sequence[Event], pageable_ops: Iterable[int] = (), pageable_calls: Iterable[int] = (),
                 step_name: str = STEP_RANGE):
        self.step_name = step_name
        self.events = sorted(host, key=lambda e: e.start_us)
        self.pageable_ops, self.pageable_calls = set(pageable_ops), set(pageable_calls)
        self.steps = [e for e in self.events if e.name == step_name]
        self.starts: dict[int, list[float]] = {}
        self.ends: dict[int, list[float]] = {}
        for e in self.events:
            if e.name != step_name:
                self.starts.setdefault(e.stream, []).append(e.start_us)
                self.ends.setdefault(e.stream, []).append(e.end_us)
        for ends in self.ends.values():
            ends.sort()
        self._starts = [e.start_us for e in self.events]
        self._next, self._live, self._t = 0, [], -math.inf

    def active(self, t: float) -> list[Event]:
        """Host events running at t, and synchronizing calls that returned at most SYNC_GRACE_US before.
        A copy from pageable memory is one of them: CUDA synchronizes the stream before a pageable copy
        starts (it waits for the work queued before it) and returns once the data is staged, and PyTorch's
        blocking copy (`non_blocking=False`) then waits for the copy itself: the GPU runs dry as it returns."""
        if t < self._t:
            self._next, self._live = 0, []
        self._t = t
        while self._next < len(self.events) and self.events[self._next].start_us <= t:
            self._live.append(self.events[self._next])
            self._next += 1
        self._live = [e for e in self._live if e.end_us >= t - SYNC_GRACE_US]
        return [e for e in self._live if e.end_us > t or e.name in SYNC_CALLS
                or (e.kind == RUNTIME and e.corr in self.pageable_calls)]

    def in_glue_gap(self, t: float) -> bool:
        """Whether t falls in a short gap (GLUE_GAP_US) between two host events of one thread inside a
        step: Python running between two PyTorch calls."""
        steps = [s for s in self.steps if s.start_us <= t <= s.end_us]
        for thread, starts in self.starts.items():
            ends = self.ends[thread]
            inside = [s for s in steps if s.stream == thread]
            before = ends[bisect.bisect_right(ends, t) - 1] if bisect.bisect_right(ends, t) else None
            after_i = bisect.bisect_right(starts, t)
            after = starts[after_i] if after_i < len(starts) else None
            lo = max([x for x in [before] + [s.start_us for s in inside] if x is not None], default=None)
            hi = min([x for x in [after] + [s.end_us for s in inside] if x is not None], default=None)
            if lo is not None and hi is not None and hi - lo <= GLUE_GAP_US:
                return True
        return False

    def cause(self, t: float) -> str:
        """What the host was doing at t, when the GPU ran dry, by priority:

        1. "input": inside a DataLoader's `__next__` (`enumerate(DataLoader)#...`) or a "gpulab.data" range;
        2. "pageable_copy": inside a copy op or `cudaMemcpyAsync` that moved pageable memory (its wait for
           the copy included: pinned memory with non_blocking=True is the fix, not removing a sync) - but
           not inside `.item()`, whose tiny copy only serves to read a number;
        3. "sync": inside (or just out of: SYNC_GRACE_US) a synchronizing call (SYNC_CALLS, `.item()`);
        4. "allocator": inside cudaMalloc/cudaFree and their relatives (ALLOC_CALLS);
        5. "launch": inside any other op or runtime call, or in a short gap between two (GLUE_GAP_US);
        6. "other": none of these (the learner's own host work, or nothing recorded).
        """
        active = self.active(t)
        names = {e.name for e in active}
        if any(e.kind == OP and e.name.startswith(INPUT_RANGES) for e in active):
            return "input"
        if not names & set(SCALAR_READS) and any(
                (e.kind == OP and e.corr in self.pageable_ops) or
                (e.kind == RUNTIME and e.corr in self.pageable_calls) for e in active):
            return "pageable_copy"
        if names & set(SYNC_CALLS):
            return "sync"
        if names & set(ALLOC_CALLS):
            return "allocator"
        if any(e.name != self.step_name and e.end_us > t for e in active) or self.in_glue_gap(t):
            return "launch"
        return "other"


    def charge(self, a: float, b: float) -> list[tuple[float, float, str]]:
        """An idle stretch [a, b] cut into (start, end, cause) pieces: the cause at its start, until the
        host enters a different strong cause (STRONG: input, pageable_copy, sync, allocator), which takes
        the rest. The GPU stays dry while the host goes on to wait for a batch or a copy, and the refill
        after a wait is that wait's cost; a weak cause (launch, other) never takes over."""
        pieces, cur, at = [], self.cause(a), a
        for e in self.events[bisect.bisect_right(self._starts, a):bisect.bisect_left(self._starts, b)]:
            c = self.cause(e.start_us)
            if c in STRONG and c != cur:
                pieces.append((at, e.start_us, cur))
                cur, at = c, e.start_us
        pieces.append((at, b, cur))
        return [p for p in pieces if p[1] > p[0]]


def idle_cause(host: Sequence[Event], t: float, pageable_ops: Iterable[int] = (),
               pageable_calls: Iterable[int] = ()) -> str:
    """`HostActivity(host, ...).cause(t)` for one moment t."""
    return HostActivity(host, pageable_ops, pageable_calls).cause(t)


# -- the analysis ----------------------------------------------------------------------------------
def analyze(events: Sequence[Event], *, on_gpu: bool = True, step_name: str = STEP_RANGE,
            tf32_matmul: bool = False, tf32_cudnn: bool = False, memory: MemoryFacts | None = None,
            step_ms: float | None = None, flops_per_step: float | None = None,
            peak_tflops: float | None = None, peak_source: str = "",
            kernel_ceiling_tflops: float | None = None) -> Facts:
    """Facts from the events of the profiled steps (each inside a `step_name` host range)."""
    events = list(events)
    windows = step_windows(events, step_name)
    if not windows:
        raise ValueError(f"no {step_name!r} ranges among the events: profile each step inside "
                         f"torch.profiler.record_function({step_name!r}) (diagnose() does)")
    steps = len(windows)
    # One span from the first step's start to the last one's end: the steps run back to back, and an idle
    # stretch that began in one step (the GPU ran dry during its `.item()`) and goes on into the next is
    # one stretch with one cause, not a new one at the next step's first line.
    span = [(windows[0][0], max(hi for _, hi in windows))]
    host = [e for e in events if e.kind in (OP, RUNTIME)]
    threads = _working_threads(host, step_name)
    host = [e for e in host if e.stream in threads]
    gpu = [e for e in events if e.kind == GPU and e.end_us > e.start_us and intersect(span, [(e.start_us, e.end_us)])]
    work = gpu if on_gpu else _cpu_work(host)
    busy = _union(work, span)
    idle = subtract(span, busy)

    pageable = [e for e in gpu if is_pageable(e)]
    activity = HostActivity(host, {e.op_id for e in pageable if e.op_id}, {e.corr for e in pageable if e.corr},
                            step_name)
    stretches = [piece for a, b in idle for piece in activity.charge(a, b)]
    causes = dict.fromkeys(CAUSES, 0.0)
    for a, b, cause in stretches:
        causes[cause] += b - a

    ops = {e.corr: e for e in events if e.kind == OP and e.corr}
    classes = {e: _class_of(e, ops, tf32_matmul, tf32_cudnn) for e in gpu}
    comm = _union([e for e in gpu if classes[e] == "communication"], span)
    rest = _union([e for e in gpu if classes[e] != "communication"], span)
    waiting = waited_on(gpu, {e.corr: e.end_us for e in host if e.kind == RUNTIME and e.corr},
                        lambda e: classes[e] != "communication")
    kernels = [e.dur_us for e in gpu if classes[e] != "copy"]
    per_step = 1e3 * steps      # us in total -> ms per step
    return Facts(
        on_gpu=on_gpu, steps=steps, window_ms=length_us(span) / per_step,
        busy_ms=length_us(busy) / per_step, idle_ms=length_us(idle) / per_step,
        idle_by_cause={c: v / per_step for c, v in causes.items()},
        busy_by_class={c: length_us(_union([e for e in gpu if classes[e] == c], span)) / per_step for c in CLASSES},
        kernels_per_step=len(kernels) / steps,
        launches_per_step=sum(1 for e in host if e.kind == RUNTIME and e.name in KERNEL_LAUNCHES
                              and any(a <= e.start_us <= b for a, b in span)) / steps, median_kernel_us=statistics.median(kernels) if kernels else None,
        pageable_copy_ms=length_us(_union(pageable, span)) / per_step,
        comm_ms=length_us(comm) / per_step, comm_exposed_ms=length_us(intersect(subtract(comm, rest), waiting)) / per_step,
        gemms=tuple(_gemm_facts(gpu, classes, ops, steps)), tf32_matmul=tf32_matmul, tf32_cudnn=tf32_cudnn,
        memory=memory, step_ms=step_ms, flops_per_step=flops_per_step, peak_tflops=peak_tflops,
        peak_source=peak_source, kernel_ceiling_tflops=kernel_ceiling_tflops,
        intervals={"windows": windows, "busy": busy, "idle": stretches,
                   "work": [(e.stream, e.start_us, e.end_us) for e in work]},
    )


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


def _class_of(e: Event, ops: dict, tf32_matmul: bool, tf32_cudnn: bool) -> str:
    op = ops.get(e.op_id)
    name = op.name if op is not None else e.op
    dtype = dtype_of(op.dtypes) if op is not None else ""
    if name in CONV_OPS:
        tf32 = tf32_cudnn               # cuDNN's switch, read when diagnose ran
    else:                               # cuBLAS's, as the profiler recorded it for the op, else as read
        tf32 = op.tf32 if op is not None and op.tf32 is not None else tf32_matmul
    return kernel_class(e.name, name, dtype, tf32)


def _gemm_facts(gpu: Sequence[Event], classes: dict, ops: dict, steps: int) -> list[GemmFact]:
    """GEMM kernels grouped by their launching op instance, then by (op, dtype, shapes)."""
    per_op: dict = {}
    for e in gpu:
        if classes[e].startswith("gemm"):
            key = e.op_id if e.op_id in ops else ("?", e.op, e.name)
            per_op.setdefault(key, []).append(e)
    groups: dict = {}
    for key, kernels in per_op.items():
        op = ops.get(key) if not isinstance(key, tuple) else None
        name = op.name if op is not None else kernels[0].op
        shapes = op.shapes if op is not None else ()
        dtype = dtype_of(op.dtypes) if op is not None else ""
        flops = (op.flops or gemm_flops(name, shapes)) if op is not None else 0.0
        tc = all(classes[k] == "gemm_tensor_core" for k in kernels)
        g = groups.setdefault((name, dtype, shapes, tc), [0, 0.0, 0.0])
        g[0] += 1
        g[1] += length_us(merge_intervals((k.start_us, k.end_us) for k in kernels))
        g[2] += flops
    return [GemmFact(op=name, dtype=dtype, shapes=shapes, calls=n / steps, gpu_ms=t / 1e3 / steps,
                     flops=f / steps, tensor_cores=tc, misaligned=misaligned(name, shapes, dtype))
            for (name, dtype, shapes, tc), (n, t, f) in sorted(groups.items(), key=lambda kv: -kv[1][1])]
