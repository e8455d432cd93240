"""FP8 in notebook 13 (sections 13 and 14b), where the GPU has FP8 Tensor Cores (Ada, Hopper and newer).
`fp8_crossover`: single n x n x n products in bf16 and in FP8 (e4m3, one scale per tensor), each checked against
its own dequantized inputs' product and against fp32, then timed in turns, alone and with the scaling of its
inputs; `crossover` finds the size from which FP8 stays faster, `fp8_table` shows the rows. `fp8_gradients`:
before the FP8 GPT step is timed, its block weight gradients against bf16's on one batch."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Sequence

import torch

from gpulab.core.device import pick_device
from gpulab.core.memory import memory_guard
from gpulab.core.timing import interleaved
from gpulab.lessons.capstone.jobs import JOBS, job_config
from gpulab.lessons.capstone.knobs import ALIGN, config
from gpulab.lessons.capstone.options import Options
from gpulab.lessons.capstone.runner import run_context
from gpulab.models import precision as P
from gpulab.models.gpt import padded_copy


# -- FP8 in the step: its gradients first ------------------------------------------------------------
# The worst relative difference of a block weight's gradient, FP8 against bf16 from the same weights on one
# batch (`fp8_gradients`). e4m3 inputs and e5m2 gradients gave 8 % (2 blocks, 64 wide) and 10 % (6 blocks,
# 256 wide) on the CPU (torch 2.13); a zero, transposed or mis-scaled gradient gives 50 % and more. The loss
# check cannot tell: two AdamW updates moved the tiny GPT's loss by 1.4 %, and zeroing every FP8 weight
# gradient changed it by 0.2 % (tests/lessons/test_l13_capstone.py, zeroing_every_fp8_weight_gradient).
FP8_GRAD_CHECK = 0.3


def fp8_gradients(options: Options, batch: int = 2, *, config: dict | None = None, scale: str | None = None,
                  seed: int = 0, device: torch.device | None = None) -> float:
    """The worst relative difference (norm of the difference over the bf16 gradient's norm) between the GPT's
    block weight gradients with `options` (fp8 on) and with the same options without fp8: the same weights
    (seed `seed`), one batch of `batch` sequences, one backward each, eager. Inside `run_context`: refused with its
    reason where `options` cannot run here, GPU memory back where it was."""
    if not options.fp8:
        raise ValueError("fp8_gradients compares a run with fp8 on against the same without it: switch fp8 on")
    device = device or pick_device()
    cfg = dict(config or job_config("gpt", scale))
    with run_context("gpt", options, batch, device):
        torch.manual_seed(seed)
        model = JOBS["gpt"].build(cfg, device)
        if options.aligned:
            model = padded_copy(model, ALIGN)
        fp8 = copy.deepcopy(model)
        P.to_fp8_training(fp8.blocks)
        x, y = JOBS["gpt"].batches(model, batch, 1)[0]
        for m in (model, fp8):
            with torch.autocast(device.type, dtype=torch.bfloat16):
                JOBS["gpt"].loss_fn(m, x, y).backward()
        worst = 0.0
        for (name, p), (_, q) in zip(model.blocks.named_parameters(), fp8.blocks.named_parameters()):
            if p.dim() == 2:
                worst = max(worst, ((q.grad - p.grad).norm() / p.grad.norm().clamp(min=1e-30)).item())
        del model, fp8, x, y
    return worst


# -- FP8: from which size it beats bf16 --------------------------------------------------------------
FP8_ROUNDS = 4          # interleaved rounds (bf16 and the FP8 variants, in turns) per size
FP8_MARGIN = 1.05       # FP8 counts as faster from 5 % up: a ratio of two medians of a dozen samples each moves by a few %
FP8_DATASHEET_SHARE = 0.6   # the self-check: the largest FP8 product reaches this share of the datasheet's FP8 / bf16


@dataclass
class Fp8Row:
    """One n x n x n product in bf16 and in FP8 (e4m3, one scale per tensor): TFLOP/s of each, and the
    errors against fp32."""

    n: int
    bf16_tflops: float
    fp8_tflops: float               # the FP8 product alone, its inputs already in e4m3 (the Tensor Cores' rate)
    fp8_eager_tflops: float         # with both inputs scaled and cast first by `to_fp8`, eager (several kernels each)
    fp8_compiled_tflops: float | None   # the same with `to_fp8` compiled (two kernels each); None where not compiled
    fp8_error: float                # FP8 product against fp32 on the same bf16 inputs: e4m3's rounding
    bf16_error: float               # bf16 product against the same

    @property
    def speedup(self) -> float:
        return self.fp8_tflops / self.bf16_tflops

    @property
    def scaling(self) -> str:
        """Which scaling was faster here: "compiled" or "eager" (only eager where none was compiled)."""
        return "compiled" if (self.fp8_compiled_tflops or 0.0) > self.fp8_eager_tflops else "eager"

    @property
    def scaled_speedup(self) -> float:
        """With its scaling, the faster of the compiled and the eager one: what FP8 training pays per product
        when its scaling is done as well as this run managed."""
        best = self.fp8_compiled_tflops if self.scaling == "compiled" else self.fp8_eager_tflops
        return best / self.bf16_tflops


def fp8_crossover(sizes: Sequence[int] | None = None, rounds: int = FP8_ROUNDS, compiled: bool | None = None) -> list[Fp8Row]:
    """bf16 against FP8 products (`precision.fp8_matmul`) at each n of `sizes` (default: the scale's
    `fp8_sizes`, multiples of 16): A (n x n) @ W.T (n x n), the layout of a linear layer. Each FP8 product is
    first checked against the product of its own dequantized inputs (`precision.FP8_KERNEL_TOLERANCE`) and
    against fp32 (`precision.FP8_TOLERANCE`), AssertionError if not; then the variants are timed in turns
    (`timing.interleaved`): bf16, the FP8 product alone, and with its inputs' scaling, eager and (`compiled`,
    by default on a GPU) through torch.compile. ValueError where this device has no FP8 (`precision.fp8_refusal`)."""
    why = P.fp8_refusal()
    if why:
        raise ValueError(why)
    sizes = tuple(config()["fp8_sizes"] if sizes is None else sizes)
    if not sizes or any(n < 16 or n % 16 for n in sizes):
        raise ValueError(f"sizes must be multiples of 16, at least 16 (got {sizes})")
    device = pick_device()
    compiled = device.type == "cuda" if compiled is None else compiled
    # static shapes, compiled afresh for each n. With one compile reused across sizes, the compiled scaling ran
    # slower than the eager one from n = 4096 up on the H200 (588 against 741 TFLOP/s at 16384; 2026-12-02,
    # results/course/2026-12-02-h200-00-13), its overhead at a near-constant ~0.3 TB/s whatever n: the signature of
    # a kernel with a fixed number of blocks. The likely cause: the compile turns dynamic at the second size
    # and keeps the amax's split chosen from that compile's size hint (what pytorch/pytorch#155941 addresses,
    # with an opt-in minimum split). Not confirmed by inductor's output code; a static compile per size avoids it
    to_fp8_compiled = torch.compile(P.to_fp8, dynamic=False) if compiled else None
    rows = []
    with memory_guard(device=device):
        try:
            for n in sizes:
                rows.append(_fp8_row(n, device, rounds, to_fp8_compiled))
                if compiled:
                    torch.compiler.reset()
        finally:
            if compiled:
                torch.compiler.reset()
    return rows


def _fp8_row(n: int, device: torch.device, rounds: int, to_fp8_compiled) -> Fp8Row:
    g = torch.Generator(device=device).manual_seed(n)
    a = torch.randn(n, n, device=device, generator=g, dtype=torch.bfloat16)
    w = torch.randn(n, n, device=device, generator=g, dtype=torch.bfloat16)
    a8, sa = P.to_fp8(a)
    w8, sw = P.to_fp8(w)
    out = P.fp8_matmul(a8, sa, w8, sw).float()
    rel = lambda c, ref: float(torch.linalg.norm(c - ref) / torch.linalg.norm(ref))
    with P.fp32_math("ieee"):
        kernel_err = rel(out, (a8.float() * sa) @ (w8.float() * sw).t())
        ref = a.float() @ w.float().t()
    fp8_err, bf16_err = rel(out, ref), rel((a @ w.t()).float(), ref)
    del out, ref
    if not kernel_err <= P.FP8_KERNEL_TOLERANCE:
        raise AssertionError(f"the FP8 product of {n} x {n} is wrong: relative error {kernel_err:.2e} against its own "
                             f"dequantized inputs' product, more than {P.FP8_KERNEL_TOLERANCE:.0e} (a scale or an operand's layout)")
    if not fp8_err <= P.FP8_TOLERANCE:
        raise AssertionError(f"the FP8 product of {n} x {n} is off by {fp8_err:.2e} against fp32, more than "
                             f"{P.FP8_TOLERANCE} (e4m3's rounding of scaled inputs gives about 4e-2): the inputs "
                             "were not scaled as to_fp8 scales them")
    variants = {"bf16": lambda: a @ w.t(),
                "fp8": lambda: P.fp8_matmul(a8, sa, w8, sw),
                "fp8 eager scaling": lambda: P.fp8_matmul(*P.to_fp8(a), *P.to_fp8(w))}
    if to_fp8_compiled is not None:
        variants["fp8 compiled scaling"] = lambda: P.fp8_matmul(*to_fp8_compiled(a), *to_fp8_compiled(w))
    t = interleaved(variants, rounds=rounds, repeat=3, warmup=2)
    rate = lambda name: t[name].per_second(2 * n ** 3) / 1e12 if name in t else None
    return Fp8Row(n, rate("bf16"), rate("fp8"), rate("fp8 eager scaling"), rate("fp8 compiled scaling"), fp8_err, bf16_err)


def crossover(rows: Sequence[Fp8Row], scaled: bool = True, margin: float = FP8_MARGIN) -> int | None:
    """The smallest n from which FP8 (with its scaling, or the product alone) is at least `margin` x bf16 at
    every larger size measured; None if it is not at the largest."""
    found = None
    for r in sorted(rows, key=lambda r: -r.n):
        if (r.scaled_speedup if scaled else r.speedup) >= margin:
            found = r.n
        else:
            break
    return found


def fp8_table(rows: Sequence[Fp8Row], on_gpu: bool) -> None:
    """Notebook 13's table of `fp8_crossover`'s rows, and its plot (TFLOP/s against n, both axes log)."""
    from gpulab.core import plots
    from IPython.display import HTML, display
    f = lambda v: "-" if v is None else v
    display(HTML(plots.table_html([(r.n, r.bf16_tflops, r.fp8_tflops, r.fp8_eager_tflops, f(r.fp8_compiled_tflops),
                        f"{r.speedup:.2f}x", f"{r.scaled_speedup:.2f}x", f"{r.fp8_error:.1e}", f"{r.bf16_error:.1e}")
                       for r in rows],
                      header=("n", "bf16 TFLOP/s", "FP8 alone", "FP8 + eager scaling", "FP8 + compiled scaling",
                              "alone / bf16", "scaled / bf16", "FP8 error", "bf16 error"),
                      notes=["scaled / bf16: with the faster of the two scalings (compiled where it ran, eager); error: "
                             "||C - C_fp32|| / ||C_fp32|| on the same bf16 inputs (FP8 rounds them to 3 mantissa bits first)"]
                      + ([] if on_gpu else ["CPU run: the code path, not a GPU's rates; no compiled scaling"]))))
    series = {"bf16": [r.bf16_tflops for r in rows], "FP8 product alone": [r.fp8_tflops for r in rows],
              "FP8 + eager scaling": [r.fp8_eager_tflops for r in rows]}
    if any(r.fp8_compiled_tflops for r in rows):
        series["FP8 + compiled scaling"] = [r.fp8_compiled_tflops for r in rows]
    plots.sweep_plot([r.n for r in rows], series, xlabel="n (an n x n x n product)", ylabel="TFLOP/s",
                     logx=True, logy=True, title="FP8 against bf16, by product size")
