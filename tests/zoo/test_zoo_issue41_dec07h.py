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
DIAGNOSES = {"after": [RUN / "diagnoses-by-134fb54.json"], "before": [RUN / "diagnoses-by-822f1d6.json"],
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
    scores_and_halves_quoted(RUN, "134fb54", labels(), DIAGNOSES)


def test_the_failing_checks_are_the_judges():
    tuned, failing = failing_checks(RUN, labels(), DIAGNOSES["after"])
    assert tuned == "over: fairseq_token_batches"
    assert set(failing) == {"timm_train_one_epoch/optimizer_unfused", "bert_variable_lengths_compile/compile_recompiles",
                            "fairseq_token_batches/varying_shapes"}


def test_hfs_rows_are_its_label_and_its_diagnoses():
    (lab,) = Z.read_steps([RUN / "labels-h1.json"])
    fixes = ", ".join(f"{r} {f['gain']:.2f}x" for r, f in lab["fixes"].items())
    label = f"{lab['as_written']['ms']:.3g} ms; {fixes}: **{lab['best']}** |"
    for live, when in (("diagnoses-h1.json", "live, 6ff1917"), ("diagnoses-by-134fb54.json", None)):
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
        assert len(second) >= len(slow) - 1                          # fairseq's one other: a third run after step 2's
        if settled:                                                  # dynamic compile
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
