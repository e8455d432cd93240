"""results/zoo/2026-12-07-h100-issue41/'s matrices come from the committed labels (both H100 folders of 2026-12-06,
then this run's) and diagnoses (e906886's live ones, then this run's; before: both runs' records under the rules of
822f1d6), and its NOTES.md and zoo/README.md quote those scores."""
import re
from pathlib import Path

import pytest

from gpulab.diagnose import zoo as Z

from test_zoo_issue41 import NEW

RES = Path(__file__).resolve().parents[2] / "results" / "zoo"
OLD_LABELS, OLD_RUN, RUN = (RES / n for n in ("2026-12-06-h100-issue41", "2026-12-06-h100-issue41-diagnoses",
                                              "2026-12-07-h100-issue41"))


def label_files():
    return (sorted(OLD_LABELS.glob("labels-[1-6]-6.json")) + [OLD_LABELS / "labels-6-6-rest.json",
            OLD_RUN / "labels-again-4-new-steps.json"] + sorted(RUN.glob("labels-7[a-d].json")))


def labels():
    return Z.read_steps(label_files())            # a step's last row, as `zoo judge` reads them


DIAGNOSES = {"after": [OLD_RUN / f for f in ("diagnoses-new-steps.json", "diagnoses-old-steps-a.json",
                                             "diagnoses-old-steps-b.json")]
             + [RUN / "diagnoses-7a.json", RUN / "diagnoses-7b.json"],
             "before": [RUN / "diagnoses-by-822f1d6.json"]}


def matrices_match(run: Path, label_rows: list, diagnoses: list, when: str) -> None:
    """`run`/matrix-WHEN.txt and matrix-WHEN-new-steps.txt are the judge's of these labels and diagnoses."""
    d = Z.read_steps(diagnoses)
    assert Z.matrix_text(Z.judge(label_rows, d)) == (run / f"matrix-{when}.txt").read_text().rstrip("\n")
    new = Z.judge([r for r in label_rows if r["name"] in NEW], d)
    assert Z.matrix_text(new) == (run / f"matrix-{when}-new-steps.txt").read_text().rstrip("\n")


@pytest.mark.parametrize("when", ["after", "before"])
def test_the_matrices_come_from_the_committed_files(when):
    matrices_match(RUN, labels(), DIAGNOSES[when], when)


def scores_quoted(run: Path, commit: str, label_rows: list, diagnoses: dict) -> None:
    """`run`/NOTES.md's table rows and zoo/README.md's sentence quote the judge's scores: the whole zoo and the new
    steps, after (the live diagnoses, `commit`) and before (`diagnoses["before"]`, the frozen rules)."""
    def score(when, new=False):
        rows = [r for r in label_rows if not new or r["name"] in NEW]
        why = dict((n, w) for n, _, w in Z.judge(rows, Z.read_steps(diagnoses[when]))["checks"])
        return re.match(r"(\d+) of (\d+)", why["top verdict names the best fix"]).groups()
    notes = (run / "NOTES.md").read_text()
    readme = " ".join((Path(__file__).resolve().parents[2] / "zoo" / "README.md").read_text().split())
    a, b, an, bn = score("after"), score("before"), score("after", True), score("before", True)
    row = lambda s: f"{s[0]} of {s[1]} ({100 * int(s[0]) / int(s[1]):.0f} %)"      # noqa: E731
    assert f"before (822f1d6)     {row(b)}  {row(bn)}" in notes
    assert f"after  ({commit})     {row(a)}  {row(an)}" in notes
    assert (f"the top verdict names the labelled best fix on {a[0]} of {a[1]} (before, the rules frozen at 822f1d6 "
            f"on the same records: {b[0]} of {b[1]}); on the new steps {an[0]} of {an[1]} (before {bn[0]} of "
            f"{bn[1]})") in readme


def failing_checks(run: Path, label_rows: list, diagnoses: list) -> tuple[str, dict]:
    """The judge's tuned check ("" where it passed, else whom it names) and the promises kept under half, {step/rule:
    gain}, each of those named with its gain in `run`/NOTES.md."""
    checks = {n: (ok, why) for n, ok, why in Z.judge(label_rows, Z.read_steps(diagnoses))["checks"]}
    ok, tuned = checks["tuned steps: no verdict expects more than 10 %"]
    kept, why = checks["every measured verdict kept half its expectation, or was demoted"]
    failing = {} if kept else dict(re.findall(r"(\w+/\w+): ([\d.]+x)", why.split("failing:")[1]))
    notes = " ".join((run / "NOTES.md").read_text().split())
    assert all(f"{k} {g}" in notes for k, g in failing.items()), failing
    return ("" if ok else tuned), failing


def test_the_notes_and_the_readme_quote_those_scores():
    scores_quoted(RUN, "624d563", labels(), DIAGNOSES)


def test_the_promises_the_notes_name_are_the_judges():
    """The four verdicts NOTES.md names as kept under half are the ones the judge lists, with their gains."""
    tuned, failing = failing_checks(RUN, labels(), DIAGNOSES["after"])
    assert failing == {"vit_manual_attention/misaligned_gemm": "0.995x",
                       "timm_train_one_epoch/optimizer_unfused": "1.05x",
                       "nanogpt_shakespeare_char/input_bound": "0.894x",
                       "fairseq_token_batches/varying_shapes": "0.868x"}
    assert tuned == ""


def test_the_records_under_one_set_of_rules_name_the_same_tops():
    """diagnoses-by-9785415.json: all records re-analysed by one commit's rules, with the live gains: the same top
    verdict as the live diagnoses on every judged step, and nanogpt's input_bound gone from the promises kept under
    half (NOTES.md, "The same records under one set of rules")."""
    live = Z.judge(labels(), Z.read_steps(DIAGNOSES["after"]))
    one = Z.judge(labels(), Z.read_steps([RUN / "diagnoses-by-9785415.json"]))
    tops = lambda j: {r["name"]: (r.get("top"), r.get("hit")) for r in j["rows"]}      # noqa: E731
    assert tops(one) == tops(live)
    why = {n: w for n, _, w in one["checks"]}["every measured verdict kept half its expectation, or was demoted"]
    assert "nanogpt_shakespeare_char/input_bound" not in why and why.count(" kept ") == 3, why


def test_a_top_no_label_can_time_is_a_miss_not_a_pass():
    """A cheat of the judge's own (2026-12-07): name first, on every step, a fix no step's FIXES holds
    (data_parallel, which no label times on one GPU), promising 1.05x and measuring nothing. The tuned check and the
    kept-half check have nothing to hold against it, so the judge must count an untimed top as a miss: 0 hits."""
    rows = [r for r in labels() if "skipped" not in r and "error" not in r]
    cheat = [{"name": r["name"], "verdicts": [{"rule": "data_parallel", "actionable": True, "demoted": False,
                                               "measured": None, "expected_gain": 1.05, "bound": 1.05,
                                               "share": 0.05, "expected": 0.05}]} for r in rows]
    c = {n: (ok, why) for n, ok, why in Z.judge(rows, cheat)["checks"]}
    assert c["top verdict names the best fix"][0] is False
    assert c["top verdict names the best fix"][1].startswith("0 of "), c
    assert c["tuned steps: no verdict expects more than 10 %"][0] is True
    assert c["every measured verdict kept half its expectation, or was demoted"][0] is not False
