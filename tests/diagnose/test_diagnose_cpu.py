"""diagnose() end to end on the CPU: a tiny MLP step, an input-bound step, bad input and a failing step."""
import json
import time

import pytest
import torch
from matplotlib.figure import Figure
from torch.profiler import record_function

from gpulab.diagnose import GPU_ONLY, DiagnoseError, Diagnosis, Verdict, diagnose
from gpulab.diagnose.events import DATA_RANGE

CPU = torch.device("cpu")


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
    return diagnose(mlp_step(), warmup=1, steps=2, device=CPU, peak_tflops=1.0, label="tiny MLP")


def test_the_split_adds_up(mlp):
    assert not mlp.on_gpu and mlp.device == "cpu" and mlp.label == "tiny MLP"
    assert mlp.step_ms > 0 and mlp.step_spread_ms >= 0 and mlp.profiled_step_ms > 0
    assert mlp.busy_ms > 0
    assert mlp.busy_ms + mlp.idle_ms == pytest.approx(mlp.profiled_step_ms)
    assert sum(mlp.idle_by_cause.values()) == pytest.approx(mlp.idle_ms)
    assert mlp.memory is None and mlp.nvml_util_pct is None


def test_flops_and_mfu_are_measured(mlp):
    # FlopCounterMode: 2 FLOPs per multiply-add; forward, and backward's weight gradients of both layers and
    # the input gradient of the second (x needs none)
    layer1, layer2 = 2 * 16 * 32 * 64, 2 * 16 * 64 * 10
    assert mlp.flops_per_step == pytest.approx(2 * layer1 + 3 * layer2)
    assert mlp.tflops == pytest.approx(mlp.flops_per_step / (mlp.step_ms / 1e3) / 1e12)
    assert mlp.mfu == pytest.approx(mlp.tflops / 1.0) and mlp.peak_source == "given by the caller"


def test_gpu_rules_are_skipped_with_why_and_the_report_says_so(mlp):
    assert set(mlp.skipped) == set(GPU_ONLY)
    assert all(why.startswith("needs a GPU") for why in mlp.skipped.values())
    text = mlp.report()
    for name, why in mlp.skipped.items():
        assert f"{name}: {why}" in text
    assert "tiny MLP" in text and "busy" in text and "MFU" in text


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


def test_an_input_bound_step_is_found_on_the_cpu():
    inner = mlp_step()

    def step():
        with record_function(DATA_RANGE):         # the learner's own batch fetching, 5 ms of waiting
            time.sleep(0.005)
        inner()

    d = diagnose(step, warmup=1, steps=2, device=CPU, flops_per_step=1.0, peak_tflops=1.0)
    assert d.idle_by_cause["input"] >= 4.5
    assert d.top is not None and d.top.rule == "input_bound" and d.top.lesson == "03"
    assert d.top.bound == pytest.approx(1 / (1 - d.top.share))


def test_trace_is_saved_where_asked(tmp_path):
    path = tmp_path / "trace.json"
    d = diagnose(mlp_step(), warmup=0, steps=1, device=CPU, flops_per_step=1.0, trace_path=path)
    assert d.trace_path == str(path) and "traceEvents" in json.loads(path.read_text())
    assert "trace:" in d.report()


def test_without_notebook_00_the_mfu_is_unknown_and_says_why():
    d = diagnose(mlp_step(), warmup=0, steps=1, device=CPU)      # the test's empty results store
    assert d.mfu is None and d.peak_tflops is None and "notebook 00" in d.report()


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
    calls = []

    def step():
        calls.append(1)
        if len(calls) > 4:                    # fine while warming up and timed (1 + 3 chunks of 1), fails once profiled
            raise RuntimeError("out of batches")

    with pytest.raises(DiagnoseError, match="RuntimeError during the profiled steps: out of batches"):
        diagnose(step, warmup=1, steps=1, device=CPU, flops_per_step=1.0)
    assert not torch.autograd.profiler._is_profiler_enabled
    diagnose(mlp_step(), warmup=0, steps=1, device=CPU, flops_per_step=1.0)    # a new profile starts fine


def test_a_gpu_diagnosis_from_hand_built_events_reports_everything():
    """The GPU side of report(), plot() and to_dict(), from events a GPU would record."""
    from gpulab.diagnose import Event, MemoryFacts, analyze

    events = [Event("op", "gpulab.step", 0, 1000, stream=1),
              Event("op", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 300, stream=1),
              Event("op", "aten::mm", 300, 320, stream=1, corr=5, shapes=((4095, 64), (64, 64)),
                    dtypes=("c10::BFloat16",) * 2),
              Event("gpu", "nvjet_hsh_128x256", 320, 900, stream=7, op_id=5, op="aten::mm"),
              Event("gpu", "ncclDevKernel_AllReduce", 850, 1000, stream=20)]
    memory = MemoryFacts(alloc_retries=0, inactive_split_bytes=0, peak_reserved_bytes=2**30, total_bytes=2**34)
    facts = analyze(events, memory=memory, step_ms=1.0, flops_per_step=1e9, peak_tflops=10.0, peak_source="test")
    d = Diagnosis.from_facts(facts, label="by hand", nvml_util_pct=80.0)
    assert d.on_gpu and not d.skipped
    assert [v.rule for v in d.verdicts][:2] == ["misaligned_gemm", "input_bound"]
    text = d.report()
    for part in ("GPU busy", "gemm_tensor_core", "communication", "NVML utilization 80 %", "peak reserved",
                 "MFU", "lesson 07", "lesson 03"):
        assert part in text, part
    assert isinstance(d.plot(), Figure)
    assert json.loads(json.dumps(d.to_dict()))["memory"]["total_bytes"] == 2**34


def test_an_unprofiled_follower_runs_the_steps_a_diagnosis_runs():
    # the other ranks of a multi-process job run step for step with the diagnosed one, unrecorded
    from gpulab.diagnose.core import CHUNKS

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
    assert len(follow_calls) == len(led_calls) >= 1 + CHUNKS * 2 + 1 + 2 + 1
