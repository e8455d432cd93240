"""Architecture facts and datasheet peaks for common NVIDIA GPUs.

These numbers are *leads*, used only as a fallback (before notebook 00 has run)
or for comparison. The course's own targets are what notebook 00 measures on
the learner's GPU and stores in the results file.

All TFLOP/s figures are dense (no 2:4 sparsity) peak rates; memory bandwidth is
in GB/s (1e9 bytes per second). Where a datasheet only prints the sparse figure,
it was halved, and the note says so.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


# compute capability major.minor -> (architecture, Tensor Core generation or None)
# Tensor Core generations per NVIDIA's architecture whitepapers: Volta 1st,
# Turing 2nd, Ampere 3rd, Ada and Hopper 4th, Blackwell 5th.
ARCHITECTURES: dict[tuple[int, int], tuple[str, int | None]] = {
    (3, 5): ("Kepler", None), (3, 7): ("Kepler", None),
    (5, 0): ("Maxwell", None), (5, 2): ("Maxwell", None), (5, 3): ("Maxwell", None),
    (6, 0): ("Pascal", None), (6, 1): ("Pascal", None), (6, 2): ("Pascal", None),
    (7, 0): ("Volta", 1), (7, 2): ("Volta", 1),
    (7, 5): ("Turing", 2),
    (8, 0): ("Ampere", 3), (8, 6): ("Ampere", 3), (8, 7): ("Ampere", 3),
    (8, 9): ("Ada Lovelace", 4),
    (9, 0): ("Hopper", 4),
    (10, 0): ("Blackwell", 5), (10, 3): ("Blackwell", 5),
    (11, 0): ("Blackwell", 5),
    (12, 0): ("Blackwell", 5), (12, 1): ("Blackwell", 5),
}


def architecture(major: int, minor: int) -> tuple[str, int | None]:
    """(architecture name, Tensor Core generation) for a compute capability.

    An unknown capability is named by its nearest known major version, marked
    '(unrecognised)', so a newer GPU still gets a sensible answer.
    """
    if (major, minor) in ARCHITECTURES:
        return ARCHITECTURES[(major, minor)]
    same_major = [k for k in ARCHITECTURES if k[0] == major]
    if same_major:
        name, tc = ARCHITECTURES[max(same_major)]
        return f"{name} (unrecognised sm_{major}{minor})", tc
    if major > max(k[0] for k in ARCHITECTURES):
        return f"newer than Blackwell (unrecognised sm_{major}{minor})", 5
    return f"older than Kepler (unrecognised sm_{major}{minor})", None


@dataclass(frozen=True)
class Datasheet:
    """Vendor peak rates for one GPU model (dense, no sparsity)."""

    match: str          # substring of torch.cuda.get_device_name()
    model: str
    fp32: float         # TFLOP/s, CUDA cores
    tf32: float | None  # TFLOP/s, Tensor Cores
    fp16: float | None  # TFLOP/s, Tensor Cores, fp32 accumulate
    bf16: float | None
    fp8: float | None
    mem_gbps: float     # GB/s
    source: str
    board_w: float | None = None    # the board's power limit (TDP), W, from the same datasheet; None: not given
    compute_capability: tuple[int, int] | None = None   # NVIDIA's CUDA GPUs list (developer.nvidia.com/cuda-gpus)

    @property
    def power_capped(self) -> bool:
        """A low-power board (under POWER_CAPPED_W: a T4's 70 W, an L4's 72 W): its Tensor Cores cannot hold the
        boost clock at that power, so a long product runs well below the datasheet's peak on a healthy card."""
        return self.board_w is not None and self.board_w < POWER_CAPPED_W

    def half(self, bf16: bool = True) -> float | None:
        """The 16-bit Tensor Core rate with fp32 accumulation (what PyTorch uses): bf16 where the GPU runs it
        natively (`bf16`) and the datasheet gives it, else fp16."""
        return (self.bf16 if bf16 else None) or self.fp16

    def half_ratio(self, bf16: bool = True) -> float | None:
        """The datasheet's 16-bit over fp32 rate (`half` / `fp32`), or None without a 16-bit rate."""
        half = self.half(bf16)
        return half / self.fp32 if half and self.fp32 else None

    def sustained_half(self, bf16: bool = True) -> float | None:
        """The 16-bit rate a healthy board holds under a long product: the datasheet's on a board with the power
        to hold its clocks, POWER_CAPPED_HALF_SHARE of it on a power-capped one."""
        half = self.half(bf16)
        if half is None:
            return None
        return half * POWER_CAPPED_HALF_SHARE if self.power_capped else half

    def half_ratio_range(self, bf16: bool = True) -> tuple[float, float] | None:
        """(least, most) 16-bit / fp32 matmul ratio a healthy board of this datasheet shows, from its rates alone.
        On a board that holds its clocks both are the datasheet's. On a power-capped one the least is the
        sustained 16-bit rate over the *full* fp32 rate (fp32 products may slow down at the power limit too,
        which only raises the ratio), the most the datasheet's (both at the same lowered clock). None without
        a 16-bit rate."""
        most = self.half_ratio(bf16)
        if most is None:
            return None
        return self.sustained_half(bf16) / self.fp32, most


# The 70-75 W low-profile class (T4, L4, A2), powered from the PCIe slot alone; every other board in the table draws
# 150 W or more. At that power a card cannot keep all of its Tensor Cores at the boost clock the peak assumes.
POWER_CAPPED_W = 100
# What a power-capped board holds under a long product: a 70 W T4 ran cuBLAS's 4096^3 fp16 product, 100 times back
# to back, at about 24 of its datasheet's 65 TFLOP/s, which NVIDIA's moderator put down to power capping at 70 W,
# "expected behavior for approximately continuous matrix multiply operations on a T4" (NVIDIA developer forums,
# "About GPU peak performance", forums.developer.nvidia.com/t/about-gpu-peak-performance/264462). It is the one
# published sustained figure for the class, so it stands for every board under POWER_CAPPED_W (an L4 included,
# whose own sustained share no committed run or source gives).
POWER_CAPPED_HALF_SHARE = 24 / 65


# Order matters: the first entry whose `match` is in the device name wins,
# so the more specific names (H100 PCIe, H200 NVL) come before the plain ones.
DATASHEETS: tuple[Datasheet, ...] = (
    Datasheet("H200 NVL", "H200 NVL", 60, 417, 835, 835, 1670, 4800,
              "NVIDIA H200 Tensor Core GPU datasheet (2024); sparse figures halved", board_w=600, compute_capability=(9, 0)),
    Datasheet("H200", "H200 SXM", 67, 495, 989, 989, 1979, 4800,
              "NVIDIA H200 Tensor Core GPU datasheet (2024); sparse figures halved", board_w=700, compute_capability=(9, 0)),
    Datasheet("H100 PCIe", "H100 PCIe", 51, 378, 756, 756, 1513, 2000,
              "NVIDIA H100 Tensor Core GPU datasheet (2023); sparse figures halved", board_w=350, compute_capability=(9, 0)),
    Datasheet("H100 NVL", "H100 NVL", 60, 418, 835, 835, 1670, 3900,
              "NVIDIA H100 Tensor Core GPU datasheet (2023); sparse figures halved", board_w=400, compute_capability=(9, 0)),
    Datasheet("H100", "H100 SXM", 67, 495, 989, 989, 1979, 3350,
              "NVIDIA H100 Tensor Core GPU datasheet (2023); sparse figures halved", board_w=700, compute_capability=(9, 0)),
    Datasheet("A100-SXM4-80GB", "A100 SXM 80GB", 19.5, 156, 312, 312, None, 2039,
              "NVIDIA A100 Tensor Core GPU datasheet (2021)", board_w=400, compute_capability=(8, 0)),
    Datasheet("A100 80GB PCIe", "A100 PCIe 80GB", 19.5, 156, 312, 312, None, 1935,
              "NVIDIA A100 Tensor Core GPU datasheet (2021)", board_w=300, compute_capability=(8, 0)),
    Datasheet("A100", "A100 40GB", 19.5, 156, 312, 312, None, 1555,
              "NVIDIA A100 Tensor Core GPU datasheet (2021)", compute_capability=(8, 0)),
    Datasheet("L40S", "L40S", 91.6, 183, 362, 362, 733, 864,
              "NVIDIA L40S datasheet (2023); sparse figures halved", board_w=350, compute_capability=(8, 9)),
    Datasheet("L4", "L4", 30.3, 60, 121, 121, 242, 300,
              "NVIDIA L4 Tensor Core GPU datasheet (2023); sparse figures halved", board_w=72, compute_capability=(8, 9)),
    Datasheet("A10", "A10", 31.2, 62.5, 125, 125, None, 600,
              "NVIDIA A10 Tensor Core GPU datasheet (2021); sparse figures halved", board_w=150, compute_capability=(8, 6)),
    Datasheet("RTX 4090", "GeForce RTX 4090", 82.6, 82.6, 165.2, 165.2, 330.3, 1008,
              "NVIDIA Ada Lovelace GPU architecture whitepaper v1.1, appendix table "
              "(fp16/bf16 with fp32 accumulate)", board_w=450, compute_capability=(8, 9)),
    Datasheet("RTX 3090", "GeForce RTX 3090", 35.6, 35.6, 71, 71, None, 936,
              "NVIDIA Ampere GA102 GPU architecture whitepaper v2.0, appendix table "
              "(fp16/bf16 with fp32 accumulate)", board_w=350, compute_capability=(8, 6)),
    Datasheet("RTX 2080 Ti", "GeForce RTX 2080 Ti", 13.4, None, 53.8, None, None, 616,
              "NVIDIA Turing GPU architecture whitepaper (2018), appendix table, reference board "
              "(fp16 with fp32 accumulate)", board_w=250, compute_capability=(7, 5)),
    Datasheet("T4", "T4", 8.1, None, 65, None, None, 320,
              "NVIDIA T4 Tensor Core GPU datasheet (2019)", board_w=70, compute_capability=(7, 5)),
    Datasheet("V100-SXM2", "V100 SXM2", 15.7, None, 125, None, None, 900,
              "NVIDIA V100 Tensor Core GPU datasheet (2020)", board_w=300, compute_capability=(7, 0)),
    Datasheet("V100", "V100 PCIe", 14, None, 112, None, None, 900,
              "NVIDIA V100 Tensor Core GPU datasheet (2020)", board_w=250, compute_capability=(7, 0)),
)


def datasheet_for(device_name: str) -> Datasheet | None:
    """The datasheet entry for a device name, or None for a GPU not in the table."""
    for entry in DATASHEETS:
        # whole words only: "L4" must not match "L40S", nor "A10" match "A100"
        if re.search(rf"(?<![A-Za-z0-9]){re.escape(entry.match)}(?![A-Za-z0-9])", device_name, re.I):
            return entry
    return None


# PCIe: usable GB/s per lane and direction after line encoding
# (gen 1-2: 8b/10b; gen 3-5: 128b/130b; gen 6: FLIT, about 242/256).
# Source: PCI-SIG specifications, as summarised in the PCI Express Wikipedia table.
PCIE_GBPS_PER_LANE: dict[int, float] = {
    1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563,
}


def pcie_peak_gbps(generation: int, width: int) -> float | None:
    """Theoretical one-direction PCIe bandwidth in GB/s, or None if the generation is unknown."""
    per_lane = PCIE_GBPS_PER_LANE.get(generation)
    return None if per_lane is None else per_lane * width
