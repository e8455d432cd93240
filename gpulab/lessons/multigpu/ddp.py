"""Sections 2 and 4 of lesson 14, inside the worker processes: the single-process variants (`exp_dp`: the plain
model, DDP with one process, DataParallel), DDP across processes (`exp_ddp`: checked gradients, throughput,
`no_sync()` accumulation), and DDP's gradient buckets (`bucket_run`, one cap: checked, then timed as the DDP
step, compute only and the communication alone; `exp_buckets`, the notebook's bucket panel), with a profile of
the GPU's kernels (`profile_steps_of`). Every variant's gradients are checked before anything is timed.
"""
from __future__ import annotations

import contextlib
import copy
import time
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook

from gpulab.core.device import float32_matmul
from gpulab.core.timing import PROFILE_KW, benchmark, gpu_kernels, release_cupti
from gpulab.lessons.multigpu.arithmetic import (GRAD_TOL, MiB, bucket_layout, check_grads, kernel_breakdown,
                                                overlap_fraction)
from gpulab.lessons.multigpu.worker import (Ctx, build_model, forward_backward, global_batch, grads_of, speed_mode,
                                            sync_all, timing_dict)


def exp_dp(ctx: Ctx, model: dict, batch: int, gpus: int, warmup: int, repeat: int,
           tol: float = GRAD_TOL, process_group=None) -> dict:
    """One process: the plain model, DDP with one process, and DataParallel over `gpus` GPUs.

    Each variant's gradients are first checked against the plain model's on the same batch.
    `process_group`: a group of this process alone, when it runs inside a larger launch (`exp_suite`).
    """
    dev = ctx.device
    net = build_model(model, dev)
    ddp_net, dp_net = copy.deepcopy(net), copy.deepcopy(net)
    ddp = nn.parallel.DistributedDataParallel(ddp_net, device_ids=[dev.index] if dev.type == "cuda" else None,
                                              process_group=process_group)
    dp = nn.DataParallel(dp_net, device_ids=list(range(gpus)) if gpus else None)
    global_n = batch * max(gpus, 1)
    xg, yg = (t.to(dev) for t in global_batch(model, global_n))
    checks = {}
    with float32_matmul("ieee"):
        forward_backward(net, xg, yg)
        ref = grads_of(list(net.parameters()))
        forward_backward(ddp, xg, yg)
        checks["DDP, 1 process"] = check_grads(grads_of(list(ddp_net.parameters())), ref, tol, "DDP, 1 process")
        if gpus:
            forward_backward(dp, xg, yg)
            checks[f"DataParallel, {gpus} GPU(s)"] = check_grads(grads_of(list(dp_net.parameters())), ref, tol,
                                                                  f"DataParallel over {gpus} GPU(s)")
    x1, y1 = xg[:batch], yg[:batch]

    def plain_step():
        net.zero_grad(set_to_none=True)
        forward_backward(net, x1, y1)

    def ddp_step():
        ddp.zero_grad(set_to_none=True)
        forward_backward(ddp, x1, y1)

    def dp_step():
        dp.zero_grad(set_to_none=True)
        forward_backward(dp, xg, yg)
        sync_all(gpus)                      # every GPU's share is done, not only GPU 0's

    timings = {}
    with speed_mode(dev):
        timings["1 device, plain"] = timing_dict(benchmark(plain_step, warmup=warmup, repeat=repeat, device=dev), batch)
        timings["DDP, 1 process"] = timing_dict(benchmark(ddp_step, warmup=warmup, repeat=repeat, device=dev), batch)
        if gpus:
            timings[f"DataParallel, {gpus} GPU(s)"] = timing_dict(
                benchmark(dp_step, warmup=warmup, repeat=repeat, device=dev), global_n)
    return {"gpus": gpus, "batch_per_device": batch, "checks": checks, "tol": tol, "timings": timings,
            "dp_device_ids": list(dp.device_ids),
            "param_bytes": sum(p.numel() * p.element_size() for p in net.parameters())}


def bucket_buffers(sizes: Sequence[int], device: torch.device) -> list[torch.Tensor]:
    """One fp32 buffer per bucket size, to time the communication alone."""
    return [torch.zeros(max(1, n // 4), device=device) for n in sizes]


def exp_ddp(ctx: Ctx, model: dict, batch: int, warmup: int, repeat: int, buckets_mb: Sequence[float | None],
            accum_steps: int, accum_micro: int, tol: float = GRAD_TOL, corrupt: bool = False,
            gradient_as_bucket_view: bool = False, profile_steps: int = 0) -> dict:
    """DDP: gradients checked, throughput, `no_sync()` accumulation, and each bucket cap of `buckets_mb`
    (`bucket_run`: checked, then DDP step, compute only and communication only; the middle cap
    profiled over `profile_steps` steps on GPUs).

    `corrupt=True` skips the all-reduce of the checked step (each rank keeps its own gradient):
    the check must then fail. It exists to show that the check can fail.
    """
    dev, r, n = ctx.device, ctx.rank, ctx.world
    ids = [dev.index] if dev.type == "cuda" else None
    base = build_model(model, dev)
    params_bytes = sum(p.numel() * p.element_size() for p in base.parameters())
    ref_net = copy.deepcopy(base)
    net = copy.deepcopy(base)
    ddp = nn.parallel.DistributedDataParallel(net, device_ids=ids)
    xg, yg = (t.to(dev) for t in global_batch(model, batch * n))
    xs, ys = xg[r * batch:(r + 1) * batch], yg[r * batch:(r + 1) * batch]
    k, mb = accum_steps, accum_micro
    xa, ya = (t.to(dev) for t in global_batch(model, k * mb * n, seed=2))
    mine = slice(r * k * mb, (r + 1) * k * mb)
    micro = list(zip(xa[mine].chunk(k), ya[mine].chunk(k)))

    def accumulate(use_no_sync: bool) -> None:
        ddp.zero_grad(set_to_none=True)
        for i, (x, y) in enumerate(micro):
            skip = use_no_sync and i < k - 1
            with ddp.no_sync() if skip else contextlib.nullcontext():
                forward_backward(ddp, x, y, divide=k)          # only the last backward all-reduces with no_sync

    checks = {}
    with float32_matmul("ieee"):
        ddp.zero_grad(set_to_none=True)
        with ddp.no_sync() if corrupt else contextlib.nullcontext():
            forward_backward(ddp, xs, ys)
        got = grads_of(list(net.parameters()))
        ref = ref_acc = None      # rank 0: the single-device step on every process's samples
        if r == 0:
            forward_backward(ref_net, xg, yg)
            ref = grads_of(list(ref_net.parameters()))
            checks["DDP step"] = check_grads(got, ref, tol, f"DDP over {n} processes, rank 0")
        for use in (True, False):
            accumulate(use)
            got = grads_of(list(net.parameters()))
            if r == 0:
                if ref_acc is None:
                    ref_net.zero_grad(set_to_none=True)
                    forward_backward(ref_net, xa, ya)
                    ref_acc = grads_of(list(ref_net.parameters()))
                name = f"{k} micro-steps " + ("with no_sync" if use else "without no_sync")
                checks[name] = check_grads(got, ref_acc, tol, name)
        del ref_acc                # ref stays: each bucket cap below is checked against it
    ref_net.zero_grad(set_to_none=True)

    def ddp_step(d, x=xs, y=ys):
        d.zero_grad(set_to_none=True)
        forward_backward(d, x, y)

    def bench(fn):
        return benchmark(fn, warmup=warmup, repeat=repeat, device=dev)

    out: dict[str, Any] = {"world": n, "batch_per_device": batch, "param_bytes": params_bytes, "checks": checks,
                           "tol": tol, "accum_steps": k, "accum_micro": mb}
    with speed_mode(dev):
        t = bench(lambda: ddp_step(ddp))
        out["throughput"] = timing_dict(t, batch * n)
        out["step_ms_by_rank"] = ctx.gather(t.median_ms)
        t_sync = bench(lambda: accumulate(False))
        t_nosync = bench(lambda: accumulate(True))
        out["accumulation"] = {"without no_sync": timing_dict(t_sync, k * mb * n),
                               "with no_sync": timing_dict(t_nosync, k * mb * n)}
        del ddp, net
        middle = buckets_mb[len(buckets_mb) // 2]
        out["buckets"] = [bucket_run(ctx, base, xs, ys, ref, cap, gradient_as_bucket_view, warmup, repeat, tol,
                                     profile_steps if cap == middle else 0) for cap in buckets_mb]
    return out


def bucket_run(ctx: Ctx, base: nn.Module, xs: torch.Tensor, ys: torch.Tensor, ref: Sequence[torch.Tensor] | None,
               cap: float | None, gradient_as_bucket_view: bool, warmup: int, repeat: int, tol: float = GRAD_TOL,
               profile_steps: int = 0) -> dict:
    """DDP on a copy of `base` with gradient buckets of `cap` MiB (None: one bucket for the whole model):
    its gradients checked against `ref` (rank 0's single-device step on every process's samples), then
    four timings on the same batch: the DDP step; DDP without communication (a second copy whose comm hook
    returns each bucket as it is, PyTorch's `noop_hook`: DDP's own work, the copies into the buckets and back
    and its hooks, without the all-reduce); compute only (the DDP step under `no_sync()`, which skips DDP's
    work too); the communication alone (one all-reduce per bucket, laid out as DDP lays them out, started back
    to back as DDP starts them). With `profile_steps`, on GPUs, also a profile of the DDP step and of compute
    only (`profile_steps_of`).

    `hidden`: the share of the all-reduce the step did not pay for, against DDP without communication
    (`overlap_fraction`); `overlap`: the same against compute only, which counts DDP's own copies and hooks as
    communication that was not hidden.

    `gradient_as_bucket_view=True` makes each `.grad` a view into its bucket, so backward writes the
    gradients where the all-reduce reads them instead of being copied there; the views survive only
    if the gradients are zeroed in place (`zero_grad(set_to_none=False)`), which is what the steps do then.
    """
    dev = ctx.device
    ids = [dev.index] if dev.type == "cuda" else None
    sizes_of_params = [p.numel() * p.element_size() for p in base.parameters()]
    params_bytes = sum(sizes_of_params)
    cap_mb = cap if cap is not None else params_bytes / MiB * 1.01 + 1     # one bucket: the whole model
    label = "whole model" if cap is None else f"{cap:g} MiB"
    m = copy.deepcopy(base)
    d = nn.parallel.DistributedDataParallel(m, device_ids=ids, bucket_cap_mb=cap_mb,
                                            gradient_as_bucket_view=gradient_as_bucket_view)

    def ddp_step():
        d.zero_grad(set_to_none=not gradient_as_bucket_view)
        forward_backward(d, xs, ys)

    def compute_only():
        d.zero_grad(set_to_none=not gradient_as_bucket_view)
        with d.no_sync():
            forward_backward(d, xs, ys)

    silent = nn.parallel.DistributedDataParallel(copy.deepcopy(base), device_ids=ids, bucket_cap_mb=cap_mb,
                                                 gradient_as_bucket_view=gradient_as_bucket_view)
    silent.register_comm_hook(None, noop_hook)          # each bucket stays as it is: no all-reduce

    def ddp_without_comm():
        silent.zero_grad(set_to_none=not gradient_as_bucket_view)
        forward_backward(silent, xs, ys)

    with float32_matmul("ieee"):
        for _ in range(2):                 # the second step runs in the rebuilt buckets (and, as views, in them)
            ddp_step()
        diff = check_grads(grads_of(list(m.parameters())), ref, tol, f"DDP, {label} buckets") if ref is not None else None
    bufs = bucket_buffers(bucket_layout(sizes_of_params, int(cap_mb * MiB)), dev)

    def comm():
        works = [dist.all_reduce(b, async_op=True) for b in bufs]   # as DDP issues them
        for w in works:
            w.wait()

    with speed_mode(dev):
        t_ddp = benchmark(ddp_step, warmup=warmup, repeat=repeat, device=dev)
        t_silent = benchmark(ddp_without_comm, warmup=warmup, repeat=repeat, device=dev)
        t_comp = benchmark(compute_only, warmup=warmup, repeat=repeat, device=dev)
        t_comm = benchmark(comm, warmup=warmup, repeat=repeat, device=dev)
        if profile_steps and dev.type == "cuda":
            profile = profile_steps_of({"DDP step": ddp_step, "compute only": compute_only}, profile_steps, dev)
        else:
            profile = None if profile_steps == 0 else {
                "skipped": "the profile reads CUDA kernels: with gloo on CPU processes the all-reduce runs on the host"}
    row = {"cap_mb": cap_mb, "label": label, "n_buckets": len(bufs), "gradient_as_bucket_view": gradient_as_bucket_view,
           "grad_diff": diff, "ddp_ms": t_ddp.median_ms, "no_comm_ms": t_silent.median_ms, "compute_ms": t_comp.median_ms,
           "comm_ms": t_comm.median_ms,
           "hidden": overlap_fraction(t_silent.median_ms, t_comm.median_ms, t_ddp.median_ms),
           "overlap": overlap_fraction(t_comp.median_ms, t_comm.median_ms, t_ddp.median_ms),
           "ddp_ms_by_rank": ctx.gather(t_ddp.median_ms), "profile": profile}
    return row                  # d, m, silent and the buffers go with this frame


def profile_steps_of(fns: dict[str, Callable[[], None]], steps: int, device: torch.device) -> dict:
    """`steps` calls of each fn under `torch.profiler` (CUDA activity), their kernels sorted by
    `kernel_breakdown`, and the wall time per step (host clock, synchronized; the profiler adds a little).
    Every rank runs it (the steps' collectives need all of them) and runs the steps even if the profiler
    fails, so the ranks stay in step; the failure is reported as {"error": ...}."""
    from torch.profiler import ProfilerActivity, profile

    out: dict[str, Any] = {}
    errors = []
    for label, fn in fns.items():
        fn()
        torch.cuda.synchronize(device)
        prof, error = None, None
        try:
            prof = profile(activities=[ProfilerActivity.CUDA], **PROFILE_KW)
            prof.start()
        except Exception as err:            # noqa: BLE001 - the steps must run on every rank regardless
            prof, error = None, f"{type(err).__name__}: {err}"
        t0 = time.perf_counter()
        for _ in range(steps):
            fn()
        torch.cuda.synchronize(device)
        wall = time.perf_counter() - t0
        try:
            if prof is not None:
                prof.stop()
                release_cupti()
                kernels = gpu_kernels(prof)
                out[label] = dict(kernel_breakdown(kernels, steps), wall_ms=wall * 1e3 / steps)
        except Exception as err:            # noqa: BLE001
            error = f"{type(err).__name__}: {err}"
        if error:
            errors.append(f"{label}: {error}")
    return {"error": "; ".join(errors)} if errors else out


def exp_buckets(ctx: Ctx, model: dict, batch: int, warmup: int, repeat: int, bucket_cap_mb: float,
                gradient_as_bucket_view: bool = False, profile_steps: int = 0, tol: float = GRAD_TOL) -> dict:
    """One bucket cap, with or without `gradient_as_bucket_view` (`bucket_run`): the notebook's bucket panel."""
    dev, r, n = ctx.device, ctx.rank, ctx.world
    base = build_model(model, dev)
    xg, yg = (t.to(dev) for t in global_batch(model, batch * n))
    ref = None
    if r == 0:
        ref_net = copy.deepcopy(base)
        with float32_matmul("ieee"):
            forward_backward(ref_net, xg, yg)
        ref = grads_of(list(ref_net.parameters()))
        del ref_net
    row = bucket_run(ctx, base, xg[r * batch:(r + 1) * batch], yg[r * batch:(r + 1) * batch], ref,
                     bucket_cap_mb, gradient_as_bucket_view, warmup, repeat, tol, profile_steps)
    return {"world": n, "tol": tol, "bucket": row}
