"""Labelled bottlenecks: for each rule of `gpulab.diagnose`, a training step that has it and the same
step with the course's fix, built from the lessons' own code. `suite.py` diagnoses both and checks
that the rule fires on the first and stays silent on the second.

    from gpulab.diagnose.cases import CASES
    from gpulab.diagnose.suite import same_model
    ok, why = same_model(CASES["host_sync"], "tiny", torch.device("cpu"))   # correct before fast
    pair = CASES["host_sync"].build("tiny", torch.device("cpu"))
    pair.bad(); pair.fixed()     # one training step each (fetch a batch, forward, backward, update)
    pair.cleanup()

`CASES` (at the end) lists each case: its rule, its lesson, the bad step and the fixed step.

Each case is sized at "tiny" to run on the CPU in well under a second a step (so the code is tested in
CI) and at "full" for a GPU, from this GPU's measured step times or ceilings where the lesson sizes
that way. `Case.needs_gpus` says how many GPUs its effect needs and `why_gpu` why: the suite skips it
with that reason elsewhere, but every case builds and steps on the CPU.
"""
from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.utils.data import default_collate

from gpulab.core.device import resolve_scale
from gpulab.core.timing import benchmark
from gpulab.lessons.l03_input_pipeline import quiet_fork

CPU = torch.device("cpu")


# -- what a case builds ----------------------------------------------------------------------------
def _nothing() -> None:
    pass


@dataclass
class Pair:
    """The two steps of a case at one scale. Each step is a callable with no arguments that fetches its
    batch and trains on it, returning the loss (a float or a tensor); both start from the same weights
    and the same batches (`same_model` checks that they train the same model).

    `fixed` is None for a case without a fix (the capstone). `sizes` records what was chosen and how;
    `note` what this device cannot show (e.g. no CUDA graph on the CPU: the fixed step runs eagerly)."""

    bad: Callable[[], object]
    fixed: Callable[[], object] | None
    sizes: dict = field(default_factory=dict)
    note: str = ""
    flops_per_step: float | None = None      # given to diagnose() where FlopCounterMode cannot count
    cleanup: Callable[[], None] = _nothing
    models: tuple = ()                       # (the bad step's model, the fixed step's): what `same_model` compares


@dataclass(frozen=True)
class Case:
    """A labelled bottleneck: `build(scale, device)` returns its Pair; `rule` is what must fire on the
    bad step and stay silent on the fixed one; `lesson` is where the course teaches the fix."""

    name: str
    rule: str | None                 # None: the capstone, where no rule may promise much
    lesson: str
    bad: str                         # one line each: what the two steps do
    fixed: str
    build: Callable[..., Pair]       # build(scale, device, reorder=False)
    needs_gpus: int = 1
    why_gpu: str = ""

    @property
    def needs_gpu(self) -> bool:
        return self.needs_gpus > 0

    def unable(self, device: torch.device, gpus: int | None = None) -> str | None:
        """Why this case cannot show its effect on `device` (with `gpus` CUDA GPUs), or None."""
        if gpus is None:
            gpus = torch.cuda.device_count() if device.type == "cuda" else 0
        if device.type != "cuda" and self.needs_gpus:
            return f"needs a CUDA GPU: {self.why_gpu}"
        if gpus < self.needs_gpus:
            return f"needs {self.needs_gpus} GPUs, this machine has {gpus}: {self.why_gpu}"
        return None


# Correct before fast: parameters after K_UPDATES updates against a measured noise floor. The check, its
# constants, its arithmetic and `trained` live in `gpulab.models.same` (the exercises' grader, the zoo and
# lessons 14 and 15 use them too); re-exported here for the suite and older callers
from gpulab.models.same import (FLOOR_MAX, K_UPDATES, SAME_ABS, SAME_MAX_FLOOR, compare, distance,  # noqa: E402,F401
                                loss_value, parameters, trained)


def _half(device: torch.device) -> torch.dtype:
    """The 16-bit type a case trains in: this GPU's (`half_dtype`), bf16 on the CPU; fp32 under
    `precision.fp32_only` (same_model's rounding floor)."""
    from gpulab.models.precision import fp32_forced, half_dtype
    return half_dtype() if device.type == "cuda" or fp32_forced() else torch.bfloat16


def _half_name(device: torch.device) -> str:
    """`_half`'s name as `train_step` takes it ("bf16", "fp16"; "fp32" under `precision.fp32_only`)."""
    from gpulab.models.precision import best_half, fp32_forced
    return best_half() if device.type == "cuda" or fp32_forced() else "bf16"


def rows(n: int, reorder: bool) -> torch.Tensor | None:
    """A fixed permutation of n batch rows (`reorder`), or None."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(12345)) if reorder else None


def _reordered(batches, perm):
    """Each batch (a tuple of tensors with rows first) with its rows in `perm`'s order (as given if None)."""
    if perm is None:
        return batches
    return [tuple(t[perm.to(t.device)] for t in b) for b in batches]


@functools.lru_cache(maxsize=None)
def _calibrated(size: int, sample_ms: float) -> int:
    """Lesson 03's `calibrate_passes`, once per process for a size and target: it times this host, and two
    builds of a case (the correctness check's) must make the same images."""
    from gpulab.lessons.l03_input_pipeline import calibrate_passes
    return calibrate_passes(size, sample_ms)


def _cycle(batches):
    """An endless iterator over a few ready batches (the same order for the bad and the fixed step)."""
    return itertools.cycle(batches).__next__


def _compute_ms(step, x, y, device) -> float | None:
    """ms of one training step on a batch already on the device (None on the CPU: nothing is sized)."""
    if device.type != "cuda":
        return None
    return benchmark(lambda: step(x, y), budget_s=0.3, device=device).median_ms


class LoaderStep:
    """A training step over a DataLoader: the next batch (the loader starts again when it runs out),
    copied to the device (non_blocking from pinned memory), then `train(x, y)`."""

    def __init__(self, loader, train, device: torch.device, perm: torch.Tensor | None = None):
        self.loader, self.train, self.device, self.batches, self.perm = loader, train, device, None, perm

    def __call__(self):
        batch = next(self.batches, None) if self.batches is not None else None
        if batch is None:                          # not started, or the loader ran out: start it again
            with quiet_fork():
                self.batches = iter(self.loader)
            batch = next(self.batches)
        x, y = batch if self.perm is None else (batch[0][self.perm], batch[1][self.perm])
        pinned = self.loader.pin_memory and self.perm is None
        return self.train(x.to(self.device, non_blocking=pinned), y.to(self.device, non_blocking=pinned))

    def close(self) -> None:
        self.batches = None                        # its workers stop when the iterator is collected


# -- 1. input: DataLoader workers (lesson 03) -------------------------------------------------------
def _l03_model(cfg: dict, device: torch.device, at_least_ms: float = 0.0, width: int | None = None):
    """Lesson 03's SmallCNN and SGD step from one seed: (a maker of fresh steps, its width, ms of a step on
    this GPU or None on the CPU). The config's width, widened by a quarter at a time (up to 8x) while a step
    takes less than `at_least_ms` here; `width` given: that width, no search."""
    from gpulab.lessons.l03_input_pipeline import make_step
    from gpulab.models.cnn import SmallCNN

    x = torch.randn(cfg["batch"], 3, cfg["size"], cfg["size"], device=device)
    y = torch.randint(10, (cfg["batch"],), device=device)
    fixed = width is not None
    width = width if fixed else cfg["width"]
    while True:
        def new_step(width=width):
            torch.manual_seed(0)
            model = SmallCNN(width=width, blocks=cfg["blocks"], device=device)
            train = make_step(model)
            train.model = model
            return train

        ms = _compute_ms(new_step(), x, y, device)
        if fixed or ms is None or ms >= at_least_ms or width >= 8 * cfg["width"]:
            return new_step, width, ms
        width = (width * 5 // 4 + 7) // 8 * 8            # a quarter wider, a multiple of 8


def build_input(scale: str, device: torch.device, reorder: bool = False) -> Pair:
    """Lesson 03's pipeline: SyntheticImages (CPU work per sample), its SmallCNN and SGD step.

    Full size: the CPU cost of a sample is set from the measured GPU step (`calibrate_passes`) so that
    W workers (the lesson's largest count this host has cores for) make a batch in half a GPU step,
    while 0 workers take W/2 GPU steps per batch: input-bound with 0 workers on any GPU, not with W."""
    from gpulab.lessons.l03_input_pipeline import (
        SyntheticImages,
        config,
        make_loader,
        usable_workers,
    )

    cfg = config(scale)
    workers = max(usable_workers([w for w in cfg["workers"] if w > 0]) or [1])
    new_step, width, compute_ms = _l03_model(cfg, device)
    batch = cfg["batch"]
    sample_ms = cfg["sample_ms"] if compute_ms is None else compute_ms * workers / (2 * batch)
    passes = _calibrated(cfg["size"], sample_ms)
    data = SyntheticImages(length=64 * batch, size=cfg["size"], passes=passes)
    pin = device.type == "cuda"
    perm = rows(batch, reorder)
    bad = LoaderStep(make_loader(data, batch, num_workers=0, pin_memory=pin), new_step(), device, perm)
    fixed = LoaderStep(make_loader(data, batch, num_workers=workers, pin_memory=pin), new_step(), device, perm)

    def cleanup():
        bad.close()
        fixed.close()

    sizes = {"batch": batch, "size": cfg["size"], "width": width, "workers": workers, "passes": passes,
             "sample_ms_target": sample_ms, "compute_ms": compute_ms,
             "how": "sample cost = GPU step x workers / (2 x batch)"}
    return Pair(bad, fixed, sizes=sizes, cleanup=cleanup, models=(bad.train.model, fixed.train.model))


# -- 2. host_sync: .item() every step (lesson 01) ---------------------------------------------------
# The sizes a first build measured, per (scale, device): a second build (the correctness check's rows
# reordered) must train the same model, and a width searched by timing can come out otherwise (on the H200
# 280 and 440 channels, and the parameters could not be compared).
_HOST_SYNC_SIZES: dict = {}


def build_host_sync(scale: str, device: torch.device, reorder: bool = False) -> Pair:
    """Lesson 03's SmallCNN step on batches the training loop builds itself on the CPU (lesson 03's
    SyntheticImages, indexed in the main process), pinned and copied without blocking. The bad step
    reads the loss with `.item()` for a log line: the host waits for the GPU, and the GPU then waits
    while the host builds the next batch. The fixed step keeps the loss on the GPU, so the host builds
    batch k+1 while the GPU trains on batch k.

    Full size: the model is widened until its GPU step takes at least twice the CPU time of the
    cheapest batch (one augment pass), then a batch's CPU cost is set to half the measured GPU step: without
    the sync the GPU stays busy, with it a third of each step is idle."""
    from gpulab.lessons.l03_input_pipeline import (
        SyntheticImages,
        config,
    )

    cfg = config(scale)
    batch, size = cfg["batch"], cfg["size"]
    key = (scale, str(device))
    if key in _HOST_SYNC_SIZES:        # the noise-floor build (rows reordered) trains the same model
        width, compute_ms, sample_ms, passes = _HOST_SYNC_SIZES[key]
        new_step, _, _ = _l03_model(cfg, device, width=width)
    else:
        one_pass = benchmark(lambda: SyntheticImages(8, size=size, passes=1)[7], device=CPU, budget_s=0.1)
        new_step, width, compute_ms = _l03_model(cfg, device, at_least_ms=2 * batch * one_pass.median_ms)
        sample_ms = cfg["sample_ms"] if compute_ms is None else compute_ms / (2 * batch)
        passes = _calibrated(size, sample_ms)
        _HOST_SYNC_SIZES[key] = (width, compute_ms, sample_ms, passes)
    data = SyntheticImages(length=64 * batch, size=size, passes=passes)

    perm = rows(batch, reorder)
    within = perm.tolist() if perm is not None else range(batch)

    def make(log_every_step: bool):
        train, order = new_step(), itertools.count()

        def step():
            i = next(order) % (len(data) // batch)
            x, y = default_collate([data[i * batch + j] for j in within])
            if device.type == "cuda":            # pinned: a pageable copy would be a bottleneck of its own
                x, y = x.pin_memory(), y.pin_memory()
            loss = train(x.to(device, non_blocking=True), y.to(device, non_blocking=True))
            return loss.item() if log_every_step else loss          # .item(): the host waits for the GPU
        step.model = train.model
        return step

    sizes = {"batch": batch, "size": size, "width": width, "passes": passes, "sample_ms_target": sample_ms,
             "compute_ms": compute_ms, "how": "batch CPU cost = GPU step / 2"}
    bad, fixed = make(True), make(False)
    return Pair(bad, fixed, sizes=sizes, models=(bad.model, fixed.model))


# -- 3. pageable_copy: pinned memory and non_blocking (lesson 05) ------------------------------------
PAGEABLE = {"tiny": {"nbytes": 2**18, "features": 256, "depth": 2},
            "full": {"nbytes": None, "features": 1024, "depth": 2}}     # None: lesson 05's largest copy


def build_pageable_copy(scale: str, device: torch.device, reorder: bool = False) -> Pair:
    """A batch of random bytes in host memory (lesson 05's `random_bytes`: every page written, so no
    zero-page trap), copied to the GPU each step, as uint8 rows turned into floats there; lesson 11's
    MLP learns to reproduce them (bf16 autocast). Bad: copied from pageable memory (the host stages it
    and waits). Fixed: the same bytes pinned once, copied with non_blocking=True.

    Full size: the batch is lesson 05's largest copy (256 MiB); the MLP is as wide as a row."""
    from gpulab.lessons.l05_pcie_transfers import config, random_bytes
    from gpulab.lessons.l11_cuda_graphs import MLP

    cfg = dict(PAGEABLE[resolve_scale(scale)])
    nbytes = cfg["nbytes"] or config(scale)["largest_bytes"]
    features = cfg["features"]
    pageable = random_bytes(nbytes).view(-1, features)
    perm = rows(pageable.shape[0], reorder)
    if perm is not None:
        pageable = pageable[perm]
    pinned = pageable.pin_memory() if device.type == "cuda" else pageable
    half = _half(device)

    def make(host: torch.Tensor):
        torch.manual_seed(0)
        model = MLP(features, cfg["depth"]).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)

        def step():
            x = host.to(device, non_blocking=host.is_pinned()).float() / 255
            with torch.autocast(device.type, dtype=half):
                loss = model(x, x)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()
        step.model = model
        return step

    sizes = {"bytes": nbytes, "rows": pageable.shape[0], "features": features, "depth": cfg["depth"]}
    bad, fixed = make(pageable), make(pinned)
    return Pair(bad, fixed, sizes=sizes, models=(bad.model, fixed.model),
                note="" if device.type == "cuda" else "pinned memory needs a CUDA GPU: on the CPU both copy alike")


# -- 4. launch_bound: CUDA graphs (lesson 11) --------------------------------------------------------
# Lesson 11's batches per step: at its own batch the replayed graph ran on the H200 about as long as the
# host's three calls a step (two copies and the replay) took under the profiler, so the fixed step itself
# looked launch-bound there; four batches keep the GPU ahead of the host, while each kernel still runs
# for a few microseconds, far less than an eager launch takes.
LAUNCH_BATCHES = 4


def build_launch_bound(scale: str, device: torch.device, reorder: bool = False) -> Pair:
    """Lesson 11's small MLP (`MLP`, `make_mlp_step`: forward and backward), bf16 autocast so its
    matrix products use Tensor Cores. Bad: eager, one launch per kernel. Fixed: the same step captured
    once (`capture`) and replayed, each batch copied into the graph's static inputs.

    Full size: lesson 11's MLP (width 512, depth 8) on four of its batches (1024 rows; see
    LAUNCH_BATCHES): each kernel runs for a few microseconds, less than launching it takes."""
    from gpulab.lessons.l11_cuda_graphs import MLP, capture, config, make_mlp_step

    cfg = config(scale)
    w, b = cfg["mlp_width"], LAUNCH_BATCHES * cfg["mlp_batch"]
    torch.manual_seed(0)
    model = MLP(w, cfg["mlp_depth"]).to(device)
    batches = _reordered([(torch.randn(b, w, device=device), torch.randn(b, w, device=device)) for _ in range(4)],
                         rows(b, reorder))
    half = _half(device)
    grads = make_mlp_step(model)

    def run(x, t):          # autocast's weight cache off: a CUDA graph must not keep casts from outside it
        with torch.autocast(device.type, dtype=half, cache_enabled=False):
            return grads(x, t)

    bad_batch, fixed_batch = _cycle(batches), _cycle(batches)

    def bad():
        return run(*bad_batch())

    if device.type != "cuda":
        fixed, note = (lambda: run(*fixed_batch())), "CUDA graphs need CUDA: on the CPU the fixed step runs eagerly"
    else:
        static_x, static_t = (t.clone() for t in batches[0])
        graph, out = capture(run, static_x, static_t)
        note = ""

        def fixed():
            x, t = fixed_batch()
            static_x.copy_(x)
            static_t.copy_(t)
            graph.replay()
            return out

    return Pair(bad, fixed, sizes={"width": w, "depth": cfg["mlp_depth"], "batch": b}, note=note, models=(model, model))


# -- 5. fp32_no_tensor_cores: mixed precision (lesson 06) -------------------------------------------
FP32 = {"tiny": {"width": 64, "depth": 4, "batch": 32, "step_ms": None},
        "full": {"width": 4096, "depth": 8, "batch": 1024, "step_ms": 40.0}}


def build_fp32(scale: str, device: torch.device, reorder: bool = False) -> Pair:
    """Lesson 11's MLP (ReLU, MSE) trained with `train_step`. Bad: precision "fp32" (TF32 off for the
    step: fp32 matmuls on the CUDA cores). Fixed: bf16 autocast, or fp16 with a GradScaler on a GPU
    without bf16 (`best_half`). `train_step` sets and restores the fp32 math mode around each step.

    Full size: width 4096, 8 layers; the batch makes an fp32 step take about `step_ms` at this GPU's
    fp32 matmul ceiling (notebook 00), a multiple of 64 rows, at least 256."""
    from gpulab.core.ceilings import ceilings
    from gpulab.lessons.l11_cuda_graphs import MLP
    from gpulab.models.precision import make_scaler
    from gpulab.models.step import train_step

    cfg = dict(FP32[resolve_scale(scale)])
    w, d = cfg["width"], cfg["depth"]
    batch, source = cfg["batch"], "the config's batch"
    fp32 = ceilings().get("matmul_fp32") if device.type == "cuda" and cfg["step_ms"] else None
    if fp32 is not None:
        batch = max(256, int(cfg["step_ms"] / 1e3 * fp32.value * 1e12 / (6 * d * w * w)) // 64 * 64)
        source = f"{cfg['step_ms']:g} ms at {fp32.value:.3g} TFLOP/s fp32 ({fp32.source})"
    half = _half_name(device)
    batches = _reordered([(torch.randn(batch, w, device=device), torch.randn(batch, w, device=device))
                          for _ in range(2)], rows(batch, reorder))

    def make(precision: str):
        torch.manual_seed(0)
        model = MLP(w, d).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        scaler = make_scaler(precision, device)
        nxt = _cycle(batches)

        def step():
            return train_step(model, *nxt(), loss=lambda m, x, t: m(x, t), optimizer=opt, precision=precision,
                              scaler=scaler)
        step.model = model
        return step

    bad, fixed = make("fp32"), make(half)
    return Pair(bad, fixed, models=(bad.model, fixed.model),
                sizes={"width": w, "depth": d, "batch": batch, "half": half, "batch_from": source,
                       "flops": 6 * batch * d * w * w})


# -- 6. misaligned_gemm: the padded vocabulary (lesson 07) ------------------------------------------
def build_misaligned(scale: str, device: torch.device, reorder: bool = False) -> Pair:
    """Lesson 07's GPT (GPT-2 small at full size: vocabulary 50257, 12 blocks of 768, sequences of
    1024) trained in 16-bit with AdamW, as notebook 07 does, on twice lesson 07's batch (16 at full
    size). Bad: the head multiplies over 50257 rows, not a multiple of 8. Fixed: `padded_copy(model,
    64)`, 50304 rows, the same weights (the padding rows are zero and the loss reads only the real
    vocabulary).

    Why twice the batch: at lesson 07's, the padded step's GPU work (29 ms on an H200) is about what its
    host needs to launch it (30.7 to 39.1 ms a step on two H200 hosts, 2026-11-30, results/diagnose/2026-11-30-h200x2-suite-at-5b8aedf/
    and results/diagnose/2026-11-30-h200x2-suite-at-030f266/), so on a slower host the fixed step turns launch-bound and the
    padding's gain hides behind the host. Twice the rows double the GPU's work, not the host's."""
    from gpulab.lessons.l07_tensor_core_alignment import config
    from gpulab.models.gpt import GPT, padded_copy, token_batches
    from gpulab.models.precision import language_model_loss, make_scaler
    from gpulab.models.step import train_step

    lm = config(scale)["lm"]
    half = _half_name(device)
    torch.manual_seed(0)
    model = GPT(lm["vocab"], lm["n_blocks"], lm["width"], lm["heads"], lm["seq"], device=device)
    padded = padded_copy(model, 64)
    batch = 2 * lm["batch"]
    batches = _reordered(token_batches(model, batch, count=2), rows(batch, reorder))

    def make(m):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        scaler, nxt = make_scaler(half, device), _cycle(batches)

        def step():
            return train_step(m, *nxt(), loss=language_model_loss, optimizer=opt, precision=half, scaler=scaler)
        return step

    return Pair(make(model), make(padded), models=(model, padded),
                sizes=dict(lm, batch=batch, padded_vocab=padded.padded_vocab, half=half))


# -- 7. memory_pressure: the caching allocator defeated (lesson 02) ---------------------------------
# full: wide layers, so each step's blocks are large (a layer's fp32 weight gradient is 256 MiB, its bf16
# cast 128 MiB) and the driver's cudaMalloc / cudaFree of them take long; few layers and a batch large
# enough that the GPU's work stays ahead of the host's launches. On the H200, 8 layers of 4096 left the
# allocator's share near the rule's threshold at a large batch and were launch-bound at a small one.
MEMORY = {"tiny": {"width": 64, "depth": 4, "batch": 64}, "full": {"width": 8192, "depth": 4, "batch": 2048}}


def build_memory(scale: str, device: torch.device, reorder: bool = False) -> Pair:
    """Lesson 11's MLP, forward and backward in bf16 autocast. Bad: `torch.cuda.empty_cache()` after
    every step, the usual answer to out-of-memory errors in forum code: each step gives every cached
    block back to the driver (cudaFree, which waits for the GPU) and asks for it again (cudaMalloc)
    while the GPU waits. Fixed: the caching allocator keeps its blocks, which is what it is for
    (lesson 02): steps reuse memory instead of asking the driver.

    Why not fragmentation under a cap, with the allocator's retries: on the H200 (torch 2.11) this MLP
    on batches of a new size every step (half the batch to the batch), capped at 1.15 times its largest
    step's memory (`set_per_process_memory_fraction`), ran out of memory within a few steps instead of
    retrying: the free pieces were parts of segments still in use, which no retry can give back. A step
    that fails cannot be diagnosed; lesson 02 shows that failure, in fresh processes."""
    from gpulab.lessons.l11_cuda_graphs import MLP, make_mlp_step
    from gpulab.models.precision import half_dtype

    cfg = MEMORY[resolve_scale(scale)]
    w, b = cfg["width"], cfg["batch"]
    gpu = device.type == "cuda"
    half = half_dtype() if gpu else torch.bfloat16
    ((x, t),) = _reordered([(torch.randn(b, w, device=device), torch.randn(b, w, device=device))], rows(b, reorder))
    torch.manual_seed(0)
    model = MLP(w, cfg["depth"]).to(device)
    grads = make_mlp_step(model)

    def make(empty_every_step: bool):
        def step():
            with torch.autocast(device.type, dtype=half):
                out = grads(x, t)
            if empty_every_step and gpu:
                torch.cuda.empty_cache()          # hands every unused cached block back to the driver
            return out
        return step

    return Pair(make(True), make(False), sizes={"width": w, "depth": cfg["depth"], "batch": b}, models=(model, model),
                note="" if gpu else "the caching allocator is CUDA's: on the CPU both steps allocate alike")


# -- 8. comm_not_overlapped: DDP's gradient buckets (lesson 14) --------------------------------------
# Lesson 11's wide MLP, not lesson 14's GPT blocks: lesson 14's model at its batch is host-bound under
# DDP (two H200s, 2026-11-30, results/diagnose/2026-11-30-h200x2-suite-at-8b96613/bench-h200x2-2026-11-30-suite.json: 429 kernels a step, the GPU
# idle 74 % of the profiled step), so the all-reduce spins in the host's gaps and the buckets have no
# GPU work to hide under (lesson 14 measures overlap 0 there, and 25 MiB buckets were slower than one).
# Eight 4096-wide layers are few, large kernels that keep the GPU busy through backward, and their
# 134 M parameters give an all-reduce of 537 MB of fp32 gradients for the buckets to hide.
DDP_SIZES = {"tiny": {"width": 64, "depth": 4, "batch": 64}, "full": {"width": 4096, "depth": 8, "batch": 8192}}


def build_ddp(scale: str, device: torch.device, reorder: bool = False) -> Pair:
    """Lesson 11's MLP under DistributedDataParallel, one process per GPU, each on its own batch, trained
    with SGD in 16-bit autocast. Bad: one gradient bucket for the whole model (lesson 14's "whole model"
    cap), so the all-reduce starts after the backward pass and the optimizer waits for all of it. Fixed:
    DDP's default 25 MiB buckets, each all-reduced while backward computes the layers before it.

    Needs a process group (the suite starts one process per GPU); without one, a group of one process
    (gloo) is made for the call and destroyed by `cleanup`, so the code runs on the CPU too."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from gpulab.lessons.l11_cuda_graphs import MLP

    own_group = not dist.is_initialized()
    if own_group:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    cfg = DDP_SIZES[resolve_scale(scale)]
    w, b = cfg["width"], cfg["batch"]
    rank, world = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(1 + rank)                 # each process its own batch
    ((x, t),) = _reordered([tuple(torch.randn(b, w, generator=gen).to(device) for _ in range(2))], rows(b, reorder))
    ids = [device.index] if device.type == "cuda" else None
    half = _half(device)

    def make(bucket_cap_mb: float | None):
        torch.manual_seed(0)                                      # same weights in every process and both steps
        net = MLP(w, cfg["depth"]).to(device)
        model_mib = sum(p.numel() * p.element_size() for p in net.parameters()) / 2**20
        ddp = DDP(net, device_ids=ids, bucket_cap_mb=bucket_cap_mb or model_mib * 1.01 + 1)
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=half):  # Tensor Cores: the comm, not fp32, must show
                loss = ddp(x, t)
            loss.backward()                                 # DDP all-reduces the gradient buckets here
            opt.step()                                      # ...and the optimizer waits for the last one
            return loss.detach()
        step.model = net
        return step

    def cleanup():
        if own_group:
            # gloo's worker threads destroy each finished work item themselves, and that needs the GIL (the
            # item keeps the Python state its thread had). When the last DDP reducer goes, the group's
            # destructor joins those threads while its caller holds the GIL: a worker still finishing an
            # item then waits forever (hung CI twice, every thread in a futex wait). Give them the GIL first.
            time.sleep(0.2)
            dist.destroy_process_group()

    params = cfg["depth"] * (w * w + w)
    bad, fixed = make(None), make(25)
    return Pair(bad, fixed, sizes=dict(cfg, parameters=params, processes=world), cleanup=cleanup,
                models=(bad.model, fixed.model))


# -- the capstone: nothing left to fix (lesson 13) ---------------------------------------------------
def build_capstone(scale: str, device: torch.device, reorder: bool = False) -> Pair:
    """Lesson 13's GPT with every toggle this device accepts (`all_on`: TF32, 16-bit autocast, padded
    vocabulary, fused AdamW, pinned DataLoader workers, torch.compile on a GPU), assembled from lesson
    13's parts as its `run_job` does; the FLOPs are lesson 13's `model_flops` (FlopCounterMode cannot see
    inside compiled code). No fixed step: no verdict on it may promise more than 10 %."""
    from gpulab.lessons.capstone.jobs import JOBS, model_flops
    from gpulab.lessons.capstone.knobs import ALIGN, LR, POOL
    from gpulab.lessons.capstone.options import AMP_DTYPES, all_on
    from gpulab.lessons.capstone.runner import Inputs
    from gpulab.lessons.capstone.runs import Runs
    from gpulab.models.gpt import padded_copy
    from gpulab.models.precision import fp32_math, make_scaler
    from gpulab.models.step import train_step

    runs = Runs(scale=scale)
    runs.fit_batches(("gpt",))            # the notebook's fitting: a smaller GPU gets a smaller model or batch
    cfg = runs.configs["gpt"]
    options = all_on("gpt", cfg["batch"])
    job = JOBS["gpt"]
    torch.manual_seed(0)
    model = job.build(cfg, device)
    pool = [(x.cpu(), y.cpu()) for x, y in job.batches(model, cfg["batch"], POOL)]
    if options.aligned:
        model = padded_copy(model, ALIGN)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, fused=True if options.fused else None)
    scaler = make_scaler("fp16", device) if options.amp == "fp16" else None
    loss_of = job.loss_fn
    if options.compile:
        loss_of = torch.compile(loss_of, mode=options.compile_mode)
    with quiet_fork():
        inputs = Inputs(pool, device, options.loader).__enter__()

    def step():
        with fp32_math("tf32" if options.tf32 else "ieee"):
            return train_step(model, *inputs.next(), loss=loss_of, optimizer=optimizer,
                              precision=AMP_DTYPES[options.amp], scaler=scaler, graphs=options.cuda_graphs)

    def cleanup():
        inputs.__exit__(None, None, None)
        if options.compile:
            torch.compiler.reset()

    return Pair(step, None, models=(model,), sizes=dict(cfg, options=options.label, fitted=runs.lowered.get("gpt", "")),
                flops_per_step=model_flops("gpt", cfg, cfg["batch"], device), cleanup=cleanup)


# -- the cases ---------------------------------------------------------------------------------------
CASES: dict[str, Case] = {c.name: c for c in (
    Case("input", "input_bound", "03", "DataLoader with 0 workers", "DataLoader workers", build_input,
         why_gpu="on the CPU the workers share the cores with the step they should run beside"),
    Case("host_sync", "host_sync", "01", ".item() on the loss every step", "the loss kept on the GPU",
         build_host_sync, why_gpu="on the CPU the host is the device: there is no queue for a sync to drain"),
    Case("pageable_copy", "pageable_copy", "05", "batch copied from pageable memory",
         "pinned once, copied with non_blocking=True", build_pageable_copy,
         why_gpu="host<->device copies cross a bus the CPU does not have"),
    Case("launch_bound", "launch_bound", "11", "small MLP step, eager", "the same step replayed from a CUDA graph",
         build_launch_bound, why_gpu="CUDA graphs replay CUDA kernel launches"),
    Case("fp32_no_tensor_cores", "fp32_matmuls", "06", "fp32 matmuls, TF32 off",
         "16-bit autocast (bf16; fp16 + GradScaler without bf16)", build_fp32,
         why_gpu="Tensor Cores are a GPU's"),
    Case("misaligned_gemm", "misaligned_gemm", "07", "GPT head over a vocabulary of 50257 (16-bit)",
         "vocabulary padded to a multiple of 64", build_misaligned, why_gpu="Tensor Core tiles are a GPU's"),
    Case("memory_pressure", "memory_pressure", "02", "torch.cuda.empty_cache() after every step",
         "the caching allocator keeps its blocks", build_memory,
         why_gpu="the caching allocator and its retries are CUDA's"),
    Case("comm_not_overlapped", "comm_not_overlapped", "14", "DDP, one gradient bucket for the whole model",
         "DDP's 25 MiB buckets, all-reduced during backward", build_ddp, needs_gpus=2,
         why_gpu="DDP's all-reduce between GPUs overlaps with backward only where there are two GPUs"),
    Case("capstone", None, "13", "lesson 13's fastest GPT step", "(nothing to fix)", build_capstone,
         why_gpu="its toggles (TF32, compile, pinned loader) are GPU options"),
)}


def case(name: str) -> Case:
    """The case called `name` (ValueError listing them otherwise)."""
    if name not in CASES:
        raise ValueError(f"unknown case {name!r}; the cases are {', '.join(CASES)}")
    return CASES[name]

