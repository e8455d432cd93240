"""The event model and the profiler parser: fake kineto-like records for GPU work (this machine has no
GPU), and a real CPU profile."""
import os
import sys
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from gpulab.diagnose.events import (
    FRAME_MIN_US,
    GPU,
    OP,
    PY,
    PY_FRAME,
    RUNTIME,
    STEP_RANGE,
    Event,
    Record,
    activity_name,
    c_call_name,
    fmt_site,
    from_profiler,
    is_user_file,
    parse,
    record_kind,
    records_from_profiler,
    step_ranges,
    tree_facts,
)

T0 = 1_000_000_000      # a trace start in ns


def rec(name, activity, start_us, end_us, device="cpu", **kw):
    return Record(name=name, device_type=device, activity=activity, start_ns=T0 + int(start_us * 1e3),
                  end_ns=T0 + int(end_us * 1e3), **kw)


def fake_trace(kernel_link=10, call_link=10):
    """One step: aten::linear > aten::addmm (corr 10) launches a GEMM through cudaLaunchKernel (CUPTI
    correlation 500) on stream 7, plus what the parser must drop."""
    return [
        rec(STEP_RANGE, "user_annotation", 0, 100, thread=1, correlation_id=1),
        rec("aten::linear", "cpu_op", 5, 60, thread=1, correlation_id=9),
        rec("aten::addmm", "cpu_op", 10, 50, thread=1, correlation_id=10, shapes=((128,), (64, 32), (32, 128)),
            dtypes=("c10::BFloat16",) * 3, flops=2 * 64 * 32 * 128),
        rec("cudaLaunchKernel", "cuda_runtime", 20, 30, thread=1, correlation_id=500, linked_correlation_id=call_link),
        rec("nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NNT", "kernel", 40, 90, device="cuda", resource=7,
            correlation_id=500, linked_correlation_id=kernel_link),
        rec(STEP_RANGE, "gpu_user_annotation", 40, 90, device="cuda", resource=7),    # not work
        rec("Stream Sync", "cuda_sync", 90, 95, device="cuda", resource=7),            # not work
        rec("[memory]", "cpu_instant_event", 12, 12, thread=1),
        rec("train.py(12): step", "python_function", 0, 100, thread=1),
    ]


def by_kind(events, kind):
    return [e for e in events if e.kind == kind]


def test_parser_links_a_kernel_to_its_launch_call_and_op():
    events = parse(fake_trace(), T0)
    assert [e.kind for e in events].count(GPU) == 1
    (k,) = by_kind(events, GPU)
    (call,) = by_kind(events, RUNTIME)
    assert k.op == "aten::addmm" and k.op_id == 10 and k.stream == 7 and k.corr == call.corr == 500
    assert (k.start_us, k.end_us) == (40.0, 90.0)
    assert call.op == "aten::addmm" and call.stream == 1
    addmm = next(e for e in events if e.name == "aten::addmm")
    assert addmm.shapes == ((128,), (64, 32), (32, 128)) and addmm.dtypes[0] == "c10::BFloat16"
    assert addmm.flops == 2 * 64 * 32 * 128 and addmm.corr == 10
    assert {e.name for e in by_kind(events, OP)} == {STEP_RANGE, "aten::linear", "aten::addmm"}


def test_kernel_without_a_link_takes_its_launch_calls_op():
    (k,) = by_kind(parse(fake_trace(kernel_link=0), T0), GPU)
    assert k.op == "aten::addmm" and k.op_id == 10


def test_without_any_link_the_innermost_op_around_the_launch_call_is_used():
    (k,) = by_kind(parse(fake_trace(kernel_link=0, call_link=0), T0), GPU)
    assert k.op == "aten::addmm"          # not the enclosing aten::linear, nor the step range


def test_unknown_launcher_stays_empty():
    records = [rec(STEP_RANGE, "user_annotation", 0, 100, thread=1, correlation_id=1),
               rec("some_kernel", "kernel", 10, 20, device="cuda", resource=7, correlation_id=77)]
    (k,) = by_kind(parse(records), GPU)
    assert k.op == "" and k.op_id == 0


def test_times_count_from_the_first_record_without_a_trace_start():
    events = parse(fake_trace())
    assert min(e.start_us for e in events) == 0.0


def test_without_activity_types_names_decide():
    records = [rec(STEP_RANGE, "", 0, 100, thread=1, correlation_id=1),
               rec("aten::mm", "", 10, 50, thread=1, correlation_id=10),
               rec("cudaLaunchKernel", "", 20, 30, thread=1, correlation_id=5, linked_correlation_id=10),
               rec("cuLaunchKernel", "", 31, 33, thread=1, correlation_id=6, linked_correlation_id=10),
               rec("ampere_sgemm_128x64_nn", "", 40, 60, device="cuda", resource=7, correlation_id=5),
               rec(STEP_RANGE, "", 40, 60, device="cuda", resource=7),
               rec("## forward ##", "", 40, 60, device="cuda", resource=7, user_annotation=True),
               rec("Stream Sync", "", 60, 61, device="cuda", resource=7, correlation_id=8),
               rec("[memory]", "", 12, 12, thread=1),
               rec("Buffer Flush", "", 12, 14, thread=1)]
    kinds = sorted((e.kind, e.name) for e in parse(records))
    assert kinds == [(GPU, "ampere_sgemm_128x64_nn"), (OP, "aten::mm"), (OP, STEP_RANGE),
                     (RUNTIME, "cuLaunchKernel"), (RUNTIME, "cudaLaunchKernel")]


def test_without_activity_types_a_kernel_named_like_a_host_range_is_still_work():
    """inductor wraps each Triton launch in a host range named after its kernel: the kernel, launched by a
    call with its correlation id, is work; a device copy of a range (no launch call has its id) is not."""
    name = "triton_poi_fused_gelu_8"
    records = [rec(STEP_RANGE, "", 0, 100, thread=1, correlation_id=1),
               rec(name, "", 10, 40, thread=1, correlation_id=10),                     # inductor's range
               rec("cuLaunchKernel", "", 20, 30, thread=1, correlation_id=5, linked_correlation_id=10),
               rec(name, "", 40, 60, device="cuda", resource=7, correlation_id=5),    # the kernel
               rec(name, "", 40, 60, device="cuda", resource=7, correlation_id=11)]   # a range's device copy
    gpu = by_kind(parse(records), GPU)
    assert [(e.name, e.corr) for e in gpu] == [(name, 5)]


@pytest.mark.parametrize("value, name", [(5, "kernel"), (0, "cpu_op"), (7, "cuda_runtime"), ("kernel", "kernel"),
                                         ("ActivityType.CONCURRENT_KERNEL", "kernel"), (None, ""), (99, "")])
def test_activity_names(value, name):
    assert activity_name(value) == name


def test_record_kinds():
    assert record_kind(rec("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 0, 1, device="cuda")) == GPU
    assert record_kind(rec("Memset (Device)", "gpu_memset", 0, 1, device="cuda")) == GPU
    assert record_kind(rec("cudaStreamSynchronize", "cuda_runtime", 0, 1)) == RUNTIME
    assert record_kind(rec("cuMemCreate", "cuda_driver", 0, 1)) == RUNTIME
    assert record_kind(rec("gpulab.data", "user_annotation", 0, 1)) == OP
    assert record_kind(rec("x", "overhead", 0, 1)) is None


def test_memcpy_bytes_from_metadata():
    records = [rec("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", 0, 5, device="cuda", metadata='"bytes": 4096'),
               rec("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", 5, 6, device="cuda", metadata="not json")]
    assert [e.nbytes for e in parse(records)] == [4096, 0]


def copy_trace(name="Memcpy HtoD (Pageable -> Device)", shapes=((64, 256), (64, 256)), dtypes=("float", "float"), **kw):
    """aten::copy_ (corr 10) launching a copy through cudaMemcpyAsync (CUPTI correlation 500)."""
    return [rec(STEP_RANGE, "user_annotation", 0, 100, thread=1, correlation_id=1),
            rec("aten::copy_", "cpu_op", 10, 50, thread=1, correlation_id=10, shapes=shapes, dtypes=dtypes),
            rec("cudaMemcpyAsync", "cuda_runtime", 20, 30, thread=1, correlation_id=500, linked_correlation_id=10),
            rec(name, "gpu_memcpy" if name.startswith("Memcpy") else "kernel", 40, 90, device="cuda", resource=7,
                correlation_id=500, linked_correlation_id=10, **kw)]


@pytest.mark.parametrize("shapes, dtypes, nbytes", [
    (((64, 256), (64, 256)), ("float", "float"), 64 * 256 * 4),
    (((64, 256),), ("c10::BFloat16",), 64 * 256 * 2),
    (((), (10,)), ("", "long int"), 10 * 8),              # the first input with a tensor's dtype
    (((),), ("double",), 8),                              # a 0-d tensor: one element
    ((), (), 0),                                          # nothing recorded: unknown
])
def test_copy_bytes_from_the_ops_shapes_where_the_trace_does_not_say(shapes, dtypes, nbytes):
    (copy,) = by_kind(parse(copy_trace(shapes=shapes, dtypes=dtypes), T0), GPU)
    assert copy.nbytes == nbytes and copy.op == "aten::copy_"


def test_copy_bytes_the_traces_own_figures_come_first():
    (copy,) = by_kind(parse(copy_trace(nbytes=123, metadata='"bytes": 4096'), T0), GPU)
    assert copy.nbytes == 123
    (copy,) = by_kind(parse(copy_trace(metadata='"bytes": 4096'), T0), GPU)
    assert copy.nbytes == 4096
    (kernel,) = by_kind(parse(copy_trace(name="vectorized_elementwise_kernel"), T0), GPU)
    assert kernel.nbytes == 0                              # a kernel of a copy op is no memcpy


def test_python_frames_parse_into_py_events():
    site, code = ("train.py", 12, "step"), ("train.py", 30, "make_batch")
    records = [rec(STEP_RANGE, "user_annotation", 0, 100, thread=1, correlation_id=1),
               rec("make_batch", PY_FRAME, 5, 60, thread=1, site=site, code=code, user=True)]
    assert record_kind(records[1]) == PY
    (f,) = by_kind(parse(records, T0), PY)
    assert (f.name, f.start_us, f.end_us, f.stream, f.site, f.code, f.user) == \
        ("make_batch", 5.0, 60.0, 1, site, code, True)


def test_event_refuses_bad_input():
    with pytest.raises(ValueError, match="kind must be one of"):
        Event("kernel", "x", 0, 1)
    with pytest.raises(ValueError, match="ends"):
        Event(GPU, "x", 2, 1)
    assert Event(GPU, "x", 1, 3).dur_us == 2


def test_step_ranges_in_order():
    events = [Event(OP, STEP_RANGE, 50, 90), Event(OP, STEP_RANGE, 0, 40), Event(OP, "aten::mm", 1, 2)]
    assert step_ranges(events) == [(0, 40), (50, 90)]


def test_records_from_an_unfinished_or_wrong_object_say_why():
    with pytest.raises(ValueError, match="finished"):
        records_from_profiler(object())


def cpu_profile():
    lin = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True, with_flops=True) as prof:
        for _ in range(2):
            with record_function(STEP_RANGE):
                lin(x).sum().backward()
    return prof


def test_a_real_cpu_profile():
    events = from_profiler(cpu_profile())
    assert len(step_ranges(events)) == 2
    assert not by_kind(events, GPU)
    addmm = [e for e in events if e.name == "aten::addmm"]
    assert addmm and addmm[0].shapes[1:3] == ((4, 16), (16, 8)) and addmm[0].dtypes[1] == "float"
    assert addmm[0].flops == 2 * 4 * 16 * 8
    assert addmm[0].tf32 is False            # cuBLAS's TF32 switch as the op ran (PyTorch's default: off)
    assert all(e.end_us >= e.start_us >= 0 for e in events)


def test_a_torch_without_activity_types_parses_the_same():
    """torch builds whose _KinetoEvent has no activity_type (before 2.12 or so) take the name path."""
    records, start = records_from_profiler(cpu_profile())
    with_types = [(e.kind, e.name, e.start_us) for e in parse(records, start)]
    without = [(e.kind, e.name, e.start_us) for e in parse([replace(r, activity="") for r in records], start)]
    assert without == with_types


# -- the user's code and its lines -----------------------------------------------------------------
def test_is_user_file(tmp_path):
    import gpulab.core.timing
    import gpulab.diagnose.core
    import gpulab.lessons.l15_your_training_step

    mine = tmp_path / "train.py"
    mine.write_text("x = 1\n")
    assert is_user_file(str(mine)) and is_user_file(__file__)
    assert not is_user_file(os.__file__)                              # the standard library
    assert not is_user_file(torch.__file__)                           # site-packages
    assert not is_user_file("torch/nn/modules/module.py")             # as the profiler shortens it
    assert not is_user_file(gpulab.diagnose.core.__file__)            # gpulab's harness
    assert not is_user_file(gpulab.core.timing.__file__)
    assert is_user_file(gpulab.lessons.l15_your_training_step.__file__)   # the course's training code is a user's
    assert not is_user_file("<frozen importlib._bootstrap>") and not is_user_file("")
    assert not is_user_file("no/such/file.py")                        # not found: a library's shortened name


def test_c_call_name_and_fmt_site():
    assert c_call_name("<built-in method astype of numpy.ndarray object at 0x7f3a2c0>") == "astype (numpy.ndarray)"
    assert c_call_name("<built-in function perf_counter>") == "perf_counter"
    assert c_call_name("aten::mm") == "aten::mm"
    assert fmt_site(("/home/me/train.py", 12, "step")) == "train.py:12 (step)"
    assert fmt_site(("torch/amp/grad_scaler.py", 400, "")) == "torch/amp/grad_scaler.py:400"
    assert fmt_site(()) == ""


# A hand-made event tree: nodes whose extra fields' types are named as torch's are.
class _ExtraFields_PyCall:                      # noqa: N801 - torch's name
    def __init__(self, caller, callsite):
        self.caller, self.callsite = caller, callsite


class _ExtraFields_PyCCall:                     # noqa: N801
    def __init__(self, caller):
        self.caller = caller


class _ExtraFields_TorchOp:                     # noqa: N801
    def __init__(self, tf32=None):
        self.allow_tf32_cublas = tf32


def where(file, line, func):
    return SimpleNamespace(file_name=file, line_number=line, function_name=func)


def node(fields, start_us, end_us, name="", children=(), tid=1):
    return SimpleNamespace(extra_fields=fields, start_time_ns=int(start_us * 1e3), end_time_ns=int(end_us * 1e3),
                           start_tid=tid, name=name, children=list(children))


def test_tree_facts_on_a_hand_made_tree():
    me, lib = os.path.abspath(__file__), torch.nn.modules.linear.__file__
    addmm = node(_ExtraFields_TorchOp(tf32=False), 120, 130, "aten::addmm")
    inner = node(_ExtraFields_PyCall(where(lib, 125, "forward"), where(lib, 50, "linear")), 115, 135, "linear",
                 [addmm])                                 # library to library: no frame of its own
    model = node(_ExtraFields_PyCall(where(me, 22, "step"), where(lib, 120, "forward")), 100, 100 + FRAME_MIN_US * 2,
                 "forward", [inner])
    short = node(_ExtraFields_PyCCall(where(me, 24, "step")), 200, 200 + FRAME_MIN_US - 0.001,
                 "<built-in method tolist of numpy.ndarray object at 0x1>")
    numpy = node(_ExtraFields_PyCCall(where(me, 25, "step")), 300, 300 + FRAME_MIN_US,
                 "<built-in method astype of numpy.ndarray object at 0x1>")
    runs_op = node(_ExtraFields_PyCCall(where(me, 26, "step")), 400, 450, "<built-in method sum of Tensor object at 0x1>",
                   [node(_ExtraFields_TorchOp(), 410, 440, "aten::sum")])
    step = node(_ExtraFields_PyCall(where(me, 10, "<module>"), where(me, 20, "step")), 0, 1000, "step",
                [model, short, numpy, runs_op])
    tf32, sites, frames = tree_facts([step])
    assert tf32 == {("aten::addmm", 120_000): False}
    assert sites[("aten::addmm", 120_000)] == ((me, 22, "step"), (lib, 125, "forward"))
    assert sites[("aten::sum", 410_000)] == ((me, 26, "step"), (me, 26, "step"))
    got = {(r.name, r.start_ns, r.site[1], r.code[2] if r.code else "", r.user) for r in frames}
    assert got == {("step", 0, 10, "step", True), ("forward", 100_000, 22, "forward", False),
                   ("astype (numpy.ndarray)", 300_000, 25, "", True), ("sum (Tensor)", 400_000, 26, "", False)}
    assert all(r.activity == PY_FRAME and r.thread == 1 for r in frames)


def slow_part():
    deadline = time.perf_counter() + 0.002
    while time.perf_counter() < deadline:       # 2 ms of the user's own Python
        pass


def quick_part():
    return 1


def test_tree_facts_on_a_real_profile_with_stacks():
    lin = torch.nn.Linear(16, 8)
    x = torch.randn(4, 16)
    lines = {}

    def tiny_step():
        slow_part()
        quick_part()
        lines["lin"] = sys._getframe().f_lineno + 1
        return lin(x).sum()

    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        with record_function(STEP_RANGE):
            tiny_step()
    events = from_profiler(prof)
    addmm = next(e for e in events if e.name == "aten::addmm")
    assert os.path.basename(addmm.site[0]) == "test_events.py"
    assert addmm.site[1:] == (lines["lin"], "tiny_step")
    assert os.path.basename(addmm.via[0]) == "linear.py"                 # the innermost line: torch's
    frames = by_kind(events, PY)
    slow = [f for f in frames if f.name == "slow_part"]
    assert len(slow) == 1 and slow[0].user and slow[0].code[2] == "slow_part" and slow[0].site[2] == "tiny_step"
    assert slow[0].dur_us >= 2000
    assert not [f for f in frames if f.name == "quick_part"]             # shorter than FRAME_MIN_US
    assert all(f.dur_us >= FRAME_MIN_US for f in frames)
    model = [f for f in frames if f.site[2] == "tiny_step" and f.site[1] == lines["lin"] and not f.user]
    assert model, "the call into torch from the user's line is a frame, not the user's own work"


# -- on a GPU (skipped here): the linkage as torch really reports it -------------------------------
def gpu_profile(dtype=torch.bfloat16):
    device = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).to(device)
    x_host = torch.randn(64, 256)                       # pageable: its copy is a "Pageable -> Device" memcpy

    def step():
        x = x_host.to(device)
        with torch.amp.autocast("cuda", dtype=dtype):
            loss = model(x).float().square().mean()
        loss.backward()
        return loss.item()

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for _ in range(2):
            with record_function(STEP_RANGE):
                step()
        torch.cuda.synchronize()
    return from_profiler(prof)


@pytest.mark.gpu
def test_on_a_gpu_every_kernel_links_to_its_launch_call_and_op():
    events = gpu_profile()
    gpu, calls = by_kind(events, GPU), by_kind(events, RUNTIME)
    assert gpu and calls
    assert not [e for e in gpu if e.name in (STEP_RANGE, "Stream Sync")], "annotations counted as GPU work"
    launched = {c.corr for c in calls}
    unlinked = [e.name for e in gpu if e.corr not in launched]
    assert not unlinked, f"kernels without a launch call: {unlinked[:5]}"
    no_op = [e.name for e in gpu if not e.op]
    assert len(no_op) <= 0.1 * len(gpu), f"kernels without an op: {no_op[:5]}"
    gemms = [e for e in gpu if e.op in ("aten::mm", "aten::addmm")]
    # forward 2; backward 3: both weight gradients, and the input gradient of the second layer only (the
    # first layer's input is data, which needs no gradient)
    assert len(gemms) >= 2 * 5, "forward 2 + backward 3 matrix products per step"
    ops = {e.corr: e for e in by_kind(events, OP)}
    assert all(ops[e.op_id].name == e.op for e in gemms)
    assert {dtype for e in gemms for dtype in ops[e.op_id].dtypes[:3] if dtype} <= {"c10::BFloat16", "float"}
    assert any(e.name.startswith("Memcpy HtoD (Pageable -> Device)") for e in gpu)
    assert any(e.name == "cudaStreamSynchronize" for e in calls)        # .item()'s wait


@pytest.mark.gpu
def test_on_a_gpu_the_threads_of_runtime_calls_are_their_ops_threads():
    events = gpu_profile()
    ops = {e.corr: e for e in by_kind(events, OP)}
    linked = [c for c in by_kind(events, RUNTIME) if c.op_id in ops]
    assert linked and all(c.stream == ops[c.op_id].stream for c in linked)
    inside = [c for c in linked if ops[c.op_id].start_us <= c.start_us <= ops[c.op_id].end_us + 1]
    assert len(inside) >= 0.9 * len(linked), f"{len(linked) - len(inside)} of {len(linked)} calls outside their op"
