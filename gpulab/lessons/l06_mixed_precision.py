"""Lesson 06, mixed precision: its knobs, its two workloads and its headline measurement.

Notebook 06 trains the same models, from the same weights on the same data, in fp32 (TF32 off),
TF32, fp16 with a GradScaler and bf16. This module holds what the notebook and `gpulab bench`
share: the sizes (`CONFIG`, read through `config(scale)`), the workloads (`cnn_workload`,
`gpt_workload`), the code that checks and times each precision (`first_loss`, `precision_run`,
`step_peak`, `timed_precisions`), whether a run's loss curve learned as much as fp32's against a measured noise
floor (`reordered_curve`, `curve_verdict`), fp16's underflow made countable (`unscaled_gradients`,
`lost_fraction`), and `headline`: the CNN's training throughput in fp32 against the fastest 16-bit
autocast, after each precision's first loss has been checked against fp32's. The training step
itself is `gpulab.models.step.train_step`, with autocast and the GradScaler inside.
"""
from __future__ import annotations

import copy
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from gpulab.core.device import DeviceFacts, device_facts, pick_device, resolve_scale
from gpulab.core.measured import Measured
from gpulab.core.memory import GiB, track_peak
from gpulab.core.predict import Plan, Work
from gpulab.core.rates import PRODUCT_SHARE_MIN, speedup_floor  # noqa: F401 (the notebook imports them here)
from gpulab.core.timing import PACE_STEPS, benchmark, pace
from gpulab.models.cnn import RESNET50, ResNetish, image_batches
from gpulab.models.gpt import GPT, token_batches
from gpulab.models.precision import (SPECS, LossFn, check, classification_loss, fp32_math, language_model_loss,
                                     make_scaler, supported)
from gpulab.models.same import SAME_MAX_FLOOR
from gpulab.models.sizing import fit_batch, memory_budget
from gpulab.models.step import train_step

# -- knobs ------------------------------------------------------------------------------------------
TITLE = "mixed precision"
HEADLINE = "CNN images/s, best 16-bit / fp32"      # the metric bands.toml judges
CONFIG = {
    "tiny": dict(
        cnn=dict(RESNET50["tiny"], batch=32),   # a tiny ResNetish (1 block per stage, width 8, 32 px), batch 32
        gpt=dict(vocab=256, n_blocks=2, width=64, heads=4, seq=32, batch=8),   # 2 blocks of width 64
        steps=24,             # training steps per precision for the notebook's loss curves
        repeat=5,             # timed CNN steps after them (the notebook and the headline)
        gpt_repeat=8,         # timed GPT steps (its 16-bit steps are short and vary: more of them)
        headline_steps=1,     # the headline's untimed steps before its timed ones (no loss curve needed)
        underflow_batch=4,    # images in the batch whose gradients section 8 counts
    ),
    "full": dict(
        cnn=dict(RESNET50["full"]),             # ResNet-50's layer shapes on 224 x 224 images, batch 128
        gpt=dict(vocab=8192, n_blocks=6, width=768, heads=12, seq=512, batch=16),  # six blocks of lesson 09
        steps=32, repeat=10, headline_steps=2, underflow_batch=16,
        # the GPT's 16-bit steps take ~10-20 ms on an H200 and their throughput varied from run to run
        # (results/*.json, lesson 06, gpt_tokens_per_s_fp16 / _bf16): 30 timed steps, median and spread
        gpt_repeat=30,
    ),
}
MEMORY_CAP = 64 * GiB   # a batch is halved until an fp32 step fits min(this, half the free GPU memory)
BATCHES = 4             # distinct batches per workload, cycled
# Largest accepted relative difference of the starting weights' loss in each precision to fp32's
# (notebook 06, section 6, and the headline): 16-bit products round each input to 8 (bf16) or
# 11 (fp16) significant bits, TF32 to 11.
FIRST_LOSS_TOLERANCE = {"fp32": 0.0, "tf32": 1e-2, "fp16": 1e-2, "bf16": 2e-2}


# The floors of notebook 06's GPT and TF32 checks come from gpulab.core.rates, the model the bands of lessons 06
# and 13 are derived from (one model: the checks, the bands and `what_to_expect` cannot disagree).
def rate_ratio(fast: str, slow: str = "fp32") -> tuple[float | None, str]:
    """(this GPU's matmul_{fast} / matmul_{slow} ceiling, where the two figures come from): notebook 00's
    measurements, else the datasheet's (never a profile's: the timings it judges are this GPU's), else (None, why)."""
    from gpulab.core.ceilings import ceilings
    facts = device_facts()
    whose = f"this GPU's ({facts.emulated_on}, running the {facts.profile} profile)" if facts.profile else "this GPU's"
    c = ceilings()
    a, b = c.get(f"matmul_{fast}"), c.get(f"matmul_{slow}")
    if a is None or b is None or b.value <= 0:
        return None, (f"no {fast} and {slow} matrix-product ceilings for this GPU under the {facts.profile} profile "
                      "(run notebook 00 under it first)" if facts.profile else
                      f"no {fast} and {slow} matrix-product ceilings for this GPU (run notebook 00 first)")
    return a.value / b.value, f"{whose} {fast} {a.value:,.4g} / {slow} {b.value:,.4g} TFLOP/s, {a.source}"


# A TF32 product at least this much faster than an fp32 one is worth a check; under it (GeForce: TF32 at the fp32
# rate) there is nothing to expect. The TF32 check's floor is capped lower than the 16-bit one's: only the
# convolutions change, the CNN's activations stay fp32.
TF32_WORTH = 1.5
TF32_CAP = 1.3


@dataclass(frozen=True)
class Expectation:
    """One of notebook 06's speed checks as this GPU's rates set it, before anything is timed: the band or floor
    it will be judged by, where that comes from, or why the check cannot happen here (never passed then)."""

    name: str
    low: float | None
    high: float | None
    applies: bool
    why: str

    def line(self) -> str:
        if not self.applies:
            return f"{self.name}: skipped here: {self.why}"
        band = (f"at least {self.low:.3g}x" if self.high is None else f"between {self.low:.3g}x and {self.high:.3g}x")
        return f"{self.name}: {band}: {self.why}"


def expectations(facts: DeviceFacts | None = None, half: str | None = None) -> dict[str, Expectation]:
    """What notebook 06's self-checks (section 9) will ask of this GPU, from the rates they use, so that section 2
    can say it first and section 9 judges by the very same numbers:

    - "cnn": the CNN's best 16-bit / fp32 images/s, the band of this GPU's class (bands.toml, derived from the
      class's datasheet rates: gpulab.core.rates); under a GPU profile it is not judged (the timings are this GPU's);
    - "gpt": the GPT's `half` / fp32 tokens/s, at least `speedup_floor` of this GPU's own `half` / fp32 ceilings
      (`rate_ratio`: notebook 00's measurements, else this GPU's datasheet);
    - "tf32": the CNN's tf32 / fp32 images/s, at least `speedup_floor` (capped at TF32_CAP) of this GPU's tf32 / fp32
      ceilings; skipped, with the reason, where there is no TF32 (the CPU, Volta, Turing) or TF32 runs at about
      the fp32 rate (GeForce).

    The checks that need a GPU at full size say so in the notebook; these are the rates' part."""
    from gpulab.core.bands import gpu_class, load_bands
    from gpulab.models.precision import best_half

    facts = facts or device_facts()
    half = half or best_half(facts)
    out = {}
    cls = gpu_class(facts)
    band = load_bands().band(cls, "06")
    cnn = "CNN best 16-bit / fp32 images per second"
    cpu = (f"CPU run (the {facts.profile} profile's control flow): no GPU to time" if facts.profile else
           "CPU run: no Tensor Cores, and tiny sizes")
    if not facts.on_gpu:
        out["cnn"] = Expectation(cnn, None, None, False, cpu)
    elif band is None or not band.applies:
        out["cnn"] = Expectation(cnn, None, None, False, band.why if band is not None and band.why else
                                 f"no band for lesson 06 in class {cls}")
    elif facts.profile:
        out["cnn"] = Expectation(cnn, band.low, band.high, False,
                                 f"emulating the {facts.profile} profile: the {cls} band [{band.low:g}, {band.high:g}] "
                                 "is a real card's, the timing this GPU's, so it is not judged")
    else:
        out["cnn"] = Expectation(cnn, band.low, band.high, True,
                                 f"the band of this GPU's class, {cls} (gpulab/core/bands.toml, derived from the "
                                 "class's datasheet rates by gpulab.core.rates)")
    gpt = f"GPT {half} / fp32 tokens per second"
    if not facts.on_gpu or facts.tensor_core_generation is None:
        out["gpt"] = Expectation(gpt, None, None, False, cpu if not facts.on_gpu else "no Tensor Cores on this GPU")
    else:
        ratio, source = rate_ratio(half)
        floor = speedup_floor(ratio)
        out["gpt"] = (Expectation(gpt, None, None, False, source) if floor is None else
                      Expectation(gpt, floor, None, True,
                                  f"its products {ratio:.3g}x faster in {half} ({source}), at least "
                                  f"{PRODUCT_SHARE_MIN:.0%} of the fp32 step, the rest no faster (Amdahl), capped at 2x"))
    tf32 = "CNN tf32 / fp32 images per second"
    if facts.kind != "cuda":
        out["tf32"] = Expectation(tf32, None, None, False, "CPU run: TF32 is a Tensor Core format of NVIDIA GPUs")
    elif not facts.tf32:
        cc = facts.compute_capability
        out["tf32"] = Expectation(tf32, None, None, False,
                                  f"no TF32 on {facts.architecture} (compute capability {cc[0]}.{cc[1]}): it arrived "
                                  "with Ampere (8.0), so fp32 products and convolutions run as IEEE fp32 and there is "
                                  "no TF32 run to compare")
    elif not facts.on_gpu:
        out["tf32"] = Expectation(tf32, None, None, False, cpu)
    else:
        ratio, source = rate_ratio("tf32")
        if ratio is None:
            out["tf32"] = Expectation(tf32, None, None, False, source)
        elif ratio < TF32_WORTH:
            out["tf32"] = Expectation(tf32, None, None, False,
                                      f"TF32 products are not much faster than fp32 ones on this GPU ({ratio:.3g}x: "
                                      f"{source}): nothing to expect")
        else:
            out["tf32"] = Expectation(tf32, speedup_floor(ratio, cap=TF32_CAP), None, True,
                                      f"its products {ratio:.3g}x faster in TF32 ({source}), the same Amdahl floor, "
                                      f"capped at {TF32_CAP:g}x (only the convolutions change)")
    if facts.profile:        # the model sized for the profile's class, the floor and the timing this GPU's
        for key in ("gpt", "tf32"):
            e = out[key]
            if e.applies:
                out[key] = Expectation(e.name, e.low, e.high, False,
                                       f"emulating the {facts.profile} profile: {e.why}; the model is sized for that "
                                       "class and timed on this GPU, so the ratio is neither GPU's and is not judged")
    return out


def config(scale: str | None = None) -> dict:
    """This lesson's knobs at a scale ('tiny' or 'full'; default: the course's, `GPULAB_SCALE`)."""
    return copy.deepcopy(CONFIG[resolve_scale(scale)])      # a copy: the notebook may change its own


# -- how long notebook 06 takes (gpulab.core.predict) -------------------------------------------------
# seconds no GPU changes: the reference run below (48.7 s) less its GPU work there (25.2 s); the tiny scale
# keeps the same figure (its GPU work is a few ms, its start-up and imports are not smaller)
HOST_S = 23.5
HOST_SOURCE = ("wall time of notebook 06 in results/course/2026-11-30-h200-00-to-09-at-775ae4a/h200-2026-11-30-course-timings.tsv (H200, torch 2.11, "
               "2026-11-30) minus its GPU work at that run's ceilings")
# Share of each matmul ceiling a training step reached in that run (06's img/s and tokens/s in
# results/course/2026-11-30-h200-00-to-09-at-775ae4a/h200-2026-11-30-course.json, times the step FLOPs below), rounded: the CNN's 16-bit steps are
# mostly BatchNorm and ReLU traffic, the GPT's fp32 products are large.
SHARE = {"CNN": {"fp32": 0.42, "tf32": 0.15, "fp16": 0.1, "bf16": 0.08},
         "GPT": {"fp32": 0.8, "tf32": 0.35, "fp16": 0.25, "bf16": 0.3}}


def resnet_forward_flops(depths, width: int, classes: int, image: int) -> int:
    """FLOPs (2 per multiply-add) of one image through `ResNetish(depths, width, classes, image)`'s
    convolutions and head, as PyTorch's FlopCounterMode counts them: 8.18 G for ResNet-50 at 224 x 224.
    Pure arithmetic, for the plans of notebooks 06 and 07."""
    def conv(size: int, c_in: int, c_out: int, k: int, stride: int, pad: int) -> tuple[int, int]:
        out = (size + 2 * pad - k) // stride + 1
        return out, 2 * out * out * c_out * c_in * k * k

    size, flops = conv(image, 3, width, 7, 2, 3)          # stem: 7x7, stride 2
    size = (size + 2 - 3) // 2 + 1                         # 3x3 max-pool, stride 2
    c_in = width
    for i, depth in enumerate(depths):
        planes = width * 2**i
        for j in range(depth):                             # bottlenecks: 1x1, 3x3 (the stride), 1x1 x4
            stride = 2 if i > 0 and j == 0 else 1
            out, f2 = conv(size, planes, planes, 3, stride, 1)
            flops += conv(size, c_in, planes, 1, 1, 0)[1] + f2 + conv(out, planes, 4 * planes, 1, 1, 0)[1]
            if stride != 1 or c_in != 4 * planes:          # projection shortcut
                flops += conv(size, c_in, 4 * planes, 1, stride, 0)[1]
            size, c_in = out, 4 * planes
    return flops + 2 * c_in * classes                      # the linear head


def gpt_forward_flops_per_token(vocab: int, n_blocks: int, width: int, seq: int, **_) -> int:
    """FLOPs of one token through `GPT`'s forward, as FlopCounterMode counts them: 2 per weight of the
    blocks' products (12 width^2 each) and of the head, plus attention's two products (4 seq width per block)."""
    return 2 * (n_blocks * 12 * width**2 + vocab * width) + 4 * n_blocks * seq * width


def plan(scale: str | None = None) -> Plan:
    """What notebook 06 asks of the GPU at `scale` (gpulab.core.predict): each workload's training steps in
    every precision (section 7's runs and its reordered fp32 curve, the headline's, the panel's default run) and its
    first-loss forwards, at the config's batches (an upper bound: `fit_batch` may halve them on a smaller GPU). A step is 3
    forwards. It counts all four precisions as on the reference H200; a GPU without TF32 or bf16 skips those
    runs (and times fp16 in bf16's place)."""
    cfg = config(scale)
    cnn, gpt = cfg["cnn"], cfg["gpt"]
    step_flops = {"CNN": 3 * resnet_forward_flops(cnn["depths"], cnn["width"], cnn["classes"], cnn["image"])
                  * cnn["batch"],
                  "GPT": 3 * gpt_forward_flops_per_token(**gpt) * gpt["seq"] * gpt["batch"]}
    # precision_run: loss curve, 2 warm-up, timed steps, then the pace's profiled steps (at most PACE_STEPS)
    run = cfg["steps"] + 2 + cfg["repeat"] + min(cfg["repeat"], PACE_STEPS)
    gpt_run = cfg["steps"] + 2 + cfg["gpt_repeat"] + min(cfg["gpt_repeat"], PACE_STEPS)
    headline_run = cfg["headline_steps"] + 2 + cfg["repeat"] + min(cfg["repeat"], PACE_STEPS)
    # training steps per precision at the config's batch; a forward is 1/3 of a step
    steps = {
        "CNN": {"fp32": run + headline_run + 3 / 3,          # first losses: 2 in section 6, 1 in the headline
                "tf32": run + 1 / 3,
                "fp16": run + headline_run + 2 / 3,
                "bf16": run + headline_run + 2 / 3},
        "GPT": {"fp32": gpt_run + 2 / 3, "tf32": gpt_run + 1 / 3, "fp16": gpt_run + 1 / 3, "bf16": gpt_run + 1 / 3},
    }
    # section 7's noise floor of the loss curves: fp32 once more on the batches in reverse order (`reordered_curve`)
    for name in ("CNN", "GPT"):
        steps[name]["fp32"] += cfg["steps"]
    # fit_batch's two fp32 probe steps (batches 4 and 8): each workload's in section 3, the CNN's in the headline
    steps["CNN"]["fp32"] += 2 * (4 + 8) / cnn["batch"]
    steps["GPT"]["fp32"] += (4 + 8) / gpt["batch"]
    # section 8: fp32 gradients once, then 6 loss weights x (fp16, fp16 + scaler, bf16), on a small CNN batch
    small = cfg["underflow_batch"] / cnn["batch"]
    for p, count in (("fp32", 1), ("fp16", 2 * 6), ("bf16", 6)):
        steps["CNN"][p] += count * small
    # bf16 runs are bf16's own: a GPU without it (a T4, a V100) does not time them (only_native); the panel's
    # default run is the best 16-bit format, fp16 there (gpulab.core.predict's FALLBACK)
    return Plan(host_s=HOST_S, host_source=HOST_SOURCE, work=[
        *(Work(f"matmul_{p}", n * step_flops[name], SHARE[name][p], f"{name}: {n:.3g} {p} training steps",
               only_native=p == "bf16")
          for name in ("CNN", "GPT") for p, n in steps[name].items()),
        Work("matmul_bf16", run * step_flops["CNN"], SHARE["CNN"]["bf16"],
             f"CNN: {run:.3g} training steps of the panel's default run (bf16, else fp16)")])


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


def cnn_workload(cfg: dict, device: torch.device | None = None) -> Workload:
    """The CNN of `cfg` (`config()["cnn"]`: ResNetish sizes) with its images and SGD. Notebook 06 and `headline`.
    Seed torch first (the notebook and the headline call `torch.manual_seed(0)`) for the same starting weights."""
    model = ResNetish(cfg["depths"], cfg["width"], cfg["classes"], cfg["image"], device=device or pick_device())
    return Workload("CNN", model, lambda b: image_batches(model, b, count=BATCHES, seed=1), classification_loss,
                    lambda m: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9), unit="img/s")


def gpt_workload(cfg: dict, device: torch.device | None = None) -> Workload:
    """The GPT of `cfg` (`config()["gpt"]`) with its token sequences and AdamW; throughput in tokens/s. Notebook 06."""
    model = GPT(*(cfg[k] for k in ("vocab", "n_blocks", "width", "heads", "seq")), device=device or pick_device())
    return Workload("GPT", model, lambda b: token_batches(model, b, count=BATCHES, seed=1), language_model_loss,
                    lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3), unit="tokens/s", items=cfg["seq"])


# What decides PyTorch's default fp32 math for each workload: the CNN's arithmetic is convolutions (its one
# matrix product, the classifier head, is a rounding error of its FLOPs), the GPT's is matrix products.
DEFAULT_SWITCH = {"CNN": "conv", "GPT": "matmul"}


def pytorch_default(workload: str, conv_mode: str, matmul_mode: str, timed: list[str]) -> str:
    """Which timed precision is PyTorch's default for `workload` ("CNN" or "GPT"): given how cuDNN runs fp32
    convolutions (`conv_mode`, PyTorch's default "tf32") and how fp32 matrix products run (`matmul_mode`,
    default "ieee") when the notebook starts, "tf32" if the switch that governs the workload's arithmetic
    is on TF32 and TF32 is timed here, else "fp32". Notebook 06's "vs PyTorch default" column."""
    if workload not in DEFAULT_SWITCH:
        raise ValueError(f"workload must be one of {', '.join(DEFAULT_SWITCH)} (got {workload!r}).")
    mode = conv_mode if DEFAULT_SWITCH[workload] == "conv" else matmul_mode
    return "tf32" if mode == "tf32" and "tf32" in timed else "fp32"


def timed_precisions(facts: DeviceFacts | None = None) -> list[str]:
    """The precisions this device runs that are worth timing: all of `supported`, less fp16 on the CPU,
    where fp16 autocast works but is no fast path (notebook 06 still uses it to count underflow)."""
    facts = facts or device_facts()
    return [p for p in supported(facts) if facts.kind == "cuda" or p != "fp16"]


def step_peak(work: Workload, batch: int, precision: str = "fp32") -> int | None:
    """Peak memory (bytes) of one training step of `work` from its starting weights at `batch` in
    `precision`; None on the CPU. Notebook 06 (what `sizing.fit_batch` probes) and gpulab bench."""
    optimizer = work.reset()
    x, y = work.batches(batch)[0]
    with track_peak() as mem:
        train_step(work.model, x, y, loss=work.loss_fn, optimizer=optimizer, precision=precision,
                   scaler=make_scaler(precision, x.device))
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
        losses.append(train_step(model, x, y, loss=loss_fn, optimizer=optimizer, precision=precision, scaler=scaler).item())
        if scaler is not None and scaler.get_scale() < scale:
            skipped += 1
    return LossCurve(losses, skipped)


# -- do the loss curves agree? (notebook 06, section 7) ------------------------------------------------
# The mean loss over the last CURVE_WINDOW steps (two passes over the four batches) of a run against fp32's, judged
# against a measured noise floor: fp32 again from the same weights on the same batches in reverse order
# (`reordered_curve`), a run that learns as much as fp32 by construction. A run passes when its gap to fp32 is at
# most CURVE_MAX_FLOOR times that floor (gpulab.models.same's factor: two draws of noise differ by about two), or
# under CURVE_ABS of fp32's own loss there (a gap no plot of the curves shows). A floor of CURVE_FLOOR_MAX of fp32's
# fall or more says nothing: the check then fails with that reason rather than pass everything.
CURVE_WINDOW = 8
CURVE_MAX_FLOOR = SAME_MAX_FLOOR
CURVE_ABS = 0.01
CURVE_FLOOR_MAX = 0.5


def reordered_curve(work: Workload, batch: int, steps: int) -> LossCurve:
    """fp32 from `work`'s starting weights, `steps` steps on its batches of `batch` in reverse order: the noise
    floor of `curve_verdict` (untimed). Notebook 06."""
    optimizer = work.reset()
    try:
        return train_curve(work.model, optimizer, work.batches(batch)[::-1], work.loss_fn, "fp32", None, steps)
    finally:
        work.model.zero_grad(set_to_none=True)


@dataclass(frozen=True)
class CurveVerdict:
    """One run's loss curve against fp32's (`curve_verdict`): `gap` between the last-window means, `floor` (the
    reordered fp32 run's gap), `allowed`, `share` (gap / allowed: over 1 fails; inf where the floor says nothing or a
    loss is not finite), `ok`, and `why` in a sentence with the numbers."""

    gap: float
    floor: float
    allowed: float
    share: float
    ok: bool
    why: str


def curve_verdict(curve: LossCurve, reference: LossCurve, reordered: LossCurve,
                  window: int = CURVE_WINDOW) -> CurveVerdict:
    """Does `curve` learn as much as fp32's `reference` (same weights, same batches)? The mean of its last `window`
    losses against fp32's, where `reordered` (fp32 on the batches in reverse order, `reordered_curve`) gives the
    noise floor. A run whose GradScaler skipped k updates has applied k fewer by its last step: it is compared with
    fp32's window k steps earlier, at the same number of applied updates (both windows hold every batch equally
    often when `window` is a multiple of their number). Notebook 06."""
    n, k = len(reference), curve.skipped
    if len(curve) != n or len(reordered) != n:
        raise ValueError(f"curves of {len(curve)}, {n} and {len(reordered)} steps: compare curves of the same length")
    if n < window + k:
        return CurveVerdict(math.inf, math.nan, 0.0, math.inf, False,
                            f"{k} skipped update(s) leave fewer than {window} steps to compare with fp32's")
    ref = sum(reference[n - window - k:n - k]) / window
    gap = abs(curve.window(window) - ref)
    floor = abs(reordered.window(window) - reference.window(window))
    fall = reference[0] - reference.window(window)
    allowed = max(CURVE_MAX_FLOOR * floor, CURVE_ABS * abs(ref))
    at = (f"last {window} steps {curve.window(window):.4g} against fp32's {ref:.4g}"
          + (f" (steps {n - window - k + 1}-{n - k}: the GradScaler skipped {k} update(s))" if k else ""))
    if not (math.isfinite(gap) and math.isfinite(floor)):
        return CurveVerdict(gap, floor, allowed, math.inf, False, f"{at}: a loss is inf or nan")
    if fall <= 0 or floor >= CURVE_FLOOR_MAX * fall:
        return CurveVerdict(gap, floor, allowed, math.inf, False,
                            f"{at}; fp32 on the batches in reverse order differs by {floor:.3g}, "
                            + ("and fp32 did not learn (its loss did not fall)" if fall <= 0 else
                               f"{floor / fall:.0%} of fp32's fall: noise this large cannot tell two runs apart"))
    ok = gap <= allowed
    return CurveVerdict(gap, floor, allowed, gap / allowed if allowed > 0 else (math.inf if gap > 0 else 0.0), ok,
                        f"{at}: gap {gap:.3g}, {'within' if ok else 'MORE than'} {allowed:.3g} allowed "
                        f"(the larger of {CURVE_MAX_FLOOR:g}x the floor {floor:.3g}, fp32 on the batches in "
                        f"reverse order, and {CURVE_ABS:.0%} of fp32's loss)")


def precision_run(work: Workload, precision: str, batch: int, steps: int, repeat: int = 10,
                  warmup: int = 2) -> dict[str, Any]:
    """Train `work` from its starting weights in `precision`: the loss curve over `steps` steps,
    then `repeat` timed steps (after `warmup`) and their peak memory. Notebook 06.

    Returns {unit: throughput, "ms per step": Timing, "peak (GiB)": float or a note on the CPU,
    "loss curve": LossCurve, "pace": `timing.Pace` of PACE_STEPS more steps (the GPU's busy share: is the
    step the GPU's speed or the host's?), None on the CPU}. A precision this device cannot run raises ValueError.
    """
    check(precision)
    optimizer = work.reset()
    scaler = make_scaler(precision, next(work.model.parameters()).device)
    batches = work.batches(batch)
    try:
        curve = train_curve(work.model, optimizer, batches, work.loss_fn, precision, scaler, steps)
        cycle = itertools.cycle(batches)
        def step():
            train_step(work.model, *next(cycle), loss=work.loss_fn, optimizer=optimizer, precision=precision,
                       scaler=scaler)

        with track_peak() as mem:
            t = benchmark(step, warmup=warmup, repeat=repeat)
        busy = pace(step, steps=min(repeat, PACE_STEPS))      # what paces the timed step (None on the CPU)
    finally:
        work.model.zero_grad(set_to_none=True)      # also after an error: give the gradients back
    return {work.unit: t.per_second(batch * work.items), "ms per step": t,
            "peak (GiB)": "not measured on the CPU" if mem.peak is None else mem.peak / GiB,
            "loss curve": curve, "pace": busy}


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


def headline(scale: str | None = None) -> Measured:
    """The CNN's training throughput in fp32 (TF32 off) against the fastest 16-bit autocast (`precision_run`),
    at the batch the notebook trains it at; each 16-bit precision's first loss is checked against fp32's first."""
    cfg = config(scale)
    device = pick_device()
    torch.manual_seed(0)
    work = cnn_workload(cfg["cnn"], device)
    batch = fit_batch(lambda b: step_peak(work, b, "fp32"), cfg["cnn"]["batch"], memory_budget(cap=MEMORY_CAP))
    halves = [p for p in timed_precisions() if p in ("fp16", "bf16")]
    x, y = work.batches(batch)[0]
    ref = first_loss(work, x, y, "fp32")
    diffs = {p: abs(first_loss(work, x, y, p) - ref) / abs(ref) for p in halves}
    del x, y
    correct = all(diffs[p] <= FIRST_LOSS_TOLERANCE[p] for p in halves)
    rate = {p: precision_run(work, p, batch, cfg["headline_steps"], cfg["repeat"])["img/s"] for p in ("fp32", *halves)}
    best = max(halves, key=rate.get)
    return Measured(rate["fp32"], rate[best], "img/s", rate[best] / rate["fp32"], correct,
                    "first loss vs fp32: " + ", ".join(f"{p} {d:.1e} (tolerance {FIRST_LOSS_TOLERANCE[p]:.0e})"
                                                       for p, d in diffs.items()),
                    f"fp32, batch {batch}", f"{best} autocast" + (" + GradScaler" if best == "fp16" else ""))
