"""gpulab.core.device: device choice, settings, facts, fp32 matmul mode."""
import dataclasses
from types import SimpleNamespace

import pytest
import torch

from gpulab.core import device
from gpulab.core.device import SettingError

CPU = torch.device("cpu")


@pytest.fixture
def fake_cuda_available(monkeypatch):
    """PyTorch claims one CUDA GPU (nothing is run on it)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


# -- pick_device ----------------------------------------------------------------
@pytest.mark.cpu_only
def test_pick_device_falls_back_to_cpu_without_cuda():
    assert device.pick_device() == CPU


def test_gpulab_device_cpu_forces_cpu(monkeypatch, fake_cuda_available):
    monkeypatch.setenv("GPULAB_DEVICE", "cpu")
    assert device.pick_device() == CPU


def test_pick_device_takes_the_gpu_when_there_is_one(fake_cuda_available):
    assert device.pick_device() == torch.device("cuda", 0)


def test_setting_ignores_case_and_spaces(monkeypatch, fake_cuda_available):
    monkeypatch.setenv("GPULAB_DEVICE", "  CPU ")
    assert device.pick_device() == CPU


@pytest.mark.cpu_only
def test_gpulab_device_cuda_without_gpu_fails_clearly(monkeypatch):
    monkeypatch.setenv("GPULAB_DEVICE", "cuda")
    with pytest.raises(SettingError, match="PyTorch sees no CUDA GPU") as info:
        device.pick_device()
    assert "gpulab doctor" in str(info.value)


def test_bad_gpulab_device_names_the_allowed_values(monkeypatch):
    monkeypatch.setenv("GPULAB_DEVICE", "gpu")
    with pytest.raises(SettingError) as info:
        device.pick_device()
    msg = str(info.value)
    assert "GPULAB_DEVICE='gpu'" in msg
    assert "allowed values are auto, cuda, cpu" in msg


def test_setting_error_is_a_value_error():
    assert issubclass(SettingError, ValueError)


# -- scale ----------------------------------------------------------------------
@pytest.mark.cpu_only
def test_scale_auto_is_tiny_on_the_cpu():
    assert device.scale() == "tiny"
    assert device.by_scale(tiny=256, full=8192) == 256


def test_scale_auto_is_full_on_a_gpu(fake_cuda_available):
    assert device.scale() == "full"
    assert device.by_scale(tiny=256, full=8192) == 8192


def test_scale_set_explicitly(monkeypatch):
    monkeypatch.setenv("GPULAB_SCALE", "full")
    assert device.scale() == "full"
    assert device.by_scale(tiny="small", full="big") == "big"
    monkeypatch.setenv("GPULAB_SCALE", "tiny")
    assert device.by_scale(tiny="small", full="big") == "small"


def test_empty_scale_means_auto(monkeypatch, on_cpu):
    monkeypatch.setenv("GPULAB_SCALE", "")
    assert device.scale() == "tiny"


def test_bad_scale_names_the_allowed_values(monkeypatch):
    monkeypatch.setenv("GPULAB_SCALE", "huge")
    with pytest.raises(SettingError, match="allowed values are tiny, full, auto"):
        device.scale()
    with pytest.raises(SettingError, match="GPULAB_SCALE='huge'"):
        device.by_scale(tiny=1, full=2)


# -- sync -----------------------------------------------------------------------
def test_sync_on_cpu_never_touches_cuda(monkeypatch):
    def boom(*a):
        raise AssertionError("torch.cuda.synchronize called for the CPU")
    monkeypatch.setattr(torch.cuda, "synchronize", boom)
    assert device.sync(CPU) is None


def test_sync_on_cuda_synchronizes_that_device(monkeypatch):
    seen = []
    monkeypatch.setattr(torch.cuda, "synchronize", seen.append)
    device.sync(torch.device("cuda", 0))
    assert seen == [torch.device("cuda", 0)]


# -- facts ----------------------------------------------------------------------
def test_cpu_facts():
    facts = device.device_facts(CPU)
    assert facts.kind == "cpu"
    assert facts.compute_capability is None
    assert facts.architecture == "CPU"
    assert (facts.tf32, facts.bf16, facts.fp8) == (False, True, False)
    assert facts.datasheet is None and facts.memory_gib is None
    rows = dict(facts.rows())
    assert rows["compute capability"] == "-"
    assert rows["Tensor Core generation"] == "none"
    assert rows["memory"] == "-"
    assert rows["datasheet entry"] == "not in gpulab's table"
    assert rows["torch / CUDA"] == f"{torch.__version__} / {torch.version.cuda or 'CPU build'}"


def test_volta_has_no_tf32_bf16_fp8():
    f = device.facts_for_capability("Tesla V100-SXM2-16GB", 7, 0)
    assert (f.architecture, f.tensor_core_generation) == ("Volta", 1)
    assert (f.tf32, f.bf16, f.fp8) == (False, False, False)
    assert f.datasheet.model == "V100 SXM2"


def test_ampere_has_tf32_and_bf16_but_not_fp8():
    f = device.facts_for_capability("NVIDIA A100-SXM4-80GB", 8, 0)
    assert (f.tf32, f.bf16, f.fp8) == (True, True, False)
    assert f.tensor_core_generation == 3


def test_ada_has_fp8():
    f = device.facts_for_capability("NVIDIA GeForce RTX 4090", 8, 9)
    assert (f.architecture, f.tensor_core_generation) == ("Ada Lovelace", 4)
    assert (f.tf32, f.bf16, f.fp8) == (True, True, True)


def test_hopper_facts():
    f = device.facts_for_capability("NVIDIA H100 80GB HBM3", 9, 0)
    assert (f.architecture, f.tensor_core_generation) == ("Hopper", 4)
    assert f.fp8 and f.tf32 and f.bf16
    assert f.datasheet.model == "H100 SXM"


def test_pascal_has_no_tensor_cores():
    f = device.facts_for_capability("Tesla P40", 6, 1)
    assert f.tensor_core_generation is None
    assert (f.tf32, f.bf16, f.fp8) == (False, False, False)
    assert dict(f.rows())["Tensor Core generation"] == "none"


def test_unknown_gpu_gets_facts_without_datasheet():
    f = device.facts_for_capability("NVIDIA Mystery GPU", 13, 0)
    assert f.architecture == "newer than Blackwell (unrecognised sm_130)"
    assert f.datasheet is None
    assert dict(f.rows())["datasheet entry"] == "not in gpulab's table"


def test_facts_rows_format_sizes():
    f = device.facts_for_capability("NVIDIA A100-SXM4-80GB", 8, 0, sm_count=108,
                                    memory_bytes=80 * 2**30, l2_cache_bytes=40 * 2**20)
    assert f.memory_gib == 80.0
    rows = dict(f.rows())
    assert rows["device"] == "cuda: NVIDIA A100-SXM4-80GB"
    assert rows["compute capability"] == "8.0"
    assert rows["SMs"] == "108"
    assert rows["memory"] == "80.0 GiB"
    assert rows["L2 cache"] == "40 MiB"
    assert rows["TF32 / BF16 / FP8"] == "yes / yes / no"
    assert rows["datasheet entry"] == "A100 SXM 80GB"


def test_device_facts_reads_cuda_properties(monkeypatch):
    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0,
                            multi_processor_count=132, total_memory=80 * 2**30,
                            L2_cache_size=50 * 2**20)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: props)
    f = device.device_facts(torch.device("cuda", 0))
    assert f.kind == "cuda" and f.compute_capability == (9, 0)
    assert (f.sm_count, f.memory_bytes, f.l2_cache_bytes) == (132, 80 * 2**30, 50 * 2**20)
    assert f.datasheet.model == "H100 SXM"


def test_facts_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        device.device_facts(CPU).bf16 = False


# -- float32 matmul mode --------------------------------------------------------
def test_float32_matmul_switches_and_restores():
    before = torch.get_float32_matmul_precision()
    with device.float32_matmul("tf32"):
        assert torch.get_float32_matmul_precision() == "high"
    with device.float32_matmul("ieee"):
        assert torch.get_float32_matmul_precision() == "highest"
    assert torch.get_float32_matmul_precision() == before


def test_float32_matmul_restores_after_an_error():
    before = torch.get_float32_matmul_precision()
    with pytest.raises(RuntimeError):
        with device.float32_matmul("tf32"):
            raise RuntimeError("lesson code failed")
    assert torch.get_float32_matmul_precision() == before


def test_float32_matmul_refuses_unknown_mode():
    with pytest.raises(SettingError, match="allowed values are 'ieee', 'tf32'"):
        with device.float32_matmul("fp16"):
            pass


# -- describe -------------------------------------------------------------------
def test_describe_on_cpu_says_numbers_are_illustrative(on_cpu):
    line = device.describe()
    assert line.startswith("Running on the CPU (")
    assert "scale=tiny" in line
    assert "illustrative only" in line


def test_describe_reports_the_scale_setting(monkeypatch, on_cpu):
    monkeypatch.setenv("GPULAB_SCALE", "full")
    assert "scale=full" in device.describe()


def test_require_cuda_refuses_the_cpu_with_the_reason(monkeypatch):
    from gpulab.core.device import require_cuda
    with pytest.raises(ValueError, match=r"^needs a CUDA GPU: no bus here$"):
        require_cuda("no bus here", torch.device("cpu"))
    monkeypatch.setenv("GPULAB_DEVICE", "cpu")
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        require_cuda("forced CPU")


def test_physical_cores_counts_two_hyperthreads_of_one_core_once(tmp_path, monkeypatch):
    """A Colab VM's 2 vCPUs are commonly one core's two threads (sixth review of issue 40): notebook 03's
    worker floor goes by physical cores; unreadable topology falls back to the logical count."""
    import os
    from gpulab.core import device as D
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(D, "cpu_cores", lambda: 2)
    for cpu, core in ((0, 0), (1, 0)):
        top = tmp_path / f"cpu{cpu}" / "topology"
        top.mkdir(parents=True)
        (top / "physical_package_id").write_text("0\n")
        (top / "core_id").write_text(f"{core}\n")
    assert D.physical_cores(str(tmp_path)) == 1
    (tmp_path / "cpu1" / "topology" / "core_id").write_text("1\n")
    assert D.physical_cores(str(tmp_path)) == 2
    assert D.physical_cores(str(tmp_path / "none")) == 2          # no topology: the logical count
