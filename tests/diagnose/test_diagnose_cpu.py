"""diagnose() end to end on the CPU: a tiny MLP step, an input-bound step recorded and read back, bad input
and a failing step; the slow-step window (`stall_facts`), `scan_step`, the report."""
import json
import time

import pytest
import torch
from matplotlib.figure import Figure
from torch.profiler import record_function

from gpulab.diagnose import GPU_ONLY, DiagnoseError, Diagnosis, Verdict, diagnose
from gpulab.diagnose import core
from gpulab.diagnose.core import CHUNKS, STALL_FACTOR, count_flops, from_record, scan_step, stall_facts
from gpulab.diagnose.events import DATA_RANGE

CPU = torch.device("cpu")
WINDOW_S = 0.2          # the timed window: short here (a tiny step reaches MAX_CHUNKS chunks anyway)


def mlp_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))

    def step():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return step


@pytest.fixture(scope="module")
def mlp() -> Diagnosis:
    # the peak is given, so no results store is read (this fixture outlives the per-test store)
    return diagnose(mlp_step(), warmup=1, steps=2, device=CPU, peak_tflops=1.0, label="tiny MLP", window_s=WINDOW_S)


def test_the_split_adds_up(mlp):
    assert not mlp.on_gpu and mlp.device == "cpu" and mlp.label == "tiny MLP"
    assert mlp.step_ms > 0 and mlp.step_spread_ms >= 0 and mlp.profiled_step_ms > 0
    assert mlp.busy_ms > 0
    assert mlp.busy_ms + mlp.idle_ms == pytest.approx(mlp.profiled_step_ms)
    assert sum(mlp.idle_by_cause.values()) == pytest.approx(mlp.idle_ms)
    # on the CPU the ops are the device's work: the host's causes are what is left of the step ranges
    assert 0 < sum(mlp.facts.host_by_cause.values()) <= mlp.idle_ms + 1e-9
    assert mlp.memory is None and mlp.nvml_util_pct is None
    assert mlp.facts.stalls is not None and len(mlp.facts.stalls.step_ms) >= CHUNKS * 2


def test_flops_and_mfu_are_measured(mlp):
    # FlopCounterMode: 2 FLOPs per multiply-add; forward, and backward's weight gradients of both layers and
    # the input gradient of the second (x needs none)
    layer1, layer2 = 2 * 16 * 32 * 64, 2 * 16 * 64 * 10
    assert mlp.flops_per_step == pytest.approx(2 * layer1 + 3 * layer2)
    assert mlp.tflops == pytest.approx(mlp.flops_per_step / (mlp.step_ms / 1e3) / 1e12)
    # the peak the caller gave is a measured one: the fraction of measured peak; no datasheet on the CPU: no MFU
    assert mlp.measured_peak_fraction == pytest.approx(mlp.tflops / 1.0) and mlp.peak_source == "given by the caller"
    assert mlp.mfu is None


def test_gpu_rules_are_skipped_with_why_and_the_report_says_so(mlp):
    assert set(mlp.skipped) == set(GPU_ONLY)
    assert all(why.startswith("needs a GPU") for why in mlp.skipped.values())
    text = mlp.report()
    for name, why in mlp.skipped.items():
        assert f"{name}: {why}" in text
    assert "tiny MLP" in text and "busy" in text and "MFU unknown" in text and "% of the measured peak" in text


def test_the_report_lists_the_hosts_causes_with_the_users_lines(mlp):
    text = mlp.report()
    assert "the host's time per profiled step, by what it was doing" in text
    shown = [c for c, ms in mlp.facts.host_by_cause.items() if ms > 0]
    assert shown
    for c in shown:
        assert f"\n  {c:<14} {mlp.facts.host_by_cause[c]:8.3g} ms" in text
    assert "test_diagnose_cpu.py:" in text            # the step's lines, found with the profiler's stacks


def test_verdicts_are_ranked_verdicts(mlp):
    assert all(isinstance(v, Verdict) for v in mlp.verdicts)
    assert mlp.top is (mlp.verdicts[0] if mlp.verdicts else None)
    assert not any(v.rule in GPU_ONLY for v in mlp.verdicts)


def test_plot_is_a_figure(mlp):
    fig = mlp.plot()
    assert isinstance(fig, Figure) and fig.axes[0].get_xlabel() == "ms from the first profiled step"


def test_to_dict_is_json(mlp):
    d = json.loads(json.dumps(mlp.to_dict()))
    assert d["device"] == "cpu" and set(d["skipped"]) == set(GPU_ONLY)
    assert d["facts"]["window_ms"] == pytest.approx(mlp.profiled_step_ms)
    assert d["facts"]["host_by_cause"] == pytest.approx(mlp.facts.host_by_cause)


def test_an_input_bound_step_is_found_recorded_and_read_back(tmp_path):
    inner = mlp_step()

    def step():
        with record_function(DATA_RANGE):         # the learner's own batch fetching, 5 ms of waiting
            time.sleep(0.005)
        inner()

    path = tmp_path / "record.json.gz"
    d = diagnose(step, warmup=1, steps=2, device=CPU, flops_per_step=1.0, peak_tflops=1.0, window_s=WINDOW_S,
                 record_to=str(path), label="waits")
    assert d.facts.host_by_cause["input"] >= 4.5 and d.idle_by_cause["input"] >= 4.5
    assert d.top is not None and d.top.rule == "input_bound" and d.top.lesson == "03"
    assert d.top.bound == pytest.approx(1 / (1 - d.top.share))
    # confirm ran: no DataLoader to replay, so the verdict says why it was not measured
    assert d.top.measured is None and d.top.confirmation == "not measured: the step read no batch from a DataLoader"
    assert "\n  input " in d.report()
    # the record analysed again gives the same diagnosis
    again = from_record(str(path))
    assert [v.rule for v in again.verdicts] == [v.rule for v in d.verdicts]
    assert again.facts.host_by_cause == pytest.approx(d.facts.host_by_cause)
    assert again.busy_ms == pytest.approx(d.busy_ms) and again.step_ms == pytest.approx(d.step_ms)
    assert again.label == "waits" and again.device == "cpu" and again.facts.stalls == d.facts.stalls
    assert again.top.confirmation == ""                                  # nothing is run again
    assert from_record(str(path), peak_tflops=2.0).measured_peak_fraction == pytest.approx(d.measured_peak_fraction / 2)


def test_trace_is_saved_where_asked(tmp_path):
    path = tmp_path / "trace.json"
    d = diagnose(mlp_step(), warmup=0, steps=1, device=CPU, flops_per_step=1.0, trace_path=path, window_s=WINDOW_S)
    assert d.trace_path == str(path) and "traceEvents" in json.loads(path.read_text())
    assert "trace:" in d.report()


def test_without_notebook_00_the_fraction_of_measured_peak_is_unknown_and_says_why():
    d = diagnose(mlp_step(), warmup=0, steps=1, device=CPU, window_s=WINDOW_S)      # the test's empty results store
    assert d.measured_peak_fraction is None and d.peak_tflops is None and "notebook 00" in d.report()
    assert any("no warm-up step" in n for n in d.notes)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"steps": 0}, ValueError, "steps must be an integer >= 1"),
    ({"warmup": -1}, ValueError, "warmup must be an integer >= 0"),
    ({"steps": 2.5}, ValueError, "steps must be an integer"),
    ({"flops_per_step": -1.0}, ValueError, "flops_per_step must be a positive number"),
    ({"peak_tflops": float("nan")}, ValueError, "peak_tflops must be a positive number"),
])
def test_bad_arguments_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        diagnose(lambda: None, device=CPU, **kwargs)


def test_a_step_that_is_not_callable_is_refused():
    with pytest.raises(TypeError, match="callable with no arguments"):
        diagnose("train", device=CPU)


def test_a_failing_step_raises_clearly_and_leaves_nothing_profiling():
    inner = mlp_step()

    def step():
        if torch.autograd.profiler._is_profiler_enabled:      # fine while warming up and timed, fails once profiled
            raise RuntimeError("out of batches")
        inner()

    with pytest.raises(DiagnoseError, match="RuntimeError during the profiled steps: out of batches"):
        diagnose(step, warmup=1, steps=1, device=CPU, flops_per_step=1.0, window_s=WINDOW_S)
    assert not torch.autograd.profiler._is_profiler_enabled
    with pytest.raises(DiagnoseError, match="during the warm-up steps"):
        diagnose(lambda: 1 / 0, warmup=1, steps=1, device=CPU)
    diagnose(mlp_step(), warmup=0, steps=1, device=CPU, flops_per_step=1.0, window_s=WINDOW_S)    # a new profile starts


def test_a_gpu_diagnosis_from_hand_built_events_reports_everything():
    """The GPU side of report(), plot() and to_dict(), from events a GPU would record."""
    from gpulab.diagnose import Event, MemoryFacts, analyze

    user = ("train.py", 12, "step")
    events = [Event("op", "gpulab.step", 0, 1000, stream=1),
              Event("op", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 300, stream=1),
              Event("py", "__next__", 0, 300, stream=1, site=user, code=("torch/utils/data/dataloader.py", 1, "__next__")),
              Event("op", "aten::mm", 300, 320, stream=1, corr=5, shapes=((4095, 64), (64, 64)),
                    dtypes=("c10::BFloat16",) * 2),
              Event("gpu", "nvjet_hsh_128x256", 320, 900, stream=7, op_id=5, op="aten::mm"),
              Event("gpu", "ncclDevKernel_AllReduce", 850, 1000, stream=20)]
    memory = MemoryFacts(alloc_retries=0, inactive_split_bytes=0, peak_reserved_bytes=2**30, total_bytes=2**34,
                         peak_allocated_bytes=2**29, cap_source="the GPU's memory", steps=1)
    facts = analyze(events, memory=memory, step_ms=1.0, flops_per_step=1e9, peak_tflops=10.0, peak_source="test")
    d = Diagnosis.from_facts(facts, label="by hand", nvml_util_pct=80.0)
    assert d.on_gpu and not d.skipped
    # the misaligned product is 58 % of the step (2.4x expected), the input 30 % (1.4x)
    assert [v.rule for v in d.verdicts][:2] == ["misaligned_gemm", "input_bound"]
    text = d.report()
    for part in ("GPU busy", "gemm_tensor_core", "communication", "NVML utilization 80 %", "peak allocated 512.0 MiB",
                 "the allocator's cache 512.0 MiB more", "MFU", "lesson 07", "lesson 03",
                 "input               0.3 ms; GPU idle meanwhile 0.3 ms  <- train.py:12 (step)",
                 "matrix products by math (read per kernel): bf16 0.58 ms"):
        assert part in text, part
    assert isinstance(d.plot(), Figure)
    assert json.loads(json.dumps(d.to_dict()))["memory"]["total_bytes"] == 2**34


def test_an_unprofiled_follower_runs_the_steps_a_diagnosis_runs(monkeypatch):
    # the other ranks of a multi-process job run step for step with the diagnosed one, unrecorded: with a
    # process group the window is CHUNKS chunks (and a probe), and no extra step is run
    monkeypatch.setattr(core, "_distributed", lambda: True)

    def counted(fn):
        calls = []

        def step():
            calls.append(1)
            fn()
        return step, calls

    led, led_calls = counted(mlp_step())
    followed, follow_calls = counted(mlp_step())
    assert isinstance(diagnose(led, warmup=1, steps=2, device=CPU, peak_tflops=1.0), Diagnosis)
    assert diagnose(followed, warmup=1, steps=2, device=CPU, peak_tflops=1.0, profile=False) is None
    # warm-up (its last step counts the FLOPs), the probe and CHUNKS chunks of 2, one unmarked step and 2 profiled
    assert len(follow_calls) == len(led_calls) == 1 + (1 + CHUNKS) * 2 + 1 + 2


# -- pieces on their own --------------------------------------------------------------------------------
def test_scan_step_counts_flops_and_finds_no_syncs_on_the_cpu():
    a, b = torch.randn(16, 32), torch.randn(32, 64)
    flops, syncs = scan_step(lambda: (a @ b).sum().item(), CPU)
    assert flops == 2 * 16 * 32 * 64 and syncs == []
    assert scan_step(lambda: (a @ b).sum().item(), CPU, flops=False) == (None, [])
    assert scan_step(lambda: a + 1, CPU)[0] is None                    # nothing counted
    assert count_flops(lambda: a @ b) == 2 * 16 * 32 * 64
    with pytest.raises(DiagnoseError, match="ZeroDivisionError during the warm-up steps"):
        scan_step(lambda: 1 / 0, CPU)


def chunks_of(per_step: list[float], size: int) -> tuple[list, list]:
    """(every chunk's steps, each timed chunk's ms per step) as `_timed` returns them: the first chunk is
    benchmark's probe, in the steps but not a sample."""
    steps = [per_step[i:i + size] for i in range(0, len(per_step), size)]
    return steps, [sum(c) / len(c) for c in steps[1:]]


def test_stall_facts_finds_a_periodic_slow_step_and_the_typical_one():
    per_step = [1.0] * 35
    for i in (8, 18, 28):
        per_step[i] = 10.0                          # a checkpoint every 10 steps
    s = stall_facts(*chunks_of(per_step, 5))
    assert s.slow == (8, 18, 28) and s.period == 10 and s.step_ms == tuple(per_step) and not s.every_chunk
    assert s.median_ms == pytest.approx(1.0)       # the chunks without a slow step
    assert s.mean_ms == pytest.approx((2.8 * 3 + 1.0 * 3) / 6) and s.excess_ms == pytest.approx(0.9)
    per_step[28] = 1.0
    per_step[30] = 10.0                            # 8, 18, 30: not evenly
    uneven = stall_facts(*chunks_of(per_step, 5))
    assert uneven.slow == (8, 18, 30) and uneven.period is None


def test_stall_facts_a_slow_step_is_over_three_times_the_median():
    per_step = [1.0] * 20
    per_step[12] = STALL_FACTOR * 1.0              # at the factor: not slow
    assert stall_facts(*chunks_of(per_step, 5)).slow == ()
    per_step[12] = STALL_FACTOR + 0.01
    assert stall_facts(*chunks_of(per_step, 5)).slow == (12,)
    assert stall_facts([[1.0, 1.0]], [1.0]) is None                     # under three steps
    assert stall_facts([[1.0] * 5], []) is None                         # no timed chunk


def test_stall_facts_without_a_clean_chunk_takes_the_host_steps_excess():
    per_step = [1.0, 1.0, 1.0, 1.0, 10.0] * 4                           # every chunk has its slow step
    s = stall_facts(*chunks_of(per_step, 5))
    assert s.slow == (4, 9, 14, 19) and s.period == 5 and s.mean_ms == pytest.approx(2.8)
    assert s.median_ms == pytest.approx(1.0)                            # the mean less the slow steps' excess
    assert s.excess_ms == pytest.approx(1.8) and s.every_chunk           # the rule bounds it by the GPU's idle


def test_stall_facts_the_probe_chunk_does_not_dilute_the_excess():
    per_step = [1.0] * 5 + [1.0, 1.0, 1.0, 1.0, 10.0] * 3               # a clean probe; every timed chunk slow
    s = stall_facts(*chunks_of(per_step, 5))
    assert s.mean_ms == pytest.approx(2.8)
    assert s.median_ms == pytest.approx(1.0)                            # it is 2.8 - 27 / 20 = 1.45


def test_the_users_own_python_in_a_diagnosed_step_is_host_code():
    inner = mlp_step()
    took = []
    for _ in range(3):
        t0 = time.perf_counter()
        inner()
        took.append(time.perf_counter() - t0)
    # the user's own Python every step: 3 ms, or as long as the step's ops where this CPU runs them slower (a
    # busy machine: the ops took 40 ms a step on this machine under load, 2026-12-04, and 3 ms fell under the
    # threshold, so compute_bound came first though host_code was measured right)
    spin_s = max(0.003, sorted(took)[1])

    def bookkeeping():
        deadline = time.perf_counter() + spin_s
        while time.perf_counter() < deadline:
            pass

    def step():
        inner()
        bookkeeping()

    d = diagnose(step, warmup=1, steps=2, device=CPU, flops_per_step=1.0, peak_tflops=1.0, window_s=WINDOW_S,
                 confirm=False)
    assert d.facts.host_by_cause["host_code"] >= 0.8 * spin_s * 1e3, d.report()
    assert d.top is not None and d.top.rule == "host_code"
