"""What every worker process of lesson 14 shares: its place in the group (`Ctx`), the model and the batch
every process builds alike, one forward and backward, the gradients read back, and `exp_hello`, the smoke test
of a launch. The experiments (`ddp`, `allreduce`, `pipeline`, `fsdp`) stand on these; `cli` runs them.
"""
from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch import nn

from gpulab.core.device import float32_matmul
from gpulab.core.timing import Timing
from gpulab.lessons.multigpu.arithmetic import Mismatch
from gpulab.models.transformer import TransformerStack, loss_fn


@dataclass
class Ctx:
    """This process's place in the group: its rank, the group's size, its GPU (or the CPU) and the backend."""

    rank: int
    world: int
    local_rank: int
    device: torch.device
    backend: str

    def gather(self, obj: Any) -> list:
        """Every rank's obj, in rank order (on every rank)."""
        out: list = [None] * self.world
        dist.all_gather_object(out, obj)
        return out


def timing_dict(t: Timing, samples: int = 0) -> dict:
    """A Timing as JSON for the launcher (`l14_multi_gpu.as_timing` reads it back), with the samples per step."""
    return {"samples_ms": list(t.samples_ms), "device": t.device, "method": t.method,
            "median_ms": t.median_ms, "samples": samples}


def build_model(cfg: dict, device: torch.device, seed: int = 0) -> TransformerStack:
    """Lesson 09's GPT block stack, initialised on the CPU from `seed` (identical in every process)."""
    torch.manual_seed(seed)
    return TransformerStack(**cfg).to(device)


def global_batch(cfg: dict, batch: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """The same (x, y) batch in every process: random embeddings and each position's next one (CPU)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(batch, cfg["seq"] + 1, cfg["width"], generator=g)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def forward_backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor, divide: int = 1) -> torch.Tensor:
    """One forward and backward on (x, y), the loss divided by `divide` (micro-steps of one batch); the loss."""
    loss = loss_fn(model(x), y) / divide
    loss.backward()
    return loss.detach()


def grads_of(params: Sequence[nn.Parameter]) -> list[torch.Tensor]:
    """A copy of each gradient; one sharded by FSDP2 (a DTensor) gathered whole (a collective: every rank
    must call it)."""
    return [(p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone() for p in params]


def speed_mode(device: torch.device):
    """TF32 matrix products for timed steps on a GPU; the checks run in plain fp32."""
    return float32_matmul("tf32") if device.type == "cuda" else contextlib.nullcontext()


def sync_all(n: int) -> None:
    """Wait for the first n GPUs (DataParallel's replicas run on all of them)."""
    for d in range(n):
        torch.cuda.synchronize(d)


def exp_hello(ctx: Ctx, fail: bool = False, sleep_s: float = 0.0) -> dict:
    """Smoke test of a launch: one checked all-reduce. `fail`, `sleep_s`: the launcher's error paths."""
    if sleep_s:
        time.sleep(sleep_s)
    t = torch.tensor([ctx.rank + 1.0], device=ctx.device)
    dist.all_reduce(t)
    expected = ctx.world * (ctx.world + 1) / 2
    if t.item() != expected:
        raise Mismatch(f"all-reduce gave {t.item()}, expected {expected}")
    if fail and ctx.rank == ctx.world - 1:
        raise ValueError(f"rank {ctx.rank} was asked to fail (fail=True)")
    return {"sum": t.item(), "expected": expected,
            "ranks": ctx.gather({"rank": ctx.rank, "device": str(ctx.device), "pid": os.getpid()})}
