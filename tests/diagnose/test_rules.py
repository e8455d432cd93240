"""Every rule fires at its threshold and stays silent just below it; shares are honest upper bounds."""
import math
import ast
import inspect
import itertools
import json

import pytest

from gpulab.diagnose import rules as R
from gpulab.diagnose.analyze import CAUSES, CLASSES, Facts, GemmFact, MemoryFacts

WINDOW = 100.0          # ms: a share of x % is x ms
GiB = 2**30


def facts(idle=None, busy=None, on_gpu=True, **kw) -> Facts:
    idle_by_cause = dict.fromkeys(CAUSES, 0.0) | (idle or {})
    busy_by_class = dict.fromkeys(CLASSES, 0.0) | (busy or {})
    idle_ms = sum(idle_by_cause.values())
    kw.setdefault("busy_ms", WINDOW - idle_ms)
    return Facts(on_gpu=on_gpu, steps=1, window_ms=WINDOW, idle_ms=idle_ms, idle_by_cause=idle_by_cause,
                 busy_by_class=busy_by_class, **kw)


def gemm(ms, dtype="fp32", tensor_cores=False, misaligned=False, flops=0.0, shapes=((64, 64), (64, 64))):
    return GemmFact(op="aten::mm", dtype=dtype, shapes=shapes, calls=1, gpu_ms=ms, flops=flops,
                    tensor_cores=tensor_cores, misaligned=misaligned)


def memory(retries=0, peak_frac=0.5):
    return MemoryFacts(alloc_retries=retries, inactive_split_bytes=3 * 2**20,
                       peak_reserved_bytes=int(peak_frac * 80 * GiB), total_bytes=80 * GiB)


# -- each rule at its edge -------------------------------------------------------------------------
@pytest.mark.parametrize("rule, cause, threshold, lesson", [
    (R.input_bound, "input", R.INPUT_SHARE_MIN, "03"),
    (R.host_sync, "sync", R.SYNC_SHARE_MIN, "01"),
    (R.pageable_copy, "pageable_copy", R.PAGEABLE_SHARE_MIN, "05"),
    (R.memory_pressure, "allocator", R.ALLOCATOR_SHARE_MIN, "02"),
])
def test_idle_rules_fire_at_their_threshold(rule, cause, threshold, lesson):
    at = threshold * WINDOW
    assert rule(facts({cause: at - 0.01})) is None
    v = rule(facts({cause: at}))
    assert v is not None and v.rule == rule.__name__ and v.lesson == lesson
    assert v.share == pytest.approx(threshold) and v.bound == pytest.approx(1 / (1 - threshold))
    assert f"{at:.3g} ms" in v.evidence


def test_pageable_copy_adds_the_copies_gpu_time():
    edge = R.PAGEABLE_SHARE_MIN * WINDOW
    assert R.pageable_copy(facts({"pageable_copy": 1.0}, pageable_copy_ms=edge - 1.01)) is None
    v = R.pageable_copy(facts({"pageable_copy": 1.0}, pageable_copy_ms=edge - 1.0))
    assert v.share == pytest.approx(R.PAGEABLE_SHARE_MIN)


def test_launch_bound_needs_idle_and_short_kernels():
    edge = R.LAUNCH_SHARE_MIN * WINDOW
    short = R.LAUNCH_KERNEL_US_MAX - 0.1
    assert R.launch_bound(facts({"launch": edge - 0.01}, median_kernel_us=short)) is None
    assert R.launch_bound(facts({"launch": edge}, median_kernel_us=R.LAUNCH_KERNEL_US_MAX)) is None
    assert R.launch_bound(facts({"launch": edge}, median_kernel_us=None)) is None
    v = R.launch_bound(facts({"launch": edge}, median_kernel_us=short, kernels_per_step=800))
    assert v.lesson == "11" and v.share == pytest.approx(R.LAUNCH_SHARE_MIN) and "800 kernels" in v.evidence


def test_fp32_without_tensor_cores():
    edge = R.FP32_GEMM_SHARE_MIN * WINDOW
    assert R.fp32_no_tensor_cores(facts(gemms=(gemm(edge - 0.01),))) is None
    assert R.fp32_no_tensor_cores(facts(gemms=(gemm(edge, tensor_cores=True),))) is None     # TF32 on
    assert R.fp32_no_tensor_cores(facts(gemms=(gemm(edge, dtype="bf16"),))) is None
    v = R.fp32_no_tensor_cores(facts(gemms=(gemm(edge / 2), gemm(edge / 2))))
    assert v.lesson == "06" and v.share == pytest.approx(R.FP32_GEMM_SHARE_MIN)      # no peak: all the time
    # with a peak, what the FLOPs need at that peak stays: 1e12 FLOPs at 1000 TFLOP/s = 1 ms
    v = R.fp32_no_tensor_cores(facts(gemms=(gemm(edge, flops=1e12),), peak_tflops=1000.0))
    assert v.share == pytest.approx((edge - 1.0) / WINDOW)


def test_misaligned_gemm():
    edge = R.MISALIGNED_SHARE_MIN * WINDOW
    odd = {"dtype": "bf16", "tensor_cores": True, "misaligned": True, "shapes": ((4095, 64), (64, 128))}
    assert R.misaligned_gemm(facts(gemms=(gemm(edge - 0.01, **odd),))) is None
    v = R.misaligned_gemm(facts(gemms=(gemm(edge, **odd), gemm(50.0, dtype="bf16", tensor_cores=True))))
    assert v.lesson == "07" and v.share == pytest.approx(R.MISALIGNED_SHARE_MIN) and "4095" in v.evidence
    v = R.misaligned_gemm(facts(gemms=(gemm(edge, flops=2e12, **odd),), peak_tflops=1000.0))
    assert v.share == pytest.approx((edge - 2.0) / WINDOW)


def test_memory_pressure_retries_and_a_full_gpu():
    assert R.memory_pressure(facts(memory=memory())) is None
    assert R.memory_pressure(facts()) is None                     # no statistics, no allocator idle
    v = R.memory_pressure(facts(memory=memory(retries=1)))
    assert v.lesson == "02" and v.share == 0 and v.bound == 1 and "1 allocation retries" in v.evidence
    below = R.PEAK_RESERVED_FRAC_MAX - 0.01
    assert R.memory_pressure(facts(memory=memory(peak_frac=below))) is None
    v = R.memory_pressure(facts(memory=memory(peak_frac=R.PEAK_RESERVED_FRAC_MAX)))
    assert v.lesson == "09" and "peak reserved" in v.evidence


def test_comm_not_overlapped():
    edge = R.COMM_EXPOSED_SHARE_MIN * WINDOW
    assert R.comm_not_overlapped(facts(comm_ms=30.0, comm_exposed_ms=edge - 0.01)) is None
    v = R.comm_not_overlapped(facts(comm_ms=30.0, comm_exposed_ms=edge))
    assert v.lesson == "14" and v.share == pytest.approx(R.COMM_EXPOSED_SHARE_MIN)


def test_compute_bound_reports_mfu():
    edge = R.COMPUTE_BUSY_MIN * WINDOW
    gemms = {"gemm_tensor_core": 60.0, "elementwise_norm": 30.0}
    assert R.compute_bound(facts(busy=gemms, busy_ms=edge - 0.01)) is None
    # 4e13 FLOPs in a 100 ms step = 400 TFLOP/s; of an 800 TFLOP/s peak = MFU 50 %
    v = R.compute_bound(facts(busy=gemms, busy_ms=edge, step_ms=WINDOW, flops_per_step=4e13, peak_tflops=800.0,
                              peak_source="notebook 00"))
    assert v.lesson == "13" and v.share == pytest.approx(0.5) and not v.actionable and "MFU 50.0 %" in v.evidence
    v = R.compute_bound(facts(busy={"gemm_tensor_core": 20.0, "elementwise_norm": 70.0}, busy_ms=edge))
    assert v.lesson == "12" and v.share == 0 and "run notebook 00" in v.evidence


# -- running them ----------------------------------------------------------------------------------
def test_run_rules_ranks_by_bound_and_keeps_compute_bound_for_last():
    f = facts({"input": 6.0, "sync": 4.0}, busy_ms=90.0)     # compute_bound fires too (busy 90 %), but a fix comes first
    assert R.compute_bound(f) is not None
    verdicts, skipped = R.run_rules(f)
    assert [v.rule for v in verdicts] == ["input_bound"] and not skipped
    verdicts, _ = R.run_rules(facts({"input": 6.0, "sync": 7.0}, busy_ms=87.0))
    assert [v.rule for v in verdicts] == ["host_sync", "input_bound"]
    assert all(a.bound >= b.bound for a, b in itertools.pairwise(verdicts))
    verdicts, _ = R.run_rules(facts(busy_ms=95.0))
    assert [v.rule for v in verdicts] == ["compute_bound"]


def test_on_the_cpu_gpu_rules_are_skipped_with_a_reason():
    verdicts, skipped = R.run_rules(facts({"input": 20.0}, on_gpu=False))
    assert set(skipped) == set(R.GPU_ONLY) and all("needs a GPU" in why for why in skipped.values())
    assert [v.rule for v in verdicts] == ["input_bound"]


def test_every_rule_is_listed_and_every_gpu_only_name_is_a_rule():
    names = [r.__name__ for r in R.RULES]
    assert len(names) == len(set(names)) >= 9
    assert set(R.GPU_ONLY) <= set(names)


def test_every_rule_says_why_its_share_is_an_upper_bound():
    for rule in R.RULES:
        doc = " ".join((inspect.getdoc(rule) or "").split())
        assert "Share:" in doc, f"{rule.__name__} does not say what its share is"
        assert any(w in doc for w in ("at best", "at most", "no kernel", "cannot", "all a ")), rule.__name__


def test_every_threshold_has_a_comment_giving_its_reason():
    source = inspect.getsource(R).splitlines()
    tree = ast.parse("\n".join(source))
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and \
                node.targets[0].id.endswith(("_MIN", "_MAX")):
            above = source[node.lineno - 2].strip()
            assert above.startswith("#"), f"{node.targets[0].id} has no comment with its reason"


def test_verdict_bound_is_amdahl_and_serialisable():
    v = R.verdict("x", "y", "00", 0.75, "e", "f")
    assert v.bound == pytest.approx(4.0)
    assert R.verdict("x", "y", "00", 1.5, "e", "f").bound == float("inf")
    assert R.verdict("x", "y", "00", -0.5, "e", "f").share == 0
    assert json.loads(json.dumps(R.verdict("x", "y", "00", 1.0, "e", "f").to_dict()))["bound"] is None


def test_shares_are_of_the_unprofiled_step_and_idle_is_scaled_to_it():
    """The profiler lengthens the host's work: 40 ms of profiled idle around 60 ms busy, but the unprofiled
    step took 80 ms, so 20 ms of idle is real; each cause keeps its share of it."""
    f = facts({"launch": 30.0, "input": 10.0}, busy_ms=60.0, step_ms=80.0)
    assert f.idle_scale == pytest.approx(0.5)
    assert f.idle("launch") == pytest.approx(15.0) and f.idle("input") == pytest.approx(5.0)
    assert f.share(f.idle("input")) == pytest.approx(5.0 / 80.0)
    v = R.input_bound(f)                       # the input wait, and the launch gaps after it
    assert v is not None and v.share == pytest.approx(20.0 / 80.0)


def test_launch_bound_promises_all_host_side_idle():
    f = facts({"launch": 40.0, "other": 10.0}, busy_ms=50.0, median_kernel_us=5.0)
    v = R.launch_bound(f)
    assert v is not None and v.share == pytest.approx(0.5)       # a graph replay runs none of the host's work


def test_a_step_replayed_from_a_cuda_graph_is_not_called_launch_bound():
    """Its kernels come from one cudaGraphLaunch: the fix is in; its idle is the loop around it."""
    one_by_one = facts({"launch": 40.0}, busy_ms=60.0, median_kernel_us=5.0, kernels_per_step=90, launches_per_step=90)
    replayed = facts({"launch": 40.0}, busy_ms=60.0, median_kernel_us=5.0, kernels_per_step=90, launches_per_step=0)
    assert R.launch_bound(one_by_one) is not None and R.launch_bound(replayed) is None


def test_gpu_time_measured_under_the_profiler_never_promises_an_infinite_gain():
    """The 2 x H200 run's fp32 case: 46 ms of fp32 GEMMs in 47 ms busy under the profiler, a 43.1 ms step
    without it. Against the unprofiled step alone that is more than the whole step (bound inf)."""
    f = facts({"launch": 3.0}, busy={"gemm_no_tensor_core": 46.0}, busy_ms=47.0, step_ms=43.1,
              gemms=(gemm(46.0),))
    v = R.fp32_no_tensor_cores(f)
    assert v is not None and v.share == pytest.approx(46.0 / 47.0) and math.isfinite(v.bound)
