"""The widget panel: toggles for an experiment, a Run button, and a plot and
table that keep earlier runs beside the new one. Introduced in notebook 00.

The experiment is a plain function whose toggles are its arguments and which
returns a dict of measurements (numbers or `Timing`s):

    def experiment(dtype="bf16", n=4096) -> dict: ...
    panel = Panel(experiment, {"dtype": Choice(("fp32", "bf16")), "n": IntRange(256, 16384)},
                  metric="TFLOP/s")
    panel            # shows the controls; has already run the defaults once

Values are checked before the experiment runs: a value outside a control's
range is refused with a message and nothing runs. An error inside the
experiment (out of memory included) is caught and explained; the kernel lives on.
The function stays callable without widgets (tests use it that way), and
`panel.run(**values)` runs it as the button would.
"""
from __future__ import annotations

import html
import io
import threading
import traceback
from typing import Any, Callable, Mapping
import ipywidgets as W
from IPython.display import HTML, display
from gpulab.core import plots
from gpulab.core.device import sync
from gpulab.core.memory import memory_guard
from gpulab.core.timing import Timing
from gpulab.notebook.controls import Choice, IntRange, Toggle


Control = Choice | Toggle | IntRange


# -- the panel --------------------------------------------------------------
def _fmt(v: Any) -> str:
    if isinstance(v, Timing):
        return f"{v.median_ms:.4g} ms ± {v.spread_ms / 2:.2g}"
    if isinstance(v, float):
        return f"{v:.4g}"
    return html.escape(str(v))


def explain_error(err: BaseException) -> str:
    """A learner-facing sentence for an error raised inside an experiment."""
    import torch
    if isinstance(err, torch.OutOfMemoryError):
        return ("Out of GPU memory: this setting needs more memory than the GPU has free. "
                "The tensors of the failed run were released; try a smaller size. "
                f"({str(err).splitlines()[0]})")
    if isinstance(err, ValueError):
        return f"Refused: {err}"
    return f"The experiment failed with {type(err).__name__}: {err}"


class Panel:
    """Controls + Run button + a table and bar plot of every run so far."""

    def __init__(self, experiment: Callable[..., Mapping[str, Any]],
                 controls: Mapping[str, Control], metric: str, title: str = "",
                 defaults: Mapping[str, Any] | None = None, run_default: bool = True,
                 ylabel: str | None = None):
        import inspect

        self.experiment = experiment
        self.controls = dict(controls)
        self.metric = metric
        self.title = title
        params = inspect.signature(experiment).parameters
        missing = [k for k in self.controls if k not in params]
        if missing:
            name = getattr(experiment, "__name__", repr(experiment))
            raise TypeError(f"{name}() has no argument(s) {missing} for the controls")
        self.defaults = {k: (defaults or {}).get(k, params[k].default) for k in self.controls}
        for k, v in self.defaults.items():
            self.controls[k].validate(k, v)
        self.ylabel = ylabel or metric
        self.history: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.last_message = ""
        self.inputs = {k: c.widget(k, self.defaults[k]) for k, c in self.controls.items()}
        self.button = W.Button(description="Run", button_style="primary", icon="play")
        self.clear_button = W.Button(description="Clear runs")
        self.status = W.HTML()
        self.out = W.Output()
        self.button.on_click(lambda _: self.run(**self.values()))
        self.clear_button.on_click(lambda _: self.clear())
        header = [W.HTML(f"<b>{html.escape(title)}</b>")] if title else []
        self.widget = W.VBox(header + list(self.inputs.values())
                             + [W.HBox([self.button, self.clear_button]), self.status, self.out])
        self._lock = threading.Lock()
        if run_default:
            self._run(dict(self.defaults), reraise=True)

    def values(self) -> dict[str, Any]:
        """The values the controls show now."""
        return {k: w.value for k, w in self.inputs.items()}

    def _say(self, text: str, error: bool = False) -> None:
        self.last_message = text
        color = "#b00020" if error else "#333333"
        self.status.value = f"<span style='color:{color}'>{html.escape(text)}</span>"

    def run(self, **values: Any) -> dict[str, Any] | None:
        """Validate `values`, run the experiment, add it to the history and redraw.

        Returns the measurements, or None when the values were refused or the run failed.
        """
        return self._run(values, reraise=False)

    def _run(self, values: dict[str, Any], reraise: bool) -> dict[str, Any] | None:
        # reraise: the default run at construction lets an unexpected error (a bug in
        # the lesson, not a refused value or an OOM) propagate, so nbval reports it.
        args = {**self.defaults, **values}
        unknown = set(values) - set(self.controls)
        try:
            if unknown:
                raise ValueError(f"unknown setting(s): {', '.join(sorted(unknown))}; "
                                 f"this panel has {', '.join(self.controls)}.")
            args = {k: self.controls[k].validate(k, v) for k, v in args.items()}
        except ValueError as err:
            self._say(f"Refused: {err}", error=True)
            print(self.last_message)
            return None
        with self._lock, memory_guard(quiet=True) as report:
            self.button.disabled = True
            self._say("running " + ", ".join(f"{k}={v}" for k, v in args.items()) + " ...")
            try:
                result = dict(self.experiment(**args))
            except Exception as err:  # noqa: BLE001 - the kernel must survive any lesson error
                result = None
                self._say(explain_error(err), error=True)
                print(self.last_message)
                expected = isinstance(err, ValueError) or "OutOfMemory" in type(err).__name__
                if not expected:
                    if reraise:
                        raise
                    traceback.print_exc(limit=3)
                del err  # drop the traceback's frames, and the tensors they hold
            finally:
                self.button.disabled = False
        if not report.ok:
            print(report.message())
        if result is None:
            return None
        if self.metric not in result:
            self._say(f"the experiment returned no {self.metric!r}; it returned {list(result)}",
                      error=True)
            return None
        self.history.append((args, result))
        self._say(f"run #{len(self.history)} done." + ("" if report.ok else " " + report.message()))
        self.redraw()
        return result

    def clear(self) -> None:
        self.history.clear()
        self.out.clear_output()
        self._say("runs cleared.")

    def table_html(self) -> str:
        """The history as an HTML table: one row per run, settings then measurements."""
        if not self.history:
            return "<p>no runs yet</p>"
        arg_keys = list(self.controls)
        metric_keys: list[str] = []
        for _, res in self.history:
            metric_keys += [k for k in res if k not in metric_keys]
        head = "".join(f"<th>{html.escape(k)}</th>" for k in ["run", *arg_keys, *metric_keys])
        rows = []
        for i, (args, res) in enumerate(self.history, 1):
            cells = [str(i)] + [_fmt(args[k]) for k in arg_keys] + [_fmt(res.get(k, "")) for k in metric_keys]
            rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        return f"<table><tr>{head}</tr>{''.join(rows)}</table>"

    def figure(self):
        """Bar plot of the panel's metric for every run so far."""
        labels = {}
        for i, (args, res) in enumerate(self.history, 1):
            changed = [f"{k}={v}" for k, v in args.items()
                       if len(self.controls) == 1 or v != self.defaults[k]]
            labels[f"#{i} " + (", ".join(changed) or "default")] = res[self.metric]
        return plots.compare_bars(labels, ylabel=self.ylabel, title=self.title)

    def redraw(self) -> None:
        self.out.clear_output(wait=True)
        with self.out:
            display(HTML(self.table_html()))
            display(self.figure())

    def _ipython_display_(self) -> None:
        display(self.widget)


# -- live GPU monitor -------------------------------------------------------
class MonitorPanel:
    """Start/Stop a live GPU monitor; its timeline redraws about once a second.

    `load` (optional) is a function that keeps the GPU busy for one call; the
    "Run load" button calls it for `load_seconds` so the learner sees the
    timeline move. Built headless, it runs the load once and shows the result.
    """

    def __init__(self, load: Callable[[], object] | None = None, load_seconds: float = 3.0,
                 interval_s: float = 0.2, run_default: bool = True):
        from gpulab.core.monitor import GpuMonitor

        self._make_monitor = lambda: GpuMonitor(interval_s=interval_s)
        self.monitor = self._make_monitor()
        self.load = load
        self.load_seconds = load_seconds
        self.start_button = W.ToggleButton(description="Monitor", icon="eye", value=False)
        self.load_button = W.Button(description=f"Run load {load_seconds:g} s",
                                    disabled=load is None)
        self.status = W.HTML()
        self.image = W.Image(format="png")
        self.start_button.observe(self._toggle, names="value")
        self.load_button.on_click(lambda _: self.run_load())
        self._redraw_thread: threading.Thread | None = None
        self.widget = W.VBox([W.HBox([self.start_button, self.load_button]), self.status, self.image])
        if run_default:
            self.run_load()

    def _toggle(self, change) -> None:
        if change["new"]:
            self.start()
        else:
            self.stop()

    def start(self) -> None:
        self.monitor = self._make_monitor().start()
        self.status.value = html.escape(self.monitor.status)
        if not self.monitor.available:
            return
        self._redraw_thread = threading.Thread(target=self._redraw_loop, daemon=True)
        self._redraw_thread.start()

    def stop(self) -> None:
        self.monitor.stop()
        self._render()
        self.status.value = html.escape(self.monitor.status)

    def _redraw_loop(self) -> None:
        while self.monitor.running:
            self._render()
            threading.Event().wait(1.0)

    def _render(self) -> None:
        fig = plots.timeline_plot(self.monitor.timeline())
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        self.image.value = buf.getvalue()

    def run_load(self) -> None:
        """Monitor while the load runs for load_seconds; show the timeline."""
        import time

        self.monitor = self._make_monitor().start()
        if self.load is not None:
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < self.load_seconds:
                self.load()
                sync()  # the load's GPU work is done before we look at the clock again
        self.monitor.stop()
        self._render()
        self.status.value = html.escape(self.monitor.status)
        if not self.monitor.available:
            print(self.monitor.status)

    def _ipython_display_(self) -> None:
        display(self.widget)
