"""Number formats for training: fp32, TF32, fp16 with a GradScaler, bf16. Introduced in notebook 06; used in 07 and 13.

- `SPECS`, `refusal`, `check`, `supported`, `best_half`, `half_dtype`: the four precisions, and why this
  device cannot run one (bf16 only where the GPU has it natively).
- `fp32_math(mode)`: fp32 matrix products AND convolutions as IEEE fp32 ("ieee") or on TF32
  Tensor Cores ("tf32"); both switches are restored afterwards.
- `make_scaler`, `classification_loss`, `language_model_loss`: what `models.step.train_step` takes.
- FP16 / BF16 / FP32: the limits of each format, from `torch.finfo`.
- `fp8_refusal`, `to_fp8`, `fp8_matmul`: e4m3 products with one scale per tensor (Ada, Hopper and newer;
  notebook 13's FP8 section); `to_fp8_training` / `Fp8Linear`: a model's linear layers trained in FP8, all
  three products of each (e4m3 inputs and weights, e5m2 gradients), as torchao's tensorwise recipe does
  (notebook 13's `fp8` toggle).

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
    its rounding alone moves the parameters (`gpulab.diagnose.suite.same_model`)."""
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
# Gradients in FP8 training: e5m2 (5 exponent bits, 2 mantissa bits, largest 57344), the wider range that
# torchao's tensorwise recipe gives the output's gradient (one scale per tensor drops e4m3 entries under about
# amax x 4e-6, e5m2 ones under about amax x 3e-10)
FP8_GRAD_DTYPE = getattr(torch, "float8_e5m2", None)
# The FP8 product against the product of its own dequantized inputs ((a8 sa) @ (b8 sb).T in fp32): what
# the kernel adds, its bf16 output's rounding and its accumulation: 1.7e-3 measured (n = 64 to 512, torch
# 2.13 on the CPU). A wrong scale, a transposed operand or a kernel bug gives far more.
FP8_KERNEL_TOLERANCE = 1e-2
# The FP8 product against fp32 on the original inputs: e4m3 keeps 3 mantissa bits, and per-tensor scaling
# of normal inputs rounded each input by 2.7 % (RMS) and the product by 3.7 % (about sqrt(2) x 2.7 %), same
# measurement. More than 6 % means the inputs were not scaled as `to_fp8` scales them.
FP8_TOLERANCE = 0.06
# A gradient product in FP8 training (an e5m2 gradient against an e4m3 input or weight, `Fp8LinearFunction`)
# against fp32: e5m2 keeps 2 mantissa bits, and the products came out 5.8 to 5.9 % off (n = 64 to 512, normal
# data, torch 2.13 on the CPU).
FP8_GRAD_TOLERANCE = 0.09


def fp8_refusal(facts: DeviceFacts | None = None, device: torch.device | None = None) -> str | None:
    """Why this device cannot run FP8 matrix products (`fp8_matmul`), or None if it can: no FP8 Tensor
    Cores before Ada (8.9), and a 16 x 16 probe product must run (PyTorch builds without FP8 kernels, for
    Windows or ROCm's other FP8 format, refuse it). On the CPU, PyTorch runs them slowly, for the code path:
    the CPU is not refused, its timings are not a GPU's."""
    if FP8_DTYPE is None or not hasattr(torch, "_scaled_mm"):
        return f"this PyTorch ({torch.__version__}) has no float8_e4m3fn or torch._scaled_mm"
    facts = facts or device_facts()
    if facts.kind == "cuda" and not facts.fp8:
        cc = facts.compute_capability or (0, 0)
        return (f"this {facts.architecture} GPU (compute capability {cc[0]}.{cc[1]}) has no FP8 Tensor Cores: "
                "they arrived with Ada (8.9) and Hopper (9.0)")
    device = device or pick_device()
    try:
        x8, s = to_fp8(torch.ones(16, 16, device=device))
        fp8_matmul(x8, s, x8, s)
    except (RuntimeError, NotImplementedError) as err:
        return f"this PyTorch cannot run an FP8 product here ({type(err).__name__}: {str(err).splitlines()[0]})"
    return None


def to_fp8(x: torch.Tensor, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`x` in e4m3 (or `dtype`, e.g. FP8_GRAD_DTYPE) with one scale for the whole tensor, recomputed at every
    call ("dynamic" scaling, as torchao's float8 training does by default): scale = amax / the format's
    largest (448 for e4m3), so the largest element lands on it; returns (x8, scale), x ~ x8 * scale. Eager,
    it is several kernels (abs, max, divide, clamp, cast), each a pass over x; compiled, two: the amax,
    then one pass that scales and casts."""
    dtype = dtype or FP8_DTYPE
    largest = torch.finfo(dtype).max
    scale = (x.detach().abs().amax().float() / largest).clamp(min=1e-12)
    return (x.float() / scale).clamp(-largest, largest).to(dtype), scale


def fp8_matmul(a8: torch.Tensor, sa: torch.Tensor, b8: torch.Tensor, sb: torch.Tensor,
               out_dtype: torch.dtype = torch.bfloat16, fast_accum: bool = True) -> torch.Tensor:
    """(a8 * sa) @ (b8 * sb).T on FP8 Tensor Cores (`torch._scaled_mm`): a8 (M x K) and b8 (N x K), both
    row-major e4m3 from `to_fp8` (so b8.T is the column-major operand the kernel needs); K and N multiples of
    16; fp32 accumulation, the result in `out_dtype`. `fast_accum`: Hopper's faster accumulation, which
    torchao's float8 training uses for the forward product (not for the two gradient products)."""
    if not (a8.is_contiguous() and b8.is_contiguous()):
        raise ValueError("fp8_matmul takes row-major (contiguous) a8 and b8")
    if a8.shape[1] != b8.shape[1] or a8.shape[1] % 16 or b8.shape[0] % 16:
        raise ValueError(f"fp8_matmul needs a8 (M x K), b8 (N x K) with K and N multiples of 16 "
                         f"(got {tuple(a8.shape)} and {tuple(b8.shape)})")
    return torch._scaled_mm(a8, b8.t(), scale_a=sa, scale_b=sb, out_dtype=out_dtype, use_fast_accum=fast_accum)


class Fp8LinearFunction(torch.autograd.Function):
    """y = x @ w.T + b with a linear layer's three products in FP8, as torchao's float8 training does them
    with its default (tensorwise) recipe: x and w cast to e4m3, the output's gradient to e5m2, each with
    one dynamic scale per tensor (`to_fp8`); the forward product with fast accumulation, the two gradient
    products without; their outputs in bf16 (the gradient of w in fp32, the weights' own dtype, and the
    gradient of x in x's dtype). The weight's gradient sums over the tokens, so a call's token count (every
    dimension of x but the last) must be a multiple of 16, as the kernel needs."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        if x2.shape[0] % 16:
            raise ValueError(f"FP8 training needs the tokens of a call (batch x sequence) to be a multiple of 16 "
                             f"(got {x2.shape[0]}): the weight's gradient sums over them on FP8 Tensor Cores")
        x8, sx = to_fp8(x2)
        w8, sw = to_fp8(w)
        y = fp8_matmul(x8, sx, w8, sw, out_dtype=torch.bfloat16, fast_accum=True)
        if b is not None:
            y = y + b.to(y.dtype)
        ctx.save_for_backward(x8, sx, w8, sw)     # the e4m3 copies: half the bytes of bf16 ones
        ctx.meta = (lead, x.dtype, w.dtype, b is not None)
        return y.reshape(*lead, w.shape[0])

    @staticmethod
    def backward(ctx, gy: torch.Tensor):
        x8, sx, w8, sw = ctx.saved_tensors
        lead, x_dtype, w_dtype, has_bias = ctx.meta
        g2 = gy.reshape(-1, gy.shape[-1]).contiguous()
        g8, sg = to_fp8(g2, FP8_GRAD_DTYPE)
        # dx = gy @ w: fp8_matmul(a, b) is a @ b.T, so b = w.T, row-major
        gx = fp8_matmul(g8, sg, w8.t().contiguous(), sw, out_dtype=torch.bfloat16, fast_accum=False)
        # dw = gy.T @ x: a = gy.T, b = x.T, both row-major (the tokens are the inner dimension)
        gw = fp8_matmul(g8.t().contiguous(), sg, x8.t().contiguous(), sx, out_dtype=torch.float32, fast_accum=False)
        gb = g2.sum(0).to(w_dtype) if has_bias else None
        return gx.reshape(*lead, -1).to(x_dtype), gw.to(w_dtype), gb


class Fp8Linear(nn.Linear):
    """An `nn.Linear` whose products run in FP8 (`Fp8LinearFunction`); its parameters stay as they are (fp32 master
    weights, AdamW updating them in fp32). `to_fp8_training` swaps them in. The tokens a call multiplies
    (every dimension but the last) must be a multiple of 16, as must in_features and out_features."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Fp8LinearFunction.apply(x, self.weight, self.bias)


def fp8_linear_refusal(linear: nn.Linear) -> str | None:
    """Why `linear` cannot run in FP8 (`fp8_matmul` needs K and N multiples of 16), or None."""
    if linear.in_features % 16 or linear.out_features % 16:
        return f"{linear.in_features} -> {linear.out_features} features: not multiples of 16"
    return None


def to_fp8_training(module: nn.Module) -> list[str]:
    """Every `nn.Linear` inside `module` whose sizes FP8 takes becomes an `Fp8Linear` in place (the same
    parameters: nothing is copied, tied weights stay tied); returns the names of those swapped. What the
    caller leaves out of `module` stays as it was (notebook 13 passes the GPT's blocks, not its head)."""
    swapped = []
    for name, child in list(module.named_modules()):
        if type(child) is nn.Linear and fp8_linear_refusal(child) is None:
            child.__class__ = Fp8Linear
            swapped.append(name)
    return swapped


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


def fp32_math_text(device: torch.device, facts: DeviceFacts | None = None) -> str:
    """How fp32 convolutions and matrix products actually run here, in a sentence: the switches say "tf32" or
    "ieee", but a GPU without TF32 (before Ampere: a T4, a V100) runs both as IEEE fp32 whatever they say, and on
    the CPU neither applies. Notebook 03."""
    switches = f"(switches: convolutions {conv_fp32_mode()}, matrix products {matmul_fp32_mode()})"
    if device.type != "cuda":
        return f"fp32 math on the CPU: neither TF32 switch applies {switches}"
    facts = facts or device_facts(device)
    if not facts.tf32:
        return (f"fp32 convolutions and matrix products run as IEEE fp32: {facts.name} has no TF32 (it came with "
                f"Ampere), whatever the switches say {switches}")
    return (f"fp32 convolutions run as: {conv_fp32_mode()} (cuDNN's default); fp32 matrix products as: "
            f"{matmul_fp32_mode()}")


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


def _datasheet_speedups(facts: DeviceFacts):
    """(16-bit / fp32 (least, most), tf32 / fp32, the datasheet) of this GPU's datasheet (under a GPU profile the
    profile's; gpulab.core.specs: bf16 where native, else fp16, both with fp32 accumulation, and on a
    power-capped board the least at its power limit: `Datasheet.half_ratio_range`, the rates its class's bands
    are derived from), Nones where it is not in the table."""
    sheet = facts.datasheet
    if sheet is None or not sheet.fp32:
        return None, None, None
    return sheet.half_ratio_range(facts.bf16), (sheet.tf32 / sheet.fp32 if sheet.tf32 else None), sheet


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
        half_range, tf32_x, sheet = _datasheet_speedups(facts)
        from_ = sheet.source if sheet is not None else ""
        if half_range is not None:
            whose = f"the {facts.profile} profile's datasheet" if facts.profile else "this GPU's datasheet"
            least, most = half_range
            rate = f"about {most:.2g}x fp32's rate on {whose} ({from_})"
            if least < most:         # a power-capped board (gpulab.core.specs.POWER_CAPPED_HALF_SHARE)
                rate += (f", but a {sheet.board_w:g} W board cannot hold that under a long product: a T4 held about "
                         f"{100 * sheet.sustained_half(facts.bf16) / sheet.half(facts.bf16):.0f}% of its 16-bit peak "
                         f"at its power limit, so expect between {least:.2g}x and {most:.2g}x")
        elif facts.geforce:
            rate = ("about twice fp32's rate (four times on Turing), as on the GeForce cards NVIDIA's Turing, Ampere "
                    "GA102 and Ada whitepapers list (16-bit products with fp32 accumulation, what PyTorch uses, at half "
                    "the data-centre parts' rate)")
        else:
            rate = "several times fp32's rate on a data-centre part (this GPU is not in gpulab.core.specs)"
        lines.append(f"{arch} (compute capability {cc[0]}.{cc[1]}) has generation-"
                     f"{facts.tensor_core_generation} Tensor Cores: 16-bit matrix products and convolutions run "
                     f"at {rate}; notebook 00 measured what they reach here. Layers limited by memory traffic "
                     "(normalization, activations, the optimizer) gain at most 2x from 16-bit data, so a whole "
                     "step gains less than its products.")
    if not facts.tf32:
        lines.append("No TF32 and no bf16 here: both arrived with Ampere (8.0). fp16 with a GradScaler "
                     "is the mixed precision this GPU runs; tf32 and bf16 are refused below.")
    else:
        if tf32_x is not None and tf32_x < 1.5:
            tf32 = (f"runs here at {tf32_x:.2g}x the fp32 rate ({from_}), so it hardly speeds up fp32 code; ")
        elif tf32_x is not None:
            tf32 = f"runs here at {tf32_x:.2g}x the fp32 rate ({from_}) without changing the model's code; "
        elif facts.geforce:
            tf32 = "runs at about the fp32 rate on GeForce cards (NVIDIA's whitepapers), so it hardly helps there; "
        else:
            tf32 = "speeds up fp32 products on a data-centre part without changing the model's code; "
        lines.append("TF32 (fp32 tensors, Tensor Core math with a 10-bit mantissa) " + tf32 +
                     "bf16 has fp32's exponent range, so it needs no scaler.")
    if facts.fp8:
        lines.append("This GPU also has FP8 Tensor Cores (Ada, Hopper, Blackwell); training in FP8 needs "
                     "scaling (per tensor or per row: torchao's float8 training, NVIDIA Transformer Engine): notebook 13 "
                     "measures from which product sizes it beats bf16 here.")
    return lines
