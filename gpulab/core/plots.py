"""One look for every plot in the course (matplotlib).

Each function returns a matplotlib Figure: the last line of a notebook cell
shows it, and a widget panel displays it in its output area.

- `compare_bars`: one bar per run, with its spread (IQR) as error bars; labels wrapped or rotated from
  their length and the bar count (`tick_labels`), never overlapping.
- `sweep_plot`: a measured quantity against a swept parameter, one line per series, each series its own
  colour, line style and marker (`series_style`), so coinciding lines stay distinguishable.
- `timeline_plot`: the GPU monitor's samples over time.
- `samples_plot`: every timed call of a few `Timing`s, to see median and spread.
- `roofline_plot`: attainable FLOP/s against arithmetic intensity from measured ceilings.
- `segments_plot`: the caching allocator's segments (lesson 02).
- `stream_timeline_plot`: work on each CUDA stream over time (lesson 08).
- `waterfall_plot`: a cumulative quantity built up step by step, each step a floating bar (lesson 13).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence
import matplotlib
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from gpulab.core.timing import Timing


COLORS = ("#2f6db5", "#e07b24", "#3a9a4f", "#c23b3b", "#7d5ba6", "#8c6d31", "#d45fa5", "#6b6b6b")


STYLE = {
    "figure.figsize": (7.0, 3.6),
    "figure.dpi": 100,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.prop_cycle": matplotlib.cycler(color=COLORS),
    "font.size": 10,
    "axes.titlesize": 11,
    "legend.frameon": False,
}


# One look per series, for the whole course: colour, line style and marker all change from one series to
# the next, so two series that lie on top of each other (fp32 and bf16 losses) both stay visible.
LINESTYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def series_style(i: int) -> dict:
    """matplotlib keywords for the i-th series of a line plot (`sweep_plot`)."""
    return dict(color=COLORS[i % len(COLORS)], ls=LINESTYLES[i % len(LINESTYLES)],
                marker=MARKERS[i % len(MARKERS)], mfc="none" if i % 2 else COLORS[i % len(COLORS)])


CHAR_WIDTH_EM = 0.6     # average width of a DejaVu Sans character, in font sizes (ems)


def wrap_label(text: str, width: int) -> list[str] | None:
    """`text` in lines of at most `width` characters, broken after a space, "=" or ","; None if one
    piece alone is wider."""
    import re

    lines, line = [], ""
    for piece in re.split(r"(?<=[ =,])", text):
        if len(piece.strip()) > width:
            return None
        if line and len((line + piece).rstrip()) > width:
            lines.append(line.rstrip())
            line = piece.lstrip()
        else:
            line += piece
    return lines + [line.rstrip()] if line.strip() else lines


def tick_labels(names: Sequence[str], slot_in: float, fontsize: float = 10.0, max_lines: int = 3,
                rotate_above: int = 4) -> tuple[list[str], int]:
    """Category labels that do not overlap: (labels, rotation in degrees).

    Each label has `slot_in` inches (the distance between two bars). More than `rotate_above` labels are
    rotated 20 degrees (parallel labels that far apart cannot touch). Fewer stay level: a label that fits
    its slot as it is; a longer one wrapped (after a space, "=" or ",") onto up to `max_lines` lines; if a
    piece alone is too wide, or it needs more lines, all are rotated after all.
    """
    if len(names) > rotate_above:
        return list(names), 20
    fits = max(1, int(slot_in * 72 / (fontsize * CHAR_WIDTH_EM)) - 1)   # one character of gap
    if all(len(n) <= fits for n in names):
        return list(names), 0
    wrapped = [wrap_label(n, fits) for n in names]
    if all(lines is not None and len(lines) <= max_lines for lines in wrapped):
        return ["\n".join(lines) for lines in wrapped], 0
    return list(names), 20


def _set_tick_labels(ax, fig: Figure, names: Sequence[str], margin_in: float = 1.0) -> None:
    """Bar/category tick labels at 0..n-1 that do not overlap (`tick_labels`)."""
    slot = (fig.get_figwidth() - margin_in) / max(len(names), 1)
    labels, rotation = tick_labels(names, slot)
    ax.set_xticks(range(len(names)), labels, rotation=rotation, ha="right" if rotation else "center",
                  rotation_mode="anchor" if rotation else "default")


def figure(ncols: int = 1, **kw) -> tuple[Figure, list]:
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, ncols, **kw)
    plt.close(fig)  # keep pyplot from showing it a second time; we return it
    return fig, list(axes) if ncols > 1 else [axes]


def styled(fig: Figure) -> Figure:
    fig.tight_layout()
    return fig


def compare_bars(values: Mapping[str, Timing | float], ylabel: str = "ms per call",
                 title: str = "", baseline: str | None = None,
                 lower_is_better: bool | None = None) -> Figure:
    """Bars for named runs. Timings show their median with the IQR as an error bar.

    With `baseline`, each bar is labelled with its speed-up over that run:
    baseline / value for times (`lower_is_better`), value / baseline for rates.
    `lower_is_better=None` decides from the values: Timings are times, numbers rates.
    """
    names = list(values)
    mids, lows, highs = [], [], []
    for name in names:
        v = values[name]
        if isinstance(v, Timing):
            mids.append(v.median_ms)
            lows.append(v.median_ms - v.p25_ms)
            highs.append(v.p75_ms - v.median_ms)
        else:
            mids.append(float(v))
            lows.append(0.0)
            highs.append(0.0)
    fig, (ax,) = figure(figsize=(max(4.0, 1.1 * len(names) + 2), 3.6))
    with plt.rc_context(STYLE):
        bars = ax.bar(range(len(names)), mids, yerr=[lows, highs], capsize=4,
                      color=[COLORS[i % len(COLORS)] for i in range(len(names))])
        _set_tick_labels(ax, fig, names)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        if lower_is_better is None:
            lower_is_better = any(isinstance(v, Timing) for v in values.values())
        if baseline is not None and baseline in values:
            base = mids[names.index(baseline)]
            for bar, mid in zip(bars, mids):
                if base and mid:
                    ax.annotate(f"{base / mid:.2g}x" if lower_is_better else f"{mid / base:.2g}x",
                                (bar.get_x() + bar.get_width() / 2, mid),
                                ha="center", va="bottom", fontsize=9)
    return styled(fig)


def sweep_plot(x: Sequence[float], series: Mapping[str, Sequence[float | None]], xlabel: str,
               ylabel: str, title: str = "", logx: bool = False, logy: bool = False,
               hlines: Mapping[str, float] | None = None,
               vlines: Mapping[str, float] | None = None) -> Figure:
    """One line per series against x (a None value leaves its point out); optional labelled horizontal/vertical
    reference lines."""
    curves = {label: tuple(zip(*[(a, b) for a, b in zip(x, ys) if b is not None])) or ((), ())
              for label, ys in series.items()}
    return curves_plot(curves, xlabel, ylabel, title, hlines=hlines, vlines=vlines, logx=logx, logy=logy)


def curves_plot(curves: Mapping[str, tuple[Sequence[float], Sequence[float]]], xlabel: str, ylabel: str,
                title: str = "", hlines: Mapping[str, float] | None = None,
                vlines: Mapping[str, float] | None = None, logx: bool = False, logy: bool = False) -> Figure:
    """One line per curve, each with its own x values ({label: (xs, ys)}; an empty curve draws nothing);
    optional labelled horizontal/vertical reference lines."""
    fig, (ax,) = figure()
    with plt.rc_context(STYLE):
        for i, (label, (xs, ys)) in enumerate(curves.items()):
            if len(xs):
                ax.plot(xs, ys, ms=4, label=label, **series_style(i))
        for j, (label, y) in enumerate((hlines or {}).items()):
            ax.axhline(y, ls="--", lw=1, color=COLORS[(j + len(curves)) % len(COLORS)], label=label)
        for label, xv in (vlines or {}).items():
            ax.axvline(xv, ls=":", lw=1, color="#555555", label=label)
        if logx:
            ax.set_xscale("log")
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    return styled(fig)


TIMELINE_LABELS = {
    "busy_pct": "GPU busy %", "mem_used_gib": "memory used (GiB)", "sm_clock_mhz": "SM clock (MHz)",
    "pcie_rx_gbps": "PCIe rx (GB/s)", "pcie_tx_gbps": "PCIe tx (GB/s)", "power_w": "power (W)",
}


def timeline_plot(timeline: Mapping[str, Sequence[float | None]],
                  metrics: Sequence[str] = ("busy_pct", "mem_used_gib", "sm_clock_mhz", "power_w"),
                  title: str = "") -> Figure:
    """Small multiples of the GPU monitor's timeline (`GpuMonitor.timeline()`)."""
    metrics = [m for m in metrics if any(v is not None for v in timeline.get(m, []))]
    if not metrics:
        fig, (ax,) = figure(figsize=(6, 1.5))
        ax.axis("off")
        ax.text(0.5, 0.5, "no GPU monitor samples (see the monitor's status)", ha="center")
        return fig
    fig, axes = figure(ncols=len(metrics), figsize=(3.0 * len(metrics), 2.6))
    t = timeline["t_s"]
    with plt.rc_context(STYLE):
        for i, (ax, m) in enumerate(zip(axes, metrics)):
            pts = [(a, b) for a, b in zip(t, timeline[m]) if b is not None]
            ax.plot(*zip(*pts), color=COLORS[i % len(COLORS)], lw=1.5)
            ax.set_title(TIMELINE_LABELS.get(m, m), fontsize=10)
            ax.set_xlabel("time (s)")
            if m == "busy_pct":
                ax.set_ylim(-2, 102)
        if title:
            fig.suptitle(title)
    return styled(fig)


def samples_plot(timings: Mapping[str, Timing], title: str = "", logy: bool = True) -> Figure:
    """Every timed call (dots) with the median (bar) per Timing: the spread made visible."""
    fig, (ax,) = figure()
    with plt.rc_context(STYLE):
        for i, (label, t) in enumerate(timings.items()):
            xs = [i + (k % 7 - 3) * 0.04 for k in range(len(t.samples_ms))]
            ax.scatter(xs, t.samples_ms, s=10, alpha=0.6, color=COLORS[i % len(COLORS)])
            ax.hlines(t.median_ms, i - 0.3, i + 0.3, color="black", lw=2)
        ax.set_xticks(range(len(timings)), list(timings))
        ax.set_ylabel("ms per call")
        if logy:
            ax.set_yscale("log")
        ax.set_title(title)
    return styled(fig)


def segments_plot(layout: Sequence[Sequence[tuple[float, str]]], title: str = "",
                  max_rows: int = 60) -> Figure:
    """The caching allocator's segments, one row each: live blocks blue, free blocks grey.

    `layout` is per segment a list of (MiB, "live"/"free") blocks, as
    `gpulab.lessons.l02_memory_fragmentation.layout_of` returns. Long lists show the first `max_rows`.
    """
    rows = list(layout)[:max_rows]
    fig, (ax,) = figure(figsize=(7.0, min(6.0, 1.2 + 0.09 * max(len(rows), 1))))
    with plt.rc_context(STYLE):
        for y, blocks in enumerate(rows):
            x = 0.0
            for size, state in blocks:
                ax.barh(y, size, left=x, height=0.8, color=COLORS[0] if state == "live" else "#cccccc",
                        edgecolor="white", linewidth=0.3)
                x += size
        ax.set_yticks([])
        ax.set_ylim(-0.6, max(len(rows), 1) - 0.4)
        ax.invert_yaxis()
        ax.set_xlabel("MiB within the segment")
        ax.set_ylabel(f"segments ({len(rows)}" + (f" of {len(layout)})" if len(layout) > len(rows) else ")"))
        ax.set_title(title)
        ax.grid(False)
        from matplotlib.patches import Patch
        ax.legend(handles=[Patch(color=COLORS[0], label="live tensor"), Patch(color="#cccccc", label="free")],
                  fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return styled(fig)


def stream_timeline_plot(runs: Mapping[str, Sequence], title: str = "",
                         xlabel: str = "ms from start") -> Figure:
    """Spans as horizontal bars: one row per (run, stream), one colour per step name.

    Each span needs .stream, .name, .start_ms, .end_ms and .ms (`gpulab.lessons.l08_cuda_streams.Span`). Lesson 08.
    """
    from matplotlib.patches import Patch

    rows: list[tuple[str, list]] = []
    for run, spans in runs.items():
        for stream in dict.fromkeys(s.stream for s in spans):
            rows.append((f"{run}: {stream}", [s for s in spans if s.stream == stream]))
    names = list(dict.fromkeys(s.name for spans in runs.values() for s in spans))
    color = {n: COLORS[i % len(COLORS)] for i, n in enumerate(names)}
    fig, (ax,) = figure(figsize=(7.0, 1.2 + 0.45 * max(len(rows), 1)))
    with plt.rc_context(STYLE):
        for y, (_, spans) in enumerate(rows):
            for s in spans:
                ax.barh(y, s.ms, left=s.start_ms, height=0.6, color=color[s.name], edgecolor="white")
        for run, spans in runs.items():
            if spans:
                end = max(s.end_ms for s in spans)
                ys = [y for y, (label, _) in enumerate(rows) if label.startswith(f"{run}: ")]
                ax.plot([end, end], [min(ys) - 0.4, max(ys) + 0.4], color="black", linewidth=1)
                ax.annotate(f"{end:.2f} ms", (end, min(ys)), xytext=(4, 0), textcoords="offset points",
                            va="center", fontsize=8)
        ends = [s.end_ms for spans in runs.values() for s in spans]
        if ends:
            ax.set_xlim(0, max(ends) * 1.15)
        ax.set_yticks(range(len(rows)), [label for label, _ in rows])
        ax.set_ylim(-0.6, max(len(rows), 1) - 0.4)
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        ax.grid(axis="y", visible=False)
        ax.legend(handles=[Patch(color=color[n], label=n) for n in names], fontsize=8,
                  loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return styled(fig)


def roofline_plot(compute_peaks: Mapping[str, float], bandwidth_gbps: float,
                  points: Mapping[str, tuple[float, float]] | None = None,
                  title: str = "Roofline from this device's measured ceilings") -> Figure:
    """Attainable TFLOP/s = min(peak, intensity x bandwidth), on log-log axes.

    compute_peaks: label -> TFLOP/s (one roof each). bandwidth_gbps: memory GB/s.
    points: label -> (FLOP per byte, achieved TFLOP/s) to place measured kernels.
    """
    import numpy as np

    fig, (ax,) = figure(figsize=(7.0, 4.2))
    bw_tflops_per_intensity = bandwidth_gbps / 1e3  # TFLOP/s per (FLOP/byte)
    top = max(compute_peaks.values())
    ridge_max = top / bw_tflops_per_intensity
    far = max([ridge_max * 8, 10] + [2 * i for i, _ in (points or {}).values()])
    xs = np.logspace(-2, np.log10(far), 200)
    with plt.rc_context(STYLE):
        ax.plot(xs, xs * bw_tflops_per_intensity, color="#555555", lw=1, ls="--",
                label=f"memory: {bandwidth_gbps:,.0f} GB/s")
        last_labelled = None
        for i, (label, peak) in enumerate(sorted(compute_peaks.items(), key=lambda kv: kv[1])):
            ridge = peak / bw_tflops_per_intensity
            ax.plot(xs, np.minimum(peak, xs * bw_tflops_per_intensity),
                    color=COLORS[i % len(COLORS)], lw=2, label=f"{label}: {peak:,.3g} TFLOP/s")
            if last_labelled is None or peak > 1.25 * last_labelled:  # keep labels apart
                ax.annotate(f"ridge {ridge:.3g} FLOP/B", (ridge, peak), fontsize=7,
                            xytext=(4, -12), textcoords="offset points")
                last_labelled = peak
        for label, (intensity, achieved) in (points or {}).items():
            ax.scatter([intensity], [achieved], marker="x", s=50, color="black", zorder=5)
            ax.annotate(label, (intensity, achieved), fontsize=8, xytext=(4, 4),
                        textcoords="offset points")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
        ax.set_ylabel("attainable TFLOP/s")
        ax.set_title(title)
        ax.legend(fontsize=8, loc="upper left")
    return styled(fig)


UP, DOWN, SKIPPED = COLORS[2], COLORS[3], "#cccccc"


def waterfall_plot(rows: Sequence[tuple[str, float | None]], notes: Sequence[str] | None = None,
                   ylabel: str = "speed-up over the baseline (x)", title: str = "", logy: bool = True,
                   total_label: str = "total", higher_is_better: bool = True) -> Figure:
    """A waterfall: the first row's bar, then one floating bar per step from the cumulative value before it
    to the value after it (green where it got better, red where worse: up, unless `higher_is_better` is
    False, as for memory), then the total. Lesson 13.

    rows: (label, cumulative value) in order, the first being the start (e.g. ("baseline", 1.0)); a None
    value is a step that did not count (skipped or failed): a grey marker at the level it left unchanged.
    notes: one text per row, written above its bar (e.g. each step's share). Log scale by default, so
    equal ratios are equal heights.
    """
    if not rows or rows[0][1] is None:
        raise ValueError("a waterfall needs a first row with a value")
    values = [v for _, v in rows if v is not None]
    if logy and min(values) <= 0:
        raise ValueError("a log-scale waterfall needs positive values")
    low = min(values) / 1.6 if logy else min(0.0, min(values))
    fig, (ax,) = figure(figsize=(max(5.0, 0.95 * (len(rows) + 1) + 2), 3.8))
    with plt.rc_context(STYLE):
        level = rows[0][1]
        for i, (label, value) in enumerate(rows):
            if i == 0:
                ax.bar(i, value - low, bottom=low, color=COLORS[0], width=0.6)
                top = value
            elif value is None:
                ax.bar(i, 0, bottom=level, color=SKIPPED, width=0.6, edgecolor=SKIPPED, linewidth=2)
                ax.plot([i - 0.3, i + 0.3], [level, level], color="#888888", lw=2, ls=":")
                top = level
            else:
                better = (value >= level) == higher_is_better
                ax.bar(i, value - level, bottom=level, width=0.6, color=UP if better else DOWN)
                top = max(value, level)
                level = value
            if i + 1 < len(rows):
                ax.plot([i + 0.3, i + 0.7], [level, level], color="#555555", lw=0.8)
            if notes is not None and i < len(notes) and notes[i]:
                ax.annotate(notes[i], (i, top), xytext=(0, 3), textcoords="offset points", ha="center",
                            va="bottom", fontsize=8)
        ax.bar(len(rows), level - low, bottom=low, color=COLORS[4], width=0.6)
        ax.annotate(f"{level / rows[0][1]:.3g}x" if logy else f"{level:.3g}", (len(rows), level), xytext=(0, 3),
                    textcoords="offset points", ha="center", va="bottom", fontsize=8)
        _set_tick_labels(ax, fig, [label for label, _ in rows] + [total_label])
        high = max(values)
        if logy:
            from matplotlib.ticker import FuncFormatter, LogLocator

            ax.set_yscale("log")
            ax.set_ylim(low, high * 1.6)                  # room above the tallest bar for its note
            ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        else:
            ax.set_ylim(low, high + 0.15 * (high - low or 1.0))
        ax.set_ylabel(ylabel)
        ax.set_title(title)
    return styled(fig)


def sig(value: float | None, unit: str = "", digits: int = 3) -> str:
    """`value` to `digits` significant figures, never in fixed decimals that print 0.0 for a small number:
    sig(0.01234, "TFLOP/s") -> "0.0123 TFLOP/s", sig(693.4) -> "693", sig(51234.5) -> "51,235";
    below 1e-4, scientific notation. None, NaN or infinity give "-"."""
    if value is None or not math.isfinite(value):
        return "-"
    if value != 0 and abs(value) >= 10 ** (digits - 1):
        return f"{value:,.0f}" + (f" {unit}" if unit else "")    # whole numbers keep all their digits
    value = float(f"{value:.{digits}g}")           # round to the significant figures first
    if value == 0:
        text = "0"
    else:
        mag = math.floor(math.log10(abs(value)))
        if mag >= digits - 1:
            text = f"{value:,.0f}"
        elif mag >= -4:
            text = f"{value:.{digits - 1 - mag}f}"
        else:
            text = f"{value:.{digits - 1}e}"
    return f"{text} {unit}" if unit else text


def _cell(v) -> str:
    """A table cell: a float to 4 significant figures, anything else as it prints."""
    return sig(v, digits=4) if isinstance(v, float) else str(v)


def table_html(rows: Sequence[Sequence[Any]], header: Sequence[str] | None = None, notes: Sequence[str] = ()) -> str:
    """Rows as an HTML table (numbers to 4 significant figures), `notes` as lines below it; under a GPU profile a
    last note says whose timings the table holds. `gpulab.notebook.lesson.show_table` displays it.

    Keep the cells short: a long sentence in one column of a wide table is squeezed to a word per
    line. Put it in `notes` and refer to it from the cell.
    """
    import html
    from gpulab.core.device import device_facts, device_label
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header) if header else ""
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    if device_facts().profile:       # every table under a profile says whose timings it holds
        notes = [*notes, f"{device_label()}: that class's features and memory, this GPU's timings."]
    below = "".join(f"<div style='margin:2px 0'>{html.escape(n)}</div>" for n in notes)
    return f"<table>{'<tr>' + head + '</tr>' if head else ''}{body}</table>{below}"
