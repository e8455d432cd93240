"""gpulab.core.plots: every function returns a Figure with the expected artists."""
import pytest
import torch
from matplotlib.collections import PathCollection
from matplotlib.container import BarContainer
from matplotlib.figure import Figure

from gpulab.core import plots
from gpulab.core.monitor import GpuMonitor
from gpulab.core.timing import summarize


def bars_of(ax) -> BarContainer:
    (container,) = [c for c in ax.containers if isinstance(c, BarContainer)]
    return container


def error_bar_ranges(container):
    """(low, high) y of each bar's error bar."""
    (segments,) = [lc.get_segments() for lc in container.errorbar.lines[2]]
    return [(round(s[0][1], 9), round(s[1][1], 9)) for s in segments]


def texts(ax):
    return [t.get_text() for t in ax.texts]


# -- compare_bars -----------------------------------------------------------------------
def test_compare_bars_one_bar_per_run():
    fig = plots.compare_bars({"a": 1.0, "b": 2.0, "c": 3.0}, title="three runs")
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    assert len(ax.patches) == 3
    assert [p.get_height() for p in ax.patches] == [1.0, 2.0, 3.0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c"]
    assert ax.get_title() == "three runs" and ax.get_ylabel() == "ms per call"


def test_compare_bars_timings_get_iqr_error_bars():
    t = summarize([1.0, 2.0, 3.0, 4.0, 5.0], "cpu", "perf_counter")   # p25 2, median 3, p75 4
    fig = plots.compare_bars({"timed": t, "plain": 6.0})
    (ax,) = fig.axes
    assert [p.get_height() for p in ax.patches] == [3.0, 6.0]
    assert error_bar_ranges(bars_of(ax)) == [(2.0, 4.0), (6.0, 6.0)]


def test_compare_bars_baseline_speedup_for_times():
    fig = plots.compare_bars({"slow": 10.0, "fast": 5.0}, ylabel="ms per call", baseline="slow",
                             lower_is_better=True)
    assert texts(fig.axes[0]) == ["1x", "2x"]


def test_compare_bars_timings_are_times_without_being_told():
    slow = summarize([10.0, 10.0, 10.0], "cpu", "perf_counter")
    fast = summarize([5.0, 5.0, 5.0], "cpu", "perf_counter")
    fig = plots.compare_bars({"slow": slow, "fast": fast}, ylabel="µs per call", baseline="slow")
    assert texts(fig.axes[0]) == ["1x", "2x"]


def test_compare_bars_baseline_ratio_for_rates():
    fig = plots.compare_bars({"fp32": 50.0, "bf16": 700.0}, ylabel="TFLOP/s", baseline="fp32")
    assert texts(fig.axes[0]) == ["1x", "14x"]


def test_compare_bars_unknown_baseline_adds_no_labels():
    fig = plots.compare_bars({"a": 1.0, "b": 2.0}, baseline="missing")
    assert texts(fig.axes[0]) == []


def test_compare_bars_many_names_are_rotated():
    fig = plots.compare_bars({f"run {i}": float(i + 1) for i in range(6)})
    (ax,) = fig.axes
    assert len(ax.patches) == 6
    assert {t.get_rotation() for t in ax.get_xticklabels()} == {20.0}


# -- sweep_plot ------------------------------------------------------------------------
def test_sweep_plot_lines_and_reference_lines():
    fig = plots.sweep_plot([1, 2, 4, 8], {"fp32": [1, 2, 3, 4], "bf16": [2, None, 6, 8]},
                           xlabel="batch", ylabel="ms", logx=True,
                           hlines={"peak": 10.0}, vlines={"ridge": 3.0})
    (ax,) = fig.axes
    assert len(ax.lines) == 4                   # 2 series + 1 hline + 1 vline
    fp32, bf16 = ax.lines[:2]
    assert list(bf16.get_xdata()) == [1, 4, 8]  # the None point is left out
    assert list(fp32.get_ydata()) == [1, 2, 3, 4]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "linear"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["fp32", "bf16", "peak", "ridge"]


@pytest.mark.filterwarnings("ignore:No artists with labels found")
def test_curves_plot_each_curve_on_its_own_x():
    fig = plots.curves_plot({"fp32": ([0, 1, 2], [5, 4, 3]), "bf16": ([0, 0.5], [5, 3.5])}, xlabel="s", ylabel="loss",
                            hlines={"target": 3.0})
    (ax,) = fig.axes
    assert len(ax.lines) == 3
    assert list(ax.lines[1].get_xdata()) == [0, 0.5] and list(ax.lines[0].get_ydata()) == [5, 4, 3]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["fp32", "bf16", "target"]


def test_sweep_plot_series_without_values_draws_nothing():
    fig = plots.sweep_plot([1, 2], {"empty": [None, None]}, xlabel="x", ylabel="y", logy=True)
    (ax,) = fig.axes
    assert len(ax.lines) == 0
    assert ax.get_yscale() == "log"


# -- timeline_plot ----------------------------------------------------------------------
def test_timeline_plot_one_panel_per_metric_with_data():
    tl = {"t_s": [0.0, 0.2, 0.4], "busy_pct": [10.0, 90.0, 95.0],
          "mem_used_gib": [1.0, 2.0, 2.0], "sm_clock_mhz": [None, None, None],
          "power_w": [100.0, None, 300.0]}
    fig = plots.timeline_plot(tl, title="load")
    assert len(fig.axes) == 3                   # the clock never read: no panel
    busy, mem, power = fig.axes
    assert busy.get_title() == "GPU busy %" and busy.get_ylim() == (-2, 102)
    assert mem.get_title() == "memory used (GiB)"
    assert list(power.lines[0].get_ydata()) == [100.0, 300.0]
    assert fig._suptitle.get_text() == "load"


def test_timeline_plot_without_samples_says_so():
    fig = plots.timeline_plot(GpuMonitor(device=torch.device("cpu")).timeline())
    (ax,) = fig.axes
    assert not ax.axison
    assert texts(ax) == ["no GPU monitor samples (see the monitor's status)"]


# -- samples_plot ------------------------------------------------------------------------
def test_samples_plot_shows_every_call_and_the_median():
    a = summarize([1.0, 1.1, 1.2, 5.0], "cpu", "perf_counter")
    b = summarize([2.0, 2.1, 2.2], "cpu", "perf_counter")
    fig = plots.samples_plot({"a": a, "b": b}, title="spread")
    (ax,) = fig.axes
    dots = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert [len(c.get_offsets()) for c in dots] == [4, 3]
    assert ax.get_yscale() == "log"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b"]


# -- roofline_plot ---------------------------------------------------------------------
def test_roofline_one_roof_per_peak_plus_memory_line():
    fig = plots.roofline_plot({"bf16": 700.0, "fp32": 50.0}, bandwidth_gbps=3000.0,
                              points={"my kernel": (10.0, 20.0)})
    (ax,) = fig.axes
    assert len(ax.lines) == 3
    memory, fp32, bf16 = ax.lines               # roofs drawn lowest first
    assert memory.get_label() == "memory: 3,000 GB/s"
    assert fp32.get_label() == "fp32: 50 TFLOP/s"
    assert bf16.get_label() == "bf16: 700 TFLOP/s"
    assert max(fp32.get_ydata()) == pytest.approx(50.0)
    assert max(bf16.get_ydata()) == pytest.approx(700.0)
    x0 = fp32.get_xdata()[0]
    assert fp32.get_ydata()[0] == pytest.approx(x0 * 3.0)    # memory-bound: 3 TFLOP/s per FLOP/B
    assert "ridge 16.7 FLOP/B" in texts(ax) and "ridge 233 FLOP/B" in texts(ax)
    assert "my kernel" in texts(ax)
    assert ax.get_xscale() == ax.get_yscale() == "log"


# -- waterfall_plot --------------------------------------------------------------------
def test_waterfall_floating_bars_colour_by_direction_and_skip_rows():
    from matplotlib.colors import to_rgb

    rows = [("baseline", 1.0), ("+ a", 2.0), ("+ b", None), ("+ c", 1.5), ("+ d", 3.0)]
    fig = plots.waterfall_plot(rows, notes=["", "+2x", "skipped", "-25%", "+2x"], title="steps")
    (ax,) = fig.axes
    bars = ax.patches
    assert len(bars) == len(rows) + 1                     # one per row and the total
    a, skipped, c, d = bars[1:5]
    assert (a.get_y(), a.get_y() + a.get_height()) == pytest.approx((1.0, 2.0))   # floats from the level before
    assert a.get_facecolor()[:3] == pytest.approx(to_rgb(plots.UP))
    assert skipped.get_height() == 0 and skipped.get_y() == pytest.approx(2.0)     # level unchanged
    assert (c.get_y() + c.get_height(), c.get_y()) == pytest.approx((1.5, 2.0))   # down: from 2 to 1.5
    assert c.get_facecolor()[:3] == pytest.approx(to_rgb(plots.DOWN))
    assert (d.get_y(), d.get_y() + d.get_height()) == pytest.approx((1.5, 3.0))
    total = bars[-1]
    assert total.get_y() + total.get_height() == pytest.approx(3.0)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["baseline", "+ a", "+ b", "+ c", "+ d", "total"]
    assert "3x" in texts(ax) and "-25%" in texts(ax) and "skipped" in texts(ax)
    assert ax.get_yscale() == "log" and ax.get_title() == "steps"
    memory = plots.waterfall_plot([("start", 30.0), ("+ a", 12.0)], logy=False, higher_is_better=False)
    assert memory.axes[0].patches[1].get_facecolor()[:3] == pytest.approx(to_rgb(plots.UP))   # less is better
    assert memory.axes[0].get_yscale() == "linear"


def test_waterfall_refuses_rows_it_cannot_draw():
    with pytest.raises(ValueError, match="first row"):
        plots.waterfall_plot([("baseline", None), ("+ a", 2.0)])
    with pytest.raises(ValueError, match="positive"):
        plots.waterfall_plot([("baseline", 1.0), ("+ a", 0.0)])


# -- issue 16: labels that do not overlap, lines that stay apart --------------------------------
def drawn_tick_labels(fig):
    """The figure drawn (Agg); its x tick labels with their extents in pixels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    labels = [t for t in fig.axes[0].get_xticklabels() if t.get_text()]
    return labels, [t.get_window_extent(renderer) for t in labels]


PANEL_LABELS = [
    ["#1 default", "#2 synchronize=False", "#3 synchronize=False"],
    ["#1 default", "#2 synchronize=False", "#3 synchronize=False, warmup=False", "#4 n=512"],
    ["#1 job=cnn, channels_last=True", "#2 job=gpt, amp=bf16, aligned=True, fused=True"],
    ["#1 precision=fp32", "#2 precision=bf16, n=4095", "#3 precision=bf16, n=4096", "#4 precision=bf16, n=4097",
     "#5 precision=fp16, n=4097", "#6 default"],
    ["a", "b"],
]


@pytest.mark.parametrize("names", PANEL_LABELS, ids=lambda n: f"{len(n)} bars")
def test_compare_bars_labels_never_overlap(names):
    import math

    fig = plots.compare_bars({n: float(i + 1) for i, n in enumerate(names)})
    labels, boxes = drawn_tick_labels(fig)
    rotation = labels[0].get_rotation()
    assert [t.get_text().replace("\n", "").replace(" ", "") for t in labels] == [n.replace(" ", "") for n in names]
    if rotation == 0:
        assert not any(a.overlaps(b) for a, b in zip(boxes, boxes[1:])), [t.get_text() for t in labels]
    else:        # parallel rotated labels: the distance between their baselines exceeds a line's height
        slot_px = boxes[1].x1 - boxes[0].x1
        line_px = labels[0].get_fontsize() * fig.dpi / 72 * 1.2
        assert slot_px * math.sin(math.radians(rotation)) > line_px


def test_short_labels_stay_level_and_long_ones_wrap_before_they_rotate():
    assert plots.tick_labels(["fp32", "bf16"], slot_in=1.5) == (["fp32", "bf16"], 0)
    labels, rotation = plots.tick_labels(["#1 default", "#2 synchronize=False", "#3 synchronize=False"], 1.4)
    assert (labels, rotation) == (["#1 default", "#2 synchronize=\nFalse", "#3 synchronize=\nFalse"], 0)
    assert plots.tick_labels(["x" * 40, "y"], slot_in=1.0)[1] == 20          # one unbreakable piece: rotate
    assert plots.wrap_label("#3 synchronize=False, warmup=False", 16) == ["#3 synchronize=", "False, warmup=", "False"]


def test_sweep_plot_series_differ_in_style_as_well_as_colour():
    """fp32's loss curve lying exactly under bf16's stays visible: another line style and marker."""
    curve = [2.3, 2.1, 1.9, 1.8]
    fig = plots.sweep_plot([1, 2, 3, 4], {"fp32": curve, "bf16": curve, "fp16": curve}, "step", "loss")
    lines = fig.axes[0].get_lines()
    styles = [(ln.get_linestyle(), ln.get_marker()) for ln in lines]
    assert len(set(styles)) == 3, styles
    assert len({ln.get_color() for ln in lines}) == 3
    assert styles[0] == ("-", "o")
