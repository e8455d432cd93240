"""Reference answers to notebook 13's free-text exercises (the capstone: every toggle together)."""
from __future__ import annotations

import contextlib

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from gpulab.core.device import device_facts, pick_device
from gpulab.core.memory import GiB
from gpulab.core.timing import benchmark
from gpulab.exercises.answers import Answer, one_thread_on_cpu
from gpulab.lessons import l13_capstone as C           # the names notebook 13 uses, as its cells spell them
from gpulab.lessons.capstone.jobs import fit_model
from gpulab.lessons.capstone.runner import CheckpointedBlocks, run_job
from gpulab.models import precision as P
from gpulab.models.sizing import count_flops, fit_batch, memory_budget


def _where(scale: str) -> dict:
    return {"device": pick_device().type, "scale": scale}


def _gpu_full(found: dict) -> bool:
    return found["device"] == "cuda" and found["scale"] == "full"


def _runs(scale: str) -> C.Runs:
    """The notebook's `runs`: every run at `scale`, each job fitted to this GPU (section 4)."""
    runs = C.Runs(scale=scale)
    runs.fit_batches()
    return runs


def _mismatches(steps) -> list[str]:
    """The rows that failed a check of section 5 (not the same training as fp32)."""
    return [s.label for s in steps if s.status == "mismatch"]


def _row(steps, label: str):
    return next((s for s in steps if s.label == label), None)


# -- 1. amp before tf32 -----------------------------------------------------------------------------
def _reversed(scale: str) -> dict:
    facts = device_facts()
    half = P.best_half(facts)
    runs = _runs(scale)
    order = C.ORDERS["gpt"]
    swapped = ("amp", "tf32") + tuple(t for t in order if t not in ("amp", "tf32"))
    out = {**_where(scale), "half": half}
    for name, o in (("as given", order), ("amp first", swapped)):
        steps = C.waterfall("gpt", o, runs, facts=facts, half=half)
        out[f"{name}: mismatches"] = ", ".join(_mismatches(steps)) or "none"
        for s in steps:
            out[f"{name}: {s.label}"] = (f"{s.share_pct:.0f}% of the speed-up, x{s.gain:.2f}"
                                         if s.share_pct is not None and s.gain is not None else s.status)
        for t in ("tf32", "amp"):
            r = _row(steps, f"+ {t}")
            out[f"{name}: gain of {t}"] = r.gain if r is not None and r.counted and r.gain is not None else "-"
        out[f"{name}: total speed-up"] = C.fastest(steps).speedup
    return out


def _reversed_claim(f: dict) -> str | None:
    for name in ("as given", "amp first"):
        if f[f"{name}: mismatches"] != "none":
            return f"{name}: a run did not train the same model as fp32 ({f[f'{name}: mismatches']})"
    first, after = f["as given: gain of tf32"], f["amp first: gain of tf32"]
    if f["device"] == "cuda" and isinstance(first, float) and isinstance(after, float):
        if after > 1.15:
            return f"TF32 after {f['half']} still sped the step up {after:.2f}x"
        if after > first:
            return "TF32 bought more after 16-bit autocast than before it"
    return None


# -- 2. compile in the CNN's waterfall --------------------------------------------------------------
def _cnn_compiled(scale: str) -> dict:
    facts = device_facts()
    runs = _runs(scale)
    steps = C.waterfall("cnn", C.ORDERS["cnn"] + ("compile",), runs, facts=facts, half=P.best_half(facts))
    comp = _row(steps, "+ compile")
    before = [s for s in steps[:steps.index(comp)] if s.counted][-1]
    out = {**_where(scale), "compile row": comp.status, "mismatches": ", ".join(_mismatches(steps)) or "none"}
    if comp.counted:
        r, b = comp.result, before.result
        saved = b.step_ms - r.step_ms
        out.update({"first compiled step ms": r.first_step_ms, "compiled step ms": r.step_ms,
                    f"step ms before ({before.label})": b.step_ms,
                    "steps to pay back (first - compiled) / (before - compiled)":
                        (r.first_step_ms - r.step_ms) / saved if saved > 0 else "never"})
    return out


def _cnn_compiled_claim(f: dict) -> str | None:
    if f["mismatches"] != "none":
        return f"a run did not train the same model as fp32: {f['mismatches']}"
    if "first compiled step ms" not in f:
        return f"the compile row did not run: {f['compile row']}"
    if f["first compiled step ms"] <= f["compiled step ms"]:
        return "the first compiled step was not longer than a warm one: nothing compiled in it"
    return None


# -- 3. CUDA graphs at a small batch ----------------------------------------------------------------
def _graphs(scale: str) -> dict:
    half = P.best_half(device_facts())
    runs = _runs(scale)
    big = runs.batch("cnn")
    small = 16
    compiled = C.Options(amp=half, compile=True)          # the panel's defaults, with compile
    graphs = compiled.adding("cuda_graphs")
    out = {**_where(scale), "big batch": big}
    for batch in dict.fromkeys((small, big)):
        c, g = runs.checked("cnn", compiled, batch), runs.checked("cnn", graphs, batch)
        out[f"batch {batch}: statuses"] = f"{c.status}, {g.status}"
        if c.counted and g.counted:
            out[f"batch {batch}: compile ms"] = c.result.step_ms
            out[f"batch {batch}: + cuda_graphs ms"] = g.result.step_ms
            out[f"batch {batch}: gain of cuda_graphs"] = c.result.step_ms / g.result.step_ms
    return out


def _graphs_claim(f: dict) -> str | None:
    bad = [k for k, v in f.items() if k.endswith("statuses") and any(s not in ("ok", "baseline") for s in v.split(", "))]
    if bad:
        return f"a run was not counted: {', '.join(f'{k} {f[k]}' for k in bad)}"
    small, big = f.get("batch 16: gain of cuda_graphs"), f.get(f"batch {f['big batch']}: gain of cuda_graphs")
    if _gpu_full(f) and small is not None and big is not None and small < 0.95 * big:
        return "CUDA graphs bought less at batch 16 than at the big batch"
    return None


# -- 4. the largest batch in this GPU's memory budget ------------------------------------------------
def _largest(scale: str) -> dict:
    half = P.best_half(device_facts())
    budget = memory_budget(C.MEMORY_CAP)         # section 4's: half of this GPU's usable memory, at most MEMORY_CAP
    runs = C.Runs(scale=scale)
    runs.configs["gpt"], _ = fit_model("gpt", runs.configs["gpt"], int(C.STATE_SHARE * budget))
    memory = C.Options(amp=half, checkpointing=True, accumulation=C.ACCUMULATION)
    plain = C.Options(amp=half)
    wanted = 16 * 64                             # halved until it fits
    batch = fit_batch(lambda b: runs("gpt", memory, b, timed=False).peak_bytes, wanted, budget, probe=C.ACCUMULATION)
    plain_batch = fit_batch(lambda b: runs("gpt", plain, b, timed=False).peak_bytes, wanted, budget, probe=1)
    # correct first, at the notebook's batch, as section 12c does: a batch changes how many samples a step averages,
    # not the arithmetic per sample, and the fp32 reference at the largest batch would not fit the budget
    checked = [runs.checked("gpt", o) for o in (memory, plain)]
    out = {**_where(scale), "budget GiB": budget / GiB, "largest batch, checkpointing + accumulation": batch,
           "largest batch, neither": plain_batch, "checks": ", ".join(c.status for c in checked)}
    if all(c.counted for c in checked):
        big, base = runs("gpt", memory, batch), runs("gpt", plain, plain_batch)
        gib = lambda r: None if r.peak_bytes is None else r.peak_bytes / GiB     # None on the CPU
        out.update({"peak GiB, checkpointing + accumulation": gib(big), "peak GiB, neither": gib(base),
                    f"tokens/s, batch {batch}, checkpointing + accumulation": big.items_per_s,
                    f"tokens/s, batch {plain_batch}, neither": base.items_per_s,
                    "throughput ratio (checkpointing + accumulation / neither)": big.items_per_s / base.items_per_s})
    return out


def _largest_claim(f: dict) -> str | None:
    if "peak GiB, neither" not in f:
        return f"a run failed its checks at the notebook's batch: {f['checks']}"
    peaks = [f["peak GiB, checkpointing + accumulation"], f["peak GiB, neither"]]
    if None not in peaks and max(peaks) > f["budget GiB"]:
        return "a batch the fit chose did not fit the budget"
    if f["largest batch, checkpointing + accumulation"] < f["largest batch, neither"]:
        return "checkpointing and accumulation fitted a smaller batch than neither"
    return None


# -- 5. hardware FLOPs --------------------------------------------------------------------------------
def _flops_of(cfg: dict, batch: int, checkpointing: bool, device: torch.device) -> float:
    """FLOPs of one training step as the hardware runs it, counted like `C.model_flops` (2 samples, scaled)."""
    spec = C.JOBS["gpt"]
    torch.manual_seed(0)
    model = spec.build(cfg, device)
    if checkpointing:
        model.blocks = CheckpointedBlocks(model.blocks)
    x, y = spec.batches(model, 2, 1)[0]
    with contextlib.ExitStack() as stack:
        if device.type == "cpu":
            stack.enter_context(sdpa_kernel(SDPBackend.MATH))      # as model_flops: the CPU's flash has no formula
        return count_flops(lambda: spec.loss_fn(model, x, y).backward()) / 2 * batch


def _hfu(scale: str) -> dict:
    device = pick_device()
    half = P.best_half(device_facts())
    cfg = C.job_config("gpt", scale)
    batch = cfg["batch"]
    padded = dict(cfg, vocab=-(-cfg["vocab"] // C.ALIGN) * C.ALIGN)
    model_f = C.model_flops("gpt", cfg, batch, device)
    padded_f = C.model_flops("gpt", padded, batch, device)
    ckpt_f = _flops_of(cfg, batch, True, device)
    hardware_f = _flops_of(padded, batch, True, device)
    r = run_job("gpt", C.Options(amp=half, aligned=True, checkpointing=True), scale=scale)
    sheet = C.datasheet_peak()                    # MFU and HFU divide by the datasheet's peak (PaLM, appendix B)
    out = {**_where(scale), "model FLOPs": model_f, "padded vocabulary FLOPs": padded_f,
           "checkpointed FLOPs": ckpt_f, "hardware FLOPs (both)": hardware_f,
           "recomputation / model": (ckpt_f - model_f) / model_f,
           "step ms": r.step_ms, "model TFLOP/s": r.tflops,
           "hardware TFLOP/s": r.tflops * hardware_f / model_f}
    if sheet is not None:
        out.update({"MFU": C.mfu(r, sheet), "HFU": C.mfu(r.tflops * hardware_f / model_f, sheet)})
    return out


def _hfu_claim(f: dict) -> str | None:
    if not f["padded vocabulary FLOPs"] >= f["model FLOPs"]:
        return "the padded vocabulary counted fewer FLOPs than the model's"
    if not 0 < f["recomputation / model"] <= 1 / 3 + 0.01:
        return "recomputation is not a positive part of at most one forward pass (a third of the step)"
    if not f["hardware FLOPs (both)"] >= max(f["checkpointed FLOPs"], f["padded vocabulary FLOPs"]):
        return "the hardware count is not above the model count"
    if "HFU" in f and f["HFU"] is not None and f["MFU"] is not None and f["HFU"] < f["MFU"]:
        return "HFU came out below MFU"
    return None


# -- 6. FP8 at the GPT's shapes -----------------------------------------------------------------------
def _fp8_shapes(scale: str) -> dict:
    device = pick_device()
    why = P.fp8_refusal(device_facts())
    if why:
        return {**_where(scale), "skipped": why}
    cfg = C.job_config("gpt", scale)
    m = cfg["batch"] * cfg["seq"]                        # tokens: the rows of every linear layer's input
    out = {**_where(scale), "M (tokens)": m}
    for k in (cfg["width"], cfg["width"] // 4):          # 2048 and 512 at full size
        torch.manual_seed(0)
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        w = torch.randn(k, k, device=device, dtype=torch.bfloat16)      # N x K, as nn.Linear keeps it
        a8, sa = P.to_fp8(a)
        w8, sw = P.to_fp8(w)
        exact = a.float() @ w.float().t()
        got = P.fp8_matmul(a8, sa, w8, sw).float()
        t16 = benchmark(lambda: a @ w.t(), device=device).median_ms
        t8 = benchmark(lambda: P.fp8_matmul(a8, sa, w8, sw), device=device).median_ms
        t8s = benchmark(lambda: P.fp8_matmul(*P.to_fp8(a), *P.to_fp8(w)), device=device).median_ms
        out.update({f"K=N={k}: FP8 relative error": float((got - exact).norm() / exact.norm()),
                    f"K=N={k}: bf16 ms": t16, f"K=N={k}: FP8 alone x bf16": t16 / t8,
                    f"K=N={k}: FP8 with its scaling x bf16": t16 / t8s})
    return out


def _fp8_claim(f: dict) -> str | None:
    if "skipped" in f:
        return None
    bad = [k for k, v in f.items() if k.endswith("relative error") and v > 0.1]
    return f"FP8 products far from fp32's: {', '.join(bad)}" if bad else None


# -- 7 and 9. time to the loss ----------------------------------------------------------------------
def _budget(scale: str) -> float | None:
    return 0.1 if scale == "tiny" else None          # tiny: a short run is enough to compare the curves


def _curves(scale: str, first: C.Options, second: C.Options) -> tuple:
    a = C.time_to_loss(first, budget_s=_budget(scale), scale=scale)
    b = C.time_to_loss(second, target=a.final_loss, budget_s=_budget(scale), scale=scale)
    at = dict((s, loss) for s, _, loss in a.points)
    common = [(at[s], loss) for s, _, loss in b.points if s in at]
    worst = max(abs(x - y) / abs(x) for x, y in common)
    return a, b, worst, len(common)


def _accumulation(scale: str) -> dict:
    half = P.best_half(device_facts())
    alone = C.Options(amp=half)
    split = alone.adding("accumulation")
    a, b, worst, n = _curves(scale, alone, split)
    tol, _ = C.loss_tolerance("gpt", alone)
    return {**_where(scale), "evaluations compared": n, "largest relative loss difference at equal steps": worst,
            "tolerance (16-bit)": tol, f"{alone.label} tokens/s": a.tokens_per_s,
            f"{split.label} tokens/s": b.tokens_per_s, "tokens/s ratio (split / alone)": b.tokens_per_s / a.tokens_per_s}


def _accumulation_claim(f: dict) -> str | None:
    if f["evaluations compared"] < 2:
        return "fewer than two evaluations to compare"
    if f["largest relative loss difference at equal steps"] > f["tolerance (16-bit)"]:
        return "accumulation changed the loss curve per step beyond 16-bit rounding"
    if _gpu_full(f) and f["tokens/s ratio (split / alone)"] > 1.05:
        return "four micro-batches ran faster than one batch"
    return None


def _speedrun(scale: str) -> dict:
    base, fused = C.Options(), C.Options(fused=True)
    a, b, worst, n = _curves(scale, base, fused)
    tol, _ = C.loss_tolerance("gpt", fused)
    out = {**_where(scale), "evaluations compared": n, "largest relative loss difference at equal steps": worst,
           "tolerance (fp32)": tol, "tokens/s ratio (fused / fp32)": b.tokens_per_s / a.tokens_per_s}
    if b.reached:
        out["time-to-loss ratio (fp32 / fused)"] = a.points[-1][1] / b.reached[1]
    return out


def _speedrun_claim(f: dict) -> str | None:
    if f["evaluations compared"] < 2:
        return "fewer than two evaluations to compare"
    if f["largest relative loss difference at equal steps"] > f["tolerance (fp32)"]:
        return "fused AdamW changed the loss curve per step beyond fp32's order-of-sums differences"
    return None


ANSWERS = [
    Answer("13", 1, run=one_thread_on_cpu(_reversed), expect=_reversed_claim, text=(
        "Run `C.waterfall(\"gpt\", (\"amp\", \"tf32\", \"aligned\", \"fused\", \"loader\", \"compile\"), runs)` "
        "beside the order as given: the rows after the first two, and the total, are the same runs (`Runs` "
        "memoizes them), so only the first two shares trade places. Both TF32 and 16-bit autocast speed up the "
        "same matrix products: once autocast runs them in bf16 (or fp16), no fp32 product is left for TF32 to "
        "speed up, because TF32 applies only to fp32 products (PyTorch's CUDA semantics notes, 'TensorFloat-32'). "
        "So TF32 first takes part of what bf16 would have taken, and after bf16 it adds almost nothing. On a GPU "
        "the run checks that TF32's gain after 16-bit is at most 1.15x and below its gain when first. On the CPU "
        "TF32 is refused, and every row is checked against fp32's losses.")),
    Answer("13", 2, needs="triton", run=one_thread_on_cpu(_cnn_compiled), expect=_cnn_compiled_claim, text=(
        "Run the CNN's waterfall with `compile` appended (`C.ORDERS[\"cnn\"] + (\"compile\",)`). The compile row's "
        "first step includes tracing and generating the ResNet's kernels, so it is far longer than its warm steps. "
        "Compiling pays for itself after (first step - compiled step) / (step before - compiled step) steps: the "
        "extra cost of the first step over what each later step saves. A real training run of thousands of "
        "steps pays that back many times; a notebook that times a few steps does not. On the CPU compile is "
        "refused (section 3), so this runs on a GPU with Triton only.")),
    Answer("13", 3, needs="triton", run=one_thread_on_cpu(_graphs), expect=_graphs_claim, text=(
        "Run the CNN with the panel's defaults plus `compile`, then plus `cuda_graphs`, at batch 16 and at the "
        "notebook's batch, each checked against fp32's losses. CUDA graphs remove the host's cost of launching "
        "each kernel, a fixed cost per step that does not grow with the batch (lesson 11). At a big batch every "
        "kernel runs long enough to hide its launch, so graphs buy little; at batch 16 the kernels are short and "
        "launches make up a larger part of the step, so graphs help more. On a GPU at full size the run checks "
        "that the graphs' gain at batch 16 is at least 0.95 of their gain at the big batch.")),
    Answer("13", 4, needs="cuda", run=one_thread_on_cpu(_largest), expect=_largest_claim, text=(
        "With `amp`, `checkpointing` and 4-way `accumulation`, find the batch the way section 4 does: "
        "`sizing.fit_batch` measures two small steps and extrapolates the peak memory in a straight line, halving "
        "from a large batch until the prediction fits section 4's budget (half of this GPU's free memory). Do the "
        "same with `amp` alone, check both at the notebook's batch (the fp32 reference of the largest batch would "
        "not fit), and time the two batches. Checkpointing recomputes each block's forward in backward, and "
        "accumulation runs more, smaller micro-batches, so the tokens per second often do not rise: the larger "
        "effective batch pays only if the training needs it (fewer optimizer steps to a loss, see section 14), "
        "not for speed. The run checks that both chosen batches' measured peaks fit the budget, and that "
        "checkpointing with accumulation fitted at least the batch that neither did.")),
    Answer("13", 5, run=one_thread_on_cpu(_hfu), expect=_hfu_claim, text=(
        "Count the padded model with `C.model_flops` on a config whose vocabulary is rounded up to a multiple of "
        "`C.ALIGN`, and count a checkpointed model's step with `count_flops` (FlopCounterMode sees the recomputed "
        "forward during backward). Hardware FLOPs = both together; HFU is hardware FLOP/s over the datasheet's peak, "
        "MFU model FLOP/s over the same (Chowdhery et al. 2022, appendix B, define both). Recomputation adds at most one "
        "forward pass, a third of the step. HFU says how well the GPU is used, including work that does not train "
        "the model; MFU says how fast the model trains, and it is the one to compare between setups. On the CPU, "
        "or a GPU without a datasheet row, no peak is used, so only the counts are compared.")),
    Answer("13", 6, run=one_thread_on_cpu(_fp8_shapes), expect=_fp8_claim, text=(
        "At the GPT's shapes an input is M = batch x sequence rows of K = width, and a weight N x K: cast both with "
        "`P.to_fp8` (one scale per tensor) and multiply with `P.fp8_matmul`, against `a @ w.t()` in bf16, alone and "
        "with the scaling in front. FP8's Tensor Cores double the datasheet rate, but the scaling reads each "
        "tensor twice (amax, then scale and cast); at width 512 the products are small, so that fixed cost and the "
        "launches outweigh the faster product, while at 2048 the product is large enough that FP8 can win. Check "
        "the FP8 result first: it must stay within e4m3's rounding of the fp32 product. On the CPU or a GPU "
        "without FP8 the times are not a GPU's.")),
    Answer("13", 7, run=one_thread_on_cpu(_accumulation), expect=_accumulation_claim, text=(
        "Run `C.time_to_loss(C.Options(amp=half))`, then the same with `accumulation=4` and its target, and "
        "compare the validation losses at equal steps, then the tokens per second. Four micro-batches of a "
        "quarter each add up to the same gradient as the whole batch (each loss is divided by 4), so the loss "
        "curve per step is the same up to rounding; accumulation only changes the speed, slower, since four "
        "smaller kernels do the work of one larger one. 16-bit autocast changes the rounding of every product, "
        "so it changes the curve a little, within its tolerance, and speeds every step on a GPU.")),
    Answer("13", 9, run=one_thread_on_cpu(_speedrun), expect=_speedrun_claim, text=(
        "A toggle that leaves the arithmetic as it is (fused AdamW, the loader, compile, CUDA graphs, the padded "
        "vocabulary, channels_last) leaves the loss curve per step unchanged, so its step speed-up is its speed-up "
        "to the loss. The run shows it for fused AdamW: its curve matches fp32's at equal steps within fp32's "
        "tolerance. Toggles that round more (TF32, 16-bit, FP8) change the curve a little, so most of their step "
        "speed-up carries over; checkpointing and accumulation do not shorten a step at all, and a larger batch "
        "changes how much each step learns, which only the time to the loss can judge.")),
]
