"""Shared set-up for gpulab's unit tests.

- matplotlib draws off screen (Agg), chosen before anything imports pyplot.
- Every test gets its own results file and no GPULAB_SCALE / GPULAB_DEVICE,
  so nothing reads or writes ~/.gpulab and the machine's settings don't leak in; nor the memory
  modes the root conftest.py sets for notebooks (GPULAB_MEMORY_CPU / _STRICT / _PLANT, GPULAB_GRADING_STRICT).
- `@pytest.mark.gpu` tests are skipped without CUDA; `@pytest.mark.cpu_only`
  tests check the no-GPU fallbacks as they really happen and are skipped with CUDA.
- `fake_pynvml` builds a stand-in for the `pynvml` module (no NVIDIA driver needed).
"""
from __future__ import annotations

import collections
import itertools
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
import torch  # noqa: E402

CPU = torch.device("cpu")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "cpu_only: checks the no-CUDA fallback as it really happens (skipped with a GPU)")


def pytest_collection_modifyitems(config, items):
    has_gpu = torch.cuda.is_available()
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_cpu = pytest.mark.skip(reason="checks the no-GPU fallback; this machine has a CUDA GPU")
    for item in items:
        if not has_gpu and item.get_closest_marker("gpu"):
            item.add_marker(skip_gpu)
        if has_gpu and item.get_closest_marker("cpu_only"):
            item.add_marker(skip_cpu)


@pytest.fixture(autouse=True)
def isolated_gpulab(tmp_path, monkeypatch):
    """Own results file, default settings."""
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path / "results.json"))
    monkeypatch.delenv("GPULAB_SCALE", raising=False)
    monkeypatch.delenv("GPULAB_DEVICE", raising=False)
    for name in ("GPULAB_MEMORY_CPU", "GPULAB_MEMORY_STRICT", "GPULAB_MEMORY_PLANT",    # the notebooks' modes
                 "GPULAB_GRADING_STRICT"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def results_path(tmp_path):
    """The file GPULAB_RESULTS points at in this test."""
    return tmp_path / "results.json"


@pytest.fixture
def on_cpu(monkeypatch):
    """Run the course on the CPU even where a GPU exists (GPULAB_DEVICE=cpu)."""
    monkeypatch.setenv("GPULAB_DEVICE", "cpu")


# -- a fake pynvml ------------------------------------------------------------
class NVMLError(Exception):
    """Stands in for pynvml.NVMLError; subclasses are named like pynvml's own."""


NVML_ERRORS = {
    name: type(f"NVMLError_{name}", (NVMLError,), {})
    for name in ("LibraryNotFound", "DriverNotLoaded", "NoPermission", "NotSupported",
                 "NotFound", "Unknown")
}


class FakePynvml:
    """Just enough of the `pynvml` module for gpulab.core.monitor, counting every call.

    Readings: GPU busy `busy` % (cycled), 3 GiB used, SM clock 1410 MHz,
    PCIe rx 12e6 KB/s and tx 3.5e6 KB/s, power 250000 mW; each metric named in
    `unsupported` raises NVMLError_NotSupported instead.
    """

    NVMLError = NVMLError
    NVML_CLOCK_SM = 1
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1

    def __init__(self, init_error: str | None = None, count: int = 1,
                 driver: str | bytes = b"550.54.15", unsupported=("power_w",), busy=(87,),
                 link=(4, 16, 5, 16)):
        for name, cls in NVML_ERRORS.items():
            setattr(self, f"NVMLError_{name}", cls)
        self.init_error = init_error
        self.count = count
        self.driver = driver
        self.unsupported = set(unsupported)
        self._busy = itertools.cycle(busy)
        self.link = link
        self.calls: collections.Counter[str] = collections.Counter()

    def _read(self, call: str, metric: str | None = None) -> None:
        self.calls[call] += 1
        if metric in self.unsupported:
            raise NVML_ERRORS["NotSupported"]("Not Supported")

    # life cycle
    def nvmlInit(self):
        self.calls["nvmlInit"] += 1
        if self.init_error:
            raise NVML_ERRORS[self.init_error](f"{self.init_error} (fake)")

    def nvmlShutdown(self):
        self.calls["nvmlShutdown"] += 1

    def nvmlDeviceGetCount(self):
        self._read("nvmlDeviceGetCount", "count")
        return self.count

    def nvmlSystemGetDriverVersion(self):
        self._read("nvmlSystemGetDriverVersion", "driver")
        return self.driver

    # handles
    def nvmlDeviceGetHandleByUUID(self, uuid):
        self._read("nvmlDeviceGetHandleByUUID", "uuid")
        return ("uuid", uuid)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._read("nvmlDeviceGetHandleByIndex")
        return ("index", index)

    # metrics
    def nvmlDeviceGetUtilizationRates(self, h):
        self._read("nvmlDeviceGetUtilizationRates", "busy_pct")
        return SimpleNamespace(gpu=next(self._busy), memory=40)

    def nvmlDeviceGetMemoryInfo(self, h):
        self._read("nvmlDeviceGetMemoryInfo", "mem_used_gib")
        return SimpleNamespace(used=3 * 2**30, free=77 * 2**30, total=80 * 2**30)

    def nvmlDeviceGetClockInfo(self, h, clock):
        self._read("nvmlDeviceGetClockInfo", "sm_clock_mhz")
        assert clock == self.NVML_CLOCK_SM
        return 1410

    def nvmlDeviceGetPcieThroughput(self, h, counter):
        metric = "pcie_rx_gbps" if counter == self.NVML_PCIE_UTIL_RX_BYTES else "pcie_tx_gbps"
        self._read("nvmlDeviceGetPcieThroughput", metric)
        return 12_000_000 if metric == "pcie_rx_gbps" else 3_500_000   # KB/s

    def nvmlDeviceGetPowerUsage(self, h):
        self._read("nvmlDeviceGetPowerUsage", "power_w")
        return 250_000   # mW

    # PCIe link
    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        self._read("link", "link")
        return self.link[0]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self.link[1]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self.link[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self.link[3]


@pytest.fixture
def fake_pynvml():
    """Factory: fake_pynvml(init_error="DriverNotLoaded", count=0, unsupported=(...), ...)."""
    return FakePynvml


@pytest.fixture
def use_pynvml(monkeypatch):
    """Make gpulab.core.monitor import the given fake instead of the real pynvml."""
    import gpulab.core.monitor

    def use(fake):
        monkeypatch.setattr(gpulab.core.monitor, "import_pynvml", lambda: fake)
        return fake
    return use
