"""An input pipeline that makes the CPU work for every sample. Notebook 03.

`SyntheticImages` builds each image from its index (the "decode") and runs a few
augment passes over it with numpy, so a sample costs the CPU a few milliseconds,
tunable with `passes`. It lives in this importable module, not in a notebook,
because DataLoader workers started by *spawn* (or forkserver) re-import the
dataset's class by name: a class defined in a notebook's `__main__` cannot be found there.

`batches_match` checks that workers serve the same batches; `loader_run` (`train_from_loader` over
fresh batches) is the measurement. `train_from_loader` runs a training loop over a DataLoader and
splits the step time:
the loop's wall time per step (host clock, device synchronized at the end) minus the
compute time of one step on a batch already on the device (`gpulab.core.timing.benchmark`)
is the time the GPU waited for data.

`CONFIG` / `config(scale)` hold the lesson's sizes (image size, batch, CPU cost per sample, model,
worker counts, steps), written once for the notebook and `gpulab bench`; `headline(scale)` is the
worker sweep both judge: the step time with 0 workers against the best worker count.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import warnings
from dataclasses import dataclass, field
from typing import Callable
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from gpulab.core.device import cpu_cores, physical_cores, pick_device, resolve_scale
from gpulab.core.measured import Measured
from gpulab.core.predict import Plan
from gpulab.core.timing import benchmark, stopwatch
from gpulab.models.cnn import SmallCNN
from gpulab.models.precision import classification_loss
from gpulab.models.step import train_step


# -- knobs ------------------------------------------------------------------------------------------
TITLE = "input pipeline"
HEADLINE = "step time, 0 workers / best worker count"      # the metric bands.toml judges
CONFIG = {
    "tiny": dict(
        size=32,                        # pixels per side of each image
        batch=16,                       # images per batch
        sample_ms=0.9,                  # CPU time per sample that calibrate_passes aims at
        width=8, blocks=2,              # SmallCNN's channels and conv blocks
        workers=(0, 1, 2),              # DataLoader worker counts swept (those above the core count are dropped)
        check_workers=2,                # workers whose batches are compared with the main process's
        steps=12, warmup=3,             # timed steps per setting, after untimed warm-up steps
    ),
    # stall: at full size on a GPU, `size_model` narrows the CNN until a step takes at most 1/stall of the
    # CPU time of a batch, so that with 0 workers the GPU waits most of each step on any GPU (a T4 as an H200)
    "full": dict(size=96, batch=64, sample_ms=1.5, width=64, blocks=4, workers=(0, 2, 4, 8, 12), check_workers=2,
                 steps=40, warmup=3, stall=8, min_width=8),
}

# seconds of notebook 03 that no GPU changes: the CPU makes every batch (the lesson is an input stall)
# Section 7 now runs each of its 4 settings 3 times (issue 40: a gap is judged against the runs' spread), 9 loader
# runs more than the 3 of the timed run: each 3 + 40 steps at the best worker count (10-14 ms a step on the H200
# runs), plus the workers' start and first batches, about 0.9 s; an estimate until a full run is timed.
SECTION7_EXTRA_S = 9 * 0.9
HOST_S = 43.1 + SECTION7_EXTRA_S
HOST_SOURCE = ("wall time of notebook 03 in results/course/2026-11-30-h200-00-to-09-at-775ae4a/h200-2026-11-30-course-timings.tsv (H200, torch 2.11, "
               "2026-11-30); its GPU steps are sized to under 1/8 of the CPU's batch time, inside it; plus an estimate "
               "of the 9 loader runs section 7 added since (3 runs of each setting)")


def config(scale: str | None = None) -> dict:
    """This lesson's knobs at a scale ('tiny' or 'full'; default: the course's, `GPULAB_SCALE`)."""
    return dict(CONFIG[resolve_scale(scale)])


def plan(scale: str | None = None) -> Plan:
    """What notebook 03 asks of the GPU (gpulab.core.predict): nothing that adds to its time. Each step is
    sized (`size_model`) to a fraction of the CPU's time per batch, and runs while the CPU makes the next."""
    return Plan(host_s=HOST_S, work=(), host_source=HOST_SOURCE)


def size_model(cfg: dict, device: torch.device, data_ms: float, tries: int = 4) -> tuple[int, float | None]:
    """SmallCNN's width for this GPU: `cfg["width"]`, narrowed (a multiple of 8, at least `min_width`)
    until one training step on a batch already on the device takes at most `data_ms / cfg["stall"]`,
    the CPU time of a batch over the stall wanted. A quick calibration: each try times a few steps
    (`benchmark`); the next width follows from the step's FLOPs growing about as width squared.
    Returns (width, ms of a step at that width); the config's width and None on the CPU or without
    a "stall" (tiny scale), where nothing is resized."""
    width = cfg["width"]
    if device.type != "cuda" or "stall" not in cfg:
        return width, None
    target = data_ms / cfg["stall"]
    batch, size = cfg["batch"], cfg["size"]
    for _ in range(tries):
        torch.manual_seed(0)
        step = make_step(SmallCNN(width=width, blocks=cfg["blocks"], device=device))
        x = torch.randn(batch, 3, size, size, device=device)
        y = torch.randint(10, (batch,), device=device)
        ms = benchmark(lambda: step(x, y), budget_s=0.2).median_ms
        del step, x, y
        timed = width                 # the width `ms` belongs to: the last try's next width is never timed
        if ms <= target or width <= cfg["min_width"]:
            break
        narrower = int(width * (target / ms) ** 0.5) // 8 * 8
        width = max(cfg["min_width"], min(narrower, width - 8))
    return timed, ms


def usable_workers(counts, cores: int | None = None) -> list[int]:
    """The worker counts of `counts` this machine has cores for (`cpu_cores()` by default: its affinity, a
    profile's host)."""
    cores = cores or cpu_cores()
    return [k for k in counts if k <= cores]


class SyntheticImages(Dataset):
    """`length` images of 3 x `size` x `size` float32 pixels and an integer label each.

    Sample i is a pure function of (seed, i): the same index gives the same image in
    any process, with any number of workers. Each of the `passes` augment passes
    blurs (a 3x3 box filter built from shifted copies), maybe flips, jitters brightness
    and contrast, and squashes with tanh: about a dozen full-image numpy operations,
    single-threaded, as decoding and augmenting a JPEG would be.
    """

    def __init__(self, length: int, size: int = 64, passes: int = 4, classes: int = 10, seed: int = 0):
        if length < 1 or size < 4 or passes < 0 or classes < 1:
            raise ValueError(f"need length >= 1, size >= 4, passes >= 0, classes >= 1 "
                             f"(got {length}, {size}, {passes}, {classes})")
        self.length, self.size, self.passes, self.classes, self.seed = length, size, passes, classes, seed

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if not 0 <= i < self.length:
            raise IndexError(f"index {i} out of range for {self.length} samples")
        rng = np.random.default_rng((self.seed, i))
        label = int(rng.integers(self.classes))
        img = rng.standard_normal((3, self.size, self.size), dtype=np.float32)   # "decode"
        img += np.float32(label / self.classes)                                  # a learnable hint
        for _ in range(self.passes):                                             # "augment"
            img = (img + np.roll(img, 1, axis=1) + np.roll(img, -1, axis=1)) / np.float32(3)
            img = (img + np.roll(img, 1, axis=2) + np.roll(img, -1, axis=2)) / np.float32(3)
            if rng.random() < 0.5:
                img = img[:, :, ::-1]
            img = np.tanh(img * np.float32(rng.uniform(0.8, 1.2)) + np.float32(rng.uniform(-0.1, 0.1)))
        return torch.from_numpy(np.ascontiguousarray(img, dtype=np.float32)), label


def make_loader(dataset: Dataset, batch_size: int, num_workers: int = 0, pin_memory: bool = False,
                prefetch_factor: int | None = None) -> DataLoader:
    """A DataLoader over `dataset` in order (no shuffle), without persistent workers.

    `prefetch_factor` (batches each worker prepares ahead) only exists with workers:
    with `num_workers=0` it is ignored (PyTorch refuses it there). `pin_memory=True`
    needs a CUDA GPU; it is refused on the CPU instead of letting PyTorch warn.
    """
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0 (got {num_workers})")
    if prefetch_factor is not None and prefetch_factor < 1:
        raise ValueError(f"prefetch_factor must be >= 1 (got {prefetch_factor})")
    if pin_memory and not torch.cuda.is_available():
        raise ValueError("pin_memory=True needs a CUDA GPU: pinned (page-locked) memory is for "
                         "copies to a GPU, and this machine has none.")
    return DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers,
                      pin_memory=pin_memory, persistent_workers=False,
                      prefetch_factor=prefetch_factor if num_workers > 0 else None)


@contextlib.contextmanager
def quiet_fork():
    """Starting DataLoader workers without Python 3.12+'s warning about fork() in a process with threads
    (CUDA's): the workers never touch CUDA, which is what makes fork safe here (as notebook 03 explains)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"This process .*is multi-threaded, use of fork",
                                category=DeprecationWarning)
        yield


def live_workers() -> int:
    """How many child processes (DataLoader workers) of this process are alive now."""
    return len(multiprocessing.active_children())


def make_step(model: torch.nn.Module, lr: float = 0.01) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """One SGD training step of `model` on a batch already on its device: forward, loss, backward, update."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return train_step(model, x, y, loss=classification_loss, optimizer=opt)

    return step


@dataclass
class LoopResult:
    """What `train_from_loader` measured over its timed steps (milliseconds per step)."""

    num_workers: int
    pin_memory: bool
    prefetch_factor: int | None
    steps: int
    batch_size: int
    step_ms: float                 # wall time per step: host clock over the timed steps
    host_wait_ms: float            # mean host time inside next(loader) and the copy to the device
    start_s: float                 # perf_counter at the first timed step
    end_s: float                   # perf_counter after the last one (device synchronized)
    losses: list[float] = field(default_factory=list, repr=False)
    waits_ms: list[float] = field(default_factory=list, repr=False)   # each timed step's host_wait

    @property
    def images_per_s(self) -> float:
        return self.batch_size / (self.step_ms / 1e3)

    @property
    def wait_share(self) -> float:
        """The share of the timed loop the host spent getting batches (next() and the copy): near 0 where
        the batches were ready before the loop asked, large where it waited for the workers."""
        return sum(self.waits_ms) / (self.step_ms * self.steps) if self.waits_ms and self.step_ms > 0 else 0.0


def train_from_loader(loader: DataLoader, step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                      warmup: int = 2, device: torch.device | None = None) -> LoopResult:
    """Run `step` over every batch of `loader`; time all but the first `warmup` batches.

    The first batches wait for the workers to start, so they are not timed. The clock
    starts after the device has finished the warm-up steps and stops after it has finished
    the last step. `host_wait_ms` is the host's time in `next()` plus the copy to the
    device (non_blocking when the batch is pinned): while the host waits there, the GPU
    may still be running the previous step, so it is not the GPU's idle time; that is
    `step_ms` minus the compute time of a step (see notebook 03). The loader is run to
    its end, so its workers exit when this returns.
    """
    device = device or pick_device()
    n_batches = len(loader)
    if n_batches <= warmup:
        raise ValueError(f"the loader has {n_batches} batches; need more than warmup={warmup}")
    waits, losses = [], []
    it = iter(loader)

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        x, y = next(it)
        return (x.to(device, non_blocking=loader.pin_memory),
                y.to(device, non_blocking=loader.pin_memory))

    for _ in range(warmup):
        losses.append(step(*next_batch()))
    with stopwatch(device=device) as loop:          # device synchronized at both ends
        for _ in range(n_batches - warmup):
            with stopwatch(sync=False, device=device) as wait:   # host time only
                x, y = next_batch()
            waits.append(wait.ms)
            losses.append(step(x, y))
    for _ in it:        # nothing left: this ends the iterator, which shuts its workers down
        pass
    del it
    timed = n_batches - warmup
    return LoopResult(num_workers=loader.num_workers, pin_memory=loader.pin_memory,
                      prefetch_factor=loader.prefetch_factor if loader.num_workers else None,
                      steps=timed, batch_size=loader.batch_size, step_ms=loop.ms / timed,
                      host_wait_ms=sum(waits) / len(waits), start_s=loop.start_s, end_s=loop.end_s,
                      losses=[float(v) for v in losses], waits_ms=waits)


def batches_match(dataset: Dataset, batch_size: int, num_workers: int) -> tuple[bool, int]:
    """Correct before fast: whether a loader with `num_workers` worker processes serves exactly the
    batches (images and labels, in order) that the main process alone serves; and how many batches."""
    reference = list(make_loader(dataset, batch_size, num_workers=0))
    with_workers = list(make_loader(dataset, batch_size, num_workers=num_workers))
    same = len(reference) == len(with_workers) and all(
        torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(reference, with_workers))
    return same, len(reference)


def loader_run(step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], num_workers: int, *, batch: int,
               size: int, passes: int, steps: int, warmup: int = 3, pin_memory: bool = False,
               prefetch_factor: int = 2, device: torch.device | None = None, seed: int = 1) -> LoopResult:
    """`train_from_loader` over `warmup + steps` fresh batches of `SyntheticImages(size, passes)` served
    by `num_workers` workers: notebook 03's measurement (and `gpulab bench`'s)."""
    ds = SyntheticImages(length=(warmup + steps) * batch, size=size, passes=passes, seed=seed)
    loader = make_loader(ds, batch, num_workers=num_workers, pin_memory=pin_memory, prefetch_factor=prefetch_factor)
    return train_from_loader(loader, step, warmup=warmup, device=device)


def window_mean(timeline: dict, t_from: float, t_to: float, metric: str = "busy_pct") -> float | None:
    """Mean of one GpuMonitor metric over samples with t_from <= t_s <= t_to, or None if there are none."""
    values = [v for t, v in zip(timeline.get("t_s", []), timeline.get(metric, []))
              if v is not None and t_from <= t <= t_to]
    return sum(values) / len(values) if values else None


def calibrate_passes(size: int, target_sample_ms: float, probe_passes: int = 8, max_passes: int = 200) -> int:
    """The number of augment passes that makes one sample cost about `target_sample_ms` of CPU here.

    Times a sample with 0 and with `probe_passes` passes (`gpulab.core.timing.benchmark` on the CPU)
    and assumes the cost grows linearly with the passes. Hosts differ several-fold in CPU speed,
    so the lesson asks for a CPU cost, not a pass count.
    """
    if target_sample_ms <= 0 or probe_passes < 1:
        raise ValueError(f"need target_sample_ms > 0 and probe_passes >= 1 (got {target_sample_ms}, {probe_passes})")
    cpu = torch.device("cpu")
    base = benchmark(lambda: SyntheticImages(8, size=size, passes=0)[1], device=cpu, budget_s=0.1).median_ms
    probe = benchmark(lambda: SyntheticImages(8, size=size, passes=probe_passes)[1], device=cpu, budget_s=0.2).median_ms
    per_pass = max((probe - base) / probe_passes, 1e-6)
    return int(min(max_passes, max(1, round((target_sample_ms - base) / per_pass))))


# The share of the ideal speed-up the workers are held to where the host is small: a quarter is left for the
# main process's own work (launching, pinning) and each batch's trip between processes. A judgement.
WORKER_FLOOR_SHARE = 0.75


def worker_speedup_floor(counts, cores: int | None = None, stall: int | None = None) -> tuple[float, str]:
    """(the least speed-up of the best worker count over 0 workers this host should show, why). With 0
    workers one core makes a batch in batch x sample while the GPU waits; with k workers k batches are
    made at once, on at most `cores` cores, and the step cannot be faster than the GPU's (sized to 1/stall
    of a batch's CPU time): ideal min(k, cores, stall), held to WORKER_FLOOR_SHARE of it. `cores`: this
    host's physical cores by default (`physical_cores`: two hyperthreads of one core make a batch little
    faster than one thread)."""
    cores = cores or physical_cores()
    k = max([c for c in counts if c > 0], default=0)
    ideal = min(k, cores, stall or k) if k else 1
    return WORKER_FLOOR_SHARE * ideal, (f"{cores} physical CPU core(s), at most {k} worker(s) here: ideal "
                                        f"min(workers, cores{', stall' if stall else ''}) = {ideal}, "
                                        f"held to {WORKER_FLOOR_SHARE:.0%} of it")


# Section 3's prediction of NVML's busy %: compute / step, so the best setting's busy % over 0 workers' is predicted to
# be the two settings' step-time ratio, measured in the same runs. NVML's busy % is a coarse share of its sample
# windows: on the H200 the busy ratio was 0.57-1.05 of the step ratio over ten full-size runs (results/course/
# 2026-11-29-* to 2026-12-03-*, step_ms_0_workers and step_ms_12_workers with their gpu_busy_pct; the lowest in the
# runs before section 6's settled windows). The notebook's check holds it to BUSY_PREDICTION_SHARE of the prediction.
BUSY_PREDICTION_SHARE = 0.5


def busy_ratio_floor(step_0_ms: float, step_best_ms: float) -> tuple[float, str]:
    """(the least GPU-busy ratio, best setting over 0 workers, that notebook 03 accepts, why): BUSY_PREDICTION_SHARE of
    section 3's prediction, busy = compute / step, for the two settings' measured steps (their ratio)."""
    predicted = step_0_ms / step_best_ms
    return BUSY_PREDICTION_SHARE * predicted, (f"{BUSY_PREDICTION_SHARE:g} of section 3's prediction, busy = compute / "
                                               f"step: {step_0_ms:.1f} / {step_best_ms:.1f} ms = {predicted:.2f}x")


def band_floor(scale: str | None = None) -> tuple[float | None, str]:
    """The headline's least ratio on this host (`worker_speedup_floor` over the worker counts it has cores
    for): notebook 03 and `gpulab bench` both lower the class's band to it where it is lower. None where the
    ideal is one core (a host of one physical core): a check against a floor under 1 could not fail, since
    the best setting includes 0 workers, so it is skipped with this reason (`bands.judged_low`)."""
    cfg = config(scale)
    floor, why = worker_speedup_floor(usable_workers(cfg["workers"]), stall=cfg.get("stall"))
    if floor < 1.0:      # an ideal of one: 0 workers is among the counts, so the best cannot read below 1
        return None, (f"not judged on this host: {why}; the workers have no core of their own, so no speed-up is "
                      "expected, and with 0 workers among the settings the best one's ratio cannot fall below 1")
    return floor, why


def headline(scale: str | None = None, *, passes: int | None = None, width: int | None = None) -> Measured:
    """Step time with 0 DataLoader workers against the best of `config(scale)["workers"]`: notebook 03's sweep.

    `passes` and `width`: the augment passes per sample and the CNN's width to run at. Notebook 03 passes
    its own (section 1's calibration, section 2's width), so that its self-check times the configuration of
    its table: calibrated again, the passes can differ (one run got 5 where the table had used 10), and the
    ratio with them. `gpulab bench` leaves them out: both are then found here as the notebook finds them."""
    cfg = config(scale)
    device = pick_device()
    on_gpu = device.type == "cuda"
    cores = cpu_cores()
    size, batch, steps, warmup = cfg["size"], cfg["batch"], cfg["steps"], cfg["warmup"]
    if passes is not None and passes < 0 or width is not None and width < 1:
        raise ValueError(f"need passes >= 0 and width >= 1 (got {passes}, {width})")
    if passes is None:
        passes = calibrate_passes(size, target_sample_ms=cfg["sample_ms"])
    if width is None:
        sample_ms = benchmark(lambda: SyntheticImages(8, size=size, passes=passes)[7], device=torch.device("cpu"),
                              budget_s=0.2).median_ms
        width, _ = size_model(cfg, device, batch * sample_ms)
    torch.manual_seed(0)
    step = make_step(SmallCNN(width=width, blocks=cfg["blocks"], device=device))
    counts = usable_workers(cfg["workers"], cores)
    check_workers = min(cfg["check_workers"], cores)
    threads = torch.get_num_threads()
    if not on_gpu:
        torch.set_num_threads(1)    # as notebook 03 does on the CPU: the step gets one core, the workers the rest
    try:
        with quiet_fork():
            same, n_batches = batches_match(SyntheticImages(length=3 * batch, size=size, passes=passes), batch,
                                            num_workers=check_workers)
            step_ms = {k: loader_run(step, k, batch=batch, size=size, passes=passes, steps=steps, warmup=warmup,
                                     pin_memory=on_gpu, device=device).step_ms for k in counts}
    finally:
        torch.set_num_threads(threads)
    best = min(step_ms, key=step_ms.get)
    return Measured(step_ms[0], step_ms[best], "ms/step", step_ms[0] / step_ms[best], same,
                    f"{n_batches} batches {'identical' if same else 'DIFFERENT'} with 0 and {check_workers} workers",
                    f"0 workers (batch {batch}, {passes} passes, width {width})", f"{best} workers (best of {counts})")
