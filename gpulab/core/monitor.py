"""Watch the GPU while a lesson runs, through NVML (the library behind nvidia-smi).

Introduced in notebook 00, used in 03 (input stalls) and 05 (PCIe).

    with GpuMonitor() as mon:
        train_for_a_while()
    mon.timeline()     # {"t_s": [...], "busy_pct": [...], "mem_used_gib": [...], ...}

Without NVML (no NVIDIA driver, the CPU, a container without the driver's
utility capability, WSL metrics that are not supported) the monitor says why
in `mon.status` and records nothing; the lesson goes on.

Depends on the `nvidia-ml-py` distribution, imported as `pynvml`.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, fields
from typing import Any
import torch
from gpulab.core.device import pick_device
from gpulab.core import specs


# NVML's "GPU utilization" is the share of the last sample period (1/6 s to 1 s,
# depending on the product) in which at least one kernel was running: it says
# the GPU was busy, not how much of it was used.
# The longest of those periods: a sample read less than this long after sampling began covers time before it.
NVML_PERIOD_MAX_S = 1.0
METRICS = ("busy_pct", "mem_used_gib", "sm_clock_mhz", "pcie_rx_gbps", "pcie_tx_gbps", "power_w")


def import_pynvml():
    import pynvml  # from the nvidia-ml-py distribution
    return pynvml


def nvml_status() -> tuple[bool, str]:
    """(usable, explanation) for NVML on this machine."""
    try:
        pynvml = import_pynvml()
    except ImportError:
        return False, ("the pynvml module is missing: install the `nvidia-ml-py` package "
                       "(pip install nvidia-ml-py).")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        name = type(err).__name__
        if "LibraryNotFound" in name:
            why = ("NVML's library (libnvidia-ml.so) was not found: no NVIDIA driver on this "
                   "machine, or a container started without the driver's 'utility' capability.")
        elif "DriverNotLoaded" in name:
            why = "the NVIDIA driver is installed but not loaded (no GPU, or the module failed)."
        elif "NoPermission" in name:
            why = "no permission to talk to the NVIDIA driver."
        else:
            why = f"NVML failed to start: {err}."
        return False, why
    try:
        count = pynvml.nvmlDeviceGetCount()
        driver = pynvml.nvmlSystemGetDriverVersion()
        if isinstance(driver, bytes):
            driver = driver.decode()
    except pynvml.NVMLError as err:
        return False, f"NVML started but could not list the GPUs: {err}."
    finally:
        pynvml.nvmlShutdown()
    if count == 0:
        return False, "NVML runs but reports no GPU."
    return True, f"NVML ready: driver {driver}, {count} GPU(s)."


def nvml_handle(pynvml, device: torch.device):
    """NVML handle of the torch device, matched by UUID (CUDA_VISIBLE_DEVICES renumbers GPUs): a MIG slice's
    own handle where CUDA_VISIBLE_DEVICES names it (MIG-...) or its UUID is a slice's, else the GPU's; by
    index only when no UUID matches (which, on a slice, would be the whole GPU's)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = str(torch.cuda.get_device_properties(index).uuid)
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    candidates = [visible[index]] if index < len(visible) and visible[index].startswith("MIG-") else []
    candidates += [uuid] if uuid.startswith(("GPU-", "MIG-")) else [f"GPU-{uuid}", f"MIG-{uuid}"]
    for name in candidates:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(name)
        except pynvml.NVMLError:
            continue
    return pynvml.nvmlDeviceGetHandleByIndex(index)


@dataclass(frozen=True)
class Sample:
    t_s: float
    busy_pct: float | None
    mem_used_gib: float | None
    sm_clock_mhz: float | None
    pcie_rx_gbps: float | None
    pcie_tx_gbps: float | None
    power_w: float | None


def _readers(pynvml) -> dict[str, Any]:
    kb_per_s_to_gbps = 1e3 / 1e9
    return {
        "busy_pct": lambda h: pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
        "mem_used_gib": lambda h: pynvml.nvmlDeviceGetMemoryInfo(h).used / 2**30,
        "sm_clock_mhz": lambda h: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
        # Each PCIe throughput query blocks ~20 ms (NVML averages over that window).
        "pcie_rx_gbps": lambda h: pynvml.nvmlDeviceGetPcieThroughput(
            h, pynvml.NVML_PCIE_UTIL_RX_BYTES) * kb_per_s_to_gbps,
        "pcie_tx_gbps": lambda h: pynvml.nvmlDeviceGetPcieThroughput(
            h, pynvml.NVML_PCIE_UTIL_TX_BYTES) * kb_per_s_to_gbps,
        "power_w": lambda h: pynvml.nvmlDeviceGetPowerUsage(h) / 1e3,
    }


def slice_without_utilization() -> str:
    """Why NVML's utilization is not read here ("" where it is): under a MIG-slice profile, as on a real
    slice, where NVML reports it Not Supported (the GPU's figure would count every slice's kernels)."""
    from gpulab.core.device import profile
    prof = profile()
    if prof is not None and not prof.nvml_utilization:
        return (f"a MIG slice ({prof.key}: {prof.mig}) has no NVML utilization of its own; "
                "the profiler's busy share is the measure there")
    return ""


class GpuMonitor:
    """Background sampler of GPU busy %, memory, SM clock, PCIe rx/tx and power.

    `interval_s` is clamped to >= 0.1 s when PCIe is sampled (each PCIe query
    blocks ~20 ms). Use as a context manager or call start()/stop().
    """

    def __init__(self, interval_s: float = 0.2, pcie: bool = True,
                 device: torch.device | None = None):
        self.device = device or pick_device()
        self.pcie = pcie
        self.interval_s = max(interval_s, 0.1) if pcie else max(interval_s, 0.02)
        self.samples: list[Sample] = []
        self.unsupported: dict[str, str] = {}
        self.available = False
        self.status = "not started"
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._pynvml = None
        self._handle = None

    # -- life cycle -------------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether the sampling thread is running (between `start()` and `stop()`)."""
        return self._thread is not None

    def start(self) -> "GpuMonitor":
        if self._thread is not None:
            raise RuntimeError("this GpuMonitor is already running")
        self.samples = []
        if self.device.type != "cuda":
            self.status = "GPU monitor off: the course is running on the CPU."
            return self
        ok, why = nvml_status()
        if not ok:
            self.status = f"GPU monitor off: {why}"
            return self
        self._pynvml = import_pynvml()
        self._pynvml.nvmlInit()
        self._handle = nvml_handle(self._pynvml, self.device)
        self.available = True
        no_util = slice_without_utilization()
        if no_util:
            self.unsupported["busy_pct"] = no_util
        self.status = f"sampling every {self.interval_s:g} s"
        self._stop.clear()
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="gpulab-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> "GpuMonitor":
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self._thread = None
        if self._pynvml is not None:
            try:
                self._pynvml.nvmlShutdown()
            except self._pynvml.NVMLError:
                pass
            self._pynvml = None
        if self.available:
            self.status = f"{len(self.samples)} samples over {self.duration_s:.1f} s"
        return self

    def __enter__(self) -> "GpuMonitor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- sampling ---------------------------------------------------------
    def sample_once(self) -> Sample:
        """Read every metric once; a metric this GPU does not support reads None."""
        readers = _readers(self._pynvml)
        values: dict[str, float | None] = {}
        for name in METRICS:
            if name in self.unsupported or (not self.pcie and name.startswith("pcie")):
                values[name] = None
                continue
            try:
                values[name] = float(readers[name](self._handle))
            except self._pynvml.NVMLError as err:
                self.unsupported[name] = str(err)
                values[name] = None
        return Sample(t_s=time.perf_counter() - self._t0, **values)

    def _run(self) -> None:
        while True:
            self.samples.append(self.sample_once())
            if self._stop.wait(self.interval_s):
                self.samples.append(self.sample_once())
                return

    # -- results ----------------------------------------------------------
    @property
    def started_at(self) -> float | None:
        """`time.perf_counter()` when sampling began (each sample's t_s counts from it); None if never started."""
        return getattr(self, "_t0", None)

    @property
    def duration_s(self) -> float:
        return self.samples[-1].t_s - self.samples[0].t_s if len(self.samples) > 1 else 0.0

    def timeline(self) -> dict[str, list[float | None]]:
        """Column lists: t_s and each metric (None where not supported)."""
        return {f.name: [getattr(s, f.name) for s in self.samples] for f in fields(Sample)}

    def mean(self, metric: str, since_s: float = 0.0) -> float | None:
        """Average of one metric over the run, or None if it was never read. `since_s`: only the samples read at
        least that long after sampling began (NVML_PERIOD_MAX_S for busy %: an earlier sample's period began
        before the sampling, so it reads whatever the GPU did then)."""
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}; choose from {', '.join(METRICS)}")
        values = [getattr(s, metric) for s in self.samples if getattr(s, metric) is not None and s.t_s >= since_s]
        return sum(values) / len(values) if values else None


@dataclass(frozen=True)
class PcieLink:
    generation: int
    width: int
    max_generation: int
    max_width: int

    @property
    def peak_gbps(self) -> float | None:
        """Theoretical one-direction bandwidth of the link as it runs now (GB/s)."""
        return specs.pcie_peak_gbps(self.generation, self.width)

    @property
    def max_peak_gbps(self) -> float | None:
        """...and at the best generation and width both ends support (GB/s)."""
        return specs.pcie_peak_gbps(self.max_generation, self.max_width)

    def __str__(self) -> str:
        peak = self.max_peak_gbps
        return (f"PCIe gen {self.max_generation} x{self.max_width}"
                + (f" (~{peak:.0f} GB/s each way)" if peak else "")
                + f"; running now at gen {self.generation} x{self.width}")


def pcie_link(device: torch.device | None = None) -> PcieLink | None:
    """The GPU's PCIe link from NVML, or None where NVML cannot tell.

    An idle GPU may drop to a lower generation to save power, so the
    maximum (what both ends support) is the figure to compare copies against.
    """
    device = device or pick_device()
    if device.type != "cuda" or not nvml_status()[0]:
        return None
    pynvml = import_pynvml()
    pynvml.nvmlInit()
    try:
        h = nvml_handle(pynvml, device)
        return PcieLink(
            generation=pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
            width=pynvml.nvmlDeviceGetCurrPcieLinkWidth(h),
            max_generation=pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h),
            max_width=pynvml.nvmlDeviceGetMaxPcieLinkWidth(h),
        )
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


@dataclass(frozen=True)
class Sharing:
    """Whether this GPU is shared: a MIG slice, or other processes computing on it."""

    mig: bool
    other_processes: int            # compute processes on the GPU besides this one
    other_memory_gib: float         # GPU memory those processes hold
    note: str                       # what that does to the numbers, for a learner

    @property
    def shared(self) -> bool:
        return self.mig or self.other_processes > 0


def gpu_sharing(device: torch.device | None = None) -> Sharing | None:
    """Is this GPU shared? A MIG slice (NVML's MIG mode, or 'MIG' in the device name) has a fraction of
    the SMs, memory and bandwidth; other compute processes take SMs and bandwidth while they run.
    None on the CPU or where NVML cannot tell. Notebook 00 and `gpulab doctor` say it; the results
    store marks such runs (`sharing_mark`).

    NVML lists processes by the host's process ids; in a container this process has another one, so
    when no listed id is ours but this process holds a CUDA context, one listed process is taken to
    be this one (the one holding the least memory is left out of the count: ours is counted, not named).
    """
    device = device or pick_device()
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    mig = " MIG " in f" {name} "
    procs: list[tuple[int, int]] = []
    if nvml_status()[0]:
        pynvml = import_pynvml()
        pynvml.nvmlInit()
        try:
            h = nvml_handle(pynvml, device)
            try:
                current, _pending = pynvml.nvmlDeviceGetMigMode(h)
                mig = mig or current == getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", 1)
            except pynvml.NVMLError:
                pass                                    # not a MIG-capable GPU
            try:
                # an MPS server is listed as a compute process: it runs this process's kernels under MPS, it is
                # not a second user (on the H200 a learner alone under roomrun --mps read "1 other process
                # (0.1 GiB)": the server)
                procs = [(p.pid, p.usedGpuMemory or 0) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                         if not is_mps_server(pynvml, p.pid)]
            except pynvml.NVMLError:
                pass
        finally:
            pynvml.nvmlShutdown()
    others = other_processes(procs, os.getpid(), torch.cuda.is_initialized())
    other_bytes = sum(b for _, b in others)
    notes = []
    if mig:
        notes.append("this is a MIG slice: its SMs, memory and memory bandwidth are a fraction of the "
                     "whole GPU's, so ceilings and timings are the slice's, not the card's datasheet")
    if others:
        notes.append(f"{len(others)} other process(es) compute on this GPU ({other_bytes / 2**30:.1f} GiB): "
                     "while they run they take SMs and memory bandwidth, so timings vary and ceilings read low "
                     "(time-sliced, a kernel short enough to run between two switches can read near its rate alone)")
    return Sharing(mig, len(others), other_bytes / 2**30, "; ".join(notes) or "this GPU is not shared")


def is_mps_server(pynvml, pid: int) -> bool:
    """Whether NVML's compute process `pid` is an MPS server (`nvidia-cuda-mps-server`), by the name NVML
    gives it; False where NVML cannot name it (a process of another container)."""
    try:
        name = pynvml.nvmlSystemGetProcessName(pid)
    except Exception:       # noqa: BLE001 - NVMLError, or an older binding without the call: not known
        return False
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    return os.path.basename(str(name).strip()).startswith("nvidia-cuda-mps-server")


def other_processes(procs: list[tuple[int, int]], own_pid: int, own_context: bool) -> list[tuple[int, int]]:
    """The (pid, bytes) of NVML's compute processes that are not this one: ours by its id, or, where no id
    matches but this process holds a CUDA context (a container's own process ids), the one holding the
    least memory, taken to be ours."""
    if any(pid == own_pid for pid, _ in procs):
        return [p for p in procs if p[0] != own_pid]
    if own_context and procs:
        ours = min(procs, key=lambda p: p[1])
        rest = list(procs)
        rest.remove(ours)
        return rest
    return list(procs)


_SHARING_CACHE: dict[int, tuple[float, Sharing | None]] = {}


def sharing_mark(device: torch.device | None = None, max_age_s: float = 30.0) -> dict:
    """What the results store adds to a record measured on a shared GPU: {"shared": the note}; {} on a
    GPU used alone, on the CPU, or where NVML cannot tell. Asked of NVML at most every `max_age_s`.
    GPULAB_SHARED_GPU (a workshop hub's time-sliced profile sets it: inside a container NVML sees no other
    learner's processes) marks every record on a GPU with its text."""
    device = device or pick_device()
    if device.type != "cuda":
        return {}
    declared = os.environ.get("GPULAB_SHARED_GPU", "").strip()
    if declared:
        return {"shared": f"declared shared by the room ({declared})"}
    key = device.index or 0
    now = time.monotonic()
    if key not in _SHARING_CACHE or now - _SHARING_CACHE[key][0] > max_age_s:
        try:
            _SHARING_CACHE[key] = (now, gpu_sharing(device))
        except Exception:            # a marking must never stop a measurement from being recorded
            _SHARING_CACHE[key] = (now, None)
    found = _SHARING_CACHE[key][1]
    return {"shared": found.note} if found is not None and found.shared else {}
