"""`gpulab bench`: each lesson's headline measurement, run headless, checked against its band.

For instructors and maintainers. Every entry of `REGISTRY` is a lesson module of `gpulab.lessons`:
its `headline(scale)` is the function its notebook's self-check calls, so the bench measures exactly
what the notebook does (the lesson checks the faster variant against the baseline before timing it
and returns a `Measured`); its `TITLE` and `HEADLINE` (the metric) name the row.

    report = run(select(["05", "07"]))      # what `gpulab bench --lessons 05,07` does
    print(format_table(report))

Bands come from `gpulab/core/bands.toml` (one per lesson and GPU class: `tensor-core`, the classes that narrow it
(`power-capped`, `geforce`, `pre-ampere`: gpulab.core.bands.gpu_class), `pre-volta`,
`cpu`), each with its source. A ratio inside its band passes; the CPU class and tiny-scale runs are
reported "n/a", never passed or failed. Adding a lesson: docs/adding-a-lesson.md.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Callable, Sequence

import torch

from gpulab.core.bands import Band, Bands, gpu_class, judged_low, load_bands
from gpulab.core.device import device_facts, pick_device, resolve_scale
from gpulab.core.measured import Measured, Skipped
from gpulab.core.results import FILE_KINDS, Record, ResultsStore, current_gpu_name, results_store
from gpulab.lessons import (l00_gpu_ceilings as L00, l01_measuring_time as L01, l03_input_pipeline as L03,
                            l04_occupancy_and_waves as L04, l05_pcie_transfers as L05, l06_mixed_precision as L06,
                            l07_tensor_core_alignment as L07, l08_cuda_streams as L08,
                            l09_activation_checkpointing as L09, l10_gradient_accumulation as L10,
                            l11_cuda_graphs as L11, l12_kernel_fusion as L12, l13_capstone as L13)

BENCH_KIND = FILE_KINDS["bench"]
BENCH_SCHEMA = 1
MiB, GiB = 2**20, 2**30

# Statuses of a row. --check fails on FAILING; n/a and skipped never pass or fail.
PASS, FAIL, NA, SKIPPED, WRONG, ERROR = "pass", "FAIL", "n/a", "skipped", "wrong", "error"
FAILING = (FAIL, WRONG, ERROR)


@dataclass(frozen=True)
class Experiment:
    """One registry entry: a lesson module, and how to read its ratio back from the results store.

    `from_store` reads the same ratio from a results-store file's records (those the notebook
    recorded), so `gpulab room` and the measured-on table can use notebook runs too; None if the
    notebook does not record it.
    """

    module: ModuleType
    from_store: Callable[[Sequence[Record]], list[float]] | None = None

    @property
    def lesson(self) -> str:
        """"03" for gpulab.lessons.l03_input_pipeline."""
        return self.module.__name__.rsplit(".", 1)[-1][1:3]

    @property
    def title(self) -> str:
        return self.module.TITLE

    @property
    def metric(self) -> str:
        return self.module.HEADLINE

    def run(self, scale: str | None = None) -> Measured:
        """The lesson's `headline(scale)`: what its notebook's self-check measures."""
        return self.module.headline(scale)


# -- reading ratios back from results-store records -----------------------------------------------
def _values(records: Sequence[Record], lesson: str, name: str) -> list[float]:
    return [r.value for r in records if r.lesson == lesson and r.name == name]


def _stored(lesson: str, name: str) -> Callable[[Sequence[Record]], list[float]]:
    """The notebook records the ratio itself under `name`."""
    return lambda records: _values(records, lesson, name)


def _stored_ratio(lesson: str, numerators: Sequence[str], denominator: str):
    """The notebook records both sides: the best of `numerators` / `denominator`, run by run (records
    of one notebook run are written together, so the k-th of each name belong to the k-th run)."""
    def read(records: Sequence[Record]) -> list[float]:
        tops = [v for v in (_values(records, lesson, n) for n in numerators) if v]
        dens = _values(records, lesson, denominator)
        if not tops or not dens:
            return []
        return [max(t) / d for *t, d in zip(*tops, dens) if d]
    return read


def _first_stored(lesson: str, names: Sequence[str]):
    """The first of `names` that the records hold (e.g. fp16 on a GPU, bf16 on the CPU)."""
    def read(records: Sequence[Record]) -> list[float]:
        for n in names:
            if found := _values(records, lesson, n):
                return found
        return []
    return read


REGISTRY: tuple[Experiment, ...] = (
    Experiment(L00, _stored_ratio("00", ("matmul_fp16", "matmul_bf16"), "matmul_fp32")),
    Experiment(L01),
    Experiment(L03, _stored("03", "speedup_best_vs_0")),
    Experiment(L04, _stored("04", "wave_step_ratio")),
    Experiment(L05, _stored_ratio("05", ("h2d_pinned_largest_gbps",), "h2d_pageable_largest_gbps")),
    Experiment(L06, _stored("06", "cnn_amp_speedup")),
    Experiment(L07, _first_stored("07", ("gemm_aligned_speedup_fp16", "gemm_aligned_speedup_bf16"))),
    Experiment(L08, _stored("08", "overlapped_vs_serial")),
    Experiment(L09, _stored("09", "peak_ratio_every_block")),
    Experiment(L10),
    Experiment(L11, _stored("11", "tiny_ops_speedup")),
    Experiment(L12, _stored("12", "eager_vs_compile")),
    Experiment(L13, _stored("13", "gpt_speedup_fastest")),
)


# Lessons whose headline comparison exists only as code in the notebook: not benched (see report).
NOT_IN_BENCH = {
    "02": "its headline is an outcome (an OOM under a memory cap, removed by a fix), not a ratio",
    "14": "it needs two or more GPUs and starts its own processes; run notebook 14",
}


# Lesson 15 is not a headline ratio: it is gpulab.diagnose's suite of labelled bad/fixed steps, whose
# confusion matrix and checks `run_suite` adds to the report (all lessons, or --lessons 15).
SUITE_LESSON = "15"


def wants_suite(lessons: Sequence[str] | None) -> bool:
    """Whether a bench over `lessons` (all when None) runs the diagnosis suite."""
    return not lessons or SUITE_LESSON in [str(x).strip().zfill(2) for x in lessons]


def select(lessons: Sequence[str] | None = None, registry: Sequence[Experiment] | None = None) -> list[Experiment]:
    """The entries for `lessons` (all when None), in registry order; ValueError naming what is unknown.
    Lesson 15 (the diagnosis suite, `run_suite`) selects no entry."""
    registry = REGISTRY if registry is None else registry
    if not lessons:
        return list(registry)
    wanted = [str(x).strip().zfill(2) for x in lessons if str(x).strip() and str(x).strip().zfill(2) != SUITE_LESSON]
    known = {e.lesson for e in registry}
    unknown = [x for x in wanted if x not in known]
    if unknown:
        why = "; ".join(f"{x}: " + (f"not in bench ({NOT_IN_BENCH[x]})" if x in NOT_IN_BENCH else "no such lesson")
                        for x in unknown)
        raise ValueError(f"{why}. Lessons in bench: {', '.join(sorted(known | {SUITE_LESSON}))}.")
    return [e for e in registry if e.lesson in wanted]


def judge(exp: Experiment, measured: Measured | None, bands: Bands, cls: str, size: str, profile: str | None = None) -> tuple[str, str, Band | None]:
    """(status, why, band) of one measurement. Wrong results fail; the CPU class and tiny runs are n/a."""
    band = bands.band(cls, exp.lesson)
    if band is not None and band.metric != exp.metric:
        return ERROR, (f"the band in {bands.path} [{cls}.{exp.lesson}] is for '{band.metric}', "
                       f"the bench measures '{exp.metric}'"), band
    if measured is None:
        return SKIPPED, "", band
    if not measured.correct:
        return WRONG, f"the optimized variant did not match the baseline: {measured.check}", band
    settings = bands.settings(cls)
    if settings.get("applies", True) is False:
        return NA, str(settings.get("why", "")), band
    if profile and (band is None or band.measures == "time"):
        return NA, (f"emulating the {profile} profile: the timings are this GPU's, not a {profile}'s, so bands "
                    "of time are judged only without a profile"), band
    if size != "full":
        return NA, "tiny scale: bands are for full-size runs", band
    if band is None:
        return NA, f"no band for lesson {exp.lesson} in class {cls} ({bands.path})", None
    if not band.applies:
        return NA, band.why, band
    if not math.isfinite(measured.ratio):
        return FAIL, f"ratio is {measured.ratio}", band
    low, lowered = judged_low(band, exp.module)         # this machine's own prediction (lesson 03: its cores)
    if low is None:                                      # this machine cannot show the effect at all
        return NA, lowered, band
    ok = low <= measured.ratio <= band.high
    if ok:
        return PASS, lowered, band
    return FAIL, f"outside [{_num(low)}, {_num(band.high)}]" + (f" ({lowered})" if lowered else ""), band


# -- running ----------------------------------------------------------------------------------
@dataclass
class Row:
    lesson: str
    title: str
    metric: str
    status: str
    why: str = ""
    baseline: float | None = None
    optimized: float | None = None
    unit: str = ""
    baseline_label: str = ""
    optimized_label: str = ""
    ratio: float | None = None
    correct: bool | None = None
    check: str = ""
    notes: str = ""
    band_low: float | None = None
    band_high: float | None = None
    band_source: str = ""
    seconds: float = 0.0


@dataclass
class Report:
    run_id: str
    gpu: str
    gpu_class: str
    device: str
    torch: str
    cuda: str | None
    scale: str
    time: str
    host: str
    bands_file: str
    rows: list[Row] = field(default_factory=list)
    not_in_bench: dict[str, str] = field(default_factory=dict)
    suite: dict | None = None       # gpulab.diagnose's suite (lesson 15): its SuiteResult.to_dict()

    @property
    def failed(self) -> list[Row]:
        return [r for r in self.rows if r.status in FAILING]

    @property
    def suite_failed(self) -> list[dict]:
        """The diagnosis suite's checks that failed (a skipped check, ok None, never fails)."""
        return [c for c in (self.suite or {}).get("checks", []) if c["ok"] is False]

    def to_json(self) -> dict:
        out = {"kind": BENCH_KIND, "schema": BENCH_SCHEMA, **asdict(self)}
        for row in out["rows"]:                     # JSON has no inf or nan: an open bound is null
            for k, v in row.items():
                if isinstance(v, float) and not math.isfinite(v):
                    row[k] = None
        return out


class Progress:
    """A plain progress bar on stderr: redrawn in place on a terminal, one line per step otherwise."""

    def __init__(self, total: int, stream=None, width: int = 24):
        self.total, self.width, self.done = total, width, 0
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.perf_counter()

    def show(self, label: str) -> str:
        filled = self.width * self.done // max(self.total, 1)
        line = (f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
                f"{time.perf_counter() - self.t0:5.0f} s  {label}")
        if self.tty:
            self.stream.write("\r" + line[:100].ljust(100))
            self.stream.flush()
        return line

    def step(self, label: str) -> None:
        self.done += 1
        line = self.show(label)
        if not self.tty:                 # a log file: one line per finished step
            self.stream.write(line + "\n")
            self.stream.flush()
        if self.tty and self.done == self.total:
            self.stream.write("\n")
            self.stream.flush()


def run(experiments: Sequence[Experiment] | None = None, bands: Bands | None = None,
        progress: bool = True, stream=None, scale: str | None = None) -> Report:
    """Run each lesson's headline once at `scale` (default: the course's; skipped where it cannot run
    here, its error caught and reported), judge it against this GPU class's band, and return the
    report. Nothing is written."""
    from gpulab.core.memory import memory_guard

    experiments = list(REGISTRY if experiments is None else experiments)
    bands = bands or load_bands()
    device = pick_device()
    facts = device_facts(device)
    cls, size = gpu_class(facts), resolve_scale(scale)
    now = dt.datetime.now(dt.timezone.utc)
    report = Report(run_id=f"{socket.gethostname()}-{now.strftime('%Y%m%dT%H%M%S%fZ')}",
                    gpu=current_gpu_name(), gpu_class=cls, device=device.type, torch=torch.__version__,
                    cuda=torch.version.cuda, scale=size, time=now.isoformat(timespec="seconds"),
                    host=socket.gethostname(), bands_file=bands.path,
                    not_in_bench={k: v for k, v in NOT_IN_BENCH.items()})
    bar = Progress(len(experiments), stream) if progress else None
    for exp in experiments:
        if bar:
            bar.show(f"{exp.lesson} {exp.title} ...")
        t0 = time.perf_counter()
        measured, why_run, status = None, "", None
        try:
            with memory_guard(quiet=True) as guard:
                measured = exp.run(size)
        except Skipped as err:
            why_run = str(err)
        except AssertionError as err:           # a gpulab check refused a wrong result before timing
            status, why_run = WRONG, f"wrong result: {err}"
        except Exception as err:  # noqa: BLE001 - one broken lesson must not stop the bench
            status, why_run = ERROR, f"{type(err).__name__}: {err}"
        seconds = time.perf_counter() - t0
        judged, why, band = judge(exp, measured, bands, cls, size, facts.profile)
        row = Row(exp.lesson, exp.title, exp.metric, status or judged, why_run or why, seconds=seconds)
        if band is not None and band.applies:
            row.band_low, row.band_high = band.low, band.high
        if band is not None:
            row.band_source = band.source
        if measured is not None:
            row.baseline, row.optimized, row.unit = measured.baseline, measured.optimized, measured.unit
            row.baseline_label, row.optimized_label = measured.baseline_label, measured.optimized_label
            row.ratio, row.correct, row.check, row.notes = measured.ratio, measured.correct, measured.check, measured.notes
            if not guard.ok:
                row.notes = (row.notes + "; " if row.notes else "") + guard.message()
        report.rows.append(row)
        if bar:
            bar.step(f"{exp.lesson} {exp.title}: {row.status}")
    return report


# -- output -----------------------------------------------------------------------------------
def _num(v: float | None, unit: str = "") -> str:
    if v is None:
        return "-"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.4g}" + (f" {unit}" if unit else "")


def band_text(low: float | None, high: float | None) -> str:
    if low is None and high is None:
        return "-"
    if low is None or math.isinf(low):
        return f"<= {_num(high)}"
    if high is None or math.isinf(high):
        return f">= {_num(low)}"
    return f"{_num(low)} - {_num(high)}"


def table_rows(report: Report) -> list[tuple[str, ...]]:
    """(lesson, headline, baseline, optimized, ratio, band, status) per row, as printed."""
    rows = []
    for r in report.rows:
        rows.append((r.lesson, r.metric,
                     f"{_num(r.baseline, r.unit)} ({r.baseline_label})" if r.baseline is not None else "-",
                     f"{_num(r.optimized, r.unit)} ({r.optimized_label})" if r.optimized is not None else "-",
                     f"{r.ratio:.3g}x" if r.ratio is not None else "-",
                     band_text(r.band_low, r.band_high), r.status))
    return rows


def format_table(report: Report) -> str:
    """The bench's one table, a line per failed, wrong, skipped or n/a row saying why, and what is not benched."""
    header = ("lesson", "headline", "baseline", "optimized", "ratio", "band", "status")
    rows = table_rows(report)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [f"gpulab bench on {report.gpu} (class {report.gpu_class}), torch {report.torch}, "
           f"scale={report.scale}, {report.time}", "", line(header), line(tuple("-" * w for w in widths))]
    out += [line(r) for r in rows]
    notes = [f"  {r.lesson} {r.status}: {r.why}" for r in report.rows if r.why]
    notes += [f"  {r.lesson} note: {r.notes}" for r in report.rows if r.notes]
    if notes:
        out += ["", *notes]
    if report.not_in_bench:
        out += ["", "not in bench: " + "; ".join(f"{k} ({v})" for k, v in sorted(report.not_in_bench.items()))]
    if report.device != "cuda":
        out += ["", "CPU run: tiny sizes, the numbers are illustrative only; bands are not applicable."]
    failed = report.failed
    out += ["", f"{len(failed)} row(s) failed: {', '.join(r.lesson for r in failed)}" if failed
            else "no row failed."]
    return "\n".join(out)


def default_json_path(report: Report) -> Path:
    """Where the JSON goes without --json: beside the results store, named for the GPU and time."""
    from gpulab.core.results import default_path

    slug = "".join(c if c.isalnum() else "-" for c in report.gpu.lower()).strip("-") or "gpu"
    stamp = report.time.replace(":", "").replace("-", "").replace("+0000", "Z")
    return default_path().parent / "bench" / f"{slug}-{stamp}.json"


def write_json(report: Report, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report.to_json(), indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def record(report: Report, store: ResultsStore | None = None) -> int:
    """Write each measured row into the results store as `bench_ratio` of its lesson; returns how many."""
    store = store or results_store()
    n = 0
    for r in report.rows:
        if r.ratio is None or not math.isfinite(r.ratio):
            continue
        store.record(r.lesson, "bench_ratio", r.ratio, "x", scale=report.scale, metric=r.metric, status=r.status,
                     baseline=r.baseline, optimized=r.optimized, value_unit=r.unit, run_id=report.run_id,
                     band_low=None if r.band_low is None or math.isinf(r.band_low) else r.band_low,
                     band_high=None if r.band_high is None or math.isinf(r.band_high) else r.band_high)
        n += 1
    return n


# -- lesson 15: the diagnosis suite ------------------------------------------------------------------
def run_suite(report: Report, scale: str | None = None, progress: bool = True, stream=None) -> dict:
    """gpulab.diagnose's labelled cases on this device (gpulab.diagnose.suite), into `report.suite`."""
    from gpulab.diagnose.suite import run_suite as diagnose_suite

    stream = stream if stream is not None else sys.stderr
    say = (lambda text: (stream.write(f"15 diagnose suite: {text}\n"), stream.flush())) if progress else None
    result = diagnose_suite(scale, progress=say)
    report.suite = result.to_dict()
    report.suite["text"] = result.matrix_text()
    return report.suite


def format_suite(suite: dict) -> str:
    """The suite's confusion matrix and its checks, one line each (ok / FAIL / skipped, and why)."""
    marks = {True: "ok", False: "FAIL", None: "skipped"}
    lines = ["", suite["text"], "", "checks:"]
    lines += [f"  {marks[c['ok']]:<7} {c['name']}: {c['why']}" for c in suite["checks"]]
    failed = [c for c in suite["checks"] if c["ok"] is False]
    lines.append(f"{len(failed)} check(s) failed." if failed else "no check failed.")
    return "\n".join(lines)


def record_suite(report: Report, store: ResultsStore | None = None) -> int:
    """The suite's per-case figures into the results store (lesson 15): each ran case's measured gain
    against its bound; returns how many records."""
    store = store or results_store()
    n = 0
    for c in (report.suite or {}).get("cases", []):
        bad, fixed = c.get("bad"), c.get("fixed")
        if c.get("status") != "ran" or not bad:
            continue
        fired = {v["rule"]: v for v in bad["verdicts"]}
        top = bad["verdicts"][0] if bad["verdicts"] else None
        v = fired.get(c["rule"]) if c.get("rule") else None
        if fixed and v and bad.get("steady_ms") and fixed.get("steady_ms"):
            store.record("15", "suite_gain", bad["steady_ms"] / fixed["steady_ms"], "x", scale=report.scale,
                         case=c["name"], rule=c["rule"], bound=v.get("bound"), share=v.get("share"),
                         bad_ms=bad["steady_ms"], fixed_ms=fixed["steady_ms"], run_id=report.run_id,
                         top_lesson=top["lesson"] if top else None)
            n += 1
        elif c.get("rule") is None and top is not None:      # the capstone: its largest promise
            fixes = [x for x in bad["verdicts"] if x.get("actionable", True)]
            store.record("15", "suite_capstone_largest_bound", max([x["bound"] or math.inf for x in fixes], default=1.0),
                         "x", scale=report.scale, run_id=report.run_id, mfu=bad.get("mfu"))
            n += 1
    return n
