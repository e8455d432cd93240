"""`gpulab bench`: each lesson's headline comparison, run headless, checked against a band.

For instructors and maintainers. Every entry of `REGISTRY` is one small function that calls the
same gpulab functions its notebook calls for the headline comparison (never a copy of the
notebook's code), checks the faster variant against the baseline before timing it, and returns
a `Measured`: baseline and optimized values with their unit, the ratio, and the check.

    report = run(select(["05", "07"]))      # what `gpulab bench --lessons 05,07` does
    print(format_table(report))

Bands come from `bands.toml` beside this file (one per lesson and GPU class: `tensor-core`,
`pre-volta`, `cpu`), each with its source. A ratio inside its band passes; the CPU class and
tiny-scale runs are reported "n/a", never passed or failed. Adding a lesson: one function here,
one line in `REGISTRY`, one band per GPU class in bands.toml.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import os
import socket
import sys
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from gpulab.device import by_scale, device_facts, pick_device, require_cuda, scale
from gpulab.precision import half_dtype
from gpulab.results import Record, ResultsStore, current_gpu_name, results_store

BENCH_KIND = "gpulab-bench"
BENCH_SCHEMA = 1
CLASSES = ("tensor-core", "pre-volta", "cpu")
BANDS_PATH = Path(__file__).with_name("bands.toml")
MiB, GiB = 2**20, 2**30

# Statuses of a row. --check fails on FAILING; n/a and skipped never pass or fail.
PASS, FAIL, NA, SKIPPED, WRONG, ERROR = "pass", "FAIL", "n/a", "skipped", "wrong", "error"
FAILING = (FAIL, WRONG, ERROR)


class Skipped(Exception):
    """The experiment cannot run on this machine (e.g. it needs a CUDA GPU); the message says why."""


@dataclass(frozen=True)
class Measured:
    """What one headline experiment measured. `ratio` is defined as in the lesson's own self-check."""

    baseline: float
    optimized: float
    unit: str
    ratio: float
    correct: bool              # the optimized variant matched the baseline before it was timed
    check: str                 # what was checked, with the numbers
    baseline_label: str = "baseline"
    optimized_label: str = "optimized"
    notes: str = ""


@dataclass(frozen=True)
class Experiment:
    """One registry entry: the lesson's headline comparison.

    `from_store` reads the same ratio from a results-store file's records (those the notebook
    recorded), so `gpulab room` and the README table can use notebook runs too; None if the
    notebook does not record it.
    """

    lesson: str
    title: str
    metric: str
    run: Callable[[], Measured]
    from_store: Callable[[Sequence[Record]], list[float]] | None = None


# -- reading ratios back from results-store records -----------------------------------------------
def _values(records: Sequence[Record], lesson: str, name: str) -> list[float]:
    return [r.value for r in records if r.lesson == lesson and r.name == name]


def _stored(lesson: str, name: str) -> Callable[[Sequence[Record]], list[float]]:
    """The notebook records the ratio itself under `name`."""
    return lambda records: _values(records, lesson, name)


def _stored_ratio(lesson: str, numerators: Sequence[str], denominator: str):
    """The notebook records both sides: the best of `numerators` / `denominator`, run by run (records
    of one notebook run are written together, so the k-th of each name belong to the k-th run)."""
    def read(records: Sequence[Record]) -> list[float]:
        tops = [v for v in (_values(records, lesson, n) for n in numerators) if v]
        dens = _values(records, lesson, denominator)
        if not tops or not dens:
            return []
        return [max(t) / d for *t, d in zip(*tops, dens) if d]
    return read


def _first_stored(lesson: str, names: Sequence[str]):
    """The first of `names` that the records hold (e.g. fp16 on a GPU, bf16 on the CPU)."""
    def read(records: Sequence[Record]) -> list[float]:
        for n in names:
            if found := _values(records, lesson, n):
                return found
        return []
    return read


# -- the experiments, one per lesson ----------------------------------------------------------
def ceilings_half_vs_fp32() -> Measured:
    """Lesson 00: the fastest 16-bit matmul against fp32 (`ceilings.matmul_experiment`)."""
    from gpulab.ceilings import matmul_experiment, supported_precisions

    n = by_scale(tiny=256, full=8192)
    halves = [p for p in supported_precisions() if p in ("fp16", "bf16")]
    fp32 = matmul_experiment("fp32", n)            # each checked against float64 before it is timed
    runs = {p: matmul_experiment(p, n) for p in halves}
    best = max(runs, key=lambda p: runs[p]["TFLOP/s"])
    errors = ", ".join(f"{p} {r['rel. error']:.1e}" for p, r in {"fp32": fp32, **runs}.items())
    return Measured(fp32["TFLOP/s"], runs[best]["TFLOP/s"], "TFLOP/s", runs[best]["TFLOP/s"] / fp32["TFLOP/s"],
                    True, f"relative error against float64: {errors}", f"fp32, n={n}", f"{best}, n={n}")


def timing_sync_vs_no_sync() -> Measured:
    """Lesson 01: the same matmul timed without synchronizing (wrong) and with CUDA events (right)."""
    from gpulab.device import sync
    from gpulab.timing import benchmark

    n = by_scale(tiny=256, full=8192)
    device = pick_device()
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    wrong = benchmark(lambda: a @ b, sync=False)
    sync()
    right = benchmark(lambda: a @ b)
    del a, b
    return Measured(wrong.median_ms, right.median_ms, "ms", right.median_ms / wrong.median_ms, True,
                    "nothing to compare: both columns time the same a @ b",
                    f"host clock, no sync (fp32 n={n})", "CUDA events + sync")


def input_pipeline_workers() -> Measured:
    """Lesson 03: step time with 0 DataLoader workers against the best worker count (`gpulab.data`)."""
    from gpulab.data import SmallCNN, SyntheticImages, batches_match, calibrate_passes, loader_run, make_step

    device = pick_device()
    on_gpu = device.type == "cuda"
    cores = os.cpu_count() or 1
    size, batch = by_scale(tiny=32, full=96), by_scale(tiny=16, full=64)
    passes = calibrate_passes(size, target_sample_ms=by_scale(tiny=0.9, full=1.5))
    width, blocks = by_scale(tiny=(8, 2), full=(64, 4))
    torch.manual_seed(0)
    step = make_step(SmallCNN(width=width, blocks=blocks, device=device))
    counts = [k for k in by_scale(tiny=(0, 2), full=(0, 2, 4, 8, 12)) if k <= cores]
    steps, warmup = by_scale(tiny=8, full=30), 3
    with warnings.catch_warnings():
        # Python 3.12+ warns about fork() in a process with threads (CUDA's); the workers never
        # touch CUDA, which is what makes fork safe here (as notebook 03 explains).
        warnings.filterwarnings("ignore", message=r"This process .*is multi-threaded, use of fork",
                                category=DeprecationWarning)
        same, n_batches = batches_match(SyntheticImages(length=3 * batch, size=size, passes=passes), batch,
                                        num_workers=max(counts))
        step_ms = {k: loader_run(step, k, batch=batch, size=size, passes=passes, steps=steps, warmup=warmup,
                                 pin_memory=on_gpu, device=device).step_ms for k in counts}
    best = min(step_ms, key=step_ms.get)
    return Measured(step_ms[0], step_ms[best], "ms/step", step_ms[0] / step_ms[best], same,
                    f"{n_batches} batches {'identical' if same else 'DIFFERENT'} with 0 and {max(counts)} workers",
                    f"0 workers (batch {batch}, {passes} passes)", f"{best} workers (best of {counts})")


def occupancy_wave_step() -> Measured:
    """Lesson 04: one program more than a full wave costs a second wave (`occupancy.WaveKernel`)."""
    from gpulab.occupancy import WaveKernel, triton_status

    ok, why = triton_status()
    if not ok:
        raise Skipped(why)
    wave = WaveKernel(iters=by_scale(tiny=64, full=512))     # compiles, then checks its output
    one, more = wave.time(wave.slots), wave.time(wave.slots + 1)
    return Measured(one.median_ms, more.median_ms, "ms", more.median_ms / one.median_ms, True,
                    "wave_kernel's output checked (a=1, b=0 leaves its input unchanged)",
                    f"{wave.slots} programs (one full wave)", f"{wave.slots + 1} programs")


def pcie_pinned_vs_pageable() -> Measured:
    """Lesson 05: host->device copy from pinned against pageable memory (`transfers.transfer_bandwidth`)."""
    from gpulab.transfers import transfer_bandwidth

    try:
        require_cuda("host<->device copies cross a bus the CPU does not have")
    except ValueError as err:
        raise Skipped(str(err)) from None
    nbytes = by_scale(tiny=16, full=256) * MiB
    pageable = transfer_bandwidth(nbytes, "h2d", pinned=False)["GB/s"]   # each copy checked byte for byte
    pinned = transfer_bandwidth(nbytes, "h2d", pinned=True)["GB/s"]
    return Measured(pageable, pinned, "GB/s", pinned / pageable, True, "every copy checked byte for byte",
                    f"pageable, {nbytes // MiB} MiB", f"pinned, {nbytes // MiB} MiB")


def amp_cnn_speedup() -> Measured:
    """Lesson 06: CNN training throughput, fastest 16-bit autocast against fp32 (`precision.precision_run`)."""
    from gpulab import precision as P
    from gpulab.memory import GiB as _GiB
    from gpulab.workloads import ResNetish, fit_batch, image_batches, memory_budget

    device = pick_device()
    facts = device_facts()
    cfg = by_scale(tiny=dict(depths=(1, 1, 1, 1), width=8, classes=10, image=32, batch=32),
                   full=dict(depths=(3, 4, 6, 3), width=64, classes=1000, image=224, batch=128))
    torch.manual_seed(0)
    model = ResNetish(cfg["depths"], cfg["width"], cfg["classes"], cfg["image"], device=device)
    work = P.Workload("CNN", model, lambda b: image_batches(model, b, count=4, seed=1), P.classification_loss,
                      lambda m: torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9), unit="img/s")

    batch = fit_batch(lambda b: P.step_peak(work, b, "fp32"), cfg["batch"], memory_budget(cap=64 * _GiB))
    # fp16 autocast is no fast path on the CPU (notebook 06 times it on GPUs only)
    halves = [p for p in ("fp16", "bf16") if p in P.supported(facts) and (device.type == "cuda" or p != "fp16")]
    x, y = work.batches(batch)[0]
    ref = P.first_loss(work, x, y, "fp32")
    diffs = {p: abs(P.first_loss(work, x, y, p) - ref) / abs(ref) for p in halves}
    del x, y
    correct = all(diffs[p] <= P.FIRST_LOSS_TOLERANCE[p] for p in halves)
    steps, repeat = by_scale(tiny=1, full=2), by_scale(tiny=3, full=10)
    rate = {p: P.precision_run(work, p, batch, steps, repeat)["img/s"] for p in ("fp32", *halves)}
    best = max(halves, key=rate.get)
    return Measured(rate["fp32"], rate[best], "img/s", rate[best] / rate["fp32"], correct,
                    "first loss vs fp32: " + ", ".join(f"{p} {d:.1e} (tolerance {P.FIRST_LOSS_TOLERANCE[p]:.0e})"
                                                       for p, d in diffs.items()),
                    f"fp32, batch {batch}", f"{best} autocast" + (" + GradScaler" if best == "fp16" else ""))


def tensor_core_alignment() -> Measured:
    """Lesson 07: an n = 4096 matrix product against n = 4095 (`precision.gemm_experiment`)."""
    from gpulab import precision as P

    facts = device_facts()
    if facts.kind == "cuda":
        p = next(p for p in ("fp16", "bf16") if P.refusal(p, facts) is None)
    else:
        p = "bf16"                  # notebook 07: fp16 products take a slow path on the CPU
    aligned, misaligned = by_scale(tiny=(256, 255), full=(4096, 4095))
    repeat = by_scale(tiny=10, full=20)
    P.gemm_experiment(aligned, p, repeat=1)        # loads the math library's kernels first
    fast = P.gemm_experiment(aligned, p, repeat=repeat)     # each checked against fp32 first
    slow = P.gemm_experiment(misaligned, p, repeat=repeat)
    return Measured(slow["TFLOP/s"], fast["TFLOP/s"], "TFLOP/s", fast["TFLOP/s"] / slow["TFLOP/s"], True,
                    f"relative error against fp32: {fast['rel. error']:.1e} ({aligned}), "
                    f"{slow['rel. error']:.1e} ({misaligned})", f"{p}, n={misaligned}", f"{p}, n={aligned}")


def streams_overlap() -> Measured:
    """Lesson 08: a host->device copy and a matmul, serial on one stream and overlapped on two
    (`streams.CopyAndMatmul`, as notebook 08 times it)."""
    from gpulab.streams import NO_STREAMS, CopyAndMatmul
    from gpulab.timing import benchmark

    try:
        device = require_cuda(NO_STREAMS)
    except ValueError as err:
        raise Skipped(str(err)) from None
    mib, n = by_scale(tiny=8, full=256), by_scale(tiny=256, full=8192)
    dtype = half_dtype()
    job = CopyAndMatmul.make(mib, n, dtype, device)
    try:
        said, correct = job.check(), True
    except AssertionError as err:
        said, correct = f"FAILED: {str(err).splitlines()[0]}", False
    serial = benchmark(lambda: job.run(overlap=False))
    overlapped = benchmark(lambda: job.run(overlap=True))
    del job
    return Measured(serial.median_ms, overlapped.median_ms, "ms", overlapped.median_ms / serial.median_ms,
                    correct, said, f"serial: copy {mib} MiB, then matmul n={n}", "overlapped on two streams")


def checkpointing_memory() -> Measured:
    """Lesson 09: peak memory of a training step, checkpointing every block against none
    (`workloads.TransformerStack`, `training_peak`)."""
    from gpulab.timing import benchmark
    from gpulab.workloads import (GRAD_TOL, TransformerStack, checkpointing_check, make_batch, predicted_batch,
                                  train_step, training_peak)

    device = pick_device()
    if device.type != "cuda":
        raise Skipped("peak memory is read from CUDA's caching allocator; the CPU has none")
    cfg = by_scale(tiny=dict(n_blocks=12, width=64, heads=4, seq=32, batch=4),
                   full=dict(n_blocks=12, width=1024, heads=16, seq=1024, batch=32))
    dtype = half_dtype()
    torch.manual_seed(0)
    model = TransformerStack(cfg["n_blocks"], cfg["width"], cfg["heads"], cfg["seq"], device=device)
    params = sum(p.numel() for p in model.parameters())
    batch = predicted_batch(cfg["n_blocks"], cfg["batch"], cfg["seq"], cfg["width"], params, device=device)
    x, y = make_batch(model, 2, seed=1)
    ref_loss, checked = checkpointing_check(model, x, y, ks=(1,))    # correct before fast, as notebook 09
    loss, diff = checked[1]
    correct = abs(loss - ref_loss) <= GRAD_TOL * abs(ref_loss) and diff <= GRAD_TOL
    del x, y
    peak, step_ms = {}, {}
    try:
        for k in (0, 1):
            model.checkpoint_every = k
            peak[k] = training_peak(model, batch, dtype)
            x, y = make_batch(model, batch)
            step_ms[k] = benchmark(lambda: train_step(model, x, y, dtype), warmup=2).median_ms
            del x, y
    finally:
        model.zero_grad(set_to_none=True)
    return Measured(peak[0] / GiB, peak[1] / GiB, "GiB", peak[1] / peak[0], correct,
                    f"fp32 loss and gradients, every block vs none: worst relative difference {diff:.1e} "
                    f"(<= {GRAD_TOL:.0e})",
                    f"no checkpointing, batch {batch}", "checkpoint every block",
                    notes=f"step time every block / none: {step_ms[1] / step_ms[0]:.2f}x")


def accumulation_memory() -> Measured:
    """Lesson 10: peak memory of one big batch against the same effective batch accumulated over
    micro-batches (`workloads.accumulate`, `track_peak`); the gradients are checked equal first."""
    from gpulab.memory import track_peak
    from gpulab.workloads import (GRAD_TOL, TransformerStack, accumulate, accumulation_check, make_batch, param_bytes,
                                  predicted_batch, train_step)

    device = pick_device()
    if device.type != "cuda":
        raise Skipped("peak memory is read from CUDA's caching allocator; the CPU has none")
    cfg = by_scale(tiny=dict(n_blocks=4, width=64, heads=4, seq=32, micro=4),
                   full=dict(n_blocks=12, width=1024, heads=16, seq=1024, micro=8))
    steps = 4
    dtype = half_dtype()
    torch.manual_seed(0)
    model = TransformerStack(cfg["n_blocks"], cfg["width"], cfg["heads"], cfg["seq"], device=device)
    params = sum(p.numel() for p in model.parameters())
    micro = predicted_batch(cfg["n_blocks"], cfg["micro"], cfg["seq"], cfg["width"], params, times=steps,
                            device=device)     # one big batch of micro x steps is run too
    x, y = make_batch(model, 2 * steps, seed=1)                 # correct first, in fp32, as notebook 10
    diff = accumulation_check(model, x, y, steps)["divided"]
    del x, y
    try:
        xb, yb = make_batch(model, micro * steps)
        with track_peak() as one:
            train_step(model, xb, yb, dtype)
        model.zero_grad(set_to_none=True)
        with track_peak() as accumulated:
            accumulate(model, zip(xb.chunk(steps), yb.chunk(steps)), steps, dtype)
        del xb, yb
    finally:
        model.zero_grad(set_to_none=True)
    base = param_bytes(model)
    big_peak, acc_peak = base + one.peak_above_start, base + accumulated.peak_above_start
    return Measured(big_peak / GiB, acc_peak / GiB, "GiB", big_peak / acc_peak, diff < GRAD_TOL,
                    f"fp32 gradients, {steps} micro-batches vs one batch: largest difference / norm {diff:.1e} "
                    f"(< {GRAD_TOL:.0e})",
                    f"one batch of {micro * steps}", f"{steps} x {micro} accumulated")


def fusion_compile() -> Measured:
    """Lesson 12: the seed's (x + y).relu().mean(1), eager against torch.compile (`fusion.fused_operation`)."""
    from gpulab.fusion import check_close, compile_backend, fused_operation
    from gpulab.timing import benchmark

    device = pick_device()
    n = by_scale(tiny=512, full=8192)
    torch.manual_seed(0)
    x = torch.randn(n, n, device=device)
    y = torch.randn(n, n, device=device)
    backend, why = compile_backend(device)
    torch.compiler.reset()
    compiled = torch.compile(fused_operation, backend=backend)
    worst = check_close(compiled(x, y), fused_operation(x, y))      # raises if it differs (1e-5)
    eager = benchmark(lambda: fused_operation(x, y))
    fused = benchmark(lambda: compiled(x, y))
    del x, y
    return Measured(eager.median_ms, fused.median_ms, "ms", eager.median_ms / fused.median_ms, True,
                    f"compiled vs eager: largest difference {worst:.1e} (<= 1e-5)",
                    f"eager, fp32 {n} x {n}", f"torch.compile ({backend})")


def graphs_tiny_ops() -> Measured:
    """Lesson 11: 400 tiny elementwise ops, eager against one CUDA graph replay (`graphs.capture`)."""
    from gpulab.graphs import NO_GRAPHS, capture, max_difference, tiny_ops, tiny_ops_reference
    from gpulab.timing import benchmark

    try:
        device = require_cuda(NO_GRAPHS)
    except ValueError as err:
        raise Skipped(str(err)) from None
    n_ops = 400
    x = torch.randn(1024, device=device)
    eager_out = tiny_ops(x, n_ops)
    eager_err = max_difference(eager_out, tiny_ops_reference(x, n_ops))
    graph, graph_out = capture(lambda t: tiny_ops(t, n_ops), x)
    graph.replay()
    replay_diff = max_difference(graph_out, eager_out)
    eager = benchmark(lambda: tiny_ops(x, n_ops))
    replay = benchmark(graph.replay)
    del graph, graph_out, eager_out, x
    return Measured(eager.median_ms, replay.median_ms, "ms", eager.median_ms / replay.median_ms,
                    eager_err <= 1e-4 and replay_diff == 0.0,
                    f"eager vs float64 {eager_err:.1e} (<= 1e-4); replay vs eager {replay_diff:.1e} (must be 0)",
                    f"eager, {n_ops} launches", "one CUDA graph replay")


def capstone_gpt() -> Measured:
    """Lesson 13: the GPT job, fp32 against every toggle this device accepts (`capstone.headline`)."""
    from gpulab.capstone import headline

    h = headline("gpt")
    notes = f"MFU {100 * h['mfu']:.0f}% of {h['peak']}" if h["mfu"] is not None else "MFU: no 16-bit peak known"
    return Measured(h["baseline"], h["optimized"], h["unit"], h["ratio"], h["correct"], h["check"],
                    h["baseline_label"], h["optimized_label"], notes=notes)


REGISTRY: tuple[Experiment, ...] = (
    Experiment("00", "GPU ceilings", "16-bit / fp32 matmul TFLOP/s", ceilings_half_vs_fp32,
               _stored_ratio("00", ("matmul_fp16", "matmul_bf16"), "matmul_fp32")),
    Experiment("01", "measuring time", "CUDA events / host clock without sync, ms", timing_sync_vs_no_sync),
    Experiment("03", "input pipeline", "step time, 0 workers / best worker count", input_pipeline_workers,
               _stored("03", "speedup_best_vs_0")),
    Experiment("04", "occupancy and waves", "one program past a full wave / a full wave, ms", occupancy_wave_step,
               _stored("04", "wave_step_ratio")),
    Experiment("05", "PCIe transfers", "pinned / pageable host->device GB/s", pcie_pinned_vs_pageable,
               _stored_ratio("05", ("h2d_pinned_largest_gbps",), "h2d_pageable_largest_gbps")),
    Experiment("06", "mixed precision", "CNN images/s, best 16-bit / fp32", amp_cnn_speedup,
               _stored("06", "cnn_amp_speedup")),
    Experiment("07", "Tensor Core alignment", "matmul TFLOP/s, n=4096 / n=4095", tensor_core_alignment,
               _first_stored("07", ("gemm_aligned_speedup_fp16", "gemm_aligned_speedup_bf16"))),
    Experiment("08", "CUDA streams", "copy + matmul, overlapped / serial ms", streams_overlap,
               _stored("08", "overlapped_vs_serial")),
    Experiment("09", "activation checkpointing", "peak memory, every block / none", checkpointing_memory,
               _stored("09", "peak_ratio_every_block")),
    Experiment("10", "gradient accumulation", "peak memory, one big batch / accumulated", accumulation_memory),
    Experiment("11", "CUDA graphs", "400 tiny ops, eager / graph replay ms", graphs_tiny_ops,
               _stored("11", "tiny_ops_speedup")),
    Experiment("12", "kernel fusion", "eager / torch.compile ms", fusion_compile, _stored("12", "eager_vs_compile")),
    Experiment("13", "capstone", "GPT tokens/s, every toggle / fp32", capstone_gpt, _stored("13", "gpt_speedup_fastest")),
)

# Lessons whose headline comparison exists only as code in the notebook: not benched (see report).
NOT_IN_BENCH = {
    "02": "its headline is an outcome (an OOM under a memory cap, removed by a fix), not a ratio",
    "14": "it needs two or more GPUs and starts its own processes; run notebook 14",
}


def select(lessons: Sequence[str] | None = None, registry: Sequence[Experiment] | None = None) -> list[Experiment]:
    """The entries for `lessons` (all when None), in registry order; ValueError naming what is unknown."""
    registry = REGISTRY if registry is None else registry
    if not lessons:
        return list(registry)
    wanted = [str(x).strip().zfill(2) for x in lessons if str(x).strip()]
    known = {e.lesson for e in registry}
    unknown = [x for x in wanted if x not in known]
    if unknown:
        why = "; ".join(f"{x}: " + (f"not in bench ({NOT_IN_BENCH[x]})" if x in NOT_IN_BENCH else "no such lesson")
                        for x in unknown)
        raise ValueError(f"{why}. Lessons in bench: {', '.join(sorted(known))}.")
    return [e for e in registry if e.lesson in wanted]


# -- bands ------------------------------------------------------------------------------------
class BandsError(ValueError):
    """The bands file is missing something or says something impossible."""


@dataclass(frozen=True)
class Band:
    gpu_class: str
    lesson: str
    metric: str
    low: float
    high: float
    source: str
    applies: bool = True
    why: str = ""               # why the band does not apply (applies=False)


@dataclass(frozen=True)
class Bands:
    path: str
    classes: dict[str, dict[str, Any]]          # class -> its settings (applies, why, source, description)
    bands: dict[str, dict[str, Band]]           # class -> lesson -> band

    def band(self, gpu_class: str, lesson: str) -> Band | None:
        return self.bands.get(gpu_class, {}).get(lesson)


def _toml():
    try:
        import tomllib
    except ModuleNotFoundError:          # Python 3.10
        import tomli as tomllib
    return tomllib


def load_bands(path: str | os.PathLike | None = None) -> Bands:
    """Read and check a bands file (default: gpulab/bands.toml); BandsError says what is wrong."""
    path = Path(path) if path is not None else BANDS_PATH
    tomllib = _toml()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise BandsError(f"bands file {path}: cannot be read ({err.strerror or err})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise BandsError(f"bands file {path}: not valid TOML ({err})") from None
    classes, bands = {}, {}
    for cls in CLASSES:
        table = data.get(cls)
        if not isinstance(table, dict):
            raise BandsError(f"bands file {path}: no [{cls}] table (classes: {', '.join(CLASSES)})")
        settings = {k: v for k, v in table.items() if not isinstance(v, dict)}
        if not isinstance(settings.get("applies", True), bool):
            raise BandsError(f"bands file {path}: [{cls}] applies must be true or false")
        if settings.get("applies", True) is False and not str(settings.get("why", "")).strip():
            raise BandsError(f"bands file {path}: [{cls}] does not apply, so it needs a 'why'")
        classes[cls] = settings
        bands[cls] = {}
        for lesson, raw in table.items():
            if isinstance(raw, dict):
                bands[cls][lesson] = _band(path, cls, lesson, raw)
    extra = sorted(set(data) - set(CLASSES))
    if extra:
        raise BandsError(f"bands file {path}: unknown class(es) {', '.join(extra)} (classes: {', '.join(CLASSES)})")
    return Bands(str(path), classes, bands)


def _band(path: Path, cls: str, lesson: str, raw: dict) -> Band:
    where = f"bands file {path}: [{cls}.{lesson}]"
    metric, source = raw.get("metric"), raw.get("source")
    if not isinstance(metric, str) or not metric.strip():
        raise BandsError(f"{where} needs a 'metric'")
    if not isinstance(source, str) or not source.strip():
        raise BandsError(f"{where} needs a 'source': where the band comes from")
    applies = raw.get("applies", True)
    if not isinstance(applies, bool):
        raise BandsError(f"{where} applies must be true or false")
    if not applies:
        why = raw.get("why")
        if not isinstance(why, str) or not why.strip():
            raise BandsError(f"{where} does not apply, so it needs a 'why'")
        return Band(cls, lesson, metric, -math.inf, math.inf, source, False, why)
    low, high = raw.get("low"), raw.get("high")
    for name, v in (("low", low), ("high", high)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
            raise BandsError(f"{where} needs a number '{name}' (use -inf or inf for no bound)")
    if low > high:
        raise BandsError(f"{where} low {low} > high {high}")
    if math.isinf(low) and math.isinf(high):
        raise BandsError(f"{where} bounds nothing: give low or high (or applies = false and a why)")
    return Band(cls, lesson, metric, float(low), float(high), source, True, "")


def gpu_class(facts=None) -> str:
    """'tensor-core' (compute capability >= 7.0), 'pre-volta', or 'cpu' for this device."""
    facts = facts or device_facts()
    if facts.kind != "cuda" or facts.compute_capability is None:
        return "cpu"
    return "tensor-core" if tuple(facts.compute_capability) >= (7, 0) else "pre-volta"


def judge(exp: Experiment, measured: Measured | None, bands: Bands, cls: str, size: str) -> tuple[str, str, Band | None]:
    """(status, why, band) of one measurement. Wrong results fail; the CPU class and tiny runs are n/a."""
    band = bands.band(cls, exp.lesson)
    if band is not None and band.metric != exp.metric:
        return ERROR, (f"the band in {bands.path} [{cls}.{exp.lesson}] is for '{band.metric}', "
                       f"the bench measures '{exp.metric}'"), band
    if measured is None:
        return SKIPPED, "", band
    if not measured.correct:
        return WRONG, f"the optimized variant did not match the baseline: {measured.check}", band
    settings = bands.classes.get(cls, {})
    if settings.get("applies", True) is False:
        return NA, str(settings.get("why", "")), band
    if size != "full":
        return NA, "tiny scale: bands are for full-size runs", band
    if band is None:
        return NA, f"no band for lesson {exp.lesson} in class {cls} ({bands.path})", None
    if not band.applies:
        return NA, band.why, band
    if not math.isfinite(measured.ratio):
        return FAIL, f"ratio is {measured.ratio}", band
    ok = band.low <= measured.ratio <= band.high
    return (PASS, "", band) if ok else (FAIL, f"outside [{_num(band.low)}, {_num(band.high)}]", band)


# -- running ----------------------------------------------------------------------------------
@dataclass
class Row:
    lesson: str
    title: str
    metric: str
    status: str
    why: str = ""
    baseline: float | None = None
    optimized: float | None = None
    unit: str = ""
    baseline_label: str = ""
    optimized_label: str = ""
    ratio: float | None = None
    correct: bool | None = None
    check: str = ""
    notes: str = ""
    band_low: float | None = None
    band_high: float | None = None
    band_source: str = ""
    seconds: float = 0.0


@dataclass
class Report:
    run_id: str
    gpu: str
    gpu_class: str
    device: str
    torch: str
    cuda: str | None
    scale: str
    time: str
    host: str
    bands_file: str
    rows: list[Row] = field(default_factory=list)
    not_in_bench: dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> list[Row]:
        return [r for r in self.rows if r.status in FAILING]

    def to_json(self) -> dict:
        out = {"kind": BENCH_KIND, "schema": BENCH_SCHEMA, **asdict(self)}
        for row in out["rows"]:                     # JSON has no inf or nan: an open bound is null
            for k, v in row.items():
                if isinstance(v, float) and not math.isfinite(v):
                    row[k] = None
        return out


class Progress:
    """A plain progress bar on stderr: redrawn in place on a terminal, one line per step otherwise."""

    def __init__(self, total: int, stream=None, width: int = 24):
        self.total, self.width, self.done = total, width, 0
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.t0 = time.perf_counter()

    def show(self, label: str) -> str:
        filled = self.width * self.done // max(self.total, 1)
        line = (f"[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} "
                f"{time.perf_counter() - self.t0:5.0f} s  {label}")
        if self.tty:
            self.stream.write("\r" + line[:100].ljust(100))
            self.stream.flush()
        return line

    def step(self, label: str) -> None:
        self.done += 1
        line = self.show(label)
        if not self.tty:                 # a log file: one line per finished step
            self.stream.write(line + "\n")
            self.stream.flush()
        if self.tty and self.done == self.total:
            self.stream.write("\n")
            self.stream.flush()


def run(experiments: Sequence[Experiment] | None = None, bands: Bands | None = None,
        progress: bool = True, stream=None) -> Report:
    """Run each experiment once (skipped where it cannot run here, its error caught and reported),
    judge it against this GPU class's band, and return the report. Nothing is written."""
    from gpulab.memory import memory_guard

    experiments = list(REGISTRY if experiments is None else experiments)
    bands = bands or load_bands()
    device = pick_device()
    facts = device_facts(device)
    cls, size = gpu_class(facts), scale()
    now = dt.datetime.now(dt.timezone.utc)
    report = Report(run_id=f"{socket.gethostname()}-{now.strftime('%Y%m%dT%H%M%S%fZ')}",
                    gpu=current_gpu_name(), gpu_class=cls, device=device.type, torch=torch.__version__,
                    cuda=torch.version.cuda, scale=size, time=now.isoformat(timespec="seconds"),
                    host=socket.gethostname(), bands_file=bands.path,
                    not_in_bench={k: v for k, v in NOT_IN_BENCH.items()})
    bar = Progress(len(experiments), stream) if progress else None
    for exp in experiments:
        if bar:
            bar.show(f"{exp.lesson} {exp.title} ...")
        t0 = time.perf_counter()
        measured, why_run, status = None, "", None
        try:
            with memory_guard(quiet=True) as guard:
                measured = exp.run()
        except Skipped as err:
            why_run = str(err)
        except AssertionError as err:           # a gpulab check refused a wrong result before timing
            status, why_run = WRONG, f"wrong result: {err}"
        except Exception as err:  # noqa: BLE001 - one broken lesson must not stop the bench
            status, why_run = ERROR, f"{type(err).__name__}: {err}"
        seconds = time.perf_counter() - t0
        judged, why, band = judge(exp, measured, bands, cls, size)
        row = Row(exp.lesson, exp.title, exp.metric, status or judged, why_run or why, seconds=seconds)
        if band is not None and band.applies:
            row.band_low, row.band_high = band.low, band.high
        if band is not None:
            row.band_source = band.source
        if measured is not None:
            row.baseline, row.optimized, row.unit = measured.baseline, measured.optimized, measured.unit
            row.baseline_label, row.optimized_label = measured.baseline_label, measured.optimized_label
            row.ratio, row.correct, row.check, row.notes = measured.ratio, measured.correct, measured.check, measured.notes
            if not guard.ok:
                row.notes = (row.notes + "; " if row.notes else "") + guard.message()
        report.rows.append(row)
        if bar:
            bar.step(f"{exp.lesson} {exp.title}: {row.status}")
    return report


# -- output -----------------------------------------------------------------------------------
def _num(v: float | None, unit: str = "") -> str:
    if v is None:
        return "-"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return f"{v:.4g}" + (f" {unit}" if unit else "")


def band_text(low: float | None, high: float | None) -> str:
    if low is None and high is None:
        return "-"
    if low is None or math.isinf(low):
        return f"<= {_num(high)}"
    if high is None or math.isinf(high):
        return f">= {_num(low)}"
    return f"{_num(low)} - {_num(high)}"


def table_rows(report: Report) -> list[tuple[str, ...]]:
    """(lesson, headline, baseline, optimized, ratio, band, status) per row, as printed."""
    rows = []
    for r in report.rows:
        rows.append((r.lesson, r.metric,
                     f"{_num(r.baseline, r.unit)} ({r.baseline_label})" if r.baseline is not None else "-",
                     f"{_num(r.optimized, r.unit)} ({r.optimized_label})" if r.optimized is not None else "-",
                     f"{r.ratio:.3g}x" if r.ratio is not None else "-",
                     band_text(r.band_low, r.band_high), r.status))
    return rows


def format_table(report: Report) -> str:
    """The bench's one table, a line per failed, wrong, skipped or n/a row saying why, and what is not benched."""
    header = ("lesson", "headline", "baseline", "optimized", "ratio", "band", "status")
    rows = table_rows(report)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    out = [f"gpulab bench on {report.gpu} (class {report.gpu_class}), torch {report.torch}, "
           f"scale={report.scale}, {report.time}", "", line(header), line(tuple("-" * w for w in widths))]
    out += [line(r) for r in rows]
    notes = [f"  {r.lesson} {r.status}: {r.why}" for r in report.rows if r.why]
    notes += [f"  {r.lesson} note: {r.notes}" for r in report.rows if r.notes]
    if notes:
        out += ["", *notes]
    if report.not_in_bench:
        out += ["", "not in bench: " + "; ".join(f"{k} ({v})" for k, v in sorted(report.not_in_bench.items()))]
    if report.device != "cuda":
        out += ["", "CPU run: tiny sizes, the numbers are illustrative only; bands are not applicable."]
    failed = report.failed
    out += ["", f"{len(failed)} row(s) failed: {', '.join(r.lesson for r in failed)}" if failed
            else "no row failed."]
    return "\n".join(out)


def default_json_path(report: Report) -> Path:
    """Where the JSON goes without --json: beside the results store, named for the GPU and time."""
    from gpulab.results import default_path

    slug = "".join(c if c.isalnum() else "-" for c in report.gpu.lower()).strip("-") or "gpu"
    stamp = report.time.replace(":", "").replace("-", "").replace("+0000", "Z")
    return default_path().parent / "bench" / f"{slug}-{stamp}.json"


def write_json(report: Report, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report.to_json(), indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def record(report: Report, store: ResultsStore | None = None) -> int:
    """Write each measured row into the results store as `bench_ratio` of its lesson; returns how many."""
    store = store or results_store()
    n = 0
    for r in report.rows:
        if r.ratio is None or not math.isfinite(r.ratio):
            continue
        store.record(r.lesson, "bench_ratio", r.ratio, "x", metric=r.metric, status=r.status,
                     baseline=r.baseline, optimized=r.optimized, value_unit=r.unit, run_id=report.run_id,
                     band_low=None if r.band_low is None or math.isinf(r.band_low) else r.band_low,
                     band_high=None if r.band_high is None or math.isinf(r.band_high) else r.band_high)
        n += 1
    return n
