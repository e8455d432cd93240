"""results/zoo/2026-12-07-h100-issue41-h/: the shape fixes' steps timed one by one with their shapes, and
hf_trainer_dynamic_padding diagnosed and labelled on one H100. Its matrices come from the committed labels and
diagnoses; its NOTES.md quotes the scores, the failing checks, hf's row, and what the per-step files say: each shape's
slow steps are its first two runs, and the settled steps' figures."""
import json
import statistics

import pytest

from gpulab.diagnose import zoo as Z

from test_zoo_issue41_dec07 import failing_checks, matrices_match
from test_zoo_issue41_dec07f import notes as notes_of, scores_and_halves_quoted
from test_zoo_issue41_dec07g import RUN as RUN_G, labels as labels_g

RUN = RUN_G.parent / "2026-12-07-h100-issue41-h"
DIAGNOSES = {"after": [RUN / "diagnoses-by-0af2d54.json"], "before": [RUN / "diagnoses-by-822f1d6.json"],
             "before-this-run": [RUN / "diagnoses-by-6ff1917.json"]}


def labels() -> list:
    """run g's labels with hf's of this run last (a step's last row counts, as in `Z.read_steps`)."""
    rows = {r["name"]: r for r in labels_g() + Z.read_steps([RUN / "labels-h1.json"])}
    return list(rows.values())


def notes() -> str:
    return notes_of(RUN)


def steps_of(name: str) -> list:
    return json.loads((RUN / "shape-steps" / f"{name}.json").read_text())["rows"]


@pytest.mark.parametrize("when", ["after", "before", "before-this-run"])
def test_the_matrices_come_from_the_committed_files(when):
    matrices_match(RUN, labels(), DIAGNOSES[when], when)


def test_the_notes_quote_the_scores_and_the_halves():
    scores_and_halves_quoted(RUN, "0af2d54", labels(), DIAGNOSES)


def test_the_failing_checks_are_the_judges():
    tuned, failing = failing_checks(RUN, labels(), DIAGNOSES["after"])
    assert tuned == "over: fairseq_token_batches"
    assert set(failing) == {"timm_train_one_epoch/optimizer_unfused", "bert_variable_lengths_compile/compile_recompiles",
                            "fairseq_token_batches/varying_shapes"}


def test_hfs_rows_are_its_label_and_its_diagnoses():
    (lab,) = Z.read_steps([RUN / "labels-h1.json"])
    fixes = ", ".join(f"{r} {f['gain']:.2f}x" for r, f in lab["fixes"].items())
    label = f"{lab['as_written']['ms']:.3g} ms; {fixes}: **{lab['best']}** |"
    for live, when in (("diagnoses-h1.json", "live, 6ff1917"), ("diagnoses-by-0af2d54.json", None)):
        (d,) = [r for r in Z.read_steps([RUN / live]) if r["name"] == "hf_trainer_dynamic_padding"]
        top = d["verdicts"][0]
        cell = f"{d['step_ms']:.3g} ms, {top['rule']}, {1 / (1 - top['expected']):.2g}x"
        assert cell in notes() and (when is None or f"({when}) | {cell} | {label}" in notes())
    kept = (1 - 1 / lab["fixes"]["varying_shapes"]["gain"]) / top["expected"]
    assert 0.5 <= kept and f"**{100 * kept:.0f} % of the promise**" in notes()


def test_each_shapes_slow_steps_are_its_first_two_runs():
    for name, shapes, last_new, settled in (("bert-fix", 3, 37, 4.34), ("fairseq-fix", 25, 278, None)):
        rows = steps_of(name)
        median = statistics.median(r["ms"] for r in rows)
        runs: dict = {}
        for r in rows:
            runs.setdefault(tuple(r["shape"]), []).append(r["i"])
        assert len(runs) == shapes and max(r["i"] for r in rows if r["new"]) == last_new
        slow = [r for r in rows if not r["new"] and r["ms"] > 3 * median]
        second = [r for r in slow if runs[tuple(r["shape"])][1] == r["i"]]
        other = [(r["i"], runs[tuple(r["shape"])].index(r["i"]) + 1) for r in slow if r not in second]
        assert other == ([(23, 4)] if name == "fairseq-fix" else [])   # after step 2's compile made shapes dynamic
        if name == "fairseq-fix":
            assert f"Of fairseq's {len(slow)} slow steps that were not a shape's first, {len(second)} were its second; " \
                   "the other was the fourth run of the first shape (steps 0, 1, 4 and 23)" in notes()
            assert runs[tuple(rows[0]["shape"])][:4] == [0, 1, 4, 23]
        if settled:
            after = [r["ms"] for r in rows if r["i"] > last_new]
            assert f"{len(after)} steps, median {statistics.median(after):.3g} ms, none slow" in notes()
            assert max(after) < 3 * median and f"{statistics.median(after):.3g}" == f"{settled:.3g}"


def test_the_settled_steps_against_the_promise():
    fix = statistics.median(r["ms"] for r in steps_of("fairseq-fix") if not r["new"])
    written = statistics.median(r["ms"] for r in steps_of("fairseq-none") if not r["new"])
    (d,) = [r for r in Z.read_steps([RUN_G / "diagnoses-g2.json"]) if r["name"] == "fairseq_token_batches"]
    promise = 1 / (1 - d["verdicts"][0]["expected"])
    kept = (1 - fix / written) / (1 - 1 / promise)
    assert (f"fairseq's fix {fix:.3g} ms against {written:.3g} ms as written, {written / fix:.2f}x, where the diagnosis "
            f"promised {promise:.3g}x on its settled step: {100 * kept:.0f} % of the promise") in notes()
    first = [r["ms"] for r in steps_of("fairseq-none") if r["new"]]
    assert f"56 shapes in 150 steps, each first step {min(first):.0f}-{max(first):.0f} ms" in notes() and len(first) == 56


def ms_range(values, unit="ms", k=1.0, fmt="{:.0f}") -> str:
    return f"{fmt.format(min(values) / k)}-{fmt.format(max(values) / k)} {unit}"


def test_the_first_and_second_runs_quoted_are_the_files():
    bert, fix = steps_of("bert-fix"), steps_of("fairseq-fix")
    def nth(rows, n):
        runs: dict = {}
        for r in rows:
            runs.setdefault(tuple(r["shape"]), []).append(r)
        return [v[n]["ms"] for v in runs.values() if len(v) > n]
    assert f"| bert, fix (pad to 128, graphs) | 300 | 3 | {ms_range(nth(bert, 0), 's', 1e3, '{:.1f}')} (the compiles) " \
           f"| {ms_range(nth(bert, 1))} |" in notes()
    first = sorted(nth(fix, 0))
    compiles, others = first[-3:], first[:-3]
    seconds = sorted(nth(fix, 1))
    assert (f"three {ms_range(compiles, 's', 1e3, '{:.1f}')} (the compiles), the others {ms_range(others)} | "
            f"{ms_range(seconds[:-1])}, one {seconds[-1]:.0f} ms |") in notes()
    nonfirst = [r for r in bert if not r["new"]]
    same = statistics.median(r["ms"] for r in nonfirst if not r["switch"])
    other = statistics.median(r["ms"] for r in nonfirst if r["switch"])
    assert f"(bert: median {other:.3g} against {same:.3g} ms)" in notes()


def test_the_paired_settled_steps():
    fix, written = steps_of("fairseq-fix"), steps_of("fairseq-none")
    runs: dict = {}
    for r in fix:
        runs.setdefault(tuple(r["shape"]), []).append(r["i"])
    idx = [r["i"] for r in written if not r["new"] and runs[tuple(fix[r["i"]]["shape"])].index(r["i"]) >= 2]
    a, b = statistics.median(fix[i]["ms"] for i in idx), statistics.median(written[i]["ms"] for i in idx)
    (d,) = [r for r in Z.read_steps([RUN_G / "diagnoses-g2.json"]) if r["name"] == "fairseq_token_batches"]
    kept = (1 - a / b) / d["verdicts"][0]["expected"]
    assert (f"Paired on the same {len(idx)} batches (the step as written not at a shape's first run, the fix at a shape's "
            f"third run or later): {a:.3g} against {b:.3g} ms, {b / a:.2f}x, {100 * kept:.0f} % of the promise") in notes()


def test_hfs_timed_steps_as_quoted():
    import lzma
    with lzma.open(RUN / "records" / "hf_trainer_dynamic_padding.json.xz") as f:
        ms = json.load(f)["stalls"]["step_ms"]
    slow = [t for t in ms if t >= 3 * min(ms)]
    fast = [t for t in ms if t < 3 * min(ms)]
    assert (f"{len(slow)} of the {len(ms)} timed steps met a new length and took {ms_range(slow)}, the other "
            f"{['', 'one', 'two', 'three', 'four', 'five', 'six'][len(fast)]} {ms_range(fast)}") in notes()
    (live,) = Z.read_steps([RUN / "diagnoses-h1.json"])
    assert f"The live diagnosis read {live['step_ms']:.0f} ms" in notes()    # its timing's median, as written
