"""Host<->device copies of any size, for notebook 05.

`gpulab.lessons.l00_gpu_ceilings.transfer_experiment` (notebook 00) takes whole MiB; this module
times copies from a few bytes up, and the pieces notebook 05 adds: how long a `non_blocking` copy
keeps the host waiting, what pinning right before a copy costs, and the benchmarking trap of a
pageable copy from a buffer nobody wrote (the zero page).

Which clock: a copy from pinned memory is GPU work alone (the copy engine reads the buffer), so CUDA
events time it (`gpulab.core.timing.benchmark`). Where the CPU takes part (the driver's staging copy
of a pageable buffer, `pin_memory()`'s copy into page-locked memory), events bracket a blocking call
whole (the end mark is queued only after it returns) but miss CPU work that overlaps GPU work queued
before it (`pin_then_copy`'s events row): such work is timed on the host clock around a synchronized
call (`benchmark(..., clock="host")`), the rule of notebook 01, section 6.

`host_cache()` reads the size of the CPU's last-level cache from Linux's sysfs, and `cache_probe` times one
pageable copy size from a host buffer reused every call against one rotated through buffers too many to stay
in that cache: what notebook 05 tests the pageable sweep's peak with.

`CONFIG` / `config(scale)` hold the copy sizes, written once for the notebook and `gpulab bench`;
`headline(scale)` is the host->device copy of the sweep's largest size from pinned against pageable
memory, what notebook 05's self-check and `gpulab bench` measure.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import torch
from gpulab.core.device import pick_device, require_cuda, resolve_scale
from gpulab.core.measured import Measured, Skipped
from gpulab.core.memory import MiB
from gpulab.core.predict import Plan, Work
from gpulab.core.timing import MIN_CALLS, benchmark


# -- knobs ------------------------------------------------------------------------------------------
TITLE = "PCIe transfers"
HEADLINE = "pinned / pageable host->device GB/s"      # the metric bands.toml judges
CONFIG = {
    "tiny": dict(
        smallest_bytes=4 * 2**10,       # the sweep's first copy (4 KiB)
        largest_bytes=16 * MiB,         # the sweep's last copy; the headline copies this much
        nonblocking_bytes=64 * MiB,     # the copy whose non_blocking return is timed
        pin_trap_bytes=64 * MiB,        # the copy pinned right before it is made
        zero_page_bytes=16 * MiB,       # the pageable copy from an untouched / a filled buffer
    ),
    "full": dict(smallest_bytes=4 * 2**10, largest_bytes=256 * MiB, nonblocking_bytes=64 * MiB,
                 pin_trap_bytes=64 * MiB, zero_page_bytes=256 * MiB),
}


def config(scale: str | None = None) -> dict:
    """This lesson's knobs at a scale ('tiny' or 'full'; default: the course's, `GPULAB_SCALE`)."""
    return dict(CONFIG[resolve_scale(scale)])


def plan(scale: str | None = None) -> Plan:
    """What notebook 05 asks of the GPU at `scale` (gpulab.core.predict): bytes over the link, per kind of
    copy, each copy a fixed count (what benchmark times beyond its least is its budget: host time)."""
    cfg = config(scale)
    calls = MIN_CALLS       # benchmark()'s least; the rest of its budget is host time
    moved = dict.fromkeys(("h2d_pageable", "h2d_pinned", "d2h_pageable", "d2h_pinned"), 0)
    # transfer_bandwidth: one copy, a check that reads the GPU buffer back (gpu.cpu(): d2h pageable), then
    # `calls` timed copies; device->host first fills the GPU buffer from host.flip(0) (h2d pageable)

    def transfer(nbytes: int, kind: str) -> None:
        moved[kind] += (1 + calls) * nbytes
        moved["d2h_pageable"] += nbytes
        if kind.startswith("d2h"):
            moved["h2d_pageable"] += nbytes

    sizes = log_sizes(cfg["smallest_bytes"], cfg["largest_bytes"])[::2]     # the notebook's sweep
    for kind in moved.copy():
        for nbytes in sizes:
            transfer(nbytes, kind)
    transfer(cfg["largest_bytes"], "h2d_pageable")          # the self-check (headline): the largest size
    transfer(cfg["largest_bytes"], "h2d_pinned")            # from pageable and from pinned memory again
    transfer(16 * MiB, "h2d_pinned")                        # the panel's default run
    # nonblocking_return, from pageable and from pinned memory: 1 + 10 calls on the host clock, a check,
    # 1 + 10 calls timed
    nb = cfg["nonblocking_bytes"]
    moved["h2d_pageable"] += 22 * nb
    moved["h2d_pinned"] += 22 * nb
    moved["d2h_pageable"] += 2 * nb
    # pin_then_copy: a checked pinned copy, then `calls` each of the pageable copy, pin_memory() + copy
    # (all threads, one thread, and on CUDA events) and the copy pinned once (pinning itself is host work)
    trap = cfg["pin_trap_bytes"]
    moved["h2d_pinned"] += (1 + 4 * calls) * trap
    moved["h2d_pageable"] += calls * trap
    moved["d2h_pageable"] += trap
    # zero_page_copy: from an untouched and from a filled buffer, a checked copy and benchmark's 3 warm-up ones
    # (its timed copies fill a budget of host time: in host_s)
    zero = cfg["zero_page_bytes"]
    moved["h2d_pageable"] += 2 * 4 * zero
    moved["d2h_pageable"] += 2 * zero
    # cache_probe, at each direction's pageable peak (at most largest_bytes): every rotated buffer's copy checked
    # once (at most ROTATE_MAX, read back device->host), then `calls` copies reused and `calls` rotated
    for kind in ("h2d_pageable", "d2h_pageable"):
        moved[kind] += ROTATE_MAX + 2 * calls * cfg["largest_bytes"]
        moved["d2h_pageable"] += ROTATE_MAX
    # pageable copies here reach less than notebook 00's figure (H200, 256 MiB: 6.1 of 8.8 GB/s host->device,
    # 11.0 of 14.8 device->host, results/course/2026-11-30-h200-00-to-09-at-775ae4a/h200-2026-11-30-course.json); pinned ones all of it
    share = {"h2d_pageable": 0.7, "h2d_pinned": 1.0, "d2h_pageable": 0.7, "d2h_pinned": 1.0}
    work = [Work(kind, nbytes, share[kind], f"{kind.replace('_', ' ')} copies, {nbytes / MiB:,.0f} MiB")
            for kind, nbytes in moved.items()]
    # host_s: see host_source; tiny runs the same formulas, with the full run's host time (tiny runs on
    # the CPU, where nothing is predicted: its plan is only for completeness)
    # host_s: 14.7 s wall in the s3 run less its 2.7 s of GPU work at that run's ceilings (the plan before
    # issue 15), + 1.2 s for the host-clock budgets issue 15 added (0.3 s each: two more pin_then_copy runs,
    # the zero-page pair)
    # + 0.8 s for cache_probe's budgets (issue 40: 0.2 s for each of 2 runs in 2 directions) and about 1 s for
    # filling its rotated buffers (up to 1 GiB of random bytes a direction)
    return Plan(host_s=12.0 + 1.2 + 0.8 + 1.0, work=work,
                host_source="wall time of notebook 05 in results/course/2026-11-30-h200-00-to-09-at-fcf1941/h200-2026-11-30-s3-course-timings.tsv "
                            "(H200, torch 2.11, 2026-11-30) minus its GPU work at that run's ceilings, "
                            "plus the time budgets of the runs added since (issues 15 and 40)")


DIRECTIONS = ("h2d", "d2h")


def log_sizes(lo: int, hi: int, per_octave: int = 1) -> list[int]:
    """Byte counts from `lo` to `hi` (both included), `per_octave` points per doubling, log-spaced."""
    if lo < 1 or hi < lo or per_octave < 1:
        raise ValueError(f"need 1 <= lo <= hi and per_octave >= 1 (got {lo}, {hi}, {per_octave})")
    steps = math.floor(math.log2(hi / lo) * per_octave + 1e-9)
    sizes = [round(lo * 2 ** (i / per_octave)) for i in range(steps + 1)]
    return sorted(set(sizes) | {hi})


def predicted_gbps(nbytes: int, peak_gbps: float, overhead_us: float = 10.0) -> float:
    """Bandwidth of one copy of `nbytes` if each copy costs `overhead_us` plus bytes / peak."""
    return nbytes / (overhead_us * 1e-6 + nbytes / (peak_gbps * 1e9)) / 1e9


def random_bytes(nbytes: int) -> torch.Tensor:
    """`nbytes` random bytes in (pageable) host memory, every page written.

    The bytes repeat with a period of 1,000,003 (a prime, so no chunk of a power-of-two size repeats
    its neighbour): cheap to make at 256 MiB, and a misplaced chunk still fails a copy's check."""
    g = torch.Generator().manual_seed(nbytes)
    block = torch.randint(0, 256, (min(nbytes, 1_000_003),), dtype=torch.uint8, generator=g)
    return block.repeat(-(-nbytes // block.numel()))[:nbytes].clone()


def _buffers(nbytes: int, direction: str, pinned: bool, device: torch.device):
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be 'h2d' or 'd2h' (got {direction!r}).")
    if nbytes < 1:
        raise ValueError(f"nbytes must be >= 1 (got {nbytes}).")
    require_cuda("host<->device copies cross a bus the CPU does not have.", device)
    host = random_bytes(nbytes)
    if pinned:
        host = host.pin_memory()
    gpu = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return host, gpu


def transfer_bandwidth(nbytes: int, direction: str = "h2d", pinned: bool = True,
                       device: torch.device | None = None, budget_s: float = 0.2) -> dict:
    """GB/s (1e9 bytes/s) and the Timing of one copy of `nbytes` bytes between host and GPU.

    The copy is checked byte for byte before it is timed. A pinned copy is the copy engine's work
    alone: `non_blocking=True`, timed by `benchmark`'s CUDA events. A pageable copy keeps the CPU
    busy staging the data: timed on the host clock around a synchronized call (`benchmark(..., clock="host")`).
    """
    device = device or pick_device()
    host, gpu = _buffers(nbytes, direction, pinned, device)
    if direction == "h2d":
        fn = lambda: gpu.copy_(host, non_blocking=pinned)  # noqa: E731
        fn()
        ok = torch.equal(gpu.cpu(), host)
    else:
        gpu.copy_(host.flip(0).to(device))
        fn = lambda: host.copy_(gpu, non_blocking=pinned)  # noqa: E731
        fn()
        torch.cuda.synchronize(device)
        ok = torch.equal(gpu.cpu(), host)
    if not ok:
        raise AssertionError(f"{direction} copy of {nbytes} bytes produced different data")
    t = (benchmark(fn, budget_s=budget_s, device=device) if pinned
         else benchmark(fn, budget_s=budget_s, device=device, clock="host"))
    del host, gpu
    return {"GB/s": t.per_second(nbytes) / 1e9, "ms": t}


def nonblocking_return(nbytes: int, pinned: bool, device: torch.device | None = None,
                       repeat: int = 10) -> dict:
    """For `gpu.copy_(host, non_blocking=True)`: how long the call keeps the host, and the copy itself.

    `host_ms`: host clock around the call without synchronizing (benchmark's `sync=False`,
    the counter-example of notebook 01, here exactly what is wanted: when does the call return?).
    `device_ms`: the copy as CUDA events see it. From pageable memory the call returns only
    when the copy is done (host_ms ~ device_ms); from pinned memory it returns at once.
    """
    device = device or pick_device()
    host, gpu = _buffers(nbytes, "h2d", pinned, device)
    fn = lambda: gpu.copy_(host, non_blocking=True)  # noqa: E731
    torch.cuda.synchronize(device)
    host_t = benchmark(fn, warmup=1, repeat=repeat, sync=False, device=device)
    torch.cuda.synchronize(device)
    ok = torch.equal(gpu.cpu(), host)
    device_t = benchmark(fn, warmup=1, repeat=repeat, device=device)
    del host, gpu
    if not ok:
        raise AssertionError("non-blocking copy produced different data")
    return {"host_ms": host_t.median_ms, "device_ms": device_t.median_ms}


@contextlib.contextmanager
def cpu_threads(n: int | None):
    """Run a block with `n` intra-op CPU threads (None: leave them as they are), then restore."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def pin_then_copy(nbytes: int, device: torch.device | None = None, budget_s: float = 0.3) -> dict:
    """`tensor.pin_memory()` right before every copy, against a plain pageable copy and a copy from a
    buffer pinned once, all on the host clock (`benchmark(..., clock="host")`: pinning is CPU work).

    `pin_memory()` copies the data into a page-locked buffer with PyTorch's CPU copy, which runs on all
    intra-op threads (`torch.get_num_threads()`); the driver's staging copy of a pageable buffer runs on
    the calling thread. So the pinning is timed twice: with this process's threads, and with one, as in
    a DataLoader's worker and pin-memory thread, which set `torch.set_num_threads(1)`.

    One more run times pin_memory() + copy with CUDA events, the wrong clock for it (notebook 01, section 6):
    nothing synchronizes between its calls, so the CPU pins the next call's data while the GPU still copies
    the previous one, and the events, marks on the GPU's stream, miss that overlapped pinning.

    Returns GB/s of each run, `timings` (their Timings) and `threads` (the intra-op thread count).
    """
    device = device or pick_device()
    host, gpu = _buffers(nbytes, "h2d", False, device)
    pinned_once = host.pin_memory()
    gpu.copy_(host.pin_memory(), non_blocking=True)
    torch.cuda.synchronize(device)
    if not torch.equal(gpu.cpu(), host):
        raise AssertionError("pin + copy produced different data")
    threads = torch.get_num_threads()
    runs = {
        "pageable copy": (None, lambda: gpu.copy_(host)),
        "pin_memory() + copy": (None, lambda: gpu.copy_(host.pin_memory(), non_blocking=True)),
        "pin_memory() + copy, 1 thread": (1, lambda: gpu.copy_(host.pin_memory(), non_blocking=True)),
        "pinned once, copy": (None, lambda: gpu.copy_(pinned_once, non_blocking=True)),
    }
    out = {}
    for name, (n, fn) in runs.items():
        with cpu_threads(n):
            out[name] = benchmark(fn, budget_s=budget_s, device=device, clock="host")
    out["pin_memory() + copy, CUDA events"] = benchmark(runs["pin_memory() + copy"][1], budget_s=budget_s,
                                                       device=device)
    del host, gpu, pinned_once
    return ({name: t.per_second(nbytes) / 1e9 for name, t in out.items()}
            | {"timings": out, "threads": threads})


def zero_page_copy(nbytes: int, device: torch.device | None = None, budget_s: float = 0.3) -> dict:
    """A pageable host->device copy from a buffer nobody wrote (`torch.empty`) against one filled with
    random bytes, on the host clock: the benchmarking trap of the zero page.

    `torch.empty` only reserves address space. Until a page is written, the kernel maps every page of
    it that is read to one shared page of zeros, so the driver's staging copy reads the same page over
    and over from the CPU's cache instead of `nbytes` from DRAM, and the copy looks faster than any real
    batch can be. Returns GB/s of both (`untouched`, `random`) and their Timings (`timings`).
    """
    if nbytes < 1:
        raise ValueError(f"nbytes must be >= 1 (got {nbytes}).")
    device = require_cuda("host<->device copies cross a bus the CPU does not have.", device or pick_device())
    gpu = torch.empty(nbytes, dtype=torch.uint8, device=device)
    sources = {"untouched": torch.empty(nbytes, dtype=torch.uint8), "random": random_bytes(nbytes)}
    out = {}
    for name, host in sources.items():
        fn = lambda: gpu.copy_(host)  # noqa: E731
        fn()
        if not torch.equal(gpu.cpu(), host):      # reads the host buffer only: it stays untouched
            raise AssertionError(f"pageable copy from the {name} buffer produced different data")
        out[name] = benchmark(fn, budget_s=budget_s, device=device, clock="host")
    del gpu, sources
    return {name: t.per_second(nbytes) / 1e9 for name, t in out.items()} | {"timings": out}


def host_cache(cpu: int | None = None, root: str = "/sys/devices/system/cpu") -> dict | None:
    """The largest CPU cache the operating system reports for `cpu` (default: the first CPU this process may
    run on), from Linux's sysfs (`cpuN/cache/index*/`: level, type, size, shared_cpu_list): usually the L3,
    the last-level cache. {"bytes", "level", "shared_cpus", "path"}, or None where sysfs does not say (not
    Linux, a container that hides it). A virtual machine reports what its hypervisor tells it, and the cache
    is shared with the other CPUs listed and whatever they run."""
    import os
    from pathlib import Path

    if cpu is None:
        try:
            cpu = min(os.sched_getaffinity(0))
        except (AttributeError, OSError, ValueError):
            cpu = 0
    best = None
    for index in sorted(Path(root, f"cpu{cpu}", "cache").glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
            shared = (index / "shared_cpu_list").read_text().strip() if (index / "shared_cpu_list").exists() else "?"
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:].upper(), 1)
        try:
            nbytes = int(size[:-1] if unit > 1 else size) * unit
        except ValueError:
            continue
        if best is None or level > best["level"]:
            best = {"bytes": nbytes, "level": level, "shared_cpus": shared, "path": str(index / "size")}
    return best


# The rotated buffers of `cache_probe` together hold at least this many times the cache, and at most ROTATE_MAX.
ROTATE_FACTOR = 2
ROTATE_MAX = 1024 * MiB


def cache_probe(nbytes: int, direction: str = "h2d", cache_bytes: int | None = None,
                device: torch.device | None = None, budget_s: float = 0.2) -> dict:
    """One pageable copy size timed two ways, both on the host clock: from (device->host: into) one host
    buffer every call, which stays in the CPU's caches between calls where it fits ("reused"), and from a
    different buffer each call, cycling through enough of them (together over ROTATE_FACTOR x `cache_bytes`,
    at most ROTATE_MAX) that each has left the cache before its turn comes again ("rotated"). Same bytes,
    same driver path; only where the CPU finds the host buffer differs. Pinned memory is not involved: the
    copy engine reads it without the CPU.

    Returns {"reused", "rotated": GB/s, "timings": their Timings, "buffers": how many rotate, "rotated_bytes":
    their total, "enough": whether that total reached ROTATE_FACTOR x cache_bytes (False where ROTATE_MAX
    capped it, or the cache's size is unknown)}."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be 'h2d' or 'd2h' (got {direction!r}).")
    if nbytes < 1:
        raise ValueError(f"nbytes must be >= 1 (got {nbytes}).")
    device = require_cuda("host<->device copies cross a bus the CPU does not have.", device or pick_device())
    want = ROTATE_FACTOR * cache_bytes if cache_bytes else ROTATE_MAX
    count = max(2, min(ROTATE_MAX // nbytes, math.ceil(want / nbytes) + 1))
    hosts = [random_bytes(nbytes) for _ in range(count)]
    gpu = torch.empty(nbytes, dtype=torch.uint8, device=device)
    if direction == "d2h":
        gpu.copy_(hosts[0].flip(0).to(device))

    def copy(host: torch.Tensor) -> None:
        if direction == "h2d":
            gpu.copy_(host)
        else:
            host.copy_(gpu)

    for host in hosts:                         # every buffer's copy checked once, byte for byte
        copy(host)
        if not torch.equal(gpu.cpu(), host):
            raise AssertionError(f"pageable {direction} copy of {nbytes} bytes produced different data")
    turn = itertools.count()
    runs = {"reused": lambda: copy(hosts[0]), "rotated": lambda: copy(hosts[next(turn) % count])}
    out = {name: benchmark(fn, budget_s=budget_s, device=device, clock="host") for name, fn in runs.items()}
    del hosts, gpu
    return ({name: t.per_second(nbytes) / 1e9 for name, t in out.items()}
            | {"timings": out, "buffers": count, "rotated_bytes": count * nbytes,
               "enough": bool(cache_bytes) and count * nbytes >= ROTATE_FACTOR * cache_bytes})


# The share of the predicted pinned / pageable ratio a host is held to (its copies also contend with
# whatever else the host does; the prediction leaves out the driver's own overheads). A judgement.
PINNED_FLOOR_SHARE = 0.75


def host_memcpy_gbps(nbytes: int = 256 * MiB, repeat: int = 3) -> float:
    """One CPU thread's copy rate between two pageable buffers (numpy's copyto, the course's `benchmark` on
    the host clock, median of `repeat`), GB/s of payload: what the driver's staging of a pageable
    host->device copy runs at, one thread copying into its pinned staging buffer."""
    import numpy as np
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.empty_like(src)
    t = benchmark(lambda: np.copyto(dst, src), warmup=1, repeat=repeat, device=torch.device("cpu"))
    return t.per_second(nbytes) / 1e9


def pinned_floor(pinned_gbps: float, memcpy_gbps: float) -> tuple[float, str]:
    """(least pinned / pageable ratio this host should show, why): a pageable copy is staged by one
    thread's memcpy into pinned memory and sent from there, so it runs at most at the slower of the two
    (the driver overlaps them in chunks); pinned runs at the link's rate. Predicted ratio max(1, pinned /
    memcpy), held to PINNED_FLOOR_SHARE of it and never below 1 (pinned slower than pageable is a fault)."""
    ideal = max(1.0, pinned_gbps / memcpy_gbps)
    low = max(1.0, PINNED_FLOOR_SHARE * ideal)
    return low, (f"pinned {pinned_gbps:.3g} GB/s over this host's one-thread memcpy {memcpy_gbps:.3g} GB/s: "
                 f"predicted {ideal:.3g}x, held to {PINNED_FLOOR_SHARE:.0%} of it")


def band_floor(scale: str | None = None) -> tuple[float, str]:
    """The headline's least ratio on this host (`pinned_floor` over notebook 00's measured pinned host->device
    rate and this host's memcpy): notebook 05 and `gpulab bench` lower the class's band to it where lower.
    With no measured pinned rate, no floor (infinity: the band stands)."""
    from gpulab.core.ceilings import ceilings
    pinned = ceilings().get("h2d_pinned")
    if pinned is None or not pinned.source.startswith("measured"):
        return math.inf, "no pinned host->device rate measured here (notebook 00)"
    return pinned_floor(pinned.value, host_memcpy_gbps(min(config(scale)["largest_bytes"], 256 * MiB)))


def headline(scale: str | None = None) -> Measured:
    """Host->device copy of `largest_bytes` from pinned against pageable memory (`transfer_bandwidth`)."""
    try:
        require_cuda("host<->device copies cross a bus the CPU does not have")
    except ValueError as err:
        raise Skipped(str(err)) from None
    nbytes = config(scale)["largest_bytes"]
    pageable = transfer_bandwidth(nbytes, "h2d", pinned=False)["GB/s"]   # each copy checked byte for byte
    pinned = transfer_bandwidth(nbytes, "h2d", pinned=True)["GB/s"]
    return Measured(pageable, pinned, "GB/s", pinned / pageable, True, "every copy checked byte for byte",
                    f"pageable, {nbytes // MiB} MiB", f"pinned, {nbytes // MiB} MiB")
