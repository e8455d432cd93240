"""gpulab.core.timing: benchmark() and Timing."""
import dataclasses
import time

import pytest
import torch

from gpulab.core import timing
from gpulab.core.timing import MIN_CALLS, Timing, benchmark, summarize

CPU = torch.device("cpu")


class Counter:
    """A function to time that counts its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1


def make_timing(median=2.0, p25=1.5, p75=2.5, **kw):
    return Timing(median_ms=median, p25_ms=p25, p75_ms=p75, min_ms=kw.get("min", 1.0),
                  max_ms=kw.get("max", 3.0), n=kw.get("n", 5), device="cpu", method="perf_counter")


# -- benchmark on the CPU ----------------------------------------------------------
@pytest.mark.cpu_only
def test_default_device_without_cuda_uses_perf_counter():
    t = benchmark(lambda: None, repeat=3)
    assert (t.method, t.device) == ("perf_counter", "cpu")


def test_cpu_timing_is_ordered():
    t = benchmark(lambda: sum(range(1000)), repeat=15, device=CPU)
    assert t.method == "perf_counter"
    assert t.n == 15 and len(t.samples_ms) == 15
    assert t.min_ms <= t.p25_ms <= t.median_ms <= t.p75_ms <= t.max_ms
    assert t.min_ms > 0


def test_warmup_calls_are_made_but_not_timed():
    fn = Counter()
    t = benchmark(fn, warmup=4, repeat=6, device=CPU)
    assert fn.calls == 4 + 6
    assert t.n == 6


def test_benchmark_synchronizes_around_every_timed_call(monkeypatch):
    synced = []
    monkeypatch.setattr(timing, "sync", synced.append)
    benchmark(Counter(), warmup=2, repeat=5, device=CPU)
    assert synced == [CPU] * 10


def test_repeat_none_fits_the_budget_between_3_and_max_repeat():
    fn = Counter()
    t = benchmark(fn, warmup=0, max_repeat=20, device=CPU)
    assert t.n == 20                      # a fast call: the cap decides
    assert fn.calls == 1 + 20             # one probe call, then the timed ones


def test_repeat_none_never_goes_below_3():
    t = benchmark(lambda: time.sleep(0.01), warmup=0, budget_s=0.001, device=CPU)
    assert t.n == 3


def test_repeat_none_follows_the_budget_for_slow_calls():
    t = benchmark(lambda: time.sleep(0.01), warmup=0, budget_s=0.05, device=CPU)
    assert 3 <= t.n <= 5                  # 50 ms budget / >=10 ms per call


def test_a_share_of_the_budget_spends_that_share_and_keeps_the_floor(monkeypatch):
    slow = lambda: time.sleep(0.005)                                       # noqa: E731
    assert 15 <= benchmark(slow, warmup=0, budget_s=0.2, device=CPU).n <= 40       # 200 ms / 5 ms and more
    monkeypatch.setenv("GPULAB_TIMING_BUDGET", "0.1")
    assert 3 <= benchmark(slow, warmup=0, budget_s=0.2, device=CPU).n <= 4         # 20 ms / 5 ms and more
    assert benchmark(slow, warmup=0, budget_s=0.01, device=CPU).n == 3             # the floor stays
    assert benchmark(slow, warmup=0, repeat=7, device=CPU).n == 7                  # a count asked for stays


@pytest.mark.parametrize("raw", ["0", "1.5", "half", "-0.1"])
def test_a_budget_share_out_of_range_is_refused_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv("GPULAB_TIMING_BUDGET", raw)
    with pytest.raises(ValueError, match=r"GPULAB_TIMING_BUDGET must be a number in \(0, 1\]"):
        benchmark(lambda: None, warmup=0, device=CPU)


@pytest.mark.parametrize("kwargs, message", [
    ({"warmup": -1}, "warmup must be >= 0"),
    ({"repeat": 0}, "repeat must be >= 1"),
])
def test_invalid_counts_are_refused(kwargs, message):
    fn = Counter()
    with pytest.raises(ValueError, match=message):
        benchmark(fn, device=CPU, **kwargs)
    assert fn.calls == 0


def test_sync_false_is_the_host_clock_counter_example(monkeypatch):
    synced = []
    monkeypatch.setattr(timing, "sync", synced.append)
    fn = Counter()
    t = benchmark(fn, warmup=1, repeat=4, sync=False, device=CPU)
    assert t.method == "host clock, no sync"
    assert t.n == 4 and fn.calls == 5
    assert synced == []


def test_sync_false_without_repeat_times_ten_calls():
    assert benchmark(lambda: None, warmup=0, sync=False, device=CPU).n == 10


def test_sleep_of_10_ms_measures_about_10_ms():
    t = benchmark(lambda: time.sleep(0.01), warmup=1, repeat=5, device=CPU)
    assert 9.0 <= t.median_ms <= 40.0


# -- Timing and summarize -----------------------------------------------------------
def test_timing_is_frozen():
    t = benchmark(lambda: None, repeat=3, device=CPU)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.median_ms = 0.0


def test_summarize_odd_count_gives_known_quartiles():
    t = summarize([5.0, 1.0, 3.0, 2.0, 4.0], "cpu", "perf_counter")
    assert (t.p25_ms, t.median_ms, t.p75_ms) == (2.0, 3.0, 4.0)
    assert (t.min_ms, t.max_ms, t.n) == (1.0, 5.0, 5)
    assert t.samples_ms == (5.0, 1.0, 3.0, 2.0, 4.0)   # kept in call order


def test_summarize_even_count_interpolates():
    t = summarize([1.0, 2.0, 3.0, 4.0], "cpu", "perf_counter")
    assert (t.p25_ms, t.median_ms, t.p75_ms) == (1.75, 2.5, 3.25)


def test_summarize_single_sample():
    t = summarize([7.0], "cuda:0", "cuda events")
    assert (t.p25_ms, t.median_ms, t.p75_ms, t.min_ms, t.max_ms) == (7.0,) * 5
    assert (t.device, t.method) == ("cuda:0", "cuda events")


def test_summarize_refuses_no_samples():
    with pytest.raises(ValueError, match="no samples"):
        summarize([], "cpu", "perf_counter")


def test_per_second_uses_the_median():
    t = make_timing(median=2.0)
    assert t.per_second(1e9) == pytest.approx(5e11)      # 1e9 per 2 ms
    assert t.per_second(2 * 4096**3) / 1e12 == pytest.approx(68.72, rel=1e-3)


def test_spread():
    t = make_timing(median=2.0, p25=1.5, p75=2.5)
    assert t.spread_ms == 1.0
    assert t.spread_pct == 50.0
    assert make_timing(median=0.0, p25=0.0, p75=0.0).spread_pct == 0.0


def test_str_says_what_was_measured():
    assert str(make_timing(median=2.0, n=5)) == "2 ms (IQR 1 ms, n=5, perf_counter on cpu)"


def test_host_time_no_sync_returns_one_time_per_call():
    fn = Counter()
    out = timing.host_time_no_sync(fn, 7)
    assert len(out) == 7 and fn.calls == 7
    assert all(ms >= 0 for ms in out)


# -- on a GPU ----------------------------------------------------------------------
@pytest.mark.gpu
def test_cuda_benchmark_uses_events():
    a = torch.randn(1024, 1024, device="cuda")
    t = benchmark(lambda: a @ a, repeat=10)
    assert t.method == "cuda events"
    assert t.device.startswith("cuda")
    assert 0 < t.median_ms < 100


@pytest.mark.gpu
def test_cuda_events_time_the_work_not_the_launch():
    a = torch.randn(4096, 4096, device="cuda")
    real = benchmark(lambda: a @ a, repeat=10)
    launch_only = benchmark(lambda: a @ a, repeat=10, sync=False)
    assert launch_only.method == "host clock, no sync"
    assert real.median_ms > launch_only.median_ms


def test_stopwatch_times_the_block_on_the_host_clock():
    from gpulab.core.timing import stopwatch
    with stopwatch() as w:
        time.sleep(0.02)
    assert 15 <= w.ms <= 200
    assert w.end_s > w.start_s
    with stopwatch(sync=False) as quick:
        pass
    assert 0 <= quick.ms < w.ms


def test_stopwatch_records_the_end_even_when_the_block_raises():
    from gpulab.core.timing import stopwatch
    with pytest.raises(RuntimeError):
        with stopwatch() as w:
            raise RuntimeError("boom")
    assert w.end_s >= w.start_s > 0


def test_host_clock_times_each_call_on_the_host_clock():
    """clock="host" (lesson 05's pageable copies and pinning): each call between two synchronizations."""
    calls = []
    t = benchmark(lambda: calls.append(1), warmup=2, budget_s=0.0, clock="host", device=torch.device("cpu"))
    assert t.method == "host clock, synchronized" and t.n == 3 and len(calls) == 6   # 2 warm-up, 1 probe, 3 timed
    assert t.min_ms >= 0
    t = benchmark(lambda: None, budget_s=10.0, max_repeat=7, clock="host", device=torch.device("cpu"))
    assert t.n == 7
    with pytest.raises(ValueError, match="clock"):
        benchmark(lambda: None, clock="wall")


def test_min_calls_is_what_benchmark_makes_with_its_defaults():
    calls = []
    benchmark(lambda: calls.append(1), budget_s=0.0, device=torch.device("cpu"))
    assert len(calls) == MIN_CALLS


def test_merged_ms_counts_overlapping_kernels_once():
    from gpulab.core.timing import merge_intervals, merged_ms
    assert merge_intervals([(5.0, 20.0), (0.0, 10.0), (30.0, 40.0)]) == [(0.0, 20.0), (30.0, 40.0)]
    assert merged_ms([(0.0, 10.0), (5.0, 20.0), (30.0, 40.0)]) == pytest.approx(0.030)    # us -> ms
    assert merged_ms([(30.0, 40.0), (0.0, 10.0)]) == pytest.approx(0.020)                # any order
    assert merged_ms([(0.0, 10.0), (2.0, 3.0)]) == pytest.approx(0.010)                  # nested
    assert merged_ms([]) == 0.0


def test_intersect_and_subtract_sorted_disjoint_intervals():
    from gpulab.core.timing import intersect, subtract
    assert intersect([(0, 10), (20, 30)], [(5, 25)]) == [(5, 10), (20, 25)]
    assert subtract([(0, 30)], [(5, 10), (20, 25)]) == [(0, 5), (10, 20), (25, 30)]
    assert subtract([(0, 10)], []) == [(0, 10)]



def test_calls_per_sample_times_back_to_back_calls_per_call():
    import torch
    from gpulab.core.timing import benchmark
    seen = []
    t = benchmark(lambda: seen.append(1), warmup=1, repeat=3, calls=4, device=torch.device("cpu"))
    assert len(seen) == 1 * 4 + 3 * 4 and t.n == 3 and "4 back-to-back calls per sample" in t.method
    with pytest.raises(ValueError, match="calls must be >= 1"):
        benchmark(lambda: None, calls=0, device=torch.device("cpu"))


def test_interleaved_takes_turns_so_a_slowdown_falls_on_every_variant():
    """A GPU that slows down half way (another learner starts) slows A and B alike when they take turns;
    timed one after the other, the second variant alone would take it."""
    from gpulab.core.timing import interleaved

    calls = []

    def variant(name):
        def fn():
            calls.append(name)
        return fn

    out = interleaved({"A": variant("A"), "B": variant("B")}, rounds=4, repeat=2, warmup=1,
                      device=torch.device("cpu"))
    assert set(out) == {"A", "B"} and out["A"].n == 8 and out["B"].n == 8
    assert "interleaved with B (4 rounds)" in out["A"].method
    assert "".join(calls[:4]) == "AABB"                       # each variant's warm-up and first call
    assert "".join(calls[4:]) == "AABB" "BBAA" "AABB" "BBAA"   # turns, the order reversed every round
    with pytest.raises(ValueError):
        interleaved({}, device=torch.device("cpu"))


def test_pace_says_what_sets_a_steps_pace():
    """The GPU's busy share of a step and which side paces it, at the 90 % line diagnose's compute_bound uses."""
    import torch

    from gpulab.core.timing import GPU_PACED_MIN, Pace, pace
    from gpulab.diagnose.rules import COMPUTE_BUSY_MIN

    assert COMPUTE_BUSY_MIN == GPU_PACED_MIN
    at = Pace(busy_ms=9.0, step_ms=10.0, steps=5)
    below = Pace(busy_ms=8.99, step_ms=10.0, steps=5)
    assert at.paced_by == "the GPU" and below.paced_by == "the host"
    assert "GPU busy 89.9 %" in below.text() and "waits between kernels" in below.text()   # not "90 %"
    assert at.percent() == "90.0" and Pace(7.0, 10.0, 1).percent() == "70"
    assert Pace(busy_ms=12.0, step_ms=10.0, steps=1).share == 1.0       # overlapping streams counted once, capped
    assert pace(lambda: None, device=torch.device("cpu")) is None


def test_pace_is_unknown_where_the_profiler_saw_nothing_or_refused(monkeypatch):
    """No recorded GPU activity is not an idle GPU: pace says nothing (None) rather than 'paced by the host'."""
    import contextlib

    import torch

    import gpulab.core.timing as T

    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(T, "sync", lambda device: None)
    monkeypatch.setattr(T, "gpu_profile", lambda: contextlib.nullcontext(None))
    monkeypatch.setattr(T, "gpu_kernels", lambda prof: [])
    assert T.pace(lambda: None, steps=2, device=gpu) is None
    monkeypatch.setattr(T, "gpu_kernels", lambda prof: [("k", 0.0, 400.0), ("k", 300.0, 600.0)])
    p = T.pace(lambda: None, steps=2, device=gpu)
    assert p.busy_ms == 0.3 and p.kernels == 1.0 and p.steps == 2

    def refused(prof):
        raise RuntimeError("CUPTI_ERROR_INSUFFICIENT_PRIVILEGES")
    monkeypatch.setattr(T, "gpu_kernels", refused)
    assert T.pace(lambda: None, device=gpu) is None


def test_gpu_profile_keeps_events_across_cycles_unless_told_otherwise(monkeypatch):
    """torch 2.10 and 2.11 warn "set acc_events=True" at the first profiler session of a process without it, with
    or without a schedule (pytorch/pytorch#180348): notebook 11 printed it under its step profile on 2026-12-03 and
    2026-12-06. gpu_profile passes acc_events=True unless its caller says otherwise."""
    import contextlib

    import torch.profiler

    import gpulab.core.timing as T

    seen = []

    @contextlib.contextmanager
    def profile(**kwargs):
        seen.append(kwargs)
        yield None
    monkeypatch.setattr(torch.profiler, "profile", profile)
    monkeypatch.setattr(T, "release_cupti", lambda: None)
    with T.gpu_profile():
        pass
    with T.gpu_profile(cpu=True, acc_events=False, record_shapes=True):
        pass
    assert seen[0]["acc_events"] is True and len(seen[0]["activities"]) == 1
    assert seen[1]["acc_events"] is False and seen[1]["record_shapes"] and len(seen[1]["activities"]) == 2
