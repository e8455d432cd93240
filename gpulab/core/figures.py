"""Figures in the notebooks' prose, their committed reference records, and the learner's own values.

A measured figure in a markdown cell carries a tag right after it (an HTML comment, invisible in
Jupyter): `took 109 ms<!-- fig 03 step_ms_0_workers -->`, `55–68 %<!-- fig 03 busy.gpu_busy_pct -->`,
`12 %<!-- fig 07 share x100 -->`, `0.78×<!-- fig 06 ratio tol=10 -->`, `1.74×<!-- fig 15 fix_speedup
round=2 -->`. The tag names the lesson and the record (`NAME.KEY` reads `extra[KEY]`), `xK` the factor the
prose shows the value in, `tol=P` the percent the prose may round by, `KEY=VALUE` the records whose
`extra[KEY]` is VALUE (one round of a chain). tests/test_prose_figures.py holds every tagged figure to the committed records
under results/ (GPU runs at full size, no profile); `beside` puts the learner's own newest value of each
figure next to the reference, for `gpulab.notebook.lesson.show_beside_reference`.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TOL_PCT = 5.0

# -- the grammar -----------------------------------------------------------------------------------
NUM = r"(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
# Unit text allowed between a figure and its tag: letters, µ, ×, %, /, ², ³, °, spaces (short).
UNIT_TEXT = r"[A-Za-zµμ×%/²³°'’\s]{0,24}?"
RANGE_SEP = r"(?:–|—|-|\bto\b)"
# A figure ending right before a tag: NUM [unit] [sep NUM] [unit], anchored at the end.
FIGURE_BEFORE_TAG = re.compile(
    rf"(?<![\w.,])(?P<a>{NUM})(?:{UNIT_TEXT}\s*{RANGE_SEP}\s*(?P<b>{NUM}))?{UNIT_TEXT}\s*$")
UNITS = r"(?:TFLOP/s|GB/s|TB/s|tokens/s|images/s|img/s|iter/s|µs|μs|us|ms|s|×|%)"
# A measured-looking figure: NUM [unit] [sep NUM] unit (x only right after the number: "9.5x").
MEASURED = re.compile(
    rf"(?<![\w.,])(?:{NUM}\s*{UNITS}?\s*{RANGE_SEP}\s*)?{NUM}(?:\s*{UNITS}|x)(?![A-Za-z0-9/])")
TRIGGER = re.compile(r"H200|\b(?:measured|took|ran at|reached|recorded|in two runs)\b", re.IGNORECASE)
FIG_MARK, NOT_MEASURED_MARK = "\x00F", "\x00N"
FIG_MARK_RE = re.compile(r"\x00F(\d+)\x00")
TAGGED_AFTER = re.compile(r"\s*\x00[FN]")


@dataclass(frozen=True)
class Rec:
    """The fields of a results-store record this check reads, with the file it came from."""
    lesson: str
    name: str
    value: float
    gpu: str = "NVIDIA H200"
    scale: str = "full"
    extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    source: str = "synthetic"
    time: str = ""


@dataclass(frozen=True)
class Tag:
    lesson: str
    name: str
    k: float = 1.0
    tol_pct: float = DEFAULT_TOL_PCT
    where: tuple[tuple[str, str], ...] = ()     # KEY=VALUE: only records whose extra[KEY] prints as VALUE


def number(text: str) -> float:
    return float(text.replace(",", ""))


def parse_tag(body: str) -> Tag | str:
    """The inside of `<!-- fig ... -->` as a Tag, or the reason it cannot be read."""
    import shlex
    try:
        words = shlex.split(body)          # a KEY="value with spaces" filter stays one word
    except ValueError as err:
        return f"an unreadable fig tag ({err}): <!--{body}-->"
    if len(words) < 3 or words[0] != "fig":
        return f"a fig tag needs a lesson and a record name: <!--{body}-->"
    from dataclasses import replace
    tag = Tag(words[1], words[2])
    for opt in words[3:]:
        if m := re.fullmatch(r"x(\d+(?:\.\d+)?(?:e-?\d+)?)", opt):
            tag = replace(tag, k=float(m.group(1)))
        elif m := re.fullmatch(r"tol=(\d+(?:\.\d+)?)%?", opt):
            tag = replace(tag, tol_pct=float(m.group(1)))
        elif m := re.fullmatch(r"([A-Za-z_]\w*)=(.+)", opt):
            tag = replace(tag, where=tag.where + ((m.group(1), m.group(2)),))
        else:
            return f"unknown option {opt!r} in <!--{body}-->"
    if tag.k == 0:
        return f"x0 in <!--{body}-->"
    return tag


def strip_code(md: str) -> str:
    """Markdown without fenced code blocks and without the numbers of inline code spans (code, not prose):
    a span with no digit keeps its text (`channels_last`), so a sentence shown to the learner still reads;
    one with a digit (`n = 4096`, `float8_e4m3fn`) becomes a space."""
    md = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "\n", md, flags=re.DOTALL | re.MULTILINE)
    span = lambda m: " " if re.search(r"\d", m.group(2)) else f" {m.group(2)} "
    return re.sub(r"(`+)(?!`)(.*?)(?<!`)\1(?!`)", span, md, flags=re.DOTALL)


def mark_tags(md: str) -> tuple[str, list[Tag | str]]:
    """Code stripped; fig tags become markers \\x00F<i>\\x00 (i indexes the returned list), not-measured
    tags \\x00N\\x00, every other HTML comment disappears."""
    tags: list[Tag | str] = []

    def repl(m: re.Match) -> str:
        body = m.group(1)
        if re.match(r"\s*fig\b", body):
            tags.append(parse_tag(body))
            return f"{FIG_MARK}{len(tags) - 1}\x00"
        if re.match(r"\s*not measured\b", body, re.IGNORECASE):
            return f"{NOT_MEASURED_MARK}\x00"
        return ""
    return re.sub(r"<!--(.*?)-->", repl, strip_code(md), flags=re.DOTALL), tags


BLOCK_START = re.compile(r"^\s*(?:[-*+]\s|\d+[.)]\s|#|\||>)")


def sentences(md: str) -> list[str]:
    """Paragraphs, list items, headings and table rows, each cut into sentences."""
    blocks: list[list[str]] = []
    current: list[str] = []
    for line in md.splitlines():
        if not line.strip() or BLOCK_START.match(line):
            if current:
                blocks.append(current)
            current = [line] if line.strip() else []
        else:
            current.append(line)
    if current:
        blocks.append(current)
    out = []
    for block in blocks:
        text = " ".join(part.strip() for part in block)
        out += [s for s in re.split(r"(?<=[.!?])\s+", text) if s.strip()]
    return out


def plain(sentence: str, limit: int = 110) -> str:
    """The sentence as a reader sees it (no markers), shortened."""
    s = re.sub(r"\x00[FN]\d*\x00", "", sentence)
    s = " ".join(s.split())
    s = re.sub(r",(?:\s*,)+", ",", re.sub(r"\s+([,.;:])", r"\1", s))   # a dropped code span leaves ", ,"
    return s if len(s) <= limit else s[: limit - 1] + "…"


def selected(tag: Tag, extra: dict | None) -> bool:
    """Whether a record's extra fields pass the tag's KEY=VALUE filters (a round of a chain, a size). `gpu=` is not
    an extra field: it picks the reference runs (`reference_records`), never the learner's own record."""
    return all(str((extra or {}).get(k)) == v for k, v in tag.where if k not in REFERENCE_KEYS)


# Filters that pick reference runs, not extra fields: `gpu=NAME` (a part of the GPU's name) and `run=FOLDER` (the
# folder under results/ that holds the record's file, where prose quotes one named run among several of one GPU).
REFERENCE_KEYS = ("gpu", "run")


def in_run(tag: Tag, source: str) -> bool:
    """Whether a reference record's file lies in the folder the tag's `run=FOLDER` names (its parent's name)."""
    return all(Path(source).parent.name == v for k, v in tag.where if k == "run")


def on_gpu(tag: Tag, gpu: str) -> bool:
    """Whether a reference record's GPU passes the tag's `gpu=NAME` filter (a part of its name, any case: gpu=H200
    keeps "NVIDIA H200" and leaves out an H100's run beside a sentence about the H200)."""
    return all(v.lower() in gpu.lower() for k, v in tag.where if k == "gpu")


# Extra fields that say which variant of a measurement a record holds and where it ran, where that is not the
# record's GPU at its scale (lesson 14 runs its multi-process parts with gloo on CPU processes at the tiny size
# beside a single GPU: device="cpu"). A record with device "cpu" is no reference for a GPU's figure.
SETTING_KEYS = ("variant", "backend", "device", "processes", "size")


def key_values(pairs: Iterable[tuple[str, Any]]) -> str:
    """KEY=VALUE pairs as a tag writes them: 'variant="DDP, 1 process", backend=gloo'."""
    return ", ".join(f'{k}="{v}"' if re.search(r"[\s,]", str(v)) else f"{k}={v}" for k, v in pairs)


def setting(extra: dict | None, leave_out: Iterable[str] = ()) -> str:
    """A record's variant and where it ran, from its extra fields: "backend=gloo, device=cpu, processes=2"."""
    extra, leave_out = extra or {}, set(leave_out)
    return key_values((k, extra[k]) for k in SETTING_KEYS if k in extra and k not in leave_out)


def reference_records(tag: Tag, records: Iterable[Rec]) -> list[Rec]:
    """Every committed record the tag names that is a GPU's figure: on a GPU, at full size, no profile, no "shared"
    mark (other processes on the GPU, a room, or a MIG slice: `monitor.sharing_mark`; no reference for a whole
    GPU's figure) and not run on the CPU beside the GPU (extra device "cpu")."""
    name = tag.name.partition(".")[0]
    return [r for r in records
            if r.lesson == tag.lesson and r.name == name and r.gpu != "CPU" and r.scale == "full"
            and not (r.extra or {}).get("profile") and not (r.extra or {}).get("shared")
            and (r.extra or {}).get("device") != "cpu" and selected(tag, r.extra) and on_gpu(tag, r.gpu)
            and in_run(tag, r.source)]


def matching(tag: Tag, records: Iterable[Rec]) -> list[tuple[float, str]]:
    """(value, file) of each of the tag's `reference_records` that holds a number where the tag reads."""
    key = tag.name.partition(".")[2]
    out = []
    for r in reference_records(tag, records):
        value = (r.extra or {}).get(key) if key else r.value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append((float(value), r.source))
    return out


def variants(tag: Tag, records: Iterable[Rec]) -> list[str]:
    """The variants (extra "variant") among the tag's references, where the tag does not name one itself."""
    if any(k == "variant" for k, _ in tag.where):
        return []
    return sorted({str(r.extra["variant"]) for r in reference_records(tag, records) if "variant" in (r.extra or {})})


def gpu_model(name: str) -> str:
    """A GPU's model as the device table names it ("NVIDIA H100 80GB HBM3" -> "H100"), or the name itself."""
    from gpulab.core.specs import datasheet_for
    entry = datasheet_for(name)
    return entry.match if entry else name


def named_gpus(sentence: str) -> set[str]:
    """The GPU models of the device table a sentence names, whole words ("the H200" -> {"H200"})."""
    from gpulab.core.specs import DATASHEETS
    return {e.match for e in DATASHEETS
            if re.search(rf"(?<![A-Za-z0-9]){re.escape(e.match)}(?![A-Za-z0-9])", plain(sentence), re.I)}


def check_markdown(md: str, records: Iterable[Rec], where: str = "markdown") -> list[str]:
    """Every problem with the figures of one markdown text: tagged figures outside their records'
    range or naming no record, unreadable tags, untagged measured-looking figures."""
    records = list(records)
    text, tags = mark_tags(md)
    problems = []
    for sentence in sentences(text):
        # tagged figures
        for m in FIG_MARK_RE.finditer(sentence):
            tag = tags[int(m.group(1))]
            before = re.sub(r"\x00[FN]\d*\x00", "", sentence[: m.start()])
            if isinstance(tag, str):
                problems.append(f"{where}: {tag}, in: {plain(sentence)!r}")
                continue
            fig = FIGURE_BEFORE_TAG.search(before)
            if not fig:
                problems.append(f"{where}: the tag <!-- fig {tag.lesson} {tag.name} --> has no number "
                                f"right before it, in: {plain(sentence)!r}")
                continue
            ends = [fig.group("a")] + ([fig.group("b")] if fig.group("b") else [])
            shown = "–".join(ends)
            found = matching(tag, records)
            if not found:
                problems.append(f"{where}: {shown} in {plain(sentence)!r}: no committed record "
                                f"lesson {tag.lesson} name {tag.name} (GPU, scale full, no profile) "
                                f"in results/")
                continue
            named, ran = named_gpus(sentence), {gpu_model(r.gpu) for r in reference_records(tag, records)}
            if named and not any(k == "gpu" for k, _ in tag.where) and not named & ran:
                problems.append(f"{where}: {shown} in {plain(sentence)!r}: the sentence names the "
                                f"{', '.join(sorted(named))}, its records ran on the {', '.join(sorted(ran))}: "
                                "say which GPU the figure is of (gpu=NAME)")
            several = variants(tag, records)
            if len(several) > 1:
                # a figure is one variant's (issue 40: DataParallel's 564 once stood beside the plain step's 622)
                problems.append(f"{where}: {shown} in {plain(sentence)!r}: the records {tag.lesson}/{tag.name} are of "
                                f"{len(several)} variants ({', '.join(several)}): name the figure's with variant=\"...\"")
            values = [v for v, _ in found]
            lo_v, hi_v = min(values), max(values)
            lo = lo_v - abs(lo_v) * tag.tol_pct / 100
            hi = hi_v + abs(hi_v) * tag.tol_pct / 100
            for end in ends:
                v = number(end) / tag.k
                if not lo <= v <= hi:
                    files = sorted({Path(s).name for _, s in found})
                    scaled = f" (÷{tag.k:g} = {v:.4g})" if tag.k != 1 else ""
                    problems.append(
                        f"{where}: {end}{scaled} in {plain(sentence)!r} is outside "
                        f"[{lo:.4g}, {hi:.4g}] (records {lo_v:.4g}..{hi_v:.4g} ±{tag.tol_pct:g} %) of "
                        f"{len(found)} records {tag.lesson}/{tag.name} in files {', '.join(files)}")
            if len(ends) == 2:
                # a quoted range covers its records (issue 40: "6.5-9.5x" against records of 6.47-17.1x)
                a, b = sorted(number(e) / tag.k for e in ends)
                if a > lo_v + abs(lo_v) * tag.tol_pct / 100 or b < hi_v - abs(hi_v) * tag.tol_pct / 100:
                    files = sorted({Path(s).name for _, s in found})
                    problems.append(
                        f"{where}: the range {shown} in {plain(sentence)!r} is narrower than its {len(found)} records "
                        f"{tag.lesson}/{tag.name} ({lo_v:.4g}..{hi_v:.4g}, ±{tag.tol_pct:g} %) in files "
                        f"{', '.join(files)}: quote the records' range")
        # untagged measured-looking figures
        if not TRIGGER.search(re.sub(r"\x00[FN]\d*\x00", "", sentence)):
            continue
        for m in MEASURED.finditer(sentence):
            if TAGGED_AFTER.match(sentence, m.end()):
                continue
            problems.append(f"{where}: untagged figure {m.group(0).strip()!r} in {plain(sentence)!r}: "
                            "tag it <!-- fig LESSON NAME --> against a committed record, mark it "
                            "<!-- not measured: ... -->, or remove it")
    return problems


# Measurements renamed after records of them were committed: (lesson, old name) -> (name now, {old extra key: key
# now}). Committed stores keep the names they were written with; the prose, the prose-figure test and the table of
# your values beside it read an old record as the same measurement under its name now (`renamed`). Notebook 13 once
# called its fraction of measured peak "MFU" (gpt_mfu_ladder, with the datasheet's ratio as datasheet_share); MFU
# is the ratio to the datasheet's peak, so the record became gpt_peak_fraction_ladder with that ratio as mfu.
# (13/gpt_mfu is not here: its old records divide by a measured peak in some runs and the datasheet's in others.)
RENAMED = {("13", "gpt_mfu_ladder"): ("gpt_peak_fraction_ladder", {"datasheet_share": "mfu"})}


def renamed(r: Any) -> Rec:
    """Record `r` (a `Rec`, or a results store's record: lesson, name, value, gpu, scale, extra) as a `Rec` under its
    name now (RENAMED), its extra keys renamed with it."""
    lesson, name, extra = str(r.lesson), r.name, dict(getattr(r, "extra", None) or {})
    if (lesson, name) in RENAMED:
        name, keys = RENAMED[lesson, name]
        extra = {keys.get(k, k): v for k, v in extra.items()}
    return Rec(lesson, name, float(r.value), str(getattr(r, "gpu", "")), str(getattr(r, "scale", "")), extra,
               str(getattr(r, "source", "your results store")), str(getattr(r, "time", "")))


def committed_records(root: Path = ROOT) -> tuple[Rec, ...]:
    """Every record of every results store under root/results/ (other JSON files are not stores)."""
    out = []
    for path in sorted((root / "results").rglob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError, OSError):
            continue
        if not isinstance(data, dict) or not isinstance(data.get("records"), list):
            continue
        for r in data["records"]:
            if not isinstance(r, dict) or not isinstance(r.get("value"), (int, float)):
                continue
            out.append(renamed(Rec(str(r.get("lesson")), str(r.get("name")), float(r["value"]),
                                   str(r.get("gpu", "")), str(r.get("scale", "")),
                                   r.get("extra") if isinstance(r.get("extra"), dict) else {},
                                   str(path.relative_to(root)), str(r.get("time", "")))))
    return tuple(out)


@dataclass(frozen=True)
class Figure:
    """One tagged figure of the prose: the number(s) as shown, the tag, and the sentence around it."""
    shown: str
    values: tuple[float, ...]
    tag: Tag
    sentence: str


def prose_figures(md: str) -> list[Figure]:
    """Every readable tagged figure of a markdown text, in order."""
    text, tags = mark_tags(md)
    out = []
    for sentence in sentences(text):
        for m in FIG_MARK_RE.finditer(sentence):
            tag = tags[int(m.group(1))]
            fig = FIGURE_BEFORE_TAG.search(re.sub(r"\x00[FN]\d*\x00", "", sentence[: m.start()]))
            if isinstance(tag, str) or not fig:
                continue
            ends = [fig.group("a")] + ([fig.group("b")] if fig.group("b") else [])
            out.append(Figure("–".join(ends), tuple(number(e) for e in ends), tag, plain(sentence)))
    return out


def notebook_markdown(lesson: str, root: Path = ROOT) -> list[str] | None:
    """The markdown cells of lesson `lesson`'s notebook in root/notebooks/, or None where it is not there."""
    found = sorted((root / "notebooks").glob(f"{lesson}_*.ipynb"))
    if not found:
        return None
    cells = json.loads(found[0].read_text(encoding="utf-8"))["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "markdown"]


def _value(rec_value: float, extra: dict, tag: Tag) -> float | None:
    key = tag.name.partition(".")[2]
    v = (extra or {}).get(key) if key else rec_value
    return float(v) * tag.k if isinstance(v, (int, float)) and not isinstance(v, bool) else None


# Records no notebook makes: a maintainers' probe, committed with its script. The learner has no value of
# their own for these; `beside` says where the figure came from instead of NOT_RUN.
NOT_RUN = "none of yours (not run yet, or not here)"
PROBES = {("00", "layout_probe"): "results/course/2026-12-03-h200-00-to-15/peak-probe.py"}


def beside(lesson: str, mine: Iterable[Any], gpu_now: str, references: Iterable[Rec] | None = None,
           markdown: list[str] | None = None) -> list[dict]:
    """One row per tagged figure of lesson `lesson`'s prose: the figure as the prose shows it, the
    reference runs it comes from (files and GPUs), and the learner's newest value of the same record
    (`mine`: records with lesson, name, value, gpu, scale, extra; scaled as the prose shows it), with how
    the two compare: "same GPU", "another GPU", "emulating a profile", "tiny size (CPU)", "CPU processes" (a
    measurement run on the CPU beside this GPU), NOT_RUN (none of yours), or for a probe's record (PROBES) "reference only:
    ..." with its script. Yours is matched only to a record of the figure's variant (the tag's KEY=VALUE filters,
    and the variant of its references), and the regime says where yours ran (`setting`)."""
    markdown = notebook_markdown(lesson) if markdown is None else markdown
    committed = committed_records() if references is None else tuple(renamed(r) for r in references)
    mine = [renamed(r) for r in mine]
    rows = []
    for md in markdown or []:
        for fig in prose_figures(md):
            name = fig.tag.name.partition(".")[0]
            refs = matching(fig.tag, committed)
            ref_recs = reference_records(fig.tag, committed)
            ref_variants = {str(r.extra["variant"]) for r in ref_recs if "variant" in (r.extra or {})}
            named = [k for k, _ in fig.tag.where]
            same_name = [r for r in mine if str(r.lesson) == fig.tag.lesson and r.name == name
                         and _value(r.value, r.extra, fig.tag) is not None]
            ours = [r for r in same_name if selected(fig.tag, r.extra)
                    and (not ref_variants or str((r.extra or {}).get("variant")) in ref_variants)]
            chosen = list(fig.tag.where) + ([("variant", next(iter(ref_variants)))]
                                            if len(ref_variants) == 1 and "variant" not in named else [])
            record = f"{fig.tag.lesson}/{fig.tag.name}" + (f" {key_values(chosen)}" if chosen else "")
            row = {"figure": fig.shown, "record": record, "sentence": fig.sentence,
                   "reference": ", ".join(sorted({f"{Path(r.source).name} ({r.gpu})" for r in ref_recs})) or "none",
                   "reference_range": (min(v for v, _ in refs) * fig.tag.k, max(v for v, _ in refs) * fig.tag.k)
                   if refs else None, "yours": None, "regime": NOT_RUN}
            if (fig.tag.lesson, name) in PROBES:
                row["regime"] = f"reference only: a probe no notebook runs ({PROBES[fig.tag.lesson, name]})"
            elif same_name and not ours:
                extra, keys = same_name[-1].extra or {}, [k for k, _ in chosen]
                ran = ", ".join(x for x in (key_values((k, extra[k]) for k in keys if k in extra),   # the figure's keys
                                            setting(extra, leave_out=keys)) if x)
                row["regime"] = (f"none of yours is the figure's ({key_values(chosen)}); your newest {name} ran "
                                 f"with {ran or 'no setting recorded'}")
            if ours:
                r = ours[-1]
                row["yours"] = _value(r.value, r.extra, fig.tag)
                row["regime"] = regime(r, {x.gpu for x in ref_recs})
                where = setting(r.extra, leave_out=[k for k, _ in chosen])
                if where:
                    row["regime"] += f"; yours ran with {where}"
            rows.append(row)
    return rows


def regime(r: Any, reference_gpus: set[str]) -> str:
    """How a learner's record compares with the reference runs on `reference_gpus`: under a profile, on the CPU
    (the machine's, or CPU processes beside its GPU), at the tiny size, on the same GPU or on another one."""
    extra = r.extra or {}
    tiny = r.scale != "full" or extra.get("size") == "tiny"
    if extra.get("profile"):
        return "emulating " + str(extra.get("profile"))
    if r.gpu == "CPU":
        return "tiny size (CPU)"
    if extra.get("device") == "cpu":
        backend = f" ({extra['backend']})" if "backend" in extra else ""
        return f"CPU processes{backend} beside the {r.gpu}" + (", tiny size" if tiny else "")
    if tiny:
        return "tiny size"
    return "same GPU" if r.gpu in reference_gpus else f"another GPU ({r.gpu})"
