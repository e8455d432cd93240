"""results/zoo/2026-12-07-h100-issue41-c/'s matrices come from the committed labels (every H100 label file, the
newest last) and diagnoses (the live ones before it, then its five; before: all 43 records under the rules of
822f1d6), and its NOTES.md and zoo/README.md quote those scores, the promises kept under half, the halves, and the
split of the shape-changing steps' timed steps into fast and slow ones."""
import json
import statistics
from pathlib import Path

import pytest

from gpulab.diagnose import zoo as Z
from gpulab.diagnose.core import open_record

from test_zoo_issue41_dec07b import DIAGNOSES as BEFORE_THIS, UNDER_HALF, labels
from test_zoo_issue41_dec07 import failing_checks, matrices_match, scores_quoted

RUN = Path(__file__).resolve().parents[2] / "results" / "zoo" / "2026-12-07-h100-issue41-c"
DIAGNOSES = {"after": BEFORE_THIS["after"] + [RUN / f"diagnoses-c{i}.json" for i in range(1, 6)],
             "before": [RUN / "diagnoses-by-822f1d6.json"], "one": [RUN / "diagnoses-by-b5bc435.json"]}


def notes() -> str:
    return " ".join((RUN / "NOTES.md").read_text().split())


@pytest.mark.parametrize("when", ["after", "before"])
def test_the_matrices_come_from_the_committed_files(when):
    matrices_match(RUN, labels(), DIAGNOSES[when], when)


def test_the_notes_and_the_readme_quote_those_scores():
    scores_quoted(RUN, "b5bc435", labels(), DIAGNOSES)


def test_the_misses_and_the_failing_checks_are_the_ones_the_notes_name():
    judged = Z.judge(labels(), Z.read_steps(DIAGNOSES["after"]))
    misses = {r["name"] for r in judged["rows"] if "hit" in r and not r["hit"] and not r.get("tie")}
    ties = {r["name"] for r in judged["rows"] if r.get("tie")}
    assert misses == {"vit_manual_attention", "cifar10_tutorial_per_class"}, misses
    assert ties == {"pageable_uint8_images", "transformer_under_cap"}, ties
    assert failing_checks(RUN, labels(), DIAGNOSES["after"]) == (
        "over: bert_variable_lengths_compile, fairseq_token_batches", UNDER_HALF)


def test_the_records_under_one_set_of_rules_name_the_same_tops():
    tops = lambda j: {r["name"]: (r.get("top"), r.get("hit")) for r in j["rows"]}      # noqa: E731
    assert tops(Z.judge(labels(), Z.read_steps(DIAGNOSES["one"]))) == tops(Z.judge(labels(), Z.read_steps(DIAGNOSES["after"])))


def test_the_halves_the_notes_quote_are_the_judges():
    for when, (held, dev) in {"after": ((13, 16), (19, 20)), "before": ((9, 16), (15, 20))}.items():
        rows = [r for r in Z.judge(labels(), Z.read_steps(DIAGNOSES[when]))["rows"] if "hit" in r]
        for half, (hits, of) in ((True, held), (False, dev)):
            got = [r["hit"] for r in rows if r["held_out"] == half]
            assert (sum(got), len(got)) == (hits, of), (when, half)
    assert ("On the held-out half (`zoo.held_out`) the top names the best fix on 13 of 16 labelled steps after and 9 "
            "of 16 before; on the development half 19 of 20 after and 15 of 20 before") in notes()


def test_the_two_widened_variants_came_first_on_the_steps_they_were_written_for():
    rows = {r["name"]: r for r in Z.read_steps([RUN / "diagnoses-c1.json"])}
    for name, words in (("coteaching_numpy_argsort", "each of the 2 models in step.model"),
                        ("torchvision_reference_classification", "the model compiled")):
        top = rows[name]["verdicts"][0]
        assert top["rule"] == "launch_bound" and "compiled alone" in top["confirmation"], name
        assert words in top["confirmation"], top["confirmation"]


@pytest.mark.parametrize("name, timed, fast, median, slow, lo, hi", [
    ("bert_variable_lengths_compile", 20, 12, "4.46", 8, "88.7", "1154"),
    ("fairseq_token_batches", 50, 31, "10.56", 19, "91.5", "102"),
    ("hf_trainer_dynamic_padding", 40, 11, "10.83", 29, "96.6", "110")])
def test_the_fast_and_slow_steps_the_notes_quote_are_the_records(name, timed, fast, median, slow, lo, hi):
    """NOTES.md's table: a timed step is fast under 3x the fastest one, and the fast ones' median is near the label's
    settled step."""
    steps = json.load(open_record(RUN / "records" / f"{name}.json.xz"))["stalls"]["step_ms"]
    quick = [t for t in steps if t < 3 * min(steps)]
    late = [t for t in steps if t >= 3 * min(steps)]
    assert (len(steps), len(quick), len(late)) == (timed, fast, slow)
    assert f"{statistics.median(quick):.2f}" == median
    assert float(lo) == pytest.approx(min(late), rel=0.005) and float(hi) == pytest.approx(max(late), rel=0.005)
    assert f"| {name} | {timed} | {fast} | {median} ms | {slow} | {lo}-{hi} ms |" in notes()


def test_the_readme_quotes_how_much_slower_the_slow_steps_ran():
    """zoo/README.md: the slow steps ran 8.7x to 259x their step's fast median, over the three steps."""
    ratios = []
    for name in ("bert_variable_lengths_compile", "fairseq_token_batches", "hf_trainer_dynamic_padding"):
        steps = json.load(open_record(RUN / "records" / f"{name}.json.xz"))["stalls"]["step_ms"]
        median = statistics.median(t for t in steps if t < 3 * min(steps))
        ratios += [t / median for t in steps if t >= 3 * min(steps)]
    quoted = f"{min(ratios):.2g}x to {max(ratios):.3g}x slower"
    assert quoted == "8.7x to 258x slower"
    assert quoted in " ".join((RUN.parents[2] / "zoo" / "README.md").read_text().split())
