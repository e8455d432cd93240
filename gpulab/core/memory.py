"""GPU memory as PyTorch's caching allocator sees it. Introduced in notebook 00; the heart of 02.

- `memory_now()`: allocated / reserved now and at peak, and the fragmentation
  figure (memory the allocator reserved from the driver but holds no tensor).
- `track_peak()`: a context manager that measures a block's peak.
- `memory_guard()`: the notebooks' memory check. When its block ends it fails if the block kept memory it
  took, or if more is allocated than when the notebook began (`notebook_start`, called by the notebook's
  first cell) plus what the notebook declares it keeps (`keeps=`, `report.keep()`): memory held since an
  earlier cell shows at every later check, not only at the check of the cell that took it.

On the CPU there is no caching allocator to read: the figures are None and `available` is False, so
lessons can say so instead of printing zeros, and a memory check says it was skipped. Tests switch on a
stand-in with GPULAB_MEMORY_CPU=1: "allocated" on the CPU is then the bytes of the live CPU tensors'
storages (`counted_cpu_bytes`), so a notebook run at the tiny size on a machine without a GPU checks its
memory too; GPULAB_MEMORY_STRICT=1 makes a failed check raise MemoryNotReturned (nbval fails the cell).
"""
from __future__ import annotations

import contextlib
import gc
import itertools
import os
import sys
import threading
import types
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator
import torch
from gpulab.core.device import device_facts, pick_device


MiB = 2**20


GiB = 2**30


def fmt_bytes(n: float | None) -> str:
    """Human-readable bytes: '512.0 MiB', '16.60 GiB', or '-' for None."""
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n >= GiB:
        return f"{sign}{n / GiB:.2f} GiB"
    if n >= MiB:
        return f"{sign}{n / MiB:.1f} MiB"
    if n >= 1024:
        return f"{sign}{n / 1024:.1f} KiB"
    return f"{sign}{int(n)} B"


@dataclass(frozen=True)
class MemoryStats:
    """A reading of the caching allocator (bytes). None on the CPU."""

    available: bool
    allocated: int | None = None
    reserved: int | None = None
    peak_allocated: int | None = None
    peak_reserved: int | None = None

    @property
    def fragmentation(self) -> int | None:
        """Bytes reserved from the driver but not holding any tensor (reserved - allocated)."""
        if not self.available:
            return None
        return self.reserved - self.allocated

    @property
    def fragmentation_pct(self) -> float | None:
        """Fragmentation as a percentage of reserved memory."""
        if not self.available or not self.reserved:
            return None if not self.available else 0.0
        return 100.0 * self.fragmentation / self.reserved

    def __str__(self) -> str:
        if not self.available:
            return "memory: not measured (no CUDA caching allocator on the CPU)"
        return (f"allocated {fmt_bytes(self.allocated)}, reserved {fmt_bytes(self.reserved)}, "
                f"reserved-but-unused {fmt_bytes(self.fragmentation)}, "
                f"peak allocated {fmt_bytes(self.peak_allocated)}")


def memory_now(device: torch.device | None = None) -> MemoryStats:
    """Current and peak allocated/reserved bytes on the course's device."""
    device = device or pick_device()
    if device.type != "cuda":
        return MemoryStats(available=False)
    return MemoryStats(
        available=True,
        allocated=torch.cuda.memory_allocated(device),
        reserved=torch.cuda.memory_reserved(device),
        peak_allocated=torch.cuda.max_memory_allocated(device),
        peak_reserved=torch.cuda.max_memory_reserved(device),
    )


def free_memory(device: torch.device | None = None) -> tuple[int, int] | None:
    """(free, total) bytes on the GPU as the driver sees it (all processes), or None on the CPU.

    Under a GPU profile (`GPULAB_PROFILE`) the total is the profile's memory and the free part what this
    process may still reserve under that cap, so everything sized from it fits the emulated card.
    """
    device = device or pick_device()
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    facts = device_facts(device)
    if facts.profile and facts.memory_bytes is not None and facts.memory_bytes < total:
        total = facts.memory_bytes
        free = max(0, min(free, total - torch.cuda.memory_reserved(device)))
    return free, total


def usable_memory(device: torch.device | None = None) -> tuple[int, int] | None:
    """(usable, total) bytes for this process: the driver's free memory (`free_memory`) plus what PyTorch's
    caching allocator holds reserved but unallocated, which this process reuses without asking the driver.
    Sizing from the driver's free memory alone shrinks after any step has filled the cache (issue 40:
    notebook 10's budget, computed after its fp32 check, halved on a 15 GiB card). None on the CPU."""
    free = free_memory(device)
    if free is None:
        return None
    device = device or pick_device()
    cached = max(0, torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    return min(free[0] + cached, free[1]), free[1]


def release(device: torch.device | None = None) -> None:
    """Collect Python garbage, drop cuBLAS's cached workspaces and hand cached,
    unused blocks back to the driver."""
    gc.collect()
    device = device or pick_device()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        # cuBLAS keeps a workspace per stream (up to 32 MiB on Hopper) in the caching
        # allocator after the first matmul: library state, not a tensor anyone holds.
        clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear_workspaces is not None:
            clear_workspaces()
        torch.cuda.empty_cache()


@dataclass
class PeakReading:
    """Filled in by `track_peak` when its block ends (bytes)."""

    start: int | None = None
    end: int | None = None
    peak: int | None = None

    @property
    def peak_above_start(self) -> int | None:
        """The most memory the block used on top of what was allocated when it began."""
        return None if self.peak is None else self.peak - self.start


@contextlib.contextmanager
def track_peak(device: torch.device | None = None) -> Iterator[PeakReading]:
    """Measure the peak allocated memory of a block:

        with track_peak() as mem:
            loss = model(x).sum(); loss.backward()
        mem.peak_above_start   # bytes; None on the CPU
    """
    device = device or pick_device()
    reading = PeakReading()
    if device.type != "cuda":
        yield reading
        return
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    reading.start = torch.cuda.memory_allocated(device)
    try:
        yield reading
    finally:
        torch.cuda.synchronize(device)
        reading.end = torch.cuda.memory_allocated(device)
        reading.peak = torch.cuda.max_memory_allocated(device)


# -- what is allocated: the CUDA allocator, or (GPULAB_MEMORY_CPU=1) the live CPU tensors ----------------------
CPU_COUNT_ENV = "GPULAB_MEMORY_CPU"      # 1: on the CPU, "allocated" is the bytes of live CPU tensors' storages
STRICT_ENV = "GPULAB_MEMORY_STRICT"      # 1: a failed memory check raises MemoryNotReturned (tests, nbval)


def _env_on(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def counting_on_cpu() -> bool:
    """True under GPULAB_MEMORY_CPU=1: memory checks on the CPU count live CPU tensors (`counted_cpu_bytes`)."""
    return _env_on(CPU_COUNT_ENV)


def strict_by_default() -> bool:
    """True under GPULAB_MEMORY_STRICT=1: every `memory_guard` not given `strict` raises when its check fails."""
    return _env_on(STRICT_ENV)


def _key(device: torch.device) -> tuple[str, int]:
    if device.type != "cuda":
        return device.type, 0
    if device.index is not None:
        return "cuda", device.index
    return "cuda", torch.cuda.current_device() if torch.cuda.is_initialized() else 0


def _on(t: torch.Tensor, key: tuple[str, int]) -> bool:
    d = t.device
    return d.type == key[0] and (d.type != "cuda" or (d.index or 0) == key[1])


def _storage(t: torch.Tensor) -> tuple[int, int] | None:
    """(data pointer, bytes) of a tensor's storage; None where it has none to count (meta, sparse, a fake
    or functional wrapper, an empty one)."""
    try:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        return (ptr, st.nbytes()) if ptr else None
    except Exception:  # noqa: BLE001 - tensor kinds without a plain storage are not counted
        return None


_SAVED: dict[type, tuple[str, ...]] = {}     # autograd node type -> its saved-tensor attributes


def _graph_tensors(roots: Iterable[Any]) -> Iterator[torch.Tensor]:
    """The tensors the autograd graphs behind `roots` (grad_fn nodes) saved for backward: C++ holds them, so
    they are not among Python's objects, yet they are memory a kept `loss` keeps. Freed ones (after backward)
    raise on access and are skipped."""
    stack, seen = list(roots), {}
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node                        # kept alive while walking, so no id is reused
        names = _SAVED.get(type(node))
        if names is None:
            names = _SAVED[type(node)] = tuple(
                a for a in dir(type(node)) if a.startswith("_saved_") or a == "saved_tensors")
        for name in names:
            try:
                value = getattr(node, name)
            except Exception:  # noqa: BLE001 - freed by backward, or not a tensor attribute
                continue
            for v in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(v, torch.Tensor):
                    yield v
        stack.extend(n for n, _ in getattr(node, "next_functions", ()))


def _count(tensors: Iterable[torch.Tensor], key: tuple[str, int], found: dict[int, int],
           graphs: bool = True) -> dict[int, int]:
    """Add each tensor's storage on the device `key` to `found` (data pointer -> bytes), with its gradient and
    (`graphs`) what its autograd graph saved."""
    roots = []
    for t in tensors:
        try:
            grad = t.grad if t.is_leaf else None          # a non-leaf's .grad warns; it has none unless retained
            for u in (t, grad) if grad is not None else (t,):
                if _on(u, key):
                    s = _storage(u)
                    if s:
                        found[s[0]] = s[1]
            if graphs and t.grad_fn is not None:
                roots.append(t.grad_fn)
        except Exception:  # noqa: BLE001 - a tensor subclass without these attributes counts nothing
            continue
    if roots:
        _count(_graph_tensors(roots), key, found, graphs=False)     # one walk covers every node they reach
    return found


def _tensor_types() -> set[type]:
    """torch.Tensor and every subclass defined so far (Parameter, Buffer, ...)."""
    found, todo = set(), [torch.Tensor]
    while todo:
        t = todo.pop()
        if t not in found:
            found.add(t)
            todo += t.__subclasses__()
    return found


def _live_tensors() -> Iterator[torch.Tensor]:
    """Every tensor among Python's objects. The filter runs in C (map, compress): a Python loop over a
    notebook kernel's few hundred thousand objects took most of a check's time. type(), not isinstance: some
    objects' __class__ warns when read."""
    objs = gc.get_objects()
    return itertools.compress(objs, map(_tensor_types().__contains__, map(type, objs)))


def counted_cpu_bytes() -> int:
    """Bytes of the storages of every live CPU tensor Python can reach (found through `gc.get_objects()`),
    their gradients and what live autograd graphs saved, each storage counted once by its data pointer: the
    memory checks' "allocated" on the CPU under GPULAB_MEMORY_CPU=1. At the tiny size it stands for what a
    GPU run holds on the device. Not counted: tensors held only from C++ with no graph reachable from Python
    (the JIT's or a compiled graph's internals)."""
    return sum(_count(_live_tensors(), ("cpu", 0), {}).values())


def allocated_now(device: torch.device | None = None) -> int | None:
    """What the memory checks read as allocated: the CUDA allocator's bytes on a GPU; on the CPU, under
    GPULAB_MEMORY_CPU=1, `counted_cpu_bytes()`; else None (nothing to read)."""
    device = device or pick_device()
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    if device.type == "cpu" and counting_on_cpu():
        return counted_cpu_bytes()
    return None


def kept_bytes(keeps: Iterable[Any], device: torch.device | None = None) -> dict[int, int]:
    """The storages on `device` (data pointer -> bytes, each once) that `keeps` holds: tensors (with their
    gradients and saved graphs), modules (parameters and buffers), optimizers (their state), and mappings,
    sequences, functions (their closures) or plain objects holding them (searched a few levels deep).
    Storages on another device count nothing: a host-side dataset declared kept is free on a GPU."""
    key = _key(device or pick_device())
    tensors, seen, stack = [], set(), [(k, 0) for k in keeps]
    while stack:
        obj, depth = stack.pop()
        if obj is None or id(obj) in seen or depth > 6 or isinstance(obj, (str, bytes, int, float, type)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            tensors.append(obj)
        elif isinstance(obj, torch.nn.Module):
            tensors += [*obj.parameters(), *obj.buffers()]
        elif isinstance(obj, torch.optim.Optimizer):
            stack += [(v, depth + 1) for v in obj.state.values()]
            stack += [(g["params"], depth + 1) for g in obj.param_groups]
        elif isinstance(obj, dict):
            stack += [(v, depth + 1) for v in obj.values()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack += [(v, depth + 1) for v in obj]
        elif isinstance(obj, types.FunctionType):              # a step function: what its closure holds
            for c in obj.__closure__ or ():
                with contextlib.suppress(ValueError):          # an empty cell
                    stack.append((c.cell_contents, depth + 1))
        elif isinstance(obj, types.MethodType):
            stack.append((obj.__self__, depth + 1))
        elif hasattr(obj, "__dict__") and not isinstance(obj, types.ModuleType):
            stack += [(v, depth + 1) for v in vars(obj).values()]
    return at_block_sizes(_count(tensors, key, {}), key)


def at_block_sizes(found: dict[int, int], key: tuple[str, int]) -> dict[int, int]:
    """`found` (data pointer -> bytes) with each CUDA storage counted at the size of the allocator's block that
    holds it, which is what `torch.cuda.memory_allocated` counts: a request is rounded up to 512 B, and a large
    block is not split when 1 MiB or less would remain (three 325.1 MiB matrices hold 326 MiB each). Counting
    `nbytes` left those few MiB looking held and undeclared. Storages not found in the snapshot keep their bytes."""
    if key[0] != "cuda" or not found:
        return found
    try:
        segments = torch.cuda.memory_snapshot()
    except Exception:  # noqa: BLE001 - no snapshot (no CUDA, an allocator without one): the storages' own bytes
        return found
    blocks = {b["address"]: b["size"] for seg in segments if seg.get("device", key[1]) == key[1]
              for b in seg.get("blocks", ()) if b.get("state") == "active_allocated" and "address" in b}
    return {ptr: max(n, blocks.get(ptr, n)) for ptr, n in found.items()}


# -- the notebook's start -------------------------------------------------------------------------------------
_start: dict[tuple[str, int], int] = {}


def notebook_start(device: torch.device | None = None) -> int | None:
    """Record what is allocated now as the notebook's start, the level every later memory check compares
    with (with what the notebook declares it keeps). `lesson.start()`, in each notebook's first cell, calls
    it after the notebook's imports; a fresh process records it when this module is first imported.
    Returns the bytes, None where nothing can be read. CUDA is not initialised to read it: where it is not,
    nothing is allocated (0)."""
    device = device or pick_device()
    if device.type == "cuda":
        if not torch.cuda.is_initialized():
            _start.update({("cuda", i): 0 for i in range(torch.cuda.device_count())})
            return 0
        release(device)
        _start.update({("cuda", i): torch.cuda.memory_allocated(i) for i in range(torch.cuda.device_count())})
        return _start[_key(device)]
    if device.type != "cpu" or not counting_on_cpu():
        return None
    gc.collect()
    _start[_key(device)] = counted_cpu_bytes()
    return _start[_key(device)]


def started_at(device: torch.device | None = None) -> int | None:
    """The notebook's start on `device` (`notebook_start`); on a GPU 0 where none was recorded (CUDA was not
    initialised when this module was imported); None where none was recorded on the CPU."""
    key = _key(device or pick_device())
    return _start.get(key, 0 if key[0] == "cuda" else None)


def _start_at_import() -> None:
    if torch.cuda.is_initialized():
        _start.update({("cuda", i): torch.cuda.memory_allocated(i) for i in range(torch.cuda.device_count())})
    if counting_on_cpu():
        _start[("cpu", 0)] = counted_cpu_bytes()


_start_at_import()


# -- the memory check -----------------------------------------------------------------------------------------
@dataclass
class GuardReport:
    """What `memory_guard` found when its block ended (bytes; None where nothing could be read)."""

    before: int | None = None       # allocated when the block began
    after: int | None = None        # allocated when it ended
    tolerance: int = 0
    start: int | None = None        # the notebook's start; None: not compared (a nested or quiet guard)
    kept: int = 0                   # declared kept at the end (`keeps=` and `keep()`), on this device
    kept_new: int = 0               # of which not held by the declared keeps when the block began
    planted: int = 0                # the planted-leak test's bytes (`plant_leak`), left out of the verdict
    what: str = "GPU memory"
    block: bool = True              # False for `notebook_check`: no block, only the notebook's start
    kept_objects: list = field(default_factory=list, repr=False, compare=False)

    def keep(self, *objs: Any) -> None:
        """Declare objects this block makes and the notebook keeps on purpose after it (a model, its
        optimizer): their memory is allowed at this check. Made before the block? Pass them as `keeps=`."""
        self.kept_objects.extend(objs)

    @property
    def leaked(self) -> int | None:
        """Bytes allocated after the block that were not before and are not declared kept (None when
        nothing was read)."""
        return None if self.before is None else self.after - self.before - self.kept_new

    @property
    def held(self) -> int | None:
        """Bytes allocated at the end beyond the notebook's start and the declared keeps (and a planted leak)
        (None: not compared)."""
        return None if self.start is None or self.after is None else self.after - self.start - self.kept - self.planted

    @property
    def block_ok(self) -> bool:
        return self.leaked is None or self.leaked <= self.tolerance

    @property
    def start_ok(self) -> bool:
        return self.held is None or self.held <= self.tolerance

    @property
    def ok(self) -> bool:
        return self.block_ok and self.start_ok

    def message(self) -> str:
        if self.leaked is None:
            return "memory check: skipped on the CPU (no CUDA allocator to read)."
        f = fmt_bytes
        kept = (f"; {f(self.kept)} declared kept" if self.kept else "") + (
            f"; {f(self.planted)} planted by the test, left out" if self.planted else "")
        if self.ok:
            now = f"back to {f(self.after)}" if self.after - self.before <= self.tolerance else f(self.after)
            if self.start is None:
                return f"memory check: {now} allocated (started at {f(self.before)}{kept})."
            if not self.block:
                but = " but what it declares kept" if self.kept and self.after - self.start > self.tolerance else ""
                return (f"memory check: nothing held since the notebook's start{but}: {f(self.after)} allocated, "
                        f"{f(self.start)} at the start{kept}.")
            return (f"memory check: {now} allocated (the block started at {f(self.before)}, "
                    f"the notebook at {f(self.start)}{kept}).")
        earlier = (f"{f(self.held)} more than at the notebook's start {{}} still allocated ({f(self.after)} now, "
                   f"{f(self.start)} at the start{kept}): held since an earlier cell, not declared as kept. "
                   "Delete what an earlier cell left bound (a model, an optimizer, a list of results, a loss "
                   "with its graph) or, where the notebook keeps it on purpose, declare it: "
                   "memory_guard(keeps=(model, optimizer)).")
        if self.block_ok:
            lead = "this block returned what it took, but " if self.block else ""
            return "memory check: " + lead + earlier.format("are")
        text = (f"memory check: {f(self.leaked)} of {self.what} was NOT returned ({f(self.before)} before, "
                f"{f(self.after)} after" + (f", {f(self.kept_new)} of it declared kept" if self.kept_new else "")
                + "). Something still holds tensors: a list or global that kept results, a model not deleted, "
                "or the last exception (sys.last_traceback) keeping a frame alive.")
        if self.held is not None and self.held - self.leaked > self.tolerance:
            text += (f" Besides, {f(self.held - self.leaked)} more than at the notebook's start were already "
                     f"allocated when the block began ({f(self.start)} at the start{kept}): held since an earlier "
                     "cell, not declared as kept.")
        return text


class MemoryNotReturned(RuntimeError):
    """Raised by a strict `memory_guard` (`strict=True` or GPULAB_MEMORY_STRICT=1) when its check fails."""


class PlantNotSeen(AssertionError):
    """Raised by a memory check that compares with the notebook's start but did not count the planted leak."""


# -- the planted-leak test ------------------------------------------------------------------------------------
_planted: dict[tuple[str, int], list[torch.Tensor]] = {}


def plant_leak(nbytes: int, device: torch.device | None = None) -> int:
    """The planted-leak test (issue 40, item 2): leave `nbytes` allocated on the course's device for the rest
    of this process, as a cell that forgot a tensor would. The notebooks' test run plants one right after each
    notebook's first cell (conftest.py, GPULAB_MEMORY_PLANT). Every check that compares with the notebook's
    start must count it, or raises PlantNotSeen; it then says so and leaves it out of its verdict
    (`GuardReport.planted`), so the same run still checks everything else. Returns the bytes planted."""
    device = device or pick_device()
    _planted.setdefault(_key(device), []).append(torch.ones(nbytes, dtype=torch.uint8, device=device))
    return nbytes


def planted_bytes(device: torch.device | None = None) -> int:
    return sum(t.numel() for t in _planted.get(_key(device or pick_device()), ()))


# What a check lets pass by default. On a GPU 1 MiB: the allocator rounds each block up (to 512 B, and 2 MiB
# segments), and libraries keep small state there. The CPU count is exact, in bytes of storages, and a tiny
# run's tensors are KiB, not MiB: any tensor left counts.
TOLERANCE = {"cuda": 1 * MiB, "cpu": 0}

_nesting = threading.local()     # how many memory_guard blocks this thread is inside


@contextlib.contextmanager
def memory_guard(tolerance_bytes: int | None = None, strict: bool | None = None, quiet: bool = False,
                 device: torch.device | None = None, keeps: Iterable[Any] = (),
                 since_start: bool | None = None) -> Iterator[GuardReport]:
    """The memory check: on exit it collects garbage and empties the cache, then fails

    - if the block did not give back what it took (allocated now against the block's start), or
    - if more is allocated than at the notebook's start (`notebook_start`) plus what the notebook declares
      it keeps: `keeps=(model, optimizer)` for objects held from earlier cells, `report.keep(obj)` for
      objects the block makes and leaves alive on purpose. Memory an earlier cell left behind fails every
      later check until it is released or declared.

        with memory_guard(keeps=(model,)) as mem:
            run_experiment(model)
            mem.keep(optimizer)
        # prints "memory check: back to ..." or what was not returned, and why

    `since_start`: compare with the notebook's start; by default only the outermost guard that prints
    does (a guard inside another guard's block, or a quiet one that a function reads for its caller,
    checks its own block). `strict=True` raises MemoryNotReturned instead of printing; by default strict
    under GPULAB_MEMORY_STRICT=1. A block that raised is not masked: its exception goes on, the check is
    printed. Within `tolerance_bytes` counts as returned (default `TOLERANCE`).

    On the CPU the check is skipped, or under GPULAB_MEMORY_CPU=1 counts CPU tensors (`counted_cpu_bytes`) in
    the checks that compare with the notebook's start; the others, a function's own block checks, stay
    skipped there: each count scans every object of the kernel (0.05 to 0.15 s in a notebook), and whatever
    such a block leaves behind still fails the notebook's next check. The count collects garbage only when a
    reading would fail (a pass without collecting is a pass); on a GPU the cache is emptied both times.
    """
    device = device or pick_device()
    depth = getattr(_nesting, "depth", 0)
    compare = (depth == 0 and not quiet) if since_start is None else since_start
    counted = device.type == "cpu" and counting_on_cpu() and compare
    readable = device.type == "cuda" or counted
    report = GuardReport(tolerance=TOLERANCE.get(device.type, MiB) if tolerance_bytes is None else tolerance_bytes,
                         kept_objects=list(keeps),
                         what="GPU memory" if device.type == "cuda" else "memory (CPU tensors counted)")
    entry: set[int] = set()
    if readable:
        if not counted:
            release(device)
        report.before = allocated_now(device)
        entry = set(kept_bytes(report.kept_objects, device))
        if compare:
            report.start = started_at(device)
            report.planted = planted_bytes(device) if report.start is not None else 0
    raised = False
    _nesting.depth = depth + 1
    try:
        yield report
    except BaseException:
        raised = True
        raise
    finally:
        _nesting.depth = depth
        if readable:
            if not counted:
                release(device)
            report.after = allocated_now(device)
            kept = kept_bytes(report.kept_objects, device)
            report.kept = sum(kept.values())
            report.kept_new = sum(b for p, b in kept.items() if p not in entry)
            if counted and not report.ok:       # garbage may hold tensors: collect, then read again
                release(device)
                report.after = allocated_now(device)
        report.kept_objects.clear()              # the report must not keep the notebook's objects alive
        if not raised:
            _raise_if_failed(report, strict_by_default() if strict is None else strict)
        if not quiet:
            print(report.message(), file=sys.stdout)


def _raise_if_failed(report: GuardReport, strict: bool) -> None:
    if report.planted and report.held is not None and report.held < 0:       # fewer bytes than the plant
        raise PlantNotSeen(
            f"memory check: the planted leak of {fmt_bytes(report.planted)} was not seen: "
            f"{fmt_bytes(report.held + report.planted)} above the notebook's start ({fmt_bytes(report.start)}), "
            f"{fmt_bytes(report.kept)} declared kept. This check does not compare with what was allocated when "
            "the notebook began, or a declared keep holds the planted tensor.")
    if strict and not report.ok:
        raise MemoryNotReturned(report.message())


def notebook_check(keeps: Iterable[Any] = (), tolerance_bytes: int | None = None, quiet: bool = False,
                   strict: bool | None = None, device: torch.device | None = None) -> GuardReport:
    """The notebook's last memory check (its "What you saw" cell): releases what nothing holds and compares
    what is allocated with the notebook's start plus `keeps`. Prints, or raises as `memory_guard` does."""
    with memory_guard(tolerance_bytes, strict=False, quiet=True, device=device, keeps=keeps,
                      since_start=True) as report:
        pass
    report.block = False
    _raise_if_failed(report, strict_by_default() if strict is None else strict)
    if not quiet:
        print(report.message(), file=sys.stdout)
    return report
