"""Lesson 07, Tensor Core alignment: its knobs, its experiments and its headline measurement.

Notebook 07 times matrix products around n = 4096, a GPT step with its vocabulary padded, a
ResNet-50-shaped CNN in both memory layouts and `cudnn.benchmark` in fresh processes. This module
holds what the notebook and `gpulab bench` share: the sizes (`CONFIG`, read through `config(scale)`),
`gemm_experiment` (one product, checked against fp32 before it is timed), `alignment` (a row's alignment
in bytes), `vocab_floor` and `layout_floor` (what the checks of the two fixes ask of this GPU),
`conv_step_times` and `conv_benchmark_in_fresh_process` (the cudnn.benchmark runs; `main` is
the child process's command line), and `headline`: the aligned product (n = 4096) against the
misaligned one (n = 4095) in 16-bit.
"""
from __future__ import annotations

import argparse
import copy
import itertools
import json
import subprocess
import sys
from typing import Sequence

import torch

from gpulab.core.device import DeviceFacts, device_facts, pick_device, resolve_scale
from gpulab.core.measured import Measured
from gpulab.core.predict import Plan, Work
from gpulab.core.timing import PACE_STEPS, Pace, benchmark, pace, summarize
from gpulab.lessons.l06_mixed_precision import gpt_forward_flops_per_token, resnet_forward_flops
from gpulab.models.cnn import RESNET50, ResNetish, image_batches
from gpulab.models.precision import GEMM_TOLERANCE, check, classification_loss, fp32_math, make_scaler, refusal
from gpulab.models.step import train_step


def _resnet_layers(scale: str) -> dict:
    """ResNet-50's layer configuration at a scale (`cnn.RESNET50` without image size and batch)."""
    return {k: RESNET50[scale][k] for k in ("depths", "width", "classes")}


# -- knobs ------------------------------------------------------------------------------------------
TITLE = "Tensor Core alignment"
HEADLINE = "matmul TFLOP/s, n=4096 / n=4095"      # the metric bands.toml judges
CONFIG = {
    "tiny": dict(
        sizes=[240, 248, 252, 254, 255, 256, 257, 258, 260, 264, 272],   # n of the n x n x n products swept
        aligned=256, misaligned=255,     # the headline's pair: a multiple of 64, and one less
        gemm_repeat=10,                  # timed calls per matrix product
        repeat=5,                        # timed training steps (GPT vocabulary, CNN layouts)
        cudnn_repeat=5,                  # timed steady steps in each cudnn.benchmark process
        lm=dict(vocab=1001, n_blocks=2, width=64, heads=4, seq=32, batch=4),  # an odd vocabulary, as GPT-2's
        cnn=dict(RESNET50["tiny"]),      # channels_last: a tiny ResNetish, batch 16
        cudnn=dict(fixed=32, varying=(40, 48), batch=8, **_resnet_layers("tiny")),  # image sizes: fixed, new
    ),
    "full": dict(
        sizes=[4064, 4080, 4088, 4092, 4094, 4095, 4096, 4097, 4098, 4100, 4104, 4112, 4128],
        aligned=4096, misaligned=4095,
        gemm_repeat=20,
        repeat=10,
        # the steady cudnn.benchmark on/off ratio spread 0.80 - 1.39 over seven H200 runs of 10 steps each
        # (results/*.json, lesson 07, cudnn_benchmark_steady_ratio): 30 steps (~15 ms each at batch 32), after
        # 3 warm-up steps, so the learner sees each setting's spread beside the ratio
        cudnn_repeat=30,
        lm=dict(vocab=50257, n_blocks=12, width=768, heads=12, seq=1024, batch=8),  # GPT-2 small's shapes
        cnn=dict(RESNET50["full"]),      # ResNet-50's layer shapes on 224 x 224 images, batch 128
        cudnn=dict(fixed=RESNET50["full"]["image"], varying=(192, 256), batch=32, **_resnet_layers("full")),
    ),
}


def config(scale: str | None = None) -> dict:
    """This lesson's knobs at a scale ('tiny' or 'full'; default: the course's, `GPULAB_SCALE`)."""
    return copy.deepcopy(CONFIG[resolve_scale(scale)])      # a copy: the notebook may change its own


# -- how long notebook 07 takes (gpulab.core.predict) -------------------------------------------------
# seconds no GPU changes: the reference run below (66.7 s) less its GPU work there (4.0 s, the plan before
# issue 15); the tiny scale keeps the same figure (its GPU work is a few ms, its start-up and imports are not
# smaller). + 8 s: the CNN panel's default run (issue 15), a fresh Python process that imports torch and
# loads cuDNN (a planning figure until a GPU run measures it; section 6's two processes, with their
# searches, took 46 s together in that run)
HOST_S = 62.7 + 8.0
HOST_SOURCE = ("wall time of notebook 07 in results/course/2026-11-30-h200-00-to-09-at-fcf1941/h200-2026-11-30-s3-course-timings.tsv (H200, torch 2.11, "
               "2026-11-30) minus its GPU work at that run's ceilings, plus 8 s planned for the CNN panel's "
               "fresh process (issue 15)")


def plan(scale: str | None = None) -> Plan:
    """What notebook 07 asks of the GPU at `scale` (gpulab.core.predict): the products of section 3's sweep
    (fp16 and bf16), of the headline and of the panel; the GPT steps of the vocabulary runs; the CNN steps
    of the layout runs and of the two cudnn.benchmark processes, at the config's batches (an upper bound:
    the notebook may lower them on a smaller GPU). 16-bit training runs in bf16, as on the reference H200;
    the products' first precision is fp16 (`gemm_precisions`). A training step is 3 forwards. Shares:
    what the reference run reached (07's records in results/course/2026-11-30-h200-00-to-09-at-775ae4a/h200-2026-11-30-course.json): a product with
    16-byte rows at its 16-bit ceiling, one without at about a fifth; the GPT step about 0.28 of bf16's;
    the CNN 0.08 (NCHW) and 0.15 (channels_last)."""
    cfg = config(scale)
    first, gpt, cnn, cb = "fp16", cfg["lm"], cfg["cnn"], cfg["cudnn"]

    # products: gemm_experiment(n, repeat=r) multiplies 1 (its check) + 3 (warm-up) + r times in 16-bit,
    # and once in fp32 (the reference); (m, n, k) of each call, by precision
    a, b, r = cfg["aligned"], cfg["misaligned"], cfg["gemm_repeat"]
    calls = {p: [(a, a, a, 1)] + [(n, n, n, r) for n in cfg["sizes"]] for p in ("fp16", "bf16")}  # warm-up, sweep
    calls[first] += [(a, a, a, 1), (a, a, a, r), (b, b, b, r),     # headline: warm-up, aligned, misaligned
                     (a, a, a, r), (a, a, b, r)]                     # panel: its default, then k = misaligned
    half = {"aligned": {"fp16": 0.0, "bf16": 0.0}, "misaligned": {"fp16": 0.0, "bf16": 0.0}}
    fp32_check = 0.0
    for p, todo in calls.items():
        for m, n, k, repeat in todo:
            rows = "aligned" if min(alignment(n), alignment(k)) >= 16 else "misaligned"
            half[rows][p] += (4 + repeat) * 2 * m * n * k
            fp32_check += 2 * m * n * k

    # GPT: per padding (1, 2, 8, 64), 2 warm-up + `repeat` timed steps in bf16, and 2 fp32 forwards on 2
    # sequences (the logits check); once a forward and backward on 1 sequence in fp32 (section 4's FLOP count)
    def gpt_token(vocab: int) -> int:
        return gpt_forward_flops_per_token(**(gpt | {"vocab": vocab}))
    padded = [-(-gpt["vocab"] // m) * m for m in (1, 2, 8, 64)]
    gpt_steps = sum((2 + cfg["repeat"]) * 3 * gpt_token(v) * gpt["seq"] * gpt["batch"] for v in padded)
    gpt_steps += 3 * gpt_token(padded[-1]) * gpt["seq"] * (1 + 2)      # fit_batch's probe steps, batches 1 and 2
    gpt_fp32 = sum(2 * gpt_token(v) * gpt["seq"] * 2 for v in padded) + 3 * gpt_token(gpt["vocab"]) * gpt["seq"]

    # CNN: each layout 3 warm-up + `repeat` timed steps; each cudnn.benchmark process (off, on) one start-up
    # step (64 px, conv_step_times's startup_size), the first step, 1 warm-up + `repeat` steady steps and
    # one step per new size
    def cnn_image(c: dict, image: int) -> int:
        return 3 * resnet_forward_flops(c["depths"], c["width"], c["classes"], image)
    n_layout = 3 + cfg["repeat"]
    layout_step = cnn_image(cnn, cnn["image"]) * cnn["batch"]
    steady = 1 + STEADY_WARMUP + cfg["cudnn_repeat"] + min(cfg["cudnn_repeat"], PACE_STEPS)   # + pace's steps
    n_cudnn = 2 * (1 + steady + len(cb["varying"]))
    cudnn = 2 * cb["batch"] * (cnn_image(cb, 64) + steady * cnn_image(cb, cb["fixed"])
                               + sum(cnn_image(cb, s) for s in cb["varying"]))
    # the panels' default runs: a GPT step padded to a multiple of 64 (2 warm-up + `repeat`); the CNN in
    # channels_last with cudnn.benchmark off, in a fresh process (start-up step, then `steady` steps)
    panels = (2 + cfg["repeat"]) * 3 * gpt_token(padded[-1]) * gpt["seq"] * gpt["batch"]
    cnn_panel = cb["batch"] * (cnn_image(cb, 64) + steady * cnn_image(cb, cb["fixed"]))

    return Plan(host_s=HOST_S, host_source=HOST_SOURCE, work=[
        *(Work(f"matmul_{p}", half[rows][p], 1.0 if rows == "aligned" else 0.2, f"{p} products, {rows} rows")
          for rows in half for p in half[rows]),
        Work("matmul_fp32", fp32_check, 0.9, "fp32 reference of every product"),
        Work("matmul_bf16", gpt_steps, 0.28, f"GPT: {4 * (2 + cfg['repeat'])} bf16 steps, 4 vocabularies"),
        Work("matmul_fp32", gpt_fp32, 0.7, "GPT: fp32 logits checks and the FLOP count"),
        Work("matmul_bf16", n_layout * layout_step, 0.08, f"CNN: {n_layout} bf16 steps, NCHW"),
        Work("matmul_bf16", n_layout * layout_step, 0.15, f"CNN: {n_layout} bf16 steps, channels_last"),
        Work("matmul_bf16", cudnn, 0.08, f"CNN: {n_cudnn} bf16 steps of batch {cb['batch']}, cudnn.benchmark off/on"),
        Work("matmul_bf16", panels, 0.28, f"GPT panel: {2 + cfg['repeat']} bf16 steps, padded vocabulary"),
        Work("matmul_bf16", cnn_panel, 0.15, f"CNN panel: {1 + steady} bf16 steps, channels_last"),
    ])


# -- notebook 07's checks of the two fixes, from this GPU's own prediction and class ------------------------
# Padding the vocabulary: section 4 predicts the step-time ratio 1 + share x (slow-down - 1) from the output layer's
# share of the step and section 3's square-product slow-down. That charges each of the head's three products the
# penalty of a product whose three matrices all have odd rows, where in each of them only the matrices with a row
# per token (the logits, their gradient) do, so it overstates: the H200 measured 1.39 against 2.08 predicted, 36 %
# of the predicted gain (results/course/2026-12-03-h200-00-to-15, the outputs of notebook 07's cells 12 and 14).
# The check asks for VOCAB_GAIN_SHARE of the predicted gain, and is skipped where the prediction is under
# VOCAB_WORTH: a gain that small is not told from the steps' noise.
VOCAB_GAIN_SHARE = 0.25
VOCAB_WORTH = 1.2
# channels_last: the floor asked of the layout where the class's alignment band (bands.toml, lesson 07) has a low
# end above 1, the classes whose Tensor Cores are fast enough that what feeds them (aligned rows, a layout without
# transposes) shows (tensor-core, pre-ampere); where that low end is 1 (GeForce, power-capped: 16-bit at twice
# fp32, or held at the power limit) the layout's gain is shown, not judged.
LAYOUT_LOW = 1.1


def vocab_floor(predicted: float) -> tuple[float | None, str]:
    """(the least step-time ratio, unpadded / padded, that notebook 07's vocabulary check asks for, why) from
    section 4's `predicted` ratio; (None, why not) where the prediction is too small to check."""
    if predicted < VOCAB_WORTH:
        return None, (f"section 4 predicted only {predicted:.2f}x from section 3's slow-down: a gain under "
                      f"{VOCAB_WORTH:g}x is not told from the steps' noise")
    low = 1 + VOCAB_GAIN_SHARE * (predicted - 1)
    return low, (f"{VOCAB_GAIN_SHARE:.0%} of the gain section 4 predicted ({predicted:.2f}x), which overstates it: "
                 "each of the head's three products has odd rows in one of its three matrices (the logits or their "
                 "gradient), not in all three")


def layout_floor(facts: DeviceFacts | None = None) -> tuple[float | None, str]:
    """(the floor of notebook 07's channels_last / NCHW check on this GPU's class, why), or (None, why it is not
    judged here): LAYOUT_LOW where the class's lesson-07 band (bands.toml) has a low end above 1, none where it is
    1 or the class has no band, none under a GPU profile (the class is the profile's, the timing this GPU's)."""
    from gpulab.core.bands import gpu_class, load_bands
    facts = facts or device_facts()
    cls = gpu_class(facts)
    band = load_bands().band(cls, "07")
    if band is None or not band.applies:
        return None, band.why if band is not None and band.why else f"no lesson-07 band for class {cls}"
    if facts.profile:
        return None, (f"emulating the {facts.profile} profile: the class ({cls}) is the profile's, the timing this "
                      "GPU's, so it is not judged")
    if band.low <= 1.0:
        return None, (f"on {cls} GPUs the alignment band's low end is {band.low:g} (gpulab/core/bands.toml, [{cls}.07]): "
                      "their Tensor Cores are slow enough (16-bit at twice fp32, or held at the power limit) that "
                      "what feeds them, aligned rows or a layout without transposes, may gain little; shown, not judged")
    return LAYOUT_LOW, (f"on {cls} GPUs a product with misaligned rows is at least {band.low:g}x slower (bands.toml, "
                        f"[{cls}.07]): how the Tensor Cores' operands are laid out shows, so channels_last must gain "
                        f"at least {LAYOUT_LOW:g}x")


def gemm_precisions(facts: DeviceFacts | None = None) -> list[str]:
    """The 16-bit precisions the products are timed in: fp16 and bf16 where this GPU runs them, bf16 alone
    on the CPU (fp16 products take a slow path there). The headline times the first."""
    facts = facts or device_facts()
    if facts.kind != "cuda":
        return ["bf16"]
    return [p for p in ("fp16", "bf16") if refusal(p, facts) is None]


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
    a, b = operands(m, k, n, spec.dtype or torch.float32, device)
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


def operands(m: int, k: int, n: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A (m x k) and B (k x n) of a product, drawn from seed 0 in fp32 and cast to `dtype`."""
    g = torch.Generator(device=device).manual_seed(0)
    return (torch.randn(m, k, generator=g, device=device).to(dtype),
            torch.randn(k, n, generator=g, device=device).to(dtype))


def alignment(n: int, element_bytes: int = 2) -> int:
    """The largest power of two, up to 256 bytes, that divides a row of n elements: 2 for n = 4095 in fp16,
    256 for n = 4096. Tensor Core kernels want at least 16 bytes."""
    row = n * element_bytes
    a = 1
    while a < 256 and row % (2 * a) == 0:
        a *= 2
    return a


# -- notebook 07: cudnn.benchmark, measured in a fresh process ------------------------------------
# cuDNN keeps the convolution plan it chose for each shape (and dtype, layout, ...) for the life
# of the process, whatever torch.backends.cudnn.benchmark says when it is reused. Comparing the
# flag on and off on the same shapes inside one process would time the first setting's choices
# twice, so each setting runs in its own process.
_FULL = RESNET50["full"]      # the defaults below: ResNet-50 on 224 x 224 images
# Untimed steps at the fixed size after the first one (where cuDNN chooses, or with benchmark=True searches,
# its plans for the forward and both backward convolutions) and before the steady steps are timed
STEADY_WARMUP = 3


def conv_step_times(benchmark_on: bool, fixed: int = _FULL["image"], varying: Sequence[int] = (160, 192, 256),
                    batch: int = 32, precision: str = "bf16", depths: Sequence[int] = _FULL["depths"],
                    width: int = _FULL["width"], classes: int = _FULL["classes"], repeat: int = 10,
                    startup_size: int = 64, channels_last: bool = False) -> dict:
    """Training-step times of a ResNetish with torch.backends.cudnn.benchmark = `benchmark_on`,
    in *this* process (run it in a fresh one: see conv_benchmark_in_fresh_process). Notebook 07.

    - "start-up": one step on `startup_size` images, which loads cuDNN and cuBLAS (with the search
      off in both settings: autotuning shapes that are never used again would only add time);
    - "first step": the first step on `fixed`-size images (cuDNN picks its plans for this shape; with
      benchmark=True it times the candidates of every convolution, forward and backward, here);
    - "steady": `repeat` further steps on the same size, after `STEADY_WARMUP` untimed ones;
    - "new sizes": one step per size in `varying`, each size new to the process (left out if `varying`
      is empty).
    Between "steady" and "new sizes", PACE_STEPS more steady steps under a kernel-only profile say what paces
    the step (`timing.pace`: the GPU's busy share), returned as "pace" (None on the CPU).
    Model and images are in `channels_last` (NHWC) or the default NCHW layout, the same in both settings.
    Returns the samples (ms) of each, the device and the timing method.
    """
    sizes = [startup_size, fixed, *varying]
    if len(set(sizes)) != len(sizes) or min(sizes) < 32:
        raise ValueError(f"the start-up size, the fixed size and the varying sizes must all differ and be "
                         f">= 32 pixels (got {startup_size}, {fixed}, {list(varying)}).")
    check(precision)
    device = pick_device()
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = False           # the start-up step below: loading, no search
    try:
        torch.manual_seed(0)
        model = ResNetish(tuple(depths), width, classes, image=fixed, device=device)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        scaler = make_scaler(precision, device)

        def step(xy: tuple[torch.Tensor, torch.Tensor]) -> None:
            train_step(model, *xy, loss=classification_loss, optimizer=opt, precision=precision, scaler=scaler)

        startup = image_batches(model, batch, count=1, size=startup_size, channels_last=channels_last)[0]
        fixed_batches = image_batches(model, batch, count=2, channels_last=channels_last)
        new_batches = iter([image_batches(model, batch, count=1, size=s, channels_last=channels_last)[0]
                            for s in varying])
        cycle = itertools.cycle(fixed_batches)
        times = {"start-up": benchmark(lambda: step(startup), warmup=0, repeat=1, device=device)}
        torch.backends.cudnn.benchmark = benchmark_on
        times |= {
            "first step": benchmark(lambda: step(next(cycle)), warmup=0, repeat=1, device=device),
            "steady": benchmark(lambda: step(next(cycle)), warmup=STEADY_WARMUP, repeat=repeat, device=device),
        }
        busy = pace(lambda: step(next(cycle)), steps=min(repeat, PACE_STEPS), device=device)   # None on the CPU
        if varying:
            times["new sizes"] = benchmark(lambda: step(next(new_batches)), warmup=0, repeat=len(varying),
                                           device=device)
    finally:
        torch.backends.cudnn.benchmark = before
    t = times["steady"]
    return {"benchmark": benchmark_on, "device": t.device, "method": t.method, "fixed": fixed,
            "varying": list(varying), "batch": batch, "precision": precision, "channels_last": channels_last,
            "samples_ms": {k: list(v.samples_ms) for k, v in times.items()},
            "pace": None if busy is None else {"busy_ms": busy.busy_ms, "step_ms": busy.step_ms, "steps": busy.steps}}


def conv_benchmark_in_fresh_process(benchmark_on: bool, fixed: int = _FULL["image"],
                                    varying: Sequence[int] = (160, 192, 256), batch: int = 32,
                                    precision: str = "bf16", depths: Sequence[int] = _FULL["depths"],
                                    width: int = _FULL["width"], classes: int = _FULL["classes"], repeat: int = 10,
                                    channels_last: bool = False, timeout_s: float = 300) -> dict:
    """`conv_step_times` in a new Python process (fresh cuDNN caches); returns a `Timing` per phase, and "pace":
    what paced the steady steps (`timing.Pace`, None on the CPU). Notebook 07."""
    cmd = [sys.executable, "-m", "gpulab.lessons.l07_tensor_core_alignment", "--benchmark", "on" if benchmark_on else "off",
           "--fixed", str(fixed), "--varying", ",".join(map(str, varying)), "--batch", str(batch),
           "--precision", precision, "--depths", ",".join(map(str, depths)), "--width", str(width),
           "--classes", str(classes), "--repeat", str(repeat)] + (["--channels-last"] if channels_last else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode == 2:          # the child refused the settings
        raise ValueError(proc.stderr.strip().splitlines()[-1].removeprefix("gpulab.lessons.l07_tensor_core_alignment: "))
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError("the cudnn.benchmark process failed: " + " | ".join(tail))
    raw = json.loads(proc.stdout.strip().splitlines()[-1])
    out: dict = {k: summarize(v, raw["device"], raw["method"]) for k, v in raw["samples_ms"].items()}
    out["pace"] = Pace(**raw["pace"]) if raw.get("pace") else None
    return out


def main(argv: list[str] | None = None) -> int:
    """The child process of `conv_benchmark_in_fresh_process`: `conv_step_times` with these arguments, as JSON."""
    def ints(text: str) -> list[int]:
        return [int(v) for v in text.split(",") if v]

    p = argparse.ArgumentParser(description="Time a ResNetish training step with cudnn.benchmark on or off "
                                            "(notebook 07); print JSON.")
    p.add_argument("--benchmark", choices=("on", "off"), required=True)
    p.add_argument("--fixed", type=int, default=_FULL["image"])
    p.add_argument("--varying", type=ints, default=[160, 192, 256])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--precision", default="bf16")
    p.add_argument("--depths", type=ints, default=list(_FULL["depths"]))
    p.add_argument("--width", type=int, default=_FULL["width"])
    p.add_argument("--classes", type=int, default=_FULL["classes"])
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--channels-last", action="store_true", help="model and images in NHWC (channels_last)")
    a = p.parse_args(argv)
    try:
        out = conv_step_times(a.benchmark == "on", a.fixed, a.varying, a.batch, a.precision, a.depths,
                              a.width, a.classes, a.repeat, channels_last=a.channels_last)
    except ValueError as err:
        print(f"gpulab.lessons.l07_tensor_core_alignment: {err}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


def headline(scale: str | None = None) -> Measured:
    """The aligned product (n = 4096 at full scale) against the misaligned one (n = 4095), in the first of
    `gemm_precisions`; each is checked against fp32 before it is timed (`gemm_experiment`)."""
    cfg = config(scale)
    p = gemm_precisions()[0]
    aligned, misaligned, repeat = cfg["aligned"], cfg["misaligned"], cfg["gemm_repeat"]
    gemm_experiment(aligned, p, repeat=1)        # loads the math library's kernels first
    fast = gemm_experiment(aligned, p, repeat=repeat)     # each checked against fp32 first
    slow = gemm_experiment(misaligned, p, repeat=repeat)
    how = ""
    from gpulab.core.monitor import sharing_mark
    shared = sharing_mark().get("shared")
    if shared:           # others use this GPU: time the two in turns, so their load falls on both alike
        fast["TFLOP/s"], slow["TFLOP/s"] = gemm_pair_interleaved(aligned, misaligned, p, repeat)
        how = f"; timed in turns (A B B A ...): the GPU is shared ({shared})"
    return Measured(slow["TFLOP/s"], fast["TFLOP/s"], "TFLOP/s", fast["TFLOP/s"] / slow["TFLOP/s"], True,
                    f"relative error against fp32: {fast['rel. error']:.1e} ({aligned}), "
                    f"{slow['rel. error']:.1e} ({misaligned}){how}", f"{p}, n={misaligned}", f"{p}, n={aligned}")


def gemm_pair_interleaved(n_a: int, n_b: int, precision: str, repeat: int) -> tuple[float, float]:
    """TFLOP/s of the n_a and n_b square products in `precision`, timed in turns (`timing.interleaved`);
    both were checked against fp32 by `gemm_experiment` before this is called."""
    from gpulab.core.timing import interleaved
    spec = check(precision)
    device = pick_device()
    ops = {n: operands(n, n, n, spec.dtype or torch.float32, device) for n in (n_a, n_b)}
    with fp32_math(spec.fp32_mode):
        t = interleaved({f"n={n}": (lambda a=a, b=b: a @ b) for n, (a, b) in ops.items()},
                        rounds=max(2, repeat // 3), repeat=3)
    del ops
    return tuple(t[f"n={n}"].per_second(2 * n**3) / 1e12 for n in (n_a, n_b))


if __name__ == "__main__":
    raise SystemExit(main())
