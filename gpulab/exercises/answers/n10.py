"""Reference answers to notebook 10's free-text exercises (gradient accumulation).

Every run builds lesson 09's `TransformerStack` at the lesson's sizes (`config(scale)`), as section 1 does: bf16
(fp16 where bf16 is not native) autocast on a GPU for what is timed, plain fp32 (TF32 off) for what is checked
against the big batch, plain fp32 on the CPU."""
from __future__ import annotations

import copy
import math

import torch
from torch import nn

from gpulab.core.device import float32_matmul, pick_device
from gpulab.core.memory import memory_guard, track_peak
from gpulab.core.timing import benchmark
from gpulab.exercises.answers import Answer
from gpulab.lessons.l10_gradient_accumulation import (ADAMW_PREDICTION_TOL, OPTIMIZERS, accumulation_check, config,
                                                      update_ratio)
from gpulab.models.precision import best_half, half_dtype, make_scaler
from gpulab.models.sizing import predicted_batch
from gpulab.models.step import GRAD_TOL, mse_loss, train_step, worst_difference
from gpulab.models.transformer import TransformerStack, loss_fn, make_batch

MiB = 2**20


# -- shared ---------------------------------------------------------------------------------------------
def _model(scale: str, timed: bool = True):
    """(device, cfg, model, parameters, autocast dtype): section 1's model; dtype None (plain fp32) on the CPU
    or where `timed` is False (the fp32 checks)."""
    device = pick_device()
    cfg = config(scale)
    dtype = half_dtype() if timed and device.type == "cuda" else None
    torch.manual_seed(0)
    model = TransformerStack(cfg["n_blocks"], cfg["width"], cfg["heads"], cfg["seq"], device=device)
    return device, cfg, model, sum(p.numel() for p in model.parameters()), dtype


def _optimizer(model: nn.Module, dtype, device):
    """Section 1's AdamW (lr 1e-5) and its GradScaler (fp16 only; None for bf16 and fp32)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    return opt, (make_scaler(best_half(), device) if dtype is not None else None)


def _time(fn, scale: str, device, repeat: int = 3):
    """benchmark at the course's settings at full size; at tiny (the CPU tests) a few calls, no extra warm-up
    (each caller has already run `fn`'s work once)."""
    if scale == "full":
        return benchmark(fn, warmup=1, device=device)
    return benchmark(fn, warmup=0, repeat=repeat, device=device)


def _norm(tensors) -> float:
    return math.sqrt(sum(float((t.double() ** 2).sum()) for t in tensors))


def _grads(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.detach().clone() for p in model.parameters()]


def _rel_diff(grads, ref) -> float:
    """accumulation_check's measure, lesson 09's: per parameter, the largest |difference| of its entries over its
    largest reference entry, the worst parameter (`step.worst_difference`)."""
    return worst_difference(grads, ref)


def _norm_diff(grads, ref) -> float:
    """|difference| / |reference|, each the norm over every entry: how far off the whole gradient is (the
    largest entry's measure shrinks with the parameter count, this one does not)."""
    return _norm(g - r for g, r in zip(grads, ref)) / _norm(ref)


def _gpu_full(f: dict) -> bool:
    return f["device"] == "cuda" and f["scale"] == "full"


# -- 1. 1 x 32 against 32 x 1 ------------------------------------------------------------------------------
def _ex1(scale: str) -> dict:
    from gpulab.lessons.l12_kernel_fusion import kernels_launched
    device, cfg, model, params, dtype = _model(scale)
    opt, scaler = _optimizer(model, dtype, device)
    # 32, or halved until one batch of it is predicted to fit half the free memory (a smaller GPU)
    eff = predicted_batch(cfg["n_blocks"], 32, cfg["seq"], cfg["width"], params, dtype is not None, device=device)
    out: dict = {"device": device.type, "scale": scale, "effective batch": eff}
    layouts = {f"1 x {eff}": (1, eff), f"{eff} x 1": (eff, 1)}
    with memory_guard(quiet=True):
        x, y = make_batch(model, eff)                     # the same samples both ways, ready before the clock
        batches = {name: list(zip(x.split(m), y.split(m))) for name, (m, _) in layouts.items()}
        one, whole = layouts
        losses = {one: train_step(model, batches[one], accumulation=eff, precision=dtype).item(),    # no update
                  # the loss is taken before the update, at the same weights; the update makes AdamW's state
                  whole: train_step(model, x, y, optimizer=opt, scaler=scaler, precision=dtype).item()}
        for name, (m, s) in layouts.items():
            def effective_batch(b=batches[name], s=s):
                train_step(model, b, accumulation=s, optimizer=opt, scaler=scaler, precision=dtype)
            if device.type == "cuda":
                with track_peak(device) as mem:
                    effective_batch()
                out[f"{name}: peak above the weights and AdamW's state (MiB)"] = mem.peak_above_start / MiB
                kernels = kernels_launched(effective_batch, device)
                out[f"{name}: kernels per effective batch"] = len(kernels)
            t = _time(effective_batch, scale, device, repeat=2)
            out[f"{name}: ms per effective batch"] = t.median_ms
            out[f"{name}: ms per sample"] = t.median_ms / eff
        model.zero_grad(set_to_none=True)
        del x, y, batches, opt, model
    out[f"loss, {one} / {whole}"] = losses[one] / losses[whole]
    out[f"ms per sample, {one} / {whole}"] = out[f"{one}: ms per sample"] / out[f"{whole}: ms per sample"]
    out[f"extra ms per added micro-step, ({one} - {whole}) / {eff - 1}"] = (
        (out[f"{one}: ms per effective batch"] - out[f"{whole}: ms per effective batch"]) / max(eff - 1, 1))
    out["16-bit"] = dtype is not None
    return out


def _expect1(f: dict) -> str | None:
    eff = f["effective batch"]
    one, whole = f"1 x {eff}", f"{eff} x 1"
    tol = 2e-2 if f["16-bit"] else 1e-5        # bf16 products of other shapes round differently
    if abs(f[f"loss, {one} / {whole}"] - 1) > tol:
        return "the two layouts did not compute the same mean loss: they are not the same effective batch"
    if f["device"] == "cuda":
        if not f[f"{one}: kernels per effective batch"] > 0.5 * eff * f[f"{whole}: kernels per effective batch"]:
            return f"{one} did not launch about {eff} times the kernels of {whole}"
        peak = "peak above the weights and AdamW's state (MiB)"
        if not f[f"{whole}: {peak}"] > f[f"{one}: {peak}"]:
            return f"{whole} (all activations at once) did not peak higher than {one}"
    if _gpu_full(f) and eff >= 8 and not f[f"ms per sample, {one} / {whole}"] > 1.1:
        return f"on a GPU at full size {one} was not slower per sample than {whole}"
    return None


# -- 2. 10 samples in 4 + 4 + 2 ------------------------------------------------------------------------------
def _ex2(scale: str) -> dict:
    device, cfg, model, params, _ = _model(scale, timed=False)
    n, parts = 10, 3
    out: dict = {"device": device.type, "scale": scale}
    with memory_guard(quiet=True):
        x, y = make_batch(model, n, seed=1)
        micro = list(zip(x.chunk(parts), y.chunk(parts)))            # torch.chunk: 4, 4 and 2 samples
        out["micro-batch sizes"] = " ".join(str(xs.shape[0]) for xs, _ in micro)

        def weighted(m, xs, ys):          # each micro-batch's mean loss times its share of the batch, n_i / N
            return mse_loss(m, xs, ys) * (xs.shape[0] / n)

        try:
            accumulation_check(model, x, y, parts)
            out["accumulation_check on 10 in 3"] = "ran"
        except ValueError as err:
            out["accumulation_check on 10 in 3"] = f"refused: {err}"
        with float32_matmul("ieee"):
            big_loss = train_step(model, x, y).item()                      # the big batch
            big = _grads(model)
            by3_loss = train_step(model, micro, accumulation=parts).item()     # each loss / 3
            by3 = _grads(model)
            w_loss = train_step(model, micro, accumulation=parts, divide=False, loss=weighted).item()   # x n_i / N
            w = _grads(model)
        model.zero_grad(set_to_none=True)
        out["divided by 3: worst difference per parameter"] = _rel_diff(by3, big)
        out["divided by 3: |difference| / |gradient|"] = _norm_diff(by3, big)
        out["times n_i / N: worst difference per parameter"] = _rel_diff(w, big)
        out["divided by 3: loss / big batch's"] = by3_loss / big_loss
        out["times n_i / N: loss / big batch's"] = w_loss / big_loss
        del x, y, micro, big, by3, w, model
    out["weights per micro-batch, n_i / N"] = "0.4 0.4 0.2"
    return out


def _expect2(f: dict) -> str | None:
    if f["micro-batch sizes"] != "4 4 2":
        return f"10 samples in 3 chunks were {f['micro-batch sizes']}, not 4 4 2"
    if not f["accumulation_check on 10 in 3"].startswith("refused"):
        return "section 3's accumulation_check accepted micro-batches of unequal size"
    if not f["times n_i / N: worst difference per parameter"] < GRAD_TOL:
        return "weighting each micro-batch's loss by n_i / N did not reproduce the big batch's gradients"
    if not abs(f["times n_i / N: loss / big batch's"] - 1) < GRAD_TOL:
        return "the weighted losses did not add up to the big batch's mean loss"
    if not f["divided by 3: |difference| / |gradient|"] > 1e-2:
        return "dividing by 3 gave the big batch's gradients: the micro-batches were not unequal"
    return None


# -- 3. BatchNorm against LayerNorm -------------------------------------------------------------------------
class TokenBatchNorm(nn.BatchNorm1d):
    """BatchNorm over (batch, seq) for each of `width` channels, on the stack's (batch, seq, width) tensors:
    a drop-in replacement for the blocks' LayerNorm(width)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


def _with_batchnorm(model: nn.Module) -> int:
    """Every LayerNorm of `model` replaced, in place, by a TokenBatchNorm of the same width; how many."""
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if isinstance(child, nn.LayerNorm)]
    for parent, name, child in swaps:
        setattr(parent, name, TokenBatchNorm(child.normalized_shape[0], device=child.weight.device))
    return len(swaps)


def _ex3(scale: str) -> dict:
    device, cfg, model, params, _ = _model(scale, timed=False)
    steps, m = cfg["steps"], cfg["check_micro"]
    out: dict = {"device": device.type, "scale": scale, "steps": steps}
    with memory_guard(quiet=True):
        x, y = make_batch(model, m * steps, seed=1)          # section 3's batch: steps micro-batches of check_micro
        out["LayerNorm (the lesson's model)"] = accumulation_check(model, x, y, steps)["divided"]
        out["norms replaced"] = _with_batchnorm(model)
        model.train()
        out["BatchNorm, training mode (batch statistics)"] = accumulation_check(model, x, y, steps)["divided"]
        with float32_matmul("ieee"):                   # the same two steps, for the whole gradient's difference
            train_step(model, x, y)
            big = _grads(model)
            train_step(model, x, y, accumulation=steps)
            out["BatchNorm, training mode: |difference| / |gradient|"] = _norm_diff(_grads(model), big)
        model.zero_grad(set_to_none=True)
        del big
        model.eval()        # running statistics: each sample normalized on its own again
        out["BatchNorm, eval mode (running statistics)"] = accumulation_check(model, x, y, steps)["divided"]
        model.train()
        del x, y, model
    out["tolerance"] = GRAD_TOL
    return out


def _expect3(f: dict) -> str | None:
    if not f["LayerNorm (the lesson's model)"] < GRAD_TOL:
        return "the LayerNorm model's accumulated gradients differ from the big batch's"
    if not f["BatchNorm, training mode: |difference| / |gradient|"] > 1e-3:
        return "with BatchNorm in training mode the accumulated gradients still matched the big batch's"
    if not f["BatchNorm, eval mode (running statistics)"] < GRAD_TOL:
        return "with BatchNorm on running statistics (eval mode) the gradients did not match"
    return None


# -- 4. the optimizer step's share -------------------------------------------------------------------------
def _ex4(scale: str) -> dict:
    device, cfg, model, params, dtype = _model(scale)
    micro = predicted_batch(cfg["n_blocks"], cfg["micro"], cfg["seq"], cfg["width"], params, dtype is not None,
                            device=device)                   # section 2's micro-batch
    opt, scaler = _optimizer(model, dtype, device)
    most = 16
    out: dict = {"device": device.type, "scale": scale, "micro-batch": micro, "parameters": params}
    with memory_guard(quiet=True):
        batches = [make_batch(model, micro, seed=i) for i in range(most)]       # ready before the clock starts
        train_step(model, batches[:1], optimizer=opt, scaler=scaler, precision=dtype)   # AdamW's state, as section 1
        moments = sum(s[k].numel() * s[k].element_size() for s in opt.state.values() for k in ("exp_avg", "exp_avg_sq"))
        ms = {}
        for steps in (1, most):
            def effective_batch(b=batches[:steps], steps=steps):
                train_step(model, b, accumulation=steps, optimizer=opt, scaler=scaler, precision=dtype)
            ms[steps] = _time(effective_batch, scale, device).median_ms
        # the last effective batch has left its gradients in .grad: the update alone, on them
        update = _time(opt.step, scale, device, repeat=5).median_ms
        model.zero_grad(set_to_none=True)
        del batches, opt, model
    out["AdamW moments (bytes per parameter)"] = moments / params
    out["optimizer.step ms"] = update
    for steps in (1, most):
        out[f"ms per effective batch, {steps} micro-batch(es)"] = ms[steps]
        out[f"update's share, {steps} micro-batch(es)"] = update / ms[steps]
    micro_step = max(ms[1] - update, 0.0)                  # one forward + backward, from the 1-step batch
    out[f"predicted share at {most}: u / (u + {most} x (T1 - u))"] = update / (update + most * micro_step)
    out["AdamW traffic per step, at least 28 bytes per parameter (MiB)"] = 28 * params / MiB
    return out


def _expect4(f: dict) -> str | None:
    if abs(f["AdamW moments (bytes per parameter)"] - 8) > 1e-9:
        return "AdamW's two moments did not hold 8 bytes (two fp32 numbers) per parameter"
    if _gpu_full(f) and not f["update's share, 16 micro-batch(es)"] < f["update's share, 1 micro-batch(es)"] / 4:
        return "on a GPU at full size the update's share did not fall several-fold from 1 to 16 micro-batches"
    return None


# -- 5. the learning rate of a larger effective batch -------------------------------------------------------
def _ex5(scale: str) -> dict:
    device, cfg, model, params, _ = _model(scale, timed=False)
    k, m = 16, cfg["check_micro"]
    out: dict = {"device": device.type, "scale": scale, "micro-batch": m, "micro-batches k": k}
    ps = list(model.parameters())
    start = copy.deepcopy(model.state_dict())
    with memory_guard(quiet=True):
        batches = [make_batch(model, m, seed=i) for i in range(k)]
        with float32_matmul("ieee"):
            # each micro-batch's gradient at the starting weights: their sum is k x the accumulated one
            total = [torch.zeros_like(p) for p in ps]
            squares = 0.0
            for xs, ys in batches:
                train_step(model, xs, ys)
                squares += _norm(p.grad for p in ps) ** 2
                for t, p in zip(total, ps):
                    t += p.grad
            train_step(model, batches, accumulation=k)            # the accumulated gradient of the k x m batch
            out["accumulated gradient vs mean of micro-batch gradients"] = _rel_diff(_grads(model),
                                                                                     [t / k for t in total])
            small, big = squares / k, _norm(total) ** 2 / k**2     # E|g_B|^2 at B = m and at B = k m
            w_norm = _norm(p.detach() for p in ps)
            # k SGD steps at lr on the micro-batches, one after another, against one step at k x lr on the
            # accumulated batch: that one moves the weights by lr x (sum of the gradients at the start), the
            # k steps by lr x (sum of the gradients each met on its way); their difference is the drift
            for label, rel_step in (("small lr", 1e-5), ("large lr", 1e-2)):
                lr = rel_step * w_norm / (k * math.sqrt(big))      # the big step moves the weights by rel_step
                model.load_state_dict(start)
                opt = torch.optim.SGD(ps, lr=lr)
                met = [torch.zeros_like(p) for p in ps]
                for xs, ys in batches:
                    train_step(model, xs, ys, optimizer=opt)       # leaves the gradient it stepped with in .grad
                    for t, p in zip(met, ps):
                        t += p.grad
                out[f"{label}: lr"] = lr
                out[f"{label}: k steps at lr vs 1 step at k lr, |difference| / |update|"] = (
                    _norm(a - b for a, b in zip(met, total)) / _norm(total))
                del opt, met
        model.load_state_dict(start)
        model.zero_grad(set_to_none=True)
        del batches, total, model
    out["|g|^2 at batch k m / at batch m"] = big / small
    g2 = (k * m * big - m * small) / (k * m - m)                 # McCandlish et al. 2018, appendix A
    noise = (small - big) / (1 / m - 1 / (k * m))
    out["B_noise = tr(Sigma) / |G|^2 (samples)"] = noise / g2 if g2 > 0 else "noise dominates: above k x m"
    return out


def _expect5(f: dict) -> str | None:
    if not f["accumulated gradient vs mean of micro-batch gradients"] < GRAD_TOL:
        return "the accumulated gradient is not the mean of the micro-batches' gradients"
    if not f["|g|^2 at batch k m / at batch m"] < 1:
        return "the larger batch's gradient was not shorter than the micro-batches' on average"
    s = f["small lr: k steps at lr vs 1 step at k lr, |difference| / |update|"]
    large = f["large lr: k steps at lr vs 1 step at k lr, |difference| / |update|"]
    if not s < 0.01:
        return "at a small lr, k small SGD steps did not match one step of k x lr on the k x batch"
    if not large > 10 * s:
        return "at a large lr the k small steps did not drift away from the one large step"
    return None


# -- 6. the mistake with gradient clipping ------------------------------------------------------------------
def _ex6(scale: str) -> dict:
    device, cfg, model, params, _ = _model(scale, timed=False)
    steps, lr = cfg["steps"], 1e-3
    ps = list(model.parameters())
    start = copy.deepcopy(model.state_dict())
    out: dict = {"device": device.type, "scale": scale, "steps": steps}

    def accumulate(x, y, divide: bool):
        for xs, ys in zip(x.chunk(steps), y.chunk(steps)):
            loss = loss_fn(model(xs), ys)
            (loss / steps if divide else loss).backward()        # adds into .grad

    def one_update(name: str, divide: bool, max_norm: float) -> float:
        """Size (norm over every weight) of one update of a fresh `name` optimizer, clipped at max_norm."""
        model.load_state_dict(start)
        before = [p.detach().clone() for p in ps]
        opt = OPTIMIZERS[name](ps, lr=lr)
        opt.zero_grad(set_to_none=True)
        accumulate(x, y, divide)
        torch.nn.utils.clip_grad_norm_(ps, max_norm)
        opt.step()
        size = _norm(p.detach() - b for p, b in zip(ps, before))
        del opt, before
        return size

    with memory_guard(quiet=True):
        x, y = make_batch(model, cfg["check_micro"] * steps, seed=1)      # section 3's batch
        with float32_matmul("ieee"):
            model.zero_grad(set_to_none=True)
            accumulate(x, y, divide=True)
            g = _grads(model)                                   # the correct gradient, before any clipping
            n = _norm(g)
            w = [p.detach().double() for p in ps]
            model.zero_grad(set_to_none=True)
            defaults = torch.optim.AdamW(ps, lr=lr).defaults
            eps, wd = defaults["eps"], defaults["weight_decay"]
            out["correct gradient norm n"] = n
            thresholds = {"1.0 (the exercise)": 1.0, "n / 2 (both clipped)": n / 2,
                          f"2 x {steps} x n (neither clipped)": 2 * steps * n}
            for label, c in thresholds.items():
                s_right = min(1.0, c / (n + 1e-6))              # clip_grad_norm_'s factor: max_norm / (norm + 1e-6)
                s_wrong = steps * min(1.0, c / (steps * n + 1e-6))
                out[f"max_norm {label}: SGD ratio"] = one_update("SGD", False, c) / one_update("SGD", True, c)
                out[f"max_norm {label}: SGD predicted"] = s_wrong / s_right
                out[f"max_norm {label}: AdamW ratio"] = one_update("AdamW", False, c) / one_update("AdamW", True, c)
                # AdamW's first update of a weight fed gradient s g: lr (wd w + s g / (|s g| + eps))
                right = wrong = 0.0
                for gi, wi in zip(g, w):
                    gi = gi.double()
                    right += float(((wd * wi + s_right * gi / (s_right * gi.abs() + eps)) ** 2).sum())
                    wrong += float(((wd * wi + s_wrong * gi / (s_wrong * gi.abs() + eps)) ** 2).sum())
                out[f"max_norm {label}: AdamW predicted"] = math.sqrt(wrong / right)
        for name in ("SGD", "AdamW"):
            out[f"no clipping: {name} ratio (update_ratio)"] = update_ratio(model, x, y, steps, name, lr=lr)
        model.load_state_dict(start)
        model.zero_grad(set_to_none=True)
        del x, y, g, w, model
    return out


def _expect6(f: dict) -> str | None:
    steps = f["steps"]
    labels = sorted({k.split(": ")[0] for k in f if k.startswith("max_norm ")})
    for label in labels:
        sgd, sgd_pred = f[f"{label}: SGD ratio"], f[f"{label}: SGD predicted"]
        if abs(sgd / sgd_pred - 1) > 1e-3:
            return f"{label}: the SGD ratio {sgd:.4f} is not the clipping factors' {sgd_pred:.4f}"
        adam, adam_pred = f[f"{label}: AdamW ratio"], f[f"{label}: AdamW predicted"]
        if abs(adam / adam_pred - 1) > ADAMW_PREDICTION_TOL:
            return f"{label}: the AdamW ratio {adam:.5f} is not the {adam_pred:.5f} its formula predicts"
        if not 1 - 1e-3 <= sgd <= steps * (1 + 1e-3):
            return f"{label}: the clipped SGD ratio left [1, steps]"
    if abs(f["no clipping: SGD ratio (update_ratio)"] / steps - 1) > 1e-3:
        return "without clipping the SGD ratio was not steps"
    if abs(f["max_norm n / 2 (both clipped): SGD ratio"] - 1) > 1e-3:
        return "with both gradients clipped the SGD updates were not the same"
    return None


ANSWERS = [
    Answer("10", 1, run=_ex1, expect=_expect1, text=(
        "Run `panel.run(micro_batch=1, steps=32)` and `panel.run(micro_batch=32, steps=1)`; the run does both on "
        "the same 32 samples with section 1's AdamW and checks that they give the same mean loss. The arithmetic "
        "is the same and so is the one optimizer step; what 1 x 32 adds is 31 more passes through each micro-step's "
        "fixed costs. Every micro-step launches the same few hundred kernels (forward, backward, autocast's "
        "casts) whatever its size, so the count grows 32-fold (the run counts them on a GPU), and at one sample "
        "a product has only seq rows: the 1024 x 1024 output projection at full size is 64 tiles of 128 x 128, "
        "fewer than an H200's 132 SMs (datasheet), so many kernels leave SMs idle or are too short to hide their "
        "launch. The run prints the extra milliseconds each added micro-step costs. 32 x 1 pays in memory "
        "instead: its peak holds all 32 samples' activations (the run reads both peaks on a GPU). The slowdown "
        "per sample is checked on a GPU at full size; on the CPU per-operator overhead shows the same trend, "
        "unjudged.")),
    Answer("10", 2, run=_ex2, expect=_expect2, text=(
        "The big batch's loss is the mean over its 10 samples, (1/10) x sum of n_i x mean_i, so each "
        "micro-batch's mean loss must be multiplied by n_i / N: 0.4, 0.4 and 0.2. Dividing each by 3 gives "
        "every micro-batch the same weight, so each sample of the 2-sample micro-batch counts twice as much as "
        "one in a 4-sample micro-batch, and the gradient is biased toward it. `accumulation_check` itself refuses "
        "unequal micro-batches (the run shows the refusal), so check it with its measure, `worst_difference`: "
        "the run compares the big batch's fp32 gradients with section 1's loop, each loss weighted by n_i / N "
        "(`train_step(..., divide=False)` with that loss), and with the divide-by-3 form. Note that `train_step(model, x, y, accumulation=3)` on 10 samples does the "
        "wrong thing silently: `x.chunk(3)` makes 4, 4 and 2 and each loss is divided by 3. The weighted form "
        "matches to rounding; dividing by 3 misses by far more than the tolerance. The same weighting applies "
        "to a data loader's short last batch.")),
    Answer("10", 3, run=_ex3, expect=_expect3, text=(
        "Section 3's equality needs the big batch's loss to be a sum of per-sample terms: then it splits over "
        "micro-batches, and so do its gradients. LayerNorm normalizes each token over its own width features, "
        "so a sample's output does not depend on which other samples share its batch. BatchNorm in training mode "
        "normalizes each channel with the mean and variance of the batch it is given, so a micro-batch of 2 "
        "normalizes with other statistics than the batch of 8; outputs, loss and gradients all change, and the "
        "gradient through those statistics couples the samples. Its running statistics are also updated once "
        "per micro-batch. The run replaces every LayerNorm of the model by a BatchNorm over (batch, seq) and "
        "runs `accumulation_check`: the LayerNorm model matches, the BatchNorm one in training mode does not, "
        "and the same BatchNorm in eval mode (running statistics, per sample again) matches. That is why "
        "accumulation suits LayerNorm and GroupNorm models, and a BatchNorm model trained by accumulation "
        "behaves like one with the micro-batch's statistics (ghost batch norm), not the effective batch's.")),
    Answer("10", 4, run=_ex4, expect=_expect4, text=(
        "`accumulation_experiment` and the panel free the gradients when they end, so right after them the "
        "step has nothing to update; `train_step` itself leaves them in `.grad` (with an optimizer after the "
        "update, without one after the backwards). The run times the effective batches with `train_step`, then "
        "`benchmark(optimizer.step)` on the gradients the last one left: the update alone (on the same gradients "
        "each call, which is fine for a timing). AdamW's step is "
        "elementwise over every parameter: it reads the weight, gradient and two moments and writes three of "
        "them back, at least 28 bytes per fp32 parameter (the two moments are 8 bytes, which the run checks), "
        "so its time is set by the parameter count and memory bandwidth, never by the batch. An effective "
        "batch of `steps` micro-batches costs about steps x (one forward + backward) + u, so the update's share "
        "u / (steps x f + u) falls roughly as 1/steps; the run predicts the 16-step share from the 1-step "
        "timing and prints both. Amortizing the update (and, with DDP, the all-reduce) over more samples is "
        "one of accumulation's gains. On a GPU at full size the run checks that the share falls several-fold "
        "from 1 to 16 micro-batches; on the CPU the figures are illustrative.")),
    Answer("10", 5, run=_ex5, expect=_expect5, text=(
        "Yes: the optimizer sees the effective batch, so the learning rate belongs to it, not to the micro-batch; "
        "accumulation itself changes nothing, being the same big batch. The linear scaling rule (Goyal et al. "
        "2017, 'Accurate, Large Minibatch SGD') multiplies SGD's lr by k when the batch grows k-fold, because k "
        "small steps at lr then move the weights about as one step at k x lr on the k-times batch, provided the "
        "gradient barely changes over those k steps. Early in training it changes fast, so they ramp the lr "
        "linearly up to k x lr over the first 5 epochs (gradual warm-up), and the rule fails beyond a critical "
        "batch (McCandlish et al. 2018's gradient noise scale). The run measures exactly this with SGD: k small "
        "steps against one accumulated step of k x lr, from the gradients each step met: near-identical at a "
        "small lr, drifting apart at a large one. It also shows the larger batch's gradient is shorter (noise "
        "averages out) and estimates the noise scale, only illustrative on the course's random data. For Adam "
        "and AdamW, which normalize the gradient's scale, a square-root rule (Malladi et al. 2022) fits better; "
        "and a schedule written in optimizer steps (warm-up, decay) must be rescaled, as the same samples are "
        "k times fewer steps.")),
    Answer("10", 6, run=_ex6, expect=_expect6, text=(
        "Write the loop: for each micro-batch `loss_fn(model(xs), ys).backward()` (divided by `steps` or not), "
        "then `clip_grad_norm_(model.parameters(), 1.0)` and `optimizer.step()`, from the same weights with a "
        "fresh optimizer, and compare the update norms as `update_ratio` does. Clipping rescales the whole "
        "gradient to norm at most c = max_norm, so with n the correct gradient's norm the undivided one "
        "(steps x n) is clipped whenever steps x n > c. SGD's update is lr x the clipped gradient: its ratio becomes "
        "min(steps n, c) / min(n, c), which is steps when neither is clipped, 1 when both are (the mistake "
        "disappears and SGD takes lr x c-length steps either way), and in between otherwise; the run checks all "
        "three against that formula. AdamW's first update, lr (wd w + g / (|g| + eps)), ignores a gradient's "
        "scale, so clipping, which only rescales, leaves its ratio near 1 and only changes how much eps weighs. "
        "Over many steps the mistake still shows: clipping now meets a gradient `steps` times too large, so it "
        "fires more often and harder, and a threshold tuned for the divided gradient means something else.")),
]
