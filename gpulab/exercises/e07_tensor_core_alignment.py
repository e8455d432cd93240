"""Notebook 07's graded exercise: a 16-bit product whose rows are one element short of a multiple of 64.

`a @ b` with a of m x k and b of k x n, every dimension one less than a multiple of 64 (4095 for 4096, as
notebook 07's headline): a row of k or n 16-bit elements is then 2 bytes longer than a multiple of 16, so
cuBLAS cannot read whole 16-byte pieces of a row, and it falls back from its Tensor Core kernels to slower ones.
Zeros padded onto the inner dimension k (a's columns, b's rows) add nothing to any sum, and zero columns padded
onto b give extra output columns that are sliced away: the same result, from an aligned product. m is only the
number of rows: no row's length depends on it.

Prediction at full size (n from this GPU's 16-bit rate, so the aligned product takes ~1.5 ms; capped at 8192 on
a fast GPU, where an H200 gets n = 8192, padded from 8191): on an H200 about 4x (notebook 07 measured the
4095 product at about a fifth of the 4096 one's TFLOP/s in fp16 and bf16; padding copies a and b); on a T4
(fp16, n ~ 3.6k) about 2-4x, the misaligned kernels there also lacking the Tensor Cores' 16-byte loads.
Measured on an H200 (2026-12-04, bf16, n = 8191): 4.1x and 4.4x (IQR 0.03-0.05), 7.3 ms against 1.7 ms a call;
the product as given graded 1.00x against a target of 2.55x; padding k and n to a multiple of 8 instead of 64
gained the same 4.1x. A grading took ~14 s with the inputs drawn on the GPU (~50 s when they were drawn on the
host). Systems tier: the padded product gives the same sums, so the output must match the product as
given within one 16-bit rounding of the largest output (rtol: the dtype's eps); an FP8 shortcut is outside that.
The inputs are integers / 128, whose sums are exact in fp32: any correct kernel gives the very same bits.

"""
from __future__ import annotations

import torch

from gpulab.exercises.task import Task, function, matmul_rate
from gpulab.models.precision import half_dtype

MULTIPLE = 64


def product(a, b):
    """The product as given: a (m x k) @ b (k x n) in 16-bit, every dimension one less than a multiple of 64."""
    return a @ b


def product_padded(a, b):
    """The lesson's fix: zeros pad k (a's columns and b's rows) and n (b's columns) up to a multiple of 64, so
    every row is a whole number of 16-byte pieces; the zeros add nothing to the sums, and the extra columns of the
    result are sliced off. m needs no padding: it is the number of rows, not a row's length."""
    m, k = a.shape
    n = b.shape[1]
    pad_k, pad_n = -k % 64, -n % 64
    a = torch.nn.functional.pad(a, (0, pad_k))               # m x (k + pad_k)
    b = torch.nn.functional.pad(b, (0, pad_n, 0, pad_k))     # (k + pad_k) x (n + pad_n)
    return (a @ b)[:, :n]


def build(scale: str, device: torch.device):
    dtype = half_dtype()                  # bf16 where native (and on the CPU), else fp16: what this GPU multiplies
    precision = str(dtype).replace("torch.", "").replace("bfloat16", "bf16").replace("float16", "fp16")
    if scale == "full":
        rate, source = matmul_rate(device, precision)
        if rate is None:
            aligned, why = 4096, source
        else:   # 2 n^3 FLOP in ~1.5 ms at this GPU's 16-bit rate; at most 8192 (each call draws 2 n^2 numbers)
            aligned = int(min(8192, max(512, round((1.5e-3 * rate * 1e12 / 2) ** (1 / 3) / MULTIPLE) * MULTIPLE)))
            why = f"aligned {precision} product of ~1.5 ms at {rate:.1f} TFLOP/s ({source}), at most 8192"
    else:
        aligned, why = 256, "tiny"
    m = k = n = aligned - 1

    # integers / 128: exact in bf16 and fp16, and so are their fp32 sums (numerators of ~1e6, far below 2^24, at
    # k <= 8191): every correct kernel gives the same bits in any order of summation; FP8 (3 mantissa bits) rounds them
    def draw(gen):
        return tuple(torch.randint(-128, 129, shape, generator=gen, device=gen.device, dtype=torch.int16)
                     .to(dtype).div_(128) for shape in ((m, k), (k, n)))
    # the fewest bytes any implementation moves: read a and b, write the m x n result, 2 bytes each
    return function(draw, device, rtol=torch.finfo(dtype).eps, atol=1e-3,
                    min_bytes=lambda inputs: (m * k + k * n + m * n) * 2,
                    sizes={"m = k = n": m, "padded to": aligned, "dtype": precision, "sized by": why})


TASKS = [Task(
    name="07.align", lesson="07", title="a 16-bit product with rows one element short", tier="systems",
    slow=product, reference=product_padded, build=build, warmup=1,      # no compilation, no autotuning to wait for
    what=("product(a, b) multiplies a (m x k) by b (k x n) in 16-bit, where m, k and n are each one less than a "
          "multiple of 64. Write a function with the same arguments that returns the same m x n result (within "
          "one 16-bit rounding) faster, still in a and b's dtype."),
    hints=("How many bytes is one row of a, and of b, in this dtype? What does a Tensor Core kernel need a row's "
           "length to be a multiple of (section 1's table)?",
           "Pad with zeros: torch.nn.functional.pad(a, (0, -k % 64)) and b likewise on its rows and columns, "
           "multiply, then slice the result back to [:, :n]. Zeros in the inner dimension add nothing to any sum."),
)]
