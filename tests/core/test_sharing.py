"""gpulab.core.monitor.gpu_sharing: a MIG slice or other processes on the GPU, read from NVML (faked)."""
import os
from types import SimpleNamespace

import pytest
import torch

from gpulab.core import monitor

CUDA0 = torch.device("cuda", 0)


class FakeNvml:
    NVML_DEVICE_MIG_ENABLE = 1

    class NVMLError(Exception):
        pass

    def __init__(self, mig=0, procs=(), mig_error=False, names=None):
        self.mig, self.procs, self.mig_error, self.names = mig, procs, mig_error, names or {}

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetMigMode(self, h):
        if self.mig_error:
            raise self.NVMLError("Not Supported")
        return self.mig, self.mig

    def nvmlSystemGetProcessName(self, pid):
        if pid not in self.names:
            raise self.NVMLError("Not Found")
        return self.names[pid]

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.procs]


@pytest.fixture
def gpu(monkeypatch):
    def use(fake, name="NVIDIA H200"):
        monkeypatch.setattr(monitor, "import_pynvml", lambda: fake)
        monkeypatch.setattr(monitor, "nvml_status", lambda: (True, "fake"))
        monkeypatch.setattr(monitor, "nvml_handle", lambda pynvml, device: "h")
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        return monitor.gpu_sharing(CUDA0)
    return use


def test_an_unshared_gpu(gpu):
    s = gpu(FakeNvml(procs=[(os.getpid(), 2**30)]))          # only this process
    assert not s.shared and s.note == "this GPU is not shared"


def test_other_processes_are_counted_with_their_memory(gpu):
    s = gpu(FakeNvml(procs=[(os.getpid(), 2**30), (1, 3 * 2**30), (2, 2**30)]))
    assert s.shared and s.other_processes == 2 and s.other_memory_gib == pytest.approx(4.0)
    assert "2 other process(es)" in s.note and "timings vary" in s.note


def test_an_mps_server_is_not_another_user(gpu):
    """Under MPS NVML lists the server (nvidia-cuda-mps-server) as a compute process: a learner alone under
    roomrun --mps read "1 other process(es) (0.1 GiB)" on the H200 (results/room/2026-12-03-h200-mps-07,
    alone.json). The server is left out; a second client is still another user."""
    server = (4321, 100 << 20)
    names = {4321: b"/usr/local/nvidia/bin/nvidia-cuda-mps-server"}
    assert not gpu(FakeNvml(procs=[(os.getpid(), 2**30), server], names=names)).shared
    s = gpu(FakeNvml(procs=[(os.getpid(), 2**30), server, (77, 2**30)], names={**names, 77: "python3"}))
    assert s.shared and s.other_processes == 1
    assert gpu(FakeNvml(procs=[(os.getpid(), 2**30), server])).other_processes == 1   # unnamed: counted


def test_a_mig_slice_is_named_from_nvml_or_from_the_device_name(gpu):
    assert gpu(FakeNvml(mig=1)).mig
    s = gpu(FakeNvml(mig_error=True), name="NVIDIA A100-SXM4-40GB MIG 1g.5gb")
    assert s.mig and "MIG slice" in s.note


def test_nothing_to_say_on_the_cpu():
    assert monitor.gpu_sharing(torch.device("cpu")) is None


def test_a_room_declares_a_time_sliced_gpu_shared(monkeypatch):
    """Inside a container NVML sees no other learner's processes: the hub's time-sliced profile says so."""
    import torch

    from gpulab.core import monitor
    monkeypatch.setenv("GPULAB_SHARED_GPU", "time-sliced")
    assert monitor.sharing_mark(torch.device("cuda", 0)) == {"shared": "declared shared by the room (time-sliced)"}
    assert monitor.sharing_mark(torch.device("cpu")) == {}
