"""Ranking, demotion and judging a fix's gain (`rank`, `demote`, `judge_gain`), moved out of test_rules.py, which
holds every rule at its edges."""
import math

import pytest

from gpulab.diagnose import rules as R

from test_rules import BELOW, WINDOW, facts, stalls


# -- ranking ---------------------------------------------------------------------------------------------
def v(rule, share, expected=None, blocked_by="", measured=None, actionable=True):
    out = R.verdict(rule, rule, "00", share, "e", "f", actionable=actionable, expected=expected, blocked_by=blocked_by)
    return out if measured is None else R.demote(out, measured, "measured")


def rules(verdicts):
    return [x.rule for x in verdicts]


def test_rank_by_expected_gain_not_by_bound():
    # fp32's bound is larger but its expectation smaller
    fp32, sync = v("fp32_matmuls", 0.5, expected=0.1), v("host_sync", 0.3)
    assert rules(R.rank([fp32, sync])) == ["host_sync", "fp32_matmuls"]


def test_rank_a_measured_gain_beats_an_expected_one():
    measured = v("input_bound", 0.2, measured=1.6)          # expected 1.25x, measured 1.6x
    expected = v("host_sync", 0.3)                          # expected 1.43x
    assert rules(R.rank([expected, measured])) == ["input_bound", "host_sync"]
    below = v("input_bound", 0.2, measured=1.2)
    assert rules(R.rank([below, expected])) == ["host_sync", "input_bound"]


def test_rank_puts_a_blocked_fix_right_after_its_blocker_which_ranks_by_what_it_unlocks():
    sync = v("host_sync", 0.02)                             # 1.02x by itself
    launch = v("launch_bound", 0.5, blocked_by="host_sync")  # 2x once the syncs are gone
    inp = v("input_bound", 0.3)                             # 1.43x
    assert rules(R.rank([inp, launch, sync])) == ["host_sync", "launch_bound", "input_bound"]
    # without its blocker present, a blocked fix ranks by its own gain
    assert rules(R.rank([inp, launch])) == ["launch_bound", "input_bound"]
    # a blocker worth less than its blocked fix's gain still ranks by the better of the two
    small = v("launch_bound", 0.1, blocked_by="host_sync")
    assert rules(R.rank([inp, small, sync])) == ["input_bound", "host_sync", "launch_bound"]


def test_rank_keeps_two_fixes_blocked_by_one_in_their_order():
    sync = v("host_sync", 0.01)
    big = v("launch_bound", 0.6, blocked_by="host_sync")            # 2.5x
    small = v("compile_graph_breaks", 0.3, blocked_by="host_sync")  # 1.43x
    assert rules(R.rank([big, small, sync, v("input_bound", 0.1)])) == [
        "host_sync", "launch_bound", "compile_graph_breaks", "input_bound"]


def test_rank_breaks_ties_by_the_smaller_fix():
    order = R.FIX_ORDER
    assert order.index("host_code") < order.index("input_bound") < order.index("launch_bound")
    same = [v("launch_bound", 0.2), v("input_bound", 0.2), v("host_code", 0.2)]
    assert rules(R.rank(same)) == ["host_code", "input_bound", "launch_bound"]
    near = [v("input_bound", 0.2), v("host_code", 0.199)]   # within TIE of each other
    assert rules(R.rank(near)) == ["host_code", "input_bound"]
    apart = [v("launch_bound", 0.25), v("host_code", 0.2)]   # 1.33x against 1.25x: more than TIE apart
    assert rules(R.rank(apart)) == ["launch_bound", "host_code"]
    assert rules(R.rank([v("host_code", 0.1), v("input_bound", 1.0)])) == ["input_bound", "host_code"]   # infinite


def test_rank_puts_what_is_not_a_fix_last():
    note = v("memory_full", 0.0, actionable=False)
    left = v("compute_bound", 0.9, actionable=False)
    assert rules(R.rank([left, note, v("host_code", 0.06)])) == ["host_code", "compute_bound", "memory_full"]


def test_demote_flags_a_fix_that_kept_under_half_its_promise():
    promise = v("input_bound", 0.5)                         # expected to remove half the step: 2x
    kept = R.demote(promise, 1.34, "measured 1.34x")        # removed 25.4 % of the step: 51 % of the promise
    assert not kept.demoted and kept.measured == 1.34 and kept.confirmation == "measured 1.34x"
    short = R.demote(promise, 1.33, "measured 1.33x")       # 24.8 %: under half
    assert short.demoted and short.gain == 1.33
    assert short.confirmation.startswith("measured 1.33x; demoted: it saved 50% of the expected 50.0 %")
    # a demoted fix ranks by what it measured
    assert rules(R.rank([short, v("host_code", 0.3)])) == ["host_code", "input_bound"]
    assert rules(R.rank([short, v("host_code", 0.2)])) == ["input_bound", "host_code"]
    # nothing was promised: nothing to fall short of
    assert not R.demote(v("host_sync", 0.0), 1.0, "m").demoted


def test_demote_only_for_a_shortfall_beyond_the_steps_spread():
    """A 100 ms step expected to lose 20 ms (1.25x) that lost 6 (kept 30 %): demoted when the 14 ms it fell short
    by is more than the two timings' spread, kept (and saying why) when the spread covers it."""
    promise = v("optimizer_unfused", 0.2)
    measured = 1 / (1 - 0.06)
    assert R.demote(promise, measured, "m", step_ms=100.0, noise_ms=13.9).demoted
    kept = R.demote(promise, measured, "m", step_ms=100.0, noise_ms=14.1)
    assert not kept.demoted and "not demoted" in kept.confirmation and "within the steps' spread (14.1 ms)" in \
        kept.confirmation and "14 ms it fell short by" in kept.confirmation
    assert R.demote(promise, measured, "m").demoted                     # no step time given: as before


def test_judge_gain_against_the_promise():
    g = R.judge_gain(100.0, 60.0, 2.0)                       # promised 50 ms, saved 40
    assert g["promised_ms"] == pytest.approx(50.0) and g["saved_ms"] == pytest.approx(40.0)
    assert g["of_promised"] == pytest.approx(0.8) and g["within"] and g["enough"]
    assert not R.judge_gain(100.0, 76.0, 2.0)["enough"]      # 24 of 50
    assert not R.judge_gain(100.0, 48.0, 2.0)["within"]      # 52 of 50, beyond the 1 % floor
    assert R.judge_gain(100.0, 49.5, 2.0)["within"]          # within the noise floor
    assert R.judge_gain(100.0, 48.0, 2.0, 0.02, 0.01)["within"]
    assert R.judge_gain(100.0, 50.0, None)["bound"] == math.inf


def test_one_row_per_rule_holds_its_name_column_order_and_gpu_reason():
    """Issue 42: a rule's facts are one row of rules.TABLE; RULES, GPU_ONLY, FIX_ORDER and the suite's column
    heads are read from it, and a rule's name is its function's (no renaming)."""
    from gpulab.diagnose import suite
    assert [r.name for r in R.TABLE] == [f.__name__ for f in R.RULES]
    assert suite.RULE_NAMES == tuple(r.name for r in R.TABLE) and suite.SHORT is R.SHORT
    ties = [r.tie for r in R.TABLE if r.tie is not None]
    assert sorted(ties) == list(range(len(ties))), "each fix has its own place in the tie order"
    assert len(set(R.SHORT.values())) == len(R.TABLE), "two rules share a column head"
    assert all(r.gpu_only.startswith("needs a GPU") for r in R.TABLE if r.gpu_only)


def test_a_stall_in_every_timed_chunk_is_bounded_by_the_gpus_idle():
    """cnn_tf32_off_inside on the H100 (2026-12-06): slow host steps every 5 steps, the chunk's length, in a step
    whose GPU idled 1 %: the queue filling after each chunk's synchronize, not a stall."""
    every = dict(slow=(4, 9, 14, 19), period=5, every_chunk=True)
    gpu_bound = facts(stalls=stalls(100.0, 80.0, **every))                  # no host time: the GPU never idles
    assert gpu_bound.base_idle_ms == 0 and R.periodic_stall(gpu_bound) is None
    # the GPU idle 12 % of the step: the 20 % excess is bounded by it, and says so
    idle = facts(host={"user": 0.12 * WINDOW}, stalls=stalls(100.0, 80.0, **every))
    v = R.periodic_stall(idle)
    assert v.share == pytest.approx(0.12) and "bounded by the GPU's idle time, 12" in v.evidence
    # at the rule's own bar, and just under it
    edge = facts(host={"user": R.STALL_SHARE_MIN * WINDOW}, stalls=stalls(100.0, 80.0, **every))
    assert R.periodic_stall(edge).share == pytest.approx(R.STALL_SHARE_MIN)
    under = facts(host={"user": (R.STALL_SHARE_MIN - BELOW) * WINDOW}, stalls=stalls(100.0, 80.0, **every))
    assert R.periodic_stall(under) is None
    # idle above the excess: the excess stands, unbounded; and where some chunk was clean, no bound at all
    assert R.periodic_stall(facts(host={"user": 0.5 * WINDOW}, stalls=stalls(100.0, 80.0, **every))).share \
        == pytest.approx(0.2)
    # the idle of a GPU run: from the kernel-only profile of steps back to back (light_busy_ms over light_step_ms)
    light = facts(stalls=stalls(100.0, 80.0, **every), step_ms=100.0, light_busy_ms=88.0, light_step_ms=100.0)
    assert light.base_idle_ms == pytest.approx(12.0) and R.periodic_stall(light).share == pytest.approx(0.12)
    # an excess equal to the idle is not bounded (nothing to cap)
    equal = facts(host={"user": 0.2 * WINDOW}, stalls=stalls(100.0, 80.0, **every))
    assert R.periodic_stall(equal).share == pytest.approx(0.2) and "bounded" not in R.periodic_stall(equal).evidence
    clean = facts(stalls=stalls(100.0, 80.0, slow=(4, 14), period=10))
    assert R.periodic_stall(clean).share == pytest.approx(0.2) and "bounded" not in R.periodic_stall(clean).evidence
