"""The command each of lesson 14's worker processes runs (torchrun starts it; `l14_multi_gpu.launch` starts
torchrun): `python -m gpulab.lessons.multigpu.cli EXPERIMENT --backend B --out FILE --params JSON`.

It joins the process group (NCCL on this process's GPU, or gloo on the CPU), runs one of `EXPERIMENTS` with the
JSON's arguments, and rank 0 writes the result, with where it ran and how long the process group took, to FILE.
A failing rank leaves its error beside FILE (`gpulab.core.launcher.write_rank_error`) and exits non-zero.
`exp_suite` runs several experiments in one set of processes, so their start-up is paid once.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from gpulab.core.launcher import BACKENDS, die_with_parent, write_rank_error
from gpulab.lessons.multigpu.allreduce import exp_allreduce
from gpulab.lessons.multigpu.ddp import exp_buckets, exp_ddp, exp_dp
from gpulab.lessons.multigpu.fsdp import exp_fsdp
from gpulab.lessons.multigpu.pipeline import exp_pipeline
from gpulab.lessons.multigpu.worker import Ctx, exp_hello


def exp_suite(ctx: Ctx, ddp: dict, allreduce: dict, pipeline: dict | None = None, dp: dict | None = None,
              fsdp: dict | None = None) -> dict:
    """(With `dp` given) `dp` on rank 0 alone, then `ddp`, `allreduce` and (each when given) `pipeline` and
    `fsdp`, in one set of processes.

    Each launch pays seconds of start-up (Python, PyTorch, the process group) before any
    measurement; running the parts in one launch pays it once. Each part's own time is kept.
    `dp` runs while the other ranks wait (DataParallel drives every GPU from one process), with its
    one-process DDP on a group of rank 0 alone. They wait at a gloo barrier, on the host: an NCCL
    barrier would leave a kernel spinning on their GPU, taking SMs from DataParallel's replica there.
    """
    out: dict[str, Any] = {"dp": None}
    if dp is not None:
        alone = dist.new_group([0])                   # every rank takes part in creating each group
        on_host = dist.new_group(backend="gloo")
        if ctx.rank == 0:
            t0 = time.perf_counter()
            out["dp"] = dict(exp_dp(ctx, **dp, process_group=alone), work_s=time.perf_counter() - t0)
        dist.barrier(group=on_host)
    for name, fn, params in (("ddp", exp_ddp, ddp), ("allreduce", exp_allreduce, allreduce),
                             ("pipeline", exp_pipeline, pipeline), ("fsdp", exp_fsdp, fsdp)):
        if params is None:
            out[name] = None
            continue
        dist.barrier()                      # every rank starts the part together
        t0 = time.perf_counter()
        out[name] = dict(fn(ctx, **params), work_s=time.perf_counter() - t0)
    return out


EXPERIMENTS: dict[str, Callable[..., dict]] = {
    "hello": exp_hello, "dp": exp_dp, "ddp": exp_ddp, "buckets": exp_buckets, "allreduce": exp_allreduce,
    "pipeline": exp_pipeline, "suite": exp_suite, "fsdp": exp_fsdp,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpulab.lessons.multigpu.cli",
                                description="One of lesson 14's experiments, in each process torchrun starts.")
    p.add_argument("experiment", choices=sorted(EXPERIMENTS))
    p.add_argument("--backend", choices=BACKENDS, default="gloo")
    p.add_argument("--out", default=None, help="rank 0 writes its JSON result here")
    p.add_argument("--params", default="{}", help="the experiment's arguments, as JSON")
    a = p.parse_args(argv)
    die_with_parent()
    params = json.loads(a.params)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if "MASTER_ADDR" not in os.environ:                  # started without torchrun: a group of one
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000),
                          RANK="0", WORLD_SIZE="1")
    device = torch.device("cuda", local) if a.backend == "nccl" else torch.device("cpu")
    t0 = time.perf_counter()
    try:
        if device.type == "cuda":
            torch.cuda.set_device(device)
            dist.init_process_group(a.backend, device_id=device)
        else:
            dist.init_process_group(a.backend)
        ctx = Ctx(rank, world, local, device, a.backend)
        t1 = time.perf_counter()
        result = EXPERIMENTS[a.experiment](ctx, **params)
    except Exception as err:
        if a.out:
            write_rank_error(a.out, rank, err)
        raise
    result = dict(result, experiment=a.experiment, backend=a.backend, world_size=world, device=device.type,
                  torch=torch.__version__, init_s=t1 - t0, work_s=time.perf_counter() - t1)
    if rank == 0 and a.out:
        tmp = f"{a.out}.tmp"
        Path(tmp).write_text(json.dumps(result))
        os.replace(tmp, a.out)
    del result, ctx
    gc.collect()                 # DDP reducers and pending work go before their process group
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
