"""Confirm a verdict by measuring: run a safe variant of the step that has the fix, and time it.

A rule's promise is an estimate from one profile; where the fix can be made to the step from outside,
without editing the learner's code, `confirm_verdicts` runs the step with it and ranks the verdicts by
what it measured. Each variant is undone when it ends (nothing it changes outlives it but the batch pinned
ahead, which pinned staging drops), and runs real training steps: the model trains on, as it does during the
rest of the diagnosis.

| verdict | the variant | when it cannot be made |
|---|---|---|
| fp32_matmuls | the step under `torch.autocast(dtype=bfloat16)`, its own outermost `autocast(enabled=False)` switched on; TF32 allowed where the GPU has no bf16 | a GPU with neither (Turing, Volta); a step that sets its precision otherwise |
| pageable_copy | a DataLoader's batches pinned as `pin_memory=True` pins them (with workers in a thread of their own, one batch ahead; without, inside `next()`), any other pageable host-to-GPU `Tensor.to` or `Tensor.cuda` pinned in the step (`pin_memory()`), and every copy of what it pinned to the GPU made with `non_blocking=True` | a step that reads no DataLoader and copies to the GPU only in ways it cannot see (`copy_` into a GPU tensor, `torch.tensor(..., device=)`) |
| input_bound | the DataLoader's first batch handed out again every step, its tensors copied to the GPU once: what the input pipeline costs | the batch is made by the step's own code (no DataLoader): it runs anyway |
| layout_transposes | the step's model (`step.model`) converted to channels_last in place, and the 4-D tensors given to its forward likewise (`channels_last`), undone after | no `step.model`; no 2-D convolution in it |
| host_sync, host_code, periodic_stall | the step without the calls the learner marked with `skippable(...)` | nothing marked |
| launch_bound | the step's model (`step.model`) compiled in place with `mode="reduce-overhead"` (CUDA graphs), `cudagraph_mark_step_begin()` before each step; a step that compiles its model already: its own compile again with CUDA graphs (`own_compile_graphed`), also where graph breaks block the verdict (one graph per compiled region; kept, it is no longer blocked: `through_block`) | no `step.model`; the verdict is blocked otherwise (a sync in an eager forward, shapes that change: graphs cannot work yet); inductor skipped or recorded no graph |
| elementwise_unfused (a note) | the step's model compiled in place with `torch.compile` (default mode: the pointwise chains fused, no CUDA graphs); the note becomes a ranked fix, on what it measured, where that is at least COMPILE_PROMOTE_MIN beyond the timings' spread; then, promoted or not, where no launch verdict fired and graphs can work, the model compiled with `mode="reduce-overhead"` too: a launch verdict on that measurement where it beats the default compile beyond the spreads and the step as written by COMPILE_PROMOTE_MIN (`graphs_after_fusing`) | no `step.model`; compiling it changed nothing |

The variants made to the step's model live in `model_variants.py`. A `step.model` that is a container of the models the
step calls (an nn.ModuleList or nn.ModuleDict, no forward of its own) has each member compiled or converted
(`model_variants.called_modules`).

Every other verdict says "not measured" and why, and keeps its expected gain. A verdict whose variant
saved less than half of what it was expected to, by more than the two timings' spread, is demoted
(`rules.demote`) and says so.
"""
from __future__ import annotations

import collections
import collections.abc
import contextlib
import os
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterator

import torch

from gpulab.core.timing import benchmark
from gpulab.diagnose.rules import Verdict, demote, rank
from gpulab.diagnose.model_variants import (OWN_GRAPHS, Unavailable, channels_last, models_named,  # noqa: F401
                                           compiled_in_place, cuda_graphs, own_compile_graphed, through_block,
                                           took_graphs, took_own_graphs)

# The variant's timed window, and its warm-up steps (a new precision re-selects its kernels, a compiled
# step recompiles under autocast).
CONFIRM_WINDOW_S = 0.5
CONFIRM_WARMUP = 2
CONFIRM_MAX_CHUNKS = 20
# The CUDA-graph variant's warm-up steps: the first compiles, the next ones warm the CUDA graph trees up and
# record the graphs, which later steps replay.
CONFIRM_GRAPH_WARMUP = 4


# The elementwise note (kernel_rules.elementwise_unfused) promises nothing: what fusing buys is not in the kernel names.
# Measured with the model compiled, it becomes a ranked fix where it bought at least this, beyond the two timings'
# spread: the least gain that makes a fix a zoo step's label (zoo.TUNED_GAIN_MAX). On the H100 (2026-12-06, labels
# of results/zoo/2026-12-06-h100-issue41/) compiling the model was the best fix of resnet50_bf16_nchw (2.46x),
# resnet50_fp32, pageable_uint8_images and transformer_under_cap, where the note fired on the H200's profiles and no
# ranked verdict could name it.
COMPILE_PROMOTE_MIN = 1.10
COMPILE_KWARGS: dict = {}           # torch.compile's arguments for that variant (a test passes its own backend)


# -- marks the learner puts in their own step -------------------------------------------------------------
_skipping = threading.local()


def skippable(fn: Callable, *args, **kwargs):
    """Run `fn(*args, **kwargs)` and return what it returns, except while `diagnose` measures the step
    without it (then None). Mark a line whose cost you want measured, e.g. a log line with a read-back:
    `skippable(lambda: print(loss.item()))`."""
    if getattr(_skipping, "on", False):
        _skipping.hits = getattr(_skipping, "hits", 0) + 1
        return None
    return fn(*args, **kwargs)


@contextlib.contextmanager
def without_marked() -> Iterator[dict]:
    _skipping.on, _skipping.hits = True, 0
    seen = {}
    try:
        yield seen
    finally:
        seen["hits"] = _skipping.hits
        _skipping.on = False


# -- variants ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def switched_on(device_type: str, dtype: torch.dtype) -> Iterator[dict]:
    """Inside it, the step's own `torch.autocast(..., enabled=False)` for `device_type` is entered enabled,
    in `dtype`, where it is the step's outermost autocast: a switch like `autocast(enabled=use_amp)` turned
    on, as the fix would. One nested inside an autocast the step entered itself (an fp32 island: a loss, a
    softmax) stays off. Yields {"switched": how many were turned on}."""
    from torch.amp.autocast_mode import autocast

    init, enter, leave = autocast.__init__, autocast.__enter__, autocast.__exit__
    depth, seen = [0], {"switched": 0}

    def new_init(self, device_type_, dtype=None, enabled=True, cache_enabled=None):
        if not enabled and depth[0] == 0 and device_type_ == device_type:
            enabled, dtype = True, wanted
            seen["switched"] += 1
        init(self, device_type_, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    def new_enter(self):
        depth[0] += 1
        return enter(self)

    def new_exit(self, *exc):
        depth[0] -= 1
        return leave(self, *exc)

    wanted = dtype
    undo = [_patched(autocast, "__init__", new_init), _patched(autocast, "__enter__", new_enter),
            _patched(autocast, "__exit__", new_exit)]
    try:
        yield seen
    finally:
        for u in reversed(undo):
            u()


@contextlib.contextmanager
def sixteen_bit(device: torch.device) -> Iterator[str]:
    """The step under bf16 autocast (its own outermost `autocast(enabled=False)` switched on: `switched_on`),
    or with TF32 allowed where the GPU has TF32 but no bf16."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False):
        with torch.autocast(device.type, dtype=torch.bfloat16), switched_on(device.type, torch.bfloat16):
            yield "the step under torch.autocast(dtype=torch.bfloat16), its own autocast switch turned on"
        return
    if device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 0):
        from gpulab.models.precision import fp32_math
        with fp32_math("tf32"):
            yield "the step with TF32 allowed for matmuls and convolutions"
        return
    raise Unavailable("this GPU has neither bf16 nor TF32 Tensor Cores: fp16 needs a GradScaler in the step itself")


def _patched(cls, name: str, new) -> Callable[[], None]:
    """Replace cls.name with `new`; returns the undo."""
    own = name in cls.__dict__
    old = cls.__dict__.get(name)
    setattr(cls, name, new)

    def undo():
        if own:
            setattr(cls, name, old)
        else:
            delattr(cls, name)
    return undo


def _target(args, kwargs) -> tuple[torch.device | None, dict]:
    """The device a `.to(...)` call moves to, and what else it asked for (dtype, memory format)."""
    # (device, dtype, non_blocking, memory_format); the parser refuses `copy`, which Tensor.to takes (GradScaler
    # passes copy=True every step): left out here, since a copy to another device is a new tensor anyway
    parsed = torch._C._nn._parse_to(*args, **{k: v for k, v in kwargs.items() if k != "copy"})
    device, dtype, memory_format = parsed[0], parsed[1], parsed[-1]
    rest = {k: v for k, v in (("dtype", dtype), ("memory_format", memory_format)) if v is not None}
    return device, rest


def stages(t: torch.Tensor, target) -> bool:
    """Whether `pinned_staging` stages the copy of `t` to `target`: a pageable CPU tensor going to a GPU, of any
    size (a read-back to the host is never staged: pinning cannot remove its wait)."""
    return (target is not None and torch.device(target).type == "cuda" and t.device.type == "cpu"
            and not t.is_pinned())


class Marked:
    """Tensors by the storage they view, held weakly: a tensor marked and every view of it (`x[:n]`, `x.view(-1)`)
    are in; a WeakSet of tensors would compare two of them with ==, which is elementwise."""

    def __init__(self):
        self._refs: dict = {}

    @staticmethod
    def _held(t: torch.Tensor):
        try:
            return t.untyped_storage()
        except (NotImplementedError, RuntimeError):      # sparse, wrapper subclasses: no storage of their own
            return t

    def add(self, t: torch.Tensor) -> None:
        storage = self._held(t)
        key = id(storage)
        self._refs[key] = weakref.ref(storage, lambda r, key=key: self._refs.pop(key, None)
                                      if self._refs.get(key) is r else None)

    def __contains__(self, t) -> bool:
        if not isinstance(t, torch.Tensor):
            return False
        storage = self._held(t)
        r = self._refs.get(id(storage))
        return r is not None and r() is storage


def goes_async(t: torch.Tensor, target, ours: Marked) -> bool:
    """Whether `pinned_staging` makes the copy of `t` to `target` non_blocking: a CPU tensor the variant pinned itself
    (`ours`) going to a GPU. A pinned buffer of the step's own keeps its blocking copy: the step may
    refill it right after, which a non_blocking copy would race."""
    return (target is not None and torch.device(target).type == "cuda" and t.device.type == "cpu" and t in ours)


@contextlib.contextmanager
def _pinned_ahead(pin: Callable, device: torch.device | None = None) -> Iterator[dict]:
    """A DataLoader with workers hands out its batches pinned by `pin` in a thread of this context's own, one batch
    ahead, off the step's path, as `pin_memory=True`'s pin thread does; that thread runs `torch.set_num_threads(1)`
    first, as the pin thread does (it sets the calling thread's count and the default of threads started after it;
    the step's own count is put back as that default when the context ends). A DataLoader without workers pins
    inside `next(loader)`, on the step's thread, as `pin_memory=True` does there. While the context lasts only its
    thread calls an iterator's own `__next__`; a new pass over a loader with persistent workers (`iter(loader)`
    resets the same iterator) waits for the batch in flight and drops it, as the context's end does. A worker
    process forked meanwhile runs everything as it was (a DataLoader read inside its dataset is not pinned there).
    Differences from the fix, each small against a step: one thread pins for every loader; it pins one batch ahead
    on top of the workers' prefetch; the workers' shutdown at the end of the data runs in that thread, not in the
    step's `next()`. Yields a dict whose "read" counts the batches handed out."""
    from concurrent.futures import ThreadPoolExecutor
    from torch.utils.data.dataloader import _BaseDataLoaderIter, _MultiProcessingDataLoaderIter

    pid, threads = os.getpid(), torch.get_num_threads()

    def init():
        torch.set_num_threads(1)
        if device is not None and device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gpulab-pin", initializer=init)
    next_, reset_ = _BaseDataLoaderIter.__next__, _MultiProcessingDataLoaderIter._reset
    ahead: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # iterator -> the Future of its next batch
    seen = {"read": 0}

    def fetch(it):
        return pin(next_(it))

    def drop(it) -> None:
        future = ahead.pop(it, None)
        if future is not None:
            future.exception()        # wait for it; its batch goes

    def new_next(self):
        if os.getpid() != pid:                        # a worker forked while the variant ran: as it was
            return next_(self)
        seen["read"] += 1
        if getattr(self, "_num_workers", 0) == 0:
            return pin(next_(self))
        future = ahead.pop(self, None) or pool.submit(fetch, self)
        batch = future.result()       # StopIteration (and any other error) comes back here
        ahead[self] = pool.submit(fetch, self)
        return batch

    def new_reset(self, *args, **kwargs):             # persistent workers: iter(loader) resets this iterator
        if os.getpid() == pid:
            drop(self)
        return reset_(self, *args, **kwargs)

    undo = [_patched(_BaseDataLoaderIter, "__next__", new_next),
            _patched(_MultiProcessingDataLoaderIter, "_reset", new_reset)]
    try:
        yield seen
    finally:
        for u in reversed(undo):
            u()
        pool.shutdown(wait=True)      # every fetch finished: no thread touches an iterator once the context is over
        torch.set_num_threads(threads)                # the step's count, again the default of threads to come


@contextlib.contextmanager
def pinned_staging(device: torch.device) -> Iterator[str]:
    """The step as a DataLoader with `pin_memory=True` and copies with `non_blocking=True` would run it.

    - A DataLoader's batches come pinned (`_pinned_ahead`): with workers, one batch ahead in a thread of their own,
      as `pin_memory=True`'s pin thread does, off the step's path; without workers, inside `next(loader)`.
    - A copy of a tensor the variant pinned to the GPU runs with non_blocking=True (`goes_async`).
    - A copy of a pageable CPU tensor to the GPU from anywhere else (of any size) is pinned on the step's own
      thread (`Tensor.pin_memory()`), then copied with non_blocking=True: that pinning costs the step a memcpy the
      fix would not (the pinned block comes from PyTorch's caching host allocator, reused once its copy is done).
    - A copy it cannot see (`gpu_tensor.copy_(cpu_tensor)`, `torch.tensor(..., device=...)`) stays as it was; a step
      whose copies it saw none of and that read no DataLoader is not measured (Unavailable at the end).

    Why: on an H100 (2026-12-06) notebook 15's pinning fix bought 1.26x and 1.30x where a variant that pinned
    every batch on the step's thread measured 0.997x (staging copies of 64 KiB and up into a pinned buffer) and
    0.67x (`pin_memory()` of every copy on the step's thread; that copy runs on every intra-op thread, which the
    DataLoader's pin thread avoids with `torch.set_num_threads(1)` beside its busy workers: perhaps the cause, not
    measured). Rebuilt as above, it measured that fix at 1.31x where the fix bought 1.30x (H100, 2026-12-06 night:
    results/course/2026-12-06-h100-13b-15-night/)."""
    if device.type != "cuda":
        raise Unavailable("pinned memory is for copies to a GPU")
    from torch.utils.data._utils.pin_memory import pin_memory as pin_batch      # what the pin thread calls
    to, cuda = torch.Tensor.to, torch.Tensor.cuda
    ours = Marked()                                   # the tensors this variant pinned
    copies = {"n": 0}

    def pin(batch):
        batch = pin_batch(batch)        # no device argument: torch 2.13 ignores it (the current accelerator)
        for t in _tensors(batch):
            ours.add(t)
        return batch

    def staged(t: torch.Tensor, target: torch.device) -> torch.Tensor:
        copies["n"] += 1
        return to(t if t in ours else t.pin_memory(), target, non_blocking=True)

    pid = os.getpid()

    def new_to(self, *args, **kwargs):
        try:
            target, rest = _target(args, kwargs)
        except RuntimeError:                          # a form the parser refuses (a positional copy): as it was
            return to(self, *args, **kwargs)
        if os.getpid() == pid and (stages(self, target) or goes_async(self, target, ours)):
            out = staged(self, torch.device(target))
            return to(out, **rest) if rest else out
        return to(self, *args, **kwargs)

    def new_cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
        target = torch.device("cuda", device) if isinstance(device, int) else torch.device(device or "cuda")
        if os.getpid() == pid and (stages(self, target) or goes_async(self, target, ours)):
            out = staged(self, target)
            return out if memory_format is torch.preserve_format else to(out, memory_format=memory_format)
        return cuda(self, device, non_blocking, memory_format=memory_format)

    undo = [_patched(torch.Tensor, "to", new_to), _patched(torch.Tensor, "cuda", new_cuda)]
    try:
        with _pinned_ahead(pin, device) as seen:
            yield ("a DataLoader's batches pinned as pin_memory=True pins them (with workers in a thread, one ahead), "
                   "other pageable host-to-GPU copies pinned in the step, the pinned ones copied non_blocking=True")
    finally:
        for u in reversed(undo):
            u()
    if not copies["n"] and not seen["read"]:
        raise Unavailable("the step read no DataLoader and made no copy to the GPU through Tensor.to or Tensor.cuda "
                          "(copy_ into a GPU tensor, torch.tensor(..., device=...)): the variant could not pin them")


def _tensors(batch) -> list[torch.Tensor]:
    """The tensors in a batch, through any mapping or sequence (as the DataLoader's pin_memory walks them)."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, collections.abc.Mapping):
        return [t for v in batch.values() for t in _tensors(v)]
    if isinstance(batch, collections.abc.Sequence) and not isinstance(
            batch, (str, bytes, bytearray, collections.UserString, memoryview)):
        return [t for v in batch for t in _tensors(v)]
    return []


@contextlib.contextmanager
def replayed_batch(device: torch.device) -> Iterator[str]:
    """Every DataLoader hands out its first batch again (from the variant's start), and its tensors'
    copies to the GPU are made once and handed out again: the step without its input pipeline."""
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    first: dict = {}
    on_gpu: dict = {}
    next_ = _BaseDataLoaderIter.__next__
    to = torch.Tensor.to

    def new_next(self):
        if id(self) not in first:
            first[id(self)] = next_(self)
            for t in _tensors(first[id(self)]):
                on_gpu[id(t)] = None
        return first[id(self)]

    def new_to(self, *args, **kwargs):
        if id(self) in on_gpu:
            if on_gpu[id(self)] is None:
                on_gpu[id(self)] = to(self, *args, **kwargs)
            return on_gpu[id(self)]
        return to(self, *args, **kwargs)

    undo = [_patched(_BaseDataLoaderIter, "__next__", new_next), _patched(torch.Tensor, "to", new_to)]
    try:
        yield "the DataLoader's batch handed out again every step, its copy to the GPU made once"
    finally:
        for u in reversed(undo):
            u()
    if not first:
        raise Unavailable("the step read no batch from a DataLoader")


def graphs_variant(v: Verdict, facts, step, device: torch.device):
    """(the CUDA-graph variant's context, the step that marks each step's start, the check that it took) for a
    launch verdict, or Unavailable(why): where graphs cannot work yet, or the step exposes no model. A step that
    compiles its model already is compiled again with CUDA graphs (`own_compile_graphed`), also where its forward's
    synchronizations break the graph (blocked by compile_graph_breaks): the graphs of each compiled region leave
    the breaks between them, and what they buy is measured, not assumed (`through_block`)."""
    if v.blocked_by and not (v.blocked_by == "compile_graph_breaks" and facts.compiled_regions > 0):
        raise Unavailable(f"blocked by {v.blocked_by}: CUDA graphs cannot work until its fix is made")
    model = getattr(step, "model", None)
    if not isinstance(model, torch.nn.Module):
        raise Unavailable("the step exposes no model (step.model = the module it calls) to compile")

    def marked():
        torch.compiler.cudagraph_mark_step_begin()
        return step()
    if facts.compiled_regions > 0:
        return own_compile_graphed(device), marked, took_own_graphs
    return cuda_graphs(model, device), marked, took_graphs


def _variant(v: Verdict, facts, device: torch.device, step=None):
    """The context manager that makes `v`'s fix, or Unavailable(why)."""
    if v.rule == "layout_transposes":
        model = getattr(step, "model", None)
        if not isinstance(model, torch.nn.Module):
            raise Unavailable("the step exposes no model (step.model = the module it calls) to convert")
        return channels_last(model)
    if v.rule == "fp32_matmuls":
        return sixteen_bit(device)
    if v.rule == "pageable_copy":
        return pinned_staging(device)
    if v.rule == "input_bound":
        if facts.precopy_ms > 0.5 * facts.host_by_cause.get("input", 0.0):
            raise Unavailable("the batch is made by the step's own code before its copy to the GPU (no DataLoader "
                              "to replay): the variant would make it anyway")
        return replayed_batch(device)
    if v.rule in ("host_sync", "host_code", "periodic_stall"):
        return without_marked()
    raise Unavailable("no variant of the step can make this fix from outside the step")


PRODUCTS = ("mm", "addmm", "bmm", "baddbmm", "convolution", "_convolution", "cudnn_convolution",
            "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_cudnn_attention", "_cudnn_rnn")


def product_counts(step: Callable) -> Counter:
    """How many matrix products and convolutions of one run of `step`'s forward (not its backward) received
    each dtype (a dispatch mode sees them after autocast has cast them). The backward is left out: it runs
    under whatever autocast surrounds `backward()`, even where the forward turned autocast off."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from gpulab.models.sizing import uncompiled

    seen: Counter = Counter()

    class Spy(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ in PRODUCTS and torch._C._current_autograd_node() is None:
                first = next((a for a in args if isinstance(a, torch.Tensor)), None)
                if first is not None:
                    seen[first.dtype] += 1
            return func(*args, **(kwargs or {}))

    with uncompiled(), Spy():      # a compiled model met under a dispatch mode would stay eager
        step()
    return seen


def product_dtypes(step: Callable) -> set:
    """The dtypes the matrix products and convolutions of one run of `step` received."""
    return set(product_counts(step))


def measure(step: Callable, steps: int, device: torch.device, context, check=None, warmup: int = CONFIRM_WARMUP):
    """The Timing (ms per step) of `step` run inside `context` (steps back to back, chunks of `steps`, host clock).
    `check(step)`, run first inside the context, raises Unavailable where the variant did not take."""
    with context:
        if check is not None:
            check(step)
        return benchmark(step, warmup=warmup, repeat=None, budget_s=CONFIRM_WINDOW_S,
                         max_repeat=CONFIRM_MAX_CHUNKS, calls=steps, clock="host", device=device)


# The variant took when at least half of the forward's products ran 16-bit. A step that turns autocast off
# around its forward (autocast(enabled=False)) still gets 16-bit products from the variant in its backward,
# which runs under the variant's autocast (on the H200 the head's backward products did, beside fp32
# convolutions everywhere else, and the variant measured 1.0x where the fix made by hand measured 2.4x).
TOOK_16BIT_MIN = 0.5


def took_16bit(step: Callable) -> None:
    """Unavailable unless one run of `step` under the variant fed at least TOOK_16BIT_MIN of its products
    16-bit inputs: a step that sets its own precision inside (`autocast(enabled=False)`, its own switches)
    overrides the variant, and its time would measure nothing."""
    counts = product_counts(step)
    total = sum(counts.values())
    half = counts[torch.bfloat16] + counts[torch.float16]
    if total == 0 or half < TOOK_16BIT_MIN * total:
        raise Unavailable("the step sets its own precision (autocast(enabled=False) or its own switches) and "
                          f"overrides the variant: {half} of its {total} forward matrix products ran 16-bit ("
                          + (", ".join(f"{str(d).replace('torch.', '')} {n}" for d, n in counts.items()) or "none seen")
                          + ")")


def confirm_verdicts(d, step: Callable, device: torch.device, steps: int = 5) -> None:
    """Measure every verdict of diagnosis `d` that has a variant (see the module's table), in place:
    each gets `measured` and `confirmation` (or why not), is demoted if it saved under half its
    expectation, and the verdicts are ranked again."""
    out = []
    # the 16-bit variant last: a step that carries tensors from one call to the next (an RNN's hidden state) keeps
    # them in the dtype the last variant left, and a 16-bit state fed to the step outside autocast fails (the H100,
    # 2026-12-06: word_language_model_lstm's CUDA-graph variant after its 16-bit one)
    for v in sorted(d.verdicts, key=lambda v: v.rule == "fp32_matmuls"):
        if not v.actionable and v.rule != "elementwise_unfused":         # a note that no variant measures
            out.append(v)
            continue
        try:
            run, warmup, what = step, CONFIRM_WARMUP, _describe(v, getattr(step, "model", None))
            if v.rule == "launch_bound":
                context, run, took = graphs_variant(v, d.facts, step, device)
                warmup = CONFIRM_GRAPH_WARMUP
                if took is took_own_graphs:
                    what = OWN_GRAPHS
            elif v.rule == "elementwise_unfused":
                context = compiled_variant(step)
            else:
                context = _variant(v, d.facts, device, step)
            hits: dict = {}
            if v.rule in ("host_sync", "host_code", "periodic_stall"):
                context = _counting(context, hits)
            check = took_16bit if v.rule == "fp32_matmuls" and torch.cuda.is_available() and \
                device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False) else None
            if v.rule == "launch_bound":
                check = took
            elif v.rule == "elementwise_unfused":
                check = took_graphs
            timing = measure(run, steps, device, context, check, warmup)
            ms = timing.median_ms
        except Unavailable as why:
            out.append(_note(v, f"not measured: {why}"))
            continue
        except Exception as err:       # noqa: BLE001 - a variant that fails leaves the verdict unmeasured
            out.append(_note(v, f"not measured: the variant failed ({type(err).__name__}: {str(err)[:200]})"))
            continue
        if hits.get("hits") == 0:
            out.append(_note(v, "not measured: nothing in the step is marked with gpulab.diagnose.skippable(...); "
                                "mark the line to measure what removing it buys"))
            continue
        measured = d.step_ms / ms if ms > 0 else float("inf")
        how = f"measured {measured:.3g}x ({d.step_ms:.3g} -> {ms:.3g} ms per step) with {what}"
        noise = (d.step_spread_ms or 0.0) + (timing.spread_ms or 0.0)
        out.append(promoted(v, d.step_ms, ms, how, noise) if not v.actionable else
                   through_block(demote(v, measured, how, step_ms=d.step_ms, noise_ms=noise)))
        if v.rule == "elementwise_unfused":         # promoted or not: the host may pace the compiled step
            out += graphs_after_fusing(d, out, step, device, steps, ms, timing.spread_ms or 0.0)
    d.verdicts = rank(out)


def after_fusing_wants_graphs(verdicts) -> bool:
    """Whether `graphs_after_fusing` has a launch verdict to measure among these verdicts: the elementwise note
    (whose compiled model was measured) and no launch verdict fired. `zoo.with_confirmations` asks the same of a
    re-analysed record before it keeps the live run's launch verdict made this way."""
    return (any(v.rule == "elementwise_unfused" for v in verdicts)
            and not any(v.rule == "launch_bound" for v in verdicts))


def graphs_after_fusing(d, out: list, step: Callable, device: torch.device, steps: int, fused_ms: float,
                        fused_spread_ms: float) -> list:
    """Where the elementwise note's compiled model was measured (`fused_ms`) and no launch verdict fired, the model
    compiled with mode="reduce-overhead" as well: once fused, the step's GPU work shrinks and the host's launches
    may pace it, which the profile of the step as written cannot show. Where CUDA graphs can work
    (`rules.graphs_blocked_by`) and that variant beats the default compile beyond the two timings' spreads, and the
    step as written by COMPILE_PROMOTE_MIN beyond theirs, a launch verdict on that measurement (its promise is what
    it measured), which `rank` puts first. On the H100 (2026-12-06) the default compile measured 1.26x on
    timm_train_one_epoch and 1.40x on pageable_uint8_images, where the labels' reduce-overhead compile read 1.78x
    and 1.71x in another run: designed after those readings. First run on a GPU (H100, 2026-12-07,
    results/zoo/2026-12-07-h100-issue41/): it came first on four steps and stayed out, within the spreads, on two.
    It ran only where the default compile had been promoted until torchvision_reference_classification (H100,
    2026-12-07, results/zoo/2026-12-07-h100-issue41-b/): its compiled model measured 0.979x, a note still, where the
    labels' reduce-overhead compile read 1.58x and 1.53x: a compile that does not pay alone is what a host pacing
    the fused step looks like. Widened after that reading (not yet run on a GPU)."""
    from gpulab.diagnose.rules import graphs_blocked_by
    from gpulab.diagnose.verdicts import verdict

    if device.type != "cuda" or not after_fusing_wants_graphs([*out, *d.verdicts]) or graphs_blocked_by(d.facts):
        return []
    probe = verdict("launch_bound", "", "11", 0.0, "", "")
    try:
        context, run, took = graphs_variant(probe, d.facts, step, device)
        timing = measure(run, steps, device, context, took, CONFIRM_GRAPH_WARMUP)
    except Exception:       # noqa: BLE001 - no graphs here: the compiled model's verdict stands alone
        return []
    ms = timing.median_ms
    noise = (timing.spread_ms or 0.0) + fused_spread_ms
    if ms <= 0 or ms + noise >= fused_ms:
        return []
    if (d.step_ms - (d.step_spread_ms or 0.0) - (timing.spread_ms or 0.0)) / ms < COMPILE_PROMOTE_MIN:
        return []           # the gate where the compile alone was not promoted: graphs must beat the step as written
    gain = d.step_ms / ms
    which = models_named(getattr(step, "model", None))
    how = (f'measured {gain:.3g}x ({d.step_ms:.3g} -> {ms:.3g} ms per step) with {which} compiled with '
           f'mode="reduce-overhead", against {d.step_ms / fused_ms:.3g}x ({fused_ms:.3g} ms) compiled alone; '
           "ranked on that measurement")
    v = verdict("launch_bound", "kernel launch overhead once the model is compiled (the fused step waits on its "
                "launches)", "11", 1 - 1 / gain, f"the compiled step ran {fused_ms:.3g} ms and {ms:.3g} ms with CUDA "
                "graphs: what the graphs removed is host time the fused GPU work no longer hides",
                f"torch.compile(model, mode='reduce-overhead'){'' if which == 'the model' else f' for {which}'} "
                "(torch.compiler.cudagraph_mark_step_begin() before each step)")
    from dataclasses import replace
    return [replace(v, measured=gain, confirmation=how)]


def compiled_variant(step: Callable):
    """The elementwise note's variant: `step.model` compiled in place with torch.compile's default mode
    (`compiled_in_place`), or Unavailable where the step exposes no model."""
    model = getattr(step, "model", None)
    if not isinstance(model, torch.nn.Module):
        raise Unavailable("the step exposes no model (step.model = the module it calls) to compile")
    return compiled_in_place(model, **COMPILE_KWARGS)


def promoted(v: Verdict, before_ms: float, after_ms: float, how: str, noise_ms: float) -> Verdict:
    """A note its variant measured: a ranked fix on that measurement where the gain less the two timings' spread
    reaches COMPILE_PROMOTE_MIN (its promise is what it measured: it cannot be demoted), else the note, saying it."""
    from dataclasses import replace

    measured = before_ms / after_ms if after_ms > 0 else float("inf")
    if (before_ms - noise_ms) / after_ms < COMPILE_PROMOTE_MIN:
        return _note(v, how + f"; a note still: under {COMPILE_PROMOTE_MIN:g}x, or within the steps' spread "
                              f"({noise_ms:.3g} ms)")
    beyond = (f"; more than the elementwise time's bound ({v.bound:.3g}x): compiling removed other time too "
              "(launches, other kernels)" if measured > v.bound else "")
    return replace(v, actionable=True, measured=measured, expected=min(1 - 1 / measured, v.share),
                   confirmation=how + "; ranked on that measurement" + beyond)


@contextlib.contextmanager
def _counting(context, hits: dict):
    with context as seen:
        yield seen
    hits.update(seen)


def _describe(v: Verdict, model=None) -> str:
    """What `v`'s variant made, in its measurement's words (the model named by `models_named`)."""
    return _variant_words(v).replace("the model", models_named(model), 1)


def _variant_words(v: Verdict) -> str:
    return {"fp32_matmuls": "16-bit math", "pageable_copy": "pinned staging", "input_bound": "the batch replayed",
            "layout_transposes": "the model and its inputs in channels_last",
            "launch_bound": 'the model compiled with mode="reduce-overhead"',
            "elementwise_unfused": "the model compiled (torch.compile, default mode)"}.get(v.rule, "the marked calls skipped")


def _note(v: Verdict, text: str) -> Verdict:
    from dataclasses import replace
    return replace(v, confirmation=text)
