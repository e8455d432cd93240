"""The GPU proof's own bookkeeping, on the CPU without grading: a run past its deadline lists what it did not
begin, saves after every exercise, and its table says so."""
from gpulab.exercises import proof


def test_past_its_deadline_the_proof_lists_what_it_did_not_begin_and_saves_it():
    saved = []
    result = proof.prove(["01.sync", "07.align"], scale="tiny", repeat=5, budget_s=1.0, repeat_task="01.sync",
                         deadline_s=-1.0, save=saved.append, log=lambda s: None)
    assert result["rows"] == [] and result["not_run"] == ["01.sync", "07.align"] and result["stability"] is None
    assert saved and saved[-1]["not_run"] == ["01.sync", "07.align"]
    assert "Not run (the run's deadline had passed): 01.sync, 07.align" in proof.table(result)


def test_the_table_has_a_row_per_exercise_with_its_cheats_and_the_repeat():
    row = {"task": "01.sync", "tier": "systems",
           "reference": {"reference_ratio": 1.18, "state": "passed", "target": 1.09, "grading_s": 1.6},
           "as_given": {"ratio": 1.0, "state": "failed", "grading_s": 1.8},
           "cheats": {"a": {"state": "failed"}, "b": {"state": "suspicious"}, "c": {"state": "passed"}}}
    text = proof.table({"rows": [row], "stability": {"task": "01.sync", "ratios": [1.2, 1.25, None], "median": 1.225,
                                                     "worst_off_median": 0.02}})
    assert "| 01.sync | systems | 1.18x, passed | 1.09x | 1.00x, failed | 2 of 3 | 1.60, 1.80 |" in text
    assert "ratios 1.200, 1.250, n/a; the farthest 2.0% from their median 1.225" in text
