"""The cheat suite (issue 39): each submission below tries one of the tricks graders of GPU work have met
(grading.md), and each is rejected with its reason; the lesson's own fix passes. Graded at the tiny size on the
CPU, in the grader's fresh process, exactly as a learner's submission is."""
import textwrap

import pytest
import torch

from gpulab.exercises import exercise

STEP = "01.sync"          # a training step (systems tier)
FN = "12.fusion"          # a pure function (systems tier)


SPREAD = """
import numpy as np
def spread(host):
    return float(np.percentile(host, 90) - np.percentile(host, 10))
"""


def grade(name: str, source: str, **kw):
    source = textwrap.dedent(source)
    if name == STEP:
        source = SPREAD + source
    return exercise(name).check(source, quiet=True, **kw)


def assert_rejected(v, state: str, *words: str):
    text = " ".join(v.why).lower()
    assert v.state == state, f"expected {state}, got {v.state}: {v.why}"
    for w in words:
        assert w.lower() in text, f"{w!r} not in the reason: {v.why}"


@pytest.mark.parametrize("name", [STEP, FN])
def test_the_lessons_fix_passes(name):
    v = exercise(name).check(exercise(name).task.reference, quiet=True, who="reference")
    assert v.state == "passed", v.why
    assert v.ratio is not None and v.reference_ratio is not None and v.detail["rounds"] >= 3
    assert any("correctness only" in w for w in v.why)        # on the CPU the speed is not judged, and it says so


def test_a_cached_output_is_rejected():
    v = grade(FN, """
        _cache = {}
        def fused(x, y):
            if "out" not in _cache:
                _cache["out"] = (x + y).relu().mean(dim=1)
            return _cache["out"]
        """)
    assert_rejected(v, "failed", "call 2", "differs")


def test_an_output_cached_once_the_timing_starts_is_rejected():
    v = grade(FN, """
        _seen = []
        def fused(x, y):
            _seen.append(1)
            if len(_seen) > 6 and "out" in globals():
                return globals()["out"]
            globals()["out"] = (x + y).relu().mean(dim=1)
            return globals()["out"]
        """)
    assert_rejected(v, "failed", "timed call", "cached or stale")


def test_a_step_without_backward_is_rejected():
    v = grade(STEP, """
        import torch
        def make_step(model, optimizer):
            def step(x, y, host):
                return torch.nn.functional.mse_loss(model(x), y).detach(), spread(host)
            return step
        """)
    assert_rejected(v, "failed", "skipped backward or update")


def test_a_step_without_the_update_is_rejected():
    v = grade(STEP, """
        import torch
        def make_step(model, optimizer):
            def step(x, y, host):
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.zero_grad(set_to_none=True)
                return loss, spread(host)
            return step
        """)
    assert_rejected(v, "failed", "skipped backward or update")


def test_a_step_that_trains_on_half_of_each_batch_is_rejected():
    """Half the work every step, an update every step: the loss falls, and only the parameters show it."""
    v = grade(STEP, """
        import torch
        def make_step(model, optimizer):
            def step(x, y, host):
                half = x.shape[0] // 2
                loss = torch.nn.functional.mse_loss(model(x[:half]), y[:half])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                return loss.detach(), spread(host)
            return step
        """)
    assert_rejected(v, "failed", "parameters ended far from the reference", "MORE than 4x the floor")


def test_a_step_that_stops_updating_once_timed_is_rejected():
    v = grade(STEP, """
        import torch
        def make_step(model, optimizer):
            calls = []
            def step(x, y, host):
                calls.append(1)
                loss = torch.nn.functional.mse_loss(model(x), y)
                if len(calls) <= 3:
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                return loss.detach(), spread(host)
            return step
        """)
    assert v.state == "failed", v.why
    assert "timed" in " ".join(v.why)


def test_work_left_unfinished_on_another_thread_is_rejected():
    """The CPU's stand-in for a side stream left unsynchronized: the output is filled after the call returns."""
    v = grade(FN, """
        import threading, time, torch
        def fused(x, y):
            out = torch.zeros(x.shape[0])
            def later():
                time.sleep(0.05)
                out.copy_((x + y).relu().mean(dim=1))
            threading.Thread(target=later).start()
            return out
        """)
    assert_rejected(v, "failed", "differs")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a side stream needs a CUDA GPU; the CPU stand-in above runs instead")
def test_work_on_an_unsynchronized_side_stream_is_rejected():
    v = grade(FN, """
        import torch
        def fused(x, y):
            out = torch.zeros(x.shape[0], device=x.device)
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):
                torch.cuda._sleep(2_000_000)
                out.copy_((x + y).relu().mean(dim=1))
            return out
        """)
    assert_rejected(v, "failed", "differs")


@pytest.mark.parametrize("patch, name", [
    ("import time\ntime.perf_counter = lambda: 0.0\n", "perf_counter"),
    ("import torch\ntorch.cuda.Event.elapsed_time = lambda self, other: 1e-6\n", "elapsed_time"),
    ("import torch\ntorch.cuda.synchronize = lambda *a, **k: None\n", "synchronize"),
])
def test_a_patched_timer_is_suspicious(patch, name):
    v = grade(FN, patch + textwrap.dedent("""
        def fused(x, y):
            return (x + y).relu().mean(dim=1)
        """))
    assert_rejected(v, "suspicious", name, "patches timers")


def test_a_timer_patched_during_a_call_is_suspicious():
    v = grade(FN, """
        import time
        def fused(x, y):
            time.perf_counter = lambda: 0.0
            return (x + y).relu().mean(dim=1)
        """)
    assert_rejected(v, "suspicious", "perf_counter", "after the correctness calls")


def test_reading_the_graders_seed_gets_nothing():
    """The inputs come from a generator seeded from os.urandom just before they are drawn: torch's global seed
    (re-seeded at random too) predicts nothing, so precomputed answers are wrong."""
    v = grade(FN, """
        import torch
        def fused(x, y):
            g = torch.Generator().manual_seed(torch.initial_seed())
            n = x.shape[0]
            xs, ys = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
            return (xs + ys).relu().mean(dim=1)
        """)
    assert_rejected(v, "failed", "differs")


def test_a_downcast_function_is_rejected():
    v = grade(FN, """
        import torch
        def fused(x, y):
            return (x.bfloat16() + y.bfloat16()).relu().mean(dim=1).float()
        """)
    assert_rejected(v, "failed", "differs")


def test_a_downcast_step_is_rejected_by_the_systems_tier():
    v = grade(STEP, """
        import torch
        def make_step(model, optimizer):
            def step(x, y, host):
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = torch.nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                return loss, spread(host)
            return step
        """)
    assert_rejected(v, "failed", "not the same training", "downcast")


def test_inputs_changed_in_place_are_rejected():
    v = grade(FN, """
        def fused(x, y):
            x.add_(y)
            return x.relu_().mean(dim=1)
        """)
    assert_rejected(v, "failed", "inputs in place")


def test_the_kernel_survives_a_crash_an_exit_and_a_hang():
    crash = grade(FN, "import ctypes\ndef fused(x, y):\n    return ctypes.string_at(0)\n")
    assert crash.state == "failed" and "signal" in crash.why[-1], crash.why
    gone = grade(FN, "import os\ndef fused(x, y):\n    os._exit(3)\n")
    assert gone.state == "failed" and "without a verdict" in gone.why[-1], gone.why
    hang = grade(FN, "import time\ndef fused(x, y):\n    time.sleep(60)\n", timeout_s=2)
    assert hang.state == "failed" and "time limit" in hang.why[-1], hang.why


def test_a_submission_that_raises_says_where():
    v = grade(FN, "def fused(x, y):\n    return x @ y.t()[:3]\n")
    assert v.state == "failed" and "raised RuntimeError" in " ".join(v.why)
    assert "submission.py" in v.detail.get("traceback", "")


CACHED = torch.zeros(3)


def uses_a_tensor(x, y):
    return CACHED


def test_a_function_using_the_notebooks_objects_is_refused_before_grading():
    v = exercise(FN).check(uses_a_tensor, quiet=True)
    assert v.state == "failed" and "'CACHED', a Tensor from the notebook" in v.why[0], v.why
    cached = torch.zeros(3)

    def fused(x, y):
        return cached
    v = exercise(FN).check(fused, quiet=True)
    assert v.state == "failed" and "enclosing function" in v.why[0]


def test_the_verdict_is_kept_in_the_results_store():
    from gpulab.core.results import results_store
    ex = exercise(FN)
    ex.check(ex.task.slow, quiet=True)
    rec = results_store().latest(f"exercise {FN}", lesson="12")
    assert rec is not None and rec.extra["state"] == "passed" and rec.extra["who"] == "you"
    assert ex.state() == "passed"


def test_a_backward_and_update_left_on_a_thread_is_suspicious():
    """A cheat the suite did not have (2026-12-04): the correctness calls train honestly, then each timed call
    returns after the forward and leaves the backward and the update to a thread the clock does not wait for.
    Before the thread check it was rejected only indirectly (a crash, or the updates lost to the race); now the
    grader names it."""
    v = grade(STEP, """
        import threading
        import torch
        def make_step(model, optimizer):
            calls = []
            def step(x, y, host):
                calls.append(1)
                loss = torch.nn.functional.mse_loss(model(x), y)
                def rest():
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    optimizer.step()
                if len(calls) <= 3:
                    rest()
                else:
                    threading.Thread(target=rest).start()
                return loss.detach(), spread(host)
            return step
        """)
    assert v.state in ("suspicious", "failed"), v.why
    # named by the thread check, or (on a busy host, CI 2026-12-06: the threads raced each other's updates)
    # by the parameters after the timed calls
    assert (v.state == "failed" and "signal" in v.why[-1] or "thread(s) running" in v.why[-1]
            or "stopped training the model while it was timed" in v.why[-1]), v.why


def test_a_weight_frozen_once_timed_is_rejected():
    """A cheat of my own (2026-12-06): the correctness calls train every weight, then the first weight stops
    requiring a gradient when the timing starts, so each timed backward skips its gradient. Rejected by the
    parameters after the timed calls (0.137 of the reference's movement on the CPU at the tiny size, allowed 0.01)."""
    v = grade(STEP, """
        import torch
        def make_step(model, optimizer):
            calls = []
            first = next(model.parameters())
            def step(x, y, host):
                calls.append(1)
                if len(calls) == 4:
                    first.requires_grad_(False)
                loss = torch.nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                return loss.detach(), spread(host)
            return step
        """)
    assert_rejected(v, "failed", "stopped training the model while it was timed")


@pytest.mark.parametrize("patch, changed", [
    # the code as given made slower inside the grader, so that the code as given beats it: 12x on the CPU before
    # the grader looked (2026-12-07)
    ("from gpulab.exercises.registry import task\n_t = task('01.sync')\n_slow = _t.slow\n"
     "def _slower(model, optimizer):\n    step = _slow(model, optimizer)\n"
     "    def s(x, y, host):\n        out = step(x, y, host)\n        time.sleep(0.02)\n        return out\n"
     "    return s\nobject.__setattr__(_t, 'slow', _slower)\n", "the task's slow"),
    ("import gpulab.exercises.e01_measuring_time as e01\n_h = e01.host_values_for\n"
     "e01.host_values_for = lambda ms: 4 * _h(ms)\n", "e01_measuring_time.host_values_for"),
])
def test_a_submission_that_changes_the_tasks_own_code_is_suspicious(patch, changed):
    v = grade(STEP, "import time\n" + patch + textwrap.dedent("""
        def make_step(model, optimizer):
            from gpulab.exercises.e01_measuring_time import make_step as given
            return given(model, optimizer)
        """))
    assert_rejected(v, "suspicious", changed, "the task's own code", "when it was loaded")
