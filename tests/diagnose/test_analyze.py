"""Facts from hand-built events: windows, busy merging, the host's timeline by cause, the later lessons' patterns,
the slow step's line (kernel classes, their math and GEMMs: test_analyze_kernels.py)."""
import json

import pytest

from gpulab.diagnose.analyze import (
    ATTENTION_MIN_T,
    BATCH_COPY_MIN_BYTES,
    CAUSES,
    CPU_OP_US,
    GLUE_GAP_US,
    OVERLAP_COPY_MIN_BYTES,
    PAGEABLE_MIN_BYTES,
    analyze,
    frame_site,
    host_causes,
    innermost_frames,
    stall_site,
    step_windows,
)
from gpulab.diagnose.events import GPU, OP, PY, RUNTIME, STEP_RANGE, Event

BF16 = ("c10::BFloat16", "c10::BFloat16")
FP32 = ("float", "float")
LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
USER = ("train.py", 12, "step")                       # the user's line a call came from


def step(a=0, b=1000, thread=1):
    return Event(OP, STEP_RANGE, a, b, stream=thread)


def op(name, a, b, thread=1, corr=0, **kw):
    return Event(OP, name, a, b, stream=thread, corr=corr, **kw)


def call(name, a, b, corr=0, op_id=0, thread=1):
    return Event(RUNTIME, name, a, b, stream=thread, corr=corr, op_id=op_id)


def kernel(name, a, b, stream=7, corr=0, op_id=0, op="", nbytes=0):
    return Event(GPU, name, a, b, stream=stream, corr=corr, op_id=op_id, op=op, nbytes=nbytes)


def frame(name, a, b, site=USER, code=(), user=False, thread=1):
    """A Python frame: a call from the user's `site` into `code` (a user's function when `user`)."""
    return Event(PY, name, a, b, stream=thread, site=site, code=code, user=user)


def launched(name, a, b, corr, at=None, thread=1, **kw):
    """An op that queues one kernel: the op, its launch call, the kernel (running right after the call)."""
    at = a + 1 if at is None else at
    return [op(name, a, b, corr=corr, thread=thread, **kw), call("cudaLaunchKernel", at, at + 2, corr=1000 + corr,
                                                                 op_id=corr, thread=thread),
            kernel(f"{name}_kernel", at + 3, at + 5, corr=1000 + corr, op_id=corr)]


def host(events, **kw) -> dict:
    """{cause: ms per step} of the host's time, only the causes with any."""
    return {c: pytest.approx(ms) for c, ms in analyze(events, **kw).host_by_cause.items() if ms > 1e-12}


# -- intervals and windows -------------------------------------------------------------------------
def test_busy_merges_streams():
    f = analyze([step(0, 100), kernel("k1", 10, 30, stream=7), kernel("k2", 20, 40, stream=8)])
    assert f.busy_ms == pytest.approx(0.030) and f.idle_ms == pytest.approx(0.070)
    assert f.window_ms == pytest.approx(0.100) and f.steps == 1


def test_window_extends_to_the_last_kernel_launched_inside_the_step():
    events = [step(0, 50), call("cudaLaunchKernel", 40, 42, corr=1), kernel("k", 45, 120, corr=1),
              call("cudaLaunchKernel", 200, 202, corr=2), kernel("later", 205, 300, corr=2)]
    assert step_windows(events) == [(0, 120)]
    f = analyze(events)
    assert f.window_ms == pytest.approx(0.120) and f.busy_ms == pytest.approx(0.075)


def test_window_extension_without_a_launch_call_uses_the_kernels_start():
    assert step_windows([step(0, 50), kernel("k", 30, 80)]) == [(0, 80)]
    assert step_windows([step(0, 50), kernel("k", 60, 80)]) == [(0, 50)]


def test_per_step_figures_average_over_steps():
    events = [step(0, 100), kernel("k", 0, 50), step(100, 200), kernel("k", 100, 130)]
    f = analyze(events)
    assert f.steps == 2 and f.window_ms == pytest.approx(0.100) and f.busy_ms == pytest.approx(0.040)
    assert sum(f.idle_by_cause.values()) == pytest.approx(f.idle_ms)
    assert sum(f.host_by_cause.values()) == pytest.approx(0.100)


def test_no_step_ranges_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="gpulab.step"):
        analyze([kernel("k", 0, 1)])


# -- the host's timeline by cause ------------------------------------------------------------------
def test_input_is_a_dataloaders_next_or_the_data_range():
    assert host([step(0, 1000), op(LOADER, 0, 400)]) == {"input": 0.4, "other": 0.6}
    assert host([step(0, 1000), op("gpulab.data", 200, 400)]) == {"input": 0.2, "other": 0.8}
    # input comes first: a sync or the allocator inside the loader is the loader's
    inside = [step(0, 1000), op(LOADER, 0, 400), call("cudaStreamSynchronize", 50, 150), call("cudaMalloc", 200, 300)]
    assert host(inside) == {"input": 0.4, "other": 0.6}


def test_idle_by_cause_is_the_gpus_idle_during_each_cause_and_adds_up():
    events = [step(0, 1000), op(LOADER, 0, 400), kernel("k", 400, 600),
              call("cudaStreamSynchronize", 550, 700), kernel("k", 700, 1000)]
    f = analyze(events)
    assert host(events) == {"input": 0.4, "sync": 0.15, "other": 0.45}
    assert f.idle_by_cause["input"] == pytest.approx(0.4) and f.idle_by_cause["sync"] == pytest.approx(0.1)
    assert f.idle_by_cause["other"] == pytest.approx(0.0) and f.idle_ms == pytest.approx(0.5)
    assert sum(f.idle_by_cause.values()) == pytest.approx(f.idle_ms)
    assert f.busy_ms == pytest.approx(0.5) and f.busy_ms + f.idle_ms == pytest.approx(f.window_ms)
    assert f.intervals["host"] == [(0, 400, "input"), (400, 550, "other"), (550, 700, "sync"), (700, 1000, "other")]
    assert f.syncs == (("", "", pytest.approx(0.15), 1.0),)


def test_a_blocking_call_is_a_sync_with_its_line_and_count():
    read = ("torch/_tensor.py", 40, "item")
    events = [step(0, 1000),
              op("aten::item", 200, 400, corr=4, site=USER, via=read),
              call("cudaMemcpyAsync", 205, 210, corr=900, op_id=4),
              kernel("Memcpy DtoH (Device -> Pageable)", 215, 220, corr=900, op_id=4),
              call("cudaStreamSynchronize", 210, 390, op_id=4),
              op("aten::item", 600, 700, corr=5, site=USER, via=read),
              call("cudaMemcpyAsync", 605, 610, corr=901, op_id=5),
              call("cudaStreamSynchronize", 610, 690, op_id=5)]
    f = analyze(events)
    assert f.host_by_cause["sync"] == pytest.approx(0.26)
    assert f.host_by_cause["pageable_copy"] == 0             # an item() reads a number: its copy is no staging
    assert f.syncs == (("train.py:12 (step)", "torch/_tensor.py:40 (item)", pytest.approx(0.26), 2.0),)
    assert f.host_sites["sync"] == (("train.py:12 (step)", "torch/_tensor.py:40 (item)", pytest.approx(0.26)),)
    assert f.sites("sync") == "train.py:12 (step) via torch/_tensor.py:40 (item) (0.26 ms)"
    # the rest of the two ops queues copies: before the first wait that is launching; once a wait has emptied the
    # GPU's queue (its gap began inside the wait), refilling it is the wait's ("after_sync")
    assert f.host_by_cause["launch"] == pytest.approx(0.01)
    assert f.host_by_cause["after_sync"] == pytest.approx(0.03) and f.idle_by_cause["after_sync"] == pytest.approx(0.03)
    assert f.host_sites["after_sync"] == (("train.py:12 (step)", "torch/_tensor.py:40 (item)", pytest.approx(0.03)),)
    assert f.sync_kinds == (("train.py:12 (step)", "torch/_tensor.py:40 (item)", "read", 2.0),)


def test_a_sync_on_autograds_thread_counts_while_the_step_waits():
    events = [step(0, 1000), frame("backward", 200, 600, code=("torch/_tensor.py", 600, "backward")),
              call("cudaLaunchKernel", 250, 260, corr=1, thread=2), kernel("k", 260, 300, corr=1),
              call("cudaStreamSynchronize", 300, 400, thread=2), call("cudaMalloc", 400, 450, thread=2)]
    h = host(events)
    assert h["sync"] == pytest.approx(0.1) and h["allocator"] == pytest.approx(0.05)
    # backward's frame (the framework issuing work) but for the sync and the allocator on autograd's thread; the
    # GPU ran dry inside the wait, so backward's issuing after it refills an emptied queue ("after_sync")
    assert h["launch"] == pytest.approx(0.1) and h["after_sync"] == pytest.approx(0.15) and h["other"] == pytest.approx(0.6)


def test_pageable_copy_includes_its_wait_and_says_where():
    def copy(nbytes):
        return [step(0, 1000), op("aten::copy_", 100, 300, corr=5, site=USER),
                call("cudaMemcpyAsync", 110, 250, corr=900, op_id=5),
                kernel("Memcpy HtoD (Pageable -> Device)", 120, 240, corr=900, op_id=5, nbytes=nbytes),
                call("cudaStreamSynchronize", 250, 300, op_id=5)]
    f = analyze(copy(PAGEABLE_MIN_BYTES))
    assert f.host_by_cause["pageable_copy"] == pytest.approx(0.2) and f.host_by_cause["sync"] == 0
    assert f.pageable_copies == (("train.py:12 (step)", pytest.approx(0.2), PAGEABLE_MIN_BYTES),)
    assert f.pageable_copy_ms == pytest.approx(0.12)
    assert analyze(copy(0)).host_by_cause["pageable_copy"] == pytest.approx(0.2)      # bytes unknown: counted
    # a small copy is a read-back: its wait is the sync, not staging
    small = analyze(copy(PAGEABLE_MIN_BYTES - 1))
    assert small.host_by_cause["pageable_copy"] == 0 and small.host_by_cause["sync"] == pytest.approx(0.05)
    assert small.pageable_copies == ()
    # pinned and copied with non_blocking=True, even a small host-to-device copy stops waiting (pageable_copy's bound)
    assert small.pinnable_sites == f.pinnable_sites == ("train.py:12 (step)",)


def test_the_allocator():
    events = [step(0, 1000), op("aten::empty", 100, 120), call("cudaMalloc", 101, 119), call("cudaFree", 500, 560)]
    h = host(events)
    assert h["allocator"] == pytest.approx(0.018 + 0.06)


def test_the_batch_made_before_its_copy_is_input():
    """The host's time before the step copies its batch to the GPU, queueing nothing, is the batch's making:
    data made in the main thread needs no annotation. A scalar's copy is not the batch's."""
    events = [step(0, 1000),
              frame("make_batch", 0, 300, code=("train.py", 30, "make_batch"), user=True),
              op("aten::copy_", 50, 60, corr=2), call("cudaMemcpyAsync", 52, 55, corr=20, op_id=2),
              kernel("Memcpy HtoD (Pageable -> Device)", 55, 56, corr=20, op_id=2, nbytes=8),   # a learning rate
              *launched("aten::add", 150, 170, corr=3),
              op("aten::copy_", 300, 330, corr=4, site=USER), call("cudaMemcpyAsync", 305, 310, corr=40, op_id=4),
              kernel("Memcpy HtoD (Pinned -> Device)", 310, 320, corr=40, op_id=4, nbytes=BATCH_COPY_MIN_BYTES),
              frame("log", 500, 700, site=("train.py", 14, "step"), code=("train.py", 50, "log"), user=True)]
    f = analyze(events)
    assert f.precopy_ms == pytest.approx(0.305)
    # 0..305 is input but for the two ops that queue GPU work there (50..60, 150..170) and the copy's op
    assert f.host_by_cause["input"] == pytest.approx(0.300 - 0.030)
    assert f.host_by_cause["launch"] == pytest.approx(0.010 + 0.020 + 0.030)
    assert f.host_by_cause["host_code"] == pytest.approx(0.2)          # log() after the copy is the user's code
    assert f.host_by_cause["other"] == pytest.approx(0.17 + 0.3)
    assert f.host_sites["input"][0] == ("train.py:30 (make_batch)", "", pytest.approx(0.27))
    assert f.sites("host_code") == "train.py:50 (log) (0.2 ms)"
    # without the batch's copy the same Python is the user's code, not input
    no_copy = [e for e in events if e.corr not in (4, 40) and e.op_id != 4]
    g = analyze(no_copy)
    assert g.precopy_ms == 0 and g.host_by_cause["input"] == 0
    assert g.host_by_cause["host_code"] == pytest.approx(0.27 + 0.2)


def test_a_batch_prefetched_after_the_forward_is_made_after_the_models_last_launch():
    """nanoGPT's loop copies its next batch after the forward: the forward's products and the host code between
    its launches (a compiled module's wrapper) come before the copy and are not the batch's making; only the
    stretch after the last call that queued work is. Without a matrix product before the copy the stretch runs
    from the step's start (the test above)."""
    forward = [*launched("aten::mm", 20, 40, corr=3), *launched("aten::add", 60, 70, corr=4)]
    events = [step(0, 1000), frame("forward", 10, 200, code=("model.py", 5, "forward"), user=True), *forward,
              frame("get_batch", 200, 300, code=("train.py", 30, "get_batch"), user=True),
              op("aten::copy_", 300, 330, corr=5, site=USER), call("cudaMemcpyAsync", 305, 310, corr=50, op_id=5),
              kernel("Memcpy HtoD (Pinned -> Device)", 310, 320, corr=50, op_id=5, nbytes=BATCH_COPY_MIN_BYTES)]
    assert analyze(events).precopy_ms == pytest.approx((305 - 63) / 1e3)      # the add's launch call ends at 63
    # the same steps with an elementwise kernel where the product was: the stretch runs from the step's start
    plain = [e if "mm" not in e.name else (Event(e.kind, e.name.replace("mm", "mul"), e.start_us, e.end_us,
                                                    stream=e.stream, corr=e.corr, op_id=e.op_id, op=e.op))
             for e in events]
    assert analyze(plain).precopy_ms == pytest.approx(0.305)


def test_a_copy_of_unknown_size_is_the_batchs():
    events = [step(0, 1000), op("aten::copy_", 400, 420, corr=4), call("cudaMemcpyAsync", 401, 405, corr=40, op_id=4),
              kernel("Memcpy HtoD (Pinned -> Device)", 405, 410, corr=40, op_id=4)]
    assert analyze(events).host_by_cause["input"] == pytest.approx(0.4)


def test_launch_is_ops_that_queue_work_pytorchs_python_and_short_gaps():
    assert host([step(0, 100), *launched("aten::add", 0, 100, corr=1)]) == {"launch": 0.1}
    # an op that queues nothing: a view (short) is issuing work, a long one computes on the CPU
    assert host([step(0, 100), op("aten::view", 0, CPU_OP_US - 1)]) == {"launch": 0.1}
    cpu = host([step(0, 100), op("aten::mm", 0, CPU_OP_US)])
    assert cpu == {"host_code": CPU_OP_US / 1e3, "launch": (100 - CPU_OP_US) / 1e3}
    # a stretch the profiler saw nothing in: launch up to GLUE_GAP_US, other beyond
    near = [step(0, 1000), *launched("aten::add", 0, 100, corr=1), *launched("aten::mul", 100 + GLUE_GAP_US, 1000, corr=2)]
    assert host(near) == {"launch": 1.0}
    far = [step(0, 1000), *launched("aten::add", 0, 100, corr=1), *launched("aten::mul", 101 + GLUE_GAP_US, 1000, corr=2)]
    assert host(far) == {"launch": pytest.approx(1.0 - (GLUE_GAP_US + 1) / 1e3),
                         "other": pytest.approx((GLUE_GAP_US + 1) / 1e3)}


def test_the_users_python_is_host_code_unless_a_library_called_it():
    mine = ("train.py", 40, "metrics")
    top = [step(0, 1000), frame("metrics", 200, 700, code=mine, user=True)]
    assert host(top) == {"host_code": 0.5, "other": 0.5}
    # the user's forward, called by model(x): PyTorch's work of issuing the model
    call_ = ("torch/nn/modules/module.py", 1774, "_wrapped_call_impl")
    nested = [step(0, 1000), frame("_wrapped_call_impl", 200, 700, code=call_),
              frame("forward", 250, 650, site=("model.py", 8, "_wrapped_call_impl"), code=("model.py", 5, "forward"),
                    user=True)]
    assert host(nested) == {"launch": 0.5, "other": 0.5}
    # a C call from the user's line that runs no op (numpy, a dict): the user's work, filed under that line
    numpy = [step(0, 1000), frame("astype (numpy.ndarray)", 100, 400, site=("train.py", 22, "step"), user=True)]
    f = analyze(numpy)
    assert f.host_by_cause["host_code"] == pytest.approx(0.3)
    assert f.host_sites["host_code"] == (("train.py:22 (step)", "", pytest.approx(0.3)),)


def test_backward_on_another_thread_counts_as_launch():
    """The main thread waits in backward() (a Python frame into torch); autograd's thread issues the kernels."""
    events = [step(thread=1), frame("backward", 300, 350, code=("torch/_tensor.py", 600, "backward")),
              op("autograd::engine::evaluate_function: MmBackward0", 300, 320, thread=2),
              call("cudaLaunchKernel", 305, 310, corr=1, thread=2), kernel("k", 310, 330, corr=1)]
    assert analyze(events).host_by_cause["launch"] == pytest.approx(0.05)
    assert analyze(events).host_by_cause["other"] == pytest.approx(0.95)


def test_the_host_is_read_inside_the_steps_own_ranges():
    """diagnose's synchronize after the last step, while the GPU finishes, is not the step's; nor is the
    loop between two steps."""
    events = [step(0, 100), call("cudaLaunchKernel", 50, 55, corr=1), kernel("k", 60, 500, corr=1),
              call("cudaDeviceSynchronize", 100, 500)]
    f = analyze(events)
    assert f.window_ms == pytest.approx(0.5) and f.host_by_cause["sync"] == 0
    assert sum(f.host_by_cause.values()) == pytest.approx(0.1)
    assert f.idle_ms == pytest.approx(0.06) and f.idle_by_cause["launch"] == pytest.approx(0.06)
    # the GPU idle outside the host's ranges (between two kernels after the step returned) is "other"
    tail = analyze([step(0, 100), *launched("aten::mm", 0, 30, corr=1, at=10),
                    call("cudaLaunchKernel", 90, 92, corr=2), kernel("later", 300, 400, corr=2)])
    assert tail.window_ms == pytest.approx(0.4) and tail.idle_ms == pytest.approx(0.4 - 0.002 - 0.1)
    assert tail.host_by_cause["launch"] == pytest.approx(0.1)           # the whole step range
    assert tail.idle_by_cause["launch"] == pytest.approx(0.098)         # the GPU idle during it
    assert tail.idle_by_cause["other"] == pytest.approx(0.2)            # 100..300: no host range
    assert sum(tail.idle_by_cause.values()) == pytest.approx(tail.idle_ms)
    two = analyze([step(0, 100), step(300, 400), call("cudaStreamSynchronize", 150, 250)])
    assert two.steps == 2 and two.host_by_cause["sync"] == 0
    assert sum(two.host_by_cause.values()) == pytest.approx(0.1)        # per step


def test_threads_that_neither_step_nor_launch_are_ignored():
    """A pin-memory thread's ops do not make the step's host time "launch"."""
    events = [step(0, 1000), op("aten::pin_memory", 0, 1000, thread=9)]
    f = analyze(events)
    assert f.host_by_cause["other"] == pytest.approx(1.0) and f.idle_by_cause["other"] == pytest.approx(1.0)


def test_host_causes_directly_on_one_span():
    events = [step(0, 1000), op(LOADER, 0, 200), call("cudaStreamSynchronize", 200, 300),
              call("cudaMalloc", 300, 350), frame("log", 400, 850, code=("train.py", 50, "log"), user=True)]
    t = host_causes(events, [(0, 1000)], [(0, 1000)], [])
    assert t.by_cause["input"] == [(0, 200)] and t.by_cause["sync"] == [(200, 300)]
    assert t.by_cause["allocator"] == [(300, 350)] and t.by_cause["launch"] == [(350, 400)]
    assert t.by_cause["host_code"] == [(400, 850)] and t.by_cause["other"] == [(850, 1000)]
    assert t.sites["host_code"] == {("train.py:50 (log)", ""): 450} and t.precopy_us == 0
    assert set(t.by_cause) == set(CAUSES)
    # only the span given is cut
    part = host_causes(events, [(0, 1000)], [(250, 320)], [])
    assert part.by_cause["sync"] == [(250, 300)] and part.by_cause["allocator"] == [(300, 320)]


def test_on_the_cpu_busy_is_aten_ops_outside_data_loading_and_ops_are_no_cause():
    events = [step(0, 100), op("aten::mm", 10, 30), op(LOADER, 40, 90), op("aten::stack", 50, 60)]
    f = analyze(events, on_gpu=False)
    assert f.busy_ms == pytest.approx(0.02) and f.idle_ms == pytest.approx(0.08)
    assert f.host_by_cause["input"] == pytest.approx(0.05)        # the loader, its own ops included
    assert f.host_by_cause["launch"] == pytest.approx(0.03)       # the Python around aten::mm
    assert f.host_by_cause["host_code"] == 0                      # aten::mm is the device's work here
    assert sum(f.idle_by_cause.values()) == pytest.approx(f.idle_ms)


# -- Facts' reading of the host --------------------------------------------------------------------
def test_idle_is_host_time_scaled_and_capped_by_the_gpus_idle():
    events = [step(0, 1000), op(LOADER, 0, 600), kernel("k", 600, 1000)]
    f = analyze(events, step_ms=0.8)
    assert f.host_scale == pytest.approx(0.8) and f.base_idle_ms == pytest.approx(0.4)
    assert f.host("input") == pytest.approx(0.48)
    assert f.idle("input") == pytest.approx(0.4)                   # no more than the GPU's idle
    assert f.idle_scale == pytest.approx(0.4 / 0.6)
    cpu = analyze(events, on_gpu=False, step_ms=0.8)
    assert cpu.idle("input") == pytest.approx(cpu.host("input"))
    d = f.to_dict()
    assert d["host_scale"] == pytest.approx(0.8) and d["base_idle_ms"] == pytest.approx(0.4) and "intervals" not in d


def test_sites_lists_the_largest_first():
    events = [step(0, 1000), frame("a", 0, 100, code=("t.py", 1, "a"), user=True),
              frame("b", 200, 500, code=("t.py", 5, "b"), user=True), frame("c", 600, 800, code=("t.py", 9, "c"), user=True)]
    f = analyze(events)
    assert f.sites("host_code") == "t.py:5 (b) (0.3 ms), t.py:9 (c) (0.2 ms), t.py:1 (a) (0.1 ms)"
    assert f.sites("host_code", top=1) == "t.py:5 (b) (0.3 ms)" and f.sites("sync") == ""


def test_innermost_frames_and_their_sites():
    outer = frame("outer", 0, 100, code=("t.py", 1, "outer"), user=True)
    lib = frame("lib", 10, 50, site=("t.py", 3, "outer"), code=("torch/x.py", 1, "lib"))
    inner = frame("cb", 20, 30, site=("t.py", 3, "outer"), code=("t.py", 7, "cb"), user=True)
    cut = innermost_frames([inner, lib, outer])
    assert [(a, b, f.name, under) for a, b, f, under in cut] == [
        (0, 10, "outer", False), (10, 20, "lib", False), (20, 30, "cb", True), (30, 50, "lib", False),
        (50, 100, "outer", False)]
    assert frame_site(outer) == ("t.py", 1, "outer") and frame_site(lib) == ("t.py", 3, "outer")


# -- the later lessons' patterns -------------------------------------------------------------------
def test_layout_transposes():
    events = [step(0, 1000), kernel("void cudnn::ops::nchwToNhwcKernel<float>", 0, 100),
              kernel("sm80_xmma_fprop_implicit_gemm_bf16", 100, 400),
              kernel("void cudnn::ops::nhwcToNchwKernel<float>", 400, 450)]
    assert analyze(events).transpose_ms == pytest.approx(0.15)


def attention(t, dtype=BF16):
    q, k = (8, t, 64), (8, 64, t)
    scores = (8, t, t)
    return [step(0, 1000),
            op("aten::bmm", 0, 10, corr=1, shapes=(q, k), dtypes=dtype), kernel("nvjet_qk", 10, 110, op_id=1),
            op("aten::_softmax", 110, 120, corr=2, shapes=(scores, ()), dtypes=dtype),
            kernel("softmax_warp_forward", 120, 170, op_id=2),
            op("aten::bmm", 170, 180, corr=3, shapes=(scores, (8, t, 64)), dtypes=dtype),
            kernel("nvjet_pv", 180, 280, op_id=3),
            op("aten::add", 280, 290, corr=4, shapes=((8, t, 64), (8, t, 64)), dtypes=dtype),
            kernel("elementwise_add", 290, 300, op_id=4)]


def test_attention_by_hand_is_the_work_on_the_score_matrix():
    f = analyze(attention(ATTENTION_MIN_T))
    assert f.attention_math_ms == pytest.approx(0.25) and f.attention_shape == (ATTENTION_MIN_T, ATTENTION_MIN_T)
    assert f.attention_math_flops == 2 * (2 * 8 * ATTENTION_MIN_T * ATTENTION_MIN_T * 64)
    assert [g.attention for g in f.gemms] == [True, True]       # its products, marked (misaligned_gemm leaves them)
    small = analyze(attention(ATTENTION_MIN_T - 1))
    assert small.attention_math_flops == 0 and small.attention_shape == ()     # the products on T < 128 are not
    assert not any(g.attention for g in small.gemms)


def test_attention_by_hand_counts_the_copies_of_its_heads():
    """q @ k.transpose(-2, -1) on heads split by a view and a transpose copies q and k into contiguous batches: the
    fused kernel reads them in place, so those copies are the attention's; a copy of the (B, T, C) activations is
    not, nor a copy of a (B, H, T, D) tensor where no (B, H, T, T) scores were seen."""
    t, heads = ATTENTION_MIN_T, (8, 12)
    scores = (*heads, t, t)

    def events(copied):
        return [step(0, 1000),
                op("aten::copy_", 0, 5, corr=1, shapes=(copied, copied), dtypes=BF16), kernel("copy_q", 5, 45, op_id=1),
                op("aten::bmm", 50, 55, corr=2, shapes=((96, t, 64), (96, 64, t)), dtypes=BF16),
                kernel("nvjet_qk", 55, 155, op_id=2),
                op("aten::_softmax", 160, 165, corr=3, shapes=(scores, ()), dtypes=BF16),
                kernel("softmax_warp_forward", 165, 215, op_id=3)]
    assert analyze(events((*heads, t, 64))).attention_math_ms == pytest.approx(0.19)        # q's copy, scores, softmax
    assert analyze(events((*heads, 64, t))).attention_math_ms == pytest.approx(0.19)        # k transposed
    assert analyze(events((8, t, 768, 1))).attention_math_ms == pytest.approx(0.15)         # not a head: not counted
    assert analyze(events((8, 6, t, 64))).attention_math_ms == pytest.approx(0.15)          # other heads than the scores'
    flagged = events((*heads, t, 64))                                         # copy_(dst, src, non_blocking)
    flagged[1] = op("aten::copy_", 0, 5, corr=1, shapes=((*heads, t, 64),) * 2 + ((),), dtypes=BF16 + ("Scalar",))
    assert analyze(flagged).attention_math_ms == pytest.approx(0.19)
    cast = events((*heads, t, 64))
    cast[1] = op("aten::copy_", 0, 5, corr=1, shapes=((*heads, t, 64),) * 2, dtypes=("float", "c10::BFloat16"))
    assert analyze(cast).attention_math_ms == pytest.approx(0.15)          # a cast: SDPA under autocast casts too


def test_attention_by_hand_counts_the_gradient_of_k_and_not_a_square_weight():
    """The backward's (D x T) @ (T x T) product, batched over the heads, is attention's; a linear layer's T x T
    weight, (M x T) @ (T x T) unbatched, is not."""
    t = ATTENTION_MIN_T
    base = attention(t)
    grad_k = base + [op("aten::bmm", 300, 310, corr=5, shapes=((8, 64, t), (8, t, t)), dtypes=BF16),
                     kernel("nvjet_dk", 310, 360, op_id=5)]
    assert analyze(grad_k).attention_math_ms == pytest.approx(0.30)
    linear = base + [op("aten::mm", 300, 310, corr=5, shapes=((4096, t), (t, t)), dtypes=BF16),
                     kernel("nvjet_linear", 310, 360, op_id=5)]
    assert analyze(linear).attention_math_ms == pytest.approx(0.25)


def test_a_softmax_that_is_not_over_attention_scores_is_not_attention():
    small = analyze(attention(ATTENTION_MIN_T - 1))                 # scores under ATTENTION_MIN_T: no pattern
    assert small.attention_math_ms == 0
    # a classifier's softmax over (batch, classes): no (T, T) scores at all
    logits = [step(0, 1000), op("aten::_softmax", 0, 10, corr=1, shapes=((64, 1000), ()), dtypes=FP32),
              kernel("softmax_warp_forward", 10, 500, op_id=1)]
    assert analyze(logits).attention_math_ms == 0


def test_the_optimizer_and_grad_scalers_work():
    scaler_via = ("torch/amp/grad_scaler.py", 290, "_unscale_grads_")
    events = [step(0, 1000),
              op("Optimizer.step#AdamW.step", 500, 800),
              *launched("aten::_foreach_add_", 510, 600, corr=1), *launched("aten::_foreach_mul_", 600, 700, corr=2),
              op("aten::_amp_foreach_non_finite_check_and_unscale_", 300, 400, corr=5, via=scaler_via),
              call("cudaLaunchKernel", 310, 312, corr=1005, op_id=5), kernel("unscale", 320, 350, corr=1005, op_id=5)]
    f = analyze(events)
    assert f.optimizer_name == "AdamW" and f.optimizer_fused is False and f.optimizer_kernels == 2
    assert f.optimizer_host_ms == pytest.approx(0.3) and f.optimizer_gpu_ms == pytest.approx(0.004)
    assert f.scaler_host_ms == pytest.approx(0.1) and f.scaler_gpu_ms == pytest.approx(0.03)
    fused = [step(0, 1000), op("Optimizer.step#AdamW.step", 500, 800),
             op("aten::_fused_adamw_", 510, 600, corr=1), call("cudaLaunchKernel", 511, 513, corr=1001, op_id=1),
             kernel("void at::native::fused_adamw_kernel", 520, 600, corr=1001, op_id=1)]
    assert analyze(fused).optimizer_fused is True
    assert analyze([step(0, 1000)]).optimizer_fused is None


def test_copies_not_overlapped():
    def copy(name, a, b, nbytes):
        return kernel(name, a, b, nbytes=nbytes)
    events = [step(0, 1000), copy("Memcpy HtoD (Pinned -> Device)", 0, 100, OVERLAP_COPY_MIN_BYTES),
              copy("Memcpy HtoD (Pinned -> Device)", 100, 200, OVERLAP_COPY_MIN_BYTES - 1),    # small
              copy("Memcpy HtoD (Pageable -> Device)", 200, 300, 2 * OVERLAP_COPY_MIN_BYTES),  # its own rule
              copy("Memcpy DtoH (Device -> Pinned)", 300, 500, 0),                               # size unknown
              kernel("gemm", 400, 600)]
    assert analyze(events).copy_exposed_ms == pytest.approx(0.1 + 0.1)


def test_ddp_micro_batches_and_communication_before_the_last_one():
    events = [step(0, 1000), op("DistributedDataParallel.forward", 0, 100), op("DistributedDataParallel.forward", 500, 600),
              call("ncclKernelLaunch", 200, 210, corr=1), kernel("ncclDevKernel_AllReduce", 210, 300, corr=1, stream=20),
              call("ncclKernelLaunch", 700, 710, corr=2), kernel("ncclDevKernel_AllReduce", 710, 800, corr=2, stream=20)]
    f = analyze(events)
    assert f.ddp_forwards == 2 and f.comm_early_ms == pytest.approx(0.09)


def test_data_parallel_and_compiled_regions():
    dp = ("/venv/lib/python3.11/site-packages/torch/nn/parallel/data_parallel.py", 170, "forward")
    events = [step(0, 1000), frame("forward", 0, 300, code=dp),
              op("Torch-Compiled Region: 0/0", 400, 500), op("Torch-Compiled Region: 1/0", 650, 800)]
    f = analyze(events)
    assert f.data_parallel_ms == pytest.approx(0.3)
    assert f.compiled_regions == 2 and f.between_regions_ms == pytest.approx(0.15)


def test_compiled_launch_time_runs_from_a_regions_first_launch_to_its_last():
    """What a replayed graph takes off the host: inside each compiled region (and compiled backward, on its
    own thread) from its first queueing call to its last one's end; guards before and wrappers after stay."""
    events = [step(0, 1000),
              op("Torch-Compiled Region: 0/0", 100, 400),
              call("cudaLaunchKernel", 150, 160, corr=1), call("cudaLaunchKernel", 250, 260), call("cudaLaunchKernel", 300, 310, corr=2),
              kernel("triton_a", 170, 200, corr=1), kernel("triton_b", 320, 330, corr=2),   # queued in the stretch
              call("cudaLaunchKernel", 450, 460, corr=3), kernel("eager", 470, 540, corr=3),  # outside every region
              op("CompiledFunctionBackward", 500, 900, thread=2, corr=11),
              call("cudaLaunchKernel", 600, 610, thread=2), call("cudaLaunchKernel", 700, 720, thread=2),
              call("cudaLaunchKernel", 650, 660, thread=1),                         # another thread's launch
              op("Torch-Compiled Region: 1/0", 920, 990)]                           # a region that launched nothing
    f = analyze(events)
    assert f.compiled_host_ms == pytest.approx((300 + 400 + 70) / 1e3)
    assert f.compiled_launch_ms == pytest.approx((160 + 120) / 1e3)
    assert f.compiled_launch_busy_ms == pytest.approx((30 + 10) / 1e3)   # the kernels a replayed graph still runs


def test_data_parallel_is_found_in_a_real_profile():
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from gpulab.diagnose.events import from_profiler

    model = torch.nn.DataParallel(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()))
    x = torch.randn(32, 64)
    model(x)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        for _ in range(2):
            with record_function(STEP_RANGE):
                model(x).sum().backward()
    assert analyze(from_profiler(prof), on_gpu=False).data_parallel_ms > 0


# -- the slow step's line ----------------------------------------------------------------------------
def test_stall_site_is_the_line_whose_time_grew_most():
    log = ("train.py", 40, "log")
    typical = [frame("log", 0, 100, code=log, user=True), frame("step_fn", 200, 1200, code=("train.py", 5, "f"), user=True)]
    slow = [frame("log", 0, 5100, code=log, user=True), frame("step_fn", 5200, 6300, code=("train.py", 5, "f"), user=True)]
    assert stall_site(typical, slow) == ("train.py:40 (log)", pytest.approx(5.0))
    assert stall_site(typical, typical) == ("", 0.0)


# -- CPU mode, MFU, JSON ---------------------------------------------------------------------------
def test_tflops_mfu_against_the_datasheet_and_the_fraction_of_measured_peak():
    """One name per ratio: MFU divides by the datasheet's peak (PaLM's definition), the fraction of measured peak
    by notebook 00's measured one."""
    f = analyze([step(0, 100)], step_ms=10.0, flops_per_step=1e12, peak_tflops=400.0, peak_source="test",
                kernel_ceiling_tflops=500.0)
    assert f.tflops == pytest.approx(100.0) and f.mfu == pytest.approx(0.2)
    assert f.measured_peak_fraction == pytest.approx(0.25)
    assert f.to_dict()["mfu"] == pytest.approx(0.2) and f.to_dict()["measured_peak_fraction"] == pytest.approx(0.25)
    no_sheet = analyze([step(0, 100)], step_ms=10.0, flops_per_step=1e12, peak_tflops=400.0)
    assert no_sheet.mfu is None and no_sheet.measured_peak_fraction == pytest.approx(0.25)
    assert analyze([step(0, 100)], step_ms=10.0, flops_per_step=1e12).measured_peak_fraction is None
    assert analyze([step(0, 100)], peak_tflops=400.0).tflops is None


def test_facts_are_json_serialisable():
    events = [step(0, 100), op("aten::mm", 0, 10, corr=10, shapes=((8, 8), (8, 8)), dtypes=BF16),
              kernel("nvjet", 10, 20, op_id=10), frame("f", 20, 90, code=("t.py", 1, "f"), user=True)]
    d = json.loads(json.dumps(analyze(events, step_ms=1.0, flops_per_step=1.0, peak_tflops=1.0).to_dict()))
    assert d["host_by_cause"]["host_code"] == pytest.approx(0.07) and d["gemms"][0]["math"] == "bf16"


def test_changes_lists_every_key_largest_change_first():
    from gpulab.diagnose.analyze import changes

    got = changes({"copy": 2.0, "gemm": 5.0}, {"gemm": 5.5, "comm": 1.0})
    assert got == [("copy", -2.0), ("comm", 1.0), ("gemm", 0.5)]


# -- on a GPU (skipped here): classes and causes from real profiles --------------------------------
def gpu_step(dtype, sync_every_step=False, n=1024, batch=256):
    import torch

    device = torch.device("cuda")
    model = torch.nn.Sequential(*[torch.nn.Linear(n, n) for _ in range(4)]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, n, device=device)

    def step():
        with torch.amp.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if sync_every_step:
            loss.item()
    return step


@pytest.mark.gpu
def test_on_a_gpu_16_bit_gemms_use_tensor_cores_and_fp32_without_tf32_does_not():
    import torch

    from gpulab.diagnose import diagnose
    from gpulab.models.precision import fp32_math

    half = torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    d = diagnose(gpu_step(half), warmup=2, steps=3, flops_per_step=1.0, peak_tflops=1.0, window_s=0.2, confirm=False)
    assert d.busy_by_class["gemm_tensor_core"] > 0 and d.busy_by_class["gemm_no_tensor_core"] == 0
    assert not [g for g in d.facts.gemms if g.dtype == ""], "GEMMs whose op was not found"
    with fp32_math("ieee"):      # large enough that the fp32 GEMMs are most of the step, not the launches
        d = diagnose(gpu_step(None, n=4096, batch=2048), warmup=2, steps=3, flops_per_step=1.0, peak_tflops=1.0,
                     window_s=0.2, confirm=False)
    assert d.busy_by_class["gemm_no_tensor_core"] > d.busy_by_class["gemm_tensor_core"]
    assert {g.math for g in d.facts.gemms} == {"fp32"}
    assert any(v.rule == "fp32_matmuls" for v in d.verdicts)


@pytest.mark.gpu
def test_on_a_gpu_item_every_step_is_a_sync_on_the_host():
    from gpulab.diagnose import diagnose

    d = diagnose(gpu_step(None, sync_every_step=True, n=256), warmup=2, steps=5, flops_per_step=1.0, window_s=0.2,
                 confirm=False)
    assert d.facts.host_by_cause["sync"] > 0, d.report()
    assert any("test_analyze.py" in site for site, *_ in d.facts.syncs), d.facts.syncs
    assert d.busy_ms + d.idle_ms == pytest.approx(d.profiled_step_ms)


def test_a_step_run_by_the_harness_is_not_inside_a_library_whatever_runs_the_harness():
    """The user's Python inside `diagnose()` is the user's own work even when a library (pytest, ipykernel) called
    the cell or test that called `diagnose()`: the harness frame starts afresh. Without that, the 3 ms of the user's
    own Python a step of tests/diagnose/test_diagnose_cpu.py spends was counted as 'launch' (2026-12-04)."""
    from gpulab.diagnose.analyze import innermost_frames
    from gpulab.diagnose.events import PY, Event
    lib = Event(PY, "runner", 0, 100, code=("/x/site-packages/_pytest/runner.py", 1, "call"), user=False)
    test = Event(PY, "test", 1, 99, code=("/home/u/test_mine.py", 1, "test"), user=True)
    harness = Event(PY, "diagnose", 2, 98, code=("/repo/gpulab/diagnose/core.py", 1, "diagnose"), user=False)
    mine = Event(PY, "bookkeeping", 10, 90, code=("/home/u/test_mine.py", 5, "bookkeeping"), user=True)
    libcall = Event(PY, "forward", 20, 30, code=("/x/site-packages/torch/nn/modules/module.py", 1, "forward"), user=False)
    inner = Event(PY, "my_forward", 21, 29, code=("/home/u/test_mine.py", 9, "forward"), user=True)
    under = {f.name: u for _, _, f, u in innermost_frames([lib, test, harness, mine, libcall, inner])}
    assert under["bookkeeping"] is False            # the harness's child: the user's own
    assert under["my_forward"] is True              # called by a library (model(x) -> forward): issuing its work
