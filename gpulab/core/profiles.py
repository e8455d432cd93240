"""GPU profiles: the classes of GPU learners bring, so the course can behave as on one of them.

`GPULAB_PROFILE=t4` (or v100, a10, rtx3090, rtx4090, l4, a100, h100, h200, or a MIG slice: h200-1g,
h100-1g, a100-1g) makes the course take
that class's code paths on whatever it runs on: `device_facts()` reports the profile's compute
capability and what it implies (no TF32 or bf16 before Ampere, no FP8 before Ada), so a precision
the class lacks is refused the way a real one refuses it; on a GPU, memory is capped to the
profile's (`torch.cuda.set_per_process_memory_fraction`). It is honest: every notebook's first line
says a profile is emulated, and that timings and the SM count are still this GPU's. A MIG-slice
profile's green context (gpulab.core.device) gives the process the slice's SMs, but not the slice's share
of the memory bandwidth, and processes under it still take turns on the GPU as on any time-sliced one:
seven learners under h200-1g on one H200 ran at about a seventh of one alone (docs/instructors.md, "A room of seven").
`python -m gpulab.tools.roomrun --mps` runs a room under CUDA MPS instead: side by side, each learner held to
its slice's share of the SMs by MPS rather than a green context.

On the CPU a profile gives the profile's control flow with CPU tensors: that is what CI's
portability matrix runs (tests/test_portability.py), so a crash only a T4 would hit fails CI.

Facts from NVIDIA's datasheets and architecture whitepapers (each profile names its source);
the compute capabilities from NVIDIA's CUDA GPUs list (developer.nvidia.com/cuda-gpus).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

NAMES_SETTING = "GPULAB_PROFILE"


@dataclass(frozen=True)
class Profile:
    """One class of GPU a learner brings."""

    key: str                    # what GPULAB_PROFILE takes
    name: str                   # a device name gpulab's datasheet table recognises
    compute_capability: tuple[int, int]
    memory_gib: float           # GPU memory of the smallest common variant
    power_w: int                # board power limit
    geforce: bool               # consumer card: fp16 Tensor Core math with fp32 accumulate at half rate
    source: str
    pcie_generation: int = 4    # host link, x16 (from the same datasheet): what the budget test divides by
    cpu_cores: int | None = None  # the host's CPU cores where the class comes with a typical host (None: this one's)
    # A MIG slice: its SMs (applied with a green context where PyTorch has them: gpulab.core.device), and
    # what a slice does not have: NVML reads no utilization for it, and it has no P2P or NVLink to another GPU.
    sm_count: int | None = None
    mig: str = ""               # the MIG profile name ("1g.18gb"); "" for a whole GPU
    nvml_utilization: bool = True
    p2p: bool = True


PROFILES: dict[str, Profile] = {p.key: p for p in (
    Profile("v100", "Tesla V100-SXM2-16GB", (7, 0), 16, 300, False,
            "NVIDIA V100 Tensor Core GPU datasheet (2020)", pcie_generation=3),
    Profile("t4", "Tesla T4", (7, 5), 15, 70, False,
            "NVIDIA T4 Tensor Core GPU datasheet (2019); 16 GB, about 15 GiB usable; 2 CPU cores as Colab's T4 "
            "runtime gives (os.cpu_count() there), the host most learners with a T4 have", pcie_generation=3,
            cpu_cores=2),
    Profile("a10", "NVIDIA A10", (8, 6), 24, 150, False,
            "NVIDIA A10 Tensor Core GPU datasheet (2021)", pcie_generation=4),
    Profile("rtx3090", "NVIDIA GeForce RTX 3090", (8, 6), 24, 350, True,
            "NVIDIA Ampere GA102 GPU architecture whitepaper v2.0, appendix table", pcie_generation=4),
    Profile("rtx4090", "NVIDIA GeForce RTX 4090", (8, 9), 24, 450, True,
            "NVIDIA Ada Lovelace GPU architecture whitepaper v1.1, appendix table", pcie_generation=4),
    Profile("l4", "NVIDIA L4", (8, 9), 24, 72, False,
            "NVIDIA L4 Tensor Core GPU datasheet (2023)", pcie_generation=4),
    Profile("a100", "NVIDIA A100-SXM4-40GB", (8, 0), 40, 400, False,
            "NVIDIA A100 Tensor Core GPU datasheet (2021)", pcie_generation=4),
    Profile("h100", "NVIDIA H100 80GB HBM3", (9, 0), 80, 700, False,
            "NVIDIA H100 Tensor Core GPU datasheet (2023)", pcie_generation=5),
    Profile("h200", "NVIDIA H200", (9, 0), 141, 700, False,
            "NVIDIA H200 Tensor Core GPU datasheet (2024)", pcie_generation=5),
    # MIG 1g slices, one seventh of the GPU, as a workshop hands them out (workshop/z2jh-values.yaml). SMs,
    # memory and the profile names: NVIDIA's MIG User Guide, "Supported MIG Profiles"; memory is the usable
    # part of the slice's nominal size.
    Profile("h200-1g", "NVIDIA H200 MIG 1g.18gb", (9, 0), 16, 700, False,
            "NVIDIA MIG User Guide, supported profiles: H200 1g.18gb, 16 SMs (one seventh of the GPU), 18 GB",
            pcie_generation=5, sm_count=16, mig="1g.18gb", nvml_utilization=False, p2p=False),
    Profile("h100-1g", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", (9, 0), 9.5, 700, False,
            "NVIDIA MIG User Guide, supported profiles: H100 80GB 1g.10gb, 16 SMs, 10 GB",
            pcie_generation=5, sm_count=16, mig="1g.10gb", nvml_utilization=False, p2p=False),
    Profile("a100-1g", "NVIDIA A100-SXM4-80GB MIG 1g.10gb", (8, 0), 9.5, 400, False,
            "NVIDIA MIG User Guide, supported profiles: A100 80GB 1g.10gb, 14 SMs, 10 GB",
            pcie_generation=4, sm_count=14, mig="1g.10gb", nvml_utilization=False, p2p=False),
)}


class ProfileError(ValueError):
    """GPULAB_PROFILE names no profile."""


def active_profile() -> Profile | None:
    """The profile GPULAB_PROFILE names, or None when it is unset or empty."""
    value = os.environ.get(NAMES_SETTING, "").strip().lower()
    if not value or value == "none":
        return None
    if value not in PROFILES:
        raise ProfileError(f"{NAMES_SETTING}={os.environ.get(NAMES_SETTING)!r} is not understood; "
                           f"allowed values are {', '.join(PROFILES)} (unset: this GPU as it is).")
    return PROFILES[value]
