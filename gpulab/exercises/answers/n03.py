"""Reference answers to notebook 03's free-text exercises (the input pipeline: DataLoader workers against an
idle GPU). Exercise 7 is the graded one (`ex.solution()`)."""
from __future__ import annotations

import contextlib
import functools
import math
import multiprocessing
import os
import pickle
import sys
import warnings
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader

from gpulab.core.device import cpu_cores, pick_device
from gpulab.core.memory import memory_guard
from gpulab.core.monitor import GpuMonitor
from gpulab.core.timing import GPU_PACED_MIN, benchmark, pace
from gpulab.exercises.answers import Answer
from gpulab.lessons.l03_input_pipeline import (SyntheticImages, calibrate_passes, config, live_workers, loader_run,
                                               make_loader, make_step, quiet_fork, size_model, usable_workers,
                                               window_mean)
from gpulab.models.cnn import SmallCNN, conv_flops

SETTLE_S, MIN_WINDOW_S = 1.0, 2.5   # section 6's NVML window: leave out its first second, run it at least 2.5 s
TINY_STEPS, TINY_WARMUP = 6, 2      # tiny: fewer batches than the notebook's, so that each answer takes ~1 s on 2 cores
MONITOR_S = 0.05                    # section 6's GpuMonitor interval


def _gpu_full(found: dict) -> bool:
    return found["device"] == "cuda" and found["scale"] == "full"


def _as_in_the_notebook(run):
    """`run` as notebook 03 runs: on the CPU PyTorch gets one thread (the workers the other cores), and the
    warning about fork() in a threaded process is silenced (the workers never touch CUDA); restored after."""
    @functools.wraps(run)
    def wrapped(scale: str) -> dict:
        threads = torch.get_num_threads()
        if pick_device().type != "cuda":
            torch.set_num_threads(1)
        try:
            with quiet_fork(), memory_guard(quiet=True):
                return run(scale)
        finally:
            torch.set_num_threads(threads)
    return wrapped


def _predicted(compute_ms: float, data_ms: float, counts, on_gpu: bool) -> dict[int, float]:
    """Section 3's formula: step = max(compute, batch x sample / k); on the CPU, 0 workers adds the two halves."""
    return {k: compute_ms + data_ms if k == 0 and not on_gpu else max(compute_ms, data_ms / max(k, 1))
            for k in counts}


def _fewest_at_least_as_fast(ms: dict[int, float]) -> int:
    """The smallest worker count whose predicted step is the shortest (beyond it the formula is flat)."""
    low = min(ms.values())
    return min(k for k, v in ms.items() if v <= low * (1 + 1e-9))


def _fastest(results: dict) -> int:
    return min(results, key=lambda k: results[k][0].step_ms)


@dataclass
class _Lesson:
    """Sections 1-2 of the notebook at a scale: the calibrated CPU cost of a sample and this GPU's model width."""
    scale: str
    cfg: dict
    device: torch.device
    cores: int
    counts: list
    passes: int
    sample_ms: float
    width: int

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def batch(self) -> int:
        return self.cfg["batch"]

    @property
    def size(self) -> int:
        return self.cfg["size"]

    @property
    def steps(self) -> int:
        return self.cfg["steps"] if self.scale == "full" else TINY_STEPS

    @property
    def warmup(self) -> int:
        return self.cfg["warmup"] if self.scale == "full" else TINY_WARMUP

    def data_ms(self, sample_ms: float | None = None) -> float:
        return self.batch * (self.sample_ms if sample_ms is None else sample_ms)

    def model(self, width: int | None = None) -> SmallCNN:
        torch.manual_seed(0)
        return SmallCNN(width=width or self.width, blocks=self.cfg["blocks"], device=self.device)

    def compute(self, step, with_pace: bool = False):
        """Section 2: the step on a batch already on the device (benchmark); with `with_pace`, the GPU
        kernels' share of that step (None off a GPU)."""
        x = torch.randn(self.batch, 3, self.size, self.size, device=self.device)
        y = torch.randint(10, (self.batch,), device=self.device)
        ms = benchmark(lambda: step(x, y), budget_s=0.5 if self.scale == "full" else 0.05).median_ms
        kernels = pace(lambda: step(x, y), device=self.device) if with_pace else None
        del x, y
        return ms, kernels

    def window_steps(self, predicted_ms: float, min_window_s: float = MIN_WINDOW_S) -> int:
        """Section 6's `steps_for` (the busy % read): on a GPU, steps enough for min_window_s at the predicted step."""
        if not self.on_gpu:
            return self.steps
        return max(self.steps, math.ceil(min_window_s * 1e3 / predicted_ms))

    def run(self, step, k: int, *, passes: int | None = None, steps: int | None = None, monitor=None,
            settle_s: float = SETTLE_S, prefetch_factor: int = 2):
        """Section 6's `run_setting`: a fresh loader of k workers; its busy % after `settle_s` (None if not read)."""
        r = loader_run(step, k, batch=self.batch, size=self.size, passes=passes or self.passes,
                       steps=steps or self.steps, warmup=self.warmup, pin_memory=self.on_gpu,
                       prefetch_factor=prefetch_factor, device=self.device)
        busy = None
        if monitor is not None and monitor.available:
            t0 = monitor.started_at
            busy = window_mean(monitor.timeline(), r.start_s - t0 + settle_s, r.end_s - t0)
        return r, busy

    def sweep(self, step, compute_ms: float, *, passes: int | None = None, sample_ms: float | None = None,
              monitor=None, settle_s: float = SETTLE_S, min_window_s: float = MIN_WINDOW_S) -> dict:
        """Section 6's sweep over the worker counts this host has cores for."""
        pred = _predicted(compute_ms, self.data_ms(sample_ms), self.counts, self.on_gpu)
        return {k: self.run(step, k, passes=passes, steps=self.window_steps(pred[k], min_window_s),
                            monitor=monitor, settle_s=settle_s) for k in self.counts}


def _sample_ms(size: int, passes: int, scale: str) -> float:
    """Section 1: one sample's CPU time (pure CPU work, timed on the CPU)."""
    return benchmark(lambda: SyntheticImages(8, size=size, passes=passes)[7], device=torch.device("cpu"),
                     budget_s=0.2 if scale == "full" else 0.05).median_ms


def _lesson(scale: str) -> _Lesson:
    cfg = config(scale)
    device = pick_device()
    cores = cpu_cores()
    passes = calibrate_passes(cfg["size"], target_sample_ms=cfg["sample_ms"])
    sample_ms = _sample_ms(cfg["size"], passes, scale)
    width, _ = size_model(cfg, device, data_ms=cfg["batch"] * sample_ms)
    return _Lesson(scale, cfg, device, cores, usable_workers(cfg["workers"], cores), passes, sample_ms, width)


def _where(L: _Lesson) -> dict:
    return {"device": L.device.type, "scale": L.scale, "cores": L.cores, "worker counts swept": str(L.counts)}


# -- 1. doubling passes ------------------------------------------------------------------------------
@_as_in_the_notebook
def _double_passes(scale: str) -> dict:
    L = _lesson(scale)
    step = make_step(L.model())
    compute_ms, _ = L.compute(step)
    doubled = 2 * L.passes
    sample2 = _sample_ms(L.size, doubled, scale)
    pred1 = _predicted(compute_ms, L.data_ms(), L.counts, L.on_gpu)
    pred2 = _predicted(compute_ms, L.data_ms(sample2), L.counts, L.on_gpu)
    results = L.sweep(step, compute_ms, passes=doubled, sample_ms=sample2)
    del step
    best, predicted_best = _fastest(results), _fewest_at_least_as_fast(pred2)
    out = {**_where(L), "width": L.width, "passes": L.passes, "doubled passes": doubled,
           "sample ms": L.sample_ms, "sample ms, doubled passes": sample2,
           "sample cost, doubled / original": sample2 / L.sample_ms, "compute ms (benchmark)": compute_ms,
           "workers the formula asks for (batch x sample / compute), original": math.ceil(L.data_ms() / compute_ms),
           "workers the formula asks for, doubled": math.ceil(L.data_ms(sample2) / compute_ms),
           "predicted best (of those swept), original": _fewest_at_least_as_fast(pred1),
           "predicted best (of those swept), doubled": predicted_best}
    for k, (r, _) in results.items():
        out[f"{k} workers, doubled: predicted / measured ms/step"] = f"{pred2[k]:.1f} / {r.step_ms:.1f}"
    out["measured best, doubled"] = best
    out["measured ms at predicted best / at measured best"] = (results[predicted_best][0].step_ms
                                                               / results[best][0].step_ms)
    return out


def _double_passes_claim(f: dict) -> str | None:
    if f["workers the formula asks for, doubled"] < f["workers the formula asks for (batch x sample / compute), original"]:
        return "doubling the passes did not raise the workers the formula asks for"
    if f["predicted best (of those swept), doubled"] < f["predicted best (of those swept), original"]:
        return "the predicted best worker count went down with more CPU work per sample"
    if f["device"] == "cuda" and not 1.3 <= f["sample cost, doubled / original"] <= 2.2:
        return (f"doubling the passes multiplied a sample's CPU cost by {f['sample cost, doubled / original']:.2f}, "
                "not a little under 2")
    if _gpu_full(f) and f["measured ms at predicted best / at measured best"] > 1.15:
        return "the step at the predicted best worker count was more than 15 % slower than the measured best"
    return None


# -- 2. half the width -------------------------------------------------------------------------------
@_as_in_the_notebook
def _half_width(scale: str) -> dict:
    L = _lesson(scale)
    half = max(1, L.width // 2)
    models = {w: L.model(w) for w in (L.width, half)}
    steps = {w: make_step(m) for w, m in models.items()}
    flops = {w: conv_flops(m, L.batch, L.size) for w, m in models.items()}
    compute = {w: L.compute(steps[w])[0] for w in models}
    pred = {w: _predicted(compute[w], L.data_ms(), L.counts, L.on_gpu) for w in models}
    swept = (L.width, half) if scale == "full" else (half,)        # tiny: the half-width sweep only (time)
    results = {w: L.sweep(steps[w], compute[w]) for w in swept}
    del steps, models
    out = {**_where(L), "width": L.width, "half width": half, "data ms per batch (CPU)": L.data_ms(),
           "conv FLOPs, half / full width": flops[half] / flops[L.width]}
    for w in (L.width, half):
        out[f"compute ms, width {w}"] = compute[w]
        out[f"workers the formula asks for, width {w}"] = math.ceil(L.data_ms() / compute[w])
        out[f"predicted best, width {w}"] = _fewest_at_least_as_fast(pred[w])
        if w in results:
            r = results[w]
            best = _fastest(r)
            out[f"measured ms/step by workers, width {w}"] = ", ".join(f"{k}: {v[0].step_ms:.1f}" for k, v in r.items())
            out[f"measured best, width {w}"] = best
            out[f"0 workers / best, width {w}"] = r[0][0].step_ms / r[best][0].step_ms
            out[f"wait for data, share of the 0-worker step, width {w}"] = max(0.0, 1 - compute[w] / r[0][0].step_ms)
        else:
            out[f"measured best, width {w}"] = "not swept at the tiny size"
    return out


def _half_width_claim(f: dict) -> str | None:
    w, h = f["width"], f["half width"]
    if not f["conv FLOPs, half / full width"] < 0.3:
        return "halving the width did not cut the convolutions' FLOPs to about a quarter"
    if f["device"] != "cuda":
        return None      # the CPU's step is mostly per-operator overhead at this size: no speed claim
    if not f[f"compute ms, width {h}"] < f[f"compute ms, width {w}"]:
        return "the half-width step was not faster on the GPU"
    if f[f"predicted best, width {h}"] < f[f"predicted best, width {w}"]:
        return "the formula's best worker count went down with a faster step"
    if _gpu_full(f):
        if f[f"measured best, width {h}"] < f[f"measured best, width {w}"]:
            return "the measured best worker count went down with the faster model"
        if f[f"wait for data, share of the 0-worker step, width {h}"] <= f[f"wait for data, share of the 0-worker step, width {w}"]:
            return "with 0 workers the faster model's GPU did not wait a larger share of the step"
        if f[f"0 workers / best, width {h}"] < 0.95 * f[f"0 workers / best, width {w}"]:
            return "the workers' gain over 0 workers shrank with the faster model"
    return None


# -- 3. more workers than cores --------------------------------------------------------------------
def _torch_suggested_workers() -> int | None:
    """The largest worker count DataLoader does not warn about: the CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


@_as_in_the_notebook
def _oversubscribed(scale: str) -> dict:
    L = _lesson(scale)
    step = make_step(L.model())
    compute_ms, _ = L.compute(step)
    before = live_workers()
    out = {**_where(L), "compute ms (benchmark)": compute_ms, "data ms per batch (CPU)": L.data_ms(),
           # what the cores can feed: on a GPU they make the batches; on the CPU they also run the step
           "cores' limit ms/step": max(compute_ms, (L.data_ms() + (0 if L.on_gpu else compute_ms)) / L.cores),
           "DataLoader's suggested max workers": _torch_suggested_workers()}
    with GpuMonitor(interval_s=MONITOR_S, pcie=False) as mon:       # the panel's pipeline_experiment
        for k in (L.cores, 2 * L.cores):
            predicted = _predicted(compute_ms, L.data_ms(), [k], L.on_gpu)[k]
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                warnings.filterwarnings("ignore", message=r"This process .*is multi-threaded, use of fork",
                                        category=DeprecationWarning)
                r, busy = L.run(step, k, steps=L.window_steps(predicted), monitor=mon)
            out[f"{k} workers: ms/step"] = r.step_ms
            out[f"{k} workers: timed steps / batches made ahead at most (k x prefetch 2)"] = f"{r.steps} / {2 * k}"
            out[f"{k} workers: GPU busy %"] = busy if busy is not None else "not read (" + mon.status + ")"
            out[f"{k} workers: DataLoader warned about too many workers"] = any(
                "suggested max number of worker" in str(w.message) for w in caught)
    del step
    out["2x cores / cores, ms/step"] = out[f"{2 * L.cores} workers: ms/step"] / out[f"{L.cores} workers: ms/step"]
    out["worker processes alive before / after"] = f"{before} / {live_workers()}"
    return out


def _oversubscribed_claim(f: dict) -> str | None:
    cores, suggested = f["cores"], f["DataLoader's suggested max workers"]
    for k in (cores, 2 * cores):
        should = suggested is None or k > suggested
        if f[f"{k} workers: DataLoader warned about too many workers"] != should:
            return (f"DataLoader {'did not warn' if should else 'warned'} about {k} workers with "
                    f"{suggested} CPUs suggested")
    before, after = (int(v) for v in f["worker processes alive before / after"].split(" / "))
    if after > before:
        return "worker processes were left alive after the loaders were read to the end"
    if _gpu_full(f):
        if f["2x cores / cores, ms/step"] < 0.9:
            return "twice as many workers as cores made the step more than 10 % faster"
        if f[f"{2 * cores} workers: ms/step"] < 0.85 * f["cores' limit ms/step"]:
            return "the step with 2x cores workers beat what the cores can make and the GPU can compute"
    return None


# -- 4. a notebook-defined Dataset under spawn --------------------------------------------------------
COPY = "SyntheticImagesCopy"


@contextlib.contextmanager
def _class_in_main():
    """A class whose home is `__main__`, as one defined in a notebook cell is (SyntheticImages' methods, by
    inheritance: pickle names a class by module and name only, whatever its bases); removed after."""
    main = sys.modules["__main__"]
    missing = object()
    old = getattr(main, COPY, missing)
    cls = type(COPY, (SyntheticImages,), {"__module__": "__main__", "__qualname__": COPY})
    setattr(main, COPY, cls)
    try:
        yield main, cls
    finally:
        if old is missing:
            with contextlib.suppress(AttributeError):
                delattr(main, COPY)
        else:
            setattr(main, COPY, old)


def _spawn_would_rerun_a_script() -> bool:
    """Whether a spawned child would re-run this process's main script (a plain `python script.py` without a
    `__main__` guard would run again in every worker); a notebook's kernel, `python -c` and `-m pkg` do not."""
    main = sys.modules["__main__"]
    spec = getattr(main, "__spec__", None)
    if spec is not None:
        # a module run with -m is re-imported by name, guarded code not run; a package's __main__ is not re-imported
        return not (spec.name in ("__main__", "ipykernel_launcher") or spec.name.endswith(".__main__"))
    return getattr(main, "__file__", None) is not None


@_as_in_the_notebook
def _spawn(scale: str) -> dict:
    size, batch, n = 16, 8, 32
    out: dict = {"device": pick_device().type, "scale": scale, "start methods here": str(multiprocessing.get_all_start_methods())}
    with _class_in_main() as (main, cls):
        data = pickle.dumps(cls(n, size=size, passes=1))       # what spawn sends each worker, with its loop
        out["pickle names the class as"] = f"{cls.__module__}.{cls.__qualname__}"
        out["pickle holds it by reference (module and name, no code)"] = (b"__main__" in data and COPY.encode() in data
                                                                         and b"__getitem__" not in data)
        # a spawned process that does the first thing a spawned worker does: unpickle what the parent sent
        child = multiprocessing.get_context("spawn").Process(target=pickle.loads, args=(data,))
        child.start()
        child.join(timeout=60)
        out["spawned process unpickling it: exit code"] = child.exitcode
        delattr(main, COPY)                                    # here too, without the class in __main__
        try:
            pickle.loads(data)
            out["unpickled without the class in __main__"] = "no error"
        except AttributeError as err:
            out["unpickled without the class in __main__"] = f"AttributeError: {err}"
        finally:
            setattr(main, COPY, cls)
        ref = [b for b in make_loader(SyntheticImages(n, size=size, passes=1), batch)]
        if "fork" in multiprocessing.get_all_start_methods():
            forked = list(DataLoader(cls(n, size=size, passes=1), batch_size=batch, num_workers=2,
                                     multiprocessing_context="fork"))
            out["fork, 2 workers: same batches as the lesson's class"] = len(forked) == len(ref) and all(
                torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(forked, ref))
        if scale == "full":           # the exercise's loader itself: each spawned worker imports torch (seconds)
            if _spawn_would_rerun_a_script():
                out["DataLoader with spawn"] = "not run: spawned workers would re-run this process's main script"
            else:
                try:
                    list(DataLoader(cls(n, size=size, passes=1), batch_size=batch, num_workers=2,
                                    multiprocessing_context="spawn"))
                    out["DataLoader with spawn"] = "no error"
                except RuntimeError as err:
                    out["DataLoader with spawn"] = f"RuntimeError: {' '.join(str(err).split())}"
    out["lesson's class round-trips through pickle"] = isinstance(
        pickle.loads(pickle.dumps(SyntheticImages(n, size=size, passes=1))), SyntheticImages)
    out["lesson's class is pickled as"] = f"{SyntheticImages.__module__}.{SyntheticImages.__qualname__}"
    return out


def _spawn_claim(f: dict) -> str | None:
    if not f["pickle holds it by reference (module and name, no code)"]:
        return "the pickle did not name the class by module and name only"
    if f["spawned process unpickling it: exit code"] in (0, None):
        return "a spawned process unpickled the notebook's class without dying"
    if "Can't get attribute" not in f["unpickled without the class in __main__"]:
        return "unpickling without the class in __main__ did not fail with 'Can't get attribute'"
    if f.get("fork, 2 workers: same batches as the lesson's class") is False:
        return "fork did not serve the notebook's class the lesson's batches"
    spawned = f.get("DataLoader with spawn", "not run")
    if not spawned.startswith("not run") and "exited unexpectedly" not in spawned:
        return f"the spawned DataLoader did not fail as its workers died: {spawned}"
    if not f["lesson's class round-trips through pickle"]:
        return "the lesson's importable class did not round-trip through pickle"
    return None


# -- 5. busy below 100 % ----------------------------------------------------------------------------
@_as_in_the_notebook
def _below_100(scale: str) -> dict:
    L = _lesson(scale)
    step = make_step(L.model())
    compute_ms, kernels = L.compute(step, with_pace=True)
    with GpuMonitor(interval_s=MONITOR_S, pcie=False) as mon:
        results = L.sweep(step, compute_ms, monitor=mon)
    del step
    best = _fastest(results)
    r, busy = results[best]
    share = compute_ms / r.step_ms
    wait = max(0.0, 1 - share)
    kernel_share = None if kernels is None else kernels.share
    if wait > 0.2:
        verdict = ("the loader: the step waits for data. More workers where cores are free, else cheaper decode and "
                   "augmentations, or the augmentations on the GPU" + (f" (best = {best}, the most swept)"
                                                                      if best == max(L.counts) else ""))
    elif kernel_share is not None and kernel_share < GPU_PACED_MIN:
        verdict = ("the model's step: the GPU waits on the host between kernels (launches); larger batch, CUDA graphs "
                   "(notebook 11) or torch.compile (notebook 12)")
    else:
        verdict = "neither half: what is left is NVML's sampling"
    return {**_where(L), "best workers": best, "ms/step at best": r.step_ms, "compute ms (benchmark)": compute_ms,
            "timed steps at best": r.steps,
            "timed steps asked": L.window_steps(_predicted(compute_ms, L.data_ms(), [best], L.on_gpu)[best]),
            "host ms in next() at best": r.host_wait_ms,
            "100 x compute / step (section 3's busy %)": 100 * share,
            "kernels' share of the compute step (pace)": "no kernel profile off a GPU" if kernel_share is None else kernel_share,
            "100 x kernel time / step": "-" if kernels is None else 100 * kernels.busy_ms / r.step_ms,
            "NVML busy % at best": busy if busy is not None else f"not read ({mon.status})",
            "wait for data, share of the step": wait, "change next": verdict}


def _below_100_claim(f: dict) -> str | None:
    if f["timed steps at best"] != f["timed steps asked"]:
        return "the best setting did not run the timed steps it was asked for"
    if f["device"] != "cuda":
        if not isinstance(f["NVML busy % at best"], str):
            return "a GPU busy % was read without a GPU"
        return None
    busy = f["NVML busy % at best"]
    if _gpu_full(f) and not isinstance(busy, str) and busy > f["100 x compute / step (section 3's busy %)"] + 15:
        return "NVML read the GPU busier than the compute share of the step allows (by more than 15 points)"
    return None


# -- 6. no settle, no minimum window -----------------------------------------------------------------
@_as_in_the_notebook
def _no_window(scale: str) -> dict:
    L = _lesson(scale)
    step = make_step(L.model())
    compute_ms, _ = L.compute(step)
    with GpuMonitor(interval_s=MONITOR_S, pcie=False) as mon:
        quick = L.sweep(step, compute_ms, monitor=mon, settle_s=0.0, min_window_s=0.0)
        fastest = _fastest(quick)
        predicted = _predicted(compute_ms, L.data_ms(), [fastest], L.on_gpu)[fastest]
        windowed = L.run(step, fastest, steps=L.window_steps(predicted), monitor=mon, settle_s=SETTLE_S)
    del step
    (rq, bq), (rw, bw) = quick[fastest], windowed
    out = {**_where(L), "fastest workers": fastest, "compute ms (benchmark)": compute_ms, "monitor": mon.status}
    for name, r, busy, settle in (("settle 0, window 0", rq, bq, 0.0), (f"settle {SETTLE_S:g}, window {MIN_WINDOW_S:g}", rw, bw, SETTLE_S)):
        out[f"{name}: timed steps"] = r.steps
        out[f"{name}: seconds averaged"] = max(0.0, r.end_s - r.start_s - settle)
        out[f"{name}: 100 x compute / step"] = 100 * compute_ms / r.step_ms
        out[f"{name}: NVML busy %"] = busy if busy is not None else "not read"
    if bq is not None and bw is not None:
        out["busy % points lower without the window"] = bw - bq
    return out


def _no_window_claim(f: dict) -> str | None:
    lower = f.get("busy % points lower without the window")
    if lower is None:
        return None                  # NVML has no utilization here (a MIG slice): nothing to compare
    if _gpu_full(f) and lower <= 0:
        return "without the settle time and the minimum window the fastest setting did not read lower"
    return None


ANSWERS = [
    Answer("03", 1, run=_double_passes, expect=_double_passes_claim, text=(
        "Set `passes = 2 * passes` after section 1, re-time a sample, keep section 2's model (re-running "
        "`size_model` could widen a narrowed model, changing two things at once), and run sections 3 and 6. "
        "A sample costs a fixed part (drawing the image) plus a part per augment pass, so its CPU time a little "
        "less than doubles. Section 3's formula is flat at compute beyond k* = ceil(batch x sample / compute), "
        "so the best worker count is the smallest swept count at or above k*: k* about doubles. On a GPU the "
        "step is sized to 1/8 of a batch's CPU time or less, so where `size_model` reached that k* was 8 or "
        "more; doubled it is 16 or more, above the config's largest count (12), so the predicted best is the "
        "largest count this host has cores for and the "
        "step stays data-bound at batch x sample / k instead of falling to compute. The run measures the sweep "
        "at doubled passes beside the prediction; on the CPU the 'GPU' shares the two cores with the workers, "
        "so only the mechanics show.")),
    Answer("03", 2, run=_half_width, expect=_half_width_claim, text=(
        "Build the model with `width // 2` in section 2 and keep the data as it is. A 3x3 convolution's FLOPs "
        "grow with input x output channels, so they fall to about a quarter (the first, 3-channel layer only "
        "halves; `conv_flops` counts it), and on a GPU the step gets faster, by less where launches rather "
        "than arithmetic bound it. The CPU's batch x sample is unchanged, so k* = ceil(batch x sample / "
        "compute) goes up: the best worker count rises, or stays pinned at the most this host has cores for. "
        "A faster GPU makes the pipeline more important because it shrinks only the compute half: with too few "
        "workers the step stays at batch x sample / k whatever the GPU, the GPU idles a larger share of it, and "
        "the GPU's speed-up shows only if the host keeps up. The run predicts both widths and sweeps the half "
        "width (both at full size, where it checks the GPU's wait share and the workers' gain grow).")),
    Answer("03", 3, run=_oversubscribed, expect=_oversubscribed_claim, text=(
        "Call `pipeline_experiment(num_workers=2 * cores)` (the run uses the same loader and window, beside "
        "`cores` workers). DataLoader warns at once that it will create more workers than its suggested "
        "maximum, the CPUs in this process's affinity. On a GPU host the step gets no faster, and often a "
        "little slower: CPU-bound workers cannot make more than cores / (batch x sample) batches per second "
        "however many there are; twice as many processes take turns on the cores, each batch takes about "
        "twice as long, and the main process, which receives and pins each batch and launches the step's "
        "kernels, competes with them for CPU time; each worker also costs a process's memory and start-up. "
        "Two things can make it read faster: a short run, where the longer untimed warm-up of more workers "
        "made more batches ahead (the run prints the timed steps beside k x prefetch_factor), and, on the "
        "CPU, the step itself sharing the cores, where spare workers fill the moments a worker sleeps with "
        "its prefetch slots full; either way the step cannot beat the cores' limit the run prints. Workers "
        "beyond the cores pay only when they wait rather than compute (files read over a network), which "
        "this dataset never does.")),
    Answer("03", 4, run=_spawn, expect=_spawn_claim, text=(
        "A class defined in a cell has `__module__ == '__main__'`. Under spawn each worker is a fresh "
        "interpreter: the parent pickles the dataset for it, and pickle stores a class by reference (module "
        "and name, `__main__.MyImages`), never its code. The worker's `__main__` is not the notebook's (the "
        "kernel's namespace has no file to re-run), so unpickling fails with `AttributeError: Can't get "
        "attribute 'MyImages' on <module '__main__' (built-in)>` on the workers' stderr, and the main process "
        "then raises `RuntimeError: DataLoader worker (pid(s) ...) exited unexpectedly`. Under fork nothing is "
        "pickled (the worker is a copy of the parent, class included), which is why it works there; "
        "forkserver, Linux's default from Python 3.14, fails like spawn. The fix is the lesson's: put the class "
        "in a .py module the workers can import. The run pickles such a class, unpickles it in a spawned process "
        "and where `__main__` lacks it, loads it with fork, and at full size runs the spawned DataLoader itself.")),
    Answer("03", 5, run=_below_100, expect=_below_100_claim, text=(
        "Set three numbers side by side at the best setting: NVML's busy %, 100 x compute / step (section 3's "
        "prediction; compute is the step on a batch already on the GPU), and the kernels' share of that "
        "compute step (`gpulab.core.timing.pace`). If the step is well above compute, the GPU waits for data "
        "and busy % follows compute / step: change the loader, more workers while cores are free, else "
        "cheaper decoding and augmentation or the augmentations on the GPU, which has idle time to spend. If "
        "the step is close to compute but the kernels fill only part of it, the GPU waits on the host between "
        "the small CNN's many short kernels: change the model's step (larger batch, CUDA graphs in notebook "
        "11, torch.compile in 12), not the loader. NVML reports the share of its last sample period (1/6 s to "
        "1 s by NVIDIA's NVML documentation) in which any kernel ran, so a few points either side of the "
        "prediction is sampling, not a cause. The run makes that decision on this machine's numbers; the CPU "
        "has no NVML and no kernel profile, only the compute / step split.")),
    Answer("03", 6, run=_no_window, expect=_no_window_claim, needs="cuda", text=(
        "With `settle_s = 0` and `min_window_s = 0` each setting runs only the config's steps, a fraction of a "
        "second at the fastest one, and its busy % averages every sample from the first timed step. NVML's "
        "utilization is the share of its last sample period (1/6 s to 1 s depending on the GPU, per NVIDIA's "
        "NVML documentation) in which a kernel ran, and it is updated once a period, so the first readings in "
        "the window still describe the time just before it: the workers' start-up and the warm-up steps, with "
        "the GPU mostly idle. In a window not much longer than one period that stale part is a large share of "
        "the mean, so the fastest setting reads lower than compute / step, by roughly its busy % times NVML's "
        "lag (half a period to a period) over the window's length. The slow settings barely change: their "
        "windows are long and the GPU was about as idle before them as in them. The run sweeps without the window, reruns the fastest setting with it, and "
        "prints both readings and the seconds each averaged; it needs a GPU, since the CPU has no NVML.")),
]
