"""Notebook 04's graded exercise: a memory-bound kernel launched with blocks too small to keep the memory busy.

`scale_kernel` (y = 2x) reads and writes each float once: its time is bytes over bandwidth, provided enough loads
are in flight on every SM to cover the memory's latency. Launched with 32 values and one warp a program, an SM
holds at most its block limit of programs (16 to 32, by architecture: `sm_limits`), so only 32 x 4 bytes x that
many are requested at once: far too few bytes in flight, and a low occupancy besides. The lesson's sweep
found the rate flat from about 1024 values and 4 warps a program.

Predicted (before the H200 run): the fix reaches most of the copy bandwidth and the launch as given well under
half of it, so about 2x or more on any GPU with Triton; on a machine without Triton both run PyTorch's x * 2 and
the exercise grades correctness only.
"""
from __future__ import annotations

import torch

from gpulab.core.memory import free_memory
from gpulab.exercises.task import Task, copy_rate, function
from gpulab.lessons.l04_occupancy_and_waves import scale_with, triton_status


def scale(x):
    """The launch as given: one warp and 32 values a program, one value a thread, as a first CUDA kernel does."""
    return scale_with(x, block_size=32, num_warps=1)


def scale_fixed(x):
    """The lesson's fix: 1024 values and 4 warps a program, where notebook 04's sweep found the rate flat."""
    return scale_with(x, block_size=1024, num_warps=4)


def elements(device: torch.device, scale_name: str) -> tuple[int, str]:
    """Floats per call: about half a millisecond at this GPU's copy bandwidth (notebook 00's, or the datasheet's),
    at most a 32nd of free memory; 2^16 on the CPU."""
    if scale_name != "full" or device.type != "cuda":
        return 1 << 16, "tiny"
    gbps, source = copy_rate(device)
    if gbps is None:
        return 1 << 24, f"64 MiB: {source}"
    n = int(0.5e-3 * gbps * 1e9 / 8)
    n = min(n, free_memory(device)[0] // 32 // 4)          # the profile's card under a GPU profile
    n = max(1 << 20, 1 << (n.bit_length() - 1))
    return n, f"~0.5 ms at {gbps:,.0f} GB/s ({source})"


def build(scale_name: str, device: torch.device):
    n, why = elements(device, scale_name)

    def draw(gen):
        return (torch.randn(n, generator=gen, device=gen.device),)
    return function(draw, device, rtol=0.0, atol=0.0, min_bytes=lambda inputs: 8 * n,
                    sizes={"elements": n, "MiB per buffer": n * 4 / 2**20, "sized by": why,
                           "triton": triton_status(device)[1]})


TASKS = [Task(
    name="04.blocks", lesson="04", title="a memory-bound kernel launched with tiny blocks", tier="systems",
    slow=scale, reference=scale_fixed, build=build,
    what=("scale(x) launches notebook 04's scale_kernel (y = 2x) with 32 values and one warp a program. Choose a "
          "launch (scale_with(x, block_size=..., num_warps=...), powers of two) that moves the same bytes faster. "
          "Your function takes x and returns 2x, exactly."),
    hints=("How many bytes can one SM have requested from memory at once with these programs? Section 1's "
           "occupancy() (or section 6's calculator panel) says how many of them fit on an SM.",
           "Section 4's sweep: the rate is flat from about block_size=1024 with num_warps=4."),
)]
