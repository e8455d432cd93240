"""gpulab.core.monitor: nvml_status, GpuMonitor and pcie_link, with a fake pynvml."""
import time
from types import SimpleNamespace

import pytest
import torch

from gpulab.core import monitor
from gpulab.core.monitor import METRICS, NVML_PERIOD_MAX_S, GpuMonitor, PcieLink, Sample, nvml_status

CPU = torch.device("cpu")
CUDA0 = torch.device("cuda", 0)


def sampling_monitor(fake, pcie=True):
    """A GpuMonitor wired to a fake NVML, as start() would leave it, without a thread."""
    mon = GpuMonitor(pcie=pcie, device=CPU)
    mon._pynvml, mon._handle, mon._t0 = fake, ("index", 0), time.perf_counter()
    return mon


def sample(t, busy=None, power=None):
    return Sample(t_s=t, busy_pct=busy, mem_used_gib=None, sm_clock_mhz=None,
                  pcie_rx_gbps=None, pcie_tx_gbps=None, power_w=power)


# -- nvml_status ---------------------------------------------------------------------
@pytest.mark.cpu_only
def test_real_nvml_is_unusable_here():
    ok, why = nvml_status()
    assert ok is False
    assert "libnvidia-ml.so" in why or "not loaded" in why


def test_missing_pynvml_module(monkeypatch):
    def no_module():
        raise ImportError("No module named 'pynvml'")
    monkeypatch.setattr(monitor, "import_pynvml", no_module)
    ok, why = nvml_status()
    assert ok is False
    assert "pip install nvidia-ml-py" in why


@pytest.mark.parametrize("error, explanation", [
    ("LibraryNotFound", "NVML's library (libnvidia-ml.so) was not found"),
    ("DriverNotLoaded", "the NVIDIA driver is installed but not loaded"),
    ("NoPermission", "no permission to talk to the NVIDIA driver"),
    ("Unknown", "NVML failed to start: Unknown (fake)."),
])
def test_nvml_init_errors_are_explained(fake_pynvml, use_pynvml, error, explanation):
    fake = use_pynvml(fake_pynvml(init_error=error))
    ok, why = nvml_status()
    assert ok is False
    assert why.startswith(explanation)
    assert fake.calls["nvmlShutdown"] == 0       # init failed: nothing to shut down


def test_nvml_ready(fake_pynvml, use_pynvml):
    fake = use_pynvml(fake_pynvml(count=2, driver=b"550.54.15"))
    assert nvml_status() == (True, "NVML ready: driver 550.54.15, 2 GPU(s).")
    assert fake.calls["nvmlInit"] == fake.calls["nvmlShutdown"] == 1


def test_nvml_driver_version_as_str(fake_pynvml, use_pynvml):
    use_pynvml(fake_pynvml(driver="580.95.05"))
    assert nvml_status() == (True, "NVML ready: driver 580.95.05, 1 GPU(s).")


def test_nvml_without_gpus(fake_pynvml, use_pynvml):
    fake = use_pynvml(fake_pynvml(count=0))
    assert nvml_status() == (False, "NVML runs but reports no GPU.")
    assert fake.calls["nvmlShutdown"] == 1


def test_nvml_error_after_init_is_reported_not_raised(fake_pynvml, use_pynvml):
    fake = use_pynvml(fake_pynvml(unsupported=("driver",)))
    ok, why = nvml_status()
    assert ok is False and why
    assert fake.calls["nvmlShutdown"] == 1


# -- GpuMonitor without NVML -------------------------------------------------------------
def test_monitor_on_cpu_says_why_and_records_nothing():
    with GpuMonitor(device=CPU) as mon:
        time.sleep(0.01)
    assert mon.status == "GPU monitor off: the course is running on the CPU."
    assert mon.available is False
    assert mon.samples == [] and not mon.running
    assert mon.timeline() == {"t_s": [], **{m: [] for m in METRICS}}
    assert mon.mean("busy_pct") is None
    assert mon.duration_s == 0.0


@pytest.mark.cpu_only
def test_monitor_defaults_to_the_cpu_without_cuda():
    mon = GpuMonitor().start()
    assert mon.status == "GPU monitor off: the course is running on the CPU."
    mon.stop()


def test_monitor_on_gpu_without_pynvml(monkeypatch):
    def no_module():
        raise ImportError("No module named 'pynvml'")
    monkeypatch.setattr(monitor, "import_pynvml", no_module)
    mon = GpuMonitor(device=CUDA0).start()
    assert mon.status.startswith("GPU monitor off: the pynvml module is missing")
    assert mon.available is False and not mon.running


def test_monitor_on_gpu_without_driver(fake_pynvml, use_pynvml):
    use_pynvml(fake_pynvml(init_error="LibraryNotFound"))
    mon = GpuMonitor(device=CUDA0).start()
    assert mon.status.startswith("GPU monitor off: NVML's library (libnvidia-ml.so) was not found")
    assert mon.available is False


def test_interval_is_clamped():
    assert GpuMonitor(interval_s=0.01, device=CPU).interval_s == 0.1           # PCIe queries block
    assert GpuMonitor(interval_s=0.01, pcie=False, device=CPU).interval_s == 0.02
    assert GpuMonitor(interval_s=0.5, device=CPU).interval_s == 0.5


def test_mean_of_unknown_metric_is_refused():
    mon = GpuMonitor(device=CPU)
    with pytest.raises(ValueError, match="unknown metric 'gpu_util'; choose from busy_pct"):
        mon.mean("gpu_util")
    with pytest.raises(ValueError):
        mon.mean("t_s")


# -- sampling through the fake ----------------------------------------------------------
def test_sample_once_converts_units(fake_pynvml):
    mon = sampling_monitor(fake_pynvml())
    s = mon.sample_once()
    assert s.busy_pct == 87.0
    assert s.mem_used_gib == 3.0                 # bytes -> GiB
    assert s.sm_clock_mhz == 1410.0
    assert s.pcie_rx_gbps == pytest.approx(12.0)  # KB/s -> GB/s
    assert s.pcie_tx_gbps == pytest.approx(3.5)
    assert s.t_s >= 0


def test_power_in_watts(fake_pynvml):
    s = sampling_monitor(fake_pynvml(unsupported=())).sample_once()
    assert s.power_w == 250.0                    # mW -> W


def test_unsupported_metric_reads_none_and_is_not_asked_again(fake_pynvml):
    fake = fake_pynvml(unsupported=("power_w",))
    mon = sampling_monitor(fake)
    first, second = mon.sample_once(), mon.sample_once()
    assert first.power_w is None and second.power_w is None
    assert list(mon.unsupported) == ["power_w"]
    assert "Not Supported" in mon.unsupported["power_w"]
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1
    assert second.busy_pct == 87.0


def test_pcie_off_skips_the_slow_queries(fake_pynvml):
    fake = fake_pynvml()
    s = sampling_monitor(fake, pcie=False).sample_once()
    assert (s.pcie_rx_gbps, s.pcie_tx_gbps) == (None, None)
    assert fake.calls["nvmlDeviceGetPcieThroughput"] == 0
    assert s.busy_pct == 87.0


def test_timeline_and_mean(fake_pynvml):
    mon = sampling_monitor(fake_pynvml(busy=(50, 70, 90)))
    mon.samples = [mon.sample_once() for _ in range(3)]
    tl = mon.timeline()
    assert list(tl) == ["t_s", *METRICS]
    assert tl["busy_pct"] == [50.0, 70.0, 90.0]
    assert tl["power_w"] == [None, None, None]
    assert tl["t_s"] == sorted(tl["t_s"])
    assert mon.mean("busy_pct") == 70.0
    assert mon.mean("mem_used_gib") == 3.0
    assert mon.mean("power_w") is None


def test_mean_skips_missing_readings():
    mon = GpuMonitor(device=CPU)
    mon.samples = [sample(0.0, busy=10.0), sample(0.5, busy=None), sample(1.5, busy=30.0)]
    assert mon.mean("busy_pct") == 20.0
    assert mon.duration_s == 1.5
    # a reading covers NVML's past sample period: those of the first second cover time before the sampling
    assert mon.mean("busy_pct", since_s=NVML_PERIOD_MAX_S) == 30.0
    assert mon.mean("busy_pct", since_s=2.0) is None


def test_monitor_thread_samples_and_shuts_nvml_down(fake_pynvml, use_pynvml, monkeypatch):
    fake = use_pynvml(fake_pynvml())
    monkeypatch.setattr(monitor, "nvml_handle", lambda pynvml, device: ("index", 0))
    with GpuMonitor(interval_s=0.02, pcie=False, device=CUDA0) as mon:
        assert mon.available and mon.status == "sampling every 0.02 s"
        with pytest.raises(RuntimeError, match="already running"):
            mon.start()
        time.sleep(0.15)
    assert len(mon.samples) >= 3
    assert not mon.running and mon._pynvml is None
    assert mon.status == f"{len(mon.samples)} samples over {mon.duration_s:.1f} s"
    assert fake.calls["nvmlInit"] == fake.calls["nvmlShutdown"] == 2   # nvml_status + monitor
    assert mon.mean("busy_pct") == 87.0


# -- the NVML handle and the PCIe link ---------------------------------------------------
def test_handle_is_found_by_uuid(fake_pynvml, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(uuid="1234-abcd"))
    assert monitor.nvml_handle(fake_pynvml(), CUDA0) == ("uuid", "GPU-1234-abcd")
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(uuid="GPU-5678"))
    assert monitor.nvml_handle(fake_pynvml(), CUDA0) == ("uuid", "GPU-5678")


def test_handle_falls_back_to_the_index(fake_pynvml, monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(uuid="1234-abcd"))
    fake = fake_pynvml(unsupported=("uuid",))
    assert monitor.nvml_handle(fake, torch.device("cuda", 1)) == ("index", 1)


def test_pcie_link_on_cpu_is_none():
    assert monitor.pcie_link(CPU) is None


def test_pcie_link_without_nvml(fake_pynvml, use_pynvml):
    use_pynvml(fake_pynvml(init_error="DriverNotLoaded"))
    assert monitor.pcie_link(CUDA0) is None


def test_pcie_link_from_nvml(fake_pynvml, use_pynvml, monkeypatch):
    fake = use_pynvml(fake_pynvml(link=(4, 16, 5, 16)))
    monkeypatch.setattr(monitor, "nvml_handle", lambda pynvml, device: ("index", 0))
    link = monitor.pcie_link(CUDA0)
    assert link == PcieLink(generation=4, width=16, max_generation=5, max_width=16)
    assert link.peak_gbps == pytest.approx(31.504)
    assert link.max_peak_gbps == pytest.approx(63.008)
    assert str(link) == "PCIe gen 5 x16 (~63 GB/s each way); running now at gen 4 x16"
    assert fake.calls["nvmlShutdown"] == 2


def test_pcie_link_query_failing_gives_none(fake_pynvml, use_pynvml, monkeypatch):
    fake = use_pynvml(fake_pynvml(unsupported=("link",)))
    monkeypatch.setattr(monitor, "nvml_handle", lambda pynvml, device: ("index", 0))
    assert monitor.pcie_link(CUDA0) is None
    assert fake.calls["nvmlShutdown"] == 2


def test_pcie_link_of_unknown_generation():
    link = PcieLink(generation=7, width=16, max_generation=7, max_width=16)
    assert link.max_peak_gbps is None
    assert str(link) == "PCIe gen 7 x16; running now at gen 7 x16"


# -- on a GPU -----------------------------------------------------------------------------
@pytest.mark.gpu
def test_monitor_sees_the_gpu_busy_during_matmuls():
    if not nvml_status()[0]:
        pytest.skip(nvml_status()[1])
    a = torch.randn(4096, 4096, device="cuda")
    with GpuMonitor(interval_s=0.1, pcie=False) as mon:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 1.5:
            for _ in range(20):
                a @ a
            torch.cuda.synchronize()
    assert mon.available
    assert len(mon.samples) >= 5
    busy = [v for v in mon.timeline()["busy_pct"] if v is not None]
    assert max(busy) >= 50
    assert mon.mean("mem_used_gib") > 0


def test_started_at_is_none_before_start_then_the_sampling_clock(fake_pynvml):
    assert GpuMonitor().started_at is None
    mon = sampling_monitor(fake_pynvml())
    s = mon.sample_once()
    assert mon.started_at is not None
    assert 0 <= s.t_s < 5 and abs((mon.started_at + s.t_s) - time.perf_counter()) < 5


def test_other_processes_leaves_this_one_out():
    from gpulab.core.monitor import other_processes
    procs = [(10, 5 << 30), (11, 1 << 30)]
    assert other_processes(procs, own_pid=11, own_context=True) == [(10, 5 << 30)]
    # in a container NVML lists host ids: with a CUDA context here, the smallest holder is taken as ours
    assert other_processes(procs, own_pid=99, own_context=True) == [(10, 5 << 30)]
    assert other_processes([(10, 1)], own_pid=99, own_context=True) == []
    # no CUDA context here: every listed process is another one
    assert other_processes(procs, own_pid=99, own_context=False) == procs


def test_sharing_mark_is_empty_on_the_cpu():
    import torch
    from gpulab.core.monitor import sharing_mark
    assert sharing_mark(torch.device("cpu")) == {}


def test_a_mig_slice_gets_its_own_nvml_handle_not_the_gpus(monkeypatch):
    """Under CUDA_VISIBLE_DEVICES=MIG-..., torch's device 0 is the slice: NVML is asked for that slice, not
    for index 0 (the whole first GPU)."""
    import types

    import torch

    from gpulab.core import monitor

    class NVMLError(Exception):
        pass
    asked = []

    def by_uuid(name):
        asked.append(name)
        if name == "MIG-abc":
            return "slice handle"
        raise NVMLError(name)
    fake = types.SimpleNamespace(NVMLError=NVMLError, nvmlDeviceGetHandleByUUID=by_uuid,
                                 nvmlDeviceGetHandleByIndex=lambda i: f"GPU {i}")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid="1234"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-abc")
    assert monitor.nvml_handle(fake, torch.device("cuda", 0)) == "slice handle" and asked == ["MIG-abc"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    asked.clear()
    assert monitor.nvml_handle(fake, torch.device("cuda", 0)) == "GPU 0"
    assert asked == ["GPU-1234", "MIG-1234"]
