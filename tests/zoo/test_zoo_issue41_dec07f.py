"""results/zoo/2026-12-07-cpu-issue41-f/: the H100 records analysed again by the rules of 899e8b4 (attention by hand
counts its heads' copies; misaligned_gemm leaves attention's products to attention_math). Its matrices come from the
committed labels and diagnoses, and its NOTES.md quotes the judge's scores and the promises kept under half."""
import re
from pathlib import Path

import pytest

from gpulab.diagnose import zoo as Z

from test_zoo_issue41_dec07b import labels
from test_zoo_issue41_dec07 import NEW, failing_checks, matrices_match

ZOO = Path(__file__).resolve().parents[2] / "results" / "zoo"
RUN = ZOO / "2026-12-07-cpu-issue41-f"
DIAGNOSES = {"after": [RUN / "diagnoses-by-899e8b4.json"],
             "before": [ZOO / "2026-12-07-h100-issue41-e" / "diagnoses-by-822f1d6.json"]}


def notes(run: Path = RUN) -> str:
    return " ".join((run / "NOTES.md").read_text().split())


@pytest.mark.parametrize("when", ["after", "before"])
def test_the_matrices_come_from_the_committed_files(when):
    matrices_match(RUN, labels(), DIAGNOSES[when], when)


def score(label_rows, diagnoses, names=None, half=None):
    rows = [r for r in label_rows if names is None or r["name"] in names]
    why = dict((n, w) for n, _, w in Z.judge(rows, Z.read_steps(diagnoses), only=half)["checks"])
    return tuple(int(x) for x in re.match(r"(\d+) of (\d+)", why["top verdict names the best fix"]).groups())


def scores_and_halves_quoted(run: Path, commit: str, label_rows: list, diagnoses: dict) -> None:
    """`run`/NOTES.md's table quotes the judge's scores after (`commit`) and before (822f1d6), the whole zoo and the
    new steps, and its sentence the held-out and development halves; the whole zoo's score after passes."""
    sc = lambda when, **kw: score(label_rows, diagnoses[when], **kw)        # noqa: E731
    row = lambda s: f"{s[0]} of {s[1]} ({100 * s[0] / s[1]:.0f} %)"      # noqa: E731
    text = (run / "NOTES.md").read_text()
    assert f"before (822f1d6)     {row(sc('before'))}  {row(sc('before', names=NEW))}" in text
    assert f"after  ({commit})     {row(sc('after'))}  {row(sc('after', names=NEW))}" in text
    assert sc("after")[0] / sc("after")[1] >= Z.TOP_HITS_MIN          # what the notes say passes, passes
    held, held_before = sc("after", half="held_out"), sc("before", half="held_out")
    dev, dev_before = sc("after", half="dev"), sc("before", half="dev")
    assert (f"The held-out half reads {held[0]} of {held[1]} (before {held_before[0]} of {held_before[1]}), the "
            f"development half {dev[0]} of {dev[1]} (before {dev_before[0]} of {dev_before[1]})") in notes(run)


def test_the_notes_quote_the_scores_and_the_halves():
    scores_and_halves_quoted(RUN, "899e8b4", labels(), DIAGNOSES)


def test_vit_is_a_hit_by_its_attention_whose_promise_is_its_labels():
    (row,) = [r for r in Z.judge(labels(), Z.read_steps(DIAGNOSES["after"]))["rows"] if r["name"] == "vit_manual_attention"]
    assert row["hit"] and row["top"] == "attention_math" and "misaligned_gemm" not in row["fired"]
    promise = 1 / (1 - row["fired"]["attention_math"]["expected"])
    assert f"promise from 1.51x to **{promise:.3g}x; its label measured {row['label_gain']:.3g}x**" in notes()


def test_the_failing_checks_are_the_judges():
    tuned, failing = failing_checks(RUN, labels(), DIAGNOSES["after"])
    assert tuned == "over: bert_variable_lengths_compile, fairseq_token_batches"
    assert set(failing) == {"timm_train_one_epoch/optimizer_unfused", "bert_variable_lengths_compile/compile_recompiles",
                            "fairseq_token_batches/varying_shapes"}
