"""Reference answers to notebook 00's free-text exercises (this GPU's ceilings)."""
from __future__ import annotations

import math
import time

import torch

from gpulab.core.bands import gpu_class, load_bands
from gpulab.core.device import device_facts, pick_device, sync
from gpulab.core.memory import memory_guard
from gpulab.core.specs import Datasheet, datasheet_for
from gpulab.exercises.answers import Answer, one_thread_on_cpu
from gpulab.lessons.l00_gpu_ceilings import (COPY_SHARE_LOW, config, copy_experiment, matmul_experiment,
                                             stream_experiment, supported_precisions)
from gpulab.lessons.l07_tensor_core_alignment import alignment


def _where(scale: str, device: torch.device) -> dict:
    return {"device": device.type, "scale": scale}


def _gpu_full(found: dict) -> bool:
    return found["device"] == "cuda" and found["scale"] == "full"


# -- 1. n = 4095, 4096 and 4097 in fp16 -----------------------------------------------------------------
def _odd_sizes(scale: str) -> dict:
    device = pick_device()
    n = config(scale)["panel_n"]                     # the panel's default n: 4096 at full size
    # fp16 as the exercise says; the CPU's panel offers fp32 and bf16 only, so bf16 there (also 2 bytes)
    precision = "fp16" if "fp16" in supported_precisions() else "bf16"
    band = load_bands().band(gpu_class(), "07")       # notebook 07's band for n=4096 / n=4095 on this class
    out: dict = {**_where(scale, device), "precision": precision, "n": n,
                 "band low, n / (n - 1) TFLOP/s (notebook 07)": band.low if band and band.applies else "-"}
    with memory_guard(quiet=True):
        runs = {m: matmul_experiment(precision, m) for m in (n - 1, n, n + 1)}      # each checked first
    for m, r in runs.items():
        out[f"n={m}: TFLOP/s"] = r["TFLOP/s"]
        out[f"n={m}: ms"] = r["ms"].median_ms
        out[f"n={m}: row alignment, bytes"] = alignment(m, 2)
    slow = min(runs, key=lambda m: runs[m]["TFLOP/s"])
    out["lowest TFLOP/s at n"] = slow
    out[f"n={n} / lowest, TFLOP/s"] = runs[n]["TFLOP/s"] / runs[slow]["TFLOP/s"]
    out["longest time at n"] = max(runs, key=lambda m: runs[m]["ms"].median_ms)
    return out


def _odd_sizes_claim(f: dict) -> str | None:
    n = f["n"]
    if f[f"n={n}: row alignment, bytes"] < 16:
        return f"a row of n={n} 16-bit elements is not 16-byte aligned"
    odd = [m for m in (n - 1, n + 1) if f[f"n={m}: row alignment, bytes"] >= 16]
    if odd:
        return f"a row of n={odd[0]} 16-bit elements is 16-byte aligned: it is not the misaligned case"
    low = f["band low, n / (n - 1) TFLOP/s (notebook 07)"]
    if not _gpu_full(f) or not isinstance(low, float):
        return None
    for m in (n - 1, n + 1):
        ratio = f[f"n={n}: TFLOP/s"] / f[f"n={m}: TFLOP/s"]
        if ratio < low:
            return (f"n={n} reached only {ratio:.3g}x the TFLOP/s of n={m}, below notebook 07's band ({low:g}x): "
                    "the misaligned size did not leave the fast Tensor Core kernels")
    return None


# -- 2. lowering n until 16-bit stops beating fp32 --------------------------------------------------------
SWEEP = {"tiny": [16, 32, 64, 128], "full": [128, 256, 512, 1024, 2048, 4096, 8192]}
TILE = 128          # a common cuBLAS output tile side, for the arithmetic of how many tiles fill the SMs


def _small_n(scale: str) -> dict:
    device = pick_device()
    half = "bf16" if "bf16" in supported_precisions() else "fp16"      # a T4 or a V100 has no bf16
    sms = device_facts().sm_count
    out: dict = {**_where(scale, device), "16-bit": half, "SMs": sms or "-"}
    ratios = {}
    with memory_guard(quiet=True):
        for n in SWEEP[scale]:
            fp32 = matmul_experiment("fp32", n)["TFLOP/s"]          # fp32 with TF32 off, as the panel's fp32
            h = matmul_experiment(half, n)["TFLOP/s"]
            ratios[n] = h / fp32
            out[f"n={n}: fp32 TFLOP/s"] = fp32
            out[f"n={n}: {half} TFLOP/s"] = h
            out[f"n={n}: {half} / fp32"] = ratios[n]
            out[f"n={n}: {TILE}x{TILE} output tiles"] = math.ceil(n / TILE) ** 2
    big = max(ratios)
    weak = [n for n in ratios if ratios[n] < ratios[big] / 2]
    out[f"largest n where {half} gains less than half its gain at n={big}"] = max(weak) if weak else "none"
    out[f"smallest n whose {TILE}x{TILE} tiles cover every SM"] = (
        next((n for n in ratios if math.ceil(n / TILE) ** 2 >= sms), "none") if sms else "-")
    out["sizes"] = list(ratios)
    return out


def _small_n_claim(f: dict) -> str | None:
    sizes, half = f["sizes"], f["16-bit"]
    small, big = sizes[0], sizes[-1]
    if not f[f"n={small}: fp32 TFLOP/s"] < 0.5 * f[f"n={big}: fp32 TFLOP/s"]:
        return (f"the n={small} product reached more than half the fp32 rate of n={big}: "
                "a small product should leave the device mostly idle")
    if _gpu_full(f) and not f[f"n={small}: {half} / fp32"] < 0.5 * f[f"n={big}: {half} / fp32"]:
        return (f"at n={small} {half} still beat fp32 by more than half its n={big} margin: "
                "the small product should be bound by launch and fill, not by the arithmetic")
    return None


# -- 3. the copy plateau against the datasheet ----------------------------------------------------------
COPY_MIB = {"tiny": [1, 4], "full": None}       # full: the notebook's sweep (config's copy_sweep_mib)


def _plateau(scale: str) -> dict:
    device = pick_device()
    facts = device_facts()
    sizes = COPY_MIB[scale] or config(scale)["copy_sweep_mib"]
    out: dict = {**_where(scale, device), "largest MiB": sizes[-1]}
    with memory_guard(quiet=True):
        for mib in sizes:
            out[f"copy {mib} MiB: GB/s"] = copy_experiment(mib)["GB/s"]        # one launch per copy, checked
        for kind in ("read", "write"):
            r = stream_experiment(kind, sizes[-1])
            out[f"{kind} {sizes[-1]} MiB: GB/s ({r['kernel']})"] = r["GB/s"]
            out[f"{kind} GB/s"] = r["GB/s"]
    sheet = facts.datasheet if not facts.profile else None     # under a profile the datasheet is not this GPU's
    out["datasheet GB/s"] = sheet.mem_gbps if sheet and facts.on_gpu else "-"
    if isinstance(out["datasheet GB/s"], (int, float)):
        plateau = out[f"copy {sizes[-1]} MiB: GB/s"]
        out["copy plateau / datasheet"] = plateau / sheet.mem_gbps
        out["read / datasheet"] = out["read GB/s"] / sheet.mem_gbps
        out["write / datasheet"] = out["write GB/s"] / sheet.mem_gbps
    return out


def _plateau_claim(f: dict) -> str | None:
    if not _gpu_full(f) or "copy plateau / datasheet" not in f:
        return None
    share = f["copy plateau / datasheet"]
    if not COPY_SHARE_LOW <= share < 1.0:            # the notebook's own check's low end (lesson 00)
        return f"the copy plateau was {share:.3g} of the datasheet, outside {COPY_SHARE_LOW:g} to just under 1"
    for kind in ("read", "write"):
        if not f[f"{kind} / datasheet"] < 1.0:
            return f"the {kind} stream reached {f[kind + ' / datasheet']:.3g} of the datasheet: 100% or more"
    copy = f[f"copy {f['largest MiB']} MiB: GB/s"]
    if not max(f["read GB/s"], f["write GB/s"]) >= 0.98 * copy:
        return "neither one-way stream came near the copy's rate: a copy should not beat both of its halves"
    return None


# -- 4. the monitor's busy % while a tiny kernel loops ----------------------------------------------------
SETTLE_S = 1.0          # NVML's utilization covers its last sample period (up to a second): leave it out
GRAPH_KERNELS = 200     # one graph replay: the same tiny kernel this many times back to back
TINY_ELEMENTS = 1024    # the tiny kernel's tensor: notebook 11's tiny ops


def _loop(fn, seconds: float, device: torch.device, every: int) -> int:
    """Call `fn` for `seconds` of host time, synchronizing every `every` calls (the queue stays short)."""
    calls, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        fn()
        calls += 1
        if calls % every == 0:
            sync(device)
    sync(device)
    return calls


def _busy(scale: str) -> dict:
    from gpulab.core.monitor import GpuMonitor
    from gpulab.core.timing import capture_graph, pace
    from gpulab.lessons.l03_input_pipeline import window_mean
    device = pick_device()
    seconds = max(1.5, config(scale)["monitor_seconds"])
    props = torch.cuda.get_device_properties(device)
    # device_facts' SM count: under a MIG-slice profile the slice's, not the whole GPU's
    threads = getattr(props, "max_threads_per_multi_processor", 2048) * device_facts().sm_count
    out: dict = {**_where(scale, device), "seconds per loop": seconds,
                 # at most one thread per element: the most of the GPU's resident threads the kernel can occupy
                 "tiny kernel's share of the GPU's thread slots, %": 100 * TINY_ELEMENTS / threads}
    with memory_guard(quiet=True):
        x = torch.randn(TINY_ELEMENTS, device=device)
        graph, _ = capture_graph(lambda: [x.neg_() for _ in range(GRAPH_KERNELS)], warmup=1)
        loops = {"python loop": (lambda: x.neg_(), 100), "graph replay": (graph.replay, 5)}
        for name, (fn, every) in loops.items():
            with GpuMonitor(interval_s=0.05, pcie=False, device=device) as mon:
                calls = _loop(fn, SETTLE_S + seconds, device, every)
            busy = window_mean(mon.timeline(), SETTLE_S, math.inf) if mon.available else None
            out[f"{name}: NVML busy %"] = busy if busy is not None else f"- ({mon.unsupported.get('busy_pct', mon.status)})"
            p = pace(fn, 2000 if name == "python loop" else 20, device)
            out[f"{name}: profiler busy %"] = 100 * p.share if p else "-"
            out[f"{name}: kernels per second"] = calls * (1 if name == "python loop" else GRAPH_KERNELS) / (SETTLE_S + seconds)
        graph.reset()
        del graph, x
    return out


def _busy_claim(f: dict) -> str | None:
    loop, replay = f["python loop: NVML busy %"], f["graph replay: NVML busy %"]
    if not isinstance(loop, float) or not isinstance(replay, float):
        return None             # NVML's utilization is not readable here (a MIG slice, no NVML): nothing to check
    share = f["tiny kernel's share of the GPU's thread slots, %"]
    if replay < 50:
        return f"tiny kernels replayed back to back read only {replay:.3g}% busy: NVML should count them as busy"
    if replay < 20 * share:
        return f"busy {replay:.3g}% is not far above the {share:.2g}% of the GPU's threads the kernel can use"
    if loop > replay + 10:
        return f"the Python loop, with launch gaps, read busier ({loop:.3g}%) than the gap-free replay ({replay:.3g}%)"
    return None


# -- 5. a neighbour's GPU ---------------------------------------------------------------------------
NEIGHBOURS = ("H200 SXM", "A100 SXM 80GB", "L4", "T4", "GeForce RTX 4090")


def _sheet(model: str) -> Datasheet:
    from gpulab.core.specs import DATASHEETS
    return next(s for s in DATASHEETS if s.model == model)


def _figures(s: Datasheet) -> dict:
    half = s.bf16 or s.fp16
    return {"16-bit TFLOP/s": half, "memory GB/s": s.mem_gbps,
            "16-bit / fp32 (lessons 06, 07)": half / s.fp32,
            "ridge FLOP/byte (lessons 04, 12)": half * 1e12 / (s.mem_gbps * 1e9),
            "missing": {k for k in ("tf32", "bf16", "fp8") if getattr(s, k) is None}}


RATIOS = ("16-bit / fp32 (lessons 06, 07)", "ridge FLOP/byte (lessons 04, 12)")


def compare(a: Datasheet, b: Datasheet) -> dict:
    """How two GPUs' datasheets differ: each figure's factor (larger over smaller), the ratio a lesson's
    speed-up follows that differs most, and the precisions one has and the other lacks."""
    fa, fb = _figures(a), _figures(b)
    factor = {k: max(fa[k], fb[k]) / min(fa[k], fb[k]) for k in fa if k != "missing"}
    most = max(RATIOS, key=lambda k: factor[k])
    return {"factor": factor, "differs most": most, "only one has": sorted(fa["missing"] ^ fb["missing"])}


def _neighbour(scale: str) -> dict:
    facts = device_facts()
    mine = facts.datasheet or datasheet_for("H200")        # on the CPU or a GPU not in the table: the course's H200
    out: dict = {"this GPU (datasheet)": mine.model + ("" if facts.datasheet else " (no datasheet here: the course's)")}
    for model in NEIGHBOURS:
        other = _sheet(model)
        if other.model == mine.model:
            continue
        c = compare(mine, other)
        for k, v in c["factor"].items():
            out[f"vs {other.model}: {k}, factor"] = v
        out[f"vs {other.model}: differs most"] = c["differs most"]
        out[f"vs {other.model}: precisions only one has"] = ", ".join(c["only one has"]) or "none"
    # the claims, from the table whatever this GPU is: a data-centre part against a GeForce card and a T4
    h200, rtx, t4 = _sheet("H200 SXM"), _sheet("GeForce RTX 4090"), _sheet("T4")
    for name, other in (("RTX 4090", rtx), ("T4", t4)):
        c = compare(h200, other)
        out[f"H200 vs {name}: differs most"] = c["differs most"]
        out[f"H200 vs {name}: 16-bit / fp32 factor"] = c["factor"][RATIOS[0]]
        out[f"H200 vs {name}: ridge factor"] = c["factor"][RATIOS[1]]
        out[f"H200 vs {name}: 16-bit TFLOP/s factor"] = c["factor"]["16-bit TFLOP/s"]
        out[f"H200 vs {name}: precisions only one has"] = ", ".join(c["only one has"]) or "none"
    return out


def _neighbour_claim(f: dict) -> str | None:
    if f["H200 vs RTX 4090: differs most"] != RATIOS[0] or f["H200 vs RTX 4090: 16-bit / fp32 factor"] < 3:
        return "between an H200 and an RTX 4090 the 16-bit / fp32 ratio is not what differs most (by 3x or more)"
    if not (f["H200 vs T4: 16-bit / fp32 factor"] < 2 and f["H200 vs T4: ridge factor"] < 1.5):
        return "an H200 and a T4 differ in their speed-up ratios by 2x or more"
    if f["H200 vs T4: 16-bit TFLOP/s factor"] < 10:
        return "an H200 is not 10x a T4's 16-bit rate"
    if "bf16" not in f["H200 vs T4: precisions only one has"] or "tf32" not in f["H200 vs T4: precisions only one has"]:
        return "the table gives a T4 bf16 or TF32"
    return None


ANSWERS = [
    Answer("00", 1, run=one_thread_on_cpu(_odd_sizes), expect=_odd_sizes_claim, text=(
        "Run the panel in fp16 at n = 4095, 4096 and 4097 (the run does the same with `matmul_experiment`; on the "
        "CPU, whose panel has no fp16, in bf16 at the panel's tiny size). 4096 is the fastest per FLOP: a row "
        "of 4096 16-bit elements is a whole number of 16-byte units, which Tensor Core kernels need to load "
        "their tiles, while a row of 4095 or 4097 elements is aligned to 2 bytes only, so cuBLAS falls back to "
        "slower kernels. Both odd sizes are slow, not only the smaller one, and by a wide margin, not a few "
        "percent; 4097 usually takes the longest, with the most work and one more row of tiles. Lesson 07 "
        "measures the same drop. On a GPU at full size the run checks that 4096 beats both odd "
        "sizes by at least the low end of notebook 07's band for this class of GPU; on the CPU it checks only "
        "the alignment arithmetic.")),
    Answer("00", 2, run=one_thread_on_cpu(_small_n), expect=_small_n_claim, text=(
        "Sweep n down from 8192 in fp32 and in 16-bit (bf16, or fp16 where the GPU has no bf16) and divide. At "
        "large n the 16-bit product runs several times faster, near the datasheet's ratio. As n falls the "
        "work per launch shrinks: the output has too few tiles to give every SM one (the run prints when n/128 "
        "squared passes the SM count), and then the time is the launch and the fill, the same in any "
        "precision, so the ratio collapses towards 1. The size where it falls below half its large-size value "
        "is where the matmul stops filling the GPU. On the CPU "
        "the run checks only that the smallest product uses the device far below its large-size rate; the "
        "ratio's collapse is checked on a GPU at full size.")),
    Answer("00", 3, run=one_thread_on_cpu(_plateau), expect=_plateau_claim, text=(
        "Take the large-size copy rate (the 1-2 GiB end of section 4's sweep, bytes read plus written per "
        "second) and divide by the datasheet's memory bandwidth. A healthy GPU reaches most of it but never "
        "all: the datasheet figure is the bus width times the pin rate with every cycle moving data, while "
        "real DRAM also spends cycles refreshing, opening and closing rows, and turning the bus around "
        "between reads and writes, which a copy does all the time. The read-only and the write-only "
        "streams avoid the turnaround, so at least one of them comes closer than the copy. On a GPU at full "
        "size with a datasheet entry the run checks that the copy reaches between 0.6 and just under 1 of "
        "it, that no stream reaches 1, and that a one-way stream is at least as fast as the copy; on the CPU "
        "there is no datasheet and nothing is checked.")),
    Answer("00", 4, run=_busy, expect=_busy_claim, needs="cuda", text=(
        "NVML's busy % (nvidia-smi's GPU-Util) is the share of its sample window in which any kernel was "
        "running, not how much of the GPU the kernels used. A tiny kernel on 1024 elements can occupy only a "
        "sliver of the GPU's threads, yet when such kernels run back to back the monitor reads the GPU busy "
        "most of the time, up to near 100%, while almost every SM is idle. Launched one at a time from Python "
        "it can read lower: between two launches no kernel runs, and busy % counts that time as idle. The run "
        "loops one tiny kernel both ways, from Python and replayed from a CUDA graph (kernels back to back), "
        "under the monitor, and prints NVML's reading beside the profiler's busy share and the most of the "
        "GPU's threads the kernel can occupy. It checks that the replayed loop reads at least 50% busy, many "
        "times the share of threads, and that the Python loop does not read busier than the replay. So busy % "
        "says whether the GPU had work, not whether it was used well: for that, compare achieved FLOP/s or "
        "GB/s with this notebook's ceilings (lesson 03 returns to this).")),
    Answer("00", 5, run=_neighbour, expect=_neighbour_claim, text=(
        "Absolute speeds differ everywhere, but each lesson's headline is a ratio, so what differs between "
        "two GPUs is the lessons whose ratio follows a ratio of the hardware. The 16-bit / fp32 rate sets "
        "lessons 06 and 07 (mixed precision, Tensor Core shapes): a data-centre GPU runs 16-bit many times "
        "faster than fp32, a GeForce card (fp32 accumulation at half rate) only a few times, so those two "
        "lessons differ most between an H200 and an RTX 4090. The ridge point (16-bit FLOP/s over bandwidth) "
        "sets what is memory-bound in lessons 04 and 12. A missing precision changes a lesson outright: a T4 "
        "has no bf16 or TF32, so lesson 06 runs fp16 only, although its datasheet ratios are close to an H200's "
        "(at its power limit it holds well under its datasheet's 16-bit rate in a long product, as notebook 00's "
        "sustained run shows). Lessons "
        "05 and 11 follow the host (the PCIe link, the CPU's launch cost) more than the GPU. The run compares "
        "this GPU's datasheet (the course's H200 where there is none) with a few neighbours and checks the two "
        "pairs above against the table.")),
]
