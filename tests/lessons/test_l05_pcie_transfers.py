"""gpulab.lessons.l05_pcie_transfers: the size sweep arithmetic, and the CPU refusals (the copies need a GPU)."""
import pytest
import torch

from gpulab.lessons.l05_pcie_transfers import (config, cpu_threads, log_sizes, nonblocking_return, pin_then_copy,
                                               plan, predicted_gbps, random_bytes, transfer_bandwidth, zero_page_copy)

CPU = torch.device("cpu")


def test_log_sizes():
    assert log_sizes(4096, 65536) == [4096, 8192, 16384, 32768, 65536]
    two = log_sizes(1024, 4096, per_octave=2)
    assert two[0] == 1024 and two[-1] == 4096 and len(two) == 5 and two == sorted(two)
    assert log_sizes(1000, 1000) == [1000]
    assert log_sizes(1000, 1500)[-1] == 1500
    with pytest.raises(ValueError):
        log_sizes(0, 10)
    with pytest.raises(ValueError):
        log_sizes(10, 5)


def test_predicted_gbps():
    # 10 us overhead, 50 GB/s: 500 KB takes 10 us + 10 us -> half the peak
    assert predicted_gbps(500_000, 50.0, overhead_us=10.0) == pytest.approx(25.0)
    assert predicted_gbps(10**12, 50.0) == pytest.approx(50.0, rel=1e-3)
    assert predicted_gbps(1000, 50.0) < 1.0


@pytest.mark.parametrize("fn", [
    lambda: transfer_bandwidth(4096, "h2d", True, device=CPU),
    lambda: transfer_bandwidth(4096, "d2h", False, device=CPU),
    lambda: nonblocking_return(4096, pinned=True, device=CPU),
    lambda: pin_then_copy(4096, device=CPU),
    lambda: zero_page_copy(4096, device=CPU),
])
def test_cpu_is_refused(fn):
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        fn()


def test_bad_arguments_are_refused_before_the_device():
    with pytest.raises(ValueError, match="direction"):
        transfer_bandwidth(4096, "up", device=CPU)
    with pytest.raises(ValueError, match="nbytes"):
        transfer_bandwidth(0, device=CPU)
    with pytest.raises(ValueError, match="nbytes"):
        zero_page_copy(0, device=CPU)


def test_cpu_threads_restores_the_thread_count():
    before = torch.get_num_threads()
    with cpu_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with cpu_threads(None):
        assert torch.get_num_threads() == before


def test_random_bytes_write_every_page_and_repeat_with_the_seed():
    b = random_bytes(3 * 4096 + 5)
    assert b.dtype == torch.uint8 and b.numel() == 3 * 4096 + 5
    assert torch.equal(b, random_bytes(3 * 4096 + 5))
    pages = b[: 3 * 4096].view(3, 4096)
    assert bool((pages != 0).any(dim=1).all())      # no page left as zeros


def test_plan_counts_the_zero_page_copies():
    full = {w.ceiling: w.amount for w in plan("full").work}
    assert full["h2d_pageable"] > 2 * config("full")["zero_page_bytes"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_transfer_runs():
    dev = torch.device("cuda")
    for direction in ("h2d", "d2h"):
        for pinned in (False, True):
            assert transfer_bandwidth(1 << 20, direction, pinned, device=dev)["GB/s"] > 0
    r = nonblocking_return(1 << 20, pinned=True, device=dev)
    assert r["host_ms"] >= 0 and r["device_ms"] > 0
    trap = pin_then_copy(1 << 20, device=dev, budget_s=0.01)
    assert trap["timings"]["pageable copy"].method == "host clock, synchronized"
    assert trap["timings"]["pin_memory() + copy, CUDA events"].method == "cuda events"
    assert trap["threads"] == torch.get_num_threads()
    zero = zero_page_copy(1 << 20, device=dev, budget_s=0.01)
    assert zero["untouched"] > 0 and zero["random"] > 0


def test_the_pinned_floor_follows_the_hosts_memcpy_against_the_link():
    """Issue 24: pinned >= 2x pageable came from the H200's host (PCIe gen 5, 55 GB/s pinned); a gen 3
    desktop whose one-thread memcpy nearly keeps up with its link cannot show 2x."""
    from gpulab.lessons.l05_pcie_transfers import PINNED_FLOOR_SHARE, host_memcpy_gbps, pinned_floor
    low, why = pinned_floor(55.0, 10.0)                  # a fast link, a memcpy five times slower
    assert low == PINNED_FLOOR_SHARE * 5.5 and "predicted 5.5x" in why
    assert pinned_floor(12.0, 10.0)[0] == 1.0            # gen 3: pinned need only not be slower
    assert pinned_floor(5.0, 20.0)[0] == 1.0             # a memcpy faster than the link
    assert host_memcpy_gbps(8 * 2**20, repeat=2) > 0.1


# -- the pageable peak: the CPU's cache (issue 40) --------------------------------------------------
def _cache_dir(root, cpu, index, level, kind, size, shared="0-3"):
    d = root / f"cpu{cpu}" / "cache" / f"index{index}"
    d.mkdir(parents=True)
    for name, text in (("level", f"{level}\n"), ("type", f"{kind}\n"), ("size", f"{size}\n"),
                       ("shared_cpu_list", f"{shared}\n")):
        (d / name).write_text(text)


def test_host_cache_reads_the_last_level_from_sysfs(tmp_path):
    from gpulab.lessons.l05_pcie_transfers import host_cache
    _cache_dir(tmp_path, 2, 0, 1, "Data", "48K", "2")
    _cache_dir(tmp_path, 2, 1, 1, "Instruction", "32K", "2")
    _cache_dir(tmp_path, 2, 2, 2, "Unified", "2048K", "2")
    _cache_dir(tmp_path, 2, 3, 3, "Unified", "105M", "0-55")
    got = host_cache(cpu=2, root=str(tmp_path))
    assert got["level"] == 3 and got["bytes"] == 105 * 2**20 and got["shared_cpus"] == "0-55"
    assert got["path"].endswith("cpu2/cache/index3/size")
    assert host_cache(cpu=7, root=str(tmp_path)) is None            # nothing reported: unknown, not zero
    assert host_cache(root="/nonexistent") is None


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_cache_probe_rotates_through_more_than_the_cache(monkeypatch, direction):
    """Run on the CPU with the GPU check bypassed: the buffer count, the check and the host clock."""
    import gpulab.lessons.l05_pcie_transfers as L05
    monkeypatch.setattr(L05, "require_cuda", lambda why, device=None: CPU)
    r = L05.cache_probe(4096, direction, cache_bytes=16384, budget_s=0.01)
    assert r["buffers"] == 9 and r["rotated_bytes"] == 9 * 4096 and r["enough"]      # > 2 x 16 KiB
    assert r["reused"] > 0 and r["rotated"] > 0
    assert {t.method for t in r["timings"].values()} == {"host clock, synchronized"}
    monkeypatch.setattr(L05, "ROTATE_MAX", 64 * 1024)        # unknown cache: rotate through ROTATE_MAX in all
    unknown = L05.cache_probe(4096, direction, cache_bytes=None, budget_s=0.01)
    assert not unknown["enough"] and unknown["rotated_bytes"] == 64 * 1024
    with pytest.raises(ValueError, match="direction"):
        L05.cache_probe(4096, "up")
    with pytest.raises(ValueError, match="nbytes"):
        L05.cache_probe(0)

