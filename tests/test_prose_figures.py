"""Issue 15: every figure in a notebook's prose is held to a committed record.

A measured figure in a markdown cell carries a tag, an HTML comment right after it (invisible in
Jupyter):

    took 109 ms<!-- fig 03 step_ms_0_workers -->
    55–68 %<!-- fig 03 step_ms_12_workers.gpu_busy_pct -->     (a range: both ends are checked)
    0.78×<!-- fig 06 some_ratio tol=10 -->
    a fraction quoted in %: 12 %<!-- fig 07 share x100 -->

`<!-- fig LESSON NAME [xK] [tol=P] -->`: the number just before the tag (only unit text and spaces
between them; "1,234", decimals and ranges "a–b", "a-b", "a to b" allowed), divided by K (default
1), must lie within [min·(1−P %), max·(1+P %)] (P default 5) of the values of the committed records
with that lesson and name: every results store under results/ ({"records": [...]}), records made on
a GPU (`gpu` not "CPU") at scale "full", not under a GPU profile (no `extra["profile"]`).
`NAME.KEY` reads `extra[KEY]` of the records named NAME instead of their value.

A figure that is not a measurement on our GPU says so: `9.8 GB<!-- not measured: arithmetic -->`.

Untagged figures: in a sentence that mentions the H200 or a measurement verb (measured, took, ran
at, reached, recorded, in two runs), every number with a unit of time, rate, ratio or share (ms, µs,
us, s, GB/s, TB/s, TFLOP/s, ×, x right after the number, %, tokens/s, img/s, images/s, iter/s) must
carry a fig tag or a not-measured tag. Numbers in inline or fenced code are not prose.

The checker is plain functions of text and records, tested at the bottom of this file on
synthetic markdown.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
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


@dataclass(frozen=True)
class Tag:
    lesson: str
    name: str
    k: float = 1.0
    tol_pct: float = DEFAULT_TOL_PCT


def number(text: str) -> float:
    return float(text.replace(",", ""))


def parse_tag(body: str) -> Tag | str:
    """The inside of `<!-- fig ... -->` as a Tag, or the reason it cannot be read."""
    words = body.split()
    if len(words) < 3 or words[0] != "fig":
        return f"a fig tag needs a lesson and a record name: <!--{body}-->"
    tag = Tag(words[1], words[2])
    for opt in words[3:]:
        if m := re.fullmatch(r"x(\d+(?:\.\d+)?(?:e-?\d+)?)", opt):
            tag = Tag(tag.lesson, tag.name, float(m.group(1)), tag.tol_pct)
        elif m := re.fullmatch(r"tol=(\d+(?:\.\d+)?)%?", opt):
            tag = Tag(tag.lesson, tag.name, tag.k, float(m.group(1)))
        else:
            return f"unknown option {opt!r} in <!--{body}-->"
    if tag.k == 0:
        return f"x0 in <!--{body}-->"
    return tag


def strip_code(md: str) -> str:
    """Markdown without fenced code blocks and inline code spans (they are code, not prose)."""
    md = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "\n", md, flags=re.DOTALL | re.MULTILINE)
    return re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", " ", md, flags=re.DOTALL)


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
    return s if len(s) <= limit else s[: limit - 1] + "…"


def matching(tag: Tag, records: Iterable[Rec]) -> list[tuple[float, str]]:
    """(value, file) of every committed GPU record at full size, no profile, that the tag names."""
    name, _, key = tag.name.partition(".")
    out = []
    for r in records:
        if (r.lesson != tag.lesson or r.name != name or r.gpu == "CPU" or r.scale != "full"
                or (r.extra or {}).get("profile")):
            continue
        value = (r.extra or {}).get(key) if key else r.value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append((float(value), r.source))
    return out


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


# -- the committed records and the notebooks -------------------------------------------------------
@lru_cache(maxsize=1)
def committed_records() -> tuple[Rec, ...]:
    """Every record of every results store under results/ (other JSON files are not stores)."""
    out = []
    for path in sorted((ROOT / "results").rglob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            continue
        if not isinstance(data, dict) or not isinstance(data.get("records"), list):
            continue
        for r in data["records"]:
            if not isinstance(r, dict) or not isinstance(r.get("value"), (int, float)):
                continue
            out.append(Rec(str(r.get("lesson")), str(r.get("name")), float(r["value"]),
                           str(r.get("gpu", "")), str(r.get("scale", "")),
                           r.get("extra") if isinstance(r.get("extra"), dict) else {},
                           str(path.relative_to(ROOT))))
    return tuple(out)


def notebook_problems(path: Path) -> list[str]:
    problems = []
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "markdown":
            problems += check_markdown("".join(cell["source"]), committed_records(),
                                       where=f"{path.name} cell {i}")
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_every_figure_in_prose_is_held_to_a_committed_record(path):
    problems = notebook_problems(path)
    assert not problems, f"{len(problems)} figure(s) in prose:\n" + "\n".join(problems)


def test_the_committed_records_are_found():
    assert len(committed_records()) > 100
    assert any(r.gpu != "CPU" and r.scale == "full" for r in committed_records())


# -- the checker on synthetic markdown -------------------------------------------------------------
RECS = [Rec("03", "step_ms_0_workers", 105.3, source="results/a.json"),
        Rec("03", "step_ms_0_workers", 124.8, source="results/b.json"),
        Rec("03", "busy_frac", 0.55), Rec("03", "busy_frac", 0.68),
        Rec("03", "step_ms_12_workers", 10.6, extra={"gpu_busy_pct": 52.5}),
        Rec("03", "step_ms_12_workers", 11.0, extra={"gpu_busy_pct": 68.0}),
        Rec("03", "cpu_only", 5.0, gpu="CPU"), Rec("03", "tiny_only", 5.0, scale="tiny"),
        Rec("03", "profiled", 5.0, extra={"profile": "t4"}),
        Rec("01", "first_ms", 1234.5)]


def test_a_tagged_figure_inside_the_range_passes():
    assert check_markdown("On the H200 a step took 109 ms<!-- fig 03 step_ms_0_workers -->.", RECS) == []
    # 5 % tolerance at both edges: 100.1 >= 105.3 * 0.95, 131 <= 124.8 * 1.05
    assert check_markdown("It took 100.1 ms<!-- fig 03 step_ms_0_workers --> then "
                          "131 ms<!-- fig 03 step_ms_0_workers -->.", RECS) == []
    assert check_markdown("It took 1,234.5 ms<!-- fig 01 first_ms --> the first time.", RECS) == []


def test_a_tagged_figure_outside_the_range_fails():
    problems = check_markdown("On the H200 a step took 90 ms<!-- fig 03 step_ms_0_workers -->.", RECS)
    assert len(problems) == 1
    assert "90" in problems[0] and "outside" in problems[0] and "2 records" in problems[0]
    assert "a.json" in problems[0] and "b.json" in problems[0] and "took 90 ms" in problems[0]
    assert check_markdown("took 140 ms<!-- fig 03 step_ms_0_workers tol=20 -->", RECS) == []
    assert check_markdown("took 140 ms<!-- fig 03 step_ms_0_workers -->", RECS)


def test_a_tag_naming_no_record_fails():
    for name in ("no_such_record", "cpu_only", "tiny_only", "profiled"):
        problems = check_markdown(f"It took 5 ms<!-- fig 03 {name} -->.", RECS, where="nb 01 cell 4")
        assert len(problems) == 1 and "no committed record" in problems[0], (name, problems)
        assert problems[0].startswith("nb 01 cell 4") and "took 5 ms" in problems[0]
    assert check_markdown("It took 5 ms<!-- fig 04 step_ms_0_workers -->.", RECS)   # other lesson


def test_scaling_by_k():
    assert check_markdown("busy 60 %<!-- fig 03 busy_frac x100 --> of the time", RECS) == []
    assert check_markdown("busy 80 %<!-- fig 03 busy_frac x100 --> of the time", RECS)
    assert check_markdown("took 0.11 s<!-- fig 03 step_ms_0_workers x0.001 -->", RECS) == []
    assert check_markdown("took 0.2 s<!-- fig 03 step_ms_0_workers x0.001 -->", RECS)


def test_a_range_checks_both_ends():
    assert check_markdown("The H200 was busy 55–68 %<!-- fig 03 busy_frac x100 -->.", RECS) == []
    assert check_markdown("The H200 was busy 55 to 68 %<!-- fig 03 busy_frac x100 -->.", RECS) == []
    low = check_markdown("The H200 was busy 34–68 %<!-- fig 03 busy_frac x100 -->.", RECS)
    high = check_markdown("The H200 was busy 55-90 %<!-- fig 03 busy_frac x100 -->.", RECS)
    assert len(low) == 1 and low[0].split(":")[1].strip().startswith("34")
    assert len(high) == 1 and high[0].split(":")[1].strip().startswith("90")


def test_an_extra_field_is_read_with_name_dot_key():
    assert check_markdown("busy 55–68 %<!-- fig 03 step_ms_12_workers.gpu_busy_pct -->", RECS) == []
    assert check_markdown("busy 34 %<!-- fig 03 step_ms_12_workers.gpu_busy_pct -->", RECS)
    assert "no committed record" in check_markdown("busy 3 %<!-- fig 03 step_ms_12_workers.nope -->", RECS)[0]


def test_an_untagged_figure_in_a_measured_sentence_fails():
    problems = check_markdown("On the H200 the first product took 12 ms, against 2.7 ms warm.", RECS)
    assert len(problems) == 2 and all("untagged" in p for p in problems)
    assert "'12 ms'" in problems[0] and "'2.7 ms'" in problems[1]
    for s in ("We measured 9.5x here.", "It ran at 4,100 GB/s.", "The H200 reached 75.6 %.",
              "In two runs: 83–126 ms.", "took 31.6 µs per call", "recorded 1.2 TFLOP/s",
              "The H200 ran 3 × faster.", "took 2 s.", "The H200: 900 tokens/s and 50 img/s."):
        assert check_markdown(s, RECS), s


def test_untagged_figures_that_are_not_measurements_pass():
    assert check_markdown("On the H200 a step takes 4.8 TB/s<!-- not measured: datasheet --> at best.", RECS) == []
    assert check_markdown("On the H200 9.8 GB<!-- not measured: arithmetic --> of state.", RECS) == []  # GB: no rate
    assert check_markdown("A 2x faster step saves 50 % of the time.", RECS) == []           # no trigger
    assert check_markdown("The H200 has 132 SMs and 141 GB.", RECS) == []                  # no unit listed
    assert check_markdown("On the H200, `took 12 ms` is code.", RECS) == []                # inline code
    assert check_markdown("On the H200:\n```\nit took 12 ms\n```\n", RECS) == []            # fenced code
    assert check_markdown("The H200 ran a 4096x4096 product in fp32.", RECS) == []          # a shape, not a ratio
    # a sentence without a trigger word does not borrow the next one's
    assert check_markdown("A step is 12 ms. The H200 is a GPU.", RECS) == []


def test_sentences_split_at_list_items_and_table_rows():
    md = "Intro line\n- the H200 took 12 ms\n- a 2x gain\n\n| H200 | 3 ms |\n| CPU | 5 ms |"
    problems = check_markdown(md, RECS)
    assert len(problems) == 2 and "12 ms" in problems[0] and "3 ms" in problems[1]


def test_a_tag_without_a_number_or_with_a_bad_option_fails():
    assert "no number" in check_markdown("It took <!-- fig 03 step_ms_0_workers --> long.", RECS)[0]
    assert "unknown option" in check_markdown("took 109 ms<!-- fig 03 step_ms_0_workers y5 -->", RECS)[0]
    assert "needs a lesson" in check_markdown("took 109 ms<!-- fig 03 -->", RECS)[0]
