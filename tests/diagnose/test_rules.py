"""Every rule fires at its threshold and stays silent just below it, with the share (the most its fix can
remove) and the expected share its docstring gives; `run_rules`, `rank`, `demote` and `judge_gain`."""
import ast
import inspect
import json
import math

import pytest

from gpulab.diagnose import rules as R
from gpulab.diagnose.facts import CAUSES, CLASSES, Facts, GemmFact, MemoryFacts, StallFacts

WINDOW = 100.0          # ms: a share of x % is x ms
BELOW = 0.01            # ms under a threshold's edge


def facts(host=None, busy=None, on_gpu=True, **kw) -> Facts:
    """A profiled step of WINDOW ms whose host spent `host` ({cause: ms}) on each cause. The GPU is busy for
    the rest of the step unless `busy_ms` says otherwise, so by default every cause's host time is idle."""
    host_by_cause = dict.fromkeys(CAUSES, 0.0) | (host or {})
    busy_by_class = dict.fromkeys(CLASSES, 0.0) | (busy or {})
    kw.setdefault("busy_ms", WINDOW - sum(host_by_cause.values()))
    idle_ms = WINDOW - kw["busy_ms"]
    return Facts(on_gpu=on_gpu, steps=1, window_ms=WINDOW, idle_ms=idle_ms,
                 idle_by_cause=dict.fromkeys(CAUSES, 0.0) | {"other": idle_ms}, busy_by_class=busy_by_class,
                 host_by_cause=host_by_cause, **kw)


def gemm(ms, dtype="fp32", math_="fp32", tensor_cores=False, misaligned=False, flops=0.0,
         shapes=((64, 64), (64, 64))):
    return GemmFact(op="aten::mm", dtype=dtype, shapes=shapes, calls=1, gpu_ms=ms, flops=flops,
                    tensor_cores=tensor_cores, misaligned=misaligned, math=math_)


def memory(retries=0, reserved=0.5, allocated=0.4, total=1000 * 2**20):
    return MemoryFacts(alloc_retries=retries, inactive_split_bytes=3 * 2**20, peak_reserved_bytes=int(reserved * total),
                       total_bytes=total, peak_allocated_bytes=int(allocated * total), cap_source="the GPU's memory",
                       steps=5)


def stalls(mean, median, slow=(9,), period=None, site="", site_ms=0.0, every_chunk=False):
    steps = tuple(40.0 if i in slow else 10.0 for i in range(20))
    return StallFacts(step_ms=steps, slow=slow, median_ms=median, mean_ms=mean, period=period, site=site,
                      site_ms=site_ms, every_chunk=every_chunk)


def counters(before=None, warm=None, after=None):
    zero = {"graphs": 0, "cudagraph_skips": 0, "graph_breaks": {}}
    return {"before": zero | (before or {}), "warm": zero | (warm or {}), "after": zero | (after or {})}


# -- the host-side rules: a cause's host time, at most the GPU's idle ---------------------------------------
HOST_RULES = [
    (R.input_bound, "input_bound", "input", R.INPUT_SHARE_MIN, "03"),
    (R.host_sync, "host_sync", "sync", R.SYNC_SHARE_MIN, "01"),
    (R.pageable_copy, "pageable_copy", "pageable_copy", R.PAGEABLE_SHARE_MIN, "05"),
    (R.memory_pressure, "memory_pressure", "allocator", R.ALLOCATOR_SHARE_MIN, "02"),
    (R.host_code, "host_code", "host_code", R.HOST_CODE_SHARE_MIN, "03"),
    (R.launch_bound, "launch_bound", "launch", R.LAUNCH_SHARE_MIN, "11"),
]


@pytest.mark.parametrize("rule, name, cause, threshold, lesson", HOST_RULES)
def test_host_rules_fire_at_their_threshold(rule, name, cause, threshold, lesson):
    at = threshold * WINDOW
    assert rule(facts({cause: at - BELOW})) is None
    v = rule(facts({cause: at}))
    assert v is not None and v.rule == name == rule.__name__ and v.lesson == lesson and v.actionable
    assert v.share == pytest.approx(threshold) and v.bound == pytest.approx(1 / (1 - threshold))
    assert v.expected_share == v.share and not v.blocked_by          # the fix removes the cause whole
    assert f"{at:.3g} ms" in v.evidence
    assert rule(facts({"other": 3 * at})) is None                   # another cause's host time does not fire it


@pytest.mark.parametrize("rule, name, cause, threshold, lesson", HOST_RULES)
def test_host_rules_save_no_more_than_the_gpus_idle(rule, name, cause, threshold, lesson):
    """Four times the threshold on the host, but the GPU idles only just under it: silent; at it, the share
    is the idle, not the host time (the step cannot get shorter than the GPU's work)."""
    at = threshold * WINDOW
    assert rule(facts({cause: 4 * at}, busy_ms=WINDOW - at + BELOW)) is None
    v = rule(facts({cause: 4 * at}, busy_ms=WINDOW - at))
    assert v is not None and v.share == pytest.approx(threshold)


def test_host_times_are_scaled_to_the_unprofiled_step():
    """The profiler slows the host: a 100 ms profiled step that takes 80 ms without it scales every host time
    by 0.8; the shares are of the 80 ms step."""
    f = facts({"input": 10.0, "sync": 30.0}, busy_ms=50.0, step_ms=80.0)
    assert f.host_scale == pytest.approx(0.8) and f.base_ms == 80.0 and f.base_idle_ms == pytest.approx(30.0)
    assert f.host("input") == pytest.approx(8.0) and f.idle("input") == pytest.approx(8.0)
    assert f.idle("sync") == pytest.approx(24.0)
    assert f.idle("allocator") == 0.0
    assert R.input_bound(f).share == pytest.approx(8.0 / 80.0)
    # an unprofiled step longer than the profiled one does not scale the host up
    assert facts({"input": 10.0}, step_ms=150.0).host_scale == 1.0
    # on the CPU the device is the host: no idle cap
    cpu = facts({"input": 10.0}, busy_ms=99.0, on_gpu=False)
    assert cpu.idle("input") == 10.0 and R.input_bound(cpu).share == pytest.approx(0.10)


def test_idle_is_read_from_the_kernel_only_profile_where_there_is_one():
    """The full profile stretches the step and its kernels run at a lighter load; the unprofiled idle is
    the kernel-only profile's idle share of steps back to back times the step. A launch-bound reading of a
    GPU that was busy back to back goes away."""
    stretched = dict(busy_ms=50.0, step_ms=80.0)          # step minus profiled busy: 30 ms "idle"
    assert facts({"launch": 60.0}, **stretched).base_idle_ms == pytest.approx(30.0)
    f = facts({"launch": 60.0}, light_busy_ms=78.0, light_step_ms=81.0, **stretched)
    assert f.base_idle_ms == pytest.approx(2.0)         # the smaller of 80 x 3/81 and 80 - 78
    # a kernel-only profile that stretched a host-paced step: its idle share would overstate the idle
    assert facts({"launch": 60.0}, light_busy_ms=28.0, light_step_ms=43.0, step_ms=34.0,
                 busy_ms=28.0).base_idle_ms == pytest.approx(6.0)
    assert facts({"launch": 60.0}, light_busy_ms=20.0, light_step_ms=25.0, step_ms=30.0,
                 busy_ms=20.0).base_idle_ms == pytest.approx(6.0)          # 30 x 5/25 < 30 - 20
    assert R.launch_bound(f) is None and R.launch_bound(facts({"launch": 60.0}, **stretched)) is not None
    assert facts({"launch": 60.0}, light_busy_ms=90.0, light_step_ms=81.0, **stretched).base_idle_ms == 0.0


def test_launch_bound_leaves_out_what_graphs_cannot_capture():
    """The optimizer's host time and the recurrent layers' (Dynamo runs nn.LSTM eagerly) stay outside the
    model's graphs: expected without them, silent when what is left is under the threshold."""
    v = R.launch_bound(facts({"launch": 40.0}, rnn_host_ms=20.0, optimizer_host_ms=5.0))
    assert v.share == pytest.approx(0.40) and v.expected_share == pytest.approx(0.15)
    assert "the recurrent layers' 20 ms too" in v.evidence and "the optimizer's 5 ms" in v.evidence
    edge = R.LAUNCH_SHARE_MIN * WINDOW
    assert R.launch_bound(facts({"launch": 40.0}, rnn_host_ms=40.0 - edge + BELOW)) is None
    assert R.launch_bound(facts({"launch": 40.0}, rnn_host_ms=40.0 - edge)) is not None


def test_input_bound_names_the_fix_for_where_the_batch_is_made():
    loader = R.input_bound(facts({"input": 10.0}, precopy_ms=5.0,
                                 host_sites={"input": (("train.py:12 (step)", "", 10.0),)}))
    assert "waited for from the DataLoader" in loader.evidence and "train.py:12 (step) (10 ms)" in loader.evidence
    assert loader.fix.startswith("DataLoader(num_workers>0")
    main = R.input_bound(facts({"input": 10.0}, precopy_ms=5.01))          # over half the input time
    assert "made in the main thread" in main.evidence and main.fix.startswith("move the batch making into a Dataset")


def test_host_sync_lists_the_lines_and_grad_scalers_own():
    rows = (("train.py:20 (step)", "train.py:20 (step)", 6.0, 1.0), ("train.py:9 (log)", "torch/_tensor.py:1", 0.0, 1.0))
    v = R.host_sync(facts({"sync": 6.0}, syncs=rows))
    assert "train.py:20 (step): blocked 6 ms, 1 call(s) per step" in v.evidence
    assert "train.py:9" not in v.evidence                     # blocked no time
    assert "fused=True" not in v.fix
    scaler = R.host_sync(facts({"sync": 6.0}, syncs=(("train.py:30 (step)", "torch/amp/grad_scaler.py:400 (step)",
                                                       6.0, 1.0),)))
    assert "via torch/amp/grad_scaler.py:400" in scaler.evidence and "fused=True" in scaler.fix
    # only the debug mode's finds: they are the lines shown
    hidden = R.host_sync(facts({"sync": 6.0}, hidden_syncs=(("train.py:5 (step)", "torch/x.py:1"),)))
    assert "train.py:5 (step) via torch/x.py:1" in hidden.evidence


def test_pageable_copy_is_capped_by_the_gpus_other_work():
    """Pinned, the copy still runs on the GPU: at most the step minus the GPU's other work is saved."""
    # 10 ms staging, the GPU busy 96 ms of which 1 ms is the pageable copy itself: 5 ms can go
    v = R.pageable_copy(facts({"pageable_copy": 10.0}, busy_ms=96.0, pageable_copy_ms=1.0,
                              pageable_copies=(("train.py:7 (step)", 10.0, 2 * 2**20),)))
    assert v.share == pytest.approx(0.05) and "train.py:7 (step): 2.0 MiB per step" in v.evidence
    assert R.pageable_copy(facts({"pageable_copy": 10.0}, busy_ms=96.0, pageable_copy_ms=1.0 - BELOW)) is None


def test_pageable_copy_counts_the_queue_its_waits_emptied():
    """A blocking copy from pageable memory waits for the GPU: pinned and non_blocking, the refill after that
    wait goes too (expected), and where the copies are the step's only waits, all of the GPU's idle can
    (share): the host queues work ahead. Issue 40: on an H100, notebook 15's pinning round saved 1.26x
    against a share of 1.16x that counted the staging alone."""
    line, item = "train.py:7 (step)", "train.py:9 (step)"
    kw = dict(busy_ms=80.0, pageable_copy_ms=1.0, pageable_copies=((line, 10.0, 2 * 2**20),),
              pinnable_sites=(line, "train.py:8 (step)"), host_sites={"after_sync": ((line, "", 3.0), (item, "", 2.0))})
    # idle 20 ms of 100; the GPU's other work 79 ms: at most 21 ms to win
    alone = R.pageable_copy(facts({"pageable_copy": 10.0}, syncs=((line, "", 0.5, 1.0),), **kw))
    assert alone.expected == pytest.approx(0.13) and alone.share == pytest.approx(0.21)      # 10 + 3; all the room
    assert "no other wait in the step" in alone.evidence
    # an .item() elsewhere still empties the queue every step: staging, the copy's GPU time and its refill
    other = R.pageable_copy(facts({"pageable_copy": 10.0}, syncs=((line, "", 0.5, 1.0), (item, "", 2.0, 1.0)), **kw))
    assert other.expected == pytest.approx(0.13) and other.share == pytest.approx(0.14)
    assert "no other wait" not in other.evidence
    # it fires on the staging alone, as before: the refill does not make a rule fire
    assert R.pageable_copy(facts({"pageable_copy": R.PAGEABLE_SHARE_MIN * WINDOW - BELOW}, **kw)) is None


def test_a_read_back_is_not_counted_as_a_copy_pinning_removes():
    """A pageable copy back to the host (a large .cpu()) keeps its wait when the host tensors are pinned: its line
    is not among the host-to-device ones, so neither its refill nor the all-the-idle share is counted."""
    line = "train.py:7 (step)"
    v = R.pageable_copy(facts({"pageable_copy": 10.0}, busy_ms=80.0, pageable_copy_ms=1.0,
                              pageable_copies=((line, 10.0, 2 * 2**20),), syncs=((line, "", 0.5, 1.0),),
                              host_sites={"after_sync": ((line, "", 3.0),)}))
    assert v.expected == pytest.approx(0.10) and v.share == pytest.approx(0.11)      # staging; + its GPU time


def test_pageable_copy_reads_the_gpus_other_work_from_the_kernel_only_profile():
    """The full profiler stretches the GPU's work: on the H100 (2026-12-06) notebook 15's pinning round was
    capped at the step minus the full profile's busy time (2.0 ms) and saved 2.9 ms. Room is the unprofiled
    idle (the kernel-only profile) and the copies' own GPU time, as every host rule reads the idle."""
    line = "train.py:7 (step)"
    v = R.pageable_copy(facts({"pageable_copy": 15.0}, busy_ms=90.0, step_ms=100.0, light_busy_ms=78.0,
                              light_step_ms=100.0, pageable_copy_ms=1.0, pageable_copies=((line, 15.0, 2 * 2**20),),
                              pinnable_sites=(line,), syncs=((line, "", 0.5, 1.0),)))
    assert v.share == pytest.approx(0.23) and v.expected == pytest.approx(0.15)   # 22 ms idle + 1 ms copy; 15 ms


def test_launch_bound_needs_kernels_launched_one_at_a_time():
    edge = R.LAUNCH_SHARE_MIN * WINDOW
    half = R.LAUNCHES_PER_KERNEL_MIN * 90
    assert R.launch_bound(facts({"launch": edge}, kernels_per_step=90, launches_per_step=half)) is not None
    assert R.launch_bound(facts({"launch": edge}, kernels_per_step=90, launches_per_step=half - 0.5)) is None
    assert R.launch_bound(facts({"launch": edge}, kernels_per_step=90, launches_per_step=None)) is not None
    # no condition on the median kernel any more
    assert R.launch_bound(facts({"launch": edge}, median_kernel_us=5000.0)) is not None


def test_launch_bound_is_blocked_only_by_syncs_inside_the_model():
    edge = R.LAUNCH_SHARE_MIN * WINDOW
    mine = ("train.py:20 (step)", "train.py:20 (step)", 1.0, 1.0)
    scaler = ("train.py:30 (step)", "torch/amp/grad_scaler.py:400 (_maybe_opt_step)", 1.0, 1.0)
    forward = ("model.py:12 (forward)", "model.py:12 (forward)", 1.0, 1.0)
    assert R.launch_bound(facts({"launch": edge})).blocked_by == ""
    for outside in ((mine,), (scaler,), (mine, scaler)):
        v = R.launch_bound(facts({"launch": edge}, syncs=outside))
        assert v.blocked_by == "" and "outside the model" in v.fix
    v = R.launch_bound(facts({"launch": edge}, syncs=(mine, forward)))
    assert v.blocked_by == "host_sync" and v.fix.startswith("first move the synchronizations out of the model's forward")
    # a sync line inside the forward that blocked no time: nothing blocks
    assert R.launch_bound(facts({"launch": edge}, syncs=(forward[:2] + (0.0, 1.0),))).blocked_by == ""
    # a sync found by the debug mode alone (no time measured) inside the forward blocks; outside it does not
    assert R.launch_bound(facts({"launch": edge}, hidden_syncs=(("m.py:1 (forward)", "x.py:2"),))).blocked_by == "host_sync"
    assert R.launch_bound(facts({"launch": edge}, hidden_syncs=(("train.py:1 (f)", "x.py:2"),))).blocked_by == ""


def test_host_code_names_the_users_lines():
    v = R.host_code(facts({"host_code": 6.0}, host_sites={"host_code": (("train.py:50 (log)", "", 6.0),)}))
    assert "train.py:50 (log) (6 ms)" in v.evidence


# -- memory ----------------------------------------------------------------------------------------------
def test_memory_pressure_fires_on_retries_or_allocator_time():
    assert R.memory_pressure(facts(memory=memory())) is None
    assert R.memory_pressure(facts()) is None                                   # no statistics, no allocator time
    v = R.memory_pressure(facts(memory=memory(retries=1)))
    assert v.rule == "memory_pressure" and v.share == 0 and v.bound == 1 and "1 allocation retries in 5 steps" in v.evidence
    # reserved memory near full is not pressure any more (memory_full reads allocated memory)
    assert R.memory_pressure(facts(memory=memory(reserved=1.0, allocated=0.5))) is None


def test_memory_full_reads_allocated_memory_and_is_a_note():
    total = 1000
    def full(allocated, reserved=1000):
        return facts(memory=MemoryFacts(alloc_retries=0, inactive_split_bytes=0, peak_reserved_bytes=reserved,
                                        total_bytes=total, peak_allocated_bytes=allocated, cap_source="a cap"))
    edge = int(R.PEAK_ALLOCATED_FRAC_MAX * total)
    assert R.memory_full(full(edge - 1)) is None
    v = R.memory_full(full(edge))
    assert v.rule == "memory_full" and not v.actionable and v.share == 0 and v.lesson == "09"
    assert "90.0 %" in v.evidence and "a cap" in v.evidence
    assert R.memory_full(full(500, reserved=1000)) is None               # a full cache is reusable
    assert R.memory_full(facts()) is None
    zero = MemoryFacts(alloc_retries=0, inactive_split_bytes=0, peak_reserved_bytes=0, total_bytes=0)
    assert R.memory_full(facts(memory=zero)) is None


# -- slow steps ------------------------------------------------------------------------------------------
def test_periodic_stall_edge_and_share_of_the_mean_step():
    # the mean step 100 ms against a typical 95: a 5 % excess
    assert R.periodic_stall(facts(stalls=stalls(100.0, 95.0 + BELOW))) is None
    v = R.periodic_stall(facts(stalls=stalls(100.0, 95.0, slow=(4, 14), period=10, site="train.py:9 (save)",
                                             site_ms=30.0)))
    assert v.rule == "periodic_stall" and v.lesson == "01" and v.share == pytest.approx(R.STALL_SHARE_MIN)
    assert "every 10 steps" in v.evidence and "2 of 20 timed steps" in v.evidence
    assert "30 ms more than a typical one in train.py:9 (save)" in v.evidence
    # slow steps at uneven intervals: noise makes those too (a busy host), so no verdict, even at 50 %
    assert R.periodic_stall(facts(stalls=stalls(100.0, 50.0))) is None
    assert R.periodic_stall(facts(stalls=stalls(100.0, 95.0 + BELOW, slow=(4, 14, 24), period=10))) is None
    assert R.periodic_stall(facts(stalls=stalls(100.0, 50.0, slow=()))) is None      # no slow step
    assert R.periodic_stall(facts()) is None


# -- the GPU's kernels ------------------------------------------------------------------------------------
def test_fp32_matmuls_edge_counts_ieee_and_tf32_but_not_16_bit():
    edge = R.FP32_GEMM_SHARE_MIN * WINDOW
    assert R.fp32_matmuls(facts(gemms=(gemm(edge - BELOW),))) is None
    assert R.fp32_matmuls(facts(gemms=(gemm(edge, dtype="bf16", math_="bf16", tensor_cores=True),))) is None
    v = R.fp32_matmuls(facts(gemms=(gemm(edge / 2), gemm(edge / 2, math_="tf32", tensor_cores=True))))
    assert v.rule == "fp32_matmuls" and v.lesson == "06"
    # no FLOPs known: the bound is all their time, the expectation half of it (UNKNOWN_FLOPS_SAVING)
    assert v.share == pytest.approx(R.FP32_GEMM_SHARE_MIN)
    assert v.expected_share == pytest.approx(R.FP32_GEMM_SHARE_MIN * R.UNKNOWN_FLOPS_SAVING)
    assert "5 ms on the CUDA cores, 5 ms as TF32" in v.evidence and "allow TF32" not in v.fix
    assert "or allow TF32" in R.fp32_matmuls(facts(gemms=(gemm(edge),))).fix       # IEEE: TF32 would help
    # a T4 or V100 has no TF32 (second review of 15, 2026-12-06): the fix says 16-bit only
    assert "TF32" not in R.fp32_matmuls(facts(gemms=(gemm(edge),), tf32_supported=False)).fix


def test_fp32_matmuls_share_above_the_ceiling_and_expected_above_the_measured_peak():
    # 1e12 FLOPs take 1 ms at the 1000 TFLOP/s datasheet ceiling and 2 ms at the 500 measured
    f = facts(gemms=(gemm(20.0, flops=1e12),), kernel_ceiling_tflops=1000.0, peak_tflops=500.0)
    v = R.fp32_matmuls(f)
    assert v.share == pytest.approx(0.19) and v.expected_share == pytest.approx(0.18)
    # the GPU's busy time under the profiler can exceed the unprofiled step: never more than all of it
    over = facts({"launch": 3.0}, busy_ms=47.0, step_ms=43.1, gemms=(gemm(46.0),))
    v = R.fp32_matmuls(over)
    assert v.share == pytest.approx(46.0 / 47.0) and math.isfinite(v.bound)


def test_misaligned_gemm_edge_and_share():
    edge = R.MISALIGNED_SHARE_MIN * WINDOW
    odd = {"dtype": "bf16", "math_": "bf16", "tensor_cores": True, "misaligned": True, "shapes": ((4095, 64), (64, 128))}
    assert R.misaligned_gemm(facts(gemms=(gemm(edge - BELOW, **odd), gemm(50.0, dtype="bf16", math_="bf16")))) is None
    v = R.misaligned_gemm(facts(gemms=(gemm(edge, **odd), gemm(50.0, dtype="bf16", math_="bf16"))))
    assert v.lesson == "07" and v.share == pytest.approx(R.MISALIGNED_SHARE_MIN) and "4095" in v.evidence
    v = R.misaligned_gemm(facts(gemms=(gemm(edge, flops=2e12, **odd),), kernel_ceiling_tflops=2000.0, peak_tflops=1000.0))
    assert v.share == pytest.approx((edge - 1.0) / WINDOW) and v.expected_share == pytest.approx((edge - 2.0) / WINDOW)


def test_layout_transposes_edge():
    edge = R.TRANSPOSE_SHARE_MIN * WINDOW
    assert R.layout_transposes(facts(transpose_ms=edge - BELOW)) is None
    v = R.layout_transposes(facts(transpose_ms=edge))
    assert v.lesson == "07" and v.share == pytest.approx(R.TRANSPOSE_SHARE_MIN) and "channels_last" in v.fix


def test_attention_math_edge_and_share():
    edge = R.ATTENTION_SHARE_MIN * WINDOW
    assert R.attention_math(facts(attention_math_ms=edge - BELOW)) is None
    v = R.attention_math(facts(attention_math_ms=edge, attention_shape=(1024, 1024)))
    assert v.lesson == "13" and v.share == pytest.approx(R.ATTENTION_SHARE_MIN) and "1024x1024" in v.evidence
    v = R.attention_math(facts(attention_math_ms=20.0, attention_math_flops=4e12, kernel_ceiling_tflops=2000.0,
                               peak_tflops=1000.0))
    assert v.share == pytest.approx(0.18) and v.expected_share == pytest.approx(0.16)


ADAMW = dict(optimizer_name="AdamW", optimizer_ops=("aten::_foreach_lerp_", "aten::_foreach_mul_"))


def test_optimizer_unfused_edge_on_what_fusing_is_expected_to_save():
    assert R.optimizer_unfused(facts(optimizer_host_ms=50.0, optimizer_fused=True, **ADAMW)) is None
    assert R.optimizer_unfused(facts(optimizer_host_ms=50.0, optimizer_fused=None, **ADAMW)) is None   # none seen
    # host-only: its host time on the path is in the bound, not expected to go (a fused step runs the same
    # Python per parameter): silent however long
    assert R.optimizer_unfused(facts({"launch": 50.0}, optimizer_host_ms=50.0, optimizer_fused=False, **ADAMW)) is None
    # AdamW: the edge is on two thirds of the GPU time (7 of 21 passes fused); the host part widens the bound only
    fraction, how = R.fused_fraction("AdamW", ADAMW["optimizer_ops"])
    assert fraction == pytest.approx(1 / 3) and "7 passes" in how and "21 unfused" in how
    edge = R.OPTIMIZER_SHARE_MIN * WINDOW / (1 - fraction)
    assert R.optimizer_unfused(facts({"launch": 10.0}, optimizer_gpu_ms=edge - BELOW, optimizer_host_ms=10.0 + edge,
                                     optimizer_fused=False, **ADAMW)) is None
    v = R.optimizer_unfused(facts({"launch": 10.0}, optimizer_gpu_ms=edge, optimizer_host_ms=10.0 + edge,
                                  optimizer_fused=False, optimizer_kernels=120, **ADAMW))
    assert v.lesson == "12" and v.expected_share == pytest.approx(0.05)
    assert v.share == pytest.approx((10.0 + edge) / WINDOW)
    assert v.fix == "torch.optim.AdamW(..., fused=True)" and "120 kernels" in v.evidence and "0.33" in v.evidence
    # GPU-only: a fused kernel still takes a third; 6 ms could go at most, 4 are expected: under the threshold
    gpu = R.optimizer_unfused(facts(optimizer_gpu_ms=6.0, optimizer_fused=False, **ADAMW))
    assert gpu is None
    v = R.optimizer_unfused(facts(optimizer_gpu_ms=9.0, optimizer_fused=False, **ADAMW))
    assert v.share == pytest.approx(0.09) and v.expected_share == pytest.approx(0.06)
    # GradScaler's unscale and its .item() go with the fused optimizer
    v = R.optimizer_unfused(facts({"launch": 10.0, "sync": 2.0}, optimizer_host_ms=1.0, scaler_host_ms=3.0,
                                  optimizer_fused=False, **ADAMW,
                                  syncs=(("t.py:3 (s)", "torch/amp/grad_scaler.py:1 (step)", 2.0, 1.0),)))
    assert v is None        # 2 ms of .item() and no GPU time: under the threshold, whatever the host spent
    v = R.optimizer_unfused(facts({"launch": 10.0, "sync": 2.0}, optimizer_host_ms=1.0, scaler_host_ms=3.0,
                                  optimizer_gpu_ms=6.0, optimizer_fused=False, **ADAMW,
                                  syncs=(("t.py:3 (s)", "torch/amp/grad_scaler.py:1 (step)", 2.0, 1.0),)))
    assert v.expected_share == pytest.approx(0.06) and "GradScaler's unscale included" in v.evidence
    assert "GradScaler's .item() blocked 2 ms" in v.evidence


def test_the_fused_fraction_counts_each_optimizers_passes():
    """Each optimizer's passes over its parameters, fused against its multi-tensor form; SGD's momentum read from
    its ops (a mul_ of the buffers), weight decay or Nesterov from an out-of-place add; no fused kernel, no verdict."""
    assert R.fused_fraction("SGD", ("aten::_foreach_mul_", "aten::_foreach_add_"))[0] == pytest.approx(5 / 8)
    assert R.fused_fraction("SGD", ("aten::_foreach_add", "aten::_foreach_mul_", "aten::_foreach_add_"))[0] == \
        pytest.approx(5 / 11)
    assert R.fused_fraction("SGD", ("aten::mul_", "aten::add_"))[0] == pytest.approx(5 / 8)    # the single-tensor loop
    assert R.fused_fraction("SGD", ("aten::_foreach_add_",))[0] == pytest.approx(1.0)          # nothing to fuse
    assert R.fused_fraction("Adam", ("aten::_foreach_lerp_",))[0] == pytest.approx(7 / 19)
    assert R.fused_fraction("Adam", ("aten::_foreach_add", "aten::_foreach_lerp_"))[0] == pytest.approx(7 / 22)
    for name in ("Adadelta", "RMSprop", "Lion", ""):
        assert R.fused_fraction(name, ("aten::_foreach_mul_",)) is None
    sgd = dict(optimizer_name="SGD", optimizer_ops=("aten::_foreach_mul_", "aten::_foreach_add_"), optimizer_fused=False)
    assert R.optimizer_unfused(facts(optimizer_gpu_ms=50.0, **sgd)).expected_share == pytest.approx(0.5 * 3 / 8)
    assert R.optimizer_unfused(facts(optimizer_gpu_ms=50.0, optimizer_name="Adadelta", optimizer_fused=False,
                                     optimizer_ops=("aten::_foreach_mul_",))) is None
    # notebook 15's step (SGD with momentum, no decay): a third of the GPU time had promised 1.61x; its own passes
    # (5 of 8) leave 3/8 of the GPU time to win: 1.27x
    gpu_ms = (1 - 1 / 1.61) / (2 / 3) * WINDOW
    assert R.optimizer_unfused(facts(optimizer_gpu_ms=gpu_ms, **sgd)).expected_gain == pytest.approx(1.27, abs=0.005)


def test_elementwise_unfused_edge_outside_compile():
    edge = R.ELEMENTWISE_SHARE_MIN * WINDOW
    assert R.elementwise_unfused(facts(busy={"elementwise_norm": edge - BELOW})) is None
    v = R.elementwise_unfused(facts(busy={"elementwise_norm": edge}))
    assert v.lesson == "12" and v.share == pytest.approx(0.25)
    assert not v.actionable and "measure it" in v.evidence      # a note: no gain is promised
    ranked, _ = R.run_rules(facts({"launch": 30.0}, busy={"elementwise_norm": 60.0}))
    assert [w.rule for w in ranked] == ["launch_bound", "elementwise_unfused"]
    assert R.elementwise_unfused(facts(busy={"elementwise_norm": 60.0}, compiled_regions=1.0)) is None


def test_copy_not_overlapped_edge_and_the_compute_to_hide_it_under():
    edge = R.COPY_EXPOSED_SHARE_MIN * WINDOW
    assert R.copy_not_overlapped(facts(busy_ms=60.0, copy_exposed_ms=edge - BELOW)) is None
    v = R.copy_not_overlapped(facts(busy_ms=60.0, copy_exposed_ms=edge))
    assert v.lesson == "08" and v.share == pytest.approx(R.COPY_EXPOSED_SHARE_MIN)
    # 8 ms of exposed copies but only 4 ms of compute beside them: 4 can be hidden
    assert R.copy_not_overlapped(facts(busy_ms=12.0, copy_exposed_ms=8.0)) is None
    assert R.copy_not_overlapped(facts(busy_ms=13.0, copy_exposed_ms=8.0)).share == pytest.approx(0.05)


def test_comm_not_overlapped_edge():
    edge = R.COMM_EXPOSED_SHARE_MIN * WINDOW
    assert R.comm_not_overlapped(facts(comm_ms=30.0, comm_exposed_ms=edge - BELOW)) is None
    v = R.comm_not_overlapped(facts(comm_ms=30.0, comm_exposed_ms=edge))
    assert v.lesson == "14" and v.share == pytest.approx(R.COMM_EXPOSED_SHARE_MIN)


def test_no_sync_accumulation_edge_needs_micro_batches():
    edge = R.NO_SYNC_SHARE_MIN * WINDOW
    assert R.no_sync_accumulation(facts(ddp_forwards=4.0, comm_early_ms=edge - BELOW)) is None
    v = R.no_sync_accumulation(facts(ddp_forwards=4.0, comm_early_ms=edge))
    assert v.lesson == "10" and v.share == pytest.approx(R.NO_SYNC_SHARE_MIN) and "no_sync" in v.fix
    assert R.no_sync_accumulation(facts(ddp_forwards=1.0, comm_early_ms=50.0)) is None


def test_data_parallel_edge_scaled_and_capped_by_the_idle():
    edge = R.DATA_PARALLEL_SHARE_MIN * WINDOW
    assert R.data_parallel(facts({"launch": edge}, data_parallel_ms=edge - BELOW)) is None
    v = R.data_parallel(facts({"launch": edge}, data_parallel_ms=edge))
    assert v.lesson == "14" and v.share == pytest.approx(R.DATA_PARALLEL_SHARE_MIN)
    assert R.data_parallel(facts({"launch": edge - BELOW}, data_parallel_ms=30.0)) is None      # the idle caps it
    assert R.data_parallel(facts(data_parallel_ms=0.0)) is None


# -- torch.compile ------------------------------------------------------------------------------------------
def test_compile_recompiles_fires_on_graphs_compiled_while_measured():
    warm_only = counters(warm={"graphs": 3}, after={"graphs": 3})       # compiled while warming up: fine
    assert R.compile_recompiles(facts(compile=warm_only)) is None
    assert R.compile_recompiles(facts()) is None
    v = R.compile_recompiles(facts(compile=counters(warm={"graphs": 3}, after={"graphs": 4}),
                                   stalls=stalls(100.0, 80.0)))
    assert v.rule == "compile_recompiles" and v.lesson == "12" and v.share == pytest.approx(0.2)
    assert "1 new graph(s)" in v.evidence and "mark_dynamic" in v.fix
    assert R.compile_recompiles(facts(compile=counters(after={"graphs": 1}))) is None      # no cost seen: silent
    edge = R.STALL_SHARE_MIN
    below = R.compile_recompiles(facts(compile=counters(after={"graphs": 1}), stalls=stalls(100.0, 100.0 * (1 - edge) + 0.1)))
    assert below is None
    assert R.compile_recompiles(facts(compile=counters(after={"graphs": 1}), stalls=stalls(100.0, 100.0 * (1 - edge)))) is not None


def test_compile_graph_breaks_edge():
    edge = R.GRAPH_BREAK_SHARE_MIN * WINDOW
    c = counters(after={"graph_breaks": {"call to .item()": 2, "print": 1}})
    assert R.compile_graph_breaks(facts({"launch": 10.0}, compiled_regions=1.0, between_regions_ms=10.0)) is None
    assert R.compile_graph_breaks(facts({"launch": 10.0}, compiled_regions=2.0, between_regions_ms=edge - BELOW)) is None
    v = R.compile_graph_breaks(facts({"launch": 10.0}, compiled_regions=2.0, between_regions_ms=edge, compile=c))
    assert v.lesson == "12" and v.share == pytest.approx(R.GRAPH_BREAK_SHARE_MIN)
    assert "dynamo's reasons: call to .item(); print" in v.evidence


def test_cudagraphs_skipped_edge_and_it_replaces_launch_bound():
    edge = R.CUDAGRAPH_SKIP_SHARE_MIN * WINDOW
    skipped = counters(warm={"cudagraph_skips": 1}, after={"cudagraph_skips": 1})
    assert R.cudagraphs_skipped(facts({"launch": 30.0}, compiled_regions=1.0)) is None              # none skipped
    assert R.cudagraphs_skipped(facts({"launch": 30.0}, compile=skipped)) is None                   # nothing compiled
    assert R.cudagraphs_skipped(facts({"launch": edge - BELOW}, compiled_regions=1.0, compile=skipped)) is None
    v = R.cudagraphs_skipped(facts({"launch": edge}, compiled_regions=1.0, compile=skipped))
    assert v.lesson == "11" and v.share == pytest.approx(R.CUDAGRAPH_SKIP_SHARE_MIN) and "1 time(s)" in v.evidence
    replayed = facts({"launch": 30.0}, compiled_regions=1.0, compile=skipped, kernels_per_step=100, launches_per_step=10)
    assert R.cudagraphs_skipped(replayed) is None
    verdicts, _ = R.run_rules(facts({"launch": 30.0}, compiled_regions=1.0, compile=skipped))
    assert "cudagraphs_skipped" in [v.rule for v in verdicts] and "launch_bound" not in [v.rule for v in verdicts]
    # expected: only the host time inside the compiled code; the share stays the launch time
    v = R.cudagraphs_skipped(facts({"launch": 30.0}, compiled_regions=1.0, compile=skipped, compiled_host_ms=12.0))
    assert v.share == pytest.approx(0.30) and v.expected_share == pytest.approx(0.12)
    assert "12 ms of the step inside the compiled code" in v.evidence
    # where the launches inside it are known: only the stretch from the first launch to the last
    v = R.cudagraphs_skipped(facts({"launch": 30.0}, compiled_regions=1.0, compile=skipped, compiled_host_ms=12.0,
                                   compiled_launch_ms=5.0))
    assert v.share == pytest.approx(0.30) and v.expected_share == pytest.approx(0.05)
    assert "5 ms of it between its first launch and its last" in v.evidence
    # less the GPU time of the kernels queued in that stretch (a graph still runs them); never below nothing
    v = R.cudagraphs_skipped(facts({"launch": 30.0}, compiled_regions=1.0, compile=skipped, compiled_host_ms=12.0,
                                   compiled_launch_ms=9.0, compiled_launch_busy_ms=2.0))
    assert v.expected_share == pytest.approx(0.07) and "2 ms of which its kernels keep the GPU busy" in v.evidence
    # a compiled stretch its kernels keep busy, or one below the threshold: the graphs would buy nothing
    for launch_ms, busy_ms in ((5.0, 6.0), (R.CUDAGRAPH_SKIP_SHARE_MIN * WINDOW - BELOW, 0.0)):
        assert R.cudagraphs_skipped(facts({"launch": 30.0}, compiled_regions=1.0, compile=skipped, compiled_host_ms=12.0,
                                          compiled_launch_ms=launch_ms, compiled_launch_busy_ms=busy_ms)) is None
    # a forward launched one by one while the backward replays a graph: fewer launch calls than kernels, and
    # the compiled stretch says the forward is launched one by one (launch_bound stays silent there)
    partly = facts({"launch": 30.0}, compiled_regions=1.0, compile=skipped, kernels_per_step=100, launches_per_step=40,
                   compiled_host_ms=12.0, compiled_launch_ms=R.CUDAGRAPH_SKIP_SHARE_MIN * WINDOW)
    assert R.cudagraphs_skipped(partly).expected_share == pytest.approx(R.CUDAGRAPH_SKIP_SHARE_MIN)
    assert R.launch_bound(partly) is None


def test_compute_bound_names_the_fraction_of_measured_peak_and_mfu_apart():
    edge = R.COMPUTE_BUSY_MIN * WINDOW
    gemms = {"gemm_tensor_core": 60.0, "elementwise_norm": 30.0}
    assert R.compute_bound(facts(busy=gemms, busy_ms=edge - BELOW)) is None
    # 4e13 FLOPs in a 100 ms step = 400 TFLOP/s: 50 % of an 800 TFLOP/s measured peak (what the share reads),
    # MFU 40 % of a 1000 TFLOP/s datasheet
    v = R.compute_bound(facts(busy=gemms, busy_ms=edge, step_ms=WINDOW, flops_per_step=4e13, peak_tflops=800.0,
                              peak_source="notebook 00", kernel_ceiling_tflops=1000.0))
    assert v.lesson == "13" and v.share == pytest.approx(0.5) and not v.actionable
    assert "50.0 % of the measured peak" in v.evidence and "MFU 40.0 % of the datasheet's 1e+03 TFLOP/s" in v.evidence
    no_sheet = R.compute_bound(facts(busy=gemms, busy_ms=edge, step_ms=WINDOW, flops_per_step=4e13, peak_tflops=800.0))
    assert no_sheet.share == pytest.approx(0.5) and "MFU" not in no_sheet.evidence
    v = R.compute_bound(facts(busy={"gemm_tensor_core": 20.0, "elementwise_norm": 70.0}, busy_ms=edge))
    assert v.lesson == "12" and v.share == 0 and "run notebook 00" in v.evidence


# -- running them ----------------------------------------------------------------------------------
def test_run_rules_keeps_compute_bound_for_when_no_fix_fired():
    f = facts({"input": 6.0, "sync": 4.0})                    # busy 90 %: compute_bound fires too
    assert R.compute_bound(f) is not None
    verdicts, skipped = R.run_rules(f)
    assert [v.rule for v in verdicts] == ["input_bound"] and not skipped
    verdicts, _ = R.run_rules(facts({"input": 6.0, "sync": 7.0}))
    assert [v.rule for v in verdicts] == ["host_sync", "input_bound"]
    verdicts, _ = R.run_rules(facts(busy_ms=95.0))
    assert [v.rule for v in verdicts] == ["compute_bound"]
    # a note does not hide compute_bound
    full = MemoryFacts(alloc_retries=0, inactive_split_bytes=0, peak_reserved_bytes=95, total_bytes=100,
                       peak_allocated_bytes=95)
    verdicts, _ = R.run_rules(facts(busy_ms=95.0, memory=full))
    assert sorted(v.rule for v in verdicts) == ["compute_bound", "memory_full"]


def test_on_the_cpu_gpu_rules_are_skipped_with_a_reason():
    verdicts, skipped = R.run_rules(facts({"input": 20.0}, on_gpu=False))
    assert set(skipped) == set(R.GPU_ONLY) and all("needs a GPU" in why for why in skipped.values())
    assert [v.rule for v in verdicts] == ["input_bound"]


def test_a_sync_inside_the_forward_comes_before_launch_bound_one_outside_does_not():
    """torch.compile(model, mode='reduce-overhead') captures the model: a sync in its forward splits the
    graphs (host_sync first, even under its own threshold); one in the loop (a metric, GradScaler) stays
    outside them and blocks nothing."""
    inside = (("model.py:20 (forward)", "model.py:20 (forward)", 1.0, 1.0),)
    f = facts({"launch": 30.0, "sync": 1.0}, syncs=inside)
    assert R.host_sync(f) is None
    verdicts, _ = R.run_rules(f)
    assert [v.rule for v in verdicts] == ["host_sync", "launch_bound"]
    first, launch = verdicts
    # its share includes the launch gaps it keeps the graphs from (issue 41, item 2); it is expected to save
    # only its own wait
    assert first.share == pytest.approx(0.31) and first.expected_share == pytest.approx(0.01)
    assert "it must go before launch_bound" in first.evidence and "launch_bound's fix can take 30.0 %" in first.evidence
    assert launch.blocked_by == "host_sync" and "out of the model's forward" in launch.fix
    # host_sync over its threshold: its own verdict, not a second one
    verdicts, _ = R.run_rules(facts({"launch": 30.0, "sync": 10.0}, syncs=inside))
    assert [v.rule for v in verdicts] == ["host_sync", "launch_bound"]
    assert "it must go before" not in verdicts[0].evidence
    # a torch.nn module's own sync (via its file) is inside the model too
    nn_sync = (("train.py:9 (step)", "torch/nn/modules/sparse.py:190 (forward)", 1.0, 1.0),)
    assert R.launch_bound(facts({"launch": 30.0, "sync": 1.0}, syncs=nn_sync)).blocked_by == "host_sync"
    # in a torch.compile'd model the sync is a graph break first: compile_graph_breaks (lesson 12), naming
    # the forward's line, before launch_bound, even with little host time between the regions
    compiled = facts({"launch": 30.0, "sync": 1.0}, syncs=inside + (("train.py:30 (step)", "", 1.0, 1.0),),
                     compiled_regions=4.0, between_regions_ms=1.0)
    assert R.compile_graph_breaks(compiled) is None
    verdicts, _ = R.run_rules(compiled)
    assert [v.rule for v in verdicts] == ["compile_graph_breaks", "launch_bound"]
    breaks, launch = verdicts
    assert launch.blocked_by == "compile_graph_breaks" and breaks.lesson == "12"
    assert "model.py:20 (forward)" in breaks.evidence and "train.py:30" not in breaks.evidence
    assert breaks.share == pytest.approx(0.31) and breaks.expected_share == pytest.approx(0.02)   # at most the idle
    assert "must go before launch_bound" in breaks.evidence
    # outside the model: a metric's .item() in the loop, GradScaler's inf check: nothing blocked
    for outside in ((("train.py:20 (step)", "train.py:20 (step)", 1.0, 1.0),),
                    (("t.py:3 (s)", "torch/amp/grad_scaler.py:1 (step)", 1.0, 1.0),)):
        verdicts, _ = R.run_rules(facts({"launch": 30.0, "sync": 1.0}, syncs=outside))
        assert [v.rule for v in verdicts] == ["launch_bound"] and verdicts[0].blocked_by == ""
        assert "outside the model" in verdicts[0].fix


SHAPES = (("train.py:40 (step)", "aten::embedding", ((32, 87), (32, 112), (32, 64)), 5),)


def test_varying_shapes_edge_blocks_the_graphs_and_carries_their_share():
    """Shapes that change from step to step: the launch gaps CUDA graphs would take stay until the step has a
    few shapes, so launch_bound waits behind varying_shapes, whose share and expected are the graphs'."""
    edge = R.LAUNCH_SHARE_MIN * WINDOW
    assert R.varying_shapes(facts({"launch": edge - BELOW}, shape_changes=SHAPES)) is None
    assert R.varying_shapes(facts({"launch": 3 * edge})) is None                          # the same shapes every step
    v = R.varying_shapes(facts({"launch": edge}, shape_changes=SHAPES))
    assert v.rule == "varying_shapes" and v.lesson == "11" and v.share == pytest.approx(0.10)
    assert v.expected_share == pytest.approx(0.10)
    assert "train.py:40 (step) embedding: 32x87, 32x112, 32x64 across 5 steps" in v.evidence
    assert "pad or bucket" in v.fix and "dynamic=True" in v.fix and "mark_dynamic" in v.fix
    # what the graphs leave on the host (the optimizer) is not expected to go, as for launch_bound
    v = R.varying_shapes(facts({"launch": 3 * edge}, shape_changes=SHAPES, optimizer_host_ms=edge))
    assert v.share == pytest.approx(0.30) and v.expected_share == pytest.approx(0.20)
    assert R.varying_shapes(facts({"launch": 2 * edge - BELOW}, shape_changes=SHAPES, optimizer_host_ms=edge)) is None
    # shapes the GPU's values decide (nonzero, masks) are their syncs' evidence; a compiled step's are recompiles'
    assert R.varying_shapes(facts({"launch": 3 * edge}, shape_changes=SHAPES,
                                  data_dependent=(("m.py:9 (forward)", "aten::nonzero", 4.0),))) is None
    assert R.varying_shapes(facts({"launch": 3 * edge}, shape_changes=SHAPES, compiled_regions=1.0)) is None
    verdicts, _ = R.run_rules(facts({"launch": 3 * edge}, shape_changes=SHAPES))
    assert [v.rule for v in verdicts] == ["varying_shapes", "launch_bound"]
    assert verdicts[1].blocked_by == "varying_shapes" and "a few fixed shapes" in verdicts[1].fix
    assert verdicts[0].share == pytest.approx(0.30)                   # not doubled: its share is the graphs' already


def test_graphs_are_blocked_by_a_sync_in_the_forward_a_branch_or_changing_shapes_and_nothing_else():
    base = facts({"launch": 30.0})
    assert R.graphs_blocked_by(base) == ""
    branch = (("model.py:7 (forward)", "model.py:7 (forward)", 0.5, 2.0),)
    assert R.graphs_blocked_by(facts({"launch": 30.0}, syncs=branch,
                                     sync_kinds=(("model.py:7 (forward)", "model.py:7 (forward)", "branch", 2.0),))) \
        == "host_sync"
    assert R.graphs_blocked_by(facts({"launch": 30.0}, syncs=branch, compiled_regions=2.0)) == "compile_graph_breaks"
    assert R.graphs_blocked_by(facts({"launch": 30.0}, shape_changes=SHAPES)) == "varying_shapes"
    assert R.graphs_blocked_by(facts({"launch": 30.0}, shape_changes=SHAPES, compiled_regions=1.0)) == \
        "compile_recompiles"
    # a branch on a GPU value in the loop (a NaN filter) is outside the model's graphs
    loop = (("train.py:50 (step)", "train.py:50 (step)", 0.5, 2.0),)
    assert R.graphs_blocked_by(facts({"launch": 30.0}, syncs=loop)) == ""
    # a compiled step whose shapes change and that recompiled too little to fire: its launch verdict still waits
    verdicts, _ = R.run_rules(facts({"launch": 30.0}, shape_changes=SHAPES, compiled_regions=1.0))
    assert [v.rule for v in verdicts] == ["compile_recompiles", "launch_bound"]
    assert "must settle before launch_bound" in verdicts[0].evidence


def test_host_sync_counts_the_gaps_a_wait_leaves_and_names_what_made_it_wait():
    """The GPU idles while the host is blocked and again while it refills the queue the wait emptied
    ("after_sync"): both are the sync's; each line says what made it wait."""
    row = (("train.py:61 (step)", "train.py:61 (step)", 1.0, 256.0),)
    kinds = (("train.py:61 (step)", "train.py:61 (step)", "branch", 256.0),)
    assert R.host_sync(facts({"sync": 1.0, "after_sync": 4.0 - BELOW}, syncs=row)) is None
    v = R.host_sync(facts({"sync": 1.0, "after_sync": 4.0}, syncs=row, sync_kinds=kinds))
    assert v.share == pytest.approx(0.05) and "refilled the queue" in v.evidence
    assert "[a branch on a GPU value]" in v.evidence
    assert R.launch_bound(facts({"sync": 1.0, "after_sync": 40.0}, syncs=row)) is None     # not the launches'
    shape = (("m.py:9 (forward)", "m.py:9 (forward)", "shape", 9.0),)
    v = R.host_sync(facts({"sync": 6.0}, syncs=(("m.py:9 (forward)", "m.py:9 (forward)", 6.0, 9.0),), sync_kinds=shape))
    assert "fixed shapes" in v.fix and "[an output size the GPU decides" in v.evidence


def test_every_rule_is_listed_ranked_and_every_gpu_only_name_is_a_rule():
    names = [r.__name__ for r in R.RULES]
    assert len(names) == len(set(names)) == 23
    assert set(R.GPU_ONLY) <= set(names)
    notes = {r.name for r in R.TABLE if r.tie is None}                         # a note is no fix: no tie order
    assert notes >= {"compute_bound", "memory_full"} and set(R.FIX_ORDER) == set(names) - notes
    assert len(R.FIX_ORDER) == len(set(R.FIX_ORDER))


def test_every_rule_has_an_edge_test_here():
    source = inspect.getsource(inspect.getmodule(test_every_rule_has_an_edge_test_here))
    untested = [r.__name__ for r in R.RULES if f"R.{r.__qualname__}(" not in source]
    assert not untested, f"rules without a test at their threshold: {untested}"


def test_every_rule_says_what_its_share_is():
    for rule in R.RULES:
        doc = " ".join((inspect.getdoc(rule) or "").split())
        assert "Share:" in doc or "No speed to win" in doc, f"{rule.__name__} does not say what its share is"


def test_every_threshold_has_a_comment_giving_its_reason():
    """A constant's comment is the one above it, or above the block of constants it belongs to."""
    source = inspect.getsource(R).splitlines()
    tree = ast.parse("\n".join(source))
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and \
                node.targets[0].id.endswith(("_MIN", "_MAX")):
            i = node.lineno - 2
            while source[i].split("=")[0].strip().isupper() and "=" in source[i]:
                i -= 1
            assert source[i].strip().startswith("#"), f"{node.targets[0].id} has no comment with its reason"


def test_verdict_bound_expected_and_serialisable():
    v = R.verdict("x", "y", "00", 0.75, "e", "f")
    assert v.bound == pytest.approx(4.0) and v.expected_share == 0.75 and v.expected_gain == pytest.approx(4.0)
    assert R.verdict("x", "y", "00", 1.5, "e", "f").bound == float("inf")
    assert R.verdict("x", "y", "00", -0.5, "e", "f").share == 0
    e = R.verdict("x", "y", "00", 0.5, "e", "f", expected=0.2)
    assert e.expected_share == 0.2 and e.expected_gain == pytest.approx(1.25) and e.gain == pytest.approx(1.25)
    assert R.verdict("x", "y", "00", 0.5, "e", "f", expected=0.9).expected_share == 0.5     # never above the bound
    assert R.verdict("x", "y", "00", 0.5, "e", "f", expected=-1).expected_share == 0.0
    d = json.loads(json.dumps(R.verdict("x", "y", "00", 1.0, "e", "f").to_dict()))
    assert d["bound"] is None and d["expected_gain"] is None and d["gain"] is None and d["expected"] == 1.0
    assert R.verdict("x", "y", "00", 0.5, "e", "f", expected=0.2).to_dict()["expected"] == 0.2

