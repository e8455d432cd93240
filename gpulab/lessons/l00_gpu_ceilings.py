"""Notebook 00's experiments: the ceilings of this device, measured.

- `CONFIG`, `config(scale)`: the lesson's sizes, shared by the notebook and `gpulab bench`.
- `matmul_experiment`: TFLOP/s of an n x n x n matrix product per precision.
- `peak_sweep`, `sustained`: the peak is the best of a sweep over shapes (the ceiling later lessons divide
  by as the fraction of measured peak; MFU divides by the datasheet's), and what the best shape holds when it
  runs for seconds (clock and power from NVML).
- `copy_experiment`: device memory bandwidth of a device-to-device copy.
- `transfer_experiment`: host<->device bandwidth, pageable or pinned host memory.
- `measure_ceilings`: all of them, recorded in the results store.
- `ceilings()`: read back for later lessons (measured here, else the datasheet).
- `headline(scale)`: the fastest 16-bit matmul against fp32, what notebook 00's self-check and
  `gpulab bench` measure.
- `bandwidth_ceiling()`: the copy bandwidth later lessons divide by (notebook 12).

Every experiment checks its result before it is timed.
"""
from __future__ import annotations

import contextlib
from dataclasses import replace
from typing import Iterator
import torch
from gpulab.core.ceilings import Ceiling, ceilings
from gpulab.core.device import DeviceFacts, device_facts, float32_matmul, pick_device, require_cuda, resolve_scale
from gpulab.core.measured import Measured
from gpulab.core.predict import Plan, Work
from gpulab.core.results import ResultsStore, results_store
from gpulab.core.timing import MIN_CALLS, benchmark, capture_graph


# -- knobs ------------------------------------------------------------------------------------------
TITLE = "GPU ceilings"
HEADLINE = "16-bit / fp32 matmul TFLOP/s"      # the metric bands.toml judges
CONFIG = {
    "tiny": dict(
        matmul_n=256,                   # n of the n x n x n products measure_ceilings and the headline time
        small_n=32,                     # a small product for the roofline's low-intensity points
        copy_mib=16,                    # the device copy measure_ceilings records
        copy_sweep_mib=[1, 4, 16],      # buffer sizes of the notebook's copy-bandwidth sweep
        transfer_mib=8,                 # host<->device copies measure_ceilings records (GPU only)
        fallback_copy_mib=64,           # bandwidth_ceiling's own copy when nothing is recorded
        panel_n=128,                    # the matmul panel's default n
        monitor_n=128,                  # bf16 products the GPU monitor watches
        monitor_seconds=0.5,            # how long the monitor's load runs
        # the peak: (m, n, k) shapes `peak_sweep` times in each precision, seconds of timed calls per
        # shape (in at most 200 calls: `benchmark`'s max_repeat), and how long `sustained` keeps the fastest 16-bit shape running back to back
        sweep_shapes=[(64, 64, 64), (128, 128, 128), (256, 256, 256), (256, 128, 256)],
        sweep_budget_s=0.02,
        sustain_seconds=0.2,
    ),
    "full": dict(matmul_n=8192, small_n=256, copy_mib=1024, copy_sweep_mib=[1, 4, 16, 64, 256, 1024, 2048],
                 transfer_mib=256, fallback_copy_mib=1024, panel_n=4096, monitor_n=8192, monitor_seconds=3.0,
                 # squares from 2048 to 16384, and the large rectangles (one side long) where cuBLAS's
                 # tiles fill the GPU best; each timed in every precision
                 sweep_shapes=[(n, n, n) for n in (2048, 3072, 4096, 6144, 8192, 12288, 16384)]
                 + [(16384, 16384, 4096), (16384, 4096, 16384), (4096, 16384, 16384), (8192, 8192, 16384)],
                 sweep_budget_s=0.15, sustain_seconds=3.0),
}


def config(scale: str | None = None) -> dict:
    """This lesson's knobs at a scale ('tiny' or 'full'; default: the course's, `GPULAB_SCALE`)."""
    return dict(CONFIG[resolve_scale(scale)])


def plan(scale: str | None = None) -> Plan:
    """What notebook 00 asks of the GPU at `scale` (gpulab.core.predict): its n x n products in every
    precision, the device copies and the four host<->device copies, each a fixed number of calls."""
    cfg = config(scale)
    calls = MIN_CALLS       # benchmark()'s least; the rest of its budget is host time
    big = 2 * cfg["matmul_n"] ** 3                 # FLOPs of one product at matmul_n
    # measure_ceilings times every precision once; the self-check (headline) fp32 and the 16-bit ones again
    fp32 = 2 * calls * big
    tf32 = calls * big
    fp16 = 2 * calls * big
    bf16 = 2 * calls * big                        # a T4 or V100 runs no bf16: counted anyway, to be safe
    panel = calls * 2 * cfg["panel_n"] ** 3       # the panel's default run (the last precision, bf16 or fp16)
    monitor = 20 * 2 * cfg["monitor_n"] ** 3      # the monitor's load runs for monitor_seconds (host time)
    #                                               but at least once: 20 bf16 products
    # (the roofline's small_n products are far below 1 % of this)
    # device copies (copy_experiment): randn writes the buffer, one checked copy (read + write), torch.equal
    # reads both, then `calls` timed copies: 1 + 2 + 2 + 2 * calls buffers of traffic per size
    copy_mib = cfg["copy_mib"] + sum(cfg["copy_sweep_mib"])       # measure_ceilings' copy + the sweep
    # the sweep again launch-free: one checked copy, then `calls` replays of GRAPH_MIB worth of copies
    graph_mib = sum(5 * m + 2 * calls * max(1, GRAPH_MIB // m) * m for m in cfg["copy_sweep_mib"])
    copied = ((5 + 2 * calls) * copy_mib + graph_mib) * 2**20
    # host<->device copies (transfer_experiment, 4 kinds): one checked copy + `calls` timed at that kind's
    # ceiling, and the check reads the GPU buffer back (gpu.cpu(): device->host, pageable)
    t = cfg["transfer_mib"] * 2**20
    work = [
        Work("matmul_fp32", fp32, 1.0, f"fp32 products n={cfg['matmul_n']}: measure_ceilings + self-check"),
        # a GPU without TF32 (T4, V100) skips these; predict counts them at its fp32 rate there, to be safe
        Work("matmul_tf32", tf32, 1.0, f"tf32 products n={cfg['matmul_n']}: measure_ceilings"),
        Work("matmul_fp16", fp16, 1.0, f"fp16 products n={cfg['matmul_n']}: measure_ceilings + self-check"),
        Work("matmul_bf16", bf16, 1.0, f"bf16 products n={cfg['matmul_n']}: measure_ceilings + self-check"),
        Work("matmul_bf16", panel, 0.9, f"matmul panel's default run, n={cfg['panel_n']}"),
        Work("matmul_bf16", monitor, 1.0, f"GPU monitor's load, 20 bf16 products n={cfg['monitor_n']}"),
        Work("copy_bandwidth", copied, 0.9, f"device copies, {copy_mib} MiB of buffers"),
        Work("h2d_pageable", (1 + calls) * t, 1.0, "host->device pageable copies"),
        Work("h2d_pinned", (1 + calls) * t, 1.0, "host->device pinned copies"),
        Work("d2h_pageable", (1 + calls) * t + 4 * t, 1.0, "device->host pageable copies + 4 checks"),
        Work("d2h_pinned", (1 + calls) * t, 1.0, "device->host pinned copies"),
    ]
    # host_s: see host_source; tiny runs the same formulas, with the full run's host time (tiny runs on
    # the CPU, where nothing is predicted: its plan is only for completeness)
    # the peak sweep (added after the reference run): every shape, in each of the 4 precisions, at least
    # `calls` products; its time budgets, the sustained run and the read/write streams' budgets are host time
    sweep = sum(2 * m * n * k for m, n, k in cfg["sweep_shapes"]) * calls
    work += [Work(f"matmul_{p}", sweep, 0.9, f"{p} peak sweep, {len(cfg['sweep_shapes'])} shapes")
             for p in ("fp32", "tf32", "fp16", "bf16")]
    work.append(Work("copy_bandwidth", 2 * 2 * calls * cfg["copy_mib"] * 2**20, 0.9, "read and write streams"))
    sweep_host = 4 * len(cfg["sweep_shapes"]) * cfg["sweep_budget_s"] + cfg["sustain_seconds"] + 4 * 0.5
    return Plan(host_s=19.5 + sweep_host, work=work,
                host_source="wall time of notebook 00 in results/course/2026-11-30-h200-00-to-09-at-775ae4a/h200-2026-11-30-course-timings.tsv "
                            "(H200, torch 2.11, 2026-11-30) minus its GPU work at that run's ceilings, plus the "
                            "peak sweep's and streams' timing budgets and the sustained run (added since)")


# precision -> (dtype, fp32 matmul mode or None)
PRECISIONS: dict[str, tuple[torch.dtype, str | None]] = {
    "fp32": (torch.float32, "ieee"),   # plain fp32 on CUDA cores, TF32 off
    "tf32": (torch.float32, "tf32"),   # fp32 tensors, TF32 Tensor Core math
    "fp16": (torch.float16, None),
    "bf16": (torch.bfloat16, None),
}


# Largest accepted ||C - C_ref|| / ||C_ref|| against a float64 reference, per precision
# (fp32 lands far below 1e-5; tf32 keeps 10 mantissa bits, ~5e-4; fp16 ~5e-4; bf16 ~4e-3).
TOLERANCE = {"fp32": 1e-5, "tf32": 5e-3, "fp16": 5e-3, "bf16": 2e-2}


def supported_precisions(facts: DeviceFacts | None = None) -> list[str]:
    """Precisions worth measuring here: TF32 and BF16 need Ampere or newer."""
    facts = facts or device_facts()
    if facts.kind != "cuda":
        return ["fp32", "bf16"]
    out = ["fp32"]
    if facts.tf32:
        out.append("tf32")
    out.append("fp16")
    if facts.bf16:
        out.append("bf16")
    return out


@contextlib.contextmanager
def _precision(precision: str) -> Iterator[torch.dtype]:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)} (got {precision!r}).")
    dtype, mode = PRECISIONS[precision]
    if mode is None:
        yield dtype
    else:
        with float32_matmul(mode):
            yield dtype


def matmul_error(precision: str, n: int = 512, seed: int = 0) -> float:
    """Relative error of an n x n product in `precision` against float64 on the CPU."""
    device = pick_device()
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=g, dtype=torch.float64)
    b = torch.randn(n, n, generator=g, dtype=torch.float64)
    with _precision(precision) as dtype:
        c = (a.to(device, dtype) @ b.to(device, dtype)).double().cpu()
    ref = a @ b
    return float(torch.linalg.norm(c - ref) / torch.linalg.norm(ref))


def matmul_experiment(precision: str = "bf16", n: int = 4096) -> dict:
    """Time C = A @ B (n x n) in one precision: {'TFLOP/s', 'ms', 'rel. error'}.

    2 n^3 floating-point operations; random inputs (never zeros, which run faster).
    The result is checked against float64 first; a wrong result raises.
    """
    if n < 16 or n > 65536:
        raise ValueError(f"n must be between 16 and 65536 (got {n}).")
    device = pick_device()
    with _precision(precision) as dtype:
        err = matmul_error(precision, n=min(n, 512))
        if not err <= TOLERANCE[precision]:
            raise AssertionError(f"{precision} matmul is wrong: relative error {err:.2e} "
                                 f"> {TOLERANCE[precision]:.0e}")
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        t = benchmark(lambda: a @ b)
        del a, b
    flops = 2 * n**3
    return {"TFLOP/s": t.per_second(flops) / 1e12, "ms": t, "rel. error": err}


def shape_tflops(precision: str, m: int, n: int, k: int, budget_s: float = 0.15) -> float:
    """TFLOP/s of one (m x k) @ (k x n) product in `precision` (2 m n k FLOPs over its median time;
    random inputs, the output written in place so no allocation is timed)."""
    device = pick_device()
    with _precision(precision) as dtype:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        c = torch.empty(m, n, device=device, dtype=dtype)
        t = benchmark(lambda: torch.mm(a, b, out=c), budget_s=budget_s)
        del a, b, c
    return t.per_second(2 * m * n * k) / 1e12


def peak_sweep(precision: str, shapes, budget_s: float = 0.15) -> dict:
    """The most this GPU's matrix products reach in `precision`: each (m, n, k) of `shapes` timed
    (`shape_tflops`), checked against float64 first. Returns {"best": TFLOP/s, "shape": (m, n, k),
    "rows": [((m, n, k), TFLOP/s), ...]}. One n x n x n product is not the peak: tile and wave
    quantization make some shapes faster than others, so the sweep keeps the best."""
    err = matmul_error(precision, n=512)
    if not err <= TOLERANCE[precision]:
        raise AssertionError(f"{precision} matmul is wrong: relative error {err:.2e} > {TOLERANCE[precision]:.0e}")
    rows = [(tuple(s), shape_tflops(precision, *s, budget_s=budget_s)) for s in shapes]
    shape, best = max(rows, key=lambda r: r[1])
    return {"best": best, "shape": shape, "rows": rows, "rel. error": err}


def sustained(precision: str, shape, seconds: float = 3.0) -> dict:
    """The same product run back to back for about `seconds`, in batches of ~50 ms timed with CUDA
    events (`benchmark`, no gap between batches), while NVML samples the SM clock and board power:
    {"TFLOP/s": median over the batches, "first": the first batch's, "sm_clock_mhz", "power_w" (means
    over the run; None without NVML)}. Held for seconds, the GPU draws more power and heats up, and the driver
    may lower the clock to stay within its limits, and the rate with it."""
    from gpulab.core.monitor import GpuMonitor
    m, n, k = shape
    device = pick_device()
    with _precision(precision) as dtype:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        c = torch.empty(m, n, device=device, dtype=dtype)
        one = benchmark(lambda: torch.mm(a, b, out=c), repeat=3, warmup=1).median_ms
        calls = max(1, int(50 / max(one, 1e-3)))
        batch = lambda: [torch.mm(a, b, out=c) for _ in range(calls)]  # noqa: E731
        with GpuMonitor(interval_s=0.1, pcie=False, device=device) as mon:
            t = benchmark(batch, warmup=0, repeat=max(3, int(seconds * 1e3 / (calls * one))))
        del a, b, c
    flops = 2 * m * n * k * calls
    return {"TFLOP/s": t.per_second(flops) / 1e12, "first": flops / (t.samples_ms[0] / 1e3) / 1e12,
            "sm_clock_mhz": mon.mean("sm_clock_mhz") if mon.available else None,
            "power_w": mon.mean("power_w") if mon.available else None, "seconds": sum(t.samples_ms) / 1e3}


# The launch-free copy replays this many MiB of copies per CUDA graph (at least one copy): enough copies
# that the graph's own launch is a small part of the sample, few enough that a sample stays milliseconds.
GRAPH_MIB = 256


def copy_experiment(mib: int = 1024, launch_free: bool = False) -> dict:
    """Device memory bandwidth from dst.copy_(src) of `mib` MiB: bytes read + written per second.

    Each copy is one kernel launch timed on its own event pair: a small copy then measures the launch and
    the GPU's fill as much as the memory. `launch_free=True` (on a GPU, for a copy of at most GRAPH_MIB / 2:
    a larger one is timed one launch per copy) captures GRAPH_MIB worth of copies in one CUDA graph and replays it, so the copies run back to back without the host between them: the memory
    system alone (a buffer pair that fits in the L2 cache is then read from there). On the CPU there is no
    graph and both ways are the same. Returns {"GB/s", "ms" (the Timing of one sample: one copy, or one replay of
    `copies` copies), "per_copy_ms", "copies" (per timed sample), "how"}."""
    if mib < 1:
        raise ValueError(f"mib must be >= 1 (got {mib}).")
    device = pick_device()
    n = mib * 2**20 // 4
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    if not torch.equal(dst, src):
        raise AssertionError("device copy produced different data")
    copies, how, graph = 1, "one launch per copy", None
    if launch_free and device.type != "cuda":
        how = "one launch per copy (no CUDA graph on this device)"
    elif launch_free and GRAPH_MIB // mib < 2:
        # a graph of one copy saves one launch per sample, a small part of a copy this large; and a single
        # large copy captured in a graph can take a slower path (on the H200, 2026-12-02, 1 GiB replayed from
        # a graph: 2.76 TB/s against 4.25 launched alone; pytorch/pytorch#191284)
        how = "one launch per copy (at this size one launch is a small part of the copy)"
    elif launch_free:
        many = GRAPH_MIB // mib
        try:
            graph, _ = capture_graph(lambda: [dst.copy_(src) for _ in range(many)], warmup=1)
            dst.zero_()
            graph.replay()                   # the replayed copies are checked too: from zeros, they must give src
            if not torch.equal(dst, src):
                raise AssertionError("the copies replayed from the CUDA graph produced different data")
            copies, how = many, f"{many} copies replayed from one CUDA graph"
        except RuntimeError as err:          # a driver or emulation that refuses the capture: say so, time per launch
            torch.cuda.synchronize()
            how = f"one launch per copy (the CUDA graph capture failed: {str(err)[:120]})"
    t = benchmark(graph.replay if graph is not None else (lambda: dst.copy_(src)))
    if graph is not None:
        graph.reset()
    del src, dst
    per_copy_ms = t.median_ms / copies
    return {"GB/s": 2 * n * 4 / (per_copy_ms / 1e3) / 1e9, "ms": t, "per_copy_ms": per_copy_ms,
            "copies": copies, "how": how}


def stream_experiment(kind: str = "read", mib: int = 1024) -> dict:
    """Device memory bandwidth of a one-way stream of `mib` MiB: "read" (a full reduction, the faster of
    sum and amax, reads every byte once and writes one number) or "write" (the faster of fill_ and
    zero_, writes every byte once and reads none): {"GB/s", "ms", "kernel"}. A copy mixes both; a
    kernel that mostly reads (lesson 12's fused reduction) can beat the copy's rate."""
    if kind not in ("read", "write"):
        raise ValueError(f"kind must be 'read' or 'write' (got {kind!r}).")
    if mib < 1:
        raise ValueError(f"mib must be >= 1 (got {mib}).")
    device = pick_device()
    n = mib * 2**20 // 4
    x = torch.randn(n, device=device)
    if kind == "read":
        if not torch.isclose(x.sum(), x.double().sum().float(), rtol=1e-3, atol=1.0):
            raise AssertionError("the reduction disagrees with a float64 sum")
        kernels = {"sum": lambda: x.sum(), "amax": lambda: x.amax()}
    else:
        x.fill_(1.0)
        if not bool((x == 1.0).all()):
            raise AssertionError("fill_ left other values behind")
        kernels = {"fill_": lambda: x.fill_(1.0), "zero_": lambda: x.zero_()}
    times = {name: benchmark(fn) for name, fn in kernels.items()}
    best = min(times, key=lambda k: times[k].median_ms)
    del x
    return {"GB/s": times[best].per_second(n * 4) / 1e9, "ms": times[best], "kernel": best}


def memory_floor_ms(read_bytes: float, write_bytes: float, rates: dict[str, float]) -> tuple[float, str]:
    """The least time any kernel can take to read `read_bytes` and write `write_bytes` of device memory:
    all the bytes at the fastest rate notebook 00 saw the memory move in any stream (`rates`: GB/s by
    ceiling name; read-only, write-only and copy). Not bytes over the read rate: on the H200
    (results/course/2026-11-30-h200-mamf-and-notebooks/h200-2026-11-30-s4.json) torch.compile's fused reduction read faster than the `sum` kernel
    that measured it, so only the fastest rate seen bounds every kernel. Without the read and write
    streams, the copy rate alone (then not a strict floor: a kernel that mostly reads can beat a copy).
    Returns (ms, how it was derived). Notebook 12."""
    read, write, copy = (rates.get(k) for k in ("read_bandwidth", "write_bandwidth", "copy_bandwidth"))
    if read and write:
        fastest = max(v for v in (read, write, copy) if v)
        which = {read: "read", write: "write", copy: "copy"}[fastest]
        return ((read_bytes + write_bytes) / fastest / 1e9 * 1e3,
                f"all bytes at the fastest stream measured: {which} {fastest:,.0f} GB/s "
                f"(read {read:,.0f}, write {write:,.0f}, copy {copy or 0:,.0f})")
    if copy:
        return ((read_bytes + write_bytes) / copy / 1e9 * 1e3,
                f"copy bandwidth {copy:,.0f} GB/s only (no read/write streams measured): not a strict floor")
    raise ValueError("no bandwidth measured or known: run notebook 00")


def transfer_experiment(direction: str = "h2d", pinned: bool = True, mib: int = 256) -> dict:
    """Host<->device copy bandwidth (GB/s) of `mib` MiB, from pageable or pinned host memory.

    Pinned (page-locked) memory lets the GPU's copy engine read host memory
    directly; pageable memory is first staged through a pinned driver buffer.

    Which clock (the rule of notebook 01, section 6, as notebook 05's `transfer_bandwidth` times it): a pinned
    copy is the copy engine's work alone, timed on CUDA events. From pageable memory the CPU copies the data
    between the pageable buffer and the driver's staging buffer (device->host, that copy out of the staging
    buffer is done after the GPU's part, and the call returns only then: CUDA's "API synchronization
    behavior"). Events would bracket that CPU part too (the end mark is queued only after the call returns),
    but they miss CPU work that overlaps GPU work queued before it (notebook 05, section 5); so anything the
    CPU takes part in is timed on the host clock between two synchronizations (`benchmark(..., clock="host")`).
    The Timing's `method` says which.
    """
    if direction not in ("h2d", "d2h"):
        raise ValueError(f"direction must be 'h2d' or 'd2h' (got {direction!r}).")
    device = require_cuda("host<->device copies cross a bus the CPU does not have.")
    clock = "auto" if pinned else "host"          # events for the copy engine's work, the host clock for the CPU's
    n = mib * 2**20 // 4
    host = torch.randn(n)
    if pinned:
        host = host.pin_memory()
    gpu = torch.empty(n, device=device)
    if direction == "h2d":
        gpu.copy_(host)
        ok = torch.equal(gpu.cpu(), host)
        t = benchmark(lambda: gpu.copy_(host, non_blocking=pinned), device=device, clock=clock)
    else:
        gpu.normal_()
        host.copy_(gpu)
        ok = torch.equal(gpu.cpu(), host)
        t = benchmark(lambda: host.copy_(gpu, non_blocking=pinned), device=device, clock=clock)
    if not ok:
        raise AssertionError(f"{direction} copy produced different data")
    del host, gpu
    return {"GB/s": t.per_second(n * 4) / 1e9, "ms": t}


def measure_ceilings(store: ResultsStore | None = None, sizes: dict | None = None,
                     progress=print, scale: str | None = None) -> dict[str, float]:
    """Measure every ceiling this device has and record each in the results store.

    Sizes come from `config(scale)`; `sizes` may override "n", "copy_mib" and "transfer_mib".
    """
    store = store or results_store()
    sizes = sizes or {}
    cfg = config(scale)
    n = sizes.get("n", cfg["matmul_n"])
    copy_mib = sizes.get("copy_mib", cfg["copy_mib"])
    transfer_mib = sizes.get("transfer_mib", cfg["transfer_mib"])
    found: dict[str, float] = {}
    shapes = sizes.get("sweep_shapes", cfg["sweep_shapes"])
    for p in supported_precisions():
        r = matmul_experiment(p, n)
        found[f"matmul_{p}_n{n}"] = r["TFLOP/s"]
        store.record("00", f"matmul_{p}_n{n}", r["TFLOP/s"], "TFLOP/s", n=n,
                     median_ms=r["ms"].median_ms, rel_error=r["rel. error"])
        sweep = peak_sweep(p, shapes, cfg["sweep_budget_s"])
        found[f"matmul_{p}"] = max(sweep["best"], r["TFLOP/s"])
        store.record("00", f"matmul_{p}", found[f"matmul_{p}"], "TFLOP/s", shape=list(sweep["shape"]),
                     shapes=len(shapes), rel_error=sweep["rel. error"])
        progress(f"matmul {p:>4} n={n}: {r['TFLOP/s']:8.2f} TFLOP/s; best of {len(shapes)} shapes: "
                 f"{sweep['best']:8.2f} TFLOP/s at {sweep['shape']}")
    r = copy_experiment(copy_mib)
    found["copy_bandwidth"] = r["GB/s"]
    store.record("00", "copy_bandwidth", r["GB/s"], "GB/s", mib=copy_mib, median_ms=r["ms"].median_ms)
    progress(f"device copy {copy_mib} MiB: {r['GB/s']:8.1f} GB/s  ({r['ms']})")
    for kind in ("read", "write"):
        r = stream_experiment(kind, copy_mib)
        found[f"{kind}_bandwidth"] = r["GB/s"]
        store.record("00", f"{kind}_bandwidth", r["GB/s"], "GB/s", mib=copy_mib, kernel=r["kernel"],
                     median_ms=r["ms"].median_ms)
        progress(f"device {kind} {copy_mib} MiB: {r['GB/s']:8.1f} GB/s  ({r['kernel']}: {r['ms']})")
    if pick_device().type == "cuda":
        for direction in ("h2d", "d2h"):
            for pinned in (False, True):
                name = f"{direction}_{'pinned' if pinned else 'pageable'}"
                r = transfer_experiment(direction, pinned, transfer_mib)
                found[name] = r["GB/s"]
                store.record("00", name, r["GB/s"], "GB/s", mib=transfer_mib,
                             median_ms=r["ms"].median_ms, clock=r["ms"].method)
                progress(f"{name:>12} {transfer_mib} MiB: {r['GB/s']:8.1f} GB/s  ({r['ms']})")
    return found


# -- the headline -------------------------------------------------------------------------------
def headline(scale: str | None = None) -> Measured:
    """The fastest 16-bit matmul against fp32 at `matmul_n` (`matmul_experiment`, each checked first)."""
    n = config(scale)["matmul_n"]
    halves = [p for p in supported_precisions() if p in ("fp16", "bf16")]
    fp32 = matmul_experiment("fp32", n)            # each checked against float64 before it is timed
    runs = {p: matmul_experiment(p, n) for p in halves}
    best = max(runs, key=lambda p: runs[p]["TFLOP/s"])
    errors = ", ".join(f"{p} {r['rel. error']:.1e}" for p, r in {"fp32": fp32, **runs}.items())
    return Measured(fp32["TFLOP/s"], runs[best]["TFLOP/s"], "TFLOP/s", runs[best]["TFLOP/s"] / fp32["TFLOP/s"],
                    True, f"relative error against float64: {errors}", f"fp32, n={n}", f"{best}, n={n}")


# A measured 16-bit / fp32 ratio keeps at least 3/4 of the datasheet's: on the H200 it measured 13.1-13.6
# against the datasheet's 989 / 67 = 14.8 (88-92 %; results/course/2026-11-29-h200-*/); a power-capped or
# shared card keeps less of its 16-bit rate than of its fp32 rate.
DATASHEET_RATIO_KEPT = 0.75


def datasheet_ratio(name: str, bf16: bool = True) -> float | None:
    """The datasheet's 16-bit (bf16 where the GPU has it, else fp16, fp32 accumulation) over fp32 rate for
    the GPU called `name` (gpulab.core.specs), or None for a GPU not in the table."""
    from gpulab.core.specs import datasheet_for
    sheet = datasheet_for(name)
    return None if sheet is None else sheet.half_ratio(bf16)


def least_ratio(name: str, bf16: bool = True) -> float | None:
    """The least 16-bit / fp32 ratio a healthy GPU called `name` shows, from its datasheet's rates
    (`Datasheet.half_ratio_range`): the datasheet's ratio, or on a power-capped board (a T4, an L4) its sustained
    16-bit rate over its full fp32 rate; None for a GPU not in the table."""
    from gpulab.core.specs import datasheet_for
    sheet = datasheet_for(name)
    found = None if sheet is None else sheet.half_ratio_range(bf16)
    return None if found is None else found[0]


# The least share of its datasheet's 16-bit peak a healthy GPU's best product reaches: half on a board with
# the power to hold its clocks (the H200 reached 759 of 989, results/*/2026-11-30-h200-*/), a quarter on a
# power-capped one (gpulab.core.specs.POWER_CAPPED_W: a 70 W T4's clocks drop to its power limit under a
# long product, which is where a healthy T4 runs, not a fault: it held about 24 of 65 TFLOP/s there,
# specs.POWER_CAPPED_HALF_SHARE, 0.37; a quarter leaves a third of that for a shared or warm card).
DATASHEET_SHARE_LOW = 0.5
DATASHEET_SHARE_LOW_POWER_CAPPED = 0.25


# The least share of its datasheet's memory bandwidth a healthy GPU's large device copy reaches (notebook 00's
# "copy bandwidth / datasheet" check, and its exercise 3's reference answer). The datasheet's figure is the bus width
# times the pin rate with every cycle moving data; a copy also pays DRAM refresh, row switches and the turnaround
# between reads and writes. The H200 reached 4,186-4,257 of 4,800 GB/s (0.87-0.89; copy_bandwidth in every full-size
# run under results/course/); 0.6 leaves room for boards whose memory controllers keep less, and still fails a copy
# sharing the GPU with another process's or a datasheet row for another variant of the card. A judgement.
COPY_SHARE_LOW = 0.6


def datasheet_share_low(sheet) -> tuple[float, str]:
    """The least measured / datasheet 16-bit rate notebook 00 accepts for the GPU of datasheet `sheet`, and why."""
    if sheet.power_capped:
        return DATASHEET_SHARE_LOW_POWER_CAPPED, (f"a {sheet.board_w:g} W board cannot hold the boost clock "
                                                  "the datasheet's peak assumes")
    return DATASHEET_SHARE_LOW, "a board with the power to hold its clocks"


def band_floor(scale: str | None = None) -> tuple[float, str]:
    """The headline's least ratio on this GPU: DATASHEET_RATIO_KEPT of the least ratio its own datasheet allows
    (`least_ratio`: an A10, whose datasheet ratio is 4.0, is not held to a band set for 8-16x parts, nor a T4 at
    its power limit to its datasheet's 8x); +inf (no change) for a GPU not in the table. `lesson.expect_band` and
    `gpulab bench` lower the class's low end to it."""
    facts = device_facts()
    ratio = least_ratio(facts.name, facts.bf16)
    if ratio is None:
        return float("inf"), "this GPU is not in gpulab.core.specs"
    sheet_ratio = datasheet_ratio(facts.name, facts.bf16)
    what = ("datasheet ratio" if abs(ratio - sheet_ratio) < 1e-9
            else f"ratio at its power limit (datasheet {sheet_ratio:.3g})")
    return DATASHEET_RATIO_KEPT * ratio, (f"{DATASHEET_RATIO_KEPT:g} of this GPU's {what} {ratio:.3g} "
                                          "(gpulab.core.specs)")


def bandwidth_ceiling(store: ResultsStore | None = None, scale: str | None = None) -> Ceiling:
    """Device-memory bandwidth (GB/s, read + write counted) for the floor. Notebook 12.

    Notebook 00's copy measurement for this device if recorded; else the datasheet figure
    `ceilings()` falls back to (its source says "datasheet"); else, with neither (a CPU, or a
    GPU not in gpulab's table), one copy of `fallback_copy_mib` (`config(scale)`) measured now and
    labelled so; it is not recorded.
    """
    found = ceilings(store).get("copy_bandwidth")
    if found is not None and found.source.startswith("datasheet"):
        return replace(found, source=f"notebook 00 has not measured this device; {found.source}")
    if found is not None:
        return found
    mib = config(scale)["fallback_copy_mib"]
    r = copy_experiment(mib)
    return Ceiling("copy_bandwidth", r["GB/s"], "GB/s",
                   f"measured just now ({mib} MiB copy, not recorded): run notebook 00 to record it")
