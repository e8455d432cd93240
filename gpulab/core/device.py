"""Which device the course runs on, what it can do, and how big the lessons are.

Introduced in notebook 00. Everything else in gpulab takes its device from
`pick_device()` and its size from `scale()`, so one setting changes the course.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
from dataclasses import dataclass
from typing import Iterator, TypeVar
import torch
from gpulab.core import specs
from gpulab.core.profiles import Profile, ProfileError, active_profile


SCALES = ("tiny", "full", "auto")


DEVICES = ("auto", "cuda", "cpu")


T = TypeVar("T")
_capped = False          # the profile's memory cap is applied once per process, on first use


class SettingError(ValueError):
    """A gpulab setting (environment variable or argument) has a value it does not accept."""


def setting(name: str, allowed: tuple[str, ...], default: str) -> str:
    """The value of environment setting `name`, lower-cased; SettingError naming the allowed values."""
    value = os.environ.get(name, default).strip().lower() or default
    if value not in allowed:
        raise SettingError(
            f"{name}={os.environ.get(name)!r} is not understood; "
            f"allowed values are {', '.join(allowed)} (unset means {default!r})."
        )
    return value


def pick_device() -> torch.device:
    """The device the course runs on: the first CUDA GPU if there is one, else the CPU.

    `GPULAB_DEVICE=cpu` forces the CPU (to try the tiny path on a GPU machine);
    `GPULAB_DEVICE=cuda` insists on a GPU and fails clearly without one.
    """
    wanted = setting("GPULAB_DEVICE", DEVICES, "auto")
    if wanted == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
        global _capped
        if not _capped:
            _capped = True
            apply_profile_memory_cap(device)
            apply_profile_cpu_limit()
            apply_profile_sm_limit(device)
        return device
    if wanted == "cuda":
        raise SettingError(
            "GPULAB_DEVICE=cuda but PyTorch sees no CUDA GPU "
            f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'}). "
            "Run `gpulab doctor` to see why."
        )
    return torch.device("cpu")


def require_cuda(why: str, device: torch.device | None = None) -> torch.device:
    """The course's CUDA device, or ValueError("needs a CUDA GPU: <why>") on the CPU.

    Lessons call it where an experiment only exists on a GPU (streams, graphs, host<->device
    copies, the caching allocator); panels show the ValueError as a refusal.
    """
    device = device or pick_device()
    if device.type != "cuda":
        raise ValueError(f"needs a CUDA GPU: {why}")
    return device


def resolve_scale(value: str | None = None) -> str:
    """'tiny' or 'full': how big the lessons' problems are.

    `value` is an explicit choice ('tiny', 'full' or 'auto'), as `gpulab bench --scale` passes it to
    each lesson's `headline(scale)`; None reads `GPULAB_SCALE=tiny|full|auto` (default auto), the one
    place that setting is read. auto means full on a CUDA GPU and tiny on the CPU, where numbers are
    only illustrative.
    """
    if value is None:
        value = setting("GPULAB_SCALE", SCALES, "auto")
    elif value not in SCALES:
        raise SettingError(f"scale {value!r} is not understood; allowed values are {', '.join(SCALES)}.")
    if value == "auto":
        return "full" if pick_device().type == "cuda" else "tiny"
    return value


def scale() -> str:
    """The course's scale, from `GPULAB_SCALE` (`resolve_scale()`); what a notebook runs at."""
    return resolve_scale()


def by_scale(tiny: T, full: T, scale: str | None = None) -> T:
    """Pick a problem size for a scale (default: the course's): `n = by_scale(tiny=256, full=8192)`."""
    return full if resolve_scale(scale) == "full" else tiny


def sync(device: torch.device | None = None) -> None:
    """Wait for all queued work on the device (a no-op on the CPU)."""
    device = device or pick_device()
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class DeviceFacts:
    """What the course needs to know about the device it runs on."""

    kind: str                      # "cuda" or "cpu"
    name: str
    compute_capability: tuple[int, int] | None
    architecture: str
    tensor_core_generation: int | None
    sm_count: int | None
    memory_bytes: int | None
    l2_cache_bytes: int | None
    tf32: bool
    bf16: bool
    fp8: bool
    torch_version: str
    cuda_version: str | None
    datasheet: specs.Datasheet | None
    geforce: bool = False          # consumer card: fp16 Tensor Core math with fp32 accumulate at half rate
    profile: str | None = None     # the GPULAB_PROFILE these facts emulate (None: this device as it is)
    emulated_on: str | None = None  # with a profile: the device that really runs the code
    real_kind: str | None = None    # with a profile: "cuda" or "cpu", what really runs the code

    @property
    def on_gpu(self) -> bool:
        """Whether the code really runs on a CUDA GPU (under a profile on the CPU, `kind` says "cuda" for the
        class's control flow while the tensors stay on the CPU)."""
        return (self.real_kind or self.kind) == "cuda"

    @property
    def memory_gib(self) -> float | None:
        return None if self.memory_bytes is None else self.memory_bytes / 2**30

    def rows(self) -> list[tuple[str, str]]:
        """(fact, value) pairs for a table."""
        def yes(flag: bool) -> str:
            return "yes" if flag else "no"
        cc = self.compute_capability
        return [
            ("device", f"{self.kind}: {self.name}"),
            ("compute capability", f"{cc[0]}.{cc[1]}" if cc else "-"),
            ("architecture", self.architecture),
            ("Tensor Core generation", str(self.tensor_core_generation or "none")),
            ("SMs", str(self.sm_count or "-")),
            ("memory", f"{self.memory_gib:.1f} GiB" if self.memory_bytes else "-"),
            ("L2 cache", f"{self.l2_cache_bytes / 2**20:.0f} MiB" if self.l2_cache_bytes else "-"),
            ("TF32 / BF16 / FP8", f"{yes(self.tf32)} / {yes(self.bf16)} / {yes(self.fp8)}"),
            ("torch / CUDA", f"{self.torch_version} / {self.cuda_version or 'CPU build'}"),
            ("datasheet entry", self.datasheet.model if self.datasheet else "not in gpulab's table"),
        ]


def facts_for_capability(name: str, major: int, minor: int, **extra) -> DeviceFacts:
    """DeviceFacts for a CUDA GPU of the given name and compute capability."""
    arch, tc = specs.architecture(major, minor)
    return DeviceFacts(
        kind="cuda", name=name, compute_capability=(major, minor), architecture=arch,
        tensor_core_generation=tc,
        sm_count=extra.get("sm_count"), memory_bytes=extra.get("memory_bytes"),
        l2_cache_bytes=extra.get("l2_cache_bytes"),
        tf32=major >= 8,            # Ampere and later
        bf16=major >= 8,            # native bf16 Tensor Core math from Ampere on
        fp8=(major, minor) >= (8, 9),  # Ada, Hopper, Blackwell
        torch_version=torch.__version__, cuda_version=torch.version.cuda,
        datasheet=specs.datasheet_for(name),
        geforce=extra.get("geforce", "geforce" in name.lower()),
    )


def profile() -> Profile | None:
    """The GPU profile the course emulates (`GPULAB_PROFILE`, see `gpulab.core.profiles`), or None."""
    try:
        return active_profile()
    except ProfileError as err:
        raise SettingError(str(err)) from None


def _real_facts(device: torch.device) -> DeviceFacts:
    if device.type != "cuda":
        return DeviceFacts(
            kind="cpu", name=platform.processor() or platform.machine() or "CPU",
            compute_capability=None, architecture="CPU", tensor_core_generation=None,
            sm_count=None, memory_bytes=None, l2_cache_bytes=None,
            tf32=False, bf16=True, fp8=False,
            torch_version=torch.__version__, cuda_version=torch.version.cuda, datasheet=None,
        )
    p = torch.cuda.get_device_properties(device)
    return facts_for_capability(
        p.name, p.major, p.minor, sm_count=p.multi_processor_count,
        memory_bytes=p.total_memory, l2_cache_bytes=getattr(p, "L2_cache_size", None),
    )


def device_facts(device: torch.device | None = None) -> DeviceFacts:
    """Facts about the course's device, read from PyTorch (no NVML needed).

    Under a GPU profile (`GPULAB_PROFILE`) the capabilities are the profile's (its compute capability,
    and the TF32 / bf16 / FP8 it implies) and its memory where that is smaller, so every lesson takes
    that class's code path; the SM count and L2 stay this device's, since they shape its timings, except a
    MIG slice's SM count where a green context or MPS limits this process (`apply_profile_sm_limit`): then
    the count that limit gave, for the profile it was made for.
    """
    device = device or pick_device()
    real = _real_facts(device)
    prof = profile()
    if prof is None:
        return real
    major, minor = prof.compute_capability
    memory = int(prof.memory_gib * 2**30)
    if real.memory_bytes is not None:
        memory = min(memory, real.memory_bytes)
    # a slice's SM count where a green context or MPS limits this process to it (else this GPU's: its timings)
    sms = (SM_LIMIT["sms"] if prof.sm_count and SM_LIMIT.get("sms") and SM_LIMIT.get("profile", prof.key) == prof.key
           else real.sm_count)
    if real.kind != "cuda" and prof.sm_count:
        sms = prof.sm_count             # on the CPU: the slice's control flow, as for its capabilities
    facts = facts_for_capability(prof.name, major, minor, sm_count=sms, memory_bytes=memory,
                                 l2_cache_bytes=real.l2_cache_bytes, geforce=prof.geforce)
    return dataclasses.replace(facts, profile=prof.key, emulated_on=real.name, real_kind=real.kind)


def cpu_cores() -> int:
    """The CPU cores this process may use: its affinity (a container's or a job's limit), at most the
    profile's `cpu_cores` where it has one. What DataLoader worker counts and CPU-side bands go by."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):          # macOS, Windows: no affinity call
        cores = os.cpu_count() or 1
    prof = profile()
    if prof is not None and prof.cpu_cores:
        cores = min(cores, prof.cpu_cores)
    return max(1, cores)


def physical_cores(topology: str = "/sys/devices/system/cpu") -> int:
    """The physical cores among this process's CPUs: two hyperthreads of one core count once (on Google Compute
    Engine, where Colab's VMs run, "two vCPUs share each physical CPU core by default": its "Set the number of
    threads per core" page; two processes on them do not run twice as fast),
    read from Linux's `topology` (each CPU's package and core id); `cpu_cores()` where it cannot be read.
    At most `cpu_cores()` (a profile's host)."""
    logical = cpu_cores()
    try:
        cpus = sorted(os.sched_getaffinity(0))[:logical]
        cores = set()
        for c in cpus:
            base = os.path.join(topology, f"cpu{c}", "topology")
            with open(os.path.join(base, "physical_package_id")) as pkg, open(os.path.join(base, "core_id")) as core:
                cores.add((pkg.read().strip(), core.read().strip()))
    except (AttributeError, OSError, ValueError):
        return logical
    return max(1, min(len(cores), logical))


def apply_profile_cpu_limit() -> int | None:
    """On a GPU under a profile whose class comes with a small host (the T4: Colab's 2 cores), pin this
    process, and so the DataLoader workers it starts, to that many of its cores and give PyTorch's CPU ops
    as many threads; returns the count, or None when nothing is limited (no such profile, or no affinity
    call on this system)."""
    prof = profile()
    if prof is None or not prof.cpu_cores:
        return None
    try:
        mine = sorted(os.sched_getaffinity(0))
        if len(mine) > prof.cpu_cores:
            os.sched_setaffinity(0, mine[: prof.cpu_cores])
    except (AttributeError, OSError):
        return None
    torch.set_num_threads(min(torch.get_num_threads(), prof.cpu_cores))
    return prof.cpu_cores


SM_LIMIT: dict = {"sms": None, "why": "no profile with an SM count"}   # what apply_profile_sm_limit did


def apply_profile_sm_limit(device: torch.device) -> int | None:
    """On a GPU under a MIG-slice profile (`Profile.sm_count`), run this process's work on that many SMs:
    a CUDA green context of `sm_count` SMs (`torch.cuda.green_contexts`, beta), made current, its stream
    this process's current stream. Returns the SM count, or None with the reason in SM_LIMIT["why"] (no
    such profile; this PyTorch or driver has no green contexts), when the SMs stay the whole GPU's and
    `device_facts()` says so. An MPS client with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (a room under
    `roomrun --mps`) gets no green context: MPS already limits its share of the SMs, and the count is the one
    CUDA reports for this process (MPS's, which may differ from the profile's)."""
    prof = profile()
    if prof is None or not prof.sm_count or device.type != "cuda":
        SM_LIMIT.update(sms=None, why="no profile with an SM count" if prof is None or not prof.sm_count
                        else "not on a GPU")
        return None
    mps = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "").strip()
    if mps and os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
        # an MPS client with a share of the SMs (gpulab.tools.roomrun --mps): MPS limits this process to that
        # share; a green context is the other way to the same limit, one at a time under MPS (NVIDIA's developer
        # forum, "How to use CUDA Green Context with MPS"), so none is made
        # MPS's count need not be the profile's (on the H200, 12 % of 132 SMs gave 14, not 16: roomrun's probe,
        # 2026-12-03) and CUDA reports the count it gave: a wave is that many programs, not the profile's
        try:
            given = torch.cuda.get_device_properties(device).multi_processor_count
        except Exception as err:    # noqa: BLE001 - no CUDA here: no count to report
            SM_LIMIT.update(sms=None, profile=prof.key,
                            why=f"MPS client, but CUDA could not say its SMs ({type(err).__name__}: {err})")
            return None
        if given < 2 * prof.sm_count:
            SM_LIMIT.update(sms=given, profile=prof.key, why=f"MPS gave this process {given} SMs "
                            f"(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE {mps} %; the {prof.key} profile's slice has {prof.sm_count})")
            return given
        # twice the slice or more: no MPS server limits this process (a client that cannot reach the daemon runs
        # without MPS), so the slice is emulated with a green context as anywhere else
    try:
        from torch.cuda.green_contexts import SUPPORTED, GreenContext
        if not SUPPORTED:
            raise RuntimeError("this PyTorch was not built with green contexts")
        ctx = GreenContext.create(num_sms=prof.sm_count, device_id=device.index or 0)
        ctx.set_context()
        torch.cuda.set_stream(ctx.Stream())
    except Exception as err:        # noqa: BLE001 - the slice's SMs are an emulation; the course runs without them
        SM_LIMIT.update(sms=None, why=f"green contexts unavailable ({type(err).__name__}: {err})")
        return None
    SM_LIMIT.update(sms=prof.sm_count, profile=prof.key, why=f"a green context of {prof.sm_count} SMs", context=ctx)
    return prof.sm_count


def slice_bandwidth_note() -> str:
    """"" unless a green context limits this process to a MIG slice's SMs (`apply_profile_sm_limit`); then why
    a bandwidth measured here is not a slice's. A green context limits the SMs, not the memory system: a real
    1g slice also has its own share of the memory and its bandwidth (one of eight memory slices on an
    A100/H100/H200 1g slice: NVIDIA MIG User Guide, "Supported MIG Profiles"), a ceiling every good kernel
    meets. Here the slice's SMs drive the whole GPU's memory: no kernel is bound by a slice's memory, and the
    bytes each keeps in flight on those SMs decide its bandwidth (on the H200 under h200-1g, 2026-12-02: a
    tuned Triton copy ran at 1.26x torch's copy, results/room/2026-12-02-h200-time-sliced-00-01-04)."""
    sms = SM_LIMIT.get("sms")
    if not sms:
        return ""
    prof = profile()
    return (f"emulating the {prof.key if prof else 'slice'} profile ({SM_LIMIT.get('why')}): it limits "
            "the SMs, not the memory system, so the bandwidth here is what those SMs keep in flight, not a "
            "slice's share of the memory")


def apply_profile_memory_cap(device: torch.device | None = None) -> float | None:
    """On a GPU under a profile, cap this process's share of GPU memory to the profile's memory
    (`torch.cuda.set_per_process_memory_fraction`); returns the fraction, or None when nothing is capped."""
    device = device or pick_device()
    prof = profile()
    if prof is None or device.type != "cuda":
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = min(1.0, prof.memory_gib * 2**30 / total)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction


@contextlib.contextmanager
def float32_matmul(mode: str) -> Iterator[None]:
    """Run a block with fp32 matmuls as plain IEEE fp32 ("ieee") or on TF32 Tensor Cores ("tf32").

    Restores the previous setting afterwards. Uses torch.set_float32_matmul_precision,
    which PyTorch keeps in sync with the newer backends.cuda.matmul.fp32_precision switch.
    """
    if mode not in ("ieee", "tf32"):
        raise SettingError(f"float32 matmul mode {mode!r}: allowed values are 'ieee', 'tf32'.")
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest" if mode == "ieee" else "high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def device_label() -> str:
    """The device the numbers come from, as a table or caption names it: "NVIDIA H200", or under a GPU
    profile "NVIDIA H200 emulating t4 (Tesla T4)": the class's features, this machine's timings."""
    device = pick_device()
    facts = device_facts(device)
    if not facts.profile:
        return facts.name
    return f"{_real_facts(device).name} emulating {facts.profile} ({facts.name})"


def describe() -> str:
    """One line for the top of every notebook: device, scale, and what the numbers mean (and, under
    a GPU profile, that it is emulated)."""
    device = pick_device()
    facts = device_facts(device)
    size = scale()
    real = _real_facts(device)
    if device.type == "cuda":
        line = f"Running on {real.name} ({real.architecture}, {real.sm_count} SMs), scale={size}."
    else:
        line = (f"Running on the CPU ({real.name}), scale={size}. No CUDA GPU: the numbers below "
                "are illustrative only and say nothing about GPU performance.")
    if facts.profile:
        cc = facts.compute_capability
        line = (f"Emulating the {facts.profile} profile ({facts.name}, {facts.architecture}, compute capability "
                f"{cc[0]}.{cc[1]}, {facts.memory_gib:.0f} GiB"
                + (f", {cpu_cores()} CPU cores" if profile() is not None and profile().cpu_cores else "")
                + "): that class's precisions, features and memory limit apply, but every timing (and the SM "
                "count) is this machine's. " + line)
    return line
