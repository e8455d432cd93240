"""Reference answers to notebook 06's free-text exercises (mixed precision)."""
from __future__ import annotations

from gpulab.exercises.answers import Answer


def _cnn(scale: str):
    import torch
    from gpulab.lessons.l06_mixed_precision import cnn_workload, config
    torch.manual_seed(0)                    # the notebook's starting weights
    return cnn_workload(config(scale)["cnn"])


def _ex1(scale: str) -> dict:
    from gpulab.core.device import pick_device
    from gpulab.core.memory import memory_guard
    from gpulab.lessons.l06_mixed_precision import FIRST_LOSS_TOLERANCE, config, first_loss, precision_run
    from gpulab.models.precision import best_half
    cfg = config(scale)
    on_gpu = pick_device().type == "cuda"
    half = best_half()                           # bf16 where it is native (the item's choice), else fp16
    batches = (16, 32, 128) if on_gpu else (16, 32)     # the panel stops at batch 64 on the CPU
    out: dict = {"16-bit precision": half}
    with memory_guard():
        work = _cnn(scale)
        x, y = work.batches(batches[0])[0]
        ref = first_loss(work, x, y, "fp32")
        out["first loss, relative difference to fp32"] = abs(first_loss(work, x, y, half) - ref) / abs(ref)
        out["tolerance"] = FIRST_LOSS_TOLERANCE[half]
        del x, y
        for b in batches:
            rate = {p: precision_run(work, p, b, steps=1, repeat=cfg["repeat"] if on_gpu else 3,
                                     warmup=2 if on_gpu else 1)["img/s"] for p in ("fp32", half)}
            out[f"batch {b}: {half} / fp32 img/s"] = rate[half] / rate["fp32"]
        del work
    out["device"] = pick_device().type
    return out


def _expect1(f: dict) -> str | None:
    if f["first loss, relative difference to fp32"] > f["tolerance"]:
        return f"{f['16-bit precision']}'s first loss differs from fp32's by more than {f['tolerance']:.0e}"
    if f["device"] == "cuda" and not f[f"batch 128: {f['16-bit precision']} / fp32 img/s"] > \
            f[f"batch 16: {f['16-bit precision']} / fp32 img/s"]:
        return "batch 16 gained as much from 16-bit as batch 128"
    return None


def _ex2(scale: str) -> dict:
    import itertools
    import torch
    from gpulab.core.timing import benchmark
    from gpulab.models.step import train_step
    from gpulab.core.memory import memory_guard
    from gpulab.lessons.l06_mixed_precision import config, precision_run
    from gpulab.models import precision as P
    cfg = config(scale)
    if P.refusal("tf32") is not None:
        return {"tf32": P.refusal("tf32")}
    out = {}
    with memory_guard():
        work = _cnn(scale)
        batch = cfg["cnn"]["batch"]
        before = P.conv_fp32_mode(), P.matmul_fp32_mode()
        rate = {}
        for name, precision in (("fp32 (TF32 off)", "fp32"), ("tf32 (both switches)", "tf32")):
            rate[name] = precision_run(work, precision, batch, steps=1, repeat=cfg["repeat"])["img/s"]
        # PyTorch's default: fp32 tensors, only cuDNN's convolution switch on TF32 (matmuls stay IEEE).
        # precision=None: train_step leaves the switches as set (its "fp32" would set both to IEEE)
        with P.fp32_math("ieee"):
            torch.backends.cudnn.conv.fp32_precision = "tf32"
            optimizer = work.reset()
            cycle = itertools.cycle(work.batches(batch))
            t = benchmark(lambda: train_step(work.model, *next(cycle), loss=work.loss_fn, optimizer=optimizer,
                                             precision=None), warmup=2, repeat=cfg["repeat"])
            rate["conv switch only"] = t.per_second(batch)
            work.model.zero_grad(set_to_none=True)
            del optimizer, cycle, t
        del work                  # inside the guard: the CNN, its optimizer and batches go before it reads
        out["restored"] = (P.conv_fp32_mode(), P.matmul_fp32_mode()) == before
    out |= {f"{k} img/s": v for k, v in rate.items()}
    gain = rate["tf32 (both switches)"] - rate["fp32 (TF32 off)"]
    out["share of TF32's gain from the conv switch alone"] = (
        (rate["conv switch only"] - rate["fp32 (TF32 off)"]) / gain if gain else float("nan"))
    return out


def _expect2(f: dict) -> str | None:
    if "tf32" in f:
        return None          # no TF32 on this device: nothing to compare
    if not f["restored"]:
        return "the TF32 switches were not restored afterwards"
    return None


def _ex3(scale: str) -> dict:
    import torch
    from gpulab.core.device import pick_device
    from gpulab.core.memory import memory_guard
    from gpulab.lessons.l06_mixed_precision import config, train_curve
    cfg = config(scale)
    device = pick_device()
    steps = cfg["steps"] if scale == "full" else 12
    out: dict = {}
    with memory_guard():
        work = _cnn(scale)
        batches = work.batches(8 if device.type == "cpu" else cfg["cnn"]["batch"])
        for init in (2.0**16, 2.0**24):
            optimizer = work.reset()
            scaler = torch.amp.GradScaler(device.type, init_scale=init)
            curve = train_curve(work.model, optimizer, batches, work.loss_fn, "fp16", scaler, steps)
            label = f"init_scale 2^{int(torch.log2(torch.tensor(init)).item())}"
            out[f"{label}: skipped steps"] = curve.skipped
            out[f"{label}: final scale"] = scaler.get_scale()
            out[f"{label}: last loss"] = curve[-1]
            del optimizer, scaler, curve
        work.model.zero_grad(set_to_none=True)
        del work, batches
    out["steps"] = steps
    return out


def _expect3(f: dict) -> str | None:
    import math
    s24, s16 = f["init_scale 2^24: skipped steps"], f["init_scale 2^16: skipped steps"]
    if s24 < 1:
        return "a scale of 2^24 overflowed no gradient: no step was skipped"
    if f["init_scale 2^24: final scale"] != 2.0 ** (24 - s24):
        return f"the scale ended at {f['init_scale 2^24: final scale']:g}, not 2^24 halved once per skipped step"
    if not s24 > s16:
        return "starting at 2^24 skipped no more steps than starting at 2^16"
    if not math.isfinite(f["init_scale 2^24: last loss"]):
        return "training did not recover after the skipped steps"
    return None


def _ex4(scale: str) -> dict:
    import torch
    from gpulab.core.memory import memory_guard
    from gpulab.lessons.l06_mixed_precision import config, lost_fraction, unscaled_gradients
    from gpulab.models import precision as P
    from gpulab.models.cnn import image_batches
    if P.refusal("bf16") is not None:
        return {"bf16": P.refusal("bf16")}
    with memory_guard():
        work = _cnn(scale)
        x, y = image_batches(work.model, config(scale)["underflow_batch"], count=1, seed=3)[0]   # section 8's batch
        work.reset()
        ref = unscaled_gradients(work.model, x, y, P.classification_loss, "fp32")
        again = unscaled_gradients(work.model, x, y, P.classification_loss, "fp32")
        bf16 = unscaled_gradients(work.model, x, y, P.classification_loss, "bf16")
        alive = ref != 0
        rel = ((bf16 - ref).abs() / ref.abs())[alive]
        sample = rel[torch.randperm(rel.numel(), generator=torch.Generator().manual_seed(0))[:2**20].to(rel.device)]
        out = {"entries": ref.numel(), "bf16 entries lost (zero where fp32 is not)": lost_fraction(bf16, ref),
               "median relative difference bf16 vs fp32": rel.median().item(),
               "90th percentile relative difference (2^20 entries drawn)": sample.quantile(0.9).item(),
               "whole gradient: |bf16 - fp32| / |fp32|": ((bf16 - ref).norm() / ref.norm()).item(),
               "median relative difference fp32 run twice": ((again - ref).abs() / ref.abs())[alive].median().item(),
               "bf16 unit roundoff 2^-8": 2.0 ** -8}
        del work, x, y, ref, again, bf16, rel, alive, sample
    return out


def _expect4(f: dict) -> str | None:
    if "bf16" in f:
        return None
    if f["bf16 entries lost (zero where fp32 is not)"] > 0.01:
        return "bf16 lost more than 1% of the gradient entries to zero"
    med = f["median relative difference bf16 vs fp32"]
    if not med > 10 * f["median relative difference fp32 run twice"] or not med > 2.0 ** -12:
        return "bf16's gradients were as exact as fp32's: no rounding shows"
    return None


def _ex5(scale: str) -> dict:
    import torch
    from gpulab.core.device import pick_device
    from gpulab.core.memory import memory_guard
    from gpulab.lessons.l07_tensor_core_alignment import alignment, config as config07, gemm_experiment
    from gpulab.models.precision import best_half
    half = best_half()
    with memory_guard():
        work = _cnn(scale)
        convs = [m for m in work.model.modules() if isinstance(m, torch.nn.Conv2d)]
        unaligned = sorted({c for m in convs for c in (m.in_channels, m.out_channels) if alignment(c) < 16})
        del work, convs
        cfg = config07(scale)
        a, m = cfg["aligned"], cfg["misaligned"]
        aligned = gemm_experiment(a, half, repeat=cfg["gemm_repeat"])["TFLOP/s"]
        misaligned = gemm_experiment(m, half, repeat=cfg["gemm_repeat"])["TFLOP/s"]
    return {"16-bit": half, "CNN channel counts not a multiple of 8 (16 bytes)": " ".join(map(str, unaligned)) or "none",
            f"n={a} TFLOP/s": aligned, f"n={m} TFLOP/s": misaligned, "aligned / misaligned": aligned / misaligned,
            "device": pick_device().type}


def _expect5(f: dict) -> str | None:
    if f["CNN channel counts not a multiple of 8 (16 bytes)"] not in ("3", "none"):
        return f"the CNN has unaligned channel counts besides the images' 3: {f['CNN channel counts not a multiple of 8 (16 bytes)']}"
    if f["device"] == "cuda" and not f["aligned / misaligned"] > 1.0:
        return "on this GPU the aligned product was not faster than the one a row short"
    return None


def _kernels(work, precision: str, batch: int, channels_last: bool) -> dict[str, float]:
    import itertools
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    from gpulab.core.timing import PROFILE_KW
    from gpulab.models.cnn import image_batches
    from gpulab.models.precision import make_scaler
    from gpulab.models.step import train_step
    model = work.model.to(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    optimizer = work.reset()
    scaler = make_scaler(precision, next(model.parameters()).device)
    cycle = itertools.cycle(image_batches(model, batch, count=2, seed=1, channels_last=channels_last))
    for _ in range(3):                       # warm-up: cuDNN's plans, the allocator
        train_step(model, *next(cycle), loss=work.loss_fn, optimizer=optimizer, precision=precision, scaler=scaler)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA], **PROFILE_KW) as prof:   # acc_events: no warning
        train_step(model, *next(cycle), loss=work.loss_fn, optimizer=optimizer, precision=precision, scaler=scaler)
        torch.cuda.synchronize()
    model.zero_grad(set_to_none=True)
    kernels = [e for e in prof.key_averages() if e.device_type == DeviceType.CUDA]    # kernel rows only
    top = sorted(kernels, key=lambda e: e.self_device_time_total, reverse=True)[:10]
    return {e.key: e.self_device_time_total / 1e3 for e in top}


def _ex6(scale: str) -> dict:
    from gpulab.core.memory import memory_guard
    from gpulab.lessons.l06_mixed_precision import config
    from gpulab.models import precision as P
    if P.refusal("bf16") is not None:
        return {"bf16": P.refusal("bf16")}
    batch = config(scale)["cnn"]["batch"]
    out: dict = {}
    with memory_guard():
        work = _cnn(scale)
        tops = {(p, cl): _kernels(work, p, batch, cl) for cl in (False, True) for p in ("fp16", "bf16")}
        del work
    for cl in (False, True):
        layout = "channels_last" if cl else "NCHW"
        a, b = tops["fp16", cl], tops["bf16", cl]
        out[f"{layout}: top-10 kernels only in fp16"] = len(set(a) - set(b))
        out[f"{layout}: fp16 top-10 ms"] = sum(a.values())
        out[f"{layout}: bf16 top-10 ms"] = sum(b.values())
        out[f"{layout}: largest fp16 kernel"] = max(a, key=a.get)[:80]
        out[f"{layout}: largest bf16 kernel"] = max(b, key=b.get)[:80]
    out["channels_last top-10 kernels not in NCHW's (fp16)"] = len(set(tops["fp16", True]) - set(tops["fp16", False]))
    return out


def _expect6(f: dict) -> str | None:
    if "bf16" in f:
        return None
    if not f["NCHW: top-10 kernels only in fp16"] > 0:
        return "fp16 and bf16 ran the very same ten largest kernels"
    if not f["channels_last top-10 kernels not in NCHW's (fp16)"] > 0:
        return "channels_last ran the same ten largest kernels as NCHW"
    return None


def _ex7(scale: str) -> dict:
    import torch
    from gpulab.core.memory import memory_guard
    from gpulab.lessons.l06_mixed_precision import config, gpt_workload
    from gpulab.lessons.l06_mixed_precision import precision_run
    cfg = config(scale)
    steps, repeat = (cfg["steps"], cfg["gpt_repeat"]) if scale == "full" else (4, 4)
    out: dict = {}
    with memory_guard():
        torch.manual_seed(0)
        work = gpt_workload(cfg["gpt"])
        batch = cfg["gpt"]["batch"]
        for name, fused in (("AdamW", False), ("AdamW(fused=True)", True)):
            work.optimizer = lambda m, fused=fused: torch.optim.AdamW(m.parameters(), lr=1e-3, fused=fused)
            r = precision_run(work, "fp16", batch, steps=steps, repeat=repeat)
            t = r["ms per step"]
            out[f"{name}: tokens/s"] = r["tokens/s"]
            out[f"{name}: IQR %"] = t.spread_pct
            out[f"{name}: losses"] = r["loss curve"]
        del work
    a, b = out.pop("AdamW: losses"), out.pop("AdamW(fused=True): losses")
    out["skipped steps (unfused, fused)"] = f"{a.skipped}, {b.skipped}"
    out["largest loss difference, fused vs not"] = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    out["fused supports the scaler's in-step unscale"] = bool(getattr(
        torch.optim.AdamW([torch.zeros(1, requires_grad=True)], fused=True), "_step_supports_amp_scaling", False))
    return out


def _expect7(f: dict) -> str | None:
    if not f["fused supports the scaler's in-step unscale"]:
        return "this PyTorch's fused AdamW does not take the GradScaler's inf check itself"
    a, b = f["skipped steps (unfused, fused)"].split(", ")
    if a != b:
        return f"the fused and unfused optimizers skipped different numbers of steps ({a} vs {b})"
    if f["largest loss difference, fused vs not"] > 1e-2:
        return "the fused optimizer trained to other losses than the unfused one"
    return None


ANSWERS = [
    Answer("06", 1, run=_ex1, expect=_expect1, text=(
        "Run the panel with your best 16-bit format, `P.best_half()` (bf16, or fp16 on a GPU without native "
        "bf16), and with fp32 at batch 16, 32 and 128, and divide the images/s. On a GPU the speed-up grows with the batch: at a small batch each "
        "convolution is too small to fill the Tensor Cores, and the per-step costs that 16-bit does not "
        "shrink (kernel launches, the optimizer, BatchNorm statistics) are a larger share of the step. The "
        "run also checks that the 16-bit first loss agrees with fp32's; on the CPU, where the panel stops at "
        "batch 64 and 16-bit is no fast path, it times batches 16 and 32 only.")),
    Answer("06", 2, run=_ex2, expect=_expect2, needs="cuda", text=(
        "Time the CNN three ways: fp32 with TF32 off and both switches on TF32 (`precision_run` in 'fp32' and "
        "'tf32', section 7's rows), and fp32 with only `torch.backends.cudnn.conv.fp32_precision = 'tf32'` "
        "(PyTorch's default, per the PyTorch docs on TF32). The last cannot go through the panel or "
        "`precision_run`: their 'fp32' sets both switches to IEEE over what you set. So inside "
        "`P.fp32_math('ieee')` (matrix products IEEE; both switches restored when the block ends, also after an "
        "error) set the convolution switch to 'tf32' and time `train_step(..., precision=None)`, which runs as "
        "PyTorch is set. A CNN's arithmetic is nearly all convolutions, so the convolution switch alone gives "
        "most of TF32's gain: the run prints which share, and checks that the switches were restored. A GPU "
        "before Ampere has no TF32 and skips this.")),
    Answer("06", 3, run=_ex3, expect=_expect3, text=(
        "Make `torch.amp.GradScaler(device.type, init_scale=2.0**24)` and call `train_curve` in fp16 from the "
        "starting weights, beside a run at the default 2^16. Scaled by 2^24 the gradients overflow fp16's "
        "largest value, 65504, so the scaler skips the step and halves its scale, again and again until the "
        "gradients fit: the skipped steps are wasted forward and backward passes (their count times a step's "
        "time), and the weights do not move meanwhile. The run checks that the final scale is 2^24 halved "
        "once per skipped step and that it skips more than the default start.")),
    Answer("06", 4, run=_ex4, expect=_expect4, text=(
        "Take section 8's batch and compute `unscaled_gradients` in fp32 and in bf16 at loss weight 1, then "
        "compare entry by entry. bf16 has fp32's 8 exponent bits, so almost nothing underflows to zero; but "
        "it keeps only 8 significant bits, so every product and sum of the backward pass rounds at about 2^-8 "
        "relative. Entry by entry the difference can be far larger than that: most weight-gradient entries are "
        "sums over the batch and the image of many terms that nearly cancel (batch norm removes each channel's "
        "mean), and a small error in the terms is large against a small sum. The run prints the lost share, the "
        "median and 90th-percentile relative difference per entry, and the whole gradient's relative "
        "difference (what the update's direction sees), against fp32 computed twice (which differs by nothing "
        "or almost nothing). The claim checked: almost nothing is lost to zero, and bf16's rounding shows.")),
    Answer("06", 5, run=_ex5, expect=_expect5, text=(
        "On a V100 with the cuDNN of its day, 'AMP + Tensor Core' meant making the shapes Tensor-Core friendly: "
        "channel counts, batch and hidden sizes padded to multiples of 8 in fp16 (NVIDIA's mixed-precision "
        "training guide) and a channels_last layout, lesson 07's rules. The run lists the course CNN's "
        "channel counts that are not multiples of 8 (only the 3 input colour channels) and times lesson 07's "
        "aligned and one-short products here. So predict a small gain for this CNN on your GPU: its shapes "
        "are aligned already, and current cuDNN pads the first layer itself.")),
    Answer("06", 6, run=_ex6, expect=_expect6, needs="cuda", text=(
        "Warm a step up, then profile one CNN training step with `torch.profiler.profile(activities=[CUDA])` "
        "in fp16 and in bf16, and sort the kernel rows (only those: an operator row carries its kernels' "
        "time again) by self device time. The convolution kernels' names carry their data type, so fp16 and "
        "bf16 run different kernels, and BatchNorm differs in how it reads 16-bit inputs. In channels_last "
        "the convolutions take NHWC kernels without the layout transposes that NCHW 16-bit convolutions "
        "need, which usually narrows the gap between fp16 and bf16.")),
    Answer("06", 7, run=_ex7, expect=_expect7, text=(
        "Rebuild the GPT workload (`torch.manual_seed(0)`, `gpt_workload(gpt_cfg, device)`: the notebook deleted "
        "its own), give it `torch.optim.AdamW(..., fused=True)` and train it in fp16 with `precision_run`, "
        "beside the unfused AdamW. A fused optimizer takes the GradScaler's inf check and unscaling into its "
        "own kernel (`_step_supports_amp_scaling` in PyTorch's GradScaler source), so `scaler.step` no longer "
        "reads found_inf back to the host every step. On a GPU compare tokens/s and the IQR: the step's host "
        "stall goes, which shows most where the step is short. The run checks that both optimizers train "
        "the same (same skipped steps, same losses).")),
]
