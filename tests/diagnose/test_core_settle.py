"""core.settle: the warm-up runs on in chunks until the step's time stops falling, at most its limit; the report
says where the time fell (one-time costs) or was still falling."""
import time

import torch

from gpulab.diagnose import core as C

CPU = torch.device("cpu")


def sleeper(times_ms):
    """A step that sleeps times_ms[i] on its i-th call, then the last one for ever."""
    calls = {"n": 0}

    def step():
        i = min(calls["n"], len(times_ms) - 1)
        calls["n"] += 1
        time.sleep(times_ms[i] / 1e3)
    step.calls = calls
    return step


def test_a_steady_step_settles_in_three_chunks():
    step = sleeper([2.0])
    s = C.settle(step, CPU, limit_s=5.0)
    assert s["settled"] and len(s["chunks_ms"]) == C.SETTLE_QUIET + 1 and s["steps"] == step.calls["n"] == 15
    assert C.settle_note(s) is None


def test_a_falling_step_runs_until_it_stops_falling_and_the_report_says_so():
    # 20 ms for 10 steps, then 2 ms: the first two chunks are slow, then three fast ones (the first fast one falls)
    step = sleeper([20.0] * 10 + [2.0])
    s = C.settle(step, CPU, limit_s=10.0)
    assert s["settled"] and len(s["chunks_ms"]) == 2 + 1 + C.SETTLE_QUIET, s
    assert s["chunks_ms"][0] > 5 * s["chunks_ms"][-1]
    note = C.settle_note(s)
    assert "in its first 5 steps" in note and f"after {s['steps']}; what follows is the settled step" in note


def test_a_step_still_falling_at_the_limit_is_said_to_be():
    step = sleeper([float(40 - i) for i in range(40)])      # every chunk about 5 ms faster than the one before
    s = C.settle(step, CPU, limit_s=0.3)
    assert not s["settled"] and "still falling" in C.settle_note(s)


def test_a_chunk_within_the_fall_margin_counts_as_settled():
    # 10 ms, then 9.5 ms (a 5 % fall, under SETTLE_FALL): no longer falling
    step = sleeper([10.0] * 5 + [9.5])
    s = C.settle(step, CPU, limit_s=5.0)
    assert s["settled"] and len(s["chunks_ms"]) == C.SETTLE_QUIET + 1
