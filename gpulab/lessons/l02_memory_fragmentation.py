"""Notebook 02's experiment: fragment the caching allocator until a real OOM.

How PyTorch's CUDA caching allocator works, in the parts that matter here:
- a request of 10 MiB or more gets its own segment from the driver (cudaMalloc),
  rounded up to 2 MiB; when freed, the segment stays cached for reuse;
- a cached free block serves a smaller request by being *split*: the rest
  stays behind as a free block of the same segment (in the large pool, requests
  over 1 MiB, only where more than 1 MiB remains; else the request takes it whole);
- a segment goes back to the driver only when every block in it is free.

The pattern, under a memory cap (torch.cuda.set_per_process_memory_fraction):
1. phase A: allocate `a_mib` tensors (think: activations of one shape) until
   ~85% of the cap is reserved, then free them all: every segment is cached, empty;
2. phase B: allocate one long-lived `b_mib` tensor per A tensor (think: optimizer
   state created lazily at the first step). Each one splits a cached A segment,
   so every segment now holds a live tensor and a free remainder;
3. ask for one big tensor (`big_fraction` of the cap).

In total the cap has room for it, but no free block is that large, and no segment
can be released to make one: `torch.OutOfMemoryError`.

Fixes (each run in a fresh process, since the allocator reads its settings once; several start together
where the GPU's free memory holds them all, else one after another: `fit_together`):
- `expandable_segments`: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True keeps one
  growing segment per stream, mapped in 20 MiB pages; the free tail after the
  packed B tensors is unmapped and reused for the big tensor.
- `empty_cache`: torch.cuda.empty_cache() between the phases returns the empty A
  segments to the driver before B allocates.
- `pool`: the B tensors are views into one buffer allocated up front (memory pooling).

Run one variant: `python -m gpulab.lessons.l02_memory_fragmentation --cap-mib 4096 --fix none` (prints JSON).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from gpulab.core.children import at_once
from gpulab.core.device import require_cuda, resolve_scale
from gpulab.core.memory import free_memory
from gpulab.core.predict import Plan, Work


NO_ALLOCATOR = "the caching allocator this experiment studies is CUDA's."


FIXES = ("none", "expandable_segments", "empty_cache", "pool")


MiB = 2**20


def plan(scale: str | None = None) -> Plan:
    """What notebook 02 asks of the GPU at `scale` (gpulab.core.predict): almost nothing. The
    fragmentation pattern only allocates (`torch.empty` touches no memory) in fresh processes, whose
    start-up is host time; the GPU computes only the planted leak's MLP."""
    # this lesson has no config(): the leak's sizes are the notebook's own, by_scale(tiny=..., full=...)
    full = resolve_scale(scale) == "full"
    width, batch = (2048, 512) if full else (64, 8)
    # evaluate(8, leak=True) and evaluate(8, leak=False): 16 forward passes of width -> 4 width -> width
    forward = 2 * (2 * batch * width * 4 * width)
    # the clean loop copies each output (batch x width fp32) to the host: 8 pageable device->host copies
    to_host = 8 * batch * width * 4
    work = [
        Work("matmul_fp32", 16 * forward, 0.6, f"16 MLP forward passes, width {width}, batch {batch}"),
        Work("d2h_pageable", to_host, 1.0, "8 outputs copied to the host (.cpu())"),
    ]
    # host_s: see host_source; tiny runs the same formulas, with the full run's host time (tiny runs on
    # the CPU, where nothing is predicted: its plan is only for completeness)
    return Plan(host_s=29.9, work=work,
                host_source="wall time of notebook 02 in results/course/2026-11-30-h200-00-to-09-at-775ae4a/h200-2026-11-30-course-timings.tsv "
                            "(H200, torch 2.11, 2026-11-30) minus its GPU work at that run's ceilings")


@dataclass
class FragResult:
    fix: str
    cap_mib: int
    a_mib: int
    b_mib: int
    big_mib: int
    ok: bool
    error: str = ""
    # at the moment of the big request
    allocated_mib: float = 0.0
    reserved_mib: float = 0.0
    free_in_cap_mib: float = 0.0
    largest_free_block_mib: float = 0.0
    segments: int = 0
    num_alloc_retries: int = 0
    num_ooms: int = 0
    reserved_after_mib: float = 0.0  # after the big request (and the allocator's retry)
    alloc_conf: str = ""           # the allocator setting this process started with
    started: str = ""              # set by the parent: whether it ran beside the others or alone, and why
    # (phase, allocated MiB, reserved MiB) after each step
    timeline: list = field(default_factory=list)
    # per segment: list of (MiB, "live"/"free") blocks, at the big request
    layout: list = field(default_factory=list)


def layout_of(segments: list) -> tuple[list, float, int]:
    """(blocks per segment as (MiB, "live"/"free"), largest free block MiB, segment count)
    from `torch.cuda.memory_snapshot()` or the "segments" of `torch.cuda.memory._snapshot()`."""
    layout, largest = [], 0.0
    for seg in segments:
        blocks = [(b["size"] / MiB, "live" if b["state"] == "active_allocated" else "free")
                  for b in seg["blocks"]]
        largest = max([largest] + [s for s, st in blocks if st == "free"])
        layout.append(blocks)
    return layout, largest, len(segments)


def _layout(torch) -> tuple[list, float, int]:
    return layout_of(torch.cuda.memory_snapshot())


def trace_timeline(snapshot: dict) -> list[float]:
    """Allocated MiB after each alloc/free event recorded by
    `torch.cuda.memory._record_memory_history` (from `torch.cuda.memory._snapshot()`)."""
    out, current = [], 0.0
    for trace in snapshot.get("device_traces", []):
        for event in trace:
            if event["action"] == "alloc":
                current += event["size"] / MiB
            elif event["action"] == "free_completed":
                current -= event["size"] / MiB
            else:
                continue
            out.append(current)
    return out


def run_pattern(cap_mib: int = 4096, fix: str = "none", a_mib: int = 40, b_mib: int = 24,
                big_fraction: float = 0.4) -> FragResult:
    """Run the pattern in *this* process under a cap of `cap_mib` (CUDA only).

    `fix="expandable_segments"` only takes effect if the process started with that
    allocator setting; `run_in_fresh_process` arranges it.
    """
    import torch

    if fix not in FIXES:
        raise ValueError(f"fix must be one of {', '.join(FIXES)} (got {fix!r}).")
    if not 1 <= b_mib < a_mib:
        raise ValueError(f"need 1 <= b_mib < a_mib (got a_mib={a_mib}, b_mib={b_mib}).")
    dev = require_cuda(NO_ALLOCATOR)
    total = torch.cuda.get_device_properties(dev).total_memory
    if cap_mib * MiB > total:
        raise ValueError(f"cap_mib={cap_mib} is more than this GPU's {total // MiB:,} MiB: a cap must be below it")
    torch.cuda.empty_cache()
    if torch.cuda.memory_reserved(dev):
        raise RuntimeError("run the pattern in a fresh process: this one already holds GPU memory")
    big_mib = int(cap_mib * big_fraction)
    res = FragResult(fix=fix, cap_mib=cap_mib, a_mib=a_mib, b_mib=b_mib, big_mib=big_mib, ok=False,
                     alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF",
                                               os.environ.get("PYTORCH_ALLOC_CONF", "")))

    def note(phase: str) -> None:
        res.timeline.append((phase, torch.cuda.memory_allocated(dev) / MiB,
                             torch.cuda.memory_reserved(dev) / MiB))

    def empty(mib: int):
        return torch.empty(mib * MiB, dtype=torch.uint8, device=dev)

    torch.cuda.set_per_process_memory_fraction(cap_mib * MiB / total, dev)
    try:
        count = int(0.85 * cap_mib / a_mib)
        a = []
        for _ in range(count):
            a.append(empty(a_mib))
            note("A: allocate")
        while a:
            a.pop()
            note("A: free")
        if fix == "empty_cache":
            torch.cuda.empty_cache()
            note("empty_cache")
        if fix == "pool":
            pool = empty(count * b_mib)
            b = [pool[i * b_mib * MiB:(i + 1) * b_mib * MiB] for i in range(count)]  # views
            note("B: pool")
        else:
            b = []
            for _ in range(count):
                b.append(empty(b_mib))
                note("B: allocate")
        res.allocated_mib = torch.cuda.memory_allocated(dev) / MiB
        res.reserved_mib = torch.cuda.memory_reserved(dev) / MiB
        res.free_in_cap_mib = cap_mib - res.allocated_mib
        res.layout, res.largest_free_block_mib, res.segments = _layout(torch)
        try:
            big = empty(big_mib)
            res.ok = True
            note("big tensor")
            del big
        except torch.OutOfMemoryError as err:
            res.error = str(err).splitlines()[0]
            note("OOM")
        res.reserved_after_mib = torch.cuda.memory_reserved(dev) / MiB
        stats = torch.cuda.memory_stats(dev)
        res.num_alloc_retries = stats.get("num_alloc_retries", 0)
        res.num_ooms = stats.get("num_ooms", 0)
        del b
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, dev)
        torch.cuda.empty_cache()
    return res


# What a child process takes outside its allocator's cap: its CUDA context and PyTorch's own start-up (the cap,
# set_per_process_memory_fraction, bounds only what the caching allocator reserves). A context takes a few hundred
# MiB; 1 GiB is an allowance, not a measurement, so that children started together never run the GPU out of memory.
CONTEXT_MIB = 1024


def fit_together(count: int, cap_mib: int, free_mib: float | None) -> tuple[bool, str]:
    """Whether `count` children, each reserving up to `cap_mib` under its cap plus CONTEXT_MIB for its context, fit
    in `free_mib` MiB of free GPU memory at once, and the sentence that says why they start together or one after
    another. Each child's phase A alone fills 85 % of its cap: on an 8-12 GB card three at once run the GPU itself
    out of memory, an error no fix in them can remove (issue 40). With the free memory unknown: one after another."""
    need = count * (cap_mib + CONTEXT_MIB)
    if count <= 1:
        return True, "one process"
    if free_mib is None:
        return False, f"{count} processes one after another (this GPU's free memory is not known)"
    if need <= free_mib:
        return True, (f"{count} processes started together: {count} x ({cap_mib:,} MiB cap + {CONTEXT_MIB:,} MiB for "
                      f"a CUDA context) = {need:,} MiB fits in the {free_mib:,.0f} MiB free on this GPU")
    return False, (f"{count} processes one after another: {count} x ({cap_mib:,} MiB cap + {CONTEXT_MIB:,} MiB for a "
                   f"CUDA context) = {need:,} MiB is more than the {free_mib:,.0f} MiB free on this GPU")


def run_in_fresh_processes(fixes=FIXES, cap_mib: int = 4096, timeout_s: float = 120, *, a_mib: int = 40,
                           b_mib: int = 24, alloc_conf: str = "") -> dict[str, FragResult]:
    """Run the pattern once per fix, each in a new Python process with the allocator setting that fix
    needs. Each process caps its own allocator (a fraction of the GPU's memory) and nothing is timed, so where
    the GPU's free memory holds every process with its context (`fit_together`) they start together and their
    start-ups overlap; otherwise one after another (each result's `started` says which). `a_mib`, `b_mib`: the
    two phases' block sizes;
    `alloc_conf`: more allocator settings for every child (e.g. "max_split_size_mb:32"), joined to the fix's
    own (the notebook's exercises 1 and 2).

    The notebook's own kernel and its GPU memory are untouched.
    """
    if not 1 <= b_mib < a_mib:
        raise ValueError(f"need 1 <= b_mib < a_mib (got a_mib={a_mib}, b_mib={b_mib}).")
    fixes = list(fixes)
    bad = [f for f in fixes if f not in FIXES]
    if bad:
        raise ValueError(f"fix must be one of {', '.join(FIXES)} (got {bad[0]!r}).")
    require_cuda(NO_ALLOCATOR)
    env = dict(os.environ)
    env.pop("PYTORCH_ALLOC_CONF", None)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    commands = {}
    for fix in fixes:
        conf = ",".join(filter(None, ["expandable_segments:True" if fix == "expandable_segments" else "", alloc_conf]))
        child_env = dict(env, PYTORCH_CUDA_ALLOC_CONF=conf) if conf else env
        commands[fix] = ([sys.executable, "-m", "gpulab.lessons.l02_memory_fragmentation", "--cap-mib", str(cap_mib),
                          "--fix", fix, "--a-mib", str(a_mib), "--b-mib", str(b_mib)], child_env)
    free = free_memory()
    together, started = fit_together(len(commands), cap_mib, None if free is None else free[0] / MiB)
    if together:
        done = at_once(commands, timeout_s)
    else:                   # every child runs, each alone, even where one fails: they are independent
        done = {}
        for fix, command in commands.items():
            done.update(at_once({fix: command}, timeout_s))
    out = {}
    for fix, proc in done.items():
        if proc.returncode == 2:  # the child refused the settings (e.g. no CUDA GPU)
            raise ValueError(proc.stderr.strip().splitlines()[-1].removeprefix("gpulab.lessons.l02_memory_fragmentation: "))
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise RuntimeError(f"the fragmentation process (fix={fix}) failed: " + " | ".join(tail))
        out[fix] = FragResult(**json.loads(proc.stdout.strip().splitlines()[-1]))
        out[fix].started = started
    return out


def run_in_fresh_process(cap_mib: int = 4096, fix: str = "none", timeout_s: float = 120, **pattern) -> FragResult:
    """One fix in a new process (see `run_in_fresh_processes`; `pattern`: a_mib, b_mib, alloc_conf)."""
    return run_in_fresh_processes([fix], cap_mib, timeout_s, **pattern)[fix]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Run notebook 02's fragmentation pattern once; print JSON.")
    p.add_argument("--cap-mib", type=int, default=4096)
    p.add_argument("--fix", choices=FIXES, default="none")
    p.add_argument("--a-mib", type=int, default=40, help="phase A's block size (MiB)")
    p.add_argument("--b-mib", type=int, default=24, help="phase B's block size (MiB), below A's")
    a = p.parse_args(argv)
    try:
        res = run_pattern(a.cap_mib, a.fix, a_mib=a.a_mib, b_mib=a.b_mib)
    except ValueError as err:
        print(f"gpulab.lessons.l02_memory_fragmentation: {err}", file=sys.stderr)
        return 2
    print(json.dumps(asdict(res)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
