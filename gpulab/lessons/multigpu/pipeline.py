"""Section 5 of lesson 14, inside the worker processes: a pipeline of one stage per process with GPipe's
schedule (`exp_pipeline`): each stage's gradients and the loss checked against the unsplit model, then each
stage's busy time and the step's wall time, whose ratio is the measured bubble.
"""
from __future__ import annotations

import copy
from typing import Sequence

import torch
import torch.distributed as dist

from gpulab.core.device import float32_matmul
from gpulab.core.timing import stopwatch
from gpulab.lessons.multigpu.arithmetic import (GRAD_TOL, Mismatch, bubble_fraction, check_grads, check_micro_batches,
                                                measured_bubble)
from gpulab.lessons.multigpu.worker import Ctx, build_model, forward_backward, global_batch
from gpulab.models.transformer import loss_fn


def exp_pipeline(ctx: Ctx, model: dict, batch: int, micro_batches: Sequence[int], warmup: int, repeat: int,
                 tol: float = GRAD_TOL) -> dict:
    """A pipeline of `world` stages, one per process, GPipe schedule (all forwards, then all backwards).

    m = 1 is the naive split. Each stage's busy time is the sum of its forward and backward pieces
    (host clock, device synchronized around each piece); the step's wall time runs from a common
    barrier to the barrier after the last backward. Plain fp32 throughout (TF32 off).
    """
    dev, r, p = ctx.device, ctx.rank, ctx.world
    if p < 2:
        raise ValueError("a pipeline needs at least 2 processes")
    if model["n_blocks"] % p:
        raise ValueError(f"{model['n_blocks']} blocks do not split into {p} equal stages")
    for m in micro_batches:
        check_micro_batches(batch, m)
    first, last = r == 0, r == p - 1
    full = build_model(model, dev)                # every process builds the whole model, identically
    ref = copy.deepcopy(full)
    per = model["n_blocks"] // p
    blocks = list(full.blocks)[r * per:(r + 1) * per]
    prefixes = tuple(f"blocks.{i}." for i in range(r * per, (r + 1) * per)) + (("ln_f.", "head.") if last else ())
    mine = [(name, q) for name, q in full.named_parameters() if name.startswith(prefixes)]
    ref_params = dict(ref.named_parameters())
    x, y = (t.to(dev) for t in global_batch(model, batch))
    shape = (batch, model["seq"], model["width"])

    def stage(h: torch.Tensor) -> torch.Tensor:
        for blk in blocks:
            h = blk(h)
        return full.head(full.ln_f(h)) if last else h

    def pipe_step(m: int) -> dict:
        mshape = (shape[0] // m,) + shape[1:]
        xs, ys = x.chunk(m), y.chunk(m)
        full.zero_grad(set_to_none=True)
        busy = 0.0
        ins, outs = [], []
        dist.barrier()                                       # a common start
        with stopwatch(device=dev) as wall:
            for i in range(m):                               # all forwards
                if first:
                    h = xs[i]
                else:
                    h = torch.empty(mshape, device=dev)
                    dist.recv(h, src=r - 1)
                    h.requires_grad_()
                with stopwatch(device=dev) as piece:
                    out = stage(h)
                    if last:
                        out = loss_fn(out, ys[i]) / m        # the batch loss is the mean of the micro-batch means
                busy += piece.ms
                ins.append(h)
                outs.append(out)
                if not last:
                    dist.send(out.detach(), dst=r + 1)
            for i in reversed(range(m)):                     # all backwards, last micro-batch first
                grad = None
                if not last:
                    grad = torch.empty(mshape, device=dev)
                    dist.recv(grad, src=r + 1)
                with stopwatch(device=dev) as piece:
                    outs[i].backward(grad)
                busy += piece.ms
                if not first:
                    dist.send(ins[i].grad, dst=r - 1)
            dist.barrier()                                   # the step ends when the last stage is done
        loss = sum(float(o) for o in outs) if last else None
        return {"busy_ms": busy, "wall_ms": wall.ms, "loss": loss}

    results = {}
    with float32_matmul("ieee"):
        ref_loss = float(forward_backward(ref, x, y))
        want = [ref_params[name].grad for name, _ in mine]
        for m in micro_batches:
            first_step = pipe_step(m)
            diff = check_grads([q.grad for _, q in mine], want, tol, f"pipeline stage {r}, m={m}")
            if last and abs(first_step["loss"] - ref_loss) > tol * abs(ref_loss):
                raise Mismatch(f"pipeline loss {first_step['loss']!r} differs from the unsplit model's {ref_loss!r}")
            for _ in range(warmup - 1):
                pipe_step(m)
            steps = [pipe_step(m) for _ in range(repeat)]
            results[m] = {"diff": diff, "busy_ms": [s["busy_ms"] for s in steps],
                          "wall_ms": [s["wall_ms"] for s in steps], "loss": first_step["loss"]}
    everyone = ctx.gather(results)
    out = []
    for m in micro_batches:
        walls = [max(ranks[m]["wall_ms"][j] for ranks in everyone) for j in range(repeat)]
        stages = []
        for s, ranks in enumerate(everyone):
            bubbles = sorted(measured_bubble(b, w) for b, w in zip(ranks[m]["busy_ms"], walls))
            stages.append({"stage": s, "busy_ms": sorted(ranks[m]["busy_ms"])[repeat // 2],
                           "bubble": bubbles[repeat // 2], "grad_diff": ranks[m]["diff"]})
        out.append({"micro_batches": m, "wall_ms": sorted(walls)[repeat // 2], "stages": stages,
                    "bubble_formula": bubble_fraction(p, m),
                    "bubble_measured": sum(st["bubble"] for st in stages) / p,
                    "loss": everyone[-1][m]["loss"]})
    return {"stages": p, "batch": batch, "rows": out, "ref_loss": ref_loss, "tol": tol,
            "activation_bytes": batch * model["seq"] * model["width"] * 4}
