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


# Sleeps of 10 ms and more: the host's sleep overshoots by a fraction of a millisecond, which at 2 ms a step read
# as a 12 % fall on a loaded 2-core CI machine; counts get one chunk of slack for that.
def test_a_steady_step_settles_in_three_chunks_or_four():
    # 30 ms: a loaded CI machine's first chunk of 10 ms sleeps ran 11.5 ms a step against 10.3 later (2026-12-07), a 12 %
    # fall that the report rightly calls a warm-up; the same overshoot is 4 % of 30 ms
    step = sleeper([30.0])
    s = C.settle(step, CPU, limit_s=5.0)
    assert s["settled"] and C.SETTLE_QUIET + 1 <= len(s["chunks_ms"]) <= C.SETTLE_QUIET + 2, s
    assert s["steps"] == step.calls["n"] == C.SETTLE_CHUNK * len(s["chunks_ms"])
    assert C.settle_note(s) is None


def test_a_falling_step_runs_until_it_stops_falling_and_the_report_says_so():
    # 60 ms for 10 steps, then 10 ms: two slow chunks, then fast ones until two in a row fall no further
    step = sleeper([60.0] * 10 + [10.0])
    s = C.settle(step, CPU, limit_s=10.0)
    assert s["settled"] and 2 + 1 + C.SETTLE_QUIET <= len(s["chunks_ms"]) <= 2 + 2 + C.SETTLE_QUIET, s
    # 6x apart when the host sleeps on time; a loaded 2-core CI machine stretched a 10 ms sleep to 41 ms (2026-12-07):
    # what must hold is a fall beyond the margin that counts as falling
    assert s["chunks_ms"][0] > (1 + C.SETTLE_FALL) * s["chunks_ms"][-1], s
    note = C.settle_note(s)
    assert "in its first 5 steps" in note and f"after {s['steps']}; what follows is the settled step" in note


def test_a_step_still_falling_at_the_limit_is_said_to_be():
    step = sleeper([float(80 - 2 * i) for i in range(40)])     # each chunk about 10 ms (12 %+) faster than the last
    s = C.settle(step, CPU, limit_s=0.5)
    assert not s["settled"] and "still falling" in C.settle_note(s), s


def test_a_chunk_within_the_fall_margin_counts_as_settled():
    # 20 ms, then 19 ms (a 5 % fall, under SETTLE_FALL): no longer falling
    step = sleeper([20.0] * 5 + [19.0])
    s = C.settle(step, CPU, limit_s=5.0)
    assert s["settled"] and len(s["chunks_ms"]) <= C.SETTLE_QUIET + 2, s


def test_notebook_15_quotes_the_settle_as_the_code_runs_it():
    """Notebook 15's prose names the warm-up's chunk and limit: the constants core.settle uses."""
    import json
    from pathlib import Path

    nb = Path(__file__).resolve().parents[2] / "notebooks" / "15_your_training_step.ipynb"
    text = " ".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "markdown")
    assert f"chunks of {C.SETTLE_CHUNK} steps, at most {C.SETTLE_MAX_S:g} s" in " ".join(text.split())
    from gpulab.diagnose.gaps import NEW_SHAPE_FACTOR
    assert f"{NEW_SHAPE_FACTOR:g}×<!-- not measured: gaps.NEW_SHAPE_FACTOR --> the shortest" in " ".join(text.split())


def test_a_step_that_meets_new_shapes_is_diagnosed_on_its_settled_steps_and_times_no_variant():
    """Every step draws a length; a length's first run sleeps 40 ms more (a compile per shape, say). The diagnosis
    reads the steps that did not, says how many did, and times no variant: their steps would mix the two. New
    lengths come 2 and 3 steps apart in turn: evenly spaced slow steps would read as a periodic stall."""
    seen, lengths = set(), iter(range(10, 10_000))
    cycle = {"n": 0}

    def step():
        cycle["n"] += 1
        n = next(lengths) if cycle["n"] % 5 in (0, 2) else 8 + cycle["n"] % 2
        x = torch.randn(4, n)
        if n not in seen:
            seen.add(n)
            time.sleep(0.04)
        (x @ x.T).sum()
    d = C.diagnose(step, device=CPU, warmup=2, steps=6, window_s=0.5)
    f = d.facts
    assert f.new_shapes and f.new_shapes["profiled_first"] >= 1 and f.steps == 6 - f.new_shapes["profiled_first"]
    assert f.new_shapes["settled_ms"] < 20 and d.step_ms < 20, f.new_shapes
    assert "new shapes:" in d.report() and any("no variant was timed" in n for n in d.notes)
