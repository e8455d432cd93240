"""A diagnosis as the learner reads it: `report_text` (the busy/idle split, the host's time by cause, kernel
classes, memory, MFU and the fraction of measured peak, and the ranked verdicts) and `timeline_figure` (the
profiled steps' timeline). `Diagnosis.report()` and `Diagnosis.plot()` call them."""
from __future__ import annotations

from typing import TYPE_CHECKING

from gpulab.core.memory import fmt_bytes
from gpulab.diagnose.core import STALL_FACTOR
from gpulab.diagnose.facts import CAUSES, CLASSES
from gpulab.diagnose.gaps import NEW_SHAPE_FACTOR

if TYPE_CHECKING:
    from gpulab.diagnose.core import Diagnosis
# -- the report ------------------------------------------------------------------------------------
def report_text(d: "Diagnosis") -> str:
    """The plain-text summary: the step, where the host's time went (with your lines), the GPU's busy time
    by kernel class, memory, MFU, the ranked verdicts (expected, at most, measured), skipped rules."""
    f = d.facts
    lines = [f"gpulab.diagnose{': ' + d.label if d.label else ''} on {d.device}",
             (f"step {d.step_ms:.3g} ms (unprofiled: steps back to back, spread {d.step_spread_ms:.2g} ms); "
              f"profiled step {d.profiled_step_ms:.3g} ms (the profiler adds host time to every op and Python call)")]
    if f.stalls is not None and f.stalls.slow:
        s = f.stalls
        lines.append(f"slow steps: {len(s.slow)} of {len(s.step_ms)} timed steps took over {STALL_FACTOR:g}x the median"
                     + (f", every {s.period} steps" if s.period else "")
                     + f"; mean step {s.mean_ms:.3g} ms" + (f"; the slow step's extra time: {s.site} ({s.site_ms:.3g} ms)"
                                                           if s.site else ""))
    if f.new_shapes:
        n = f.new_shapes
        compiled = f.compiled_regions > 0
        timed = (f"{n['timed_first']} of {n['timed']} timed ones ({n['first_ms'][0]:.3g} to {n['first_ms'][1]:.3g} ms)"
                 if n["first_ms"] else "")
        cost = "a compile, and more" if compiled else "no compile here"
        if n.get("first_ops"):
            cost += ("; their extra host time went most to " + ", ".join(f"{op.replace('aten::', '')} +{ms:.3g} ms"
                                                                        for op, ms in n["first_ops"]))
        elif not compiled:
            cost += ": other one-time costs, not told apart"
        if n["profiled_first"]:
            lines.append(f"new shapes: {n['profiled_first']} of {n['profiled']} profiled steps" + (f" and {timed}" if timed
                         else "") + f" took at least {NEW_SHAPE_FACTOR:g}x the shortest, mostly with the GPU idle, and ran "
                         f"shapes no other profiled step ran: a shape's first run ({cost}), paid again for each shape not "
                         "run before. What follows reads the other steps, the settled step"
                         + (f" ({n['settled_ms']:.3g} ms)" if n["settled_ms"] else "") + "; the step line's spread is of "
                         "all the timed steps")
        else:
            lines.append(f"new shapes: {timed.replace(' ones', ' steps')} took at least {NEW_SHAPE_FACTOR:g}x the "
                         "fastest while the shapes changed from step to step (no profiled step was slow): most "
                         f"likely a shape's first run ({cost}), paid again for each shape not run before. What follows "
                         f"reads the settled step, the other timed steps' median ({n['settled_ms']:.3g} ms); the step "
                         "line's spread is of all the timed steps")
        lines[-1] += (("; most timed steps met a new shape" if n["profiled_first"] else
                       "; most timed steps were slow: if these are first runs") + ": if your lengths rarely repeat, "
                      "first runs are most of the epoch, and padding or bucketing to a few shapes pays them only a few "
                      "times" if n["timed_first"] * 2 >= n["timed"] else "")
    share = (lambda ms: 100 * ms / d.profiled_step_ms) if d.profiled_step_ms else (lambda ms: 0.0)
    if d.on_gpu:
        lines.append(f"GPU busy {d.busy_ms:.3g} ms ({share(d.busy_ms):.0f} % of the profiled step, all streams merged), "
                     f"idle {d.idle_ms:.3g} ms; without the profiler idle {f.base_idle_ms:.3g} ms of {f.base_ms:.3g}"
                     + (f" (busy {f.light_busy_ms:.3g} of {f.light_step_ms:.3g} ms per step back to back under a profiler "
                        "of the GPU's activity only)" if f.light_busy_ms is not None and f.light_step_ms else ""))
    else:
        lines.append(f"on the CPU the device is the host: busy inside aten ops {d.busy_ms:.3g} ms "
                     f"({share(d.busy_ms):.0f} %), outside them {d.idle_ms:.3g} ms ({share(d.idle_ms):.0f} %)")
    lines.append("the host's time per profiled step, by what it was doing (and how long the GPU idled meanwhile; "
                 "after_sync: refilling the queue a wait emptied; queue_full: blocked on a full launch queue, the GPU "
                 "busy):")
    for c in CAUSES:
        ms = f.host_by_cause.get(c, 0.0)
        if ms <= 0:
            continue
        where = f.sites(c, top=2)
        idle = f"; GPU idle meanwhile {d.idle_by_cause.get(c, 0.0):.3g} ms" if d.on_gpu else ""
        lines.append(f"  {c:<14} {ms:8.3g} ms{idle}" + (f"  <- {where}" if where else ""))
    if f.hidden_syncs:
        seen = {}
        for site, via in f.hidden_syncs:
            seen[(site, via)] = seen.get((site, via), 0) + 1
        lines.append("synchronizing calls in one step (torch.cuda.set_sync_debug_mode): "
                     + "; ".join(f"{site or '(no line of yours)'}" + (f" via {via}" if via and via != site else "")
                                 + (f" x{n}" if n > 1 else "") for (site, via), n in seen.items()))
    if f.shape_changes:
        lines.append("shapes that changed between the profiled steps: " + "; ".join(
            f"{site or '(no line of yours)'} {op}: " + ", ".join("x".join(map(str, sh)) for sh in shapes)
            for site, op, shapes, _ in f.shape_changes[:3]))
    if f.data_dependent:
        lines.append("ops whose output size the GPU decides (the host waits to learn it): " + "; ".join(
            f"{site or '(no line of yours)'} {op} x{n:.2g}" for site, op, n in f.data_dependent[:3]))
    if d.on_gpu:
        lines.append("busy by kernel class (streams merged per class; classes may overlap):")
        lines += [f"  {c:<20} {d.busy_by_class[c]:8.3g} ms" for c in CLASSES if d.busy_by_class.get(c)]
        math = {}
        for g in f.gemms:
            math[g.math or "unknown"] = math.get(g.math or "unknown", 0.0) + g.gpu_ms
        if math:
            lines.append("  matrix products by math (read per kernel): "
                         + ", ".join(f"{k} {v:.3g} ms" for k, v in sorted(math.items(), key=lambda kv: -kv[1])))
    if d.nvml_util_pct is not None:
        lines.append(f"NVML utilization {d.nvml_util_pct:.0f} % over the timed steps: the percent of time over "
                     "NVML's past sample period (1/6 s to 1 s, by product) during which one or more kernels ran - "
                     "coarser than the profiler's busy share, usually higher, and its period may reach beyond the steps")
    if d.memory is not None:
        m = d.memory
        lines.append(f"memory: peak allocated {fmt_bytes(m.peak_allocated_bytes)} of {fmt_bytes(m.total_bytes)} "
                     f"({m.cap_source}), the allocator's cache {fmt_bytes(m.cached_bytes)} more (reserved "
                     f"{fmt_bytes(m.peak_reserved_bytes)}); {m.alloc_retries} allocation retries in {m.steps} steps")
    if d.tflops is not None:
        sheet = d.facts.kernel_ceiling_tflops
        lines.append(f"model {d.tflops:.3g} TFLOP/s: "
                     + (f"MFU {100 * d.mfu:.1f} % (of the datasheet's {sheet:.3g} TFLOP/s, PaLM's definition)"
                        if d.mfu is not None else "MFU unknown (no datasheet row for this GPU, or a GPU profile)")
                     + ("; " + (f"{100 * d.measured_peak_fraction:.1f} % of the measured peak, {d.peak_tflops:.3g} "
                                f"TFLOP/s ({d.peak_source})" if d.measured_peak_fraction is not None
                                else f"fraction of measured peak unknown: {d.peak_source}")))
    else:
        lines.append("MFU and the fraction of measured peak unknown: no FLOP count for the step")
    lines.append("verdicts, by measured gain where a variant ran, else expected gain:" if d.verdicts
                 else "verdicts: no rule fired")
    for i, v in enumerate(d.verdicts, 1):
        gain = (f"measured {v.measured:.3g}x, expected {v.expected_gain:.3g}x" if v.measured is not None
                else f"expected {v.expected_gain:.3g}x")
        head = (f"{i}. {v.bottleneck} [lesson {v.lesson}]: "
                + (f"{gain}, at most {v.bound:.3g}x (removes up to {100 * v.share:.1f} % of the step)"
                   if v.actionable else "a note, not a speed fix" if v.rule != "compute_bound"
                   else f"what is left: up to {100 * v.share:.1f} % at the measured peak"))
        lines += [head + (" - DEMOTED" if v.demoted else "") + (f" - after {v.blocked_by}" if v.blocked_by else ""),
                  f"   evidence: {v.evidence}", f"   fix: {v.fix}"]
        if v.confirmation:
            lines.append(f"   check: {v.confirmation}")
    if d.skipped:
        lines.append("not checked:")
        lines += [f"  {name}: {why}" for name, why in d.skipped.items()]
    lines += [f"note: {n}" for n in d.notes]
    if d.trace_path:
        lines.append(f"trace: {d.trace_path} (open in https://ui.perfetto.dev or chrome://tracing)")
    return "\n".join(lines)


# -- the plot --------------------------------------------------------------------------------------
CAUSE_COLORS = dict(zip(CAUSES, ("#e07b24", "#c23b3b", "#e8a0a0", "#7d5ba6", "#8c6d31", "#5b7fa6", "#d45fa5",
                                  "#f2c4e0", "#3b8c6e", "#bbbbbb")))


def timeline_figure(d: "Diagnosis"):
    """The profiled steps on one time axis: GPU work per stream (or, on the CPU, the host threads'
    aten ops), the host's time coloured by what it was doing, and each step's window as a marker."""
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
        for a, b, cause in iv.get("host", []):
            ax.broken_barh([((a - t0) / 1e3, (b - a) / 1e3)], (y_idle - 0.35, 0.7),
                           color=CAUSE_COLORS.get(cause, "#bbbbbb"), linewidth=0)
        y_steps = y_idle + 1
        for i, (a, b) in enumerate(windows):
            ax.broken_barh([((a - t0) / 1e3, (b - a) / 1e3)], (y_steps - 0.2, 0.4),
                           color="#888888" if i % 2 == 0 else "#bbbbbb", linewidth=0)
            ax.axvline((a - t0) / 1e3, color="#555555", lw=0.6, ls=":")
        labels = [r for r, _ in rows] + ["host (cause)", "steps"]
        ax.set_yticks(range(len(labels)), labels)
        ax.set_ylim(-0.6, len(labels) - 0.4)
        ax.invert_yaxis()
        ax.set_xlabel("ms from the first profiled step")
        title = f"{d.label + ': ' if d.label else ''}busy {d.busy_ms:.3g} ms, idle {d.idle_ms:.3g} ms per step"
        ax.set_title(title + (f"\ntop verdict: {d.top.bottleneck} (lesson {d.top.lesson})" if d.top else ""),
                     fontsize=10)
        ax.grid(axis="y", visible=False)
        handles = [Patch(color=COLORS[0], label="GPU work" if d.on_gpu else "aten ops")]
        handles += [Patch(color=CAUSE_COLORS[c], label=f"host: {c}") for c in CAUSES if d.facts.host_by_cause.get(c)]
        ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return styled(fig)
