"""`diagnose(step)`: which of the course's bottlenecks is yours, and what fixing it would buy.

The learner hands over one training step, a callable with no arguments that fetches its batch and
trains on it, the way their loop does. `diagnose` then

1. runs `warmup` steps unmeasured (allocator, cuBLAS and cuDNN settle);
2. times CHUNKS chunks of `steps` back-to-back steps on the host clock, synchronizing before and after
   each chunk (the unperturbed step time; NVML samples the GPU's utilization meanwhile where it can);
3. runs `steps` more under `torch.profiler` (each inside `record_function("gpulab.step")`) with the
   caching allocator's statistics read before and after;
4. counts one step's FLOPs with `FlopCounterMode` (unless `flops_per_step` is given);
5. turns the profile into `Facts` (analyze.py) and runs the rules (rules.py).
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field, fields

import torch

from gpulab.core.device import pick_device, sync
from gpulab.core.memory import fmt_bytes, free_memory
from gpulab.core.timing import benchmark
from gpulab.diagnose.analyze import CAUSES, CLASSES, Facts, MemoryFacts, analyze
from gpulab.diagnose.events import STEP_RANGE, from_profiler
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
    mfu = property(lambda self: self.facts.mfu)
    peak_tflops = property(lambda self: self.facts.peak_tflops)
    peak_source = property(lambda self: self.facts.peak_source)
    FROM_FACTS = ("on_gpu", "step_ms", "profiled_step_ms", "busy_ms", "idle_ms", "idle_by_cause", "busy_by_class",
                  "memory", "flops_per_step", "tflops", "mfu", "peak_tflops", "peak_source")

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
        return report_text(self)

    def plot(self):
        """A matplotlib Figure: the profiled steps' timeline (see `timeline_figure`)."""
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
# queue each time and charge the refill to every step): `benchmark(..., clock="host", calls=steps)`.
# CHUNKS chunks give a median and a spread.
CHUNKS = 3


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


def _memory_facts(before: dict | None, after: dict | None, device: torch.device) -> MemoryFacts | None:
    if before is None or after is None:
        return None
    _, total = free_memory(device)       # the GPU's memory (a GPULAB_PROFILE's cap where one is set)
    return MemoryFacts(
        alloc_retries=int(after.get("num_alloc_retries", 0) - before.get("num_alloc_retries", 0)),
        inactive_split_bytes=int(after.get("inactive_split_bytes.all.current", 0)),
        peak_reserved_bytes=int(after.get("reserved_bytes.all.peak", 0)), total_bytes=int(total))


def _profile(step: Callable, steps: int, device: torch.device, trace_path: str | None, record: bool = True):
    """The events of `steps` profiled steps, and the allocator's statistics around them. With `record`
    False the same steps run without the profiler, and (None, None) comes back."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
    before = _memory_stats(device)
    with profile(activities=activities, record_shapes=True, with_flops=True) if record else nullcontext() as prof:
        _run(step, "profiled steps")     # unmarked: the marked steps then start with work queued, as in training
        for _ in range(steps):
            with record_function(STEP_RANGE):
                _run(step, "profiled steps")
        sync(device)
    if not record:
        return None, None
    after = _memory_stats(device)
    events = from_profiler(prof)         # before the export: kineto's save may consume its trace
    if trace_path is not None:
        prof.export_chrome_trace(str(trace_path))
    return events, _memory_facts(before, after, device)


def count_flops(step: Callable) -> float | None:
    """FLOPs of one step as `torch.utils.flop_counter.FlopCounterMode` counts them (matrix products,
    convolutions, attention); None if it counted nothing."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        _run(step, "FLOP-counting step")
    total = counter.get_total_flops()
    return float(total) if total else None


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
    from gpulab.core.device import device_facts

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
        return None, "no MFU on the CPU: notebook 00 measures a GPU's peak; its CPU run is a tiny illustration"
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


def diagnose(step: Callable[[], object], *, warmup: int = 3, steps: int = 5, device: torch.device | None = None,
             flops_per_step: float | None = None, peak_tflops: float | None = None,
             trace_path: str | None = None, label: str = "", profile: bool = True) -> Diagnosis | None:
    """Diagnose one training step (a callable with no arguments: fetch a batch, forward, backward,
    optimizer step, zero_grad). See the module docstring for what runs; `Diagnosis.report()` says
    what was found.

    `profile=False` runs every step a diagnosis runs, in the same order, without the profiler, and
    returns None: for the other processes of a multi-process job (DDP), whose collectives must meet the
    diagnosed one's step for step. Profile one process: the profiler slows the process it records, and a
    collective on a recorded process waits for its recorded peers, so two recorded processes see longer
    collectives than either runs unrecorded."""
    _check_args(step, warmup, steps, flops_per_step, peak_tflops)
    device = torch.device(device) if device is not None else pick_device()
    notes = []
    for _ in range(warmup):
        _run(step, "warm-up steps")
    monitor = _nvml_monitor(device)
    try:
        timing = benchmark(lambda: _run(step, "timed steps"), warmup=0, repeat=CHUNKS, calls=steps, clock="host",
                           device=device)
    finally:
        if monitor is not None:
            monitor.stop()
    nvml = monitor.mean("busy_pct") if monitor is not None and monitor.available else None
    if monitor is not None and nvml is None:
        notes.append(f"no NVML utilization: {monitor.status}")
    timed_s = timing.median_ms * steps * CHUNKS / 1e3
    if nvml is not None and timed_s < NVML_MIN_S:
        nvml = None
        notes.append(f"NVML utilization not read: the timed steps lasted {timed_s:.2g} s, shorter than "
                     f"{NVML_MIN_S:g} s; NVML's figure is the percent of time over its past sample period (1/6 s to 1 s, "
                     "by product) during which one or more kernels ran, so over a shorter time it reads the idle "
                     "before and after")
    events, memory = _profile(step, steps, device, trace_path, record=profile)
    if flops_per_step is None:
        flops_per_step = count_flops(step)
    if not profile:
        return None
        if flops_per_step is None:
            notes.append("FlopCounterMode counted no FLOPs in the step: pass flops_per_step for an MFU")
    if peak_tflops is not None:
        source = "given by the caller"
    else:
        peak_tflops, source = peak_16bit(device)
    tf32_matmul, tf32_cudnn = fp32_modes()
    facts = analyze(events, on_gpu=device.type == "cuda", tf32_matmul=tf32_matmul, tf32_cudnn=tf32_cudnn,
                    memory=memory, step_ms=timing.median_ms, flops_per_step=flops_per_step,
                    peak_tflops=peak_tflops, peak_source=source, kernel_ceiling_tflops=datasheet_16bit(device))
    return Diagnosis.from_facts(facts, device=str(device), step_spread_ms=timing.spread_ms, nvml_util_pct=nvml,
                                trace_path=trace_path, label=label, notes=notes)


# -- the report ------------------------------------------------------------------------------------
def report_text(d: Diagnosis) -> str:
    """The plain-text summary: split, classes, memory, MFU, ranked verdicts, skipped rules."""
    lines = [f"gpulab.diagnose{': ' + d.label if d.label else ''} on {d.device}",
             (f"step {d.step_ms:.3g} ms (unprofiled: steps back to back, spread {d.step_spread_ms:.2g} ms over "
              f"{CHUNKS} chunks); profiled step {d.profiled_step_ms:.3g} ms (the profiler adds host overhead)")]
    share = (lambda ms: 100 * ms / d.profiled_step_ms) if d.profiled_step_ms else (lambda ms: 0.0)
    if d.on_gpu:
        lines.append(f"GPU busy {d.busy_ms:.3g} ms ({share(d.busy_ms):.0f} %, all streams merged), idle "
                     f"{d.idle_ms:.3g} ms ({share(d.idle_ms):.0f} %), charged to what the host was doing:")
    else:
        lines.append(f"on the CPU the device is the host: busy inside aten ops {d.busy_ms:.3g} ms "
                     f"({share(d.busy_ms):.0f} %), outside them {d.idle_ms:.3g} ms ({share(d.idle_ms):.0f} %: "
                     "Python, the dispatcher, data loading):")
    lines += [f"  idle, {c:<14} {d.idle_by_cause[c]:8.3g} ms ({share(d.idle_by_cause[c]):4.1f} %)"
              for c in CAUSES if d.idle_by_cause.get(c)]
    if d.on_gpu:
        lines.append("busy by kernel class (streams merged per class; classes may overlap):")
        lines += [f"  {c:<20} {d.busy_by_class[c]:8.3g} ms" for c in CLASSES if d.busy_by_class.get(c)]
    if d.nvml_util_pct is not None:
        lines.append(f"NVML utilization {d.nvml_util_pct:.0f} % over the timed steps: the percent of time over "
                     "NVML's past sample period (1/6 s to 1 s, by product) during which one or more kernels ran - "
                     "coarser than the profiler's busy share, usually higher, and its period may reach beyond the steps")
    if d.memory is not None:
        m = d.memory
        lines.append(f"memory: {m.alloc_retries} allocation retries, inactive split {fmt_bytes(m.inactive_split_bytes)}, "
                     f"peak reserved {fmt_bytes(m.peak_reserved_bytes)} of {fmt_bytes(m.total_bytes)}")
    if d.mfu is not None:
        lines.append(f"model {d.tflops:.3g} TFLOP/s, MFU {100 * d.mfu:.1f} % of {d.peak_tflops:.3g} TFLOP/s "
                     f"({d.peak_source})")
    else:
        lines.append("MFU unknown: " + (d.peak_source if not d.peak_tflops else "no FLOP count for the step"))
    f = d.facts
    if f is not None and f.idle_ms > 0:
        lines.append(f"the verdicts' shares are of the unprofiled step ({f.base_ms:.3g} ms): its idle, "
                     f"{max(f.base_ms - f.busy_ms, 0):.3g} ms (step minus busy), shared among the causes above "
                     f"as under the profiler (x{f.idle_scale:.2f} their profiled ms)")
    lines.append("verdicts, largest possible gain first:" if d.verdicts else "verdicts: no rule fired")
    for i, v in enumerate(d.verdicts, 1):
        lines += [(f"{i}. {v.bottleneck} [lesson {v.lesson}]: at most {v.bound:.3g}x "
                  f"(removes up to {100 * v.share:.1f} % of the step)"),
                  f"   evidence: {v.evidence}", f"   fix: {v.fix}"]
    if d.skipped:
        lines.append("not checked:")
        lines += [f"  {name}: {why}" for name, why in d.skipped.items()]
    lines += [f"note: {n}" for n in d.notes]
    if d.trace_path:
        lines.append(f"trace: {d.trace_path} (open in https://ui.perfetto.dev or chrome://tracing)")
    return "\n".join(lines)


# -- the plot --------------------------------------------------------------------------------------
CAUSE_COLORS = dict(zip(CAUSES, ("#e07b24", "#c23b3b", "#7d5ba6", "#8c6d31", "#d45fa5", "#bbbbbb")))


def timeline_figure(d: Diagnosis):
    """The profiled steps on one time axis: GPU work per stream (or, on the CPU, the host threads'
    aten ops), the idle stretches coloured by their cause, and each step's window as a marker."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from gpulab.core.plots import COLORS, STYLE, figure, styled

    iv = d.facts.intervals if d.facts is not None else {}
    windows = iv.get("windows", [])
    t0 = windows[0][0] if windows else 0.0
    work: dict = {}
    for stream, a, b in iv.get("work", []):
        work.setdefault(stream, []).append(((a - t0) / 1e3, (b - a) / 1e3))
    rows = [(f"{'stream' if d.on_gpu else 'thread'} {s}", spans) for s, spans in sorted(work.items())]
    fig, (ax,) = figure(figsize=(7.5, 1.6 + 0.4 * (len(rows) + 2)))
    with plt.rc_context(STYLE):
        for y, (_, spans) in enumerate(rows):
            ax.broken_barh(spans, (y - 0.35, 0.7), color=COLORS[0], linewidth=0)
        y_idle = len(rows)
        for a, b, cause in iv.get("idle", []):
            ax.broken_barh([((a - t0) / 1e3, (b - a) / 1e3)], (y_idle - 0.35, 0.7),
                           color=CAUSE_COLORS.get(cause, "#bbbbbb"), linewidth=0)
        y_steps = y_idle + 1
        for i, (a, b) in enumerate(windows):
            ax.broken_barh([((a - t0) / 1e3, (b - a) / 1e3)], (y_steps - 0.2, 0.4),
                           color="#888888" if i % 2 == 0 else "#bbbbbb", linewidth=0)
            ax.axvline((a - t0) / 1e3, color="#555555", lw=0.6, ls=":")
        labels = [r for r, _ in rows] + ["idle (cause)", "steps"]
        ax.set_yticks(range(len(labels)), labels)
        ax.set_ylim(-0.6, len(labels) - 0.4)
        ax.invert_yaxis()
        ax.set_xlabel("ms from the first profiled step")
        title = f"{d.label + ': ' if d.label else ''}busy {d.busy_ms:.3g} ms, idle {d.idle_ms:.3g} ms per step"
        ax.set_title(title + (f"\ntop verdict: {d.top.bottleneck} (lesson {d.top.lesson})" if d.top else ""),
                     fontsize=10)
        ax.grid(axis="y", visible=False)
        handles = [Patch(color=COLORS[0], label="GPU work" if d.on_gpu else "aten ops")]
        handles += [Patch(color=CAUSE_COLORS[c], label=f"idle: {c}") for c in CAUSES if d.idle_by_cause.get(c)]
        ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return styled(fig)
