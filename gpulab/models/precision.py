"""Number formats for training: fp32, TF32, fp16 with a GradScaler, bf16. Introduced in notebook 06; used in 07 and 13.

- `SPECS`, `refusal`, `check`, `supported`, `best_half`, `half_dtype`: the four precisions, and why this
  device cannot run one (bf16 only where the GPU has it natively).
- `fp32_math(mode)`: fp32 matrix products AND convolutions as IEEE fp32 ("ieee") or on TF32
  Tensor Cores ("tf32"); both switches are restored afterwards.
- `make_scaler`, `classification_loss`, `language_model_loss`: what `models.step.train_step` takes.
- FP16 / BF16 / FP32: the limits of each format, from `torch.finfo`.
- `fp8_refusal`, `to_fp8`, `fp8_matmul`: e4m3 products with one scale per tensor (Ada, Hopper and newer;
  notebook 13's FP8 section).

PyTorch's defaults differ between the two switches: since PyTorch 1.12, fp32 matrix products
do not use TF32 unless asked, while cuDNN convolutions do. `fp32_math("ieee")` turns both off.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator
import torch
from torch import nn
from gpulab.core.device import DeviceFacts, SettingError, device_facts, float32_matmul, pick_device


@dataclass(frozen=True)
class Spec:
    """How one precision is run."""

    name: str
    dtype: torch.dtype | None   # autocast dtype; None: no autocast (fp32 tensors throughout)
    fp32_mode: str              # "ieee" or "tf32": how fp32 matrix products and convolutions run
    scaler: bool                # needs a GradScaler
    what: str


SPECS: dict[str, Spec] = {
    "fp32": Spec("fp32", None, "ieee", False, "fp32 everywhere, TF32 off for matmuls and convolutions"),
    "tf32": Spec("tf32", None, "tf32", False, "fp32 tensors; matmuls and convolutions on TF32 Tensor Cores"),
    "fp16": Spec("fp16", torch.float16, "ieee", True, "fp16 autocast with a GradScaler; fp32 weights"),
    "bf16": Spec("bf16", torch.bfloat16, "ieee", False, "bf16 autocast; fp32 weights; no scaler needed"),
}


PRECISIONS = tuple(SPECS)


FP16, BF16, FP32 = torch.finfo(torch.float16), torch.finfo(torch.bfloat16), torch.finfo(torch.float32)


FP16_SMALLEST = 2.0 ** -24          # fp16's smallest subnormal (5.96e-8); values below half of it round to 0


# Largest accepted ||C - C_ref|| / ||C_ref|| of a matrix product against fp32 with TF32 off:
# the output's rounding (fp16 keeps 11 significant bits, bf16 8, TF32 inputs 11) and fp32 accumulation.
GEMM_TOLERANCE = {"fp32": 1e-5, "tf32": 5e-3, "fp16": 5e-3, "bf16": 2e-2}


def refusal(precision: str, facts: DeviceFacts | None = None) -> str | None:
    """Why this device cannot run `precision` in a meaningful way, or None if it can."""
    if precision not in SPECS:
        return f"precision must be one of {', '.join(PRECISIONS)} (got {precision!r})."
    facts = facts or device_facts()
    if facts.kind != "cuda":
        if precision == "tf32":
            return "TF32 is a Tensor Core format of NVIDIA GPUs (Ampere and later); the CPU has no TF32 mode."
        return None
    if precision == "tf32" and not facts.tf32:
        return (f"this {facts.architecture} GPU has no TF32: it arrived with Ampere (compute capability 8.0); "
                "fp32 matmuls run as plain fp32 here.")
    if precision == "bf16" and not facts.bf16:
        return (f"this {facts.architecture} GPU has no bf16 Tensor Core math (it arrived with Ampere, "
                "compute capability 8.0); PyTorch would emulate it slowly. Use fp16 with a GradScaler.")
    return None


def check(precision: str, facts: DeviceFacts | None = None) -> Spec:
    """The Spec of `precision`; ValueError with the reason if this device cannot run it."""
    why = refusal(precision, facts)
    if why:
        raise ValueError(why)
    return SPECS[precision]


def supported(facts: DeviceFacts | None = None) -> list[str]:
    """The precisions this device runs, in PRECISIONS order."""
    facts = facts or device_facts()
    return [p for p in PRECISIONS if refusal(p, facts) is None]


_fp32_only = [False]


@contextlib.contextmanager
def fp32_only() -> Iterator[None]:
    """Inside, `best_half()` is "fp32" and `half_dtype()` torch.float32 (autocast to fp32 disables itself):
    the correctness checks of the diagnosis suite and of notebook 15 run a 16-bit step so, to see how far
    its rounding alone moves the parameters (`gpulab.diagnose.cases.same_model`)."""
    _fp32_only[0] = True
    try:
        yield
    finally:
        _fp32_only[0] = False


def fp32_forced() -> bool:
    """Whether `fp32_only()` is in force."""
    return _fp32_only[0]


def best_half(facts: DeviceFacts | None = None) -> str:
    """The 16-bit precision to train in here: bf16 where it is native (and on the CPU), else fp16."""
    if _fp32_only[0]:
        return "fp32"
    facts = facts or device_facts()
    return "bf16" if facts.bf16 else "fp16"


def half_dtype(facts: DeviceFacts | None = None) -> torch.dtype:
    """`best_half`'s dtype: torch.bfloat16 where bf16 is native (and on the CPU), else torch.float16."""
    if _fp32_only[0]:
        return torch.float32
    return SPECS[best_half(facts)].dtype


# -- FP8 (Ada, Hopper and newer): e4m3 inputs with one scale per tensor ---------------------------------
FP8_DTYPE = getattr(torch, "float8_e4m3fn", None)
FP8_MAX = torch.finfo(FP8_DTYPE).max if FP8_DTYPE is not None else None      # 448
# Largest accepted ||C - C_ref|| / ||C_ref|| of a product of two e4m3 tensors against fp32: e4m3 keeps 3
# mantissa bits, so each input element is rounded by up to 2^-4 (6 %, RMS about 3.6 %); on normal inputs
# the product's error measured 3.6 % (64 x 128 x 96, torch 2.13 on the CPU). A scale off by a factor of 2
# or an input not scaled back makes it 50 % or more.
FP8_TOLERANCE = 0.1


def fp8_refusal(facts: DeviceFacts | None = None) -> str | None:
    """Why this device cannot run FP8 matrix products (`fp8_matmul`), or None if it can. On the CPU,
    PyTorch runs them (slowly, for the code path): the CPU is not refused, its timings are not a GPU's."""
    if FP8_DTYPE is None or not hasattr(torch, "_scaled_mm"):
        return f"this PyTorch ({torch.__version__}) has no float8_e4m3fn or torch._scaled_mm"
    facts = facts or device_facts()
    if facts.kind == "cuda" and not facts.fp8:
        cc = facts.compute_capability or (0, 0)
        return (f"this {facts.architecture} GPU (compute capability {cc[0]}.{cc[1]}) has no FP8 Tensor Cores: "
                "they arrived with Ada (8.9) and Hopper (9.0)")
    return None


def to_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` in e4m3 with one scale for the whole tensor (dynamic scaling, as FP8 training recipes do each
    step): scale = amax / 448, so the largest element lands on e4m3's largest; returns (x8, scale), x ~ x8 * scale.
    It reads x twice (its amax, then the cast) and writes a byte per element: work that no Tensor Core does."""
    scale = (x.detach().abs().amax().float() / FP8_MAX).clamp(min=1e-12)
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def fp8_matmul(a8: torch.Tensor, sa: torch.Tensor, b8: torch.Tensor, sb: torch.Tensor,
               out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """(a8 * sa) @ (b8 * sb).T on FP8 Tensor Cores (`torch._scaled_mm`): a8 (M x K) and b8 (N x K), both
    row-major e4m3 from `to_fp8`; K and N multiples of 16. The product is computed in e4m3 with fp32
    accumulation and written in `out_dtype`."""
    return torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype)


def _cudnn_conv_switch():
    """torch.backends.cudnn.conv (torch >= 2.9, has fp32_precision), or None for the older allow_tf32 flag."""
    conv = getattr(torch.backends.cudnn, "conv", None)
    return conv if conv is not None and hasattr(conv, "fp32_precision") else None


def conv_fp32_mode() -> str:
    """How cuDNN runs fp32 convolutions now: "tf32" or "ieee" (PyTorch's default is "tf32")."""
    conv = _cudnn_conv_switch()
    if conv is not None:
        return "ieee" if conv.fp32_precision == "ieee" else "tf32"
    return "tf32" if torch.backends.cudnn.allow_tf32 else "ieee"


def matmul_fp32_mode() -> str:
    """How fp32 matrix products run now: "tf32" or "ieee" (PyTorch's default is "ieee")."""
    return "ieee" if torch.get_float32_matmul_precision() == "highest" else "tf32"


@contextlib.contextmanager
def fp32_math(mode: str) -> Iterator[None]:
    """Run a block with fp32 matmuls AND cuDNN convolutions as IEEE fp32 ("ieee") or TF32 ("tf32").

    Uses torch.backends.cudnn.conv.fp32_precision where it exists (torch >= 2.9), else the older
    torch.backends.cudnn.allow_tf32; matmuls through gpulab.core.device.float32_matmul. Both are
    restored afterwards, also after an error.
    """
    if mode not in ("ieee", "tf32"):
        raise SettingError(f"fp32 math mode {mode!r}: allowed values are 'ieee', 'tf32'.")
    conv = _cudnn_conv_switch()
    if conv is not None:
        before = conv.fp32_precision
        conv.fp32_precision = mode
    else:
        before = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = mode == "tf32"
    try:
        with float32_matmul(mode):
            yield
    finally:
        if conv is not None:
            conv.fp32_precision = before
        else:
            torch.backends.cudnn.allow_tf32 = before


LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def classification_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the model's logits, computed in fp32. Notebook 06."""
    return nn.functional.cross_entropy(model(x).float(), y)


def language_model_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy of a gpulab.models.gpt.GPT, in fp32. Notebooks 06 and 07."""
    return model.loss(x, y)


def make_scaler(precision: str, device: torch.device | None = None) -> torch.amp.GradScaler | None:
    """A GradScaler for fp16 (`torch.amp.GradScaler(device.type)`), None for the other precisions."""
    device = device or pick_device()
    return torch.amp.GradScaler(device.type) if SPECS[precision].scaler else None


def what_to_expect(facts: DeviceFacts | None = None) -> list[str]:
    """What mixed precision can do on this device, and why, from its architecture. Notebook 06."""
    facts = facts or device_facts()
    if facts.kind != "cuda":
        return ["No CUDA GPU: bf16 autocast runs on the CPU (fast only where the CPU has bf16 "
                "instructions, such as AVX-512 BF16 or AMX); fp16 autocast runs, slowly; TF32 does not exist. "
                "The numbers below show the code path, not what a GPU does."]
    arch, cc = facts.architecture, facts.compute_capability
    lines = []
    if facts.tensor_core_generation is None:
        lines.append(f"{arch} (compute capability {cc[0]}.{cc[1]}) has no Tensor Cores. fp16 halves the "
                     "memory of activations and the bytes moved, but its arithmetic runs on ordinary units: "
                     "at best twice fp32 (P100), and on most consumer Pascal cards fp16 arithmetic is far "
                     "slower than fp32. Expect little or no speed-up; the memory saving remains.")
    else:
        lines.append(f"{arch} (compute capability {cc[0]}.{cc[1]}) has generation-"
                     f"{facts.tensor_core_generation} Tensor Cores: matrix products and convolutions in "
                     "fp16 run several times faster than in fp32. Layers limited by memory traffic "
                     "(normalization, activations, the optimizer) gain at most 2x from 16-bit data.")
    if not facts.tf32:
        lines.append("No TF32 and no bf16 here: both arrived with Ampere (8.0). fp16 with a GradScaler "
                     "is the mixed precision this GPU runs; tf32 and bf16 are refused below.")
    else:
        lines.append("TF32 (fp32 tensors, Tensor Core math with a 10-bit mantissa) speeds up fp32 code "
                     "without changing the model; bf16 has fp32's exponent range, so it needs no scaler.")
    if facts.fp8:
        lines.append("This GPU also has FP8 Tensor Cores (Ada, Hopper, Blackwell); training in FP8 needs "
                     "per-tensor scaling (torchao's float8 training, NVIDIA Transformer Engine): notebook 13 "
                     "measures from which product sizes it beats bf16 here.")
    return lines
