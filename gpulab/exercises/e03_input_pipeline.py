"""Notebook 03's graded exercise: a DataLoader without workers.

With `num_workers=0` the training loop's own process makes every sample (lesson 03's `SyntheticImages`: a
"decode" and augment passes in numpy, real CPU time per sample), one after the other, and the GPU waits for
each batch. Worker processes make the next batches in parallel while the GPU trains; pinned memory lets the
copy to the GPU run without the host waiting for it.

One graded call is one short epoch: a fresh `SyntheticImages` (its seed drawn by the grader), a fresh loader
from the learner's `make_loader(dataset, batch_size)`, and lesson 03's SmallCNN trained on every batch it
serves, in order (`make_step`: SGD with momentum). The outputs are the epoch's losses; the parameters after k
epochs must match the reference's (the systems tier: workers change when a batch is made, never what it
holds). The loader's start-up (forking its workers) is inside the call, as it is at every epoch of a real
loop without persistent workers.

Sizing (full): W = the largest of the lesson's worker counts this machine has cores for (`usable_workers`);
an epoch has max(8, 2W) batches of the lesson's batch and image size; a sample's CPU cost is calibrated on
this host (`calibrate_passes`) so that the epoch's samples take about CALL_MS of one core; the CNN is narrowed
by the lesson's `size_model` until its step takes at most 1/8 of a batch's CPU time (the lesson's stall), so
that without workers the GPU waits most of each epoch.

Prediction (to be measured on an H200): on its 16-core host W = 12, 24 batches of 64 images, ~0.33 ms a
sample (~21 ms a batch): 0 workers ~0.5 s an epoch, the GPU's ~2 ms steps hidden under it. 12 workers make
the epoch's samples in ~45 ms; the GPU's 24 steps then take ~50 ms, and forking 12 workers from a process
that holds a CUDA context costs perhaps 50-100 ms more: ~110-170 ms, the reference about 2.5x to 4x faster.
On a T4 with Colab's 2 cores, W = 2, 8 batches of ~62 ms: the two workers share the two cores with the
training loop and its pin-memory thread, about 1.3x (1.2x to 1.5x).
"""
from __future__ import annotations

import contextlib
import multiprocessing

import torch

from gpulab.exercises.task import Runner, Task, Workload
from gpulab.lessons.l03_input_pipeline import (
    SyntheticImages,
    calibrate_passes,
    config,
    make_step as cnn_step,
    quiet_fork,
    size_model,
    usable_workers,
)
from gpulab.models.cnn import SmallCNN
from gpulab.models.same import parameters

CALL_MS = 500.0            # full: one core's time to make one epoch's samples
TINY = {"size": 16, "batch": 8, "passes": 1, "batches": 4}     # the CPU: a few ms of samples an epoch


def make_loader(dataset, batch_size):
    """The loader as given: no worker processes, so the training loop's own process makes every sample of
    every batch, one after the other, while the GPU waits."""
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=0)


def make_loader_fixed(dataset, batch_size):
    """The lesson's fix: worker processes make the next batches while the GPU trains on this one, as many as
    this machine has cores for (at most the lesson's largest count); on a GPU the loader also pins each batch,
    so its copy to the GPU does not keep the host waiting. Same batches, in the same order."""
    workers = max(usable_workers(config()["workers"]))
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=workers,
                                       pin_memory=torch.cuda.is_available())


@contextlib.contextmanager
def _workers_as_in_a_notebook():
    """DataLoader workers started the way a notebook's kernel starts them. The grading process was started by a
    forkserver and inherits its start method, so a loader's workers would start from that server (a second before
    the first batch of two workers, on a 2-core CPU, 2026-12-04) where a kernel forks them (the platform's
    default method) in tens of milliseconds."""
    method = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method(multiprocessing.get_all_start_methods()[0], force=True)
    try:
        with quiet_fork():
            yield
    finally:
        multiprocessing.set_start_method(method, force=True)


def build(scale: str, device: torch.device) -> Workload:
    cfg = config(scale)
    workers = max(usable_workers(cfg["workers"]))
    if scale == "full":
        batch, size = cfg["batch"], cfg["size"]
        batches = max(8, 2 * workers)
        sample_ms = CALL_MS / (batches * batch)
        passes = calibrate_passes(size, sample_ms)
        width, step_ms = size_model(cfg, device, data_ms=batch * sample_ms)
        how = (f"{batches} batches (max(8, 2 x {workers} workers)); sample ~{sample_ms:.2f} ms of CPU "
               f"({CALL_MS:g} ms an epoch on one core); CNN narrowed to a step <= 1/{cfg.get('stall')} of a batch")
    else:
        batch, size, passes, batches = TINY["batch"], TINY["size"], TINY["passes"], TINY["batches"]
        width, step_ms, how = cfg["width"], None, "tiny"

    def instantiate(factory) -> Runner:
        torch.manual_seed(0)
        model = SmallCNN(width=width, blocks=cfg["blocks"], device=device)
        train = cnn_step(model)

        def call(inputs):
            seed, reverse = int(inputs[0]), bool(inputs[1])
            data = SyntheticImages(batches * batch, size=size, passes=passes, seed=seed)
            losses = []
            with _workers_as_in_a_notebook():
                for x, y in factory(data, batch):
                    if x.shape[0] != batch:
                        raise ValueError(f"the loader served a batch of {x.shape[0]} samples; batch_size is {batch}")
                    if reverse:                     # the noise floor: the same batch, its rows in another order
                        x, y = x.flip(0), y.flip(0)
                    pinned = device.type == "cuda" and x.is_pinned()
                    losses.append(train(x.to(device, non_blocking=pinned), y.to(device, non_blocking=pinned)))
            if len(losses) != batches:
                raise ValueError(f"the loader served {len(losses)} batches; the dataset makes {batches} of "
                                 f"batch_size {batch}")
            return torch.stack(losses)

        def close():
            nonlocal model, train
            model = train = None
        return Runner(call=call, state=lambda: parameters(model), close=close)

    def draw(gen):     # the dataset's seed, and whether to reverse each batch's rows (the noise floor's run)
        return (torch.randint(0, 2**31 - 1, (1,), generator=gen, device=gen.device),
                torch.zeros(1, dtype=torch.bool, device=gen.device))

    def reorder(inputs):
        return inputs[0], torch.ones_like(inputs[1])

    def on_host(inputs):
        return tuple(t.cpu() for t in inputs)

    return Workload(instantiate=instantiate, draw=draw, to_device=on_host, reorder=reorder,
                    sizes={"workers": workers, "batches": batches, "batch": batch, "size": size, "passes": passes,
                           "width": width, "step_ms": step_ms, "how": how})


TASKS = [Task(
    name="03.workers", lesson="03", title="a DataLoader whose main process makes every batch", tier="systems",
    slow=make_loader, reference=make_loader_fixed, build=build, warmup=1, calls="epochs",
    what=("make_loader(dataset, batch_size) returns the DataLoader a training loop reads one epoch from; as "
          "given, the loop's own process makes every sample. Return a loader that serves the same batches in "
          "the same order, faster. The grader trains lesson 03's CNN on every batch of a fresh dataset through "
          "your loader, on this machine's cores and GPU."),
    hints=("While the main process decodes and augments the next batch, what are the GPU and the machine's "
           "other cores doing?",
           "Give the DataLoader worker processes: num_workers from the cores this machine has "
           "(gpulab.lessons.l03_input_pipeline.usable_workers, or os.sched_getaffinity), and pin_memory=True "
           "on a GPU. Keep shuffle off: the same batches, in the same order."),
)]
