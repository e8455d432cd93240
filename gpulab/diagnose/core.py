"""`diagnose(step)`: which of the course's bottlenecks is yours, and what fixing it would buy.

The learner hands over one training step, a callable with no arguments that fetches its batch and
trains on it, the way their loop does. `diagnose` then

1. runs `warmup` steps unmeasured (allocator, cuBLAS and cuDNN settle), then more in chunks until the step's time
   stops falling (`settle`, on a GPU: kernels loaded, shapes compiled), at most SETTLE_MAX_S; the last runs under
   FlopCounterMode (the step's FLOPs) and `torch.cuda.set_sync_debug_mode("warn")` (the implicit
   synchronizations PyTorch warns of: `.item()`, `.cpu()`, blocking copies, `nonzero`, boolean masks,
   with the user's line; not `torch.cuda.synchronize()`, events, the allocator or distributed ops, which
   the profile's runtime calls show): no extra training step is run for either;
2. times chunks of `steps` back-to-back steps on the host clock, synchronizing before and after each chunk,
   for at least `window_s` seconds (the unperturbed step time, each step's host time, and slow steps that
   come back every N steps; NVML samples the GPU's utilization meanwhile where it can);
3. runs `steps` more under `torch.profiler` (each inside `record_function("gpulab.step")`, with shapes,
   FLOPs and Python stacks) with the caching allocator's statistics read before and after; where slow
   steps come back every few steps, a typical step and a slow one are profiled to find the line that
   took the slow one's extra time;
4. turns the profile into `Facts` (analyze.py) and runs the rules (rules.py);
5. runs, for each verdict whose fix can be made from outside the step, that variant and ranks the
   verdicts by what it measured (confirm.py).

`record_to=` keeps what was recorded (gzipped JSON); `from_record(path)` analyses it again without the GPU.
"""
from __future__ import annotations

import gzip
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields

import torch

from gpulab.core.device import device_facts, pick_device, sync
from gpulab.core.memory import free_memory
from gpulab.core.monitor import NVML_PERIOD_MAX_S
from gpulab.core.timing import benchmark, summarize
from gpulab.diagnose.analyze import analyze
from gpulab.diagnose.facts import Facts, MemoryFacts, StallFacts
from gpulab.diagnose.events import STEP_RANGE, Record
from gpulab.diagnose.rules import Verdict, run_rules


class DiagnoseError(RuntimeError):
    """The step could not be diagnosed (it raised, or produced nothing to read)."""


@dataclass
class Diagnosis:
    """What `diagnose` found: the facts (times in ms per step, averaged over the profiled steps unless
    said), the rules' verdicts on them, and how they were obtained. The figures the facts hold are read
    through them (`busy_ms`, `idle_by_cause`, `mfu`...), not stored twice."""

    device: str
    facts: Facts
    step_spread_ms: float = 0.0     # the unprofiled step's spread (interquartile range of its samples)
    nvml_util_pct: float | None = None
    verdicts: list = field(default_factory=list)
    skipped: dict = field(default_factory=dict)
    trace_path: str | None = None
    label: str = ""
    notes: list = field(default_factory=list)      # how some figures were obtained, or why they are missing

    # read from the facts
    on_gpu = property(lambda self: self.facts.on_gpu)
    step_ms = property(lambda self: self.facts.base_ms, doc="the unprofiled step (else the profiled one)")
    profiled_step_ms = property(lambda self: self.facts.window_ms)
    busy_ms = property(lambda self: self.facts.busy_ms)
    idle_ms = property(lambda self: self.facts.idle_ms)
    idle_by_cause = property(lambda self: self.facts.idle_by_cause)
    busy_by_class = property(lambda self: self.facts.busy_by_class)
    memory = property(lambda self: self.facts.memory)
    flops_per_step = property(lambda self: self.facts.flops_per_step)
    tflops = property(lambda self: self.facts.tflops)
    mfu = property(lambda self: self.facts.mfu, doc="model FLOP/s over the datasheet's 16-bit peak (PaLM's MFU)")
    measured_peak_fraction = property(lambda self: self.facts.measured_peak_fraction,
                                      doc="model FLOP/s over the 16-bit peak notebook 00 measured")
    peak_tflops = property(lambda self: self.facts.peak_tflops)
    peak_source = property(lambda self: self.facts.peak_source)
    FROM_FACTS = ("on_gpu", "step_ms", "profiled_step_ms", "busy_ms", "idle_ms", "idle_by_cause", "busy_by_class",
                  "memory", "flops_per_step", "tflops", "mfu", "measured_peak_fraction", "peak_tflops", "peak_source")

    @classmethod
    def from_facts(cls, facts: Facts, *, device: str = "cuda", step_spread_ms: float = 0.0,
                   nvml_util_pct: float | None = None, trace_path=None, label: str = "",
                   notes=()) -> Diagnosis:
        """A Diagnosis of given Facts: the rules run on them. `diagnose` ends here; tests and the
        notebook can start here from hand-built events (`analyze`)."""
        verdicts, skipped = run_rules(facts)
        return cls(device=device, facts=facts, step_spread_ms=step_spread_ms, nvml_util_pct=nvml_util_pct,
                   verdicts=verdicts, skipped=skipped,
                   trace_path=str(trace_path) if trace_path is not None else None, label=label, notes=list(notes))

    @property
    def top(self) -> Verdict | None:
        return self.verdicts[0] if self.verdicts else None

    def report(self) -> str:
        from gpulab.diagnose.report import report_text
        return report_text(self)

    def plot(self):
        """A matplotlib Figure: the profiled steps' timeline (see `report.timeline_figure`)."""
        from gpulab.diagnose.report import timeline_figure
        return timeline_figure(self)

    def to_dict(self) -> dict:
        """Everything as plain JSON values (infinite or NaN numbers become None)."""
        out = {name: getattr(self, name) for name in [f.name for f in fields(self)] + list(self.FROM_FACTS)}
        out["memory"] = None if self.memory is None else {
            **vars(self.memory), "peak_reserved_frac": self.memory.peak_reserved_frac}
        out["verdicts"] = [v.to_dict() for v in self.verdicts]
        out["facts"] = None if self.facts is None else self.facts.to_dict()
        return json.loads(json.dumps(_plain(out)))


def _plain(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


# -- measuring -------------------------------------------------------------------------------------
def _check_args(step, warmup, steps, flops_per_step, peak_tflops) -> None:
    if not callable(step):
        raise TypeError(f"diagnose(step): step must be a callable with no arguments that runs one "
                        f"training step, got {type(step).__name__}")
    for name, value, low in (("warmup", warmup, 0), ("steps", steps, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    for name, value in (("flops_per_step", flops_per_step), ("peak_tflops", peak_tflops)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value <= 0):
            raise ValueError(f"{name} must be a positive number or None, got {value!r}")


def _run(step: Callable, phase: str) -> None:
    try:
        step()
    except Exception as err:
        raise DiagnoseError(f"step() raised {type(err).__name__} during the {phase}: {err}. "
                            "diagnose() needs a step that runs on its own; fix it and call again.") from err


# The unprofiled step is timed as a training loop runs: steps back to back, the host clock read after
# a synchronize at the end of each chunk of `steps` steps (a sync after every step would drain the GPU's
# queue each time and charge the refill to every step): `benchmark(..., clock="host", calls=steps)`,
# for about WINDOW_S seconds or MAX_CHUNKS chunks, whichever ends sooner (CHUNKS at least), so that a step that stalls
# every few dozen steps (a log line, a checkpoint, the garbage collector) falls inside the window.
CHUNKS = 3
WINDOW_S = 2.0
MAX_CHUNKS = 40
# A step of the window longer than this many times the median one is a slow step (`StallFacts`). A
# judgement: steps back to back on the host clock vary by tens of percent (a collection, a page fault),
# not by a factor of three.
STALL_FACTOR = 3.0
# A slow step that comes back every N steps is profiled once if N is at most this (steps run to reach it).
STALL_PERIOD_MAX = 60


# Warm-up until the step's time stops falling: chunks of SETTLE_CHUNK steps on the host clock (benchmark, synchronized
# around each chunk) until SETTLE_QUIET chunks in a row ran no faster than (1 - SETTLE_FALL) of the fastest chunk
# before them, at most SETTLE_MAX_S. On the H100 (2026-12-07, results/zoo/2026-12-07-h100-issue41-b/) three zoo steps
# whose shapes change from step to step ran 70, 87 and 229 ms a step in the diagnosis's window after 3 warm-up steps,
# where the same steps ran 11.5, 10.3 and 4.9 ms once many shapes had been seen (CUDA's lazily loaded kernels, a
# compile per shape): the diagnosis judged a one-time cost as the step's. Written after those readings.
SETTLE_CHUNK = 5
SETTLE_FALL = 0.10
SETTLE_QUIET = 2
SETTLE_MAX_S = 20.0


def settle(step: Callable, device: torch.device, limit_s: float = SETTLE_MAX_S) -> dict:
    """Run `step` in chunks of SETTLE_CHUNK until its time per step stops falling (SETTLE_QUIET chunks in a row no
    faster than 1 - SETTLE_FALL of the fastest before them), at most `limit_s`: {"chunks_ms": each chunk's ms per
    step, "steps": run, "settled": whether it stopped falling}."""
    t0, chunks, quiet = time.perf_counter(), [], 0
    while True:
        ms = benchmark(lambda: _run(step, "warm-up steps"), warmup=0, repeat=1, calls=SETTLE_CHUNK, clock="host",
                       device=device).median_ms
        quiet = quiet + 1 if chunks and ms >= min(chunks) * (1 - SETTLE_FALL) else 0
        chunks.append(ms)
        if quiet >= SETTLE_QUIET or time.perf_counter() - t0 > limit_s:
            return {"chunks_ms": chunks, "steps": SETTLE_CHUNK * len(chunks), "settled": quiet >= SETTLE_QUIET}


def settle_note(s: dict) -> str | None:
    """What the report says of the warm-up where the step's time fell by more than SETTLE_FALL, or did not stop."""
    first, last = s["chunks_ms"][0], s["chunks_ms"][-1]
    if s["settled"] and last >= first * (1 - SETTLE_FALL):
        return None
    how = ("and was still falling when the warm-up stopped: what follows may still hold one-time costs"
           if not s["settled"] else "; what follows is the settled step")
    return (f"warm-up: the step ran {first:.3g} ms per step in its first {SETTLE_CHUNK} steps and {last:.3g} ms after "
            f"{s['steps']} {how} (the first steps' extra time is paid once: kernels loaded, graphs compiled per shape, "
            "the allocator's pool grown)").replace(" ; ", "; ")


# NVML's utilization is averaged over its own sample period (1/6 s to 1 s, by product); over less than a
# few periods it mostly reads what came before and after (lesson 03 measures the lag).
NVML_MIN_S = 2.0


def _nvml_monitor(device: torch.device):
    if device.type != "cuda":
        return None
    try:
        from gpulab.core.monitor import GpuMonitor
        return GpuMonitor(interval_s=0.05, pcie=False, device=device).start()
    except Exception:      # noqa: BLE001 - NVML is optional
        return None


def _memory_stats(device: torch.device) -> dict | None:
    return torch.cuda.memory_stats(device) if device.type == "cuda" else None


def memory_cap(device: torch.device) -> tuple[int, str]:
    """(bytes, where from) of the GPU memory this process may use: the GPU's, or less under a per-process
    cap (`torch.cuda.set_per_process_memory_fraction`, which a GPULAB_PROFILE sets too)."""
    free_total = free_memory(device)
    total = int(free_total[1]) if free_total else 0
    source = "the GPU's memory"
    fraction = None
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if getter is not None:
        try:
            fraction = float(getter(device))
        except Exception:      # noqa: BLE001 - an older build without it
            fraction = None
    if fraction is not None and 0 < fraction < 1:
        capped = int(torch.cuda.get_device_properties(device).total_memory * fraction)
        if capped < total or not total:
            total, source = capped, f"this process's cap (set_per_process_memory_fraction({fraction:.3g}))"
    return total, source


def _memory_facts(before: dict | None, after: dict | None, device: torch.device, steps: int = 1) -> MemoryFacts | None:
    if before is None or after is None:
        return None
    total, source = memory_cap(device)
    return MemoryFacts(
        alloc_retries=int(after.get("num_alloc_retries", 0) - before.get("num_alloc_retries", 0)),
        inactive_split_bytes=int(after.get("inactive_split_bytes.all.current", 0)),
        peak_reserved_bytes=int(after.get("reserved_bytes.all.peak", 0)), total_bytes=int(total),
        peak_allocated_bytes=int(after.get("allocated_bytes.all.peak", 0)), cap_source=source, steps=steps)


@dataclass
class Profiled:
    """One profiled stretch: its records (plain values, see events.Record), and the allocator around it."""

    records: list
    trace_start_ns: int
    memory: MemoryFacts | None
    events: list = field(default_factory=list, repr=False)


def _profile(step: Callable, steps: int, device: torch.device, trace_path: str | None, record: bool = True,
             cuda: bool = True, retry: bool = True) -> Profiled | None:
    """`_profile_once`, again once where reading the profile raised UnicodeDecodeError: the profiler's Python tracer
    can keep a pointer to a frame's name that is freed before the results are read (pytorch/pytorch#64345, #121219;
    here 1 of 7 runs of tests/diagnose/test_core_settle.py's new-shapes test on the CPU, torch 2.13, 2026-12-07)."""
    try:
        return _profile_once(step, steps, device, trace_path, record, cuda)
    except UnicodeDecodeError:
        if not retry:       # several processes: the others run no second profile, and its collectives would hang
            raise
        return _profile_once(step, steps, device, trace_path, record, cuda)


def _profile_once(step: Callable, steps: int, device: torch.device, trace_path: str | None, record: bool = True,
                  cuda: bool = True) -> Profiled | None:
    """`steps` profiled steps (CPU and, on a GPU, CUDA activity, shapes, FLOPs and Python stacks), and the
    caching allocator's statistics around them. With `record` False the same steps run without the
    profiler, and None comes back."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from gpulab.core.timing import PROFILE_KW, release_cupti
    from gpulab.diagnose.events import parse, records_from_profiler

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" and cuda else [])
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
    before = _memory_stats(device)
    context = (profile(activities=activities, record_shapes=True, with_flops=True, with_stack=True, **PROFILE_KW)
               if record else nullcontext())
    with context as prof:
        _run(step, "profiled steps")     # unmarked: the marked steps then start with work queued, as in training
        for _ in range(steps):
            with record_function(STEP_RANGE):
                _run(step, "profiled steps")
        sync(device)
    if not record:
        return None
    after = _memory_stats(device)
    records, start = records_from_profiler(prof)   # before the export: kineto's save may consume its trace
    if trace_path is not None:
        prof.export_chrome_trace(str(trace_path))
    if ProfilerActivity.CUDA in activities:
        release_cupti()
    return Profiled(records, start, _memory_facts(before, after, device, steps), parse(records, start or None))


def kernel_busy(step: Callable, steps: int, device: torch.device) -> tuple[float, float] | None:
    """(GPU busy ms, step ms) per step of `steps` steps run back to back under a profiler that records the
    GPU's activity only (no Python stacks, shapes or operator ranges: a few microseconds per launch), on
    the host clock between two synchronizations, as the unprofiled window times them. None on the CPU.

    The full profile's busy time is not the unprofiled step's: stretched by the profiler's host work, the
    GPU idles most of the profiled step, and its kernels ran faster there than back to back. On the H200
    (zoo run D, 2026-12-01) vit_tuned's kernels took 19.8 ms per step back to back and 13.8 ms in the
    full profile, gpt_tuned's 24.5 and 20.6, so "step minus profiled busy" read 5.8 and 4.6 ms of idle that
    CUDA graphs did not remove (their labels: 1.01x, 0.97x). One likely reason, not measured for these
    steps: a GPU at its power limit lowers its clock under sustained load (notebook 00's sustained product
    ran at 1,543 MHz and 600 W on this H200: results/course/2026-11-30-h200-mamf-and-notebooks/). This profile's busy share is the
    one the launch and idle rules read (`Facts.base_idle_ms`)."""
    from gpulab.core.timing import pace

    p = pace(lambda: _run(step, "kernel-only profiled steps"), steps, device)
    return None if p is None else (p.busy_ms, p.step_ms)


# A synchronizing call PyTorch warned of only when the debug mode was switched back after the step
SYNC_MODE_MISSING = "set_sync_debug_mode unavailable"
LATE_SYNC = "reported after the step, without its line (PyTorch's backward thread)"


def scan_step(step: Callable, device: torch.device, flops: bool = True,
              phase: str = "warm-up steps") -> tuple[float | None, list[tuple[str, str]]]:
    """One step run under `torch.utils.flop_counter.FlopCounterMode` (with `flops`) and
    `torch.cuda.set_sync_debug_mode("warn")`: (its FLOPs, or None if nothing was counted; every call PyTorch
    warned of as synchronizing the host with the GPU, as (the user's line, the innermost line of any file),
    in order). PyTorch's own docs: not every synchronizing operation warns (not `torch.cuda.synchronize()`,
    events, distributed or sparse ops); the profile's runtime calls show those.

    FlopCounterMode counts matrix products, convolutions and attention. PyTorch warns of a synchronizing
    call as it returns to Python, so the Python stack at the warning is the caller's: hidden syncs show
    too (GradScaler's `.item()`, a boolean mask, `torch.nonzero`). No syncs are looked for on the CPU.
    `diagnose` runs this as its last warm-up step, which it runs anyway: no extra training step.
    torch.compile'd code runs eagerly in this step (`gpulab.models.sizing.uncompiled`): under a dispatch mode
    Dynamo would give the compiled frame up for good; the syncs found are the eager path's."""
    import traceback
    import warnings
    from contextlib import ExitStack

    from torch.utils.flop_counter import FlopCounterMode

    from gpulab.diagnose.events import fmt_site, is_user_file
    from gpulab.models.sizing import uncompiled

    found: list = []

    def record(message, category, filename, lineno, file=None, line=None):
        if "called a synchronizing CUDA operation" not in str(message):
            return
        frames = [f for f in traceback.extract_stack()[:-1] if not f.filename.endswith("warnings.py")]
        if frames and frames[-1].name == "set_sync_debug_mode":
            # raised as the mode is switched back after the step: PyTorch reported it late (a sync in the
            # autograd engine's thread, e.g. a backward kernel that reads a count back), without its line
            found.append(("", LATE_SYNC))
            return
        user = next((f for f in reversed(frames) if is_user_file(f.filename)), None)
        inner = frames[-1] if frames else None
        as_site = lambda f: fmt_site((f.filename, f.lineno, f.name)) if f is not None else ""   # noqa: E731
        found.append((as_site(user), as_site(inner)))

    counter = FlopCounterMode(display=False) if flops else None
    with ExitStack() as stack:
        stack.enter_context(uncompiled())     # a compiled model met under a dispatch mode would stay eager
        if counter is not None:
            stack.enter_context(counter)
        if device.type == "cuda":
            try:
                previous = torch.cuda.get_sync_debug_mode()
                stack.enter_context(warnings.catch_warnings())
                warnings.simplefilter("always")
                shown = warnings.showwarning
                warnings.showwarning = record
                torch.cuda.set_sync_debug_mode("warn")
                stack.callback(lambda: (torch.cuda.set_sync_debug_mode(previous), setattr(warnings, "showwarning", shown)))
            except Exception:       # noqa: BLE001 - no sync debug mode in this build: the step runs without it
                found.append(("", SYNC_MODE_MISSING))
        _run(step, phase)
    total = counter.get_total_flops() if counter is not None else 0
    return (float(total) if total else None), found


def count_flops(step: Callable, phase: str = "FLOP-counting step") -> float | None:
    """FLOPs of one step as FlopCounterMode counts them (`scan_step`); None if it counted nothing."""
    return scan_step(step, torch.device("cpu"), True, phase)[0]


def compile_counters() -> dict:
    """torch.compile's counters (torch._dynamo.utils.counters), or {} where dynamo is not loaded: graphs
    compiled, CUDA graphs inductor skipped, graph breaks by reason."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    if dynamo is None:
        return {}
    try:
        c = dynamo.counters
        return {"graphs": int(c["stats"].get("unique_graphs", 0)),
                "cudagraph_skips": int(c["inductor"].get("cudagraph_skips", 0)),
                "graph_breaks": {str(k): int(v) for k, v in c["graph_break"].items()}}
    except Exception:          # noqa: BLE001 - counters are torch internals; without them no compile facts
        return {}


def _timed(step: Callable, steps: int, device: torch.device, window_s: float):
    """The unprofiled window: (Timing per step, every chunk's host ms per step in order, each chunk's ms per
    step). benchmark's first chunk is its probe: its steps are in the list, its time is not a sample."""
    chunks_steps: list = []

    def chunk():
        stamps = [time.perf_counter()]
        for _ in range(steps):
            _run(step, "timed steps")
            stamps.append(time.perf_counter())
        chunks_steps.append([(b - a) * 1e3 for a, b in zip(stamps, stamps[1:])])

    timing = benchmark(chunk, warmup=0, repeat=None, budget_s=window_s, max_repeat=MAX_CHUNKS, calls=1,
                       clock="host", device=device)
    chunks = [ms / steps for ms in timing.samples_ms]
    return (summarize(chunks, timing.device, f"{timing.method}, chunks of {steps} steps back to back"),
            chunks_steps, chunks)


def nvml_covered_s(chunks_steps: list) -> float:
    """Seconds of NVML readings the mean kept: the monitor ran through every chunk of steps, benchmark's probe chunk
    included, less its first period (which averaged the time before the steps began). Leaving the probe out read
    1.8 s of a 2.8 s window on an H100 (2026-12-06): benchmark's repeats are its budget over the probe, rounded down."""
    return sum(sum(c) for c in chunks_steps) / 1e3 - NVML_PERIOD_MAX_S


def stall_facts(chunks_steps: list, chunks: list) -> StallFacts | None:
    """The window's slow steps (STALL_FACTOR x the median host step) and their period if they repeat
    evenly. What they cost: the mean step (every chunk, the GPU's work included) over the typical one (the
    median of the chunks without a slow step; where every chunk has one, the host steps' own excess)."""
    per_step = [ms for c in chunks_steps for ms in c]
    if len(per_step) < 3 or not chunks:
        return None
    median = statistics.median(per_step)
    slow = tuple(i for i, ms in enumerate(per_step) if ms > STALL_FACTOR * median)
    gaps = {b - a for a, b in zip(slow, slow[1:])}
    period = gaps.pop() if len(gaps) == 1 and len(slow) >= 3 else None     # the same gap twice at least
    timed = chunks_steps[-len(chunks):]                   # the probe chunk is not a sample
    clean = [ms for ms, c in zip(chunks, timed) if max(c) <= STALL_FACTOR * median]
    mean = statistics.fmean(chunks)
    if clean:
        typical = statistics.median(clean)
    else:                                                 # every chunk has a slow step: their excess, per step
        steps = [ms for c in timed for ms in c]
        typical = mean - sum(ms - median for ms in steps if ms > STALL_FACTOR * median) / len(steps)
    return StallFacts(step_ms=tuple(per_step), slow=slow, median_ms=typical, mean_ms=mean, period=period,
                      every_chunk=bool(slow) and not clean)


def fp32_modes() -> tuple[bool, bool]:
    """(TF32 for fp32 matmuls, TF32 for cuDNN convolutions) as PyTorch is set now."""
    from gpulab.models.precision import conv_fp32_mode, matmul_fp32_mode

    try:
        matmul = matmul_fp32_mode() == "tf32"
    except RuntimeError:    # the legacy and new switches were mixed: read the new one
        matmul = getattr(torch.backends.cuda.matmul, "fp32_precision", "ieee") == "tf32"
    return matmul, conv_fp32_mode() == "tf32"


def datasheet_16bit(device: torch.device) -> float | None:
    """This GPU's datasheet dense 16-bit Tensor Core peak (TFLOP/s), None where unknown or under a
    profile (whose datasheet is another card's): the rules' ceiling for any matrix product's speed."""
    if device.type != "cuda":
        return None

    facts = device_facts(device)
    sheet = None if facts.profile else facts.datasheet
    if sheet is None:
        return None
    return (sheet.bf16 if torch.cuda.is_bf16_supported(including_emulation=False) else None) or sheet.fp16


def peak_16bit(device: torch.device) -> tuple[float | None, str]:
    """(TFLOP/s, where it comes from) of this device's 16-bit matmul ceiling from notebook 00:
    bf16 where the GPU runs it natively, else fp16."""
    from gpulab.core.ceilings import ceilings

    if device.type != "cuda":     # notebook 00's CPU figures are tiny-size illustrations, not a peak
        return None, "no measured peak on the CPU: notebook 00 measures a GPU's peak; its CPU run is a tiny illustration"
    bf16 = torch.cuda.is_bf16_supported(including_emulation=False)
    name = "matmul_bf16" if bf16 else "matmul_fp16"
    try:
        found = ceilings().get(name)
    except Exception as err:     # noqa: BLE001 - a broken results store must not stop the diagnosis
        return None, f"no peak: the results store could not be read ({err})"
    if found is None or not found.source.startswith("measured"):
        sheet = f" (the datasheet's {found.value:g} TFLOP/s is not a measurement)" if found is not None else ""
        return None, f"no measured peak: run notebook 00 on this machine{sheet}"
    return found.value, f"notebook 00 {name}, {found.source}"


def _distributed() -> bool:
    """Whether this process is one of several in a process group: then every process must run the same
    steps, so the window is a fixed CHUNKS chunks and no extra step is run for a slow one."""
    import torch.distributed as dist
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def diagnose(step: Callable[[], object], *, warmup: int = 3, steps: int = 5, device: torch.device | None = None,
             flops_per_step: float | None = None, peak_tflops: float | None = None,
             trace_path: str | None = None, label: str = "", profile: bool = True, window_s: float = WINDOW_S,
             confirm: bool = True, record_to: str | None = None, settle_s: float = SETTLE_MAX_S) -> Diagnosis | None:
    """Diagnose one training step (a callable with no arguments: fetch a batch, forward, backward,
    optimizer step, zero_grad). See the module docstring for what runs; `Diagnosis.report()` says
    what was found.

    `settle_s`: after the warm-up steps, more run in chunks until the step's time stops falling, for at most this
    long (`settle`; 0: none; on a GPU only), so that the diagnosis is of the settled step, not of its one-time costs.
    `window_s`: the unprofiled steps run for at least this long (a step that stalls every N steps must
    fall inside). `confirm`: run, for each verdict that has one, a safe variant of the step (TF32 or
    autocast, pinned staging, the same batch replayed) and rank verdicts by the measured gain
    (`gpulab.diagnose.confirm`). `record_to`: also write what was recorded (the profile's records,
    timings, allocator) to this gzipped JSON file, which `from_record` reads back without a GPU.

    `profile=False` runs every step a diagnosis runs, in the same order, without the profiler, and
    returns None: for the other processes of a multi-process job (DDP), whose collectives must meet the
    diagnosed one's step for step. Profile one process: the profiler slows the process it records, and a
    collective on a recorded process waits for its recorded peers, so two recorded processes see longer
    collectives than either runs unrecorded."""
    _check_args(step, warmup, steps, flops_per_step, peak_tflops)
    device = torch.device(device) if device is not None else pick_device()
    distributed = _distributed()
    notes = []
    compile_before = compile_counters()
    # the last warm-up step counts the FLOPs and finds the synchronizing calls: no extra training step
    for _ in range(warmup - 1):
        _run(step, "warm-up steps")
    # on a GPU (lazily loaded kernels; the CPU runs the course's tiny checks), not in a DDP job (each process runs
    # the same steps as its peers)
    if warmup > 0 and settle_s > 0 and device.type == "cuda" and not distributed:
        note = settle_note(settle(step, device, settle_s))
        if note:
            notes.append(note)
    if warmup == 0:
        notes.append("no warm-up step: the FLOPs and the synchronizing calls were found in one extra step")
    counted, hidden = scan_step(step, device, flops=flops_per_step is None)
    if any(via == SYNC_MODE_MISSING for _, via in hidden):
        notes.append("torch.cuda.set_sync_debug_mode is not in this PyTorch: hidden synchronizations were not looked for")
        hidden = [(site, via) for site, via in hidden if via != SYNC_MODE_MISSING]
    compile_warm = compile_counters()
    monitor = _nvml_monitor(device)
    reading = monitor is not None and monitor.available
    # with NVML: long enough that, its first period left out, NVML_MIN_S of readings remain
    window = max(window_s, NVML_MIN_S + NVML_PERIOD_MAX_S) if reading else window_s
    try:
        timing, per_step, chunks = _timed(step, steps, device, window if not distributed else 0.0)
    finally:
        if monitor is not None:
            monitor.stop()
    # the first period's readings averaged the time before the steps began (core.monitor.Monitor.mean)
    nvml = monitor.mean("busy_pct", since_s=NVML_PERIOD_MAX_S) if reading else None
    if monitor is not None and nvml is None:
        notes.append(f"no NVML utilization: {monitor.status}")
    timed_s = nvml_covered_s(per_step)
    if nvml is not None and timed_s < NVML_MIN_S:
        nvml = None
        notes.append(f"NVML utilization not read: its readings covered {timed_s:.3g} s, shorter than "
                     f"{NVML_MIN_S:g} s; NVML's figure is the percent of time over its past sample period (1/6 s to 1 s, "
                     "by product) during which one or more kernels ran, so over a shorter time it reads the idle "
                     "before and after")
    light = kernel_busy(step, steps, device) if profile and not distributed else None
    profiled = _profile(step, steps, device, trace_path, record=profile, retry=not distributed)
    stalls = stall_facts(per_step, chunks)
    if stalls is not None and stalls.period and not distributed and profile:
        try:
            stalls = _stall_site(step, stalls, device, max(warmup, 1), steps + (steps if light else 0))
        except DiagnoseError:
            raise
        except Exception as err:     # noqa: BLE001 - the slow step's line is extra
            notes.append(f"the slow step's line was not found ({type(err).__name__}: {err})")
    compile_after = compile_counters()
    from gpulab.diagnose import events as _events
    if _events.TREE_ERROR:
        notes.append(_events.TREE_ERROR)
    if not profile:
        return None
    if flops_per_step is None:
        flops_per_step = counted
        if counted is None:
            notes.append("FlopCounterMode counted no FLOPs in the step: pass flops_per_step for MFU and the "
                         "fraction of measured peak")
    if peak_tflops is not None:
        source = "given by the caller"
    else:
        peak_tflops, source = peak_16bit(device)
    tf32_matmul, tf32_cudnn = fp32_modes()
    compile = {"before": compile_before, "warm": compile_warm, "after": compile_after} if compile_after else {}
    inputs = dict(on_gpu=device.type == "cuda", tf32_matmul=tf32_matmul, tf32_cudnn=tf32_cudnn,
                  tf32_supported=device.type != "cuda" or device_facts(device).tf32,
                  step_ms=timing.median_ms, flops_per_step=flops_per_step, peak_tflops=peak_tflops,
                  peak_source=source, kernel_ceiling_tflops=datasheet_16bit(device), hidden_syncs=tuple(hidden),
                  compile=compile, light_busy_ms=light[0] if light else None,
                  light_step_ms=light[1] if light else None)
    if record_to is not None:
        save_record(record_to, profiled, inputs, stalls, dict(device=str(device), step_spread_ms=timing.spread_ms,
                                                             nvml_util_pct=nvml, label=label, notes=notes))
    facts = analyze(profiled.events, memory=profiled.memory, stalls=stalls, **inputs)
    d = Diagnosis.from_facts(facts, device=str(device), step_spread_ms=timing.spread_ms, nvml_util_pct=nvml,
                             trace_path=trace_path, label=label, notes=notes)
    if confirm and profile and not distributed and facts.new_shapes and facts.new_shapes["timed_first"]:
        d.notes.append(f"no variant was timed: {facts.new_shapes['timed_first']} of {facts.new_shapes['timed']} timed "
                       "steps met a shape the step had not run (the new shapes line), so a variant's timing would weigh "
                       "such first runs against the settled step")
    elif confirm and profile and not distributed:
        from gpulab.diagnose.confirm import confirm_verdicts
        confirm_verdicts(d, step, device, steps=steps)
    return d


def _stall_site(step: Callable, stalls: StallFacts, device: torch.device, warmup: int, steps: int) -> StallFacts:
    """The user's line a periodic slow step spends its extra time on: steps run on to just before the next
    slow one (if it comes within STALL_PERIOD_MAX steps), then a typical step and the slow one are each
    profiled (CPU only, with stacks); the line whose time grew most is the stall's."""
    from dataclasses import replace

    from gpulab.diagnose.analyze import stall_site

    done = warmup + len(stalls.step_ms) + steps + 1          # steps run so far
    slow_global = [warmup + i for i in stalls.slow]           # the timed window follows the warm-up steps
    nxt = slow_global[-1]
    while nxt <= done + 1:
        nxt += stalls.period
    if nxt - done - 2 > STALL_PERIOD_MAX:
        return stalls
    for _ in range(nxt - done - 1):
        _run(step, "steps to the next slow one")
    typical = _profile(step, 0, device, None, cuda=False)     # one unmarked step: the one before the slow one
    slow = _profile(step, 0, device, None, cuda=False)
    site, ms = stall_site(typical.events, slow.events)
    return replace(stalls, site=site, site_ms=ms)


def open_record(path, mode: str = "rt"):
    """A record file: xz-compressed JSON where its name ends in .xz (the committed ones, half gzip's size), else
    gzipped JSON."""
    if str(path).endswith(".xz"):
        import lzma
        return lzma.open(path, mode, encoding="utf-8")
    return gzip.open(path, mode, encoding="utf-8", **({"compresslevel": 6} if "w" in mode else {}))


def save_record(path: str, profiled: Profiled, inputs: dict, stalls, meta: dict) -> None:
    """What a diagnosis recorded, as gzipped JSON (xz where `path` ends in .xz): the profile's records, the
    allocator, the timings."""
    names = [f.name for f in fields(Record)]
    data = {"fields": names, "rows": [[getattr(r, n) for n in names] for r in profiled.records],
            "trace_start_ns": profiled.trace_start_ns,
            "memory": asdict(profiled.memory) if profiled.memory else None, "inputs": inputs,
            "stalls": asdict(stalls) if stalls else None, "meta": meta, "torch": torch.__version__}
    with open_record(path, "wt") as f:
        json.dump(_plain(data), f, separators=(",", ":"))


def from_record(path: str, **overrides) -> Diagnosis:
    """The Diagnosis of a recorded run (`diagnose(..., record_to=path)`), analysed again here: the rules as
    they are now, on what the GPU recorded then. No confirmation is run (that needs the step)."""
    from gpulab.diagnose.events import parse

    with open_record(path) as f:
        data = json.load(f)
    rows = [dict(zip(data["fields"], row)) for row in data["rows"]]
    records = [Record(**{**r, "shapes": tuple(tuple(s) for s in r["shapes"]), "dtypes": tuple(r["dtypes"]),
                         "site": tuple(r.get("site") or ()), "via": tuple(r.get("via") or ()),
                         "code": tuple(r.get("code") or ())}) for r in rows]
    memory = MemoryFacts(**data["memory"]) if data.get("memory") else None
    stalls = data.get("stalls")
    if stalls:
        stalls = StallFacts(**{**stalls, "step_ms": tuple(stalls["step_ms"]), "slow": tuple(stalls["slow"])})
    inputs = dict(data["inputs"])
    inputs["hidden_syncs"] = tuple(tuple(x) for x in inputs.get("hidden_syncs", ()))
    inputs.update(overrides)
    meta = data["meta"]
    facts = analyze(parse(records, data["trace_start_ns"] or None), memory=memory, stalls=stalls, **inputs)
    return Diagnosis.from_facts(facts, device=meta["device"], step_spread_ms=meta["step_spread_ms"],
                                nvml_util_pct=meta["nvml_util_pct"], label=meta["label"], notes=meta["notes"])
