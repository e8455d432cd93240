"""The neutral event model `diagnose` reads, and the parser that fills it from `torch.profiler`.

Every rule sees a flat list of `Event`s: GPU work ("gpu": kernels, copies, memsets), CPU-side ranges
("op": aten ops and `record_function` ranges) and CUDA runtime/driver calls on the host ("runtime").
Unit tests build such lists by hand; `from_profiler(prof)` builds them from a finished profile.

How torch links a kernel to the code that launched it (read from torch's own
`torch/autograd/profiler.py::_parse_kineto_results` and `profiler_kineto.cpp`):

- every aten op / `record_function` range has a `correlation_id` of its own;
- a GPU kernel and the runtime call that launched it (`cudaLaunchKernel`, `cudaMemcpyAsync`, ...)
  share one CUPTI `correlation_id`;
- both carry `linked_correlation_id`: the `correlation_id` of the innermost aten op that was running on
  the host when the launch happened (0 when none was).

The parser is a pure function of `Record`s (one per `_KinetoEvent`, plain values only), so a test can
feed it fake kineto-like records for GPU kernels on a machine without a GPU. Whatever it does not
recognise it keeps with an empty op name rather than guessing.
"""
from __future__ import annotations

import json
import os
import re
import site as site_module
import sys
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

GPU, OP, RUNTIME, PY = "gpu", "op", "runtime", "py"
KINDS = (GPU, OP, RUNTIME, PY)
# A Python frame taken from the profiler's event tree (with_stack=True): our own activity name for it.
# kineto's own "python_function" records carry no call-site lines and are dropped.
PY_FRAME = "python_frame"


STEP_RANGE = "gpulab.step"      # the record_function range diagnose() puts around each profiled step
DATA_RANGE = "gpulab.data"      # a range a learner may put around their own batch fetching


@dataclass(frozen=True)
class Event:
    """One thing that happened during the profiled steps, in microseconds from the trace's start."""

    kind: str        # "gpu" (kernel, memcpy, memset on the device), "op" (a CPU-side aten op or
                     # record_function range), "runtime" (a CUDA runtime/driver call on the host),
                     # "py" (a Python frame: a function of the user's code, or a call from it into a library)
    name: str
    start_us: float
    end_us: float
    stream: int = 0              # gpu: the stream; host: the thread
    op: str = ""                 # gpu: the aten op that launched it ("" if unknown)
    shapes: tuple = ()           # op: recorded input shapes
    dtypes: tuple = ()           # op: recorded input dtypes (strings, e.g. "float", "c10::BFloat16")
    flops: float = 0.0           # op: profiler with_flops count (mm/addmm/bmm/conv)
    nbytes: int = 0              # gpu memcpy: bytes if known
    corr: int = 0                # gpu, runtime: the CUDA correlation id shared by a kernel and its launch
                                 # call; op: the op's own id (0 if unknown)
    op_id: int = 0               # gpu, runtime: the `corr` of the op that launched it (0 if unknown)
    tf32: bool | None = None     # op: whether cuBLAS could use TF32 when it ran (None if unknown)
    site: tuple = ()             # op, py: (file, line, function) of the innermost line of the user's code that
                                 # led to it (`Site`); () if unknown or none (see `is_user_file`)
    via: tuple = ()              # op: the innermost Python line of any file (a library's, e.g. GradScaler's)
    code: tuple = ()             # py: (file, first line, name) of the function the frame runs; () for a C call
    user: bool = False           # py: the frame's time is the user's own work (see `frame_records`)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Event kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.end_us < self.start_us:
            raise ValueError(f"Event {self.name!r} ends ({self.end_us}) before it starts ({self.start_us})")

    @property
    def dur_us(self) -> float:
        return self.end_us - self.start_us


# -- records: what the parser reads ---------------------------------------------------------------
@dataclass(frozen=True)
class Record:
    """One profiler event as plain values (the `_KinetoEvent` accessors of the same names)."""

    name: str
    device_type: str             # "cpu" or "cuda" (torch's DeviceType of the event)
    activity: str                # kineto's activity type ("kernel", "cpu_op", "cuda_runtime", ...); "" unknown
    start_ns: int
    end_ns: int
    thread: int = 0              # start_thread_id(): the host thread (for runtime calls: their op's)
    resource: int = 0            # device_resource_id(): the stream for GPU work
    correlation_id: int = 0
    linked_correlation_id: int = 0
    shapes: tuple = ()
    dtypes: tuple = ()
    flops: float = 0.0
    metadata: str = ""           # metadata_json(), where torch fills it (memcpy bytes)
    nbytes: int = 0              # nbytes(), where this torch build has it (a copy's bytes)
    user_annotation: bool = False  # is_user_annotation(): a record_function range (host or its GPU copy)
    tf32: bool | None = None     # an op's allow_tf32_cublas, from the profiler's event tree
    site: tuple = ()             # an op's or Python frame's call site in the user's code, from the event tree
    via: tuple = ()              # an op's innermost Python call site of any file
    code: tuple = ()             # a Python frame's function (file, first line, name)
    user: bool = False           # a Python frame that is the user's own work


# kineto's ActivityType enum (libkineto/include/ActivityType.h). torch 2.13 reports the name, older
# builds the number; the first twelve have kept their numbers since kineto began.
ACTIVITY_NAMES = ("cpu_op", "user_annotation", "gpu_user_annotation", "gpu_memcpy", "gpu_memset", "kernel",
                  "external_correlation", "cuda_runtime", "cuda_driver", "cpu_instant_event",
                  "python_function", "overhead")
DEVICE_WORK = {"gpu_memcpy", "gpu_memset", "kernel"}      # what occupies the GPU: counted as busy
HOST_RANGES = {"cpu_op", "user_annotation"}
HOST_CALLS = {"cuda_runtime", "cuda_driver"}
# Device-side entries that are not work: the GPU copy of a record_function range
# ("gpu_user_annotation"), CUPTI's "cuda_sync" waits, profiler ranges. They must not count as busy.
NOT_WORK_NAMES = ("Stream Sync", "Event Sync", "Context Sync", "Stream Wait Event", "Unknown Sync")


def activity_name(value) -> str:
    """kineto's activity type as its name: from a name, a number or an enum member; "" if unknown."""
    if value is None:
        return ""
    if isinstance(value, int):
        return ACTIVITY_NAMES[value] if 0 <= value < len(ACTIVITY_NAMES) else ""
    text = str(getattr(value, "name", value)).strip().lower().rsplit(".", 1)[-1]
    return "kernel" if text == "concurrent_kernel" else text      # the enum's name for "kernel"


def _call(obj, name: str, default=None):
    fn = getattr(obj, name, None)
    if fn is None:
        return default
    try:
        return fn()
    except Exception:      # noqa: BLE001 - an accessor this torch build lacks or cannot answer
        return default


def _device(value) -> str:
    text = str(getattr(value, "name", value)).lower()
    return "cuda" if "cuda" in text else "cpu"


def records_from_profiler(prof) -> tuple[list[Record], int]:
    """(records, trace start in ns) of a finished `torch.profiler.profile`, read through
    `prof.profiler.kineto_results.events()`; each accessor is optional (defaults when absent). With
    `with_stack=True` the profiler's event tree adds each op's call site and the Python frames of the
    user's code (`tree_facts`)."""
    inner = getattr(prof, "profiler", prof)
    results = getattr(inner, "kineto_results", None)
    if results is None:
        raise ValueError("no profiler results to read: pass a torch.profiler.profile that has finished "
                         "(left its `with` block or had .stop() called)")
    global TREE_ERROR
    try:
        tf32, sites, frames = tree_facts(_call(results, "experimental_event_tree", ()) or ())
        TREE_ERROR = ""
    except Exception as err:      # noqa: BLE001 - the call sites are extra: the profile stands without them
        tf32, sites, frames = {}, {}, []
        TREE_ERROR = f"the profiler's event tree could not be read ({type(err).__name__}: {err}): no call sites"
    records = []
    for e in results.events():
        start = int(_call(e, "start_ns", 0) or 0)
        end = _call(e, "end_ns")
        if end is None:
            end = start + int(_call(e, "duration_ns", 0) or 0)
        name = str(_call(e, "name", ""))
        user_site, via = sites.get((name, start), ((), ()))
        records.append(Record(
            name=name, device_type=_device(_call(e, "device_type", "cpu")),
            activity=activity_name(_call(e, "activity_type")), start_ns=start, end_ns=int(end),
            thread=int(_call(e, "start_thread_id", 0) or 0), resource=int(_call(e, "device_resource_id", 0) or 0),
            correlation_id=int(_call(e, "correlation_id", 0) or 0),
            linked_correlation_id=int(_call(e, "linked_correlation_id", 0) or 0),
            shapes=_shapes(_call(e, "shapes", ())), dtypes=tuple(str(d) for d in (_call(e, "dtypes", ()) or ())),
            flops=float(_call(e, "flops", 0) or 0), metadata=str(_call(e, "metadata_json", "") or ""),
            nbytes=int(_call(e, "nbytes", 0) or 0),
            user_annotation=bool(_call(e, "is_user_annotation", False)),
            tf32=tf32.get((name, start)), site=user_site, via=via))
    return records + frames, int(_call(results, "trace_start_ns", 0) or 0)


TREE_ERROR = ""      # why the last profile's event tree gave no call sites ("" when it did)


# -- the user's code, and where in it things happened ----------------------------------------------------
# gpulab's own harness: its frames are not the learner's code (the lessons and models are: they are the
# training code notebook 15 diagnoses, as a learner's own would be).
HARNESS = tuple(os.path.join("gpulab", part) + os.sep for part in ("diagnose", "core", "notebook", "tools"))


@lru_cache(maxsize=None)
def _library_roots() -> tuple[str, ...]:
    """Folders whose files are libraries, not the user's code: the standard library, site-packages."""
    roots = set()
    paths = sysconfig.get_paths()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        if paths.get(key):
            roots.add(os.path.realpath(paths[key]))
    try:
        roots.update(os.path.realpath(p) for p in site_module.getsitepackages())
    except AttributeError:          # some virtualenvs' site module lacks it
        pass
    for p in sys.path:
        if p and os.path.basename(p.rstrip(os.sep)) in ("site-packages", "dist-packages"):
            roots.add(os.path.realpath(p))
    return tuple(sorted(roots))


@lru_cache(maxsize=4096)
def resolve_file(name: str) -> str:
    """The path of a file as the profiler names it: torch shortens a file's path by the sys.path entry
    it was found under ("torch/nn/modules/module.py", "train.py"); the first entry holding it."""
    if not name or name.startswith("<") or os.path.isabs(name):
        return name
    for base in sys.path:
        candidate = os.path.join(base or os.getcwd(), name)
        if os.path.exists(candidate):
            return os.path.realpath(candidate)
    return name


@lru_cache(maxsize=4096)
def is_user_file(name: str) -> bool:
    """Whether a Python file is the user's own code: not the standard library, not an installed package
    (site-packages: torch, numpy...), not frozen or generated code ("<...>"), not gpulab's harness."""
    if not name or name.startswith("<"):
        return False
    path = resolve_file(name)
    if not os.path.isabs(path):            # not found on sys.path: an installed library's shortened name
        return False
    real = os.path.realpath(path)
    if any(real == root or real.startswith(root + os.sep) for root in _library_roots()):
        return False
    return not any(h in real for h in HARNESS)


def fmt_site(site: tuple) -> str:
    """(file, line, function) as "train.py:12 (make_batch)"; "" for ()."""
    if not site:
        return ""
    file, line, func = site
    return f"{os.path.basename(file) if os.path.isabs(file) else file}:{line}" + (f" ({func})" if func else "")


def _site(frame_state) -> tuple:
    return (str(getattr(frame_state, "file_name", "")), int(getattr(frame_state, "line_number", 0) or 0),
            str(getattr(frame_state, "function_name", "")))


_C_NAME = re.compile(r"<built-in (?:method|function) (\w+)(?: of (.*?) (?:object|type object) at 0x[0-9a-f]+)?>")


def c_call_name(name: str) -> str:
    """A C function as the profiler names it, shorter: "<built-in method astype of numpy.ndarray object at
    0x7f..>" -> "astype (numpy.ndarray)"."""
    m = _C_NAME.match(name)
    if not m:
        return name
    return m.group(1) + (f" ({m.group(2)})" if m.group(2) else "")


def _kind(node) -> str:
    return type(getattr(node, "extra_fields", None)).__name__


def _contains_op(node) -> bool:
    todo = list(getattr(node, "children", ()) or ())
    while todo:
        n = todo.pop()
        if _kind(n) == "_ExtraFields_TorchOp":
            return True
        todo.extend(getattr(n, "children", ()) or ())
    return False


# Python frames shorter than this are not kept: their time counts in the frame around them (a tokenizer's
# millions of `str.lower()` calls would otherwise outnumber everything else in the profile), and a line
# that costs the step anything is called from a frame that lasts longer.
FRAME_MIN_US = 20.0
# Library frames kept wherever they are called from: nn.DataParallel's forward (lesson 14), which the
# module machinery calls, not the user's line.
KEPT_LIBRARY_FRAMES = ("nn/parallel/data_parallel.py",)


def tree_facts(roots) -> tuple[dict, dict, list[Record]]:
    """From the profiler's event tree: ({(op name, start ns): allow_tf32_cublas}, {(op name, start ns):
    (user site, via)}, the Python frame records).

    - tf32: whether cuBLAS could use TF32 when each op ran (a step may switch it itself).
    - sites: for every op, the innermost line of the user's code on its Python stack (the line a learner
      can change) and the innermost line of any file (GradScaler's `.item()` is in torch/amp, called from
      the user's `scaler.step(opt)`). Needs `with_stack=True`; without it both are ().
    - frames: the Python frames the analysis reads (activity PY_FRAME): every call of a function defined
      in the user's code, every call the user's code makes into a library (`model(x)`, `opt.step()`,
      numpy's `astype`), nothing deeper inside libraries. `user` is True for the user's own functions and
      for calls into C code that runs no PyTorch op (numpy, a dict, `gc.collect`): time the host spends
      on the user's own work. A call that runs ops (`x.to(device)`, `model(x)`) is PyTorch's work."""
    tf32, sites, frames = {}, {}, []
    todo = [(n, (), ()) for n in roots]
    while todo:
        n, user_site, any_site = todo.pop()
        kind, ef = _kind(n), getattr(n, "extra_fields", None)
        start, end = int(getattr(n, "start_time_ns", 0) or 0), int(getattr(n, "end_time_ns", 0) or 0)
        thread = int(getattr(n, "start_tid", 0) or 0)
        if kind == "_ExtraFields_PyCall":
            caller, code = _site(ef.caller), _site(ef.callsite)
            any_site = caller
            caller_user, code_user = is_user_file(caller[0]), is_user_file(code[0])
            if caller_user:
                user_site = caller
            kept = caller_user or code_user or code[0].replace(os.sep, "/").endswith(KEPT_LIBRARY_FRAMES)
            if kept and end - start >= FRAME_MIN_US * 1e3:
                frames.append(Record(code[2], "cpu", PY_FRAME, start, max(end, start), thread=thread, site=caller,
                                     code=code, user=code_user))
        elif kind == "_ExtraFields_PyCCall":
            caller = _site(ef.caller)
            any_site = caller
            if is_user_file(caller[0]):
                user_site = caller
                if end - start >= FRAME_MIN_US * 1e3:
                        frames.append(Record(c_call_name(str(n.name)), "cpu", PY_FRAME, start, max(end, start),
                                         thread=thread, site=caller, user=not _contains_op(n)))
        elif kind == "_ExtraFields_TorchOp":
            key = (str(n.name), start)
            sites[key] = (user_site, any_site)
            flag = getattr(ef, "allow_tf32_cublas", None)
            if flag is not None:
                tf32[key] = bool(flag)
        todo.extend((c, user_site, any_site) for c in getattr(n, "children", ()) or ())
    return tf32, sites, frames


def _shapes(shapes) -> tuple:
    out = []
    for s in shapes or ():
        try:
            out.append(tuple(int(d) for d in s))
        except (TypeError, ValueError):
            out.append(())
    return tuple(out)


# -- the parser ------------------------------------------------------------------------------------
def record_kind(r: Record) -> str | None:
    """"gpu", "op", "runtime", or None for what the rules do not read (memory events, Python frames,
    device-side annotations and syncs). Uses kineto's activity type; where this torch build does not
    report it (its `_KinetoEvent` has no `activity_type`), the name, the device and the ids."""
    if r.activity == PY_FRAME:
        return PY
    if r.device_type == "cuda":
        if r.activity:
            return GPU if r.activity in DEVICE_WORK else None
        return None if r.user_annotation or r.name in NOT_WORK_NAMES else GPU
    if r.activity in HOST_CALLS:
        return RUNTIME
    if r.activity in HOST_RANGES:
        return OP
    if r.activity:
        return None
    if r.user_annotation:
        return OP
    if not r.correlation_id or r.name.startswith(("[", "<built-in")):
        return None      # memory events, Python frames, CUPTI's overhead records: no id of their own
    return RUNTIME if is_runtime_name(r.name) else OP


def is_runtime_name(name: str) -> bool:
    """A CUDA runtime (`cudaLaunchKernel`) or driver (`cuLaunchKernel`) call, by its name."""
    return name.startswith("cuda") or (name.startswith("cu") and name[2:3].isupper())


def _nbytes(metadata: str) -> int:
    if not metadata or "bytes" not in metadata.lower():
        return 0
    try:
        data = json.loads(metadata if metadata.lstrip().startswith("{") else "{" + metadata + "}")
    except ValueError:
        return 0
    for key, value in data.items():
        if key.lower() == "bytes":
            try:
                return int(value)
            except (TypeError, ValueError):
                return 0
    return 0


def parse(records: Iterable[Record], trace_start_ns: int | None = None) -> list[Event]:
    """Events from records, sorted by start; times in us from `trace_start_ns` (default: the first record).

    Each GPU event's `op` is the name of the op its `linked_correlation_id` names; where the kernel has
    none, its launch call's (same `correlation_id`); where that has none either, the innermost op running
    on the launch call's thread when it started. Unknown stays "".
    """
    kept = [(r, record_kind(r)) for r in records]
    kept = [(r, k) for r, k in kept if k is not None]
    # without activity types, a device-side copy of a record_function range has its host range's name. A
    # kernel can share a host range's name too and is still work: inductor wraps each Triton launch in a
    # range named after its kernel ("triton_poi_fused_gelu_8"), so a GPU row is dropped for its name only
    # where no launch call has its correlation id (on the H200, torch 2.11, 2026-12-02, dropping by name
    # alone lost 12 ms per step of the compiled capstone GPT's kernels: busy 43.6 of 54.7 ms read as 80 %)
    host_names = {r.name for r, k in kept if k == OP}
    launched = {r.correlation_id for r, k in kept if k == RUNTIME and r.correlation_id}
    kept = [(r, k) for r, k in kept if not (k == GPU and not r.activity and r.name in host_names
                                             and r.correlation_id not in launched)]
    if not kept:
        return []
    t0 = min(r.start_ns for r, _ in kept) if trace_start_ns is None else trace_start_ns
    ops = {r.correlation_id: r for r, k in kept if k == OP and r.correlation_id}
    calls = {r.correlation_id: r for r, k in kept if k == RUNTIME and r.correlation_id}
    op_ranges = _ranges_by_thread([r for r, k in kept if k == OP])

    def launching_op(r: Record) -> int:
        if r.linked_correlation_id in ops:
            return r.linked_correlation_id
        call = calls.get(r.correlation_id) if r.device_type == "cuda" else r
        if call is None:
            return 0
        if call.linked_correlation_id in ops:
            return call.linked_correlation_id
        return _innermost(op_ranges.get(call.thread, ()), call.start_ns)

    def us(ns: int) -> float:
        return (ns - t0) / 1e3

    events = []
    for r, kind in kept:
        end = max(r.end_ns, r.start_ns)
        if kind == OP:
            events.append(Event(OP, r.name, us(r.start_ns), us(end), stream=r.thread, shapes=r.shapes,
                                dtypes=r.dtypes, flops=r.flops, corr=r.correlation_id, tf32=r.tf32, site=r.site,
                                via=r.via))
            continue
        if kind == PY:
            events.append(Event(PY, r.name, us(r.start_ns), us(end), stream=r.thread, site=r.site, code=r.code,
                                user=r.user))
            continue
        op_id = launching_op(r)
        op = ops[op_id].name if op_id in ops else ""
        if kind == GPU:
            nbytes = r.nbytes or _nbytes(r.metadata) or (_copy_bytes(ops[op_id]) if op_id in ops and
                                                          r.name.lower().startswith("memcpy") else 0)
            events.append(Event(GPU, r.name, us(r.start_ns), us(end), stream=r.resource, op=op,
                                nbytes=nbytes, corr=r.correlation_id, op_id=op_id))
        else:
            events.append(Event(RUNTIME, r.name, us(r.start_ns), us(end), stream=r.thread, op=op,
                                corr=r.correlation_id, op_id=op_id))
    events.sort(key=lambda e: (e.start_us, -e.end_us))
    return events


DTYPE_BYTES = {"float": 4, "double": 8, "c10::half": 2, "c10::bfloat16": 2, "long int": 8, "int": 4,
               "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::float8_e4m3fn": 1,
               "c10::float8_e5m2": 1}


def _copy_bytes(op: Record) -> int:
    """The bytes a copy op moved, from its recorded input shapes and dtypes (its first tensor input),
    where the trace does not say: 0 when the op recorded neither."""
    for shape, dtype in zip(op.shapes, op.dtypes):
        size = DTYPE_BYTES.get(str(dtype).lower())
        if size:                         # a tensor (a 0-d one records the shape []: one element)
            n = 1
            for d in shape:
                n *= d
            return max(n, 1) * size
    return 0


def _ranges_by_thread(ops: list[Record]) -> dict[int, list[Record]]:
    out: dict[int, list[Record]] = {}
    for r in ops:
        out.setdefault(r.thread, []).append(r)
    return out


def _innermost(ops: Iterable[Record], t_ns: int) -> int:
    """The correlation id of the shortest op (not a record_function range) that contains t_ns; 0 if none."""
    best = None
    for r in ops:
        if r.activity == "user_annotation" or not r.correlation_id:
            continue
        if r.start_ns <= t_ns <= r.end_ns and (best is None or r.end_ns - r.start_ns < best.end_ns - best.start_ns):
            best = r
    return best.correlation_id if best is not None else 0


def from_profiler(prof) -> list[Event]:
    """The events of a finished `torch.profiler.profile` (see the module's docstring for the linkage)."""
    records, start = records_from_profiler(prof)
    return parse(records, start or None)


def step_ranges(events: Iterable[Event], name: str = STEP_RANGE) -> list[tuple[float, float]]:
    """(start, end) us of each host range called `name` (diagnose's profiled steps), in order."""
    return sorted((e.start_us, e.end_us) for e in events if e.kind == OP and e.name == name)
