"""GPU memory as PyTorch's caching allocator sees it. Introduced in notebook 00; the heart of 02.

- `memory_now()`: allocated / reserved now and at peak, and the fragmentation
  figure (memory the allocator reserved from the driver but holds no tensor).
- `track_peak()`: a context manager that measures a block's peak.
- `memory_guard()`: reports GPU memory an experiment did not give back.

On the CPU there is no caching allocator to read: the figures are None and
`available` is False, so lessons can say so instead of printing zeros.
"""
from __future__ import annotations

import contextlib
import gc
import sys
from dataclasses import dataclass
from typing import Iterator
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


@dataclass
class GuardReport:
    """What `memory_guard` found when its block ended."""

    before: int | None = None
    after: int | None = None
    tolerance: int = 0

    @property
    def leaked(self) -> int | None:
        """Bytes still allocated after the block that were not before (None on the CPU)."""
        return None if self.before is None else self.after - self.before

    @property
    def ok(self) -> bool:
        return self.leaked is None or self.leaked <= self.tolerance

    def message(self) -> str:
        if self.leaked is None:
            return "memory check: skipped on the CPU (no CUDA allocator to read)."
        if self.ok:
            return (f"memory check: back to {fmt_bytes(self.after)} allocated "
                    f"(started at {fmt_bytes(self.before)}).")
        return (f"memory check: {fmt_bytes(self.leaked)} of GPU memory was NOT returned "
                f"({fmt_bytes(self.before)} before, {fmt_bytes(self.after)} after). Something "
                "still holds tensors: a list or global that kept results, a model not deleted, "
                "or the last exception (sys.last_traceback) keeping a frame alive.")


class MemoryNotReturned(RuntimeError):
    """Raised by a strict `memory_guard` when an experiment keeps GPU memory."""


@contextlib.contextmanager
def memory_guard(tolerance_bytes: int = 1 * MiB, strict: bool = False, quiet: bool = False,
                 device: torch.device | None = None) -> Iterator[GuardReport]:
    """Check that a block gives back the GPU memory it took.

        with memory_guard():
            run_experiment()
        # prints "memory check: back to ..." or what was not returned

    On exit it collects garbage and empties the cache, then compares allocated
    bytes with the start. `strict=True` raises MemoryNotReturned instead of printing.
    """
    device = device or pick_device()
    report = GuardReport(tolerance=tolerance_bytes)
    if device.type == "cuda":
        release(device)
        report.before = torch.cuda.memory_allocated(device)
    try:
        yield report
    finally:
        if device.type == "cuda":
            release(device)
            report.after = torch.cuda.memory_allocated(device)
        if strict and not report.ok:
            raise MemoryNotReturned(report.message())
        if not quiet:
            print(report.message(), file=sys.stdout)
