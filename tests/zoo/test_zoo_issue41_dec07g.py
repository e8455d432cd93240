"""results/zoo/2026-12-07-h100-issue41-g/: bert_variable_lengths_compile and fairseq_token_batches diagnosed and
labelled on one H100. Its matrices come from the committed labels and diagnoses, and its NOTES.md quotes the judge's
scores, the failing checks, each step's label and diagnosis, and what padding fairseq's batches to few shapes costs."""
import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

from gpulab.diagnose import zoo as Z

from test_zoo_issue41_dec07b import RUN as RUN_B, previous_label_files
from test_zoo_issue41_dec07 import failing_checks, matrices_match, scores_quoted
from test_zoo_issue41_dec07f import notes as notes_of, scores_and_halves_quoted

REPO = Path(__file__).resolve().parents[2]
RUN = REPO / "results" / "zoo" / "2026-12-07-h100-issue41-g"
DIAGNOSES = {"after": [RUN / "diagnoses-by-a521a62.json"], "before": [RUN / "diagnoses-by-822f1d6.json"]}


def labels() -> list:
    """The labels the runs before judged with (test_zoo_issue41_dec07b's), then this folder's."""
    return Z.read_steps([*previous_label_files(), *sorted(RUN_B.glob("labels-b[1-3].json")), RUN / "labels-g1.json",
                         RUN / "labels-g2.json"])


def notes() -> str:
    return notes_of(RUN)


@pytest.mark.parametrize("when", ["after", "before"])
def test_the_matrices_come_from_the_committed_files(when):
    matrices_match(RUN, labels(), DIAGNOSES[when], when)


def test_the_notes_quote_the_scores_and_the_halves():
    scores_and_halves_quoted(RUN, "a521a62", labels(), DIAGNOSES)


def test_the_zoo_readme_quotes_those_scores():
    scores_quoted(RUN, "a521a62", labels(), DIAGNOSES)


def test_the_failing_checks_are_the_judges():
    tuned, failing = failing_checks(RUN, labels(), DIAGNOSES["after"])
    assert tuned == "over: fairseq_token_batches" and "fairseq_token_batches" in notes()
    assert set(failing) == {"timm_train_one_epoch/optimizer_unfused", "bert_variable_lengths_compile/compile_recompiles",
                            "fairseq_token_batches/varying_shapes"}


@pytest.mark.parametrize("name, live", [("bert_variable_lengths_compile", "diagnoses-g1.json"),
                                        ("fairseq_token_batches", "diagnoses-g2.json")])
def test_each_steps_row_is_its_label_and_its_diagnosis(name, live):
    (d,) = [r for r in Z.read_steps([RUN / live]) if r["name"] == name]
    (lab,) = [r for r in labels() if r["name"] == name]
    top = d["verdicts"][0]
    cell = f"{d['step_ms']:.3g} ms, {top['rule']}, {1 / (1 - top['expected']):.3g}x"
    fixes = ", ".join(f"{r} {f['gain']:.2f}x" for r, f in lab["fixes"].items())
    assert f"| {name} | {cell} | {lab['as_written']['ms']:.3g} ms; {fixes}: **{lab['best'] or 'tuned'}** |" in notes()


def test_berts_fix_by_its_medians_keeps_most_of_its_promise():
    (lab,) = [r for r in labels() if r["name"] == "bert_variable_lengths_compile"]
    (d,) = Z.read_steps([RUN / "diagnoses-g1.json"])
    fix, written = lab["fixes"]["compile_recompiles"], lab["as_written"]
    by_median = written["median_ms"] / fix["median_ms"]
    kept = (1 - 1 / by_median) / d["verdicts"][0]["expected"]
    assert (f"median {fix['median_ms']:.3g} ms, mean {fix['ms']:.3g} ms (the as-written step's "
            f"{written['median_ms']:.3g} and {written['ms']:.3g}); by the medians the fix buys {by_median:.3g}x, "
            f"{100 * kept:.0f} % of the promise") in notes()


@pytest.fixture(scope="module")
def fairseq():
    sys.path.insert(0, str(REPO / "zoo"))
    try:
        yield importlib.import_module("fairseq_token_batches")
    finally:
        sys.path.remove(str(REPO / "zoo"))


def test_what_padding_fairseqs_batches_to_few_shapes_costs(fairseq):
    cfg = fairseq.SIZES["full"]
    batches = [fairseq.token_batch(0, k, cfg).shape for k in range(300)]
    real = sum(n * (t - 1) for n, t in batches)
    up = lambda x, q: -(-x // q) * q                                     # noqa: E731
    pow2 = lambda x: 1 << int(np.ceil(np.log2(x)))                       # noqa: E731
    ways = {"fix": lambda n, t: (up(n, cfg["rows"]), up(t, cfg["length"])),
            "pow2": lambda n, t: (pow2(n), max(32, pow2(t))),
            "128x64": lambda n, t: (up(n, 128), up(t, 64))}
    got = {}
    for way, pad in ways.items():
        shapes = [pad(n, t - 1) for n, t in batches]
        got[way] = (len(set(shapes)), sum(a * b for a, b in shapes) / real)
    assert (f"its fix's padding (rows to 16, lengths to 32) adds {got['fix'][1]:.2f}x the tokens and leaves "
            f"{got['fix'][0]} shapes; rows and lengths padded to powers of two leave {got['pow2'][0]} shapes for "
            f"{got['pow2'][1]:.2f}x the tokens; rows to 128 and lengths to 64, {got['128x64'][0]} shapes for "
            f"{got['128x64'][1]:.2f}x") in notes()
    # the fix as the step makes it pads to those multiples: the first shape is the fix's own
    assert tuple(fairseq.padded(fairseq.token_batch(0, 0, cfg), cfg).shape) == (ways["fix"](*batches[0])[0],
                                                                                 ways["fix"](batches[0][0], batches[0][1] - 1)[1] + 1)
