"""Reference answers to notebook 14's free-text exercises (several GPUs: DataParallel, DDP, NCCL, pipelines).

Exercise 5's pipeline runs in processes that torchrun starts: `python -m gpulab.exercises.answers.n14 pipelining`
is that worker (`_pipelining_worker`), launched by `_launch_pipelining` as lesson 14's `launch` does its own.
"""
from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from gpulab.core.device import float32_matmul
from gpulab.core.timing import benchmark
from gpulab.exercises.answers import Answer
from gpulab.core.launcher import OUT, die_with_parent, torchrun, write_rank_error
from gpulab.lessons.l14_multi_gpu import SIZES, as_timing, bubble_fraction, exp_pipeline, launch, placement, samples_per_s
from gpulab.lessons.multigpu.arithmetic import GRAD_TOL, check_grads
from gpulab.lessons.multigpu.ddp import exp_buckets
from gpulab.lessons.multigpu.worker import Ctx, build_model, global_batch
from gpulab.models.transformer import loss_fn

MiB = 2**20


def _gpus() -> bool:
    """Whether the multi-process parts run on GPUs here (2 or more), as `placement()` decides."""
    return placement().gpus >= 2


def _size(scale: str) -> str:
    """The size the multi-process parts run at: the course's on 2+ GPUs, else tiny (`placement()`)."""
    return scale if _gpus() else "tiny"


@contextlib.contextmanager
def _world_of_one():
    """A gloo process group of this process alone (the bucket panel's experiment, run here without torchrun)."""
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _bucket(scale: str, cap_mb: float | None, view: bool = False, env: dict | None = None) -> dict:
    """One run of the notebook's bucket panel (`exp_buckets`): on 2+ GPUs at full size, launched on every GPU
    with NCCL (with `env` added to the environment); else in this process, a gloo world of one at the tiny size."""
    s = SIZES[_size(scale)]
    params = dict(model=s["model"], batch=s["batch"], warmup=s["warmup"], repeat=s["repeat"], bucket_cap_mb=cap_mb,
                  gradient_as_bucket_view=view)
    if _gpus():
        where = placement()
        saved = {k: os.environ.get(k) for k in env or {}}
        os.environ.update(env or {})
        try:
            res = launch("buckets", where.nproc, "nccl", s["timeout_s"], profile_steps=s["profile_steps"], **params)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        return dict(res["bucket"], world=res["world"])
    threads = torch.get_num_threads()
    torch.set_num_threads(1)            # as lesson 14's gloo launches run (OMP_NUM_THREADS=1, `launch_env`)
    try:
        with _world_of_one():
            res = exp_buckets(Ctx(0, 1, 0, torch.device("cpu"), "gloo"), **params)
    finally:
        torch.set_num_threads(threads)
    return dict(res["bucket"], world=res["world"])


def _where(scale: str) -> dict:
    where = placement()
    return {"GPUs": where.gpus, "scale": scale, "ran on": "NCCL, every GPU" if _gpus() else "gloo, a world of one"}


# -- 1. DataParallel against DDP at batch 1 and 32 ----------------------------------------------------
def _dp_vs_ddp(scale: str) -> dict:
    where = placement()
    s = SIZES[scale]
    n = where.gpus
    out = {"GPUs": n, "scale": scale}
    for batch in (1, 32):
        dp = launch("dp", 1, "nccl", s["timeout_s"], model=s["model"], batch=batch, gpus=n, warmup=s["warmup"],
                    repeat=s["repeat"])
        ddp = launch("ddp", n, "nccl", s["timeout_s"], model=s["model"], batch=batch, warmup=s["warmup"],
                     repeat=s["repeat"], buckets_mb=[s["buckets_mb"][1]], accum_steps=1, accum_micro=1)
        dp_rate = samples_per_s(dp["timings"][f"DataParallel, {n} GPU(s)"])
        ddp_rate = samples_per_s(ddp["throughput"])
        out.update({f"batch {batch}: DataParallel samples/s": dp_rate, f"batch {batch}: DDP samples/s": ddp_rate,
                    f"batch {batch}: DDP / DataParallel": ddp_rate / dp_rate,
                    f"batch {batch}: DataParallel step ms": as_timing(dp["timings"][f"DataParallel, {n} GPU(s)"]).median_ms})
    return out


def _dp_vs_ddp_claim(f: dict) -> str | None:
    if f["scale"] == "full" and f["batch 1: DDP / DataParallel"] <= f["batch 32: DDP / DataParallel"]:
        return "DataParallel fell further behind at batch 32 than at batch 1"
    return None


# -- 2. the all-reduce table's prediction ------------------------------------------------------------
def _predict_comm(scale: str) -> dict:
    where = placement()
    s = SIZES[scale]
    table = launch("allreduce", where.nproc, "nccl", s["timeout_s"], sizes=list(s["allreduce_bytes"]),
                   warmup=s["allreduce_warmup"], repeat=s["allreduce_repeat"])
    one = _bucket(scale, None)                      # one bucket for the whole model
    grad_bytes = sum(p.numel() * 4 for p in build_model(s["model"], torch.device("meta")).parameters())
    row = min(table["rows"], key=lambda r: abs(math.log(r["bytes"] / grad_bytes)))    # the nearest size measured
    predicted = grad_bytes / (row["algbw_gbps"] * 1e9) * 1e3
    return {**_where(scale), "gradient bytes": grad_bytes, "nearest size in the table": row["bytes"],
            "its algbw GB/s": row["algbw_gbps"], "predicted ms": predicted, "comm only ms (one bucket)": one["comm_ms"],
            "measured / predicted": one["comm_ms"] / predicted}


def _predict_comm_claim(f: dict) -> str | None:
    r = f["measured / predicted"]
    return None if f["scale"] != "full" or 0.5 <= r <= 2 else f"the one-bucket all-reduce took {r:.2f}x the table's prediction"


# -- 3. every cap -------------------------------------------------------------------------------------
def _every_cap(scale: str) -> dict:
    s = SIZES[_size(scale)]
    out = _where(scale)
    rows = [_bucket(scale, cap) for cap in s["panel_buckets_mb"]]
    for r in rows:
        out[f"{r['label']}: buckets"] = r["n_buckets"]
        out[f"{r['label']}: DDP / comm only / compute only ms"] = (f"{r['ddp_ms']:.3g} / {r['comm_ms']:.3g} / "
                                                                   f"{r['compute_ms']:.3g}")
    out["buckets by cap"] = ", ".join(str(r["n_buckets"]) for r in rows)
    out["largest gradient difference"] = max(r["grad_diff"] for r in rows)
    return out


def _every_cap_claim(f: dict) -> str | None:
    counts = [int(c) for c in f["buckets by cap"].split(", ")]
    if any(a < b for a, b in zip(counts, counts[1:])):
        return "a larger cap made more buckets"
    if f["largest gradient difference"] > GRAD_TOL:
        return "a cap's gradients differed from the single-device step's"
    return None


# -- 4. the bubble formula -----------------------------------------------------------------------------
def _bubble(scale: str) -> dict:
    four = bubble_fraction(4, 8)
    two = bubble_fraction(2, 8)
    m = next(m for m in range(1, 1000) if bubble_fraction(4, m) <= two)
    return {"4 stages, 8 micro-batches": four, "2 stages, 8 micro-batches": two,
            "micro-batches 4 stages need to idle no more than 2 with 8": m,
            "4 stages at that count": bubble_fraction(4, m)}


def _bubble_claim(f: dict) -> str | None:
    m = f["micro-batches 4 stages need to idle no more than 2 with 8"]
    if not (f["4 stages at that count"] <= f["2 stages, 8 micro-batches"] < bubble_fraction(4, m - 1)):
        return "the count found is not the smallest that matches 2 stages with 8"
    return None


# -- 5. torch.distributed.pipelining ------------------------------------------------------------------
class _Stage(nn.Module):
    """One pipeline stage of lesson 14's stack: its blocks, and on the last stage the final norm and head."""

    def __init__(self, blocks, tail=None):
        super().__init__()
        self.blocks, self.tail = nn.Sequential(*blocks), tail

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = self.blocks(h)
        return self.tail(h) if self.tail is not None else h


def _pipelining_worker(ctx: Ctx, model: dict, batch: int, micro_batches: int, warmup: int, repeat: int) -> dict:
    """In each of 2 processes: the lesson's hand-written GPipe (`exp_pipeline`), then the same split with
    `torch.distributed.pipelining` (ScheduleGPipe, then Schedule1F1B): gradients checked against the unsplit
    model's, step time and each stage's peak memory."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    dev, r, p = ctx.device, ctx.rank, ctx.world
    cuda = dev.type == "cuda"

    def peak_reset():
        if cuda:
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)

    def peak() -> int | None:
        return torch.cuda.max_memory_allocated(dev) if cuda else None

    out = {}
    peak_reset()
    hand = exp_pipeline(ctx, model, batch, [micro_batches], warmup, repeat)
    out["hand-written GPipe"] = {"ms": hand["rows"][0]["wall_ms"], "peak": ctx.gather(peak())}
    full = build_model(model, dev)
    ref = copy.deepcopy(full)
    x, y = (t.to(dev) for t in global_batch(model, batch))
    per = model["n_blocks"] // p
    last = r == p - 1
    mod = _Stage(list(full.blocks)[r * per:(r + 1) * per], nn.Sequential(full.ln_f, full.head) if last else None)
    names = [f"blocks.{i}." for i in range(r * per, (r + 1) * per)] + (["ln_f.", "head."] if last else [])
    ref_params = dict(ref.named_parameters())
    with float32_matmul("ieee"):
        loss_fn(ref(x), y).backward()
    want = [ref_params[n].grad for n, q in full.named_parameters() if n.startswith(tuple(names))]
    mine = [q for n, q in full.named_parameters() if n.startswith(tuple(names))]
    for name, kind in (("pipelining GPipe", ScheduleGPipe), ("pipelining 1F1B", Schedule1F1B)):
        stage = PipelineStage(mod, r, p, dev)
        schedule = kind(stage, n_microbatches=micro_batches, loss_fn=loss_fn)   # grads scaled by 1/m: the batch mean

        def step():
            mod.zero_grad(set_to_none=True)
            if r == 0:
                schedule.step(x)
            elif last:
                schedule.step(target=y)
            else:
                schedule.step()
        with float32_matmul("ieee"):
            step()
            diff = check_grads([q.grad for q in mine], want, GRAD_TOL, f"{name}, stage {r}")
        peak_reset()
        dist.barrier()
        t = benchmark(step, warmup=max(1, warmup - 1), repeat=repeat, device=dev)
        out[name] = {"ms": max(ctx.gather(t.median_ms)), "peak": ctx.gather(peak()), "grad_diff": max(ctx.gather(diff))}
    return {"stages": p, "micro_batches": micro_batches, "variants": out}


def _launch_pipelining(backend: str, timeout_s: float, **params) -> dict:
    """Exercise 5's worker in 2 processes, through the course's launcher (as lesson 14's `launch`)."""
    return torchrun("gpulab.exercises.answers.n14", ["pipelining", backend, OUT, json.dumps(params)], 2, backend,
                    timeout_s, what=f"pipelining (2 x {backend})")


def _pipelining(scale: str) -> dict:
    s = SIZES[scale]
    t0 = time.perf_counter()
    res = _launch_pipelining("nccl", 2 * s["timeout_s"], model=s["pipe_model"], batch=s["pipe_batch"],
                             micro_batches=max(s["pipe_micro"]), warmup=s["pipe_warmup"], repeat=s["pipe_repeat"])
    out = {"scale": scale, "micro-batches": res["micro_batches"], "launch s": time.perf_counter() - t0}
    for name, v in res["variants"].items():
        out[f"{name}: step ms"] = v["ms"]
        out[f"{name}: stage 0 peak MiB"] = v["peak"][0] / MiB if v["peak"][0] is not None else "-"
        if "grad_diff" in v:
            out[f"{name}: gradient difference"] = v["grad_diff"]
    return out


def _pipelining_claim(f: dict) -> str | None:
    if any(v > GRAD_TOL for k, v in f.items() if k.endswith("gradient difference")):
        return "a schedule's gradients differed from the unsplit model's"
    g, o = f["pipelining GPipe: stage 0 peak MiB"], f["pipelining 1F1B: stage 0 peak MiB"]
    if isinstance(g, float) and isinstance(o, float) and o > 1.05 * g:
        return "1F1B's stage 0 held more memory than GPipe's, though it keeps fewer micro-batches in flight"
    return None


# -- 6. NCCL without peer-to-peer -----------------------------------------------------------------------
def _no_p2p(scale: str) -> dict:
    where = placement()
    s = SIZES[scale]
    kw = dict(sizes=[s["allreduce_bytes"][-1]], warmup=s["allreduce_warmup"], repeat=s["allreduce_repeat"])
    out = {"GPUs": where.gpus, "scale": scale}
    for name, value in (("default", None), ("NCCL_P2P_DISABLE=1", "1")):
        before = os.environ.get("NCCL_P2P_DISABLE")
        if value is None:
            os.environ.pop("NCCL_P2P_DISABLE", None)
        else:
            os.environ["NCCL_P2P_DISABLE"] = value
        try:
            res = launch("allreduce", where.nproc, "nccl", s["timeout_s"], **kw)
        finally:
            if before is None:
                os.environ.pop("NCCL_P2P_DISABLE", None)
            else:
                os.environ["NCCL_P2P_DISABLE"] = before
        out[f"{name}: transports"] = ", ".join(res.get("nccl", {}).get("transports") or []) or "not reported"
        out[f"{name}: bus GB/s"] = res["rows"][-1]["busbw_gbps"]
    return out


def _no_p2p_claim(f: dict) -> str | None:
    if "P2P" in f["NCCL_P2P_DISABLE=1: transports"]:
        return "NCCL still reported a P2P transport with NCCL_P2P_DISABLE=1"
    return None


# -- 7. gradient_as_bucket_view -------------------------------------------------------------------------
def _view(scale: str) -> dict:
    s = SIZES[_size(scale)]
    cap = s["buckets_mb"][1]                       # the default cap's place
    off, on = _bucket(scale, cap, False), _bucket(scale, cap, True)
    gap_off, gap_on = off["ddp_ms"] - off["compute_ms"], on["ddp_ms"] - on["compute_ms"]
    out = {**_where(scale), "cap MiB": cap, "gap ms, copies": gap_off, "gap ms, views": gap_on,
           "share of the gap gone": (gap_off - gap_on) / gap_off if gap_off > 0 else "-",
           "buckets (copies, views)": f"{off['n_buckets']}, {on['n_buckets']}",
           "gradient differences (copies, views)": f"{off['grad_diff']:.1e}, {on['grad_diff']:.1e}",
           "_diffs": max(off["grad_diff"], on["grad_diff"])}
    for name, r in (("copies", off), ("views", on)):
        prof = (r.get("profile") or {}).get("DDP step")
        if prof:
            out[f"{name}: copy and fill kernels ms per step"] = prof["copy_ms"]
            out[f"{name}: kernels per step"] = prof["kernels"]
    out["largest gradient difference"] = out.pop("_diffs")
    return out


def _view_claim(f: dict) -> str | None:
    a, b = f["buckets (copies, views)"].split(", ")
    if a != b:
        return "gradient_as_bucket_view changed the buckets"
    if f["largest gradient difference"] > GRAD_TOL:
        return "a variant's gradients differed from the single-device step's"
    return None


# -- 8. NCCL_MAX_CTAS -----------------------------------------------------------------------------------
def _ctas(scale: str) -> dict:
    cap = SIZES[_size(scale)]["buckets_mb"][1]
    default, four = _bucket(scale, cap), _bucket(scale, cap, env={"NCCL_MAX_CTAS": "4"})
    return {**_where(scale), "cap MiB": cap, "DDP step ms (default, 4 CTAs)": f"{default['ddp_ms']:.3g}, {four['ddp_ms']:.3g}",
            "comm only ms (default, 4 CTAs)": f"{default['comm_ms']:.3g}, {four['comm_ms']:.3g}",
            "DDP step, 4 CTAs / default": four["ddp_ms"] / default["ddp_ms"],
            "comm only, 4 CTAs / default": four["comm_ms"] / default["comm_ms"],
            "largest gradient difference": max(default["grad_diff"], four["grad_diff"])}


def _ctas_claim(f: dict) -> str | None:
    return None if f["largest gradient difference"] <= GRAD_TOL else "gradients differed from the single-device step's"


ANSWERS = [
    Answer("14", 1, needs="2 gpus", run=_dp_vs_ddp, expect=_dp_vs_ddp_claim, text=(
        "Launch the DataParallel part and DDP with a per-GPU batch of 1 and of 32 and compare samples per second. "
        "Every DataParallel step broadcasts the weights from GPU 0, scatters the input, runs the replicas in threads "
        "that share the GIL, gathers the outputs and reduces the gradients onto GPU 0: costs that do not grow with "
        "the batch. At batch 1 they are most of the step, so DataParallel falls furthest behind; at 32 the compute "
        "hides part of them. DDP's all-reduce runs under backward in either case. At full size the run checks "
        "that DDP's lead is larger at batch 1.")),
    Answer("14", 2, needs="2 gpus", run=_predict_comm, expect=_predict_comm_claim, text=(
        "Take the model's gradient bytes (4 per parameter) and divide by the algorithm bandwidth the all-reduce "
        "table measured at the nearest message size: that is the time of one all-reduce of the whole model. Then "
        "run the bucket panel with one bucket ('whole model') and read 'comm only', which is exactly that one "
        "all-reduce. The two agree when the link is the same and idle, because 'comm only' is the table's "
        "operation at the gradients' size; at full size the run checks they are within 2x of each other.")),
    Answer("14", 3, run=_every_cap, expect=_every_cap_claim, text=(
        "Run the bucket panel at each cap and read the bucket count, 'DDP step', 'comm only' and 'compute only'. "
        "100 MiB makes a few large buckets, between 25 MiB's many and the whole model's one: each all-reduce is "
        "larger and nearer the link's best bandwidth, but the first bucket fills later in backward, so less "
        "communication overlaps the remaining compute. DDP's default of 25 MiB trades the two. Without two GPUs the run "
        "uses a gloo world of one in this process at the tiny size (whose caps are smaller): it checks the bucket layout and the gradients, not overlap.")),
    Answer("14", 4, run=_bubble, expect=_bubble_claim, text=(
        "GPipe's idle share is (p - 1) / (m + p - 1) (`bubble_fraction`). Four stages with 8 micro-batches idle "
        "3/11 of the step, two stages with 8 idle 1/9. To bring 4 stages to 1/9 or less, 3 / (m + 3) <= 1/9 needs "
        "m >= 24 micro-batches: three times as many, since each extra stage adds one more micro-batch's time to "
        "fill and drain the pipeline. Smaller micro-batches make each kernel less efficient, so the bubble is "
        "not the whole cost.")),
    Answer("14", 5, needs="2 gpus", run=_pipelining, expect=_pipelining_claim, text=(
        "Wrap each process's blocks (the last with the final norm and head) in a module, make it a "
        "`PipelineStage(module, rank, 2, device)`, and drive it with `ScheduleGPipe(stage, n_microbatches=m, "
        "loss_fn=loss_fn)`, then `Schedule1F1B`: rank 0 calls `schedule.step(x)`, the last `schedule.step(target=y)`. "
        "The schedule scales the gradients by 1/m, so they equal the unsplit model's (checked). The step time is "
        "close to the hand-written GPipe's: the same bubble. 1F1B starts each micro-batch's backward as soon as "
        "possible, so at most p micro-batches' activations are alive at once instead of m: stage 0's peak memory "
        "falls, which the run checks.")),
    Answer("14", 6, needs="2 gpus", run=_no_p2p, expect=_no_p2p_claim, text=(
        "Launch the all-reduce with `NCCL_P2P_DISABLE=1` in the environment and read the transports NCCL logs "
        "(NCCL_DEBUG=INFO, 'via ...'). Without peer-to-peer (NVLink or PCIe P2P), NCCL routes through host "
        "shared memory (SHM) or the network transport, so every byte crosses the host's memory and the bus "
        "bandwidth drops, most on NVLink machines. NCCL's documentation describes NCCL_P2P_DISABLE as disabling "
        "the peer-to-peer transport; the run checks that no P2P transport is reported then.")),
    Answer("14", 7, run=_view, expect=_view_claim, text=(
        "Run the bucket panel at the default cap with `gradient_as_bucket_view` off and on and compare the gap "
        "between 'DDP step' and 'compute only'. Off, DDP copies each gradient into its bucket, divides it by the "
        "world size there and copies the average back; on, backward writes each `.grad` straight into the "
        "bucket, leaving a zeroing (`zero_grad(set_to_none=False)`), the accumulating add and an in-place "
        "division. Views save the two copies of the gradient bytes, a memory-bound cost, so on a GPU the "
        "copy kernels shrink. With `zero_grad(set_to_none=True)` backward makes a new gradient, which DDP copies "
        "into the bucket before pointing `.grad` at its slice again (section 8): the copy comes back. Without two GPUs a world "
        "of one in this process checks both layouts' gradients.")),
    Answer("14", 8, needs="2 gpus", run=_ctas, expect=_ctas_claim, text=(
        "Set `NCCL_MAX_CTAS=4` before a bucket panel run and compare it with the default. NCCL's kernels then "
        "use at most 4 thread blocks (SMs) per collective (NCCL's environment documentation, 2.17 and later): "
        "'comm only' gets slower, because fewer SMs move the bytes, while the compute kernels beside it keep "
        "more SMs. Whether the DDP step gets faster depends on which was in the way: if backward slowed while "
        "NCCL shared the GPU, the cap helps; if communication was exposed, it hurts. The run checks the "
        "gradients in both.")),
]


def _main(argv: list[str]) -> int:
    """torchrun's worker for exercise 5: `python -m gpulab.exercises.answers.n14 pipelining BACKEND OUT PARAMS`."""
    _, backend, out, params = argv
    die_with_parent()
    rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    device = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
    try:
        if device.type == "cuda":
            torch.cuda.set_device(device)
            dist.init_process_group(backend, device_id=device)
        else:
            dist.init_process_group(backend)
    except Exception as err:
        write_rank_error(out, rank, err)
        raise
    try:
        result = _pipelining_worker(Ctx(rank, world, local, device, backend), **json.loads(params))
        if rank == 0:
            Path(out).write_text(json.dumps(result))
        dist.barrier()
    except Exception as err:
        write_rank_error(out, rank, err)
        raise
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
