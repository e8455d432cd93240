"""What made the GPU wait: the host's side of each gap in the GPU's work, and what the step's shapes do from one
step to the next. `analyze.host_causes` and `analyze.analyze` read these.

Holistic Trace Analysis (HTA, facebookresearch/HolisticTraceAnalysis, "Idle Time Breakdown") splits a GPU's idle
time three ways: *host wait* (the CPU did not enqueue the next kernel in time), *kernel wait* (the short launch
overhead between kernels already queued back to back) and *other*. Host wait is where every fix the course
teaches lives, so the diagnosis splits it further, by what the host was doing while the GPU waited:

- blocked in a synchronization (`.item()`, a branch on a GPU value, `nonzero`, a blocking copy), and after it
  returns, refilling the queue the wait emptied ("after_sync": a step that never waits keeps work queued ahead
  of the GPU, so these gaps are the synchronization's, not the launches');
- issuing work to an empty queue ("launch"), as HTA's host wait;
- blocked in a launch call because the queue is full ("queue_full"): the GPU is busy all that time, so it is
  never idle time, only host time (a long "launch" figure on a busy GPU meant this);
- in the allocator, making the batch, compiling (torch.compile), or running the user's own Python.
"""
from __future__ import annotations

import bisect
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence

from gpulab.core.timing import intersect, merge_intervals, subtract
from gpulab.diagnose.events import GPU, OP, Event, fmt_site

# A launch call that takes this long while the GPU is busy is waiting for room in the launch queue: an
# unblocked launch returns in a few microseconds (lesson 11 measures them), even under the profiler, and the
# queue holds about a thousand launches, so it fills only when the host runs far ahead of a busy GPU.
QUEUE_FULL_US = 50.0
# torch.compile's own work on the host: the ranges dynamo's `dynamo_timed` opens around each compile phase
# ("_compile.compile_inner (dynamo_timed)", "OutputGraph.call_user_compiler (dynamo_timed)", ...) and its
# outermost "dynamo" / "entire_frame_compile" ranges (torch 2.13's names).
COMPILE_SUFFIX = "(dynamo_timed)"
COMPILE_RANGES = ("dynamo", "entire_frame_compile", "backend_compile")
# Ops whose output's size the GPU's values decide: the host must wait for the GPU to learn it (a boolean mask's
# indexing runs aten::nonzero inside aten::index).
DATA_DEPENDENT_OPS = ("aten::nonzero", "aten::nonzero_numpy", "aten::argwhere", "aten::masked_select",
                      "aten::unique", "aten::_unique", "aten::_unique2", "aten::unique_dim",
                      "aten::unique_consecutive", "aten::repeat_interleave", "aten::nonzero_static")
BRANCH_OPS = ("aten::is_nonzero",)                   # Python's bool(), if, and, or on a tensor
READ_OPS = ("aten::item", "aten::_local_scalar_dense", "aten::tolist")
COPY_OPS = ("aten::to", "aten::_to_copy", "aten::copy_", "aten::cpu", "aten::numpy")
# A synchronizing call that returned this little before the GPU ran dry still caused it: CUPTI stamps
# GPU work on the GPU's clock and torch converts it to the host's, and a blocked thread needs a few
# microseconds to wake up; the two clocks agree to within a few microseconds, not exactly. (analyze.py reads it too.)
SYNC_GRACE_US = 20.0


def is_compile(e: Event) -> bool:
    """A host range of torch.compile compiling (not running compiled code)."""
    return e.kind == OP and (e.name.endswith(COMPILE_SUFFIX) or e.name in COMPILE_RANGES)


def queue_full(launches: Iterable[Event], busy: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The host time inside launch calls of at least QUEUE_FULL_US during which the GPU was busy: the host
    waiting for room in a full launch queue."""
    long = merge_intervals((e.start_us, e.end_us) for e in launches if e.dur_us >= QUEUE_FULL_US)
    return intersect(long, list(busy))


class OpsByThread:
    """The ops of each host thread, sorted, for "which ops were running at time t" (each sync's own)."""

    def __init__(self, ops: Iterable[Event]):
        self.rows: dict[int, list[Event]] = {}
        for e in ops:
            self.rows.setdefault(e.stream, []).append(e)
        self.starts: dict[int, list[float]] = {}
        self.longest: dict[int, float] = {}
        for thread, rows in self.rows.items():
            rows.sort(key=lambda e: e.start_us)
            self.starts[thread] = [e.start_us for e in rows]
            self.longest[thread] = max((e.dur_us for e in rows), default=0.0)

    def at(self, thread: int, t: float) -> list[Event]:
        """The ops of `thread` that contain t, outermost first."""
        rows, starts = self.rows.get(thread, []), self.starts.get(thread, [])
        hi = bisect.bisect_right(starts, t)
        lo = bisect.bisect_left(starts, t - self.longest.get(thread, 0.0))
        return sorted((e for e in rows[lo:hi] if e.end_us >= t), key=lambda e: (e.start_us, -e.end_us))


def sync_kind(running: Sequence[Event]) -> str:
    """What made a synchronizing call wait, from the ops running around it (outermost first): "shape" (an op
    whose output size the GPU decides), "branch" (Python's bool() of a tensor), "read" (.item(), .tolist()),
    "copy" (a blocking copy to the host), "wait" (no op: torch.cuda.synchronize(), an event)."""
    names = [e.name for e in running]
    if any(n in DATA_DEPENDENT_OPS for n in names):
        return "shape"
    if any(n in BRANCH_OPS for n in names):
        return "branch"
    if any(n in COPY_OPS for n in names):
        return "copy"
    if any(n in READ_OPS for n in names):
        return "read"
    return "wait"


def after_sync(idle: Sequence[tuple[float, float]], blocking: Sequence[tuple[float, float, tuple]],
               by_cause: dict, movable: tuple = ("launch",)) -> dict:
    """Move the GPU's gaps that began while the host was blocked in a synchronization from `movable` causes to
    "after_sync", in place: from the moment the GPU ran dry until its next work, what the host spent issuing
    work was refilling the queue the wait emptied (its own Python, a batch, the allocator keep their causes).
    A gap counts when a blocking call began by its start (give or take SYNC_GRACE_US) and had not ended
    SYNC_GRACE_US before it. Returns {sync's key: us moved}."""
    calls = sorted(blocking, key=lambda c: c[0])
    starts = [c[0] for c in calls]
    moved: dict = {}
    for a, b in idle:
        i = bisect.bisect_right(starts, a + SYNC_GRACE_US)
        # the latest calls that began by then (a few: one thread's waits do not overlap, autograd's may)
        hit = next((key for lo, hi, key in reversed(calls[max(i - 4, 0):i]) if hi >= a - SYNC_GRACE_US), None)
        if hit is None:
            continue
        for cause in movable:
            pieces = intersect(by_cause.get(cause, []), [(a, b)])
            if not pieces:
                continue
            by_cause[cause] = subtract(by_cause[cause], pieces)
            by_cause["after_sync"] = merge_intervals(by_cause.get("after_sync", []) + pieces)
            moved[hit] = moved.get(hit, 0.0) + sum(hi - lo for lo, hi in pieces)
    return moved


# -- shapes from one step to the next ---------------------------------------------------------------------------
def shape_changes(ops: Iterable[Event], windows: Sequence[tuple[float, float]], top: int = 5) -> tuple:
    """Ops whose input shapes differ from one profiled step to the next: for each (user's line, op), the set of
    input shapes it saw in each step; where two steps' sets differ, (line, op, the distinct shapes of the first
    input that changes (at most 4), the steps it ran in). A line whose shapes vary within a step but repeat every
    step (a loop over layers of different widths) does not count; nor one that runs in one step only."""
    per: dict = {}
    for i, keys in enumerate(window_keys(ops, windows)):
        for site, name, shapes in keys:
            per.setdefault((fmt_site(site), name), {}).setdefault(i, set()).add(shapes)
    out = []
    for (site, name), steps in per.items():
        sets = [frozenset(v) for v in steps.values()]
        if len(sets) < 2 or len(set(sets)) < 2:
            continue
        every = [shapes for s in sets for shapes in s]
        width = max(len(x) for x in every)
        column = next((j for j in range(width) if len({x[j] if j < len(x) else None for x in every}) > 1), 0)
        seen = sorted({x[column] for x in every if column < len(x) and x[column]})
        out.append((site, name, tuple(seen[:4]), len(sets), len(set(sets))))
    out.sort(key=lambda r: (-r[4], r[0], r[1]))
    return tuple(r[:4] for r in out[:top])


def data_dependent(ops: Iterable[Event], steps: int) -> tuple:
    """(user's line, op, calls per step) of the ops whose output size the GPU's values decide."""
    n = Counter((fmt_site(e.site), e.name) for e in ops if e.name in DATA_DEPENDENT_OPS)
    return tuple((site, name, calls / steps) for (site, name), calls in n.most_common())


# A step whose shapes change (a batch padded to its own longest sequence, batches built to a token budget) pays a
# one-time cost the first time each shape runs: a compile per shape, and in eager PyTorch whatever a library builds
# per shape (on one H100, torch 2.11, SDPA's cuDNN attention: 93-140 ms at each new length, forward and backward,
# results/zoo/2026-12-07-h100-issue41-i/; `first_run_ops` names it where profiled steps were first runs). Its steps
# split into settled ones and ones many times slower: on one H100 (2026-12-07,
# results/zoo/2026-12-07-h100-issue41-c/) 8.7x to 258x, in three steps whose fast steps ran at the speed their
# labels measured once every shape had run. Where the shapes change between the profiled steps and some profiled
# steps take at least this many times the shortest one, the analysis reads the others; not where the timed steps'
# slow ones repeat evenly (`StallFacts.period`): that is a stall with a line of its own.
NEW_SHAPE_FACTOR = 3.0


def window_keys(ops: Iterable[Event], windows: Sequence[tuple[float, float]]) -> list[set]:
    """For each profiled step, the (line, op, input shapes) its ops ran with."""
    keys: list[set] = [set() for _ in windows]
    starts = [lo for lo, _ in windows]
    for e in ops:
        i = bisect.bisect_right(starts, e.start_us) - 1
        if e.shapes and "::" in e.name and i >= 0 and e.start_us <= windows[i][1]:
            keys[i].add((e.site, e.name, tuple(tuple(x) for x in e.shapes)))
    return keys


def settled_windows(windows: Sequence[tuple[float, float]], changes: tuple, busy: Sequence[float] = (),
                    keys: Sequence[set] = ()) -> tuple[list, list]:
    """(the profiled steps to analyse, the ones set apart as a new shape's first run): every step and none unless
    the shapes change between steps (`shape_changes`) and some steps, not all, take NEW_SHAPE_FACTOR x the shortest
    with their extra time mostly the GPU idling (`busy`: each step's GPU busy time; a bigger batch's extra time is
    the GPU's own) and an op with shapes that no other step ran (`keys`, `window_keys`)."""
    if not changes or not windows:
        return list(windows), []
    busy = list(busy) or [0.0] * len(windows)
    short = min(range(len(windows)), key=lambda i: windows[i][1] - windows[i][0])
    length = lambda i: windows[i][1] - windows[i][0]                                       # noqa: E731
    slow = [i for i in range(len(windows)) if length(i) >= NEW_SHAPE_FACTOR * length(short)
            and (length(i) - busy[i]) - (length(short) - busy[short]) > busy[i] - busy[short]]
    if keys:
        seen = lambda i: set().union(*(keys[j] for j in range(len(windows)) if j != i and j not in slow))  # noqa: E731
        slow = [i for i in slow if keys[i] - seen(i)]
    if not slow or len(slow) == len(windows):
        return list(windows), []
    return [w for i, w in enumerate(windows) if i not in slow], [windows[i] for i in slow]


def runs_span(windows: Sequence[tuple[float, float]], kept: Sequence[tuple[float, float]]) -> list:
    """The time the analysis reads: for each run of consecutive kept steps, its first step's start to the last one's
    end (steps run back to back; the gaps between their host ranges are theirs), cut where a step set apart starts
    (the kept step's GPU work still running then is the next step's time too). All kept: one span."""
    span, run = [], []
    for i, w in enumerate(list(windows) + [None]):
        if w is not None and w in kept:
            run.append(w)
        elif run:
            end = max(hi for _, hi in run)
            span.append((run[0][0], min(end, w[0]) if w is not None else end))
            run = []
    return span


def new_shape_facts(timed_ms: Sequence[float], profiled: int, first: int, busy_ms: float = 0.0) -> dict:
    """What the first runs of new shapes cost, from the timed steps (host clock, back to back): the settled step is
    the median of those under NEW_SHAPE_FACTOR x the fastest, and no shorter than the GPU's work per step (`busy_ms`,
    the kept profiled steps': inside a chunk a step's host time can be only its launches)."""
    cut = NEW_SHAPE_FACTOR * min(timed_ms)
    slow = sorted(t for t in timed_ms if t >= cut)
    return {"profiled": profiled, "profiled_first": first, "timed": len(timed_ms), "timed_first": len(slow),
            "settled_ms": max(statistics.median(t for t in timed_ms if t < cut), busy_ms),
            "first_ms": (slow[0], slow[-1]) if slow else None}


def self_ms_by_op(ops: Iterable[Event], window: tuple[float, float]) -> dict:
    """Each op name's self time (ms) inside `window`: its time less its children's on the same thread."""
    out: dict = {}
    for thread_ops in OpsByThread(e for e in ops if window[0] <= e.start_us <= window[1]).rows.values():
        stack: list = []                                           # [event, children's time]
        for e in sorted(thread_ops, key=lambda e: (e.start_us, -e.end_us)):
            while stack and stack[-1][0].end_us <= e.start_us:
                done, kids = stack.pop()
                out[done.name] = out.get(done.name, 0.0) + (done.dur_us - kids) / 1e3
            if stack:
                stack[-1][1] += e.dur_us
            stack.append([e, 0.0])
        for done, kids in stack:
            out[done.name] = out.get(done.name, 0.0) + (done.dur_us - kids) / 1e3
    return out


def first_run_ops(ops: Sequence[Event], kept: Sequence[tuple[float, float]], first: Sequence[tuple[float, float]],
                  top: int = 3) -> tuple:
    """Where a shape's first runs spent their extra host time, on every host thread (the backward's too): ((op, ms more
    per step than in a kept step), ...), the largest first, aten ops only, none under a tenth of the largest (on one
    H100, 2026-12-07, results/zoo/2026-12-07-h100-issue41-i/: SDPA's cuDNN attention, 93-140 ms at each new length,
    forward and backward)."""
    def mean(windows):
        total: dict = {}
        for w in windows:
            for name, ms in self_ms_by_op(ops, w).items():
                total[name] = total.get(name, 0.0) + ms / len(windows)
        return total
    slow, settled = mean(first), mean(kept)
    extra = sorted(((n, ms - settled.get(n, 0.0)) for n, ms in slow.items() if n.startswith("aten::")),
                   key=lambda r: -r[1])
    return tuple((n, ms) for n, ms in extra[:top] if extra and ms > 0.1 * extra[0][1] > 0)   # a tenth of the largest


def set_apart(events: Sequence[Event], ops: Sequence[Event], windows: Sequence[tuple[float, float]], changes: tuple,
              stalls, host_shapes: bool = False) -> tuple[list, list, dict | None]:
    """`analyze`'s split of the profiled steps: (kept, set apart, `new_shape_facts` or None). Only where the step
    was timed (`stalls`, its host steps) and its slow steps do not repeat evenly (`StallFacts.period`: that is a
    stall with a line of its own, a checkpoint say). Where no profiled step met a new shape but the host chose the
    shapes (`host_shapes`: they change between the profiled steps and no op's output size is the GPU's to decide)
    and some timed steps took NEW_SHAPE_FACTOR x the fastest, those are the first runs: the profiled steps are all
    kept, and the settled step is the other timed steps' median (on one H100, 2026-12-07,
    results/zoo/2026-12-07-h100-issue41-h/: hf_trainer_dynamic_padding in a fresh process, 14 of 20 timed steps
    125-234 ms, the other six 15-27 ms, the five profiled steps none of them; the diagnosis read the median, 119 ms).
    Not where the timed steps may be something else, with no profiled step to tell (review of 134fb54): a slow step
    the stall search traced to a line of its own (`StallFacts.site`); slow steps under NEW_SHAPE_FACTOR x the GPU's
    largest profiled step (a bigger batch's own work); fast steps under the GPU's work per step (inside a chunk the
    host ran ahead, and a step's host time is not its time)."""
    if stalls is None or stalls.period or not stalls.step_ms:
        return list(windows), [], None
    gpu = merge_intervals((e.start_us, e.end_us) for e in events if e.kind == GPU and e.end_us > e.start_us)
    busy = [sum(b - a for a, b in intersect(gpu, [w])) for w in windows]
    kept, first = settled_windows(windows, changes, busy, window_keys(ops, windows))
    kept_busy_ms = sum(b for w, b in zip(windows, busy) if w in kept) / len(kept) / 1e3
    if first:
        return kept, first, {**new_shape_facts(stalls.step_ms, len(windows), len(first), kept_busy_ms),
                             "first_ops": first_run_ops([e for e in events if e.kind == OP], kept, first)}
    if not (changes and host_shapes) or stalls.site:
        return kept, [], None
    facts = new_shape_facts(stalls.step_ms, len(windows), 0)
    if (not facts["timed_first"] or facts["first_ms"][0] < NEW_SHAPE_FACTOR * max(busy) / 1e3
            or facts["settled_ms"] < kept_busy_ms):
        return kept, [], None
    return kept, [], facts          # its settled step is not under the GPU's work: no floor to apply
