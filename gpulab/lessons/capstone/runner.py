"""One run of a capstone job (`run_job`): build the job from one seed with its toggles (`prepare`, `make_trainer`),
train its first updates (an update GradScaler skips is tried again and counted), keep a sample of its parameters
and gradients for the checks (`capstone.checks`; a reference run keeps its noise floors too), then time further
steps with `gpulab.core.timing.benchmark`: throughput, model TFLOP/s, peak memory, GPU busy %. `JobResult` holds
what it measured. `run_context` is what every run of a job shares: its refusal, its fp32 math mode and its memory
guard. The input pipeline (`Inputs`, `HostBatches`) and checkpointed blocks (`CheckpointedBlocks`) live here."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn
from torch.utils.data import Dataset

from gpulab.core.device import device_facts, pick_device, resolve_scale
from gpulab.core.memory import memory_guard, track_peak
from gpulab.core.timing import Timing, benchmark, stopwatch
from gpulab.lessons.capstone import checks as K
from gpulab.lessons.capstone.jobs import JOBS, job_config, model_flops, sizes_key
from gpulab.lessons.capstone.knobs import ALIGN, CONFIG, LOADER_WORKERS, LOSS_STEPS, LR, POOL
from gpulab.lessons.capstone.options import AMP_DTYPES, Options, problem
from gpulab.lessons.l11_cuda_graphs import cudagraph_skips
from gpulab.models import precision as P
from gpulab.models.gpt import padded_copy
from gpulab.models.step import train_step
from gpulab.models.transformer import TransformerStack


# -- checkpointing ------------------------------------------------------------------------------------
class CheckpointedBlocks(nn.Module):
    """A model's `blocks` (an nn.Sequential) run with lesson 09's activation checkpointing: every
    `every` blocks form one checkpointed segment (`TransformerStack.run_blocks`, reused as it is).

    For the CNN, BatchNorm in a recomputed segment updates its running statistics a second time during
    backward; the training loss uses the batch's own statistics, so it does not change.
    """

    run_blocks = TransformerStack.run_blocks

    def __init__(self, blocks: nn.Sequential, every: int = 1):
        super().__init__()
        self.blocks, self.checkpoint_every = blocks, every

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.run_blocks(x)


# -- the input pipeline ------------------------------------------------------------------------------
class HostBatches(Dataset):
    """Ready-made batches in host memory, served in order, round and round: a dataset already decoded
    into RAM, so the input path costs only the copy to the GPU (lesson 03 measures decoding).

    It lives in this importable module because DataLoader workers must find its class by name.
    """

    def __init__(self, pool: Sequence[tuple[torch.Tensor, torch.Tensor]], length: int = 10**6):
        if not pool:
            raise ValueError("the pool needs at least one batch")
        self.pool, self.length = list(pool), length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pool[i % len(self.pool)]


def loader_workers() -> int:
    """The `loader` toggle's DataLoader workers: LOADER_WORKERS, at most the cores this process may use
    (`cpu_cores()`, a profile's host included), as lessons 03 and 15 size theirs."""
    from gpulab.core.device import cpu_cores
    return min(LOADER_WORKERS, cpu_cores())


class Inputs:
    """The batches of one run, in order, copied to the device.

    loader off: each batch is copied from pageable host memory with a plain `.to(device)` (the host
    waits for the copy). loader on: `loader_workers()` DataLoader workers serve the batches, a pinning
    thread copies them into page-locked memory, and `.to(device, non_blocking=True)` returns at once
    (lessons 03 and 05). Same batches either way, so the losses match.
    """

    def __init__(self, pool: list, device: torch.device, loader: bool = False, channels_last: bool = False):
        self.pool, self.device, self.loader, self.channels_last = pool, device, loader, channels_last
        self._i = 0
        self._it = None

    def __enter__(self) -> "Inputs":
        if self.loader:
            from gpulab.lessons.l03_input_pipeline import make_loader
            self._it = iter(make_loader(HostBatches(self.pool), batch_size=None, num_workers=loader_workers(),
                                        pin_memory=self.device.type == "cuda"))
        return self

    def __exit__(self, *exc) -> None:
        self._it = None                     # the iterator's finalizer stops its workers
        self.pool = []                      # and the batches go: a name still bound to this object holds none

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._it is not None:
            x, y = next(self._it)
        else:
            x, y = self.pool[self._i % len(self.pool)]
            self._i += 1
        x = x.to(self.device, non_blocking=self.loader)
        y = y.to(self.device, non_blocking=self.loader)
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, y


# -- one run -----------------------------------------------------------------------------------------
SKIP_RETRIES = 24      # an update GradScaler skips is tried again on its batch at most this often (2^16 -> 2^-8)


@dataclass(frozen=True)
class JobResult:
    """What `run_job` measured. `time` is per optimizer step (None for an untimed run, or one whose check
    failed)."""

    job: str
    options: Options
    batch: int
    losses: tuple[float, ...]
    time: Timing | None
    unit: str
    items_per_step: int
    flops_per_step: float
    peak_bytes: int | None
    first_step_ms: float
    busy_pct: float | None = None
    monitor_status: str = ""
    notes: tuple[str, ...] = ()
    device: str = "cpu"
    skipped_updates: tuple[int, ...] = ()     # the loss step (from 0) of each update GradScaler skipped, then retried
    first_scale: float | None = None          # GradScaler's scale before the first update (fp16)
    sample: K.Sample | None = None            # what the correctness checks compare (`capstone.checks`)
    parts: tuple[K.Part, ...] = ()            # the checks made during the run, before it was timed

    @property
    def items_per_s(self) -> float | None:
        return None if self.time is None else self.time.per_second(self.items_per_step)

    @property
    def tflops(self) -> float | None:
        """Model FLOPs per second, in TFLOP/s (recomputation under checkpointing does not count)."""
        return None if self.time is None else self.time.per_second(self.flops_per_step) / 1e12

    @property
    def step_ms(self) -> float | None:
        return None if self.time is None else self.time.median_ms


_SAMPLED: dict[tuple, tuple[list, list[str]]] = {}


def sampled(job: str, config: dict) -> tuple[K.Positions, list[str]]:
    """(the positions `checks.take` keeps of each parameter tensor, the tensors' names) for `job` at sizes
    `config`, from the model without toggles (built on the meta device: no memory)."""
    key = sizes_key(job, config)
    if key not in _SAMPLED:
        named = list(JOBS[job].build(config, torch.device("meta")).named_parameters())
        _SAMPLED[key] = (K.sample_positions([p.shape for _, p in named]), [n for n, _ in named])
    return _SAMPLED[key]


Check = Callable[[tuple, tuple, "K.Sample", "Callable[[], K.Sample] | None"], Sequence["K.Part"]]


def run_job(job: str, options: Options = Options(), batch: int | None = None, *, config: dict | None = None,
            loss_steps: int = LOSS_STEPS, timed: bool = True, warmup: int | None = None,
            budget_s: float | None = None, max_repeat: int | None = None, monitor: bool = False,
            floors: Sequence[str] = (), check: Check | None = None, own_floor: bool = False,
            device: torch.device | None = None, seed: int = 0, scale: str | None = None) -> JobResult:
    """Train `job` with `options` from the weights seed `seed` gives: `loss_steps` updates whose losses are
    kept, then (if `timed`) `benchmark` times further steps: `warmup` untimed, then as many as fit about
    `budget_s` seconds (at most `max_repeat`). Inside `memory_guard`: GPU memory goes back to where it was.

    `scale` ("tiny" or "full"; None: the course's) picks the defaults: `config` (the job's sizes,
    `job_config(job, scale)`), `budget_s` and `max_repeat` (`config(scale)`); `batch` defaults to the
    config's batch. With `monitor`, a `GpuMonitor` samples GPU busy % during the timed steps (then
    `budget_s` and `max_repeat` default to `monitor_budget_s` and `monitor_max_repeat`: 2 s at full size).
    NVML's busy % covers its past sample period, up to `monitor.NVML_PERIOD_MAX_S` (1 s) by product, so the
    samples of the first second, whose periods began before the steps, are dropped (`busy_pct` None, and
    `monitor_status` says why, where none is left). The loss steps warm up the step (the first compiles it, the next ones record CUDA
    graphs), so `warmup` defaults to one more.

    Correct before fast: the run keeps a `checks.Sample` (its parameters before and after the loss steps and
    its first update's gradients, at fixed positions). An update GradScaler skips (inf or NaN gradients) is
    tried again on its batch until it is applied (at most SKIP_RETRIES times), and counted in
    `skipped_updates`, so every run makes `loss_steps` updates on the same batches. `floors` (a reference
    run's, `checks`): "reorder", the same updates again from the same weights with each batch's rows in
    another order, and formats of `checks.FORMATS`, the first update's gradients computed in each
    (`format_gradients`). `check(losses, skipped, sample, own_floor)` returns the comparisons (`checks.Part`)
    before anything is timed; a run that fails one is not timed (`time` None, and a note says why). With
    `own_floor`, the run keeps its starting weights, and `own_floor()` (None without) gives its sample with its
    own "reorder" floor, measured only if the check asks for it. A combination no device runs, or one this
    device cannot, raises ValueError with the reason.
    """
    device = device or pick_device()
    size = resolve_scale(scale)
    knobs = CONFIG[size]                          # not `config(scale)`: the argument `config` hides it here
    cfg = dict(config or job_config(job, size))
    batch = batch or cfg["batch"]
    if loss_steps < 1:
        raise ValueError(f"loss_steps must be >= 1 (got {loss_steps}).")
    unknown = [f for f in floors if f != "reorder" and f not in K.FORMATS]
    if unknown:
        raise ValueError(f"floors: {unknown} are not 'reorder' or one of {', '.join(K.FORMATS)}.")
    warmup = 1 if warmup is None else warmup
    budget_s = knobs["monitor_budget_s" if monitor else "budget_s"] if budget_s is None else budget_s
    max_repeat = knobs["monitor_max_repeat" if monitor else "max_repeat"] if max_repeat is None else max_repeat
    flops = model_flops(job, cfg, batch, device)
    sampled(job, cfg)                             # the checks' positions, once per configuration (cached)
    with run_context(job, options, batch, device) as guard:
        out = _train(job, options, batch, cfg, loss_steps, timed, warmup, budget_s, max_repeat, monitor,
                     tuple(floors), check, own_floor, device, seed)
    notes = out.pop("notes")
    if not guard.ok:
        notes.append(guard.message())
    return JobResult(job=job, options=options, batch=batch, unit=JOBS[job].unit,
                     items_per_step=batch * JOBS[job].items(cfg), flops_per_step=flops, notes=tuple(notes),
                     device=str(device), **out)


@contextlib.contextmanager
def run_context(job: str, options: Options, batch: int, device: torch.device):
    """What every run of a job shares (`run_job`, `training_step`, `time_to_loss`): refused with `problem`'s
    reason where it cannot run here; inside, the run's fp32 math mode and `memory_guard` (yielded: GPU memory
    goes back to where it was); on the way out, the run's compiled code and CUDA graphs forgotten (and
    their memory)."""
    why = problem(job, options, batch, device_facts(device))
    if why:
        raise ValueError(why)
    with memory_guard(quiet=True, device=device) as guard, P.fp32_math("tf32" if options.tf32 else "ieee"):
        try:
            yield guard
        finally:
            if options.compile:
                torch.compiler.reset()


@dataclass
class Trainer:
    """A job's model as `options` change it, its AdamW, its GradScaler (fp16) and `train(x, y)`: one update."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler | None
    train: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]    # the job's loss of a batch (compiled with compile)


def prepare(job: str, options: Options, cfg: dict, batch: int, device: torch.device, seed: int):
    """`job`'s model from the weights seed `seed` gives, its POOL batches (made on the device from the model
    as built, kept in host memory), then `make_trainer`'s changes: (Trainer, pool)."""
    torch.manual_seed(seed)
    model = JOBS[job].build(cfg, device)
    pool = [(x.cpu(), y.cpu()) for x, y in JOBS[job].batches(model, batch, POOL)]
    return make_trainer(job, options, model, device), pool


def make_trainer(job: str, options: Options, model: nn.Module, device: torch.device) -> Trainer:
    """`model` as `options` change it (the padded vocabulary, checkpointed blocks, channels_last), its
    GradScaler (fp16) and `train(x, y)`: one `train_step` with AdamW (fused or not), autocast, the compiled
    loss (torch.compile, with CUDA graphs under reduce-overhead) and accumulation."""
    spec = JOBS[job]
    if options.aligned:
        model = padded_copy(model, ALIGN)            # same weights, zero rows for the padding tokens
    if options.fp8:
        P.to_fp8_training(model.blocks)              # the blocks' linear products; the head stays in autocast's bf16
    if options.checkpointing:
        model.blocks = CheckpointedBlocks(model.blocks)
    if options.channels_last:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, fused=True if options.fused else None)
    scaler = P.make_scaler("fp16", device) if options.amp == "fp16" else None

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return spec.loss_fn(model, x, y)

    if options.compile:
        loss_of = torch.compile(loss_of, mode=options.compile_mode)

    def train(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return train_step(model, x, y, loss=lambda _, xs, ys: loss_of(xs, ys), optimizer=optimizer,
                          precision=AMP_DTYPES[options.amp], scaler=scaler,
                          accumulation=options.accumulation, graphs=options.cuda_graphs)
    return Trainer(model, optimizer, scaler, train, loss_of)


def _update(trainer: Trainer, x: torch.Tensor, y: torch.Tensor, step: int, skipped: list[int]) -> float:
    """One update on (x, y), its loss. An update GradScaler skips (its scale falls) is tried again on the
    same batch, at most SKIP_RETRIES times; `step` is appended to `skipped` for each skip."""
    for _ in range(SKIP_RETRIES + 1):
        before = trainer.scaler.get_scale() if trainer.scaler is not None else None
        loss = trainer.train(x, y).item()
        if before is None or trainer.scaler.get_scale() >= before:
            break
        skipped.append(step)
    return loss


def _train(job: str, options: Options, batch: int, cfg: dict, loss_steps: int, timed: bool, warmup: int,
           budget_s: float, max_repeat: int, monitor: bool, floors: tuple[str, ...], check: Check | None,
           own_floor: bool, device: torch.device, seed: int) -> dict:
    notes: list[str] = []
    skips = cudagraph_skips()
    allocated = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    positions, _ = sampled(job, cfg)
    with track_peak(device) as mem:
        trainer, pool = prepare(job, options, cfg, batch, device, seed)
        params = list(trainer.model.parameters())
        if len(params) != len(positions):
            raise RuntimeError(f"{options.label}: the model has {len(params)} parameter tensors where {job}'s has "
                               f"{len(positions)}: a toggle changed the model's parameters, which the checks compare")
        first_scale = trainer.scaler.get_scale() if trainer.scaler is not None else None
        start = [p.detach().to("cpu", copy=True) for p in params] if floors or own_floor else None
        p0 = K.take(params, positions)
        monitor_status, busy, parts, skipped = "", None, (), []
        with Inputs(pool, device, options.loader, options.channels_last) as inputs:
            with stopwatch(device=device) as first:
                losses = [_update(trainer, *inputs.next(), 0, skipped)]     # the first step compiles, if compile is on
            g1 = K.take([p.grad for p in params], positions)
            losses += [_update(trainer, *inputs.next(), i, skipped) for i in range(1, loss_steps)]
            sample = K.Sample(p0, g1, K.take(params, positions))
            floor = functools.partial(_floor_samples, trainer, start=start, batches=pool[:loss_steps], device=device,
                                      channels_last=options.channels_last, chunks=options.accumulation,
                                      positions=positions)
            if floors:
                sample = floor(sample, floors=floors)

            def with_own_floor() -> K.Sample:
                nonlocal sample
                if sample.reordered is None:
                    sample = floor(sample, floors=("reorder",))
                return sample
            if check is not None:
                parts = tuple(check(tuple(losses), tuple(skipped), sample, with_own_floor if own_floor else None))
                failed = [p for p in parts if not p.ok]
                if failed:
                    timed = False
                    notes.append("not timed: " + "; ".join(p.why for p in failed))
            start = floor = None            # the host copies of the starting weights go
            t = None
            if timed:
                mon = None
                if monitor:
                    from gpulab.core.monitor import GpuMonitor
                    mon = GpuMonitor(interval_s=0.05, pcie=False, device=device).start()
                try:
                    t = benchmark(lambda: trainer.train(*inputs.next()), warmup=warmup, budget_s=budget_s,
                                  max_repeat=max_repeat, device=device)
                finally:
                    if mon is not None:
                        busy, monitor_status = _busy(mon.stop())
        trainer.model.zero_grad(set_to_none=True)
    if options.cuda_graphs and cudagraph_skips() > skips:
        notes.append(f"CUDA graphs NOT applied: torch.compile skipped them {cudagraph_skips() - skips} time(s) "
                     "(its log above says why); this row ran compiled code without graphs.")
    peak = None if mem.peak is None else mem.peak - allocated
    return {"losses": tuple(losses), "time": t, "peak_bytes": peak, "first_step_ms": first.ms,
            "busy_pct": busy, "monitor_status": monitor_status, "notes": notes, "skipped_updates": tuple(skipped),
            "first_scale": first_scale, "sample": sample, "parts": parts}


def _busy(mon) -> tuple[float | None, str]:
    """(GPU busy %, what the monitor says) of a stopped `GpuMonitor`: the mean of the samples read at least
    NVML_PERIOD_MAX_S after it started (an earlier one's sample period began before the timed steps)."""
    from gpulab.core.monitor import NVML_PERIOD_MAX_S
    busy = mon.mean("busy_pct", since_s=NVML_PERIOD_MAX_S)
    if busy is None and mon.mean("busy_pct") is not None:
        return None, (f"the timed steps lasted {mon.duration_s:.2g} s; NVML's busy % covers its past sample period "
                      f"(up to {NVML_PERIOD_MAX_S:g} s), so a sample of the first {NVML_PERIOD_MAX_S:g} s reads the "
                      "time before the steps, and no later one was read")
    return busy, mon.status


def format_gradients(trainer: Trainer, x: torch.Tensor, y: torch.Tensor, fmt: str, chunks: int = 1) -> list:
    """The gradients of one step of `trainer`'s model on (x, y) computed in `fmt` (`checks.FORMATS`), by
    `train_step` alone (no optimizer, no GradScaler): the weights rounded to `fmt` (`checks.round_weights`),
    then the step in it: TF32's math mode ("tf32"), autocast ("fp16", "bf16"; "fp8" under bf16 autocast, as
    the fp8 toggle runs). fp16's loss is multiplied by a power of two (2^16, halved while a gradient
    overflows), so small gradients stay above fp16's smallest number, and divided out again (in place: the
    gradients are `.grad`'s own tensors)."""
    params = list(trainer.model.parameters())
    K.round_weights(trainer.model, fmt)
    precision = "bf16" if fmt == "fp8" else fmt
    scale = K.FLOOR_SCALE if fmt == "fp16" else 1.0
    while True:
        train_step(trainer.model, x, y, loss=lambda _, xs, ys: trainer.loss(xs, ys) * scale, precision=precision,
                   accumulation=chunks)
        grads = [p.grad for p in params]
        if scale <= 1.0 or all(bool(torch.isfinite(g).all()) for g in grads if g is not None):
            break
        scale /= 2
    if scale != 1.0:
        for g in grads:
            if g is not None:
                g.div_(scale)
    return grads


def _floor_samples(trainer: Trainer, sample: K.Sample, *, start: list, batches: list, floors: tuple[str, ...],
                   device: torch.device, channels_last: bool, chunks: int, positions: list) -> K.Sample:
    """`sample` with a reference run's noise floors (`checks`), each from the starting weights `start` (host
    copies; the optimizer's state cleared, the gradients dropped): "reorder", the same updates on `batches`
    with each batch's rows in another order (`checks.rows_order`, within each of `chunks` micro-batches), and
    its parameters after them (added to `sample`'s); each format, the first update's gradients computed in it
    (`format_gradients`). The loader is not used: the floors are the arithmetic's, and the batches are the
    same."""
    params = list(trainer.model.parameters())

    def restart() -> None:
        with torch.no_grad():
            for p, w in zip(params, start):
                p.copy_(w)
        trainer.optimizer.state.clear()
        trainer.model.zero_grad(set_to_none=True)

    def on_device(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = x.to(device), y.to(device)
        return (x.contiguous(memory_format=torch.channels_last) if channels_last else x), y

    reordered, rounded = sample.reordered, dict(sample.rounded)
    if "reorder" in floors:
        restart()
        perm = K.rows_order(batches[0][0].shape[0], chunks)
        for i, (x, y) in enumerate(batches):
            _update(trainer, *on_device(x[perm], y[perm]), i, [])
        reordered = K.take(params, positions)
    for fmt in (f for f in floors if f != "reorder"):
        restart()
        rounded[fmt] = K.take(format_gradients(trainer, *on_device(*batches[0]), fmt, chunks), positions)
    return dataclasses.replace(sample, reordered=reordered, rounded=rounded)
