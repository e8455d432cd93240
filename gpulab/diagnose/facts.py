"""The `Facts` contract: what `analyze` finds in a profiled step and the rules in `rules.py` read, per profiled
step (the profiled steps' total divided by their number), with the memory, stall and GEMM facts it holds.
`changes` compares two steps' facts. Read alone: nothing here reads events."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

# What the thread that runs the step was doing (`analyze.host_causes`): making or waiting for the batch, blocked in
# a synchronization, refilling the GPU's queue that a synchronization emptied ("after_sync": the GPU idles from
# the moment it ran dry until the host's next work reaches it), staging a pageable copy, in the allocator,
# compiling (torch.compile), issuing work to a queue with room ("launch"), blocked on a full launch queue (the
# GPU busy meanwhile: never idle), the user's own Python, or nothing the profiler saw.
CAUSES = ("input", "sync", "after_sync", "pageable_copy", "allocator", "compile", "launch", "queue_full", "host_code",
          "other")
CLASSES = ("gemm_tensor_core", "gemm_no_tensor_core", "gemm_unknown", "elementwise_norm", "copy", "communication")


# -- facts -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MemoryFacts:
    """The caching allocator around the profiled steps (torch.cuda.memory_stats), against the memory this
    process may use: the GPU's, or less under a per-process cap (`set_per_process_memory_fraction`, a
    GPULAB_PROFILE). Allocated is what tensors hold; reserved adds the allocator's cache of free blocks,
    which it reuses and gives back under pressure, so only allocated memory says the step is near full."""

    alloc_retries: int              # num_alloc_retries during the steps: cudaMalloc failed, cache freed, retried
    inactive_split_bytes: int       # inactive_split_bytes.all.current after the steps: free pieces of used blocks
    peak_reserved_bytes: int        # reserved_bytes.all.peak during the steps
    total_bytes: int                # the memory this process may use: the GPU's, or its cap
    peak_allocated_bytes: int = 0   # allocated_bytes.all.peak during the steps: what tensors held at most
    cap_source: str = ""            # where total_bytes comes from ("the GPU's memory", "a per-process cap...")
    steps: int = 1                  # profiled steps the retries were counted over

    @property
    def peak_reserved_frac(self) -> float:
        return self.peak_reserved_bytes / self.total_bytes if self.total_bytes else 0.0

    @property
    def peak_allocated_frac(self) -> float:
        return self.peak_allocated_bytes / self.total_bytes if self.total_bytes else 0.0

    @property
    def cached_bytes(self) -> int:
        """The allocator's cache at the peak: reserved but held by no tensor (reusable)."""
        return max(self.peak_reserved_bytes - self.peak_allocated_bytes, 0)


@dataclass(frozen=True)
class StallFacts:
    """Steps much longer than the typical one in the timed window (host clock, steps back to back)."""

    step_ms: tuple                  # every timed step's host time, in order
    slow: tuple                     # indices of the steps longer than STALL_FACTOR x the median
    median_ms: float                # the typical step: the median chunk without a slow step (GPU work included)
    mean_ms: float                  # the mean step over every chunk of the window
    period: int | None              # steps between slow steps, when they repeat evenly
    site: str = ""                  # the user's line the slow step spent its extra time on, where found
    site_ms: float = 0.0            # how much longer that line took in the slow step than in a typical one
    every_chunk: bool = False       # every timed chunk had a slow step: no chunk times the step without one

    @property
    def excess_ms(self) -> float:
        """What the slow steps cost per step: the mean step over the typical one."""
        return max(self.mean_ms - self.median_ms, 0.0)


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
    math: str = ""                  # how it ran: "fp32" (CUDA cores), "tf32", "bf16", "fp16", "fp8", "" unknown
    attention: bool = False         # a product of attention by hand (its scores or its context)


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
    tf32_supported: bool = True     # the GPU has TF32 (Ampere and later); False before: no TF32 advice
    memory: MemoryFacts | None = None
    step_ms: float | None = None    # unprofiled step time (steps back to back, host clock, synchronized)
    # the GPU's busy time and the step under a profiler of the GPU's activity only (core.kernel_busy): the
    # busy share of steps run back to back, where kernels can run slower than in the stretched full profile
    light_busy_ms: float | None = None
    light_step_ms: float | None = None
    flops_per_step: float | None = None
    peak_tflops: float | None = None
    peak_source: str = ""
    # No matrix product runs faster than this (TFLOP/s, 16-bit): the datasheet's dense peak where it is
    # known, else the measured peak. A measured peak is not a ceiling for every shape (some GEMMs run
    # faster than notebook 00's best), so the rules' "time a faster kernel can save" divides by this.
    kernel_ceiling_tflops: float | None = None
    # -- what the host spent the step on (ms per profiled step on the thread that runs it) and where
    host_by_cause: dict = field(default_factory=dict)
    host_sites: dict = field(default_factory=dict)       # cause -> ((user's line, library line, ms), ...)
    syncs: tuple = ()               # (user's line, library line, ms blocked per step, calls per step)
    hidden_syncs: tuple = ()        # (user's line, innermost line), one per warning of torch.cuda.set_sync_debug_mode
    sync_kinds: tuple = ()          # (user's line, library line, kind, calls per step): what made each sync wait -
                                    # "read" (.item(), .tolist()), "branch" (Python's if/bool on a GPU value), "shape"
                                    # (nonzero, boolean masks: an output whose size the GPU decides), "copy", "wait"
    data_dependent: tuple = ()      # (user's line, op, calls per step) of ops whose output size the GPU's values decide
    shape_changes: tuple = ()       # (user's line, op, distinct input shapes seen, steps): ops whose shapes differ
                                    # from one profiled step to the next
    new_shapes: dict | None = None  # where profiled steps that met a new shape were set apart (gaps.settled_windows):
                                    # how many, of the profiled and the timed steps, and the settled step's time
    pageable_copies: tuple = ()     # (user's line, ms of host time per step, bytes per step)
    pinnable_sites: tuple = ()      # the user's lines of every host-to-device copy from pageable memory, any size
    precopy_ms: float = 0.0         # host time before the batch's copy to the GPU (made in the main thread)
    # -- patterns of the course's later lessons (ms per profiled step)
    transpose_ms: float = 0.0       # layout conversions (NCHW <-> NHWC) around convolutions (lesson 07)
    attention_math_ms: float = 0.0  # attention computed as matmul + softmax over (T, T) scores (lesson 13)
    attention_math_flops: float = 0.0
    attention_shape: tuple = ()     # (T, T) of the largest score matrix seen
    optimizer_host_ms: float = 0.0  # the host in optimizer.step() (its record_function range)
    optimizer_gpu_ms: float = 0.0   # the GPU time of the kernels it queued
    optimizer_kernels: float = 0.0  # per step
    optimizer_fused: bool | None = None   # a fused optimizer kernel ran (None: no optimizer range seen)
    optimizer_name: str = ""
    optimizer_ops: tuple = ()       # the ops that queued GPU work inside optimizer.step (which passes it makes)
    scaler_host_ms: float = 0.0     # GradScaler's unscale / inf checks on the host (a fused optimizer does them)
    scaler_gpu_ms: float = 0.0
    copy_exposed_ms: float = 0.0    # non-pageable copies of >= 1 MiB while no kernel ran (lesson 08)
    ddp_forwards: float = 0.0       # DistributedDataParallel forwards per step (micro-batches)
    comm_early_ms: float = 0.0      # communication queued before the step's last DDP forward (lesson 10)
    data_parallel_ms: float = 0.0   # host time inside nn.DataParallel's forward (lesson 14)
    compiled_regions: float = 0.0   # torch.compile'd regions entered per step
    between_regions_ms: float = 0.0  # host time between two compiled regions of a step (graph breaks)
    rnn_host_ms: float = 0.0        # host time inside recurrent layers' ops (Dynamo runs them eagerly)
    compiled_host_ms: float | None = None   # host time inside compiled regions and compiled backwards
    compiled_launch_ms: float | None = None  # of it, from each region's first GPU-queueing call to its last's end
    compiled_launch_busy_ms: float = 0.0     # GPU time of the kernels queued in that stretch (a graph still runs them)
    compile: dict = field(default_factory=dict)   # dynamo's counters around the timed steps (core.py)
    stalls: StallFacts | None = None
    intervals: dict = field(default_factory=dict, repr=False)   # for the plot: windows, busy, idle, host

    @property
    def base_ms(self) -> float:
        """The step the shares are of: the unprofiled one where it was timed (the step a fix speeds up),
        else the profiled one."""
        return self.step_ms or self.window_ms

    @property
    def base_idle_ms(self) -> float:
        """The unprofiled step's idle: its share in the kernel-only profile of steps back to back (where
        one was made) times the step; else the step minus the full profile's busy time."""
        if self.light_busy_ms is not None and self.light_step_ms:
            # the smaller of its idle share times the step and the step minus its busy time: the kernel-only
            # profile still adds a little host time per launch (of a step launching 900 kernels one by one,
            # on the H200, 34 ms became 43), which shows as idle in a step the host paces
            return max(min(self.base_ms * (1.0 - self.light_busy_ms / self.light_step_ms),
                           self.base_ms - self.light_busy_ms), 0.0)
        return max(self.base_ms - self.busy_ms, 0.0)

    @property
    def host_scale(self) -> float:
        """The unprofiled step over the profiled one (at most 1): the profiler adds host time to every op and
        Python call, so host times measured under it are scaled by this to the step a fix speeds up."""
        if not self.window_ms or not self.step_ms:
            return 1.0
        return min(self.step_ms / self.window_ms, 1.0)

    @property
    def idle_scale(self) -> float:
        """Unprofiled idle over profiled idle (for the report's idle lines)."""
        if self.idle_ms <= 0:
            return 0.0
        return self.base_idle_ms / self.idle_ms

    def host(self, cause: str) -> float:
        """ms per unprofiled step the host spent on `cause` (profiled, scaled by host_scale)."""
        return self.host_by_cause.get(cause, 0.0) * self.host_scale

    def idle(self, cause: str) -> float:
        """The most of the unprofiled step a fix that takes `cause` off the host's path can save: the host's
        time in it, and no more than the GPU's idle time (the step cannot get shorter than the GPU's work)."""
        if not self.on_gpu:
            return self.host(cause)
        return min(self.host(cause), self.base_idle_ms)

    def sites(self, cause: str, top: int = 3) -> str:
        """The user's lines `cause`'s host time came from, largest first: "train.py:12 (make_batch) 30 ms"."""
        rows = self.host_sites.get(cause, ())[:top]
        return ", ".join(f"{site}{' via ' + via if via and via != site else ''} ({ms:.3g} ms)"
                         for site, via, ms in rows)

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
        """Model FLOP/s utilization as PaLM defines it: tflops / the datasheet's dense 16-bit peak
        (`kernel_ceiling_tflops`; None where the datasheet is unknown or the step's FLOPs are)."""
        if self.tflops is None or not self.kernel_ceiling_tflops:
            return None
        return self.tflops / self.kernel_ceiling_tflops

    @property
    def measured_peak_fraction(self) -> float | None:
        """tflops / the 16-bit peak notebook 00 measured on this GPU (`peak_tflops`): the fraction of measured
        peak, not MFU (None if unknown)."""
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
        out.update(tflops=self.tflops, mfu=self.mfu, measured_peak_fraction=self.measured_peak_fraction,
                   base_ms=self.base_ms, idle_scale=self.idle_scale,
                   host_scale=self.host_scale, base_idle_ms=self.base_idle_ms)
        return out


# -- comparing two steps -----------------------------------------------------------------------------
def changes(before: dict, after: dict) -> list[tuple[str, float]]:
    """after - before for every key of either (ms per step, say), the largest change first: where a
    fix's time went between two diagnoses of the same step."""
    keys = list(dict.fromkeys([*before, *after]))
    return sorted(((k, after.get(k, 0.0) - before.get(k, 0.0)) for k in keys), key=lambda kv: -abs(kv[1]))
