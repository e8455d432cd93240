"""The GPU-side rules: kernels that could be faster (fp32 products, misaligned or transposed ones, attention by
hand, an unfused optimizer, unfused elementwise work, copies and communication not overlapped, all-reduces of
every micro-batch), with their thresholds and the reasons for them. `rules.TABLE` lists them with the host-side
rules."""
from __future__ import annotations

from gpulab.diagnose.facts import Facts
from gpulab.diagnose.verdicts import Verdict, pct, verdict

# -- thresholds ------------------------------------------------------------------------------------
# fp32 matrix products (on the CUDA cores, or TF32 Tensor Cores) above 10 % of the step: 16-bit autocast
# speeds them up (lesson 06 measures by how much on this GPU) but changes numerics, so it must be a real
# share.
FP32_GEMM_SHARE_MIN = 0.10
# An fp32 product whose FLOPs the trace does not give (a cuDNN RNN, a kernel with no shapes): the 16-bit
# Tensor Core rate is twice TF32's on the datasheets (A100 312 against 156, H100 SXM 989 against 495
# dense TFLOP/s), so 16-bit is expected to save half its time; its bound stays all of it.
UNKNOWN_FLOPS_SAVING = 0.5
# Misaligned 16-bit GEMMs above 5 %: padding a dimension to a multiple of 8 (or 64, lesson 07) is a
# one-line change, so the "worth fixing" share of the one-line fixes applies.
MISALIGNED_SHARE_MIN = 0.05
# Layout conversions (NCHW <-> NHWC) above 5 %: channels_last is two lines (lesson 07).
TRANSPOSE_SHARE_MIN = 0.05
# Attention by hand (matmul + softmax over T x T scores) above 5 %: F.scaled_dot_product_attention is one
# line (lesson 13).
ATTENTION_SHARE_MIN = 0.05
# An unfused optimizer whose phase (host and GPU) takes 5 % of the step: fused=True is one argument.
OPTIMIZER_SHARE_MIN = 0.05
# What a fused optimizer kernel takes of the unfused one's GPU time: the ratio of their passes over the
# parameters (each a read or a write of one parameter-sized tensor), counted per optimizer from torch.optim's
# multi-tensor ("foreach") code, which the single-tensor loop matches op for op:
# - AdamW: fused reads p, g, m, v and writes p, m, v: 7. Foreach: the decay's mul_(p) 2, lerp_(m, g) 3, mul_(v) 2,
#   addcmul_(v, g, g) 4, sqrt(v) 2, div_ 2, add_(eps) 2, addcdiv_(p, m, denom) 4: 21. 7/21.
# - Adam: the same without the decoupled decay: 19 (an L2 weight decay adds grad + wd p: 3 more). 7/19.
# - SGD with momentum: fused reads p, g, buf and writes p, buf: 5. Foreach: mul_(buf) 2, add_(buf, g) 3,
#   add_(p, buf) 3: 8 (weight decay or Nesterov's out-of-place add: 3 more each). 5/8.
# - SGD without momentum: fused 3, foreach add_(p, g) 3: nothing to win (weight decay: 3/6).
# Other optimizers (Adadelta, RMSprop, Adamax, NAdam, RAdam...) have no fused CUDA kernel in torch.optim: no
# verdict proposes one.
FUSED_PASSES = {"AdamW": 7, "Adam": 7}
FOREACH_PASSES = {"AdamW": 21, "Adam": 19}
PASSES_EXTRA = 3          # an out-of-place add over the parameters: weight decay (L2) or Nesterov's look-ahead
OUT_OF_PLACE_ADD = ("aten::_foreach_add", "aten::add")
MOMENTUM_OPS = ("aten::_foreach_mul_", "aten::mul_")


def fused_fraction(name: str, ops: tuple) -> tuple[float, str] | None:
    """(the fused kernel's share of the unfused optimizer's GPU time, how it was counted) for optimizer `name`,
    from the ops that queued its GPU work (`Facts.optimizer_ops`: SGD's momentum shows as a mul_ of its buffers,
    weight decay or Nesterov as an out-of-place add); None where torch.optim has no fused form of it."""
    extra = PASSES_EXTRA if any(op in OUT_OF_PLACE_ADD for op in ops) else 0
    if name == "SGD":
        momentum = any(op in MOMENTUM_OPS for op in ops)
        fused, foreach = (5, 8 + extra) if momentum else (3, 3 + extra)
        what = "SGD with momentum" if momentum else "SGD"
    elif name in FUSED_PASSES:
        fused, foreach, what = FUSED_PASSES[name], FOREACH_PASSES[name] + (extra if name == "Adam" else 0), name
    else:
        return None
    return fused / foreach, f"{what}: {fused} passes over the parameters fused, {foreach} unfused"
# Elementwise and normalization kernels above 25 % of the step, outside torch.compile: fusing them is a
# compile away (lesson 12), and a quarter of the step is where that beats the one-line fixes' 5 %.
ELEMENTWISE_SHARE_MIN = 0.25
# Communication not hidden behind compute above 10 % of the step: bucketing and overlap (DDP's
# defaults, lesson 14) restructure the backward pass, so as for launch overhead the bar is 10 %.
COMM_EXPOSED_SHARE_MIN = 0.10
# All-reduces of micro-batches before the last one (accumulation without no_sync) above 5 %: no_sync is
# one `with` (lesson 10).
NO_SYNC_SHARE_MIN = 0.05
# An exposed host<->device copy above 5 % of the step: the one-line fixes' share (a side stream, lesson 08).
COPY_EXPOSED_SHARE_MIN = 0.05


# -- GPU-side rules: kernels that could be faster --------------------------------------------------------
def _above(ms: float, flops: float, tflops: float | None) -> float:
    """What remains of `ms` beyond the time `flops` take at `tflops` (all of `ms` when unknown)."""
    if tflops and flops:
        return max(ms - flops / (tflops * 1e12) * 1e3, 0.0)
    return ms


def _ceilings(f: Facts) -> tuple[float | None, float | None]:
    """(the fastest a 16-bit product runs: the datasheet's peak where known, else the measured; the
    measured peak, what an expected gain assumes)."""
    ceiling = max(f.kernel_ceiling_tflops or 0.0, f.peak_tflops or 0.0) or None
    return ceiling, f.peak_tflops or ceiling


def fp32_matmuls(f: Facts) -> Verdict | None:
    """Matrix products and convolutions in fp32: on the CUDA cores, or as TF32 on the Tensor Cores (cuDNN
    allows TF32 for convolutions by default), at half or less of the 16-bit rate. Share: their time minus
    what their FLOPs take at the 16-bit ceiling; expected: minus what they take at this GPU's measured
    16-bit peak."""
    ms, flops = f.gemm_ms(lambda g: g.dtype == "fp32")
    if f.busy_share(ms) < FP32_GEMM_SHARE_MIN:
        return None
    ieee, _ = f.gemm_ms(lambda g: g.dtype == "fp32" and g.math == "fp32")
    tf32, _ = f.gemm_ms(lambda g: g.dtype == "fp32" and g.math == "tf32")
    ceiling, peak = _ceilings(f)
    chosen = [g for g in f.gemms if g.dtype == "fp32"]
    expected = sum(_above(g.gpu_ms, g.flops, peak) if g.flops else g.gpu_ms * UNKNOWN_FLOPS_SAVING for g in chosen)
    return verdict("fp32_matmuls", "fp32 matrix products (not 16-bit)", "06", f.busy_share(_above(ms, flops, ceiling)),
                   f"fp32 GEMMs and convolutions {ms:.3g} ms per step ({pct(f.busy_share(ms))}; threshold "
                   f"{pct(FP32_GEMM_SHARE_MIN)}): {ieee:.3g} ms on the CUDA cores, {tf32:.3g} ms as TF32 "
                   "(math mode read per kernel)",
                   "train under torch.amp.autocast('cuda', dtype=torch.bfloat16) (fp16 + GradScaler without bf16)"
                   + (", or allow TF32" if ieee > tf32 and f.tf32_supported else ""),   # no TF32 before Ampere
                   expected=f.busy_share(expected))


def misaligned_gemm(f: Facts) -> Verdict | None:
    """16-bit GEMMs with a dimension that is not a multiple of 8. Share: their time minus what their
    FLOPs take at the 16-bit ceiling: padding cannot make them faster than that. Not the products of attention
    by hand where `attention_math` fires: its fix replaces them (the fused kernel has no T x T product to pad), and
    one GEMM's time is not promised twice. On one H100 (2026-12-07, results/zoo/2026-12-07-h100-issue41/, labels-7d)
    the zoo's vit_manual_attention, whose misaligned products were its attention's (T = 197), ran 0.995x with its
    tokens padded to 200."""
    replaced = _attention_fires(f)
    chosen = lambda g: g.misaligned and not (replaced and g.attention)        # noqa: E731
    ms, flops = f.gemm_ms(chosen)
    if f.busy_share(ms) < MISALIGNED_SHARE_MIN:
        return None
    worst = max((g for g in f.gemms if chosen(g)), key=lambda g: g.gpu_ms)
    ceiling, peak = _ceilings(f)
    return verdict("misaligned_gemm", "misaligned matrix shapes (Tensor Core tiles)", "07",
                   f.busy_share(_above(ms, flops, ceiling)),
                   f"16-bit GEMMs with M, N or K not a multiple of 8: {ms:.3g} ms per step "
                   f"({pct(f.busy_share(ms))}; threshold {pct(MISALIGNED_SHARE_MIN)}), largest {worst.op} "
                   f"{list(worst.shapes)}",
                   "pad the odd dimension (vocabulary, hidden size, batch x sequence) to a multiple of 64",
                   expected=f.busy_share(_above(ms, flops, peak)))


def layout_transposes(f: Facts) -> Verdict | None:
    """cuDNN converting NCHW tensors to NHWC and back around its Tensor Core convolutions. Share: those
    kernels' time; channels_last removes them."""
    share = f.busy_share(f.transpose_ms)
    if share < TRANSPOSE_SHARE_MIN:
        return None
    return verdict("layout_transposes", "NCHW layout conversions around convolutions", "07", share,
                   f"layout conversion kernels (nchwToNhwc / nhwcToNchw) {f.transpose_ms:.3g} ms per step "
                   f"(threshold {pct(TRANSPOSE_SHARE_MIN)})",
                   "model.to(memory_format=torch.channels_last) and the inputs likewise")


def _attention_fires(f: Facts) -> bool:
    """Whether attention by hand is a share worth its one-line fix: where `attention_math` fires."""
    return f.busy_share(f.attention_math_ms) >= ATTENTION_SHARE_MIN


def attention_math(f: Facts) -> Verdict | None:
    """Attention written as matmul, softmax, matmul over a (T, T) score matrix: the scores go to memory and
    back several times. Share: those kernels' time minus their FLOPs at the 16-bit ceiling (a fused kernel
    keeps the scores on chip)."""
    ms = f.attention_math_ms
    if not _attention_fires(f):
        return None
    ceiling, peak = _ceilings(f)
    t = "x".join(str(x) for x in f.attention_shape)
    return verdict("attention_math", "attention by hand (scores materialized)", "13",
                   f.busy_share(_above(ms, f.attention_math_flops, ceiling)),
                   f"matmul + softmax over {t} scores: {ms:.3g} ms per step ({pct(f.busy_share(ms))}; threshold "
                   f"{pct(ATTENTION_SHARE_MIN)})",
                   "torch.nn.functional.scaled_dot_product_attention (Flash / memory-efficient kernels)",
                   expected=f.busy_share(_above(ms, f.attention_math_flops, peak)))


def optimizer_unfused(f: Facts) -> Verdict | None:
    """An optimizer that updates parameters with many kernels (foreach or a loop), not one fused kernel.
    Share: its phase on the host's path (its host time beyond its GPU time, at most the idle) plus its GPU
    time; expected: the GPU time a fused kernel saves (1 - `fused_fraction`: its passes over the parameters
    against the unfused ones', counted per optimizer) and GradScaler's blocked .item(), not the host part: a
    fused step runs the same Python per parameter (grouping, state) and GradScaler still checks the gradients
    for inf with its own kernels. Silent for an optimizer torch.optim has no fused kernel for. On the H200
    (2026-12-01) the zoo's fp16_gradscaler_foreach, whose foreach AdamW and unscale took 3.1 ms of host time
    per 16.9 ms step, ran 0.93x with fused=True, where counting the host part had expected 1.22x."""
    if f.optimizer_fused is None or f.optimizer_fused:
        return None
    counted = fused_fraction(f.optimizer_name, f.optimizer_ops)
    if counted is None:
        return None
    fraction, how = counted
    host_ms = (f.optimizer_host_ms + f.scaler_host_ms) * f.host_scale
    gpu_ms = f.optimizer_gpu_ms + f.scaler_gpu_ms
    exposed_host = min(max(host_ms - gpu_ms, 0.0), f.base_idle_ms)
    scaler = sum(min(ms * f.host_scale, f.base_idle_ms) for _, via, ms, _ in f.syncs if "grad_scaler" in via)
    share = f.share(exposed_host + f.busy_share(gpu_ms) * f.base_ms + scaler)
    expected = f.share(gpu_ms * (1 - fraction) + scaler)
    if expected < OPTIMIZER_SHARE_MIN:
        return None
    name = f.optimizer_name or "the optimizer"
    return verdict("optimizer_unfused", "unfused optimizer", "12", share,
                   f"{name}.step: {f.optimizer_kernels:.0f} kernels, {gpu_ms:.3g} ms on the GPU, {host_ms:.3g} ms on "
                   f"the host per step" + (" (GradScaler's unscale included: a fused optimizer folds the multiply "
                                           "into its kernel and drops the .item(); GradScaler still checks the "
                                           "gradients for inf/NaN)" if f.scaler_host_ms else "")
                   + (f"; GradScaler's .item() blocked {scaler:.3g} ms" if scaler else "")
                   + f"; a fused kernel takes {fraction:.2f} of its GPU time ({how}) (threshold "
                   f"{pct(OPTIMIZER_SHARE_MIN)})",
                   f"torch.optim.{f.optimizer_name or 'AdamW'}(..., fused=True)", expected=expected)


def elementwise_unfused(f: Facts) -> Verdict | None:
    """Elementwise and normalization kernels take a large part of the step outside torch.compile: each
    moves its tensors through memory once. A note, not a ranked fix: what fusing them buys depends on which
    of them inductor can fuse (pointwise chains: yes; cuDNN's RNN, softmax, norms and reductions are one
    pass already; code Dynamo runs eagerly, like nn.LSTM, not at all), which kernel names do not tell. On
    the H200 (2026-12-01) lstm_tuned's torch.compile bought 1.01x where half its elementwise time (the
    factor an earlier version of this rule used) predicted 1.3x, so no gain is promised: lesson 12
    measures it, and so does the diagnosis where the step exposes its model (`confirm.compiled_variant`: compiled,
    it becomes a ranked fix on what it measured). Share: their time (shown, not promised)."""
    ms = f.busy_by_class.get("elementwise_norm", 0.0)
    share = f.busy_share(ms)
    if f.compiled_regions > 0 or share < ELEMENTWISE_SHARE_MIN:
        return None
    return verdict("elementwise_unfused", "unfused elementwise work", "12", share,
                   f"elementwise and normalization kernels {ms:.3g} ms per step ({pct(share)}; threshold "
                   f"{pct(ELEMENTWISE_SHARE_MIN)}), no torch.compile'd region; what fusing them buys is not "
                   "predicted from kernel names: measure it",
                   "torch.compile the model (or the loss), which fuses chains of pointwise ops, and time both",
                   actionable=False)


def copy_not_overlapped(f: Facts) -> Verdict | None:
    """Large copies between host and GPU while no kernel runs: the copy engine could run them beside
    compute. Share: that time, at most the compute there is to hide it under."""
    compute = max(f.busy_ms - f.copy_exposed_ms, 0.0)
    share = f.busy_share(min(f.copy_exposed_ms, compute))
    if share < COPY_EXPOSED_SHARE_MIN:
        return None
    return verdict("copy_not_overlapped", "copies not overlapped with compute", "08", share,
                   f"copies of 1 MiB or more with no kernel beside them {f.copy_exposed_ms:.3g} ms per step "
                   f"(threshold {pct(COPY_EXPOSED_SHARE_MIN)})",
                   "copy the next batch on a side stream while this one trains (torch.cuda.Stream, wait_stream, "
                   "record_stream; pinned memory, non_blocking=True)")


def comm_not_overlapped(f: Facts) -> Verdict | None:
    """Collectives (NCCL) that queued work waited for. Share: that exposed time; overlapping communication
    with the backward pass can at best hide all of it."""
    share = f.busy_share(f.comm_exposed_ms)
    if share < COMM_EXPOSED_SHARE_MIN:
        return None
    return verdict("comm_not_overlapped", "communication not overlapped with compute", "14", share,
                   f"exposed communication {f.comm_exposed_ms:.3g} of {f.comm_ms:.3g} ms per step "
                   f"({pct(share)}; threshold {pct(COMM_EXPOSED_SHARE_MIN)})",
                   "let DDP overlap: gradient buckets (bucket_cap_mb), no_sync() while accumulating")


def no_sync_accumulation(f: Facts) -> Verdict | None:
    """Gradient accumulation under DDP that all-reduces every micro-batch: only the last one's all-reduce
    is needed. Share: the communication before the step's last forward."""
    share = f.busy_share(f.comm_early_ms)
    if f.ddp_forwards <= 1 or share < NO_SYNC_SHARE_MIN:
        return None
    return verdict("no_sync_accumulation", "gradient accumulation all-reducing every micro-batch", "10", share,
                   f"{f.ddp_forwards:.2g} DDP forwards per step; communication before the last one "
                   f"{f.comm_early_ms:.3g} ms per step (threshold {pct(NO_SYNC_SHARE_MIN)})",
                   "with model.no_sync(): around every micro-batch but the last")
