"""Section 6 of lesson 14, inside the worker processes: FSDP2 (`fully_shard`) against DDP on the same model
and data (`exp_fsdp`): the first step's gradients and the weights after a few AdamW steps checked, then each
variant timed, with each rank's memory at rest and at peak on GPUs. Its memory is predicted by
`arithmetic.state_bytes_per_gpu`.
"""
from __future__ import annotations

import copy
import gc
from typing import Any

import torch
from torch import nn

from gpulab.core.device import float32_matmul
from gpulab.core.timing import benchmark
from gpulab.lessons.multigpu.arithmetic import FSDP_PREFETCH, GRAD_TOL, Mismatch, check_grads
from gpulab.lessons.multigpu.worker import (Ctx, build_model, forward_backward, global_batch, grads_of, speed_mode,
                                            timing_dict)


def exp_fsdp(ctx: Ctx, model: dict, batch: int, warmup: int, repeat: int, updates: int = 3, lr: float = 1e-3,
             tol: float = GRAD_TOL, corrupt: bool = False) -> dict:
    """FSDP2 against DDP on the same model and data. `fully_shard` wraps each block, then the whole model
    (the head and final LayerNorm form the root's unit); both train with AdamW from the same weights on each
    rank's slice of the same batches (a fourth variant prefetches FSDP_PREFETCH units explicitly). Checked first: the first step's gradients (FSDP2's gathered from their
    shards) against DDP's, within `tol` of the norm (AdamW would hide a gradient off by a constant factor);
    then, after `updates` steps, the weights, by the course's one comparison (`cases.compare`: within
    SAME_MAX_FLOOR times the noise floor measured on rank 0, DDP against one process on the whole batch). Then each is timed, `reshard_after_forward` True and False,
    with each rank's memory at rest (after a step, gradients freed) and at peak, on GPUs. The starting
    weights and the batches stay on the CPU, so the GPU holds only what the variant being timed holds.

    `corrupt=True` scales the last rank's batch by 2 in the FSDP2 run's checked steps: the check must fail."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from gpulab.models.same import compare, parameters

    cpu = torch.device("cpu")
    dev, r, n = ctx.device, ctx.rank, ctx.world
    ids = [dev.index] if dev.type == "cuda" else None
    mesh = init_device_mesh(dev.type, (n,))
    base = build_model(model, cpu)                       # on the CPU: each variant copies it to the device
    start = parameters(base)
    count = sum(p.numel() for p in base.parameters())
    unit = max(sum(p.numel() for p in b.parameters()) for b in base.blocks)

    def on_device() -> nn.Module:
        return copy.deepcopy(base).to(dev)

    def sharded(reshard: bool, prefetch: int = 0) -> nn.Module:
        net = on_device()
        for block in net.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(net, mesh=mesh, reshard_after_forward=reshard)
        if prefetch:       # explicit: each block issues the all-gathers of the next `prefetch` blocks (backward: the previous)
            blocks = list(net.blocks)
            for i, block in enumerate(blocks):
                block.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + prefetch])
                block.set_modules_to_backward_prefetch(blocks[max(0, i - prefetch):i][::-1])
        return net

    def data(k: int, whole: bool = False, scale_mine: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = global_batch(model, batch * n, seed=10 + k)             # on the CPU; only what is used moves
        if not whole:
            x, y = x[r * batch:(r + 1) * batch] * scale_mine, y[r * batch:(r + 1) * batch]
        return x.to(dev), y.to(dev)

    checks: dict[str, Any] = {}
    with float32_matmul("ieee"):
        ddp = nn.parallel.DistributedDataParallel(on_device(), device_ids=ids)
        ddp_opt = torch.optim.AdamW(ddp.parameters(), lr=lr)
        fsdp = sharded(True)
        fsdp_opt = torch.optim.AdamW(fsdp.parameters(), lr=lr)
        for k in range(updates):
            for net, opt, mine in ((ddp, ddp_opt, 1.0), (fsdp, fsdp_opt, 2.0 if corrupt and r == n - 1 else 1.0)):
                opt.zero_grad(set_to_none=True)
                forward_backward(net, *data(k, scale_mine=mine))
            if k == 0:
                got, want = grads_of(list(fsdp.parameters())), grads_of(list(ddp.module.parameters()))   # every rank
                if r == 0:
                    checks["grads"] = check_grads(got, want, tol, f"FSDP2 over {n} processes, first step", "DDP")
                del got, want
            ddp_opt.step()
            fsdp_opt.step()
        got, want = ([t.cpu() for t in parameters(m)] for m in (fsdp, ddp.module))   # every rank: a collective
        if r == 0:
            ref = on_device()
            ref_opt = torch.optim.AdamW(ref.parameters(), lr=lr)
            for k in range(updates):
                ref_opt.zero_grad(set_to_none=True)
                forward_backward(ref, *data(k, whole=True))
                ref_opt.step()
            same = compare(start, want, got, [(want, [t.cpu() for t in parameters(ref)])], k=updates,
                           floor_is="DDP against one process on the whole batch", what="FSDP2")
            checks.update(updates=updates, **same)
            if not same["ok"]:
                raise Mismatch(f"FSDP2 over {n} processes against DDP: {same['why']}")
            del ref, ref_opt
        del fsdp, fsdp_opt, got, want, ddp, ddp_opt
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()

    out: dict[str, Any] = {"world": n, "batch_per_device": batch, "params": count, "largest_unit": unit,
                           "checks": checks, "tol": tol, "variants": {}}
    makers = {"DDP": lambda: nn.parallel.DistributedDataParallel(on_device(), device_ids=ids),
              "FSDP2, reshard_after_forward=True": lambda: sharded(True),
              "FSDP2, reshard_after_forward=False": lambda: sharded(False),
              f"FSDP2, reshard_after_forward=True, prefetch {FSDP_PREFETCH} units": lambda: sharded(True, FSDP_PREFETCH)}
    x, y = data(0)
    with speed_mode(dev):
        for name, make in makers.items():
            net = make()
            opt = torch.optim.AdamW(net.parameters(), lr=lr)

            def step(net=net, opt=opt):
                opt.zero_grad(set_to_none=True)
                forward_backward(net, x, y)
                opt.step()

            step()                                   # AdamW's moments exist from here on
            opt.zero_grad(set_to_none=True)
            row: dict[str, Any] = {}
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
                row["rest_bytes"] = ctx.gather(torch.cuda.memory_allocated(dev))
                torch.cuda.reset_peak_memory_stats(dev)
            t = benchmark(step, warmup=warmup, repeat=repeat, device=dev)
            if dev.type == "cuda":
                row["peak_bytes"] = ctx.gather(torch.cuda.max_memory_allocated(dev))
            row["timing"] = timing_dict(t, batch * n)
            row["step_ms_by_rank"] = ctx.gather(t.median_ms)
            out["variants"][name] = row
            del net, opt, step
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return out
