"""results/zoo/2026-12-07-h100-issue41-e/: the three shape-changing steps diagnosed with a shape's first runs set apart
after the review (65f6157). Its matrices come from the committed labels and diagnoses (the folder before's, then its
own), and its NOTES.md quotes the judge's scores, the promises kept under half, and each step's first runs."""
from pathlib import Path

import pytest

from gpulab.diagnose import zoo as Z

from test_zoo_issue41_dec07b import labels
from test_zoo_issue41_dec07d import DIAGNOSES as BEFORE_THIS, first_runs_quoted, notes, promises_and_tuned, same_tops
from test_zoo_issue41_dec07 import matrices_match, scores_quoted

RUN = Path(__file__).resolve().parents[2] / "results" / "zoo" / "2026-12-07-h100-issue41-e"
DIAGNOSES = {"after": BEFORE_THIS["after"] + [RUN / "diagnoses-e1.json"],
             "before": [RUN / "diagnoses-by-822f1d6.json"], "one": [RUN / "diagnoses-by-65f6157.json"]}


@pytest.mark.parametrize("when", ["after", "before"])
def test_the_matrices_come_from_the_committed_files(when):
    matrices_match(RUN, labels(), DIAGNOSES[when], when)


def test_the_notes_quote_those_scores():
    scores_quoted(RUN, "65f6157", labels(), DIAGNOSES)


def test_the_promises_kept_under_half_and_the_tuned_check_are_the_judges():
    promises_and_tuned(RUN, DIAGNOSES)
    (hf,) = [r for r in Z.read_steps([RUN / "diagnoses-e1.json"]) if r["name"] == "hf_trainer_dynamic_padding"]
    (label,) = [r for r in labels() if r["name"] == "hf_trainer_dynamic_padding"]
    gain = label["fixes"]["varying_shapes"]["gain"]
    kept = (1 - 1 / gain) / hf["verdicts"][0]["expected"]
    assert f"hf_trainer_dynamic_padding's varying_shapes keeps {100 * kept:.0f} % (label {gain:.3g}x" in notes(RUN)


def test_the_records_under_one_set_of_rules_name_the_same_tops():
    same_tops(DIAGNOSES)


@pytest.mark.parametrize("name, settled, first, timed, lo, hi, top, gain", [
    ("bert_variable_lengths_compile", "6.78", 8, 20, "125", "6467", "compile_recompiles", "2.03"),
    ("fairseq_token_batches", "15.1", 15, 40, "114", "157", "varying_shapes", "2.06"),
    ("hf_trainer_dynamic_padding", "20.1", 14, 20, "165", "220", "varying_shapes", "3.63")])
def test_each_steps_settled_step_and_first_runs_are_the_diagnosis(name, settled, first, timed, lo, hi, top, gain):
    first_runs_quoted(RUN, "diagnoses-e1.json", name, settled, first, timed, lo, hi, top, gain,
                      "the settled step ({} ms)")
