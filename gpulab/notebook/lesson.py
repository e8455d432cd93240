"""Helpers for the notebook template: the opening line, showing lesson code,
self-checks against a stated band, and the closing "What you saw" table.

Importing this module in a notebook kernel also installs the setup guard: a gpulab setting that is
not understood (`GPULAB_DEVICE=banana`) raised before `start()` has run (that is, in the notebook's
first code cell) shows one short, marked message, and every later cell of the notebook does nothing
but say it did not run, instead of failing with a NameError for what the first cell never defined.
"""
from __future__ import annotations

import html
import inspect
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence
from IPython.display import HTML, Markdown, display
from gpulab.core.device import describe, pick_device
from gpulab.core.memory import MemoryNotReturned, fmt_bytes, notebook_check, notebook_start, strict_by_default
from gpulab.core.plots import sig, table_html  # noqa: F401 - sig: the notebooks call lesson.sig


_started = False   # start() has run in this process: the notebook's setup cell got that far
_lesson = ""       # the lesson start() was called for (the check log's first column)
CHECKS_ENV = "GPULAB_CHECKS"


def start(lesson: str) -> None:
    """First output of every notebook: where it runs, at what size, what the numbers mean and, on a
    GPU, how long the notebook will take there (`predicted_time`)."""
    global _started, _lesson
    _lesson = lesson
    text = f"**Lesson {lesson}.** {describe()}"
    predicted = predicted_time(lesson)
    if predicted is not None:
        text += " " + predicted.line()
    display(Markdown(text))
    notebook_start()        # every memory check compares with what is allocated now, after the imports
    _started = True


def lesson_module(lesson: str):
    """The module of lesson `lesson` ("00".."15") in gpulab.lessons, or None."""
    import importlib
    import pkgutil
    import gpulab.lessons as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name.startswith(f"l{lesson}_"):
            return importlib.import_module(f"gpulab.lessons.{info.name}")
    return None


def predicted_time(lesson: str, scale: str | None = None):
    """This notebook's predicted time on this GPU (`gpulab.core.predict`), from its lesson's `plan` and
    this GPU's ceilings; None on the CPU (no ceilings to divide by) or for a lesson without a plan."""
    from gpulab.core.predict import EXERCISE_S, predict

    if pick_device().type != "cuda":
        return None
    plan = getattr(lesson_module(lesson), "plan", None)
    return None if plan is None else predict(plan(scale), exercise_s=EXERCISE_S.get(lesson, 0.0))


# -- a setting that is not understood stops the notebook with one message ------------------------
NOT_RUN = "(not run: this notebook stopped at its setup cell above; fix the setting and restart the kernel)"


SETUP_ADVICE = ("gpulab stopped this notebook here: its setup cell could not start. Set the variable named above "
                "to an allowed value (or unset it) where Jupyter is started, then restart the kernel and run "
                "the notebook again. The cells below will only say that they did not run.")


def setting_error_lines(err: BaseException, stopped: bool) -> list[str]:
    """The whole traceback shown for a SettingError: its message (and, when it stops the notebook, what to
    do), no stack: the error is in a setting, not in the code above it."""
    lines = [f"\x1b[1;31m{type(err).__name__}\x1b[0m: {err}"]
    if stopped:
        lines.append(f"\x1b[1m{SETUP_ADVICE}\x1b[0m")
    return lines


def _skip_cell(lines: list[str]) -> list[str]:
    """IPython input transformer installed once the setup failed: any later cell only says it did not run."""
    return [f"print({NOT_RUN!r})\n"]


def _on_setting_error(shell, etype, value, tb, tb_offset=None):
    """IPython custom exception handler for SettingError (see `install_setup_guard`)."""
    stopped = not _started
    # IPython's protocol, not a private name: an exception with `_render_traceback_` is shown as the lines
    # it returns instead of a traceback (IPython.core.interactiveshell.InteractiveShell.showtraceback)
    value._render_traceback_ = lambda: setting_error_lines(value, stopped)
    shell.showtraceback()                   # sends the (short) error to the notebook, as any error
    if stopped and _skip_cell not in shell.input_transformers_cleanup:
        shell.input_transformers_cleanup.append(_skip_cell)
    return None


def install_setup_guard(shell=None) -> bool:
    """In an IPython kernel, show a SettingError as its message alone; raised before `start()` has run,
    it also turns every later cell into a no-op that says it did not run (until the kernel restarts).

    Installed when this module is imported; does nothing outside IPython, or where another custom
    exception handler is already installed. Returns whether the guard is in place.
    """
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        shell = get_ipython()
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return False
    from gpulab.core.device import SettingError

    if shell.custom_exceptions not in ((), (SettingError,)):
        return False
    shell.set_custom_exc((SettingError,), _on_setting_error)
    return True


def show_source(fn: Callable) -> None:
    """Show the code of a gpulab function, so the lesson's code is read where it is used."""
    src = inspect.getsource(fn)
    display(Markdown(f"`{fn.__module__}.{fn.__qualname__}`:\n```python\n{src}```"))


@dataclass(frozen=True)
class Check:
    name: str
    measured: float | None
    low: float | None
    high: float | None
    status: str   # "pass", "FAIL", "skipped", "shared" (outside its band on a GPU others use: not judged)
    why: str

    def __str__(self) -> str:
        digits = distinct_digits(self.measured, self.low, self.high) if self.measured is not None else 4
        bound = lambda b: "-" if b is None else f"{b:.{max(digits, 3)}g}"       # 1.2006 for 1.200606673407482
        band = f"[{bound(self.low)}, {bound(self.high)}]"
        value = "-" if self.measured is None else f"{self.measured:.{digits}g}"
        return f"{self.status:>7}  {self.name}: {value} (expected {band}) {self.why}"


def distinct_digits(value: float, *edges: float | None, least: int = 3, most: int = 12) -> int:
    """Significant digits (at least `least`) at which `value` prints differently from every band edge it
    differs from: 1.0126 against a high end of 1.01 prints 1.013, not 1.01 beside "above 1.01"."""
    others = [e for e in edges if e is not None and math.isfinite(e) and e != value]
    if not math.isfinite(value):
        return least
    for digits in range(least, most + 1):
        if all(f"{value:.{digits}g}" != f"{e:.{digits}g}" for e in others):
            return digits
    return most


def expect(name: str, measured: float | None, low: float | None = None,
           high: float | None = None, applies: bool = True, why_not: str = "",
           why: str = "", why_fail: str = "", timed: bool = False) -> Check:
    """Check a measured ratio against a band, or say why the check does not apply here. `timed`: a ratio of
    times, which under a GPU profile is shown, not judged (the sizes are the profile's class's, the timing this
    GPU's), as `expect_band` does for a band of time.

    Three outcomes, three texts, never mixed up:
    - skipped (`applies=False`, or nothing measured): `why_not`, why the check cannot run here (the CPU,
      a tiny size, a GPU without the feature); never reported as passed;
    - pass: `why`, what the result shows;
    - FAIL: `why_fail`, what most likely went wrong on this GPU when the effect did not appear, after
      the band the value missed. A failure never prints the skip reason.
    """
    profile = emulated_profile() if timed and applies else None
    if profile:
        applies, why_not = False, (f"emulating the {profile} profile: the sizes are that class's, the timing this "
                                   "GPU's, so the ratio is neither GPU's and is not judged")
    if not applies or measured is None:
        check = Check(name, measured, low, high, "skipped", why_not or "not measurable here")
    else:
        ok = (low is None or measured >= low) and (high is None or measured <= high)
        shared = "" if ok else _shared_gpu()
        if shared:          # other processes' kernels ran between ours: the band is not this run's fault
            check = Check(name, measured, low, high, "shared",
                          f"{fail_text(measured, low, high, why_fail)}; not judged: this GPU is shared ({shared})")
        else:
            check = Check(name, measured, low, high, "pass" if ok else "FAIL",
                          why if ok else fail_text(measured, low, high, why_fail))
    print(check)
    log_check(check)
    return check


def emulated_profile() -> str | None:
    """The GPU profile this run emulates (`GPULAB_PROFILE`), or None."""
    from gpulab.core.device import device_facts
    return device_facts().profile or None


def log_check(check: Check) -> None:
    """Append `check` as one JSON line to the file GPULAB_CHECKS names (nothing when it is unset): a run of
    the course leaves every pass, FAIL and skip with its lesson, GPU, profile and scale, which nbval's
    output does not keep. A file that cannot be written is said once in the output, not raised."""
    path = os.environ.get(CHECKS_ENV)
    if not path:
        return
    import json
    import time

    from gpulab.core.device import device_facts, scale
    facts = device_facts()
    row = {"lesson": _lesson, "name": check.name, "status": check.status, "measured": check.measured,
           "low": check.low, "high": check.high, "why": check.why, "gpu": facts.name,
           "profile": facts.profile or "", "scale": scale(), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
    except OSError as err:
        print(f"  (the check was not logged to {CHECKS_ENV}={path}: {err})")


def _shared_gpu() -> str:
    """The sharing note of this GPU ("" when it is used alone, or on the CPU): a MIG slice's neighbours or
    other processes (`monitor.sharing_mark`), or a room's time-sliced GPU (GPULAB_SHARED_GPU)."""
    try:
        from gpulab.core.monitor import sharing_mark
        return sharing_mark().get("shared", "")
    except Exception:          # noqa: BLE001 - a check must print even where NVML cannot be asked
        return ""


def fail_text(measured: float, low: float | None, high: float | None, why_fail: str) -> str:
    """What a FAIL says: which side of the band the value fell (or that it is not a number), then the
    check's own explanation."""
    digits = distinct_digits(measured, low, high)
    if not math.isfinite(measured):
        side = "not a finite number (a division by zero or a failed timing upstream)"
    elif low is not None and measured < low:
        side = f"below the band's low end {low:.{digits}g}"
    else:
        side = f"above the band's high end {high:.{digits}g}"
    return f"{measured:.{digits}g} is {side}: " + (why_fail or "this GPU did not show the expected effect")


def expect_band(lesson: str, measured: float | None, applies: bool = True, why_not: str = "",
                why: str = "", name: str | None = None, why_fail: str = "") -> Check:
    """`expect` with the band of lesson `lesson`'s headline for this GPU's class, read from
    `gpulab/core/bands.toml`: the one place a band is written (gpulab bench judges with the same).

    Skipped, with the reason, where the class has no band that applies (the CPU, a pre-Volta GPU for
    some lessons), and under a GPU profile where the band is of time: the timings are then this GPU's, not the
    profile's (a band of memory, `measures = "memory"`, is the model's, and judged).
    Where the lesson's module predicts a lower low end for this machine (`band_floor`: a host with two
    cores cannot run twelve workers), that is the low end, and it says why (`bands.judged_low`, as bench).
    """
    from gpulab.core.bands import gpu_class, judged_low, load_bands
    from gpulab.core.device import device_facts

    facts = device_facts()
    cls = gpu_class(facts)
    band = load_bands().band(cls, lesson)
    label = name or (band.metric if band else f"lesson {lesson} headline")
    if band is None or not band.applies:
        reason = band.why if band is not None else f"no band for lesson {lesson} in class {cls} (bands.toml)"
        return expect(label, measured, applies=False, why_not=why_not if not applies and why_not else reason)
    if facts.profile and band.measures == "time":
        return expect(label, measured, applies=False,
                      why_not=f"emulating the {facts.profile} profile: the band is a {cls} GPU's, the timing this "
                              "GPU's, so it is not judged")
    low = None if math.isinf(band.low) else band.low
    high = None if math.isinf(band.high) else band.high
    if applies and measured is not None and low is not None:
        low, lowered = judged_low(band, lesson_module(lesson))
        if low is None:    # this machine cannot show the effect at all: skipped with the reason
            return expect(label, measured, applies=False, why_not=lowered)
        if lowered:        # this machine cannot reach the class's low end (fewer cores, a slower link)
            print(f"  (the {cls} band's {lowered})")
    return expect(label, measured, low, high, applies=applies, why_not=why_not, why=why, why_fail=why_fail)


def show_table(rows: Sequence[Sequence[Any]], header: Sequence[str] | None = None,
               notes: Sequence[str] = ()) -> None:
    """Display rows as an HTML table (`gpulab.core.plots.table_html`: numbers to 4 significant figures, `notes`
    as lines below it; keep the cells short and put sentences in `notes`)."""
    display(HTML(table_html(rows, header, notes)))


def show_beside_reference(lesson: str) -> list[dict]:
    """The figures this lesson's prose quotes (tagged `<!-- fig ... -->` in its markdown), each beside
    your newest value of the same measurement from your results store, and how the two compare: the
    prose describes the reference runs it names, your table above describes yours. Returns the rows."""
    from gpulab.core.figures import beside
    from gpulab.core.results import current_gpu_name, results_store

    # every lesson's records: a prose figure may quote another lesson's (12 quotes notebook 00's read and write rates)
    rows = beside(lesson, results_store().records(), current_gpu_name())
    if not rows:
        display(Markdown("*This lesson's prose quotes no measured figure (or its notebook file is not under "
                         "`notebooks/` here), so there is nothing to set beside yours.*"))
        return rows

    def ref(r):
        lo, hi = r["reference_range"] or (None, None)
        return "none" if lo is None else sig(lo) if lo == hi else f"{sig(lo)} to {sig(hi)}"
    show_table([(r["figure"], r["record"], ref(r), "none" if r["yours"] is None else sig(r["yours"]),
                 r["regime"], r["reference"]) for r in rows],
               header=("in the prose", "measurement", "reference runs", "yours (newest)", "yours vs the reference",
                       "reference files (GPU)"),
               notes=["The prose quotes the reference runs named on the right (results/ in the repository); "
                      "yours come from your results store (GPULAB_RESULTS). A different GPU, a profile or the "
                      "tiny CPU size is a different regime: compare the shape of the effect, not the number."])
    return rows


def quiet_profiler_log() -> bool:
    """Before the first `torch.profiler` run of a CPU-only kernel: keep the profiler's C++ library (kineto)
    from printing "USDT: ... profiler_start" / "profiler_stop" to stderr, which a notebook shows as a red
    error box. Kineto reads KINETO_LOG_LEVEL once, when it first starts; level 6 is above its USDT level.

    On a GPU it changes nothing: there kineto's ERROR lines (CUPTI could not start, say) matter more.
    Returns whether the level was set here (False where it was set already, or on a GPU).
    """
    if pick_device().type == "cuda" or os.environ.get("KINETO_LOG_LEVEL"):
        return False
    os.environ["KINETO_LOG_LEVEL"] = "6"
    return True


PROFILE_COLUMNS = (   # (header, attribute of a key_averages() row, in microseconds or a count)
    ("self CPU", "self_cpu_time_total"), ("CPU total", "cpu_time_total"),
    ("self device", "self_device_time_total"), ("device total", "device_time_total"), ("calls", "count"),
)


def column_total(events, attr: str) -> float:
    """The total of a key_averages column the way PyTorch's own table adds it: a device-time column over
    the device's rows only (its kernels and copies, not the operators that launched them, which carry the
    same time again; not user annotations), any other column over every row. Summing a device column
    over every row counts each kernel twice (issue 24: 36.1 ms where PyTorch's table said 17.7)."""
    from torch.autograd import DeviceType
    if "device" not in attr:
        return float(sum(getattr(e, attr, 0) or 0 for e in events))
    total = 0.0
    for e in events:
        kind = getattr(e, "device_type", None)
        if kind == DeviceType.CPU and getattr(e, "is_legacy", False):
            total += getattr(e, attr, 0) or 0          # the legacy profiler kept kernel time on CPU rows
        elif kind is not None and kind != DeviceType.CPU and not getattr(e, "is_user_annotation", False):
            total += getattr(e, attr, 0) or 0
    return float(total)


def profile_rows(prof, sort_by: str = "self_cpu_time_total", row_limit: int = 10) -> tuple[list, list[str]]:
    """The rows `prof.key_averages().table(sort_by=, row_limit=)` prints, as (rows, header): the operator's
    name, its times in ms, its share of the `sort_by` column's total, its call count. Device columns appear
    only where the profile recorded device time."""
    events = list(prof.key_averages())
    total = column_total(events, sort_by) or 1.0
    has_device = any((getattr(e, "self_device_time_total", 0) or 0) > 0 for e in events)
    columns = [(h, a) for h, a in PROFILE_COLUMNS if has_device or "device" not in a]
    rows = []
    for e in sorted(events, key=lambda e: getattr(e, sort_by, 0) or 0, reverse=True)[:row_limit]:
        cells = [e.key]
        for _, attr in columns:
            v = getattr(e, attr, 0) or 0
            cells.append(str(v) if attr == "count" else sig(v / 1e3, "ms"))
        cells.insert(2, f"{100 * (getattr(e, sort_by, 0) or 0) / total:.1f}%")
        rows.append(cells)
    header = ["operator", columns[0][0], "% of total"] + [h for h, _ in columns[1:]]
    return rows, header


def profile_table(prof, sort_by: str = "self_cpu_time_total", row_limit: int = 10) -> None:
    """`prof.key_averages().table(...)` as an HTML table, whose columns stay aligned however wide the
    output area is (the text table is wider than a notebook and wraps)."""
    rows, header = profile_rows(prof, sort_by, row_limit)
    events = list(prof.key_averages())
    total_ms = column_total(events, sort_by) / 1e3
    show_table(rows, header, notes=[f"{sort_by.replace('_', ' ')}: {sig(total_ms, 'ms')} over all "
                                    f"{len(events)} operators; the {min(row_limit, len(events))} largest shown."])


def what_you_saw(rows: Sequence[tuple[str, Any]], title: str = "What you saw", keeps: Sequence[Any] = ()) -> None:
    """The closing table of a notebook: this run's measured numbers, with the device, and the notebook's
    last memory check (`memory.notebook_check`): what is allocated now against the notebook's start, plus
    `keeps`, what the notebook holds on purpose for its exercises. The check's line is printed below the
    table; under GPULAB_MEMORY_STRICT=1 a failed check raises MemoryNotReturned after the table is shown."""
    from gpulab.core.device import device_label, scale
    import torch

    memory = notebook_check(keeps, quiet=True, strict=False)
    if memory.after is None:
        at_end = "not measured (no CUDA allocator on the CPU)"
    elif memory.ok:
        at_end = f"back to the notebook's start ({fmt_bytes(memory.start)})" + (
            f", and {fmt_bytes(memory.kept)} kept on purpose" if memory.kept else "")
    else:
        at_end = f"{fmt_bytes(memory.held)} more than at the notebook's start (see the memory check)"
    rows = [*rows, ("memory allocated at the end", at_end)]
    body = "".join(f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(_fmt(v))}</td></tr>"
                   for k, v in rows)
    caption = (f"{device_label()}, torch {torch.__version__}, scale={scale()}"
               + ("" if pick_device().type == "cuda" else " — CPU: illustrative only"))
    display(HTML(f"<b>{html.escape(title)}</b> <i>({html.escape(caption)})</i>"
                 f"<table>{body}</table>"))
    print(memory.message())
    if strict_by_default() and not memory.ok:
        raise MemoryNotReturned(memory.message())


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return sig(v, digits=4)
    return str(v)


install_setup_guard()
