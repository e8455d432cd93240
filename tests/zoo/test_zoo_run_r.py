"""zoo/README.md's seventh run comes from run R's committed files: labels r (the median of three label runs,
each run's figure kept), run N's records analysed again by 8ec9b2d's rules, and call 1's records."""
import json
import statistics
from pathlib import Path

from gpulab.diagnose import zoo as Z
from gpulab.diagnose.core import from_record

ROOT = Path(__file__).resolve().parents[2]
RES = ROOT / "results" / "zoo"
README = " ".join((ROOT / "zoo" / "README.md").read_text().split())


def _file(name):
    """A committed zoo file by its name, in whichever run folder of results/zoo/ holds it."""
    found = sorted(RES.rglob(name))
    assert len(found) == 1, f"{name}: {len(found)} entries of that name under results/zoo/"
    return found[0]


def _steps(name):
    return json.loads(_file(name).read_text())["steps"]


def test_labels_r_are_the_medians_of_their_runs():
    for s in _steps("labels-h200-2026-12-02-r.json"):
        fix = s["fixes"]["cudagraphs_skipped"]
        assert fix["gain"] == statistics.median(fix["runs_gain"]) and len(fix["runs_gain"]) == 3
        assert s["best"] == "cudagraphs_skipped" and s["best_gain"] == fix["gain"]
        runs = ", ".join(f"{g:.3g}x" for g in fix["runs_gain"][:-1]) + f" and {fix['runs_gain'][-1]:.3g}x"
        assert f"{runs} (median {fix['gain']:.3g}x" in README


def test_run_n_under_8ec9b2d_against_labels_r_and_d():
    diagnoses = _steps("diagnoses-h200-2026-12-02-n-by-8ec9b2d.json")
    result = Z.judge(_steps("labels-h200-2026-12-02-r.json"), diagnoses)
    assert Z.matrix_text(result) == _file("matrix-h200-2026-12-02-n-by-8ec9b2d-labels-r.txt").read_text().rstrip("\n")
    assert all(ok for _, ok, _ in result["checks"])
    promise = {d["name"]: d["verdicts"][0]["expected_gain"] for d in diagnoses}
    kept = {m[0]: m[5] for m in result["measured"]}
    for name in kept:
        assert f"promised {promise[name]:.3g}x on `{name}` and kept {100 * kept[name]:.0f} %" in README
    d_labels = ([s for s in _steps("labels-h200-2026-12-02-d.json") if s["name"] == "reduce_overhead_skipped"]
                + _steps("labels-h200-2026-12-02-n.json"))
    old = Z.judge(d_labels, diagnoses)
    assert Z.matrix_text(old) == _file("matrix-h200-2026-12-02-n-by-8ec9b2d-labels-d.txt").read_text().rstrip("\n")
    first = next(m for m in old["measured"] if m[0] == "reduce_overhead_skipped")
    assert not first[4] and f"the first keeps {100 * first[5]:.0f} %" in README


def test_the_fixed_steps_replay_cost():
    rec = _file("records-h200-2026-12-02-r")
    before = from_record(str(rec / "zoo-reduce_overhead_skipped-as-written.json.xz")).facts
    after = from_record(str(rec / "zoo-reduce_overhead_skipped-fixed.json.xz")).facts
    inside, launching = before.compiled_host_ms * before.host_scale, before.compiled_launch_ms * before.host_scale
    replayed = after.compiled_host_ms * after.host_scale
    assert (f"spent {inside:.3g} ms per step inside compiled code (the profiled time times `host_scale`), "
            f"{launching:.3g} ms of it launching; with its graphs replayed, {replayed:.3g} ms. The "
            f"{inside - launching:.2g} ms outside the launching stretch stayed, and the replay added only "
            f"{replayed - (inside - launching):.2g} ms") in README


def test_run_h_under_the_current_rules_against_labels_d_with_rs_medians():
    """zoo/README.md's eighth section: labels dr are labels d with labels r's steps taken from labels r, nothing
    else changed; run H's records by 8ec9b2d's rules (unchanged since) against them pass all three checks."""
    d, r, dr = (_steps(f"labels-h200-2026-12-02-{k}.json") for k in ("d", "r", "dr"))
    from_r = {s["name"]: s for s in r}
    assert dr == [from_r.get(s["name"], s) for s in d] + [s for s in r if s["name"] not in {x["name"] for x in d}]
    result = Z.judge(dr, _steps("diagnoses-h200-2026-12-02-h-by-8ec9b2d.json"))
    assert Z.matrix_text(result) == _file("matrix-h200-2026-12-02-h-by-8ec9b2d-labels-dr.txt").read_text().rstrip("\n")
    assert all(ok for _, ok, _ in result["checks"])
    kept = sorted((m[5], m[0], m[1]) for m in result["measured"] if m[2] is not None)
    lowest = [k for k in kept if k[0] >= 0.5][:2]
    demoted = [k for k in kept if k[0] < 0.5]
    for share, step, rule in lowest + demoted:
        assert f"`{step}` / {rule} {100 * share:.0f} %" in README
