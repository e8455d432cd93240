"""Facts from hand-built events: windows, busy merging, idle attribution, kernel classes, GEMMs."""
import json

import pytest

from gpulab.diagnose.analyze import (
    ALIGN_ELEMENTS,
    GLUE_GAP_US,
    LAUNCH_GRACE_US,
    SYNC_GRACE_US,
    analyze,
    dtype_of,
    gemm_flops,
    idle_cause,
    kernel_class,
    misaligned,
    mnk,
    step_windows,
)
from gpulab.diagnose.events import GPU, OP, RUNTIME, STEP_RANGE, Event

BF16 = ("c10::BFloat16", "c10::BFloat16")
FP32 = ("float", "float")
LOADER = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"


def step(a=0, b=1000, thread=1):
    return Event(OP, STEP_RANGE, a, b, stream=thread)


def op(name, a, b, thread=1, corr=0, **kw):
    return Event(OP, name, a, b, stream=thread, corr=corr, **kw)


def call(name, a, b, corr=0, op_id=0, thread=1):
    return Event(RUNTIME, name, a, b, stream=thread, corr=corr, op_id=op_id)


def kernel(name, a, b, stream=7, corr=0, op_id=0, op=""):
    return Event(GPU, name, a, b, stream=stream, corr=corr, op_id=op_id, op=op)


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


def test_no_step_ranges_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="gpulab.step"):
        analyze([kernel("k", 0, 1)])


# -- idle attribution ------------------------------------------------------------------------------
def test_idle_cause_input():
    assert idle_cause([step(), op(LOADER, 100, 300)], 150) == "input"
    assert idle_cause([step(), op("gpulab.data", 100, 300), call("cudaMalloc", 120, 200)], 150) == "input"


def test_idle_cause_sync_inside_and_just_after():
    host = [step(), call("cudaStreamSynchronize", 100, 200)]
    assert idle_cause(host, 150) == "sync"
    assert idle_cause(host, 200 + SYNC_GRACE_US) == "sync"
    assert idle_cause(host, 200 + SYNC_GRACE_US + 1) == "other"      # long after: nothing running
    assert idle_cause([step(), op("aten::item", 100, 200)], 150) == "sync"


def test_idle_cause_pageable_copy_includes_its_own_wait():
    host = [step(), op("aten::copy_", 100, 300, corr=5), call("cudaMemcpyAsync", 110, 250, corr=900, op_id=5),
            call("cudaStreamSynchronize", 250, 300, op_id=5)]
    assert idle_cause(host, 260, pageable_ops={5}) == "pageable_copy"
    assert idle_cause(host, 260) == "sync"                      # the same copy from pinned memory
    assert idle_cause(host, 120, pageable_calls={900}) == "pageable_copy"


def test_item_reading_a_number_is_a_sync_not_a_pageable_copy():
    host = [step(), op("aten::item", 100, 300, corr=4), op("aten::_local_scalar_dense", 101, 299, corr=5),
            call("cudaMemcpyAsync", 110, 150, corr=900, op_id=5), call("cudaStreamSynchronize", 150, 299, op_id=5)]
    assert idle_cause(host, 200, pageable_ops={5}, pageable_calls={900}) == "sync"


def test_idle_cause_allocator_before_launch():
    host = [step(), op("aten::empty", 90, 210), call("cudaMalloc", 100, 200)]
    assert idle_cause(host, 150) == "allocator"
    assert idle_cause([step(), call("cudaFree", 100, 200)], 150) == "allocator"


def test_idle_cause_launch_inside_an_op_or_a_short_gap():
    assert idle_cause([step(), op("aten::add", 100, 120)], 110) == "launch"
    assert idle_cause([step(), call("cudaLaunchKernel", 100, 120)], 110) == "launch"
    near = [step(), op("aten::add", 100, 120), op("aten::mul", 120 + GLUE_GAP_US, 200 + GLUE_GAP_US)]
    assert idle_cause(near, 130) == "launch"
    far = [step(), op("aten::add", 100, 120), op("aten::mul", 121 + GLUE_GAP_US, 200 + GLUE_GAP_US)]
    assert idle_cause(far, 130) == "other"


def test_idle_cause_other_when_the_host_does_nothing_recorded():
    assert idle_cause([step()], 500) == "other"


def test_backward_on_another_thread_counts_as_launch():
    """The main thread waits in backward() with nothing recorded; autograd's thread issues the kernels."""
    host = [step(thread=1), op("autograd::engine::evaluate_function: MmBackward0", 300, 320, thread=2),
            op("autograd::engine::evaluate_function: AddBackward0", 330, 350, thread=2)]
    assert idle_cause(host, 325) == "launch"


def test_analyze_charges_each_stretch_to_its_start():
    events = [step(0, 1000), op(LOADER, 0, 400), kernel("k", 400, 600),
              call("cudaStreamSynchronize", 550, 700), kernel("k", 700, 1000)]
    f = analyze(events)
    assert f.idle_by_cause["input"] == pytest.approx(0.4)
    assert f.idle_by_cause["sync"] == pytest.approx(0.1)
    assert f.busy_ms == pytest.approx(0.5)
    assert [c for _, _, c in f.intervals["idle"]] == ["input", "sync"]


def test_threads_that_neither_step_nor_launch_are_ignored():
    """A pin-memory thread's ops do not make the GPU's idle time "launch"."""
    events = [step(0, 1000), op("aten::pin_memory", 0, 1000, thread=9)]
    assert analyze(events).idle_by_cause["other"] == pytest.approx(1.0)


# -- kernel classes --------------------------------------------------------------------------------
@pytest.mark.parametrize("name, op, dtype, tf32, cls", [
    ("Memcpy HtoD (Pageable -> Device)", "aten::copy_", "fp32", False, "copy"),
    ("Memset (Device)", "", "", False, "copy"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "", "", False, "communication"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>", "aten::add", "fp32",
     False, "elementwise_norm"),
    ("triton_poi_fused_add_mul_0", "", "", False, "elementwise_norm"),
    ("void at::native::elementwise_kernel<128, 2>", "aten::addmm", "bf16", False, "elementwise_norm"),
    ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn", "aten::mm", "bf16", False, "gemm_tensor_core"),
    ("nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NNT", "aten::mm", "bf16", False, "gemm_tensor_core"),
    ("volta_h884gemm_128x128_ldg8_nn", "aten::mm", "", False, "gemm_tensor_core"),
    ("ampere_sgemm_128x64_nn", "aten::mm", "fp32", False, "gemm_no_tensor_core"),
    ("ampere_sgemm_128x64_nn", "aten::mm", "fp32", True, "gemm_no_tensor_core"),   # SIMT by name, TF32 or not
    ("gemv2T_kernel_val<int, int, __nv_bfloat16, float>", "aten::addmm", "bf16", False, "gemm_no_tensor_core"),
    # the launching op's dtype overrides the name: fp32 with TF32 off cannot run on Tensor Cores
    ("sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x16", "aten::mm", "fp32", False, "gemm_no_tensor_core"),
    ("sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x16", "aten::mm", "fp32", True, "gemm_tensor_core"),
    ("some_new_kernel_name", "aten::mm", "bf16", False, "gemm_tensor_core"),       # by the op alone
    ("some_new_kernel_name", "aten::mm", "fp32", False, "gemm_no_tensor_core"),
    ("splitKreduce_kernel<32, 16, int, float>", "aten::mm", "fp32", False, "gemm_no_tensor_core"),
    ("sm80_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc", "aten::cudnn_convolution", "bf16", False,
     "gemm_tensor_core"),
    ("implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1>", "aten::cudnn_convolution", "fp32", True,
     "gemm_no_tensor_core"),
    ("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>", "aten::_flash_attention_forward", "bf16",
     False, "gemm_tensor_core"),
])
def test_kernel_class(name, op, dtype, tf32, cls):
    assert kernel_class(name, op, dtype, tf32) == cls


@pytest.mark.parametrize("dtypes, want", [(FP32, "fp32"), (BF16, "bf16"), (("", "c10::Half"), "fp16"),
                                          (("Scalar", "double"), "fp64"), (("c10::Float8_e4m3fn",), "fp8"),
                                          ((), ""), (("Scalar",), "")])
def test_dtype_of(dtypes, want):
    assert dtype_of(dtypes) == want


def test_dtype_override_from_the_launching_op_in_analyze():
    ops = [op("aten::mm", 0, 10, corr=10, shapes=((64, 64), (64, 64)), dtypes=FP32)]
    name = "sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x16"
    events = [step(0, 100), *ops, kernel(name, 10, 60, op_id=10, op="aten::mm")]
    assert analyze(events, tf32_matmul=False).busy_by_class["gemm_no_tensor_core"] == pytest.approx(0.05)
    assert analyze(events, tf32_matmul=True).busy_by_class["gemm_tensor_core"] == pytest.approx(0.05)
    # the op's own record (the profiler's allow_tf32_cublas) wins over the switch read afterwards
    recorded = [step(0, 100), op("aten::mm", 0, 10, corr=10, dtypes=FP32, tf32=True), kernel(name, 10, 60, op_id=10)]
    assert analyze(recorded, tf32_matmul=False).busy_by_class["gemm_tensor_core"] == pytest.approx(0.05)
    # convolutions follow cuDNN's switch, not the matmul one
    conv = [step(0, 100), op("aten::cudnn_convolution", 0, 10, corr=3, dtypes=FP32),
            kernel("sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32", 10, 60, op_id=3)]
    assert analyze(conv, tf32_matmul=False, tf32_cudnn=True).busy_by_class["gemm_tensor_core"] == pytest.approx(0.05)


def test_busy_by_class_copies_and_communication():
    events = [step(0, 1000), kernel("nvjet_hsh_128x256", 0, 100), kernel("vectorized_elementwise_kernel", 100, 150),
              kernel("Memcpy HtoD (Pageable -> Device)", 150, 350), kernel("Memcpy HtoD (Pinned -> Device)", 350, 400),
              kernel("ncclDevKernel_AllReduce", 380, 600, stream=20)]
    f = analyze(events)
    assert f.busy_by_class == pytest.approx({"gemm_tensor_core": 0.1, "gemm_no_tensor_core": 0.0,
                                             "elementwise_norm": 0.05, "copy": 0.25, "communication": 0.22})
    assert f.pageable_copy_ms == pytest.approx(0.2)
    assert f.comm_ms == pytest.approx(0.22)
    assert f.comm_exposed_ms == 0         # nothing was launched that waited for the all-reduce
    assert f.kernels_per_step == 3 and f.median_kernel_us == 100     # copies are not kernels


def comm_step(launch_at: float, start_at: float):
    """A backward kernel, an all-reduce after it on its own stream, and the optimizer's kernel: launched
    (call returns) at `launch_at`, started at `start_at` on the compute stream."""
    return [step(0, 1000), call("cudaLaunchKernel", 0, 5, corr=1), kernel("backward", 10, 100, corr=1),
            kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 100, 400, stream=20),
            call("cudaLaunchKernel", launch_at - 5, launch_at, corr=2), kernel("sgd", start_at, start_at + 50, corr=2)]


def test_exposed_communication_is_what_queued_work_waited_for():
    # the optimizer's kernel was queued at 50 and stood ready from the backward's end (100) until the
    # all-reduce ended (400): the all-reduce is exposed, but for the launch grace
    f = analyze(comm_step(50, 400))
    assert f.comm_ms == pytest.approx(0.3)
    assert f.comm_exposed_ms == pytest.approx((300 - LAUNCH_GRACE_US) / 1e3)
    # the host launched it only at 390 and it started at once: the all-reduce spun in a gap the host
    # left, and nothing waited for it
    assert analyze(comm_step(390, 395)).comm_exposed_ms == 0
    # at the grace's edge: launched at 350, started 20 us later is the launch; 21 us later, 1 us waited
    assert analyze(comm_step(350, 350 + LAUNCH_GRACE_US)).comm_exposed_ms == 0
    assert analyze(comm_step(350, 351 + LAUNCH_GRACE_US)).comm_exposed_ms == pytest.approx(0.001)


def test_waiting_beside_compute_is_not_exposed_communication():
    # the optimizer's kernel waits on its stream while another stream computes beside the all-reduce:
    # only the time in which communication alone ran counts
    events = comm_step(50, 400) + [kernel("other_stream_gemm", 100, 300, stream=9)]
    assert analyze(events).comm_exposed_ms == pytest.approx(0.1)


# -- GEMMs -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, shapes, dims", [
    ("aten::mm", ((64, 32), (32, 16)), (1, 64, 16, 32)),
    ("aten::addmm", ((16,), (64, 32), (32, 16)), (1, 64, 16, 32)),
    ("aten::bmm", ((4, 64, 32), (4, 32, 16)), (4, 64, 16, 32)),
    ("aten::baddbmm", ((4, 64, 16), (4, 64, 32), (4, 32, 16)), (4, 64, 16, 32)),
    ("aten::mm", ((64, 32), (31, 16)), None),          # inner dimensions disagree: not understood
    ("aten::add", ((64, 32), (64, 32)), None),
])
def test_mnk(name, shapes, dims):
    assert mnk(name, shapes) == dims


def test_misaligned_needs_16_bit_and_an_odd_dimension():
    odd = ((4095, 64), (64, 128))
    assert misaligned("aten::mm", odd, "bf16") and misaligned("aten::mm", odd, "fp16")
    assert not misaligned("aten::mm", odd, "fp32")
    assert not misaligned("aten::mm", ((4096, 64), (64, 128)), "bf16")
    assert not misaligned("aten::mm", ((64, 64), (64, 128 + ALIGN_ELEMENTS)), "bf16")
    assert misaligned("aten::mm", ((64, 60), (60, 128)), "bf16")       # K
    assert gemm_flops("aten::mm", odd) == 2 * 4095 * 64 * 128


def test_gemm_facts_group_by_op_and_shape():
    mm = {"shapes": ((4095, 64), (64, 128)), "dtypes": BF16}
    events = [step(0, 1000),
              op("aten::mm", 0, 10, corr=10, **mm), kernel("nvjet_hsh", 10, 60, op_id=10),
              op("aten::mm", 100, 110, corr=11, **mm), kernel("nvjet_hsh", 110, 160, op_id=11),
              kernel("splitKreduce_kernel", 160, 170, op_id=11),
              op("aten::addmm", 200, 210, corr=12, shapes=((8,), (64, 64), (64, 8)), dtypes=("float",) * 3,
                 flops=1234.0),
              kernel("ampere_sgemm_32x32", 210, 300, op_id=12)]
    f = analyze(events)
    bf16 = next(g for g in f.gemms if g.dtype == "bf16")
    assert bf16.calls == 2 and bf16.gpu_ms == pytest.approx(0.11) and bf16.misaligned
    assert bf16.flops == 2 * (2 * 4095 * 64 * 128) and bf16.tensor_cores
    fp32 = next(g for g in f.gemms if g.dtype == "fp32")
    assert fp32.flops == 1234.0 and not fp32.tensor_cores and not fp32.misaligned
    assert f.gemm_ms(lambda g: g.misaligned) == (pytest.approx(0.11), 2 * 2 * 4095 * 64 * 128)


# -- CPU mode, MFU, JSON ---------------------------------------------------------------------------
def test_on_the_cpu_busy_is_aten_ops_outside_data_loading():
    events = [step(0, 100), op("aten::mm", 10, 30), op(LOADER, 40, 90), op("aten::stack", 50, 60)]
    f = analyze(events, on_gpu=False)
    assert f.busy_ms == pytest.approx(0.02)
    assert f.idle_by_cause["input"] == pytest.approx(0.06)       # from entering the loader to the step's end
    assert f.idle_by_cause["launch"] == pytest.approx(0.02)      # Python around aten::mm
    assert f.idle_ms == pytest.approx(0.08)


def test_a_strong_cause_takes_over_the_rest_of_a_stretch():
    """The GPU ran dry while the host ran Python, then the host waited for the next batch: the wait and
    the refill after it are the input pipeline's; a later op (weak) does not take over."""
    events = [step(0, 1000), kernel("k", 0, 100), op("aten::add", 90, 110), op(LOADER, 150, 800),
              op("aten::to", 820, 900), kernel("k", 900, 1000)]
    f = analyze(events)
    assert [(a, b, c) for a, b, c in f.intervals["idle"]] == [(100, 150, "launch"), (150, 900, "input")]


def test_tflops_and_mfu():
    f = analyze([step(0, 100)], step_ms=10.0, flops_per_step=1e12, peak_tflops=400.0, peak_source="test")
    assert f.tflops == pytest.approx(100.0) and f.mfu == pytest.approx(0.25)
    assert analyze([step(0, 100)], step_ms=10.0, flops_per_step=1e12).mfu is None
    assert analyze([step(0, 100)], peak_tflops=400.0).tflops is None


def test_facts_are_json_serialisable():
    events = [step(0, 100), op("aten::mm", 0, 10, corr=10, shapes=((8, 8), (8, 8)), dtypes=BF16),
              kernel("nvjet", 10, 20, op_id=10)]
    json.dumps(analyze(events, step_ms=1.0, flops_per_step=1.0, peak_tflops=1.0).to_dict())


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
    d = diagnose(gpu_step(half), warmup=2, steps=3, flops_per_step=1.0, peak_tflops=1.0)
    assert d.busy_by_class["gemm_tensor_core"] > 0 and d.busy_by_class["gemm_no_tensor_core"] == 0
    assert not [g for g in d.facts.gemms if g.dtype == ""], "GEMMs whose op was not found"
    with fp32_math("ieee"):      # large enough that the fp32 GEMMs are most of the step, not the launches
        d = diagnose(gpu_step(None, n=4096, batch=2048), warmup=2, steps=3, flops_per_step=1.0, peak_tflops=1.0)
    assert d.busy_by_class["gemm_no_tensor_core"] > d.busy_by_class["gemm_tensor_core"]
    assert any(v.rule == "fp32_no_tensor_cores" for v in d.verdicts)


@pytest.mark.gpu
def test_on_a_gpu_item_every_step_is_charged_to_sync():
    from gpulab.diagnose import diagnose

    d = diagnose(gpu_step(None, sync_every_step=True, n=256), warmup=2, steps=5, flops_per_step=1.0)
    assert d.idle_by_cause["sync"] > 0, d.report()
    assert d.busy_ms + d.idle_ms == pytest.approx(d.profiled_step_ms)


def test_changes_lists_every_key_largest_change_first():
    from gpulab.diagnose.analyze import changes

    got = changes({"copy": 2.0, "gemm": 5.0}, {"gemm": 5.5, "comm": 1.0})
    assert got == [("copy", -2.0), ("comm", 1.0), ("gemm", 0.5)]
