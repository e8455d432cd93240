"""Notebook 12's graded exercise: fuse `(x + y).relu().mean(dim=1)`.

Eager PyTorch runs three kernels and writes two intermediate n x n tensors to device memory and reads them back
(6n^2 + n floats moved); one fused kernel reads x and y once and writes n means (2n^2 + n). The work is memory
bound, so the time follows the bytes: the physics check counts the fused floor's bytes against notebook 00's
bandwidth.
"""
from __future__ import annotations

import torch

from gpulab.exercises.task import Task, function


def fused_operation(x, y):
    """The code as given: three operations, three kernels in eager PyTorch."""
    return (x + y).relu().mean(dim=1)


@torch.compile(dynamic=False)
def fused_compiled(x, y):
    """The lesson's fix: torch.compile (inductor) fuses the chain, reduction included, into one kernel."""
    return (x + y).relu().mean(dim=1)


def build(scale: str, device: torch.device):
    n = 8192 if scale == "full" else 256

    def draw(gen):
        return (torch.randn(n, n, generator=gen, device=gen.device),
                torch.randn(n, n, generator=gen, device=gen.device))
    # the fewest bytes any implementation moves: read x and y, write n means
    return function(draw, device, rtol=1e-5, atol=1e-5, min_bytes=lambda inputs: (2 * n * n + n) * 4,
                    sizes={"n": n, "dtype": "fp32"})


TASKS = [Task(
    name="12.fusion", lesson="12", title="three elementwise kernels where one would do", tier="systems",
    slow=fused_operation, reference=fused_compiled, build=build, warmup=3,
    what=("fused_operation(x, y) computes (x + y).relu().mean(dim=1) in three kernels. Write a function with the "
          "same arguments and result that moves fewer bytes through device memory."),
    hints=("Count the bytes: which tensors does eager PyTorch write to memory only to read them back in the next "
           "operation?",
           "Decorate your function with @torch.compile: inductor generates one kernel for the whole chain."),
)]
