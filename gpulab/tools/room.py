"""A room of learners: merge everyone's results into one comparison across GPUs.

An instructor collects each learner's results store (`~/.gpulab/results.json`, any name) and
`gpulab bench` JSON files into one folder, then

    room = merge("collected/")          # `gpulab room collected/ --png room.png`
    print(format_table(room))           # lesson x GPU model: median ratio and run count
    room_plot(room)                     # grouped bars, one group per lesson

Each lesson's headline ratio comes from bench files directly, and from results stores through
the bench registry's `from_store` (the ratio the notebook itself recorded). Files of older
versions are read as far as they go; a file that is not JSON, is cut off, or has another shape
is reported in `room.bad` and skipped, never crashing the merge and never moved or changed; so
is anything else named *.json that is not a readable file (a folder, a broken symbolic link).
A ratio that no real run can produce (not finite, not positive, or outside MIN_RATIO..MAX_RATIO)
is skipped and listed in `room.refused` with the reason. Records made under a GPU profile (marked
`profile`) are left out: their timings are the GPU that emulated it, filed under neither.
`measured_on_block` turns the committed `results/` folder into the "measured on" table of docs/results.md.
"""
from __future__ import annotations

import json
import math
import os
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable
from matplotlib.figure import Figure
from gpulab.tools.bench import BENCH_KIND, ERROR, REGISTRY, WRONG, Experiment
from gpulab.core.bands import load_bands
from gpulab.core.results import FILE_KINDS, Record, ResultsFileError, read_records, record_profile


README_START = "<!-- measured-on:start -->"


README_END = "<!-- measured-on:end -->"


# The plausible range of a headline ratio. Every headline is the ratio of two quantities one
# lesson measures on one machine: times from about 1 us (a single launch) to about 100 s, and
# rates or memory sizes within the same eight decades. So no real run gives a ratio beyond 1e8
# or below 1e-8; one that does comes from a broken or hand-edited file. The widest real ones are
# far inside: lesson 01's synced / unsynced time is ~1e3 on an H200 and ~1e5 on the slowest
# GPU the course supports; the bands span 0.1 to 100. The bound also keeps the chart's log axis
# finite (matplotlib overflows on a ratio like 1e308).
MAX_RATIO = 1e8
MIN_RATIO = 1e-8


class RoomFileError(ValueError):
    """A file in the folder is neither a results store nor a bench JSON this version can read."""


@dataclass(frozen=True)
class Measurement:
    gpu: str            # the column: the GPU's name, "(tiny)" added for tiny-scale runs
    lesson: str
    metric: str
    value: float
    source: str         # the file it came from
    kind: str           # "bench" (a bench JSON) or "store" (a results store)
    torch: str = "?"
    time: str = ""
    run_id: str = ""


@dataclass(frozen=True)
class BadFile:
    path: str
    why: str


@dataclass(frozen=True)
class Refused:
    """A ratio read from a file but not merged: no real run can produce it."""
    path: str
    gpu: str
    lesson: str
    metric: str
    value: float
    why: str


def implausible(value: float) -> str | None:
    """Why a headline ratio cannot come from a real run (see MAX_RATIO), or None if it can."""
    if not math.isfinite(value):
        return "not a finite number"
    if value <= 0:
        return "not positive"
    if value > MAX_RATIO:
        return f"beyond the plausible bound {MAX_RATIO:g}"
    if value < MIN_RATIO:
        return f"below the plausible bound {MIN_RATIO:g}"
    return None


@dataclass
class Room:
    folder: str
    measurements: list[Measurement] = field(default_factory=list)
    bad: list[BadFile] = field(default_factory=list)
    files: list[tuple[str, str, int]] = field(default_factory=list)   # (path, kind, measurements)
    skipped_rows: int = 0       # rows or records inside good files that could not be used
    refused: list[Refused] = field(default_factory=list)   # ratios no real run can produce

    @property
    def gpus(self) -> list[str]:
        return sorted({m.gpu for m in self.measurements})

    def to_json(self) -> dict:
        return {"folder": self.folder, "files": [dict(zip(("path", "kind", "measurements"), f)) for f in self.files],
                "bad": [asdict(b) for b in self.bad], "skipped_rows": self.skipped_rows,
                "refused": [{**asdict(r), "value": repr(r.value)} for r in self.refused],   # JSON has no inf
                "measurements": [asdict(m) for m in self.measurements],
                "table": [{"lesson": lesson, "metric": metric, "gpu": gpu, "median": med, "count": n}
                          for (lesson, metric), by_gpu in cells(self).items() for gpu, (med, n) in by_gpu.items()]}


def _column(gpu: str, size: Any) -> str:
    return gpu if size in (None, "", "full") else f"{gpu} ({size})"


def _real(v: Any) -> bool:
    """A number (inf and nan included: `merge` refuses those with the reason); not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# -- reading one file -------------------------------------------------------------------------
def read_bench(data: dict, source: str) -> tuple[list[Measurement], int]:
    """Measurements of a bench JSON (any schema so far): rows with a numeric ratio whose result
    was not wrong (`merge` then refuses implausible ratios). Returns them and how many rows were
    left out."""
    gpu = data.get("gpu")
    rows = data.get("rows")
    if not isinstance(gpu, str) or not gpu:
        raise RoomFileError("a bench file without the GPU's name")
    if not isinstance(rows, list):
        raise RoomFileError("a bench file without a list of rows")
    out, skipped = [], 0
    column = _column(gpu, data.get("scale"))
    for row in rows:
        ok = (isinstance(row, dict) and isinstance(row.get("lesson"), str) and isinstance(row.get("metric"), str)
              and _real(row.get("ratio")) and row.get("status") not in (WRONG, ERROR) and row.get("correct") is not False)
        if not ok:
            skipped += 1
            continue
        out.append(Measurement(column, row["lesson"], row["metric"], float(row["ratio"]), source, "bench",
                               str(data.get("torch", "?")), str(data.get("time", "")), str(data.get("run_id", ""))))
    return out, skipped


def read_store(records: list[Record], source: str,
               registry: Iterable[Experiment] | None = None, profiles: bool = False) -> list[Measurement]:
    """Headline ratios in a results store: `bench_ratio` records written by `gpulab bench`, and the
    ratios notebooks recorded, read through each registry entry's `from_store`. Records made under a GPU
    profile are left out unless `profiles` (a room whose learners all ran under the same one)."""
    registry = REGISTRY if registry is None else tuple(registry)
    groups: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for r in records:
        if profiles or record_profile(r) is None:   # under a profile the timings are another GPU's
            groups[(r.gpu, r.scale)].append(r)
    out = []
    for (gpu, size), recs in sorted(groups.items()):
        column = _column(gpu, size)
        for r in recs:
            if r.name == "bench_ratio" and isinstance(r.extra.get("metric"), str) and _real(r.value):
                out.append(Measurement(column, r.lesson, r.extra["metric"], r.value, source, "store", r.torch,
                                       r.time, str(r.extra.get("run_id", ""))))
        for exp in registry:
            if exp.from_store is None:
                continue
            mine = [r for r in recs if r.lesson == exp.lesson and r.name != "bench_ratio"]
            for v in exp.from_store(mine):
                if _real(v):
                    out.append(Measurement(column, exp.lesson, exp.metric, float(v), source, "store",
                                           mine[-1].torch, mine[-1].time))
    return out


# Files that hold no lesson's measurements, by their kind (gpulab.core.results.FILE_KINDS): the diagnosis zoo's and
# suite's verdicts, the exercises' proof and the reference answers' runs (read by `python -m gpulab.diagnose.zoo judge`), a run folder's manifest (results_index), and
# roomrun's timings, exit codes and summary (its learners' stores hold the records)
ZOO_KIND = FILE_KINDS["zoo"]
DIAGNOSIS_KINDS = (FILE_KINDS["zoo"], FILE_KINDS["suite"], FILE_KINDS["proof"], FILE_KINDS["answers"])
MANIFEST_KIND = FILE_KINDS["manifest"]
ROOMRUN_KIND = FILE_KINDS["roomrun"]


def read_file(path: str | os.PathLike, registry: Iterable[Experiment] | None = None) -> tuple[str, list[Measurement], int]:
    """(kind, measurements, rows left out) of one file; RoomFileError if it is of no use at all."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RoomFileError("not UTF-8 text") from None
    except OSError as err:
        raise RoomFileError(f"cannot be read ({err.strerror or err})") from None
    try:
        data = json.loads(text)
    except ValueError as err:
        raise RoomFileError(f"not JSON, or cut off ({err})") from None
    if isinstance(data, dict) and str(data.get("kind", "")).startswith(DIAGNOSIS_KINDS):
        return "zoo", [], 0             # the diagnosis zoo's and suite's verdicts: no lesson's measurements
    if isinstance(data, dict) and data.get("kind") == MANIFEST_KIND:
        return "manifest", [], 0        # a run folder's manifest: what ran, read by results_index
    if isinstance(data, dict) and str(data.get("kind", "")).startswith(ROOMRUN_KIND):
        return "roomrun", [], 0         # roomrun's timings, exit codes and summary: its learners' stores hold the records
    if isinstance(data, dict) and data.get("kind") == BENCH_KIND:
        found, skipped = read_bench(data, str(path))
        return "bench", found, skipped
    if isinstance(data, dict) and "records" in data:
        try:
            records = read_records(path)            # gpulab.core.results' own tolerant reader
        except ResultsFileError as err:
            raise RoomFileError(f"a results store gpulab cannot read ({err})") from None
        raw = data["records"]
        return "store", read_store(records, str(path), registry), len(raw) - len(records)
    raise RoomFileError("JSON, but neither a gpulab results store nor a `gpulab bench` file")


def merge(folder: str | os.PathLike, registry: Iterable[Experiment] | None = None) -> Room:
    """Every *.json under `folder` (sub-folders too), merged. Bad files are listed in `bad`."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder")
    registry = REGISTRY if registry is None else tuple(registry)
    room = Room(str(folder))
    seen_runs: set[tuple[str, str, str]] = set()
    for path in sorted(folder.rglob("*.json")):
        if not path.is_file():          # named *.json, but nothing to read: say why, never silently
            room.bad.append(BadFile(str(path), _not_a_file(path)))
            continue
        try:
            kind, found, skipped = read_file(path, registry)
        except RoomFileError as err:
            room.bad.append(BadFile(str(path), str(err)))
            continue
        kept = []
        for m in found:                 # a bench run both in its JSON and in a results store: once
            why = implausible(m.value)
            if why:
                room.refused.append(Refused(str(path), m.gpu, m.lesson, m.metric, m.value, why))
                continue
            key = (m.run_id, m.lesson, m.metric)
            if m.run_id and key in seen_runs:
                continue
            seen_runs.add(key)
            kept.append(m)
        room.measurements += kept
        room.files.append((str(path), kind, len(kept)))
        room.skipped_rows += skipped
    return room


def _not_a_file(path: Path) -> str:
    """Why a *.json entry that is not a regular file was skipped."""
    if path.is_symlink():
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return f"a broken symbolic link (to {target}, which does not exist or loops)"
    if path.is_dir():
        return "a folder, not a file (any *.json inside it is read on its own)"
    return "not a regular file"


# -- the comparison ---------------------------------------------------------------------------
def cells(room: Room, measurements: Iterable[Measurement] | None = None) -> dict[tuple[str, str], dict[str, tuple[float, int]]]:
    """(lesson, metric) -> GPU -> (median, number of runs)."""
    values: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for m in room.measurements if measurements is None else measurements:
        values[(m.lesson, m.metric)][m.gpu].append(m.value)
    return {key: {gpu: (statistics.median(vs), len(vs)) for gpu, vs in sorted(by_gpu.items())}
            for key, by_gpu in sorted(values.items())}


def _cell(v: tuple[float, int] | None) -> str:
    if v is None:
        return "-"
    med, n = v
    return f"{med:.3g}x" + (f" (median of {n})" if n > 1 else "")


def _grid(header: list[str], rows: list[list[str]], markdown: bool) -> list[str]:
    if markdown:
        return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                *("| " + " | ".join(r) + " |" for r in rows)]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    fmt = lambda cs: "  ".join(c.ljust(w) for c, w in zip(cs, widths)).rstrip()  # noqa: E731
    return [fmt(header), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)]


def format_table(room: Room, markdown: bool = False) -> str:
    """Lesson x GPU model: the median headline ratio (and how many runs), then what was skipped."""
    table = cells(room)
    gpus = room.gpus
    out = [f"{len(room.files)} file(s) merged from {room.folder}, {len(room.bad)} bad file(s) skipped", ""]
    if table:
        rows = [[lesson, metric, *(_cell(by_gpu.get(g)) for g in gpus)] for (lesson, metric), by_gpu in table.items()]
        out += _grid(["lesson", "headline", *gpus], rows, markdown)
    else:
        out.append("no headline ratios found" + (" (the folder has no *.json files)" if not room.files and not room.bad else ""))
    if room.bad:
        out += ["", "bad files (skipped):", *(f"  {b.path}: {b.why}" for b in room.bad)]
    if room.refused:
        out += ["", f"implausible ratios (skipped; a real run gives {MIN_RATIO:g} to {MAX_RATIO:g}):",
                *(f"  {r.path}: {r.gpu}, lesson {r.lesson} ({r.metric}) = {r.value:.4g}: {r.why}" for r in room.refused)]
    if room.skipped_rows:
        out += ["", f"{room.skipped_rows} row(s) or record(s) inside good files could not be used "
                    "(malformed, or a wrong result)"]
    return "\n".join(out)


def room_plot(room: Room, title: str = "Headline ratio per lesson and GPU (median of runs)") -> Figure:
    """Grouped bars: one group per lesson, one bar per GPU model, log scale (ratios span 0.2x to 1000x)."""
    from gpulab.core.plots import COLORS, STYLE, figure, styled
    import matplotlib.pyplot as plt

    table = cells(room)
    keys = list(table)
    gpus = room.gpus
    fig, (ax,) = figure(figsize=(max(5.0, 0.9 * len(keys) * max(1, len(gpus)) ** 0.5 + 2.5), 3.8))
    with plt.rc_context(STYLE):
        if not keys:
            ax.text(0.5, 0.5, "no headline ratios in this folder", ha="center", va="center",
                    transform=ax.transAxes)
            ax.set_axis_off()
        else:
            width = 0.8 / max(len(gpus), 1)
            for j, gpu in enumerate(gpus):
                xs, ys = [], []
                for i, key in enumerate(keys):
                    if gpu in table[key]:
                        xs.append(i - 0.4 + width * (j + 0.5))
                        ys.append(table[key][gpu][0])
                ax.bar(xs, ys, width=width, label=gpu, color=COLORS[j % len(COLORS)])
            ax.axhline(1.0, lw=1, color="#555555")
            ax.set_yscale("log")
            ax.set_xticks(range(len(keys)), [lesson for lesson, _ in keys])
            ax.set_xlabel("lesson (headline ratio as in `gpulab bench`)")
            ax.set_ylabel("ratio (x)")
            ax.legend(fontsize=8)
        ax.set_title(title)
    return styled(fig)


# -- docs/results.md's "measured on" block --------------------------------------------------------
def measured_on_block(folder: str | os.PathLike, label: str | None = None) -> str:
    """docs/results.md's "measured on" tables, from the results files in `folder` (full-size runs only).

    Per GPU: the newest bench JSON if there is one, else the median of every results store's
    headline ratios. `label` names the folder in the table (default: its own name).
    """
    room = merge(folder)
    label = label or Path(folder).name
    bands = load_bands()
    full = [m for m in room.measurements if not m.gpu.endswith(")")]
    used: list[Measurement] = []
    for gpu in sorted({m.gpu for m in full}):
        mine = [m for m in full if m.gpu == gpu]
        benches = sorted({(m.time, m.source) for m in mine if m.kind == "bench"})
        used += [m for m in mine if m.source == benches[-1][1]] if benches else mine

    def rel(source: str) -> str:
        return f"`{label}/{Path(source).relative_to(folder).as_posix()}`"

    gpus = sorted({m.gpu for m in used})
    runs = []
    for gpu in gpus:
        mine = [m for m in used if m.gpu == gpu]
        kind = "`gpulab bench` JSON" if mine[0].kind == "bench" else "notebook runs (results store)"
        runs.append([gpu, ", ".join(sorted({m.torch for m in mine})), max(m.time for m in mine)[:10],
                     f"{kind}: " + ", ".join(rel(s) for s in sorted({m.source for m in mine}))])
    table = cells(room, used)
    by_lesson = {e.lesson: e for e in REGISTRY}
    rows = []
    for (lesson, metric), by_gpu in table.items():
        band = bands.band("tensor-core", lesson)
        band_txt = "-" if band is None or not band.applies or band.metric != metric else \
            f"{band.low:g} - {band.high:g}".replace("inf", "&infin;")
        title = by_lesson[lesson].title if lesson in by_lesson else ""
        rows.append([lesson, f"{title}: {metric}" if title else metric, band_txt,
                     *(_cell(by_gpu.get(g)) for g in gpus)])
    lines = [README_START,
             "<!-- generated by `gpulab report --readme docs/results.md` from results/; do not edit by hand -->", ""]
    if not used:
        lines.append("No full-size GPU results are committed yet.")
    else:
        lines += _grid(["GPU", "torch", "date (UTC)", "from"], runs, markdown=True)
        lines += ["", *_grid(["lesson", "headline ratio", "band (Tensor-Core GPUs)", *gpus], rows, markdown=True)]
    lines += ["", README_END]
    return "\n".join(lines)


def update_readme(readme: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """Rewrite the block between the markers in `readme` from `folder`; True if it changed."""
    readme = Path(readme)
    text = readme.read_text(encoding="utf-8")
    if README_START not in text or README_END not in text:
        raise ValueError(f"{readme} has no {README_START} ... {README_END} block to rewrite")
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    new = head + measured_on_block(folder) + tail
    if new != text:
        readme.write_text(new, encoding="utf-8")
    return new != text


def readme_block(readme: str | os.PathLike) -> str | None:
    """The block between the markers as it stands in `readme`, or None without markers."""
    text = Path(readme).read_text(encoding="utf-8")
    if README_START not in text or README_END not in text:
        return None
    return README_START + text.split(README_START, 1)[1].split(README_END, 1)[0] + README_END


# -- the live room: one row per learner ---------------------------------------------------------------
@dataclass(frozen=True)
class Learner:
    name: str           # the results file's name without .json (the hub writes <learner>.json)
    gpu: str
    lessons: tuple      # lessons with at least one record, in order
    records: int
    last: str           # the newest record's time (UTC, as recorded)
    marks: tuple        # "tiny", "profile <key>", "shared" (a MIG slice or other processes on the GPU)
    problem: str = ""   # why the file could not be read this time (half-written, not a results store)


def learners(folder: str | os.PathLike) -> list[Learner]:
    """One row per results store in `folder` (bench files and other JSON are left to `merge`): what each
    learner has run so far, on which GPU, under which marks. A file that is being written, cut off or not a
    results store gets a row that says so, and the next look reads it again; nothing is moved or changed."""
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder")
    rows = []
    for path in sorted(root.glob("*.json")):
        name = path.stem
        try:
            if not path.is_file():
                raise ResultsFileError(_not_a_file(path))
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise ResultsFileError(f"not readable JSON yet ({type(err).__name__}): half-written or not a store")
            if isinstance(data, dict) and data.get("kind") == BENCH_KIND:
                continue                            # a bench file: the lesson table reads it
            records = read_records(path)
        except (OSError, ResultsFileError) as err:
            rows.append(Learner(name, "", (), 0, "", (), str(err)))
            continue
        marks = []
        if any(r.scale == "tiny" for r in records):
            marks.append("tiny")
        profiles = sorted({record_profile(r) for r in records} - {None, ""})
        marks += [f"profile {p}" for p in profiles]
        if any(r.extra.get("shared") for r in records):
            marks.append("shared")
        lessons = tuple(sorted({r.lesson for r in records}))
        gpus = sorted({r.gpu for r in records})
        rows.append(Learner(name, ", ".join(gpus) or "-", lessons, len(records),
                            max((r.time for r in records), default=""), tuple(marks)))
    return rows


def format_learners(rows: list[Learner], markdown: bool = False) -> str:
    header = ["learner", "GPU", "lessons", "records", "last record", "marks"]
    body = [[r.name, r.gpu or "-", " ".join(r.lessons) or "-", str(r.records), r.last or "-",
             ", ".join(r.marks) if not r.problem else f"not read: {r.problem}"] for r in rows]
    lines = _grid(header, body, markdown)
    lines.append(f"{len(rows)} learner(s); marks: shared = a MIG slice or other processes on the GPU (timings "
                 "noisier), profile = timings of the GPU that emulated it, tiny = CPU-sized run")
    return "\n".join(lines)


# -- the exercises' board: each learner's graded exercises ------------------------------------------------------------
@dataclass(frozen=True)
class BoardRow:
    learner: str
    exercise: str       # "01.sync"
    state: str          # passed, failed, suspicious, cannot run, error
    ratio: float | None
    target: float | None
    judged: bool        # the speed was judged (a GPU where the lesson's fix gains): a verified pass
    who: str            # "you" (the learner's own), "reference" (the solution), ...
    time: str
    note: str = ""      # the speedrun: its mean time to the target loss, and whether it is a new best


def exercise_board(folder: str | os.PathLike) -> list[BoardRow]:
    """The newest verdict of each learner's own submission to each graded exercise (`gpulab.exercises` records
    `exercise <name>`), from the results stores in `folder`; a file that cannot be read is left to `learners`."""
    rows = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            records = read_records(path)
        except (OSError, ResultsFileError, ValueError):
            continue
        newest: dict[str, Record] = {}
        for r in records:
            if r.name.startswith("exercise ") and r.extra.get("who", "you") == "you":
                newest[r.name.removeprefix("exercise ")] = r
        runs = [r for r in records if r.name == "speedrun" and r.extra.get("who", "you") == "you"]
        if runs:       # the best of the newest run's race (its GPU, scale and profile: a tiny CPU run is another)
            from gpulab.exercises.speedrun import race
            best = min((r for r in runs if race(r) == race(runs[-1])), key=lambda r: r.value)
            e = best.extra
            rows.append(BoardRow(path.stem, "13.speedrun", str(e.get("state", "?")), None, None, False, "you",
                                 best.time, f"{best.value:.2f} s +- {float(e.get('ci_s') or 0):.2f} to the loss over "
                                            f"{e.get('seeds', '?')} seeds" + (", a new best" if e.get("new_best") else "")))
        for name, r in sorted(newest.items()):
            e = r.extra
            # a verdict reached before timing (a patched timer, not the same training) has no ratio: stored as 0
            rows.append(BoardRow(path.stem, name, str(e.get("state", "?")), r.value or None,
                                 e.get("target"), bool(e.get("speed_judged")),
                                 str(e.get("who", "you")), r.time))
    return rows


def format_board(rows: list[BoardRow], markdown: bool = False) -> str:
    def verdict(r: BoardRow) -> str:
        if r.note:
            return r.note
        if r.state == "passed":
            return "verified" if r.judged else "correct (speed not judged here)"
        return {"suspicious": "SUSPICIOUS: check it", "failed": "not yet"}.get(r.state, r.state)
    body = [[r.learner, r.exercise, r.state, "-" if r.ratio is None else f"{r.ratio:.2f}x",
             "-" if r.target is None or not r.judged else f"{r.target:.2f}x", verdict(r), r.time] for r in rows]
    lines = _grid(["learner", "exercise", "state", "ratio", "target", "verdict", "when"], body, markdown)
    passed = sum(r.state == "passed" for r in rows)
    lines.append(f"{len(rows)} submission(s) by {len({r.learner for r in rows})} learner(s): {passed} passed "
                 f"({sum(r.state == 'passed' and r.judged for r in rows)} verified by speed on a GPU), "
                 f"{sum(r.state == 'suspicious' for r in rows)} suspicious; ratio = the slow code's time / theirs, "
                 "timed in turns on their own GPU")
    return "\n".join(lines)
