"""gpulab.core.memory: fmt_bytes, MemoryStats, track_peak, memory_guard (against its block and the notebook's
start, with declared keeps), the CPU counting mode and the strict mode."""
import dataclasses
import gc
from types import SimpleNamespace

import pytest
import torch

from gpulab.core import memory
from gpulab.core.memory import GiB, GuardReport, MemoryNotReturned, MemoryStats, MiB, PeakReading, fmt_bytes, memory_guard, memory_now, track_peak

CPU = torch.device("cpu")
SKIP_MESSAGE = "memory check: skipped on the CPU (no CUDA allocator to read).\n"


@pytest.fixture(autouse=True)
def own_start(monkeypatch):
    """No notebook start recorded, no counting or strict mode from the environment."""
    monkeypatch.setattr(memory, "_start", {})
    monkeypatch.delenv(memory.CPU_COUNT_ENV, raising=False)
    monkeypatch.delenv(memory.STRICT_ENV, raising=False)


@pytest.fixture
def fake_allocator(monkeypatch):
    """A pretend CUDA caching allocator: `state["allocated"]` is what it reports; the notebook started at
    10 MiB."""
    state = {"allocated": 10 * MiB, "peak": 10 * MiB, "emptied": 0}
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(cuda, "device_count", lambda: 1)
    monkeypatch.setattr(cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(cuda, "empty_cache", lambda: state.update(emptied=state["emptied"] + 1))
    monkeypatch.setattr(cuda, "memory_allocated", lambda *a: state["allocated"])
    monkeypatch.setattr(cuda, "max_memory_allocated", lambda *a: state["peak"])
    monkeypatch.setattr(cuda, "reset_peak_memory_stats",
                        lambda *a: state.update(peak=state["allocated"]))
    assert memory.notebook_start(GPU) == 10 * MiB
    state["emptied"] = 0
    # release() without its gc.collect(): a full collection in a pytest process costs a few tenths of a second
    monkeypatch.setattr(memory, "release", lambda device=None: cuda.empty_cache())
    return state


GPU = torch.device("cuda", 0)


@pytest.fixture
def counting(monkeypatch):
    """The CPU counting mode, with the notebook's start taken now, after one collection. Then no collection,
    neither the checks' (a full one in a pytest process costs a few tenths of a second; these tests free by
    reference count) nor an automatic one (it could free an earlier test's garbage between two readings)."""
    monkeypatch.setenv(memory.CPU_COUNT_ENV, "1")
    gc.collect()
    monkeypatch.setattr(memory, "gc", SimpleNamespace(collect=lambda *a: 0, get_objects=gc.get_objects))
    gc.disable()
    try:
        memory.notebook_start(CPU)
        yield
    finally:
        gc.enable()


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
    r = GuardReport(before=10 * MiB, after=10 * MiB, tolerance=MiB, start=2 * MiB, kept=8 * MiB)
    assert r.ok and r.message() == ("memory check: back to 10.0 MiB allocated (the block started at 10.0 MiB, "
                                    "the notebook at 2.0 MiB; 8.0 MiB declared kept).")


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


def test_guard_report_returned_but_above_the_notebooks_start():
    """Issue 40: 9.11 GiB held since an earlier cell passed every later check ("back to 9.11 GiB allocated
    (started at 9.11 GiB)"); the block returned what it took, but the notebook did not."""
    r = GuardReport(before=9.11 * GiB, after=9.11 * GiB, tolerance=MiB, start=0)
    assert r.leaked == 0 and r.block_ok
    assert r.held == 9.11 * GiB and not r.start_ok and not r.ok
    assert r.message().startswith(
        "memory check: this block returned what it took, but 9.11 GiB more than at the notebook's start are "
        "still allocated (9.11 GiB now, 0 B at the start): held since an earlier cell, not declared as kept.")


def test_guard_report_a_leak_on_top_of_an_earlier_hold_names_both():
    r = GuardReport(before=74 * MiB, after=138 * MiB, tolerance=MiB, start=10 * MiB)
    msg = r.message()
    assert msg.startswith("memory check: 64.0 MiB of GPU memory was NOT returned (74.0 MiB before, 138.0 MiB after).")
    assert "Besides, 64.0 MiB more than at the notebook's start were already allocated" in msg
    only_block = GuardReport(before=10 * MiB, after=74 * MiB, tolerance=MiB, start=10 * MiB)
    assert not only_block.ok and "Besides" not in only_block.message()


@pytest.mark.parametrize("after, ok", [(10 * MiB + MiB, True), (10 * MiB + MiB + 1, False)])
def test_guard_report_tolerance_edges(after, ok):
    block = GuardReport(before=10 * MiB, after=after, tolerance=MiB)                   # against the block
    assert (block.block_ok, block.ok) == (ok, ok)
    start = GuardReport(before=after, after=after, tolerance=MiB, start=10 * MiB)      # against the start
    assert (start.block_ok, start.start_ok, start.ok) == (True, ok, ok)
    kept = GuardReport(before=10 * MiB, after=after + 5 * MiB, tolerance=MiB, start=10 * MiB,
                       kept=5 * MiB, kept_new=5 * MiB)                                  # keeps allowed on top
    assert (kept.leaked, kept.held, kept.ok) == (after - 10 * MiB, after - 10 * MiB, ok)


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


def test_memory_guard_fails_on_memory_held_since_an_earlier_cell(fake_allocator, capsys):
    fake_allocator["allocated"] += 64 * MiB          # an earlier cell's model, still bound
    with memory_guard(device=GPU) as report:
        pass
    assert report.block_ok and not report.ok and report.held == 64 * MiB
    assert "this block returned what it took, but 64.0 MiB more than at the notebook's start" in capsys.readouterr().out
    with pytest.raises(MemoryNotReturned, match="held since an earlier cell"):
        with memory_guard(strict=True, device=GPU):
            pass


def test_only_the_outermost_printing_guard_compares_with_the_start(fake_allocator, capsys):
    fake_allocator["allocated"] += 64 * MiB
    with memory_guard(device=GPU, quiet=True) as quiet:          # a function checking its block for its caller
        pass
    with memory_guard(device=GPU, since_start=False) as own:
        with memory_guard(device=GPU) as inner:                  # inside another guard's block
            pass
    assert quiet.ok and own.ok and inner.ok and inner.start is None
    with memory_guard(device=GPU, quiet=True, since_start=True) as asked:
        pass
    assert not asked.ok


def test_notebook_start_does_not_initialise_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *a: pytest.fail("read the allocator"))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: pytest.fail("initialised CUDA"))
    assert memory.notebook_start(GPU) == 0
    assert memory.started_at(torch.device("cuda", 1)) == 0


# -- the CPU counting mode (GPULAB_MEMORY_CPU=1) ---------------------------------------------------
def test_counting_mode_counts_each_storage_once_with_gradients_and_saved_graphs(counting):
    base = memory.counted_cpu_bytes()
    x = torch.ones(1024, requires_grad=True)                   # 4 KiB
    views = [x[:10], x.view(32, 32)]                           # the same storage
    assert memory.counted_cpu_bytes() - base == 4096
    loss = x.exp().sum()                                       # exp saves its 4 KiB result: held by the graph
    assert memory.counted_cpu_bytes() - base == 2 * 4096 + 4
    loss.backward()                                            # frees the graph; x.grad: 4 KiB
    assert memory.counted_cpu_bytes() - base == 2 * 4096 + 4
    del views, loss, x
    assert memory.counted_cpu_bytes() == base


def test_counting_mode_a_block_that_leaks_fails(counting, capsys):
    kept = []
    with memory_guard(device=CPU) as report:
        kept.append(torch.ones(2**20))                         # 4 MiB left in a list
    assert report.leaked == 4 * MiB and not report.ok
    assert "4.0 MiB of memory (CPU tensors counted) was NOT returned" in capsys.readouterr().out
    kept.clear()
    with memory_guard(device=CPU, strict=True) as report:
        pass
    assert report.ok


def test_counting_mode_declared_keeps_pass_and_undeclared_fail(counting, capsys):
    model = torch.nn.Linear(512, 512)                          # 1 MiB + 2 KiB of parameters
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(2, 512)).sum().backward()
    optimizer.step()                                           # + gradients, + Adam's two moments
    held = 4 * (512 * 512 + 512) * 4 + 2 * 4                  # (and Adam's two step counters)
    with memory_guard(device=CPU, keeps=(model, optimizer)) as report:
        pass
    assert report.ok and report.kept == held and report.kept_new == 0
    with memory_guard(device=CPU, keeps=[{"model": model}]) as report:        # containers of them
        pass
    assert not report.ok and report.held == held // 2 + 4      # the optimizer's state, not declared
    assert "held since an earlier cell, not declared as kept" in report.message()
    with pytest.raises(MemoryNotReturned):
        with memory_guard(device=CPU, keeps=(model,), strict=True):
            pass
    del model, optimizer
    gc.collect()                                               # the raised error's frames held them
    with memory_guard(device=CPU) as made:                     # made in the block and kept on purpose
        model = torch.nn.Linear(512, 512)
        made.keep(model)
    assert made.ok and made.kept_new == made.kept == (512 * 512 + 512) * 4
    assert made.kept_objects == []                                   # the report holds no model alive


def test_keeps_on_another_device_count_nothing():
    assert memory.kept_bytes([torch.ones(1024)], GPU) == {}


def test_strict_mode_from_the_environment_raises_but_never_masks_an_error(counting, monkeypatch):
    monkeypatch.setenv(memory.STRICT_ENV, "1")
    kept = []
    with pytest.raises(MemoryNotReturned, match="NOT returned"):
        with memory_guard(device=CPU, quiet=True, since_start=True):
            kept.append(torch.ones(2**20))
    with memory_guard(device=CPU, strict=False, quiet=True, since_start=True) as report:     # strict=False wins
        kept.append(torch.ones(2**20))
    assert not report.ok
    with pytest.raises(ZeroDivisionError):                     # the block's own error goes on
        with memory_guard(device=CPU, quiet=True, since_start=True):
            kept.append(torch.ones(2**20))
            1 / 0


def test_counting_mode_counts_only_the_checks_against_the_notebooks_start(counting, capsys):
    """A function's own block check (quiet, or inside another check) stays skipped on the CPU: each count scans
    the kernel's objects; what its block leaves behind fails the enclosing check."""
    kept = []
    with memory_guard(device=CPU) as outer:
        with memory_guard(device=CPU, quiet=True) as inner:
            kept.append(torch.ones(2**20))
    assert inner.leaked is None and inner.ok
    assert outer.leaked == 4 * MiB and not outer.ok


def test_notebook_check_compares_with_the_start_only(counting, capsys):
    held = torch.ones(2**20)
    report = memory.notebook_check(device=CPU)
    assert not report.ok and report.held == 4 * MiB
    assert capsys.readouterr().out.startswith("memory check: 4.0 MiB more than at the notebook's start are still")
    assert memory.notebook_check(keeps=(held,), device=CPU).ok
    del held
    out = capsys.readouterr().out
    assert "nothing held since the notebook's start but what it declares kept: " in out and "4.0 MiB declared kept" in out
    assert memory.notebook_check(device=CPU).ok
    assert "nothing held since the notebook's start" in capsys.readouterr().out


# -- the planted-leak test's probe ----------------------------------------------------------
def test_a_planted_leak_is_counted_then_left_out(counting, monkeypatch, capsys):
    monkeypatch.setattr(memory, "_planted", {})
    assert memory.plant_leak(3 * MiB, CPU) == 3 * MiB == memory.planted_bytes(CPU)
    with memory_guard(device=CPU, strict=True) as report:    # sees the 3 MiB, passes on the rest
        pass
    assert report.ok and report.planted == 3 * MiB and report.held == 0
    assert "3.0 MiB planted by the test, left out" in capsys.readouterr().out
    held = torch.ones(2**18)                                   # 1 MiB more: fails, as without the plant
    with memory_guard(device=CPU) as report:
        pass
    assert not report.ok and report.held == MiB
    with pytest.raises(memory.PlantNotSeen, match="planted leak of 3.0 MiB was not seen"):
        memory.notebook_check(keeps=(memory._planted,), device=CPU, quiet=True)   # a keep that swallows it
    memory.notebook_start(CPU)                                 # a start taken after the plant
    with pytest.raises(memory.PlantNotSeen):
        memory.notebook_check(keeps=(held,), device=CPU, quiet=True)


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
    memory.notebook_start()
    kept = []
    with memory_guard() as report:
        kept.append(torch.empty(64 * MiB, dtype=torch.uint8, device="cuda"))
    assert not report.ok and report.leaked >= 64 * MiB
    assert "NOT returned" in capsys.readouterr().out
    with memory_guard() as report:
        kept.clear()
    assert report.ok
    held = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    with memory_guard() as report:
        pass
    assert report.block_ok and report.held >= 64 * MiB and not report.ok
    with memory_guard(keeps=(held,)) as report:
        pass
    assert report.ok


def test_a_kept_cuda_storage_counts_at_its_allocator_blocks_size(monkeypatch):
    """memory_allocated counts blocks, not nbytes: a 325.125 MiB matrix sits in a 326 MiB block (the remainder, under
    1 MiB, is not split off), so three of them read 2.6 MiB 'held since an earlier cell' when kept storages counted
    nbytes (notebook 08 on an H100, 2026-12-06)."""
    big, small = 325.125 * MiB, 1000
    segments = [{"device": 0, "blocks": [{"address": 4096, "size": 326 * MiB, "state": "active_allocated"},
                                          {"address": 9999, "size": 2 * MiB, "state": "inactive"}]},
                {"device": 0, "blocks": [{"address": 77, "size": 1024, "state": "active_allocated"}]},
                {"device": 1, "blocks": [{"address": 123, "size": 512 * MiB, "state": "active_allocated"}]}]
    monkeypatch.setattr(torch.cuda, "memory_snapshot", lambda: segments)
    found = {4096: big, 77: small, 123: 100, 555: 7}
    assert memory.at_block_sizes(found, ("cuda", 0)) == {4096: 326 * MiB, 77: 1024, 123: 100, 555: 7}
    assert memory.at_block_sizes(found, ("cpu", 0)) == found           # the CPU's count is exact

    def broken():
        raise RuntimeError("no snapshot")
    monkeypatch.setattr(torch.cuda, "memory_snapshot", broken)
    assert memory.at_block_sizes(found, ("cuda", 0)) == found
