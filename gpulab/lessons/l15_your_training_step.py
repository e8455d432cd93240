"""Your own training step: which bottleneck is yours, and what fixing it buys. Notebook 15.

`TrainingStep(options)` is a training step written the way a first training loop often is: the
DataLoader's batches made in the main process (0 workers), each copied from pageable memory, the loss
read with `.item()` every step for a log line, and fp32 matmuls without TF32. Each of those is one
`Options` field, and `FIXES` says which field the course changes when `gpulab.diagnose` names that
bottleneck, so the notebook can take the top verdict, apply its fix, and measure what it bought against
the Amdahl bound the verdict promised.

The data is lesson 03's `SyntheticImages` (CPU work per sample that `calibrate_passes` sets from this
host's speed). The model is a multi-layer perceptron on the flattened image, its width set from this
GPU's measured fp32 ceiling (notebook 00) so that, once the data arrives in time, its fp32 matrix
products are most of the step on any GPU: a T4 gets a narrower model than an H200, and each shows the
same chain of bottlenecks. Its width is also capped by the GPU's memory (`width_for`): the correctness
checks hold PARAM_COPIES copies of the parameters at once.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from gpulab.core.ceilings import ceilings
from gpulab.core.device import cpu_cores, pick_device, resolve_scale
from gpulab.core.memory import free_memory
from gpulab.core.predict import Plan
from gpulab.lessons.l03_input_pipeline import (SyntheticImages, calibrate_passes, make_loader, quiet_fork,
                                                usable_workers)
from gpulab.models.precision import classification_loss, fp32_forced, fp32_math, half_dtype, make_scaler

TITLE = "your own training step"
CONFIG = {
    "tiny": dict(size=16, batch=8, sample_ms=0.05, workers=2, depth=2, width=64, classes=10, batches=64,
                 warmup=1, steps=2),
    # full: a batch of 256 images of 64 x 64 at about 0.25 ms of CPU each (64 ms per batch in the main
    # process); with `workers` processes the data keeps up with a GPU step of batch_ms / workers, and
    # the model is sized so its fp32 step takes `fp32_over_data` times that: once the workers fix the
    # input, fp32 is the next bottleneck on any GPU.
    "full": dict(size=64, batch=256, sample_ms=0.25, workers=8, depth=4, classes=10, batches=96,
                 fp32_over_data=2.0, min_width=256, max_width=16384, warmup=3, steps=5),
}

# Seconds of notebook 15 that no GPU changes: worker start-up, the CPU making every batch, the
# profiler's own work over the diagnoses and the panel's first run: at full size on the H200 the notebook's
# cells took 222 s in all (2026-12-02), its GPU work (a few hundred ms per diagnosis) inside.
HOST_S = 225.0
HOST_SOURCE = ("wall time of notebook 15 under nbval at full size (results/course/2026-12-02-h200-00-15/h200-2026-12-02-00-15-timings.tsv: "
               "H200, torch 2.11, 2026-12-02, 225 s, most of it the chain of fixes: five rounds, each checking that its "
               "fix trains the same model and diagnosing the step again); no GPU ceiling sets it: the steps are "
               "paced by the host's data making. A chain that runs out of verdicts with a fix stops sooner, so a shorter "
               "chain takes less: three rounds took 128 s on 2026-12-03 (results/course/2026-12-03-h200-00-13-15)")


def config(scale: str | None = None) -> dict:
    """This lesson's knobs at a scale ('tiny' or 'full'; default: the course's, `GPULAB_SCALE`)."""
    return dict(CONFIG[resolve_scale(scale)])


def plan(scale: str | None = None) -> Plan:
    """Notebook 15's time: host work (the batches are made by the CPU; the model is sized to it)."""
    return Plan(host_s=HOST_S, work=(), host_source=HOST_SOURCE)


@dataclass(frozen=True)
class Options:
    """The four habits of the slow step; the defaults are the slow ones."""

    workers: int = 0              # DataLoader worker processes (0: the main process makes every batch)
    pinned: bool = False          # page-locked batches (pin_memory=True), copied with non_blocking=True
    log_every_step: bool = True   # loss.item() each step, for a log line (the host waits for the GPU)
    precision: str = "fp32"       # "fp32" (TF32 off) or "16-bit" (autocast to this GPU's 16-bit type)


def first_workers(cfg: dict) -> int:
    """The worker count the input fix starts with: the config's, or what this host has cores for."""
    return max(usable_workers([cfg["workers"]]) or [min(2, cpu_cores())])


def fixes(cfg: dict | None = None) -> dict:
    """Rule name -> how the course fixes it on an `Options`: the lesson that rule points to, in one change.
    A fix that changes nothing (every core already has a worker) leaves the Options as they were."""
    cores = cpu_cores()
    start = first_workers(cfg or config())

    def more_workers(o: Options) -> Options:      # the config's count, then twice as many, up to the cores
        return replace(o, workers=min(max(start, 2 * o.workers), max(cores, o.workers)))

    return {
        "input_bound": more_workers,                                   # lesson 03
        "pageable_copy": lambda o: replace(o, pinned=True),            # lesson 05
        "host_sync": lambda o: replace(o, log_every_step=False),       # lesson 01
        "fp32_matmuls": lambda o: replace(o, precision="16-bit"),           # lesson 06
    }


def mlp(in_features: int, width: int, depth: int, classes: int, device: torch.device) -> nn.Module:
    """Flattened image -> `depth` Linear+GELU layers of `width` -> class scores."""
    layers: list[nn.Module] = [nn.Flatten()]
    for i in range(depth):
        layers += [nn.Linear(in_features if i == 0 else width, width), nn.GELU()]
    layers.append(nn.Linear(width, classes))
    return nn.Sequential(*layers).to(device)


def step_flops(in_features: int, width: int, depth: int, classes: int, batch: int) -> float:
    """FLOPs of one training step of `mlp`: 2 per multiply-add forward, twice that backward."""
    macs = in_features * width + (depth - 1) * width * width + width * classes
    return 6.0 * batch * macs


# GPU memory: at its fullest (the last of `same_training`'s six runs) the notebook holds this many fp32 copies of
# the MLP's parameters: the slow step's weights and momentum (2), the six parameter lists the comparison has
# gathered (6), and the running step's weights, momentum, starting copy and either its gradients (during a
# step) or its trained copy (after the last, the gradients freed): 4. A closed step holds none (`close`).
PARAM_COPIES = 2 + 6 + 4
# The share of the GPU's memory those copies may take: the rest is the CUDA context, the activations (a batch
# of 256 through 4 layers: tens of MiB) and the allocator's slack.
MEMORY_SHARE = 0.8


def _width_limits(cfg: dict, flops: float, memory_bytes: int | None) -> tuple[float, float | None]:
    """(the width whose fp32 step is `flops`, the widest whose PARAM_COPIES copies fit MEMORY_SHARE of the memory)."""
    n_in, b, d, c = 3 * cfg["size"] ** 2, cfg["batch"], cfg["depth"], cfg["classes"]

    def root(a_: float, b_: float, c_: float) -> float:      # the positive root of a w^2 + b w + c
        return (-b_ + (b_ * b_ - 4 * a_ * c_) ** 0.5) / (2 * a_)

    # 6 b (n_in w + (d - 1) w^2) = flops
    by_time = root(6 * b * (d - 1), 6 * b * n_in, -flops)
    if memory_bytes is None:
        return by_time, None
    # 4 bytes x PARAM_COPIES x ((d - 1) w^2 + (n_in + d + c) w + c) <= MEMORY_SHARE x memory  (weights and biases)
    return by_time, root(d - 1, n_in + d + c, c - MEMORY_SHARE * memory_bytes / (4 * PARAM_COPIES))


def width_for(cfg: dict, flops: float, memory_bytes: int | None = None) -> int:
    """The widest MLP whose fp32 step is at most `flops` and, given the GPU's memory in bytes, whose
    PARAM_COPIES fp32 copies of the parameters fit in MEMORY_SHARE of it; a multiple of 64 between the
    config's min_width and max_width."""
    return _snapped(cfg, *_width_limits(cfg, flops, memory_bytes))


def _snapped(cfg: dict, by_time: float, by_memory: float | None) -> int:
    """The smaller of the two limits, a multiple of 64 between the config's min_width and max_width."""
    w = by_time if by_memory is None else min(by_time, by_memory)
    return int(min(cfg["max_width"], max(cfg["min_width"], w // 64 * 64)))


def model_width(cfg: dict, passes_ms: float, device: torch.device) -> int:
    """The MLP's width on this GPU: its fp32 step takes `fp32_over_data` times the time the workers
    need for a batch (`passes_ms` per sample), at this GPU's measured fp32 matmul ceiling, and the
    parameters' copies the notebook holds fit in the GPU's memory (`width_for`); the config's width on the
    CPU or without a measured ceiling. `model_width_why` says which decided."""
    return model_width_why(cfg, passes_ms, device)[0]


def model_width_why(cfg: dict, passes_ms: float, device: torch.device) -> tuple[int, str]:
    """(`model_width`, what set it, in words for the notebook)."""
    if "width" in cfg:
        return cfg["width"], "the config's width at this scale"
    if device.type != "cuda":
        return cfg["min_width"], "the smallest width: on the CPU"
    ceiling = ceilings().get("matmul_fp32")
    if ceiling is None or not ceiling.source.startswith("measured"):
        return cfg["min_width"], "the smallest width: no measured fp32 ceiling (run notebook 00 first)"
    workers = first_workers(cfg)
    target_s = cfg["batch"] * passes_ms / 1e3 / workers * cfg["fp32_over_data"]
    memory = free_memory(device)
    total = memory[1] if memory else None
    by_time, by_memory = _width_limits(cfg, target_s * ceiling.value * 1e12, total)
    w = _snapped(cfg, by_time, by_memory)
    if by_memory is not None and by_memory < by_time and w < cfg["max_width"]:
        why = (f"capped by memory: {PARAM_COPIES} fp32 copies of the parameters (section 2's correctness checks) in "
               f"{MEMORY_SHARE:.0%} of {total / 2**30:.1f} GiB; the step's time alone allowed {int(by_time)}")
    elif w == cfg["max_width"]:
        why = f"the config's largest width ({cfg['max_width']})"
    else:
        why = (f"set by the step's time: an fp32 step of {cfg['fp32_over_data']:g}x the {target_s / cfg['fp32_over_data'] * 1e3:.0f} ms "
               f"{workers} workers need for a batch, at the measured {ceiling.value:.1f} TFLOP/s")
    return w, why


class TrainingStep:
    """One training step with the habits `options` says: call it, and it fetches a batch and trains.

    `close()` stops the DataLoader's workers. The loss of the last step is `last_loss` (a tensor on
    the device; a float when `log_every_step`)."""

    def __init__(self, options: Options = Options(), cfg: dict | None = None, device: torch.device | None = None,
                 width: int | None = None, passes: int | None = None, seed: int = 0, reorder: bool = False):
        self.options, self.cfg = options, cfg or config()
        self.device = device or pick_device()
        if options.precision not in ("fp32", "16-bit"):
            raise ValueError(f"precision must be 'fp32' or '16-bit', got {options.precision!r}")
        if options.pinned and self.device.type != "cuda":
            raise ValueError("pinned=True needs a CUDA GPU: page-locked memory is for copies to a GPU")
        cfg = self.cfg
        self.passes = passes if passes is not None else calibrate_passes(cfg["size"], cfg["sample_ms"])
        self.width, self.width_why = ((width, "given (the slow step's)") if width
                                      else model_width_why(cfg, cfg["sample_ms"], self.device))
        torch.manual_seed(seed)
        self.model = mlp(3 * cfg["size"] ** 2, self.width, cfg["depth"], cfg["classes"], self.device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
        data = SyntheticImages(length=cfg["batch"] * cfg["batches"], size=cfg["size"], passes=self.passes, seed=seed)
        self.loader = make_loader(data, cfg["batch"], num_workers=options.workers, pin_memory=options.pinned)
        with quiet_fork():
            self.batches = iter(self.loader)
        self.half = half_dtype() if self.device.type == "cuda" or fp32_forced() else torch.bfloat16
        # fp16 (a GPU without bf16) trains with loss scaling, as lesson 06 teaches; bf16 needs none
        self.scaler = make_scaler("fp16", self.device) if options.precision == "16-bit" and self.half is torch.float16 else None
        self.last_loss = None
        # reorder: each batch's rows in another order (the correctness check's noise floor, `same_training`)
        from gpulab.diagnose.cases import rows
        self.perm = rows(cfg["batch"], reorder)
        self.flops = step_flops(3 * cfg["size"] ** 2, self.width, cfg["depth"], cfg["classes"], cfg["batch"])

    def next_batch(self):
        try:
            return next(self.batches)
        except StopIteration:          # a new pass over the data (the workers start again)
            with quiet_fork():
                self.batches = iter(self.loader)
            return next(self.batches)

    def __call__(self):
        o = self.options
        x, y = self.next_batch()
        if self.perm is not None:
            x, y = x[self.perm], y[self.perm]
        x = x.to(self.device, non_blocking=o.pinned)
        y = y.to(self.device, non_blocking=o.pinned)
        with fp32_math("ieee"):           # TF32 off: fp32 matmuls stay fp32, forward and backward
            with torch.amp.autocast(self.device.type, dtype=self.half,
                                    enabled=o.precision == "16-bit" and self.half != torch.float32):
                loss = classification_loss(self.model, x, y)
            if self.scaler is None:
                loss.backward()
                self.optimizer.step()
            else:                         # fp16: scaled backward; the step is skipped if gradients overflow
                self.scaler.scale(loss).backward()
                self.scaler.step(self.optimizer)
                self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.last_loss = loss.item() if o.log_every_step else loss.detach()
        return self.last_loss

    def close(self):
        """Stop the DataLoader's workers and let the model and its optimizer state go (off the GPU): a closed
        step cannot train again."""
        self.batches = None            # the iterator's workers stop when it is collected
        del self.loader
        self.model = self.optimizer = self.scaler = None


def same_training(options: Options, cfg: dict, device: torch.device, width: int, passes: int,
                  k: int | None = None, before: Options | None = None) -> tuple[bool, str]:
    """Correct before fast: does a step with `options` train the same model as the step it replaces, `before`
    (the slow step where not given; notebook 15 passes the previous round's, issue 40)? Both from the same
    weights on the same batches for k updates; their parameters' distance against the noise floor of each with
    its batch rows reordered (`gpulab.models.same.compare`, the suite's check: it fails beyond SAME_MAX_FLOOR,
    four, times the floor), and, only where this round changes the precision, of each against itself in fp32. A
    round that keeps 16-bit (more workers after the 16-bit fix) is held to the 16-bit step's reordering floor
    alone: a change beyond four times that floor fails there too (a learning rate 1 % larger did, in
    tests/lessons/test_l15_your_training_step.py). The round that changes the precision has 16-bit rounding's own
    distance from fp32 in its floor, which holds the very distance it judges; what can fail there is each tensor's
    movement (`gpulab.models.same.movement`: a gradient lost in 16-bit leaves its tensor in place)."""
    from gpulab.diagnose.cases import K_UPDATES, compare, trained
    from gpulab.models.precision import fp32_only
    from gpulab.models.same import movement

    k = k or K_UPDATES
    before = before or Options()

    def run(o: Options, reorder: bool = False) -> tuple[list, list]:
        return trained(TrainingStep(o, cfg, device, width=width, passes=passes, reorder=reorder), k)

    p0, base = run(before)                # each run's own starting copy is dropped at once: PARAM_COPIES counts
    fixed = run(options)[1]
    floors = [(run(before, True)[1], base), (run(options, True)[1], fixed)]
    floor_is = "its batch rows reordered"
    if options.precision != before.precision:
        with fp32_only():
            floors += [(run(before)[1], base), (run(options)[1], fixed)]
        floor_is += ", its 16-bit rounding"
    what = "the fixed step" + ("" if before == Options() else " (against the previous round's)")
    result = compare(p0, base, fixed, floors, k, floor_is=floor_is, what=what)
    if options.precision == before.precision:
        return result["ok"], result["why"]
    # the floor above holds the very distance it judges (this step against itself in fp32): each tensor's movement
    # is what can fail here (a gradient 16-bit lost leaves its tensor in place)
    moved_ok, moved = movement(p0, base, fixed)
    return result["ok"] and moved_ok, f"{result['why']}; {moved}"


def measured_gain(before_ms: float, after_ms: float, bound: float, spread_before: float = 0.0,
                  spread_after: float = 0.0, expected: float | None = None) -> dict:
    """What a fix bought against what its verdict promised, judged as the diagnosis suite judges its cases
    (`gpulab.diagnose.rules.judge_gain`, with the steps' relative spreads): the speed-up; whether it stayed
    within the verdict's bound (its Amdahl ceiling), give or take the spread ("within"); the time saved
    against the time its expected gain promised ("of_promised", the bound's where no expectation is
    given) and whether that is at least half ("enough"); and the same as shares of the step
    ("saved_share", "promised_share")."""
    from gpulab.diagnose.rules import judge_gain

    g = judge_gain(before_ms, after_ms, bound, spread_before, spread_after)
    if expected is not None:
        e = judge_gain(before_ms, after_ms, expected, spread_before, spread_after)
        ceiling = g["promised_ms"] + g["noise"] * before_ms          # the most the bound allows, spread included
        g.update(expected=expected, promised_ms=e["promised_ms"], of_promised=e["of_promised"], enough=e["enough"],
                 of_promised_max=ceiling / e["promised_ms"] if e["promised_ms"] > 0 else float("inf"))
    g.update(saved_share=g["saved_ms"] / before_ms, promised_share=g["promised_ms"] / before_ms)
    if g["promised_ms"] <= 0:
        g["of_promised"] = None
    return g


def round_facts(diagnosis) -> dict:
    """What a round's verdict was computed from, for its record (issue 40: the pinning round's bound on the H100,
    2026-12-06, could not be recomputed from the records): the unprofiled step and its idle, the GPU's busy time
    under the full and the kernel-only profile, the host's time by cause, the pageable copies' GPU time, each
    wait and the refill after it, and the lines of the copies to the GPU; ms per step, 4 significant figures."""
    f = diagnosis.facts

    def r(x):
        return None if x is None else float(f"{x:.4g}")
    return {"base_ms": r(f.base_ms), "base_idle_ms": r(f.base_idle_ms), "busy_ms": r(f.busy_ms),
            "light_busy_ms": r(f.light_busy_ms), "light_step_ms": r(f.light_step_ms), "host_scale": r(f.host_scale),
            "pageable_copy_ms": r(f.pageable_copy_ms),
            "host_ms": {c: r(v) for c, v in f.host_by_cause.items() if v > 0},
            "syncs": [[site, r(ms)] for site, _, ms, _ in f.syncs],
            "after_sync": [[site, r(ms)] for site, _, ms in f.host_sites.get("after_sync", ())],
            "pinnable_sites": list(f.pinnable_sites)}


def where_it_went(before, after, top: int = 3) -> list[tuple[str, float]]:
    """The `top` largest changes from diagnosis `before` to diagnosis `after`, in ms per step, largest
    first: the GPU's idle time by cause (as the rules read it: scaled to the unprofiled step) and its
    busy time by kernel class (profiled). Negative: time the fix removed. A fix's saving beyond its
    verdict's promise shows here as time it removed from another cause."""
    from gpulab.diagnose.analyze import CAUSES, changes

    def times(d) -> dict:
        return {**{f"idle {c}": d.facts.idle(c) for c in CAUSES},
                **{f"busy {k}": ms for k, ms in d.busy_by_class.items()}}
    return changes(times(before), times(after))[:top]


def fmt_changes(changes: list[tuple[str, float]]) -> str:
    """`where_it_went`'s answer as one line: "idle input -3.1 ms, busy copy -1.2 ms"."""
    return ", ".join(f"{name} {ms:+.2g} ms" for name, ms in changes)
