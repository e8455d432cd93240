"""gpulab.lessons.l05_pcie_transfers: the size sweep arithmetic, and the CPU refusals (the copies need a GPU)."""
import pytest
import torch

from gpulab.lessons.l05_pcie_transfers import log_sizes, nonblocking_return, pin_then_copy, predicted_gbps, transfer_bandwidth

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
])
def test_cpu_is_refused(fn):
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        fn()


def test_bad_arguments_are_refused_before_the_device():
    with pytest.raises(ValueError, match="direction"):
        transfer_bandwidth(4096, "up", device=CPU)
    with pytest.raises(ValueError, match="nbytes"):
        transfer_bandwidth(0, device=CPU)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_transfer_runs():
    dev = torch.device("cuda")
    for direction in ("h2d", "d2h"):
        for pinned in (False, True):
            assert transfer_bandwidth(1 << 20, direction, pinned, device=dev)["GB/s"] > 0
    r = nonblocking_return(1 << 20, pinned=True, device=dev)
    assert r["host_ms"] >= 0 and r["device_ms"] > 0
