"""Kernel classes and GEMM shapes: which kernels are matrix products, which run on the Tensor Cores (by the
kernel's name in cuBLAS / cuBLASLt / CUTLASS / cuDNN naming, the launching op's dtypes and the TF32 switches), the
names of the profiler's ops and runtime calls that `analyze` sorts the host's time by, a product's M, N, K, its FLOPs
and whether it suits the Tensor Cores' tiles, and which kernels are attention written by hand. Read alone: nothing
here reads a whole trace."""
from __future__ import annotations

import math
from collections.abc import Sequence

from gpulab.diagnose.events import DATA_RANGE

# 16-bit GEMMs whose M, N or K is not a multiple of 8 elements (16 bytes) miss the Tensor Cores' tile
# shape: cuBLAS before CUDA 11 did not use Tensor Cores for them at all, later versions pad and lose
# efficiency (NVIDIA, "Matrix Multiplication Background User's Guide", Tensor Core requirements).
# Lesson 07 pads the vocabulary to a multiple of 64 for the best tiles; 8 is the requirement we check.
ALIGN_ELEMENTS = 8


# -- names -----------------------------------------------------------------------------------------
INPUT_RANGES = ("enumerate(DataLoader)", DATA_RANGE)      # a DataLoader's __next__, or the learner's range
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyDtoH_v2",
              "aten::item", "aten::_local_scalar_dense")
SCALAR_READS = ("aten::item", "aten::_local_scalar_dense")
# The runtime calls in which the host waits for the GPU (the blocked time a sync costs).
BLOCKING_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                  "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cuMemcpyDtoH_v2",
                  "cudaStreamWaitEvent_host")
ALLOC_CALLS = ("cudaMalloc", "cudaFree", "cudaMallocAsync", "cudaFreeAsync", "cudaHostAlloc", "cudaFreeHost",
               "cuMemAlloc_v2", "cuMemFree_v2", "cuMemCreate", "cuMemMap", "cuMemUnmap", "cuMemRelease",
               "cuMemAddressReserve", "cuMemAddressFree", "cuMemSetAccess")
COPY_OPS = ("aten::copy_", "aten::_copy_from", "aten::to", "aten::_to_copy")
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm", "aten::addmv",
              "aten::mv", "aten::dot", "aten::_addmm_activation")
CONV_OPS = ("aten::cudnn_convolution", "aten::cudnn_convolution_transpose", "aten::convolution_backward",
            "aten::_convolution", "aten::convolution", "aten::miopen_convolution")
ATTENTION_OPS = ("aten::_flash_attention_forward", "aten::_flash_attention_backward",
                 "aten::_efficient_attention_forward", "aten::_efficient_attention_backward",
                 "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_flash_attention",
                 "aten::_scaled_dot_product_efficient_attention")

# Kernel names (lower case) of matrix products: cuBLAS ("ampere_sgemm_128x64_nn", "gemv2T_kernel",
# "splitKreduce_kernel", "gemmSN_TN_kernel"), cuBLASLt on Hopper ("nvjet_hsh_..."), CUTLASS
# ("cutlass_80_tensorop_bf16_s16816gemm_..."), the xmma kernels of cuBLAS/cuDNN ("sm90_xmma_gemm_...",
# "sm80_xmma_fprop_implicit_gemm_..."), cuDNN's own ("implicit_convolve_sgemm", "cudnn::..."), and
# attention (flash / memory-efficient, "fmha_cutlass...").
GEMM_NAMES = ("gemm", "gemv", "splitk", "xmma", "cutlass", "nvjet", "winograd", "s16816", "s1688", "h884", "h1688",
              "h16816", "hmma", "wmma", "tensorop", "dot_kernel", "convolve", "fprop", "dgrad", "wgrad",
              "flash", "fmha", "triton_tem_")
# ...that never run on Tensor Cores: fp32 SIMT kernels and matrix-vector products.
# On Hopper (H200, torch 2.11, CUDA 13: results/zoo/2026-12-01-h200-run-a/kernels-h200-2026-12-01.json) an IEEE fp32 product is
# "sm80_xmma_gemm_f32f32_f32f32_f32_..._ffma_..." (FFMA: fused multiply-add on the CUDA cores) and an fp32
# convolution's weight gradient "cudnn::winograd_nonfused::winogradWgrad..."; with TF32 the same products
# are "sm90_xmma_gemm_f32f32_tf32f32_f32_..." and "..._tf32f32_tf32f32_f32_..._tensor16x8x8_...".
NO_TENSOR_CORE_NAMES = ("sgemm", "simt", "gemv", "dgemm", "dot_kernel", "gemmsn", "gemmk1", "convolve_sgemm", "ffma",
                        "winograd")
# ...that run TF32 (an fp32 op on the Tensor Cores, whatever switch was read when): cuBLAS / cuDNN names.
TF32_NAMES = ("tf32",)
# ...that do: the MMA instruction shapes in cuBLAS/CUTLASS names (s16816 = bf16/fp16 m16n8k16,
# s1688 = tf32 m16n8k8, h884/h1688 = Volta/Turing fp16), Hopper's nvjet, and the input precision.
TENSOR_CORE_NAMES = ("s16816", "s1688", "h884", "h1688", "h16816", "i8816", "hmma", "wmma", "tensorop",
                     "nvjet", "bf16", "f16", "fp16", "tf32", "e4m3", "e5m2", "flash", "fmha")



# -- kernel classes --------------------------------------------------------------------------------
def dtype_of(dtypes: Sequence[str]) -> str:
    """The precision of an op from its recorded input dtypes: that of its first tensor input."""
    names = {"float": "fp32", "c10::bfloat16": "bf16", "c10::half": "fp16", "double": "fp64"}
    for d in dtypes:
        low = str(d).lower()
        if low in names:
            return names[low]
        if "float8" in low:
            return "fp8"
    return ""


def is_gemm(name: str, op: str = "") -> bool:
    """A matrix product (or convolution / attention, which run as one), by kernel name or launching op."""
    low = name.lower()
    if low.startswith(("memcpy", "memset")) or "nccl" in low:
        return False
    return any(t in low for t in GEMM_NAMES) or (op in MATMUL_OPS + ATTENTION_OPS and "elementwise" not in low)


def uses_tensor_cores(name: str, dtype: str = "", tf32: bool = False) -> bool | None:
    """Whether a GEMM kernel ran on Tensor Cores: the name first where it says (an fp32 SIMT kernel, a
    TF32 or 16-bit MMA shape), then the launching op's dtype and TF32 switch (fp32 without TF32 cannot;
    16-bit, fp8 and fp32 with TF32 do); None when neither tells (a kernel whose op was not recorded)."""
    low = name.lower()
    if any(t in low for t in NO_TENSOR_CORE_NAMES):
        return False
    if any(t in low for t in TF32_NAMES):
        return True
    if dtype in ("fp32", "fp64") and not (dtype == "fp32" and tf32):
        return False
    if any(t in low for t in TENSOR_CORE_NAMES):
        return True
    if dtype in ("bf16", "fp16", "fp8") or (dtype == "fp32" and tf32):
        return True
    return None


def kernel_math(name: str, dtype: str = "", tf32: bool = False) -> str:
    """How a GEMM kernel computed: "fp32" (CUDA cores), "tf32", "bf16", "fp16", "fp8", or "" (unknown)."""
    tc = uses_tensor_cores(name, dtype, tf32)
    if dtype == "fp32":
        return "" if tc is None else "tf32" if tc else "fp32"
    return dtype if tc else ""


def kernel_class(name: str, op: str = "", dtype: str = "", tf32: bool = False) -> str:
    """One of CLASSES for a GPU event. Copies by name ("Memcpy ...", "Memset ..."), NCCL collectives by
    name, GEMMs by `is_gemm` and then `uses_tensor_cores`; everything else is elementwise/normalization."""
    low = name.lower()
    if low.startswith(("memcpy", "memset")):
        return "copy"
    if "nccl" in low:
        return "communication"
    if is_gemm(name, op):
        tc = uses_tensor_cores(name, dtype, tf32)
        return "gemm_unknown" if tc is None else "gemm_tensor_core" if tc else "gemm_no_tensor_core"
    return "elementwise_norm"


# -- GEMM shapes -----------------------------------------------------------------------------------
def mnk(op: str, shapes: Sequence[tuple]) -> tuple[int, int, int, int] | None:
    """(batch, M, N, K) of a matrix-product op from its recorded input shapes; None if unknown."""
    first = {"aten::mm": 0, "aten::addmm": 1, "aten::_addmm_activation": 1, "aten::bmm": 0,
             "aten::baddbmm": 1, "aten::_scaled_mm": 0}.get(op)
    if first is None or len(shapes) < first + 2:
        return None
    a, b = shapes[first], shapes[first + 1]
    if len(a) == 2 and len(b) == 2 and a[1] == b[0]:
        return 1, a[0], b[1], a[1]
    if len(a) == 3 and len(b) == 3 and a[2] == b[1]:
        return a[0], a[1], b[2], a[2]
    return None


def gemm_flops(op: str, shapes: Sequence[tuple]) -> float:
    """2 * batch * M * N * K from the shapes (0 if unknown)."""
    dims = mnk(op, shapes)
    return 0.0 if dims is None else 2.0 * math.prod(dims)


def misaligned(op: str, shapes: Sequence[tuple], dtype: str) -> bool:
    """A 16-bit matrix product with M, N or K not a multiple of ALIGN_ELEMENTS."""
    dims = mnk(op, shapes)
    return dtype in ("bf16", "fp16") and dims is not None and any(d % ALIGN_ELEMENTS for d in dims[1:])


# Attention computed by hand: a softmax over a (..., T, T) score matrix, T at least this. Below it the
# scores are small and the fused kernels buy little (FlashAttention's tiles are 64 or 128 rows).
ATTENTION_MIN_T = 128
SOFTMAX_OPS = ("aten::_softmax", "aten::softmax", "aten::_softmax_backward_data", "aten::_masked_softmax",
               "aten::_safe_softmax")
# The copies a matmul makes of a strided operand: q @ k.transpose(-2, -1) on heads split by a view and a transpose
# (B, H, T, D) copies q, k and v into contiguous batches before its bmm (and the backward the context's gradient);
# the fused kernels read the strided heads where they lie (their one demand is a last dimension of stride 1). A copy
# that changes the dtype is a cast, which the fused kernel under autocast makes too: not counted.
OPERAND_COPIES = ("aten::copy_", "aten::clone", "aten::contiguous")


def score_shape(shapes: Sequence[tuple]) -> tuple | None:
    """The (..., T, T) score shape among an op's input shapes (T at least ATTENTION_MIN_T), or None."""
    for s in shapes:
        if len(s) >= 3 and s[-1] == s[-2] and s[-1] >= ATTENTION_MIN_T:
            return tuple(s)
    return None


def attention_by_hand(gpu: Sequence, ops: dict) -> tuple[list, set]:
    """(the kernels of attention written by hand, the (T, T) tails of its scores): the kernels of ops on the
    score shapes its softmax sees (the scale, the mask, the softmax and their backward), of the products that make
    and use the scores and of their gradients ((T x D) @ (D x T), (T x T) @ (T x D), (D x T) @ (T x T)), and of the
    copies of the heads those products make (a copy, not a cast, on a (B, H, T, D) or (B, H, D, T) tensor where the
    scores are (B, H, T, T)). The fused kernel (F.scaled_dot_product_attention) does all of it in one pass."""
    scores = {score_shape(op.shapes) for op in ops.values() if op.name in SOFTMAX_OPS} - {None}
    tails = {s[-2:] for s in scores}
    heads = {s[:2] + (s[-1],) for s in scores if len(s) == 4}          # (B, H, T)

    def head_split(shape: tuple) -> bool:
        return len(shape) == 4 and ((shape[0], shape[1], shape[2]) in heads) != ((shape[0], shape[1], shape[3]) in heads)

    def on_scores(op) -> bool:
        if op is None or op.name.startswith("aten::_scaled_dot_product"):
            return False
        if (op.name in SOFTMAX_OPS and score_shape(op.shapes) is not None) or any(tuple(s) in scores for s in op.shapes):
            return True
        if (op.name in OPERAND_COPIES and any(head_split(tuple(s)) for s in op.shapes)
                and len({d for shape, d in zip(op.shapes, op.dtypes) if shape and d}) <= 1):      # tensors' dtypes
            return True
        # the score and context products and their gradients: (T x D) @ (D x T), (T x T) @ (T x D), and (D x T) @
        # (T x T) batched over the heads (a square T x T weight of a linear layer is no head's)
        dims = mnk(op.name, op.shapes)
        return dims is not None and ((dims[1], dims[2]) in tails or (dims[1], dims[3]) in tails
                                     or (dims[0] > 1 and (dims[2], dims[3]) in tails))
    return [e for e in gpu if on_scores(ops.get(e.op_id))], tails


def conv_flops(ops: dict) -> dict:
    """{op corr: FLOPs} of the convolutions, from their recorded shapes: 2 x N x K x P x Q x C/groups x R
    x S forward (input N C H W, weight K C/g R S, output N K P Q) and twice that backward (the input's
    and the weight's gradients). The output's P x Q comes from the matching backward op's grad_output;
    without one (no backward), P x Q is taken as H x W (stride 1), an overestimate for strided ones."""
    out, spatial = {}, {}
    for op in ops.values():
        if op.name == "aten::convolution_backward" and len(op.shapes) >= 3:
            grad, x, w = op.shapes[:3]
            if len(grad) >= 3 and len(w) >= 3:
                spatial[(tuple(x), tuple(w))] = tuple(grad[2:])
                fwd = 2 * math.prod(grad) * math.prod(w[1:])
                out[op.corr] = 2.0 * fwd
    for op in ops.values():
        if op.name in CONV_OPS and op.name != "aten::convolution_backward" and len(op.shapes) >= 2:
            x, w = tuple(op.shapes[0]), tuple(op.shapes[1])
            if len(x) >= 3 and len(w) >= 3:
                pq = spatial.get((x, w), x[2:])
                out[op.corr] = 2.0 * x[0] * w[0] * math.prod(pq) * math.prod(w[1:])
    return out
