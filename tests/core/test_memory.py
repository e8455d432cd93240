"""gpulab.core.memory: fmt_bytes, MemoryStats, track_peak, memory_guard."""
import dataclasses

import pytest
import torch

from gpulab.core import memory
from gpulab.core.memory import GiB, GuardReport, MemoryNotReturned, MemoryStats, MiB, PeakReading, fmt_bytes, memory_guard, memory_now, track_peak

CPU = torch.device("cpu")
SKIP_MESSAGE = "memory check: skipped on the CPU (no CUDA allocator to read).\n"


@pytest.fixture
def fake_allocator(monkeypatch):
    """A pretend CUDA caching allocator: `state["allocated"]` is what it reports."""
    state = {"allocated": 10 * MiB, "peak": 10 * MiB, "emptied": 0}
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(cuda, "empty_cache", lambda: state.update(emptied=state["emptied"] + 1))
    monkeypatch.setattr(cuda, "memory_allocated", lambda *a: state["allocated"])
    monkeypatch.setattr(cuda, "max_memory_allocated", lambda *a: state["peak"])
    monkeypatch.setattr(cuda, "reset_peak_memory_stats",
                        lambda *a: state.update(peak=state["allocated"]))
    return state


# -- fmt_bytes --------------------------------------------------------------------
def test_fmt_bytes():
    assert fmt_bytes(None) == "-"
    assert fmt_bytes(0) == "0 B"
    assert fmt_bytes(512) == "512 B"
    assert fmt_bytes(1024) == "1.0 KiB"
    assert fmt_bytes(1536) == "1.5 KiB"
    assert fmt_bytes(512 * MiB) == "512.0 MiB"
    assert fmt_bytes(GiB) == "1.00 GiB"
    assert fmt_bytes(16.6 * GiB) == "16.60 GiB"
    assert fmt_bytes(-2 * MiB) == "-2.0 MiB"


# -- MemoryStats --------------------------------------------------------------------
def test_fragmentation_arithmetic():
    s = MemoryStats(available=True, allocated=3 * GiB, reserved=4 * GiB,
                    peak_allocated=5 * GiB, peak_reserved=6 * GiB)
    assert s.fragmentation == GiB
    assert s.fragmentation_pct == 25.0
    assert str(s) == ("allocated 3.00 GiB, reserved 4.00 GiB, reserved-but-unused 1.00 GiB, "
                      "peak allocated 5.00 GiB")


def test_fragmentation_with_nothing_reserved_is_zero_percent():
    s = MemoryStats(available=True, allocated=0, reserved=0)
    assert s.fragmentation == 0
    assert s.fragmentation_pct == 0.0


def test_memory_now_on_cpu_is_not_available():
    s = memory_now(CPU)
    assert s == MemoryStats(available=False)
    assert s.fragmentation is None and s.fragmentation_pct is None
    assert "not measured" in str(s)


@pytest.mark.cpu_only
def test_memory_now_defaults_to_the_cpu_without_cuda():
    assert memory_now().available is False


def test_memory_stats_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        memory_now(CPU).allocated = 1


def test_free_memory_and_release_on_cpu(monkeypatch):
    def boom():
        raise AssertionError("empty_cache called on the CPU")
    monkeypatch.setattr(torch.cuda, "empty_cache", boom)
    assert memory.free_memory(CPU) is None
    memory.release(CPU)


def test_usable_memory_counts_the_allocators_cache(monkeypatch):
    # issue 40: notebook 10 sized its budget from the driver's free memory after a step had filled the cache
    assert memory.usable_memory(CPU) is None
    gpu = torch.device("cuda", 0)
    monkeypatch.setattr(memory, "free_memory", lambda device=None: (4 * 2**30, 16 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 6 * 2**30)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 1 * 2**30)
    assert memory.usable_memory(gpu) == (9 * 2**30, 16 * 2**30)       # 4 free + 5 cached, unallocated
    monkeypatch.setattr(memory, "free_memory", lambda device=None: (14 * 2**30, 16 * 2**30))
    assert memory.usable_memory(gpu) == (16 * 2**30, 16 * 2**30)      # never more than the card


# -- track_peak ----------------------------------------------------------------------
def test_track_peak_on_cpu_yields_none():
    with track_peak(CPU) as mem:
        torch.ones(1000)
    assert (mem.start, mem.end, mem.peak, mem.peak_above_start) == (None, None, None, None)


def test_peak_above_start():
    assert PeakReading(start=100, end=150, peak=600).peak_above_start == 500
    assert PeakReading().peak_above_start is None


def test_track_peak_reads_the_allocator(fake_allocator):
    with track_peak(torch.device("cuda", 0)) as mem:
        fake_allocator["peak"] = 74 * MiB
        fake_allocator["allocated"] = 12 * MiB
    assert (mem.start, mem.end, mem.peak) == (10 * MiB, 12 * MiB, 74 * MiB)
    assert mem.peak_above_start == 64 * MiB


# -- GuardReport ------------------------------------------------------------------------
def test_guard_report_everything_returned():
    r = GuardReport(before=10 * MiB, after=10 * MiB, tolerance=MiB)
    assert r.leaked == 0 and r.ok
    assert r.message() == "memory check: back to 10.0 MiB allocated (started at 10.0 MiB)."


def test_guard_report_small_leftover_within_tolerance():
    r = GuardReport(before=10 * MiB, after=11 * MiB, tolerance=MiB)
    assert r.leaked == MiB and r.ok


def test_guard_report_leak():
    r = GuardReport(before=10 * MiB, after=74 * MiB, tolerance=MiB)
    assert r.leaked == 64 * MiB
    assert not r.ok
    msg = r.message()
    assert "64.0 MiB of GPU memory was NOT returned" in msg
    assert "(10.0 MiB before, 74.0 MiB after)" in msg


def test_guard_report_on_cpu_is_skipped_not_failed():
    r = GuardReport()
    assert r.leaked is None and r.ok
    assert r.message() + "\n" == SKIP_MESSAGE


# -- memory_guard ----------------------------------------------------------------------
def test_memory_guard_on_cpu_prints_skipped(capsys):
    with memory_guard(device=CPU) as report:
        torch.ones(1000)
    assert capsys.readouterr().out == SKIP_MESSAGE
    assert report.leaked is None and report.ok


@pytest.mark.cpu_only
def test_memory_guard_defaults_to_the_cpu_without_cuda(capsys):
    with memory_guard(strict=True):
        pass
    assert capsys.readouterr().out == SKIP_MESSAGE


def test_memory_guard_quiet_prints_nothing(capsys):
    with memory_guard(quiet=True, device=CPU):
        pass
    assert capsys.readouterr().out == ""


def test_memory_guard_reports_memory_not_returned(fake_allocator, capsys):
    kept = []
    with memory_guard(device=torch.device("cuda", 0)) as report:
        kept.append("a tensor")
        fake_allocator["allocated"] += 64 * MiB
    assert report.before == 10 * MiB and report.after == 74 * MiB
    assert not report.ok
    assert "NOT returned" in capsys.readouterr().out
    assert fake_allocator["emptied"] == 2          # released before and after


def test_memory_guard_strict_raises_on_a_leak(fake_allocator, capsys):
    with pytest.raises(MemoryNotReturned, match="64.0 MiB of GPU memory was NOT returned"):
        with memory_guard(strict=True, device=torch.device("cuda", 0)):
            fake_allocator["allocated"] += 64 * MiB


def test_memory_guard_ok_when_memory_comes_back(fake_allocator, capsys):
    with memory_guard(strict=True, device=torch.device("cuda", 0)) as report:
        fake_allocator["allocated"] += 64 * MiB
        fake_allocator["allocated"] -= 64 * MiB
    assert report.ok and report.leaked == 0
    assert capsys.readouterr().out.startswith("memory check: back to 10.0 MiB allocated")


# -- on a GPU ----------------------------------------------------------------------------
@pytest.mark.gpu
def test_memory_now_on_gpu_is_available():
    s = memory_now()
    assert s.available
    assert s.reserved >= s.allocated >= 0
    assert s.fragmentation >= 0


@pytest.mark.gpu
def test_track_peak_sees_a_64_mib_allocation():
    with track_peak() as mem:
        x = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
        del x
    assert mem.peak_above_start >= 64 * MiB


@pytest.mark.gpu
def test_memory_guard_finds_a_planted_leak_and_its_fix(capsys):
    kept = []
    with memory_guard() as report:
        kept.append(torch.empty(64 * MiB, dtype=torch.uint8, device="cuda"))
    assert not report.ok and report.leaked >= 64 * MiB
    assert "NOT returned" in capsys.readouterr().out
    with memory_guard() as report:
        kept.clear()
    assert report.ok
