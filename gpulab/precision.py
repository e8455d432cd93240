"""Number formats for training: fp32, TF32, fp16 with a GradScaler, bf16. Introduced in notebook 06; used in 07.

- `SPECS`, `refusal`, `check`, `supported`: the four precisions, and why this device cannot run one.
- `fp32_math(mode)`: fp32 matrix products AND convolutions as IEEE fp32 ("ieee") or on TF32
  Tensor Cores ("tf32"); both switches are restored afterwards.
- `amp_step`: one optimizer step under autocast (the GradScaler for fp16, gradient accumulation,
  CUDA-graph step marks); `train_step`: the same for a model in one of the four precisions.
- `Workload`, `first_loss`, `train_curve`, `precision_run`: the same model, weights and data
  trained in each precision: loss curve, then time and peak memory.
- `unscaled_gradients`, `lost_fraction`: fp16's underflow made countable.
- `gemm_experiment`: TFLOP/s of one matrix product, checked against fp32 before it is timed.
- FP16 / BF16 / FP32: the limits of each format, from `torch.finfo`.

PyTorch's defaults differ between the two switches: since PyTorch 1.12, fp32 matrix products
do not use TF32 unless asked, while cuDNN convolutions do. `fp32_math("ieee")` turns both off.
"""
from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import nn

from gpulab.device import DeviceFacts, SettingError, device_facts, float32_matmul, pick_device
from gpulab.timing import benchmark


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


def best_half(facts: DeviceFacts | None = None) -> str:
    """The 16-bit precision to train in here: bf16 where it is native (and on the CPU), else fp16."""
    facts = facts or device_facts()
    return "bf16" if facts.bf16 else "fp16"


def half_dtype(facts: DeviceFacts | None = None) -> torch.dtype:
    """`best_half`'s dtype: torch.bfloat16 where bf16 is native (and on the CPU), else torch.float16."""
    return SPECS[best_half(facts)].dtype


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
    torch.backends.cudnn.allow_tf32; matmuls through gpulab.device.float32_matmul. Both are
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
    """Next-token cross-entropy of a gpulab.workloads.GPT, in fp32. Notebooks 06 and 07."""
    return model.loss(x, y)


def make_scaler(precision: str, device: torch.device | None = None) -> torch.amp.GradScaler | None:
    """A GradScaler for fp16 (`torch.amp.GradScaler(device.type)`), None for the other precisions."""
    device = device or pick_device()
    return torch.amp.GradScaler(device.type) if SPECS[precision].scaler else None


def amp_step(loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], optimizer: torch.optim.Optimizer,
             x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype | None = None,
             scaler: torch.amp.GradScaler | None = None, accumulation: int = 1, graphs: bool = False) -> torch.Tensor:
    """One optimizer step on the batch (x, y), fp32 matrix products as they are set now; returns the
    mean loss (detached). Notebooks 06 (through `train_step`) and 13.

    - `dtype` (torch.float16 or torch.bfloat16): the forward and the loss run under autocast in it.
    - `scaler` (fp16; `make_scaler("fp16")`): the loss is multiplied by the scale before backward, so
      small gradients stay above fp16's smallest number, and divided out again (in fp32) before the
      optimizer uses them; a step whose gradients hold inf or nan is skipped.
    - `accumulation` (lesson 10): the batch is split into that many equal micro-batches, each one's
      loss divided by their number and backpropagated, so the gradients add up to the whole batch's.
    - `graphs` (torch.compile's "reduce-overhead" mode): each micro-batch starts a new CUDA-graph step.
    """
    if dtype is torch.float16 and scaler is None:
        raise ValueError("fp16 training needs a GradScaler: pass scaler=make_scaler('fp16').")
    if isinstance(accumulation, bool) or not isinstance(accumulation, int) or accumulation < 1:
        raise ValueError(f"accumulation must be a whole number of micro-batches >= 1 (got {accumulation!r}).")
    optimizer.zero_grad(set_to_none=True)
    total = None
    for xs, ys in zip(x.chunk(accumulation), y.chunk(accumulation)):
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        with torch.amp.autocast(x.device.type, dtype=dtype, enabled=dtype is not None):
            loss = loss_of(xs, ys)                    # matmuls and convolutions in 16-bit under autocast
        if accumulation > 1:
            loss = loss / accumulation
        # Kept as a copy where a CUDA-graph replay, or the next micro-batch, reuses the output's memory.
        part = loss.detach().clone() if graphs or accumulation > 1 else loss.detach()
        total = part if total is None else total + part
        (scaler.scale(loss) if scaler is not None else loss).backward()
    if scaler is not None:
        scaler.step(optimizer)                        # unscale; skip the step if a gradient is inf/nan
        scaler.update()                               # grow the scale, or halve it after an overflow
    else:
        optimizer.step()
    return total


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
               loss_fn: LossFn, precision: str = "fp32",
               scaler: torch.amp.GradScaler | None = None) -> torch.Tensor:
    """One optimizer step of `model` in `precision` (`amp_step` under that precision's fp32 math);
    returns the loss (detached). Notebook 06. fp16 needs `scaler` (make_scaler("fp16"))."""
    spec = SPECS[precision]
    if spec.scaler and scaler is None:
        raise ValueError("fp16 training needs a GradScaler: pass scaler=make_scaler('fp16').")
    with fp32_math(spec.fp32_mode):
        return amp_step(lambda xs, ys: loss_fn(model, xs, ys), optimizer, x, y, spec.dtype, scaler)


class LossCurve(tuple):
    """Losses of consecutive training steps; `skipped`: steps the GradScaler skipped (inf/nan gradients)."""

    skipped: int = 0

    def __new__(cls, losses, skipped: int = 0):
        curve = super().__new__(cls, losses)
        curve.skipped = skipped
        return curve

    def window(self, n: int) -> float:
        """Mean of the last n losses."""
        tail = self[-n:]
        return sum(tail) / len(tail)

    def __str__(self) -> str:
        skipped = f", {self.skipped} skipped" if self.skipped else ""
        return f"{len(self)} steps: {self[0]:.3g} -> {self[-1]:.3g}{skipped}"


@dataclass
class Workload:
    """A model with its starting weights, its data and its optimizer, so that every precision
    starts from the same point. Notebook 06.

    `batches(b)` makes a list of (x, y) batches of size b on the model's device; `optimizer(model)`
    a fresh optimizer; `unit` names the throughput (e.g. "img/s") and `items` how many of those
    one sample counts (1 image, or seq tokens).
    """

    name: str
    model: nn.Module
    batches: Callable[[int], list]
    loss_fn: LossFn
    optimizer: Callable[[nn.Module], torch.optim.Optimizer]
    unit: str
    items: int = 1
    init: dict = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.init = {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    def reset(self) -> torch.optim.Optimizer:
        """Back to the starting weights (and BatchNorm statistics); returns a fresh optimizer."""
        self.model.load_state_dict(self.init)
        self.model.zero_grad(set_to_none=True)
        return self.optimizer(self.model)


# Largest accepted relative difference of the starting weights' loss in each precision to fp32's
# (notebook 06, section 6, and gpulab bench): 16-bit products round each input to 8 (bf16) or
# 11 (fp16) significant bits, TF32 to 11.
FIRST_LOSS_TOLERANCE = {"fp32": 0.0, "tf32": 1e-2, "fp16": 1e-2, "bf16": 2e-2}


def step_peak(work: Workload, batch: int, precision: str = "fp32") -> int | None:
    """Peak memory (bytes) of one training step of `work` from its starting weights at `batch` in
    `precision`; None on the CPU. Notebook 06 (what `workloads.fit_batch` probes) and gpulab bench."""
    from gpulab.memory import track_peak

    optimizer = work.reset()
    x, y = work.batches(batch)[0]
    with track_peak() as mem:
        train_step(work.model, optimizer, x, y, work.loss_fn, precision, make_scaler(precision, x.device))
    work.model.zero_grad(set_to_none=True)
    return mem.peak


def first_loss(work: Workload, x: torch.Tensor, y: torch.Tensor, precision: str) -> float:
    """The loss of the starting weights on (x, y) in `precision`, forward only. Notebook 06."""
    spec = check(precision)
    work.reset()
    with torch.no_grad(), fp32_math(spec.fp32_mode):
        with torch.amp.autocast(x.device.type, dtype=spec.dtype, enabled=spec.dtype is not None):
            return work.loss_fn(work.model, x, y).item()


def train_curve(model: nn.Module, optimizer: torch.optim.Optimizer, batches: list, loss_fn: LossFn,
                precision: str, scaler: torch.amp.GradScaler | None, steps: int) -> LossCurve:
    """`steps` training steps cycling through `batches`; the loss of each, and the steps the
    scaler skipped (its scale went down). Notebook 06."""
    losses, skipped = [], 0
    for i in range(steps):
        scale = scaler.get_scale() if scaler is not None else None
        x, y = batches[i % len(batches)]
        losses.append(train_step(model, optimizer, x, y, loss_fn, precision, scaler).item())
        if scaler is not None and scaler.get_scale() < scale:
            skipped += 1
    return LossCurve(losses, skipped)


def precision_run(work: Workload, precision: str, batch: int, steps: int, repeat: int = 10,
                  warmup: int = 2) -> dict[str, Any]:
    """Train `work` from its starting weights in `precision`: the loss curve over `steps` steps,
    then `repeat` timed steps (after `warmup`) and their peak memory. Notebook 06.

    Returns {unit: throughput, "ms per step": Timing, "peak (GiB)": float or a note on the CPU,
    "loss curve": LossCurve}. A precision this device cannot run raises ValueError.
    """
    from gpulab.memory import GiB, track_peak

    check(precision)
    optimizer = work.reset()
    scaler = make_scaler(precision, next(work.model.parameters()).device)
    batches = work.batches(batch)
    try:
        curve = train_curve(work.model, optimizer, batches, work.loss_fn, precision, scaler, steps)
        cycle = itertools.cycle(batches)
        with track_peak() as mem:
            t = benchmark(lambda: train_step(work.model, optimizer, *next(cycle), work.loss_fn, precision, scaler),
                          warmup=warmup, repeat=repeat)
    finally:
        work.model.zero_grad(set_to_none=True)      # also after an error: give the gradients back
    return {work.unit: t.per_second(batch * work.items), "ms per step": t,
            "peak (GiB)": "not measured on the CPU" if mem.peak is None else mem.peak / GiB,
            "loss curve": curve}


def unscaled_gradients(model: nn.Module, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn,
                       precision: str = "fp32", weight: float = 1.0, scale: float | None = None) -> torch.Tensor:
    """All parameter gradients of `weight x loss`, flattened into one fp32 vector. Notebook 06.

    Under fp16 or bf16 the forward runs in autocast, so backward computes in 16-bit. With
    `scale`, a GradScaler(init_scale=scale) scales the loss before backward and `unscale_`
    divides the gradients in fp32 afterwards, as in training; without it nothing is scaled.
    """
    spec = SPECS[precision]
    model.zero_grad(set_to_none=True)
    scaler = None
    if scale is not None:
        scaler = torch.amp.GradScaler(x.device.type, init_scale=scale)
    with fp32_math(spec.fp32_mode):
        with torch.amp.autocast(x.device.type, dtype=spec.dtype, enabled=spec.dtype is not None):
            loss = weight * loss_fn(model, x, y)
        if scaler is None:
            loss.backward()
        else:
            scaler.scale(loss).backward()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.0)   # unscale_ works per optimizer
            scaler.unscale_(optimizer)
    grads = torch.cat([p.grad.detach().float().flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    return grads


def lost_fraction(grads: torch.Tensor, reference: torch.Tensor) -> float:
    """Share of the gradient entries that are non-zero in `reference` but exactly zero in `grads`."""
    alive = reference != 0
    lost = (grads == 0) & alive
    return lost.sum().item() / max(alive.sum().item(), 1)


def gemm_experiment(n: int = 4096, precision: str = "bf16", m: int | None = None, k: int | None = None,
                    repeat: int = 20, max_cpu_size: int = 2048) -> dict:
    """TFLOP/s of C = A @ B, A of m x k and B of k x n (m = k = n unless given). Notebook 07.

    The product is first checked against the same inputs multiplied in fp32 with TF32 off
    (relative error within GEMM_TOLERANCE); a wrong result raises. 2 m n k operations.
    """
    m, k = m or n, k or n
    if min(m, n, k) < 16 or max(m, n, k) > 65536:
        raise ValueError(f"sizes must be between 16 and 65536 (got m={m}, n={n}, k={k}).")
    spec = check(precision)
    device = pick_device()
    if device.type != "cuda" and max(m, n, k) > max_cpu_size:
        raise ValueError(f"on the CPU this lesson stops at {max_cpu_size} (got {max(m, n, k)}): "
                         "larger products take minutes there and say nothing about a GPU.")
    dtype = spec.dtype or torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(m, k, generator=g, device=device).to(dtype)
    b = torch.randn(k, n, generator=g, device=device).to(dtype)
    with fp32_math(spec.fp32_mode):
        c = a @ b
    with fp32_math("ieee"):
        ref = a.float() @ b.float()
    err = (torch.linalg.norm(c.float() - ref) / torch.linalg.norm(ref)).item()
    del c, ref
    if not err <= GEMM_TOLERANCE[precision]:
        raise AssertionError(f"{precision} product of {m}x{k} @ {k}x{n} is wrong: relative error "
                             f"{err:.2e} > {GEMM_TOLERANCE[precision]:.0e}")
    with fp32_math(spec.fp32_mode):
        t = benchmark(lambda: a @ b, warmup=3, repeat=repeat)
    del a, b
    return {"TFLOP/s": t.per_second(2 * m * n * k) / 1e12, "ms": t, "rel. error": err}


def alignment(n: int, element_bytes: int = 2) -> int:
    """The largest power of two, up to 256 bytes, that divides a row of n elements: 2 for n = 4095 in fp16,
    256 for n = 4096. Tensor Core kernels want at least 16 bytes."""
    row = n * element_bytes
    a = 1
    while a < 256 and row % (2 * a) == 0:
        a *= 2
    return a


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
                     "per-tensor scaling (e.g. NVIDIA Transformer Engine) and is not covered here.")
    return lines
