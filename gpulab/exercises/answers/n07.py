"""Reference answers to notebook 07's free-text exercises (Tensor Core alignment)."""
from __future__ import annotations

from gpulab.exercises.answers import Answer


def _tensor_cores() -> bool:
    from gpulab.core.device import device_facts
    facts = device_facts()
    return facts.kind == "cuda" and facts.tensor_core_generation is not None


def _ex1(scale: str) -> dict:
    from gpulab.core.memory import memory_guard
    from gpulab.lessons.l07_tensor_core_alignment import alignment, config, gemm_precisions, gemm_experiment
    cfg = config(scale)
    a, odd = cfg["aligned"], cfg["misaligned"]
    p = gemm_precisions()[0]
    out: dict = {"precision": p}
    with memory_guard():
        for name, (m, n, k) in {"aligned": (a, a, a), "m": (odd, a, a), "n": (a, odd, a), "k": (a, a, odd)}.items():
            out[f"{name} TFLOP/s"] = gemm_experiment(n, p, m=m, k=k, repeat=cfg["gemm_repeat"])["TFLOP/s"]
            # row-major: A's rows hold k elements, B's and C's rows n; m is only how many rows there are
            out[f"{name}: rows under 16 bytes"] = sum(alignment(r) < 16 for r in (k, n, n))
    out["tensor cores"] = _tensor_cores()
    return out


def _expect1(f: dict) -> str | None:
    if (f["m: rows under 16 bytes"], f["n: rows under 16 bytes"], f["k: rows under 16 bytes"]) != (0, 2, 1):
        return "the row lengths do not say m leaves every row aligned, n two matrices' rows, k one"
    if f["tensor cores"] and not f["m TFLOP/s"] > max(f["n TFLOP/s"], f["k TFLOP/s"]):
        return "misaligning m hurt as much as misaligning n or k"
    return None


SIZES2 = (16, 32, 64, 128, 256, 512)


def _ex2(scale: str) -> dict:
    from gpulab.core.memory import memory_guard
    from gpulab.lessons.l07_tensor_core_alignment import config, gemm_precisions, gemm_experiment
    half = gemm_precisions()[0]
    repeat = config(scale)["gemm_repeat"]
    out: dict = {"16-bit": half}
    with memory_guard():
        for n in SIZES2:
            r16 = gemm_experiment(n, half, repeat=repeat)
            r32 = gemm_experiment(n, "fp32", repeat=repeat)
            out[f"n={n}: {half} ms"] = r16["ms"].median_ms
            out[f"n={n}: {half} / fp32 TFLOP/s"] = r16["TFLOP/s"] / r32["TFLOP/s"]
    out["tensor cores"] = _tensor_cores()
    return out


def _expect2(f: dict) -> str | None:
    if not f["tensor cores"]:
        return None          # the gain of Tensor Cores is judged on a GPU that has them
    h = f["16-bit"]
    if not f[f"n=64: {h} ms"] < 4 * f[f"n=16: {h} ms"]:
        return "n=64 took 4x the time of n=16 or more: the small products were not overhead-bound"
    if not f[f"n=512: {h} / fp32 TFLOP/s"] > f[f"n=16: {h} / fp32 TFLOP/s"]:
        return "Tensor Cores gained no more at n=512 than at n=16"
    return None


def _ex3(scale: str) -> dict:
    import itertools
    import torch
    from gpulab.core.device import pick_device
    from gpulab.core.memory import memory_guard
    from gpulab.core.timing import benchmark
    from gpulab.lessons.l06_mixed_precision import config as config06
    from gpulab.lessons.l07_tensor_core_alignment import config
    from gpulab.models import precision as P
    from gpulab.models.gpt import GPT, token_batches
    from gpulab.models.step import train_step
    gpt = dict(config06(scale)["gpt"])          # lesson 06's GPT: at full size vocabulary 8192, width 768, ...
    batch = gpt.pop("batch")
    out: dict = {f"{k} {v}: multiple of 64": v % 64 == 0 for k, v in gpt.items() if k != "n_blocks"}
    out[f"head size {gpt['width'] // gpt['heads']}: multiple of 64"] = (gpt["width"] // gpt["heads"]) % 64 == 0
    device = pick_device()
    precision = P.best_half() if device.type == "cuda" else "fp32"
    dtype = P.SPECS[precision].dtype or torch.float32
    repeat = config(scale)["repeat"]
    with memory_guard():
        for vocab in (gpt["vocab"], gpt["vocab"] - 1):          # one token fewer: less work, odd rows
            # the output layer's forward product alone: (batch x seq, width) @ (width, vocab), GPU-bound
            h = torch.randn(batch * gpt["seq"], gpt["width"], device=device, dtype=dtype)
            w = torch.randn(vocab, gpt["width"], device=device, dtype=dtype)
            out[f"vocab {vocab}: logits product ms"] = benchmark(lambda: h @ w.T, warmup=2, repeat=repeat).median_ms
            del h, w
            torch.manual_seed(0)
            model = GPT(vocab, gpt["n_blocks"], gpt["width"], gpt["heads"], gpt["seq"], device=device)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            scaler = P.make_scaler(precision, device)
            cycle = itertools.cycle(token_batches(model, batch, count=2, seed=1))
            loss = train_step(model, *next(cycle), loss=P.language_model_loss, optimizer=optimizer,
                              precision=precision, scaler=scaler)
            out[f"vocab {vocab}: first loss finite"] = bool(torch.isfinite(loss))
            out[f"vocab {vocab}: ms per step"] = benchmark(
                lambda: train_step(model, *next(cycle), loss=P.language_model_loss, optimizer=optimizer,
                                   precision=precision, scaler=scaler),
                warmup=1, repeat=repeat).median_ms
            model.zero_grad(set_to_none=True)
            del model, optimizer, scaler, cycle, loss
    out["precision"] = precision
    out["tensor cores"] = _tensor_cores()
    out["aligned vocab"] = gpt["vocab"]
    out["device"], out["scale"] = device.type, scale
    return out


def _expect3(f: dict) -> str | None:
    v = f["aligned vocab"]
    if not f[f"vocab {v}: multiple of 64"]:
        return f"the vocabulary {v} is not a multiple of 64"
    if not (f[f"vocab {v}: first loss finite"] and f[f"vocab {v - 1}: first loss finite"]):
        return "a training step gave a non-finite loss"
    if (f["tensor cores"] and f["scale"] == "full"
            and not f[f"vocab {v - 1}: logits product ms"] > f[f"vocab {v}: logits product ms"]):
        return (f"the logits product with the odd vocabulary {v - 1} (less arithmetic) was not slower than with {v} "
                f"({f[f'vocab {v - 1}: logits product ms']:.3g} against {f[f'vocab {v}: logits product ms']:.3g} ms)")
    return None


def _first_losses(c: dict) -> tuple[float, float]:
    """The fp32 (TF32 off) loss of the starting weights of `conv_step_times`'s CNN (seed 0, sizes `c`) on one batch,
    in the NCHW layout and in channels_last: the two layouts must agree before their times are compared."""
    import copy
    import torch
    from gpulab.core.device import pick_device
    from gpulab.models import precision as P
    from gpulab.models.cnn import ResNetish, image_batches
    torch.manual_seed(0)
    nchw = ResNetish(tuple(c["depths"]), c["width"], c["classes"], image=c["fixed"], device=pick_device())
    nhwc = copy.deepcopy(nchw).to(memory_format=torch.channels_last)
    x, y = image_batches(nchw, c["batch"], count=1, seed=1)[0]
    with torch.no_grad(), P.fp32_math("ieee"):
        return (P.classification_loss(nchw, x, y).item(),
                P.classification_loss(nhwc, x.contiguous(memory_format=torch.channels_last), y).item())


def _ex4(scale: str) -> dict:
    import statistics
    from gpulab.core.device import pick_device
    from gpulab.core.memory import memory_guard
    from gpulab.lessons.l07_tensor_core_alignment import config, conv_step_times
    from gpulab.models.precision import best_half
    cfg = config(scale)
    cb = cfg["cudnn"] | {"varying": ()}        # the exercise's **(cb_cfg | {"varying": ()})
    repeat = cfg["cudnn_repeat"] if pick_device().type == "cuda" else 3
    out: dict = {}
    with memory_guard():
        la, lb = _first_losses(cb)
        out["fp32 loss difference NCHW vs channels_last"] = abs(la - lb) / abs(la)
        for p in ("fp32", best_half()):
            # what conv_benchmark_in_fresh_process(False, ...) runs in its fresh process: with cudnn.benchmark off
            # in both layouts there is no search whose cache a fresh process must empty, so this process will do
            ms = {cl: statistics.median(conv_step_times(False, precision=p, repeat=repeat, channels_last=cl,
                                                        **cb)["samples_ms"]["steady"]) for cl in (False, True)}
            out[f"{p}: channels_last / NCHW img/s"] = ms[False] / ms[True]
    out["half"] = best_half()
    out["tensor cores"] = _tensor_cores()
    return out


def _expect4(f: dict) -> str | None:
    if f["fp32 loss difference NCHW vs channels_last"] > 1e-4:
        return "the two layouts gave different losses from the same weights"
    if f["tensor cores"] and not f["fp32: channels_last / NCHW img/s"] < f[f"{f['half']}: channels_last / NCHW img/s"]:
        return "channels_last gained as much in fp32 (TF32 off) as in 16-bit"
    return None


def _fresh(flag: bool, channels_last: bool, scale: str, varying: bool = False) -> dict:
    from gpulab.lessons.l07_tensor_core_alignment import config, conv_benchmark_in_fresh_process
    from gpulab.models.precision import best_half
    cfg = config(scale)
    cb = cfg["cudnn"] if varying else cfg["cudnn"] | {"varying": ()}
    return conv_benchmark_in_fresh_process(flag, precision=best_half(), repeat=cfg["cudnn_repeat"],
                                           channels_last=channels_last, **cb)


def _ex5(scale: str) -> dict:
    out: dict = {}
    worst_repeat, first_over_steady = 0.0, float("inf")
    for cl in (False, True):
        ms = {}
        for flag in (False, True):
            runs = [_fresh(flag, cl, scale) for _ in range(2)]
            ms[flag] = [r["steady"].median_ms for r in runs]
            worst_repeat = max(worst_repeat, max(ms[flag]) / min(ms[flag]))
            if flag:
                first_over_steady = min(first_over_steady, *(r["first step"].median_ms / r["steady"].median_ms
                                                             for r in runs))
        layout = "channels_last" if cl else "NCHW"
        out[f"{layout}: steady ms, benchmark off (2 runs)"] = " ".join(f"{v:.4g}" for v in ms[False])
        out[f"{layout}: steady ms, benchmark on (2 runs)"] = " ".join(f"{v:.4g}" for v in ms[True])
        out[f"{layout}: on / off (means)"] = sum(ms[True]) / sum(ms[False])
    out["largest ratio between two runs of one setting"] = worst_repeat
    out["least first step / steady step, benchmark on"] = first_over_steady
    return out


def _expect5(f: dict) -> str | None:
    if not f["least first step / steady step, benchmark on"] > 1.0:
        return "with benchmark=True a first step (the search) was no slower than the steady steps"
    return None


def _ex6(scale: str) -> dict:
    from gpulab.lessons.l07_tensor_core_alignment import config
    runs = {flag: _fresh(flag, False, scale, varying=True) for flag in (False, True)}
    off, on = runs[False], runs[True]
    search_ms = max(0.0, on["new sizes"].median_ms - off["new sizes"].median_ms)   # one new size's extra cost
    gain_ms = off["steady"].median_ms - on["steady"].median_ms                    # per step, once searched
    out = {"new sizes tried": len(config(scale)["cudnn"]["varying"]),
           "search cost of one new size (ms)": search_ms, "steady gain per step (ms)": gain_ms,
           "new size, on / off": on["new sizes"].median_ms / off["new sizes"].median_ms}
    for label, sizes in (("10 sizes", 10), ("bucketed into 3 sizes", 3)):
        out[f"{label}: steps to pay back"] = (sizes * search_ms / gain_ms) if gain_ms > 0 else "never (no steady gain)"
    return out


def _expect6(f: dict) -> str | None:
    if not f["new size, on / off"] > 1.0:
        return "a new size cost no more with benchmark=True: no search was paid"
    a, b = f["10 sizes: steps to pay back"], f["bucketed into 3 sizes: steps to pay back"]
    if isinstance(a, float) and not a > b:
        return "bucketing did not shorten the time to pay back"
    return None


ANSWERS = [
    Answer("07", 1, run=_ex1, expect=_expect1, text=(
        "Run the panel with m, then n, then k at 4095 and the other two at 4096. In row-major storage A (m x k) "
        "has rows of k elements and B (k x n) and C rows of n: those row lengths are the leading dimensions "
        "cuBLAS sees, and a row of 4095 16-bit values is not a multiple of 16 bytes, so the kernel cannot use "
        "its aligned vector or TMA loads. m is only the number of rows, never a row's length, so misaligning it "
        "costs little (one partly empty tile row); n and k hurt. On a GPU with Tensor Cores the run checks "
        "that m's product is the fastest of the three.")),
    Answer("07", 2, run=_ex2, expect=_expect2, text=(
        "Time n = 16, 32, 64, ..., 512 in the 16-bit precision and in fp32 with TF32 off. At the small sizes "
        "the time hardly changes with n: a product of 16 x 16 keeps a handful of the GPU's SMs busy for "
        "microseconds, so launch and setup decide, and Tensor Cores do not matter; the 16-bit advantage "
        "appears only as n grows enough to fill the GPU. The seed's 'small matrices like 4x4' is the shape "
        "of a Tensor Core's hardware operation, not a size worth launching a product for: a 4 x 4 product "
        "from PyTorch is all overhead.")),
    Answer("07", 3, run=_ex3, expect=_expect3, text=(
        "Vocabulary 8192, width 768 and sequence 512 are multiples of 64; the 12 heads are a count, and what "
        "the products see is the head size 768 / 12 = 64, also a multiple. Build the GPT with one dimension "
        "odd, for instance the vocabulary 8191, and time its training step beside 8192 with `benchmark`, and "
        "the output layer's product alone. On a GPU with Tensor Cores the odd vocabulary's product is slower "
        "although it does slightly less arithmetic: a 16-bit row of 8191 entries is not a multiple of 16 bytes, "
        "so cuBLAS cannot use its fastest kernels (section 1's rule). Whether the whole step shows it depends on "
        "what paces the step: where the host's launches set the pace (this GPT on a fast GPU: compare the "
        "step's time with the product's), a slower product hides inside the wait, and the two steps' times "
        "differ by no more than their noise. The claim checked is the product's, on a GPU at full size; the "
        "run prints both.")),
    Answer("07", 4, run=_ex4, expect=_expect4, text=(
        "Time the steady training steps of the CNN of section 6 in NCHW and in channels_last with precision "
        "'fp32' (TF32 off), and again in 16-bit, and compare the ratios: `conv_benchmark_in_fresh_process(False, "
        "precision=..., channels_last=...)` with no new sizes, or `conv_step_times`, which it runs, in this "
        "process (with cudnn.benchmark off there is no search cache to empty; the run does that). It also "
        "checks that both layouts give the same fp32 loss from the same weights. In fp32 with TF32 off cuDNN has no Tensor Core kernels to feed, "
        "and its NCHW fp32 kernels are already good, so there are no layout transposes to remove: the gain is "
        "smaller than in 16-bit, where NHWC is the Tensor Cores' native layout (NVIDIA's convolution guide).")),
    Answer("07", 5, run=_ex5, expect=_expect5, needs="cuda", text=(
        "Run the CNN panel's four combinations of channels_last and cudnn.benchmark twice each (each run in a "
        "fresh process, so cuDNN's cache of plans starts empty) and compare the difference between settings "
        "with the difference between two runs of one setting. Typically the benchmark's steady effect is "
        "within that run-to-run noise: with a fixed size the search only picks among kernels whose speed "
        "differs little. What benchmark=True reliably does is make the first step slower, by its search, "
        "which the run checks.")),
    Answer("07", 6, run=_ex6, expect=_expect6, needs="cuda", text=(
        "From section 6 take the extra cost of a new size with benchmark=True (its 'new sizes' step minus "
        "benchmark=False's) and the steady gain per step (False's steady step minus True's). Ten sizes pay "
        "ten searches, so benchmark=True pays back after 10 x search / gain steps, and never if the steady "
        "gain is zero or negative, as it often is; bucketing the sizes (padding or resizing to a few shapes) "
        "cuts the searches to the number of buckets. The run measures both in fresh processes and prints the "
        "two estimates.")),
]
