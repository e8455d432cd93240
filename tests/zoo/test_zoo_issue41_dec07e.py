"""results/zoo/2026-12-07-h100-issue41-e/: the three shape-changing steps diagnosed with a shape's first runs set apart
after the review (65f6157). Its matrices come from the committed labels and diagnoses (the folder before's, then its own), and its
NOTES.md quotes the judge's scores, the promises kept under half, and each step's settled step and first runs."""
import re
from pathlib import Path

import pytest

from gpulab.diagnose import zoo as Z

from test_zoo_issue41_dec07b import labels
from test_zoo_issue41_dec07d import DIAGNOSES as BEFORE_THIS
from test_zoo_issue41_dec07 import matrices_match, scores_quoted

RUN = Path(__file__).resolve().parents[2] / "results" / "zoo" / "2026-12-07-h100-issue41-e"
DIAGNOSES = {"after": BEFORE_THIS["after"] + [RUN / "diagnoses-e1.json"],
             "before": [RUN / "diagnoses-by-822f1d6.json"], "one": [RUN / "diagnoses-by-65f6157.json"]}


def notes() -> str:
    return " ".join((RUN / "NOTES.md").read_text().split())


@pytest.mark.parametrize("when", ["after", "before"])
def test_the_matrices_come_from_the_committed_files(when):
    matrices_match(RUN, labels(), DIAGNOSES[when], when)


def test_the_notes_quote_those_scores():
    scores_quoted(RUN, "65f6157", labels(), DIAGNOSES)


def test_the_promises_kept_under_half_and_the_tuned_check_are_the_judges():
    checks = {n: (ok, w) for n, ok, w in Z.judge(labels(), Z.read_steps(DIAGNOSES["after"]))["checks"]}
    ok, why = checks["tuned steps: no verdict expects more than 10 %"]
    assert not ok and why == "over: bert_variable_lengths_compile, fairseq_token_batches"
    ok, why = checks["every measured verdict kept half its expectation, or was demoted"]
    failing = dict(re.findall(r"(\w+/\w+): ([\d.]+x)", why.split("failing:")[1]))
    assert not ok and len(failing) == 5 and "hf_trainer_dynamic_padding/varying_shapes" not in failing, why
    (hf,) = [r for r in Z.read_steps([RUN / "diagnoses-e1.json"]) if r["name"] == "hf_trainer_dynamic_padding"]
    (label,) = [r for r in labels() if r["name"] == "hf_trainer_dynamic_padding"]
    gain = label["fixes"]["varying_shapes"]["gain"]
    kept = (1 - 1 / gain) / hf["verdicts"][0]["expected"]
    assert f"hf_trainer_dynamic_padding's varying_shapes keeps {100 * kept:.0f} % (label {gain:.3g}x" in notes()
    assert all(f"{k} {g}" in notes() for k, g in failing.items())


def test_the_records_under_one_set_of_rules_name_the_same_tops():
    tops = lambda j: {r["name"]: (r.get("top"), r.get("hit")) for r in j["rows"]}      # noqa: E731
    assert tops(Z.judge(labels(), Z.read_steps(DIAGNOSES["one"]))) == tops(Z.judge(labels(), Z.read_steps(DIAGNOSES["after"])))


@pytest.mark.parametrize("name, settled, first, timed, lo, hi, top, gain", [
    ("bert_variable_lengths_compile", "6.78", 8, 20, "125", "6467", "compile_recompiles", "2.03"),
    ("fairseq_token_batches", "15.1", 15, 40, "114", "157", "varying_shapes", "2.06"),
    ("hf_trainer_dynamic_padding", "20.1", 14, 20, "165", "220", "varying_shapes", "3.63")])
def test_each_steps_settled_step_and_first_runs_are_the_diagnosis(name, settled, first, timed, lo, hi, top, gain):
    (row,) = [r for r in Z.read_steps([RUN / "diagnoses-e1.json"]) if r["name"] == name]
    line = next(x for x in row["report"].splitlines() if x.startswith("new shapes:"))
    assert f"{first} of {timed} timed ones" in line and f"the settled step ({settled} ms)" in line, line
    assert re.search(r"\(([\d.e+]+) to ([\d.e+]+) ms\)", line), line
    lo_ms, hi_ms = (float(x) for x in re.search(r"\(([\d.e+]+) to ([\d.e+]+) ms\)", line).groups())
    assert lo_ms == pytest.approx(float(lo), rel=0.01) and hi_ms == pytest.approx(float(hi), rel=0.01)
    v = row["verdicts"][0]
    assert v["rule"] == top and f"{1 / (1 - v['expected']):.3g}" == gain
    assert any("no variant was timed" in n for n in row.get("notes", [])) or "no variant was timed" in row["report"]
    assert f"| {name} | {settled} ms | {first} of {timed} | {lo}-{hi} ms |" in notes()
