"""gpulab.lessons.l12_kernel_fusion: the byte counts of notebook 12, where its bandwidth comes from, the backend
choice, the correctness check, and the kernel count (None on the CPU)."""
import pytest
import torch

import gpulab.lessons.l00_gpu_ceilings as L00
import gpulab.lessons.l12_kernel_fusion as fusion
from gpulab.core.ceilings import Ceiling
from gpulab.core.device import pick_device
from gpulab.lessons.l12_kernel_fusion import PLANS, bytes_moved, check_close, compile_backend, kernels_launched, plan_from_kernels
from gpulab.lessons.l00_gpu_ceilings import bandwidth_ceiling
from gpulab.core.results import ResultsStore


def test_bytes_moved_per_plan():
    n = 8192
    b = bytes_moved(n)
    assert list(b) == list(PLANS)
    assert b["unfused"] == (6 * n * n + n) * 4 == 1_610_645_504
    assert b["add+relu fused"] == (4 * n * n + n) * 4
    assert b["fully fused"] == (2 * n * n + n) * 4 == 536_903_680
    assert bytes_moved(4, element_bytes=2)["fully fused"] == (2 * 16 + 4) * 2
    with pytest.raises(ValueError):
        bytes_moved(0)


def test_the_floor_on_an_h200_is_the_reference_figure():
    # course.md: floor 0.13 ms at 8192^2 with the H200's measured 4.2-4.3 TB/s copy
    ms = bytes_moved(8192)["fully fused"] / 4230e9 * 1e3
    assert ms == pytest.approx(0.127, abs=0.002)


def test_bandwidth_comes_from_notebook_00_when_recorded(on_cpu, results_path):
    store = ResultsStore(results_path)
    store.record("00", "copy_bandwidth", 1234.5, "GB/s", mib=16)
    c = bandwidth_ceiling(store)
    assert c.value == 1234.5 and c.source.startswith("measured ")


def test_bandwidth_falls_back_to_the_datasheet_labelled(monkeypatch):
    sheet = Ceiling("copy_bandwidth", 4800.0, "GB/s", "datasheet: NVIDIA H200 datasheet")
    monkeypatch.setattr(L00, "ceilings", lambda store=None: {"copy_bandwidth": sheet})
    c = bandwidth_ceiling()
    assert c.value == 4800.0
    assert c.source == "notebook 00 has not measured this device; datasheet: NVIDIA H200 datasheet"


def test_bandwidth_is_measured_now_when_nothing_else_exists(on_cpu, monkeypatch, results_path):
    calls = []
    monkeypatch.setattr(L00, "copy_experiment", lambda mib: calls.append(mib) or {"GB/s": 12.0})
    c = bandwidth_ceiling(ResultsStore(results_path))
    assert calls == [64] and c.value == 12.0
    assert "measured just now" in c.source and "not recorded" in c.source


def test_compile_backend(on_cpu, monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(fusion.shutil, "which", lambda name: "/usr/bin/g++" if name == "g++" else None)
    backend, why = compile_backend()
    assert backend == "inductor" and "g++" in why
    monkeypatch.setattr(fusion.shutil, "which", lambda name: None)
    backend, why = compile_backend()
    assert backend == "aot_eager" and "no C++ compiler" in why


def test_check_close():
    ref = torch.tensor([1.0, 2.0, 3.0])
    assert check_close(ref.clone(), ref) == 0.0
    assert check_close(ref + 1e-6, ref) == pytest.approx(1e-6, rel=0.1)
    with pytest.raises(AssertionError, match="largest difference"):
        check_close(ref + 1e-3, ref)
    with pytest.raises(AssertionError, match="shape"):
        check_close(ref[:2], ref)


def test_plan_from_kernels():
    assert plan_from_kernels(None, "unfused") == "unfused"
    assert plan_from_kernels(["a", "b", "c"], "fully fused") == "unfused"
    assert plan_from_kernels(["fused_add_relu", "reduce"], "unfused") == "add+relu fused"
    assert plan_from_kernels(["triton_red_fused_add_mean_relu_0"], "unfused") == "fully fused"
    with pytest.raises(ValueError):
        plan_from_kernels(None, "half fused")


def test_no_kernels_to_count_on_the_cpu(on_cpu):
    assert kernels_launched(lambda: torch.ones(3) + 1) is None


@pytest.mark.gpu
def test_eager_launches_one_kernel_per_operation():
    device = pick_device()
    x = torch.randn(256, 256, device=device)
    y = torch.randn(256, 256, device=device)
    fn = lambda: (x + y).relu().mean(dim=1)  # noqa: E731
    fn()
    names = kernels_launched(fn)
    assert len(names) == 3, names
