"""Kernel classes and their math, and GEMMs' facts, from hand-built events (moved out of test_analyze.py, which
holds the windows, the host's timeline, the later lessons' patterns and the slow step's line)."""
import pytest

from gpulab.diagnose.analyze import LAUNCH_GRACE_US, analyze, conv_flops
from gpulab.diagnose.kernels import (ALIGN_ELEMENTS, dtype_of, gemm_flops, kernel_class, kernel_math, misaligned, mnk,
                                     uses_tensor_cores)

from test_analyze import BF16, FP32, call, kernel, launched, op, step


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
    # Hopper's IEEE fp32 product (FFMA) and cuDNN's winograd: CUDA cores, whatever the switch
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x16_ffma", "aten::mm", "fp32", True, "gemm_no_tensor_core"),
    ("cudnn::winograd_nonfused::winogradWgradData4x4<float, float>", "aten::convolution_backward", "fp32", True,
     "gemm_no_tensor_core"),
    # a TF32 kernel name settles it, whatever switch was read when
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x16", "aten::mm", "fp32", False, "gemm_tensor_core"),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x16", "aten::mm", "fp32", True, "gemm_tensor_core"),
    ("some_new_kernel_name", "aten::mm", "bf16", False, "gemm_tensor_core"),       # by the op alone
    ("some_new_kernel_name", "aten::mm", "fp32", False, "gemm_no_tensor_core"),
    ("some_new_kernel_name", "aten::mm", "fp32", True, "gemm_tensor_core"),
    ("some_new_kernel_name", "aten::mm", "", False, "gemm_unknown"),               # neither name nor op tells
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


def test_uses_tensor_cores_says_none_when_nothing_tells():
    assert uses_tensor_cores("some_new_kernel_name") is None
    assert uses_tensor_cores("some_new_kernel_name", "fp64") is False
    assert uses_tensor_cores("nvjet_tst_64x8") is True
    assert uses_tensor_cores("ampere_sgemm_128x64_nn", "bf16") is False


@pytest.mark.parametrize("name, dtype, tf32, math", [
    ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x16_ffma", "fp32", True, "fp32"),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn", "fp32", False, "tf32"),
    ("ampere_sgemm_128x64_nn", "fp32", True, "fp32"),
    ("some_new_kernel_name", "fp32", True, "tf32"),
    ("some_new_kernel_name", "fp32", False, "fp32"),
    ("nvjet_hsh_128x256", "bf16", False, "bf16"),
    ("some_new_kernel_name", "fp16", False, "fp16"),
    ("some_new_kernel_name", "", False, ""),
    ("volta_h884gemm_128x128_ldg8_nn", "", False, ""),              # Tensor Cores, but which input precision?
])
def test_kernel_math(name, dtype, tf32, math):
    assert kernel_math(name, dtype, tf32) == math


@pytest.mark.parametrize("dtypes, want", [(FP32, "fp32"), (BF16, "bf16"), (("", "c10::Half"), "fp16"),
                                          (("Scalar", "double"), "fp64"), (("c10::Float8_e4m3fn",), "fp8"),
                                          ((), ""), (("Scalar",), "")])
def test_dtype_of(dtypes, want):
    assert dtype_of(dtypes) == want


def test_dtype_override_from_the_launching_op_in_analyze():
    ops = [op("aten::mm", 0, 10, corr=10, shapes=((64, 64), (64, 64)), dtypes=FP32)]
    name = "sm80_xmma_gemm_f32f32_some_new_kernel"
    events = [step(0, 100), *ops, kernel(name, 10, 60, op_id=10, op="aten::mm")]
    assert analyze(events, tf32_matmul=False).busy_by_class["gemm_no_tensor_core"] == pytest.approx(0.05)
    assert analyze(events, tf32_matmul=False).gemms[0].math == "fp32"
    assert analyze(events, tf32_matmul=True).busy_by_class["gemm_tensor_core"] == pytest.approx(0.05)
    assert analyze(events, tf32_matmul=True).gemms[0].math == "tf32"
    # the op's own record (the profiler's allow_tf32_cublas) wins over the switch read afterwards
    recorded = [step(0, 100), op("aten::mm", 0, 10, corr=10, dtypes=FP32, tf32=True), kernel(name, 10, 60, op_id=10)]
    assert analyze(recorded, tf32_matmul=False).busy_by_class["gemm_tensor_core"] == pytest.approx(0.05)
    # convolutions follow cuDNN's switch, not the matmul one
    conv = [step(0, 100), op("aten::cudnn_convolution", 0, 10, corr=3, dtypes=FP32),
            kernel("sm80_xmma_fprop_implicit_gemm_f32f32", 10, 60, op_id=3)]
    assert analyze(conv, tf32_matmul=False, tf32_cudnn=True).busy_by_class["gemm_tensor_core"] == pytest.approx(0.05)
    assert analyze(conv, tf32_matmul=True, tf32_cudnn=False).busy_by_class["gemm_no_tensor_core"] == pytest.approx(0.05)


def test_busy_by_class_copies_and_communication():
    events = [step(0, 1000), kernel("nvjet_hsh_128x256", 0, 100), kernel("vectorized_elementwise_kernel", 100, 150),
              kernel("Memcpy HtoD (Pageable -> Device)", 150, 350), kernel("Memcpy HtoD (Pinned -> Device)", 350, 400),
              kernel("ncclDevKernel_AllReduce", 380, 600, stream=20), kernel("mystery_gemm_x", 600, 650, op="aten::mm", stream=9)]
    f = analyze(events)
    assert f.busy_by_class == pytest.approx({"gemm_tensor_core": 0.1, "gemm_no_tensor_core": 0.0, "gemm_unknown": 0.05,
                                             "elementwise_norm": 0.05, "copy": 0.25, "communication": 0.22})
    assert f.pageable_copy_ms == pytest.approx(0.2)
    assert f.comm_ms == pytest.approx(0.22)
    assert f.comm_exposed_ms == 0         # nothing was launched that waited for the all-reduce
    assert f.kernels_per_step == 4 and f.median_kernel_us == 75     # copies are not kernels


def test_launches_are_counted_one_by_one():
    events = [step(0, 1000), *launched("aten::add", 0, 10, corr=1), *launched("aten::mul", 20, 30, corr=2),
              call("cudaGraphLaunch", 40, 50, corr=3), kernel("replayed", 50, 60, corr=3)]
    f = analyze(events)
    assert f.kernels_per_step == 3 and f.launches_per_step == 2


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
    (bf16,) = [g for g in f.gemms if g.dtype == "bf16"]
    assert bf16.calls == 2 and bf16.gpu_ms == pytest.approx(0.11) and bf16.misaligned and bf16.math == "bf16"
    assert bf16.flops == 2 * (2 * 4095 * 64 * 128) and bf16.tensor_cores
    fp32 = next(g for g in f.gemms if g.dtype == "fp32")
    assert fp32.flops == 1234.0 and not fp32.tensor_cores and not fp32.misaligned and fp32.math == "fp32"
    assert f.gemm_ms(lambda g: g.misaligned) == (pytest.approx(0.11), 2 * 2 * 4095 * 64 * 128)


def test_conv_flops_from_the_shapes():
    x, w, grad = (8, 3, 32, 32), (16, 3, 3, 3), (8, 16, 16, 16)        # stride 2: 16 x 16 out
    ops = {1: op("aten::cudnn_convolution", 0, 1, corr=1, shapes=(x, w)),
           2: op("aten::convolution_backward", 2, 3, corr=2, shapes=(grad, x, w))}
    fwd = 2 * 8 * 16 * 16 * 16 * 3 * 3 * 3
    assert conv_flops(ops) == {1: fwd, 2: 2 * fwd}
    alone = conv_flops({1: ops[1]})                                    # no backward: P x Q taken as H x W
    assert alone == {1: 2 * 8 * 16 * 32 * 32 * 3 * 3 * 3}
    assert conv_flops({3: op("aten::cudnn_convolution", 0, 1, corr=3, shapes=((8,), (16,)))}) == {}


def test_a_convolutions_flops_reach_its_gemm_fact():
    x, w = (8, 3, 32, 32), (16, 3, 3, 3)
    events = [step(0, 1000), op("aten::cudnn_convolution", 0, 10, corr=1, shapes=(x, w), dtypes=FP32),
              kernel("implicit_convolve_sgemm", 10, 100, op_id=1)]
    (g,) = analyze(events).gemms
    assert g.flops == 2 * 8 * 16 * 32 * 32 * 27 and g.math == "fp32"
