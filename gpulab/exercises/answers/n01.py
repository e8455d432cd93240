"""Reference answers to notebook 01's free-text exercises (measuring GPU time right)."""
from __future__ import annotations

import statistics

import torch

from gpulab.core.device import pick_device, sync
from gpulab.core.memory import memory_guard
from gpulab.core.timing import benchmark, gpu_profile
from gpulab.exercises.answers import Answer, one_thread_on_cpu
from gpulab.lessons.l01_measuring_time import config, events_vs_kernel, kernel_ms_per_call, l2_warm_vs_flushed

BUDGET = {"tiny": 0.02, "full": 0.3}        # benchmark's time budget per timing, seconds


def _where(scale: str, device: torch.device) -> dict:
    return {"device": device.type, "scale": scale}


def _gpu_full(found: dict) -> bool:
    return found["device"] == "cuda" and found["scale"] == "full"


# -- 1. torch.randn: generating against launching -----------------------------------------------------
def _randn(scale: str) -> dict:
    device = pick_device()
    cfg = config(scale)
    out: dict = _where(scale, device)
    sizes = cfg["sizes"]
    with memory_guard(quiet=True):
        for n in sizes:
            make = lambda n=n: torch.randn(n, n, device=device)
            no_sync = benchmark(make, sync=False).median_ms
            sync(device)                                     # the queued fills finish before the next timing
            events = benchmark(make, budget_s=BUDGET[scale]).median_ms
            kernel = kernel_ms_per_call(make, "aten::randn", calls=10)       # its fill kernel: GPU only
            out[f"n={n}: host clock, no sync ms"] = no_sync
            out[f"n={n}: with sync ms"] = events
            out[f"n={n}: fill kernel ms (profiler)"] = "-" if kernel is None else kernel
    small, large = sizes[0], sizes[-1]
    out["smallest n"], out["largest n"] = small, large
    out[f"no sync, n={large} / n={small} (elements: {(large // small) ** 2}x)"] = (
        out[f"n={large}: host clock, no sync ms"] / out[f"n={small}: host clock, no sync ms"])
    return out


def _randn_claim(f: dict) -> str | None:
    small, large = f["smallest n"], f["largest n"]
    grow = next(v for k, v in f.items() if k.startswith(f"no sync, n={large} /"))
    if f["device"] == "cpu":
        # no queue: the host clock waits for the numbers, so it grows with them (64x the elements at tiny)
        return None if grow > 4 else (f"on the CPU the no-sync time grew only {grow:.2g}x from n={small} to "
                                      f"n={large}: it should hold the generation, which grows with n^2")
    if not _gpu_full(f):
        return None
    if grow > 3:
        return f"on the GPU the no-sync time grew {grow:.2g}x with the size: it should stay at the launch cost"
    k_small, k_large = f[f"n={small}: fill kernel ms (profiler)"], f[f"n={large}: fill kernel ms (profiler)"]
    if isinstance(k_large, float) and not k_large > f[f"n={large}: host clock, no sync ms"]:
        return f"at n={large} generating the numbers did not take longer than launching the fill"
    if isinstance(k_small, float) and not k_small < f[f"n={small}: host clock, no sync ms"]:
        return f"at n={small} generating the numbers took longer than launching the fill"
    return None


# -- 2. sync() inside the no-sync function; synchronizing every training step ---------------------------
def _mlp_step(width: int, batch: int, device: torch.device):
    """Section 5's MLP with an SGD update: one training step, no read-back."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(),
                              torch.nn.Linear(width, width)).to(device)
    opt = torch.optim.SGD(mlp.parameters(), lr=1e-3)
    x = torch.randn(batch, width, device=device)

    def step():
        opt.zero_grad(set_to_none=True)
        mlp(x).square().mean().backward()
        opt.step()
    return step


def _sync_inside(scale: str) -> dict:
    device = pick_device()
    cfg = config(scale)
    out: dict = _where(scale, device)
    budget = BUDGET[scale]
    with memory_guard(quiet=True):
        for name, n in (("small", cfg["launch_n"]), ("lesson's", cfg["first_call_n"])):
            a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
            work = lambda: a @ b
            wrong = benchmark(work, sync=False).median_ms
            sync(device)
            fixed = benchmark(lambda: (work(), sync(device)), sync=False).median_ms
            right = benchmark(work, budget_s=budget).median_ms
            out[f"{name} n={n}: no sync ms"] = wrong
            out[f"{name} n={n}: no sync, sync() inside ms"] = fixed
            out[f"{name} n={n}: benchmark (CUDA events on a GPU) ms"] = right
            out[f"{name} n={n}: sync() inside / events"] = fixed / right
            del a, b
        out["lesson's n"] = cfg["first_call_n"]
        # a training loop: steps queued back to back against a synchronize after every step
        for name, width, batch in (("small MLP", cfg["launch_n"], cfg["profile_batch"]),
                                   ("section 5's MLP", cfg["profile_width"], cfg["profile_batch"])):
            step = _mlp_step(width, batch, device)
            free = benchmark(step, calls=10, budget_s=budget).median_ms
            synced = benchmark(lambda: (step(), sync(device)), calls=10, budget_s=budget).median_ms
            out[f"{name} (width {width}): step ms, back to back"] = free
            out[f"{name} (width {width}): step ms, sync every step"] = synced
            out[f"{name}: sync every step / back to back"] = synced / free
            del step
    return out


def _sync_inside_claim(f: dict) -> str | None:
    if not _gpu_full(f):
        return None         # on the CPU sync() is a no-op and every clock already waits: nothing to fix
    n = f["lesson's n"]
    if f[f"lesson's n={n}: benchmark (CUDA events on a GPU) ms"] < 10 * f[f"lesson's n={n}: no sync ms"]:
        return f"without sync the lesson's product (n={n}) did not read far less than the CUDA events"
    ratio = f[f"lesson's n={n}: sync() inside / events"]
    if not 0.9 <= ratio <= 1.25:
        return f"with sync() inside, the host clock read {ratio:.3g}x the CUDA events for the lesson's product"
    for name in ("small MLP", "section 5's MLP"):
        r = f[f"{name}: sync every step / back to back"]
        if not 0.95 <= r <= 2.5:
            return f"{name}: a synchronize every step changed the step time {r:.3g}x, outside 0.95-2.5x"
    return None


# -- 3. repeat=1000: median, maximum, mean -------------------------------------------------------------
def _thousand(scale: str) -> dict:
    device = pick_device()
    n = config(scale)["first_call_n"]
    out: dict = _where(scale, device)
    with memory_guard(quiet=True):
        a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
        work = lambda: a @ b
        hundred = benchmark(work, repeat=100)
        thousand = benchmark(work, repeat=1000)
        del a, b
    s = list(thousand.samples_ms)
    blocks = [s[i:i + 100] for i in range(0, 1000, 100)]       # ten runs of 100 inside the 1000
    medians = [statistics.median(x) for x in blocks]
    maxima = [max(x) for x in blocks]
    med = thousand.median_ms
    trimmed = sorted(s)[:990]                                   # the slowest 1 % left out
    out.update({
        "n": n, "median ms, repeat=100": hundred.median_ms, "median ms, repeat=1000": med,
        "median moved (1000 / 100)": med / hundred.median_ms,
        "max ms, repeat=100": hundred.max_ms, "max ms, repeat=1000": thousand.max_ms,
        "max ms, the first 100 of the 1000": max(blocks[0]),
        "max / median, repeat=100": hundred.max_ms / hundred.median_ms,
        "max / median, repeat=1000": thousand.max_ms / med,
        "IQR % of median, repeat=1000": thousand.spread_pct,
        "mean / median, repeat=1000": statistics.fmean(s) / med,
        "mean without the slowest 1% / median": statistics.fmean(trimmed) / med,
        "ten blocks of 100: range of medians / median": (max(medians) - min(medians)) / med,
        "ten blocks of 100: range of maxima / median": (max(maxima) - min(maxima)) / med,
    })
    return out


def _thousand_claim(f: dict) -> str | None:
    med_range = f["ten blocks of 100: range of medians / median"]
    max_range = f["ten blocks of 100: range of maxima / median"]
    if not med_range < max_range:
        return (f"within the 1000 calls the medians of ten blocks of 100 varied as much as their maxima "
                f"({med_range:.3g} vs {max_range:.3g} of the median)")
    if _gpu_full(f) and not 0.9 <= f["median moved (1000 / 100)"] <= 1.1:
        return f"on the GPU the median moved {f['median moved (1000 / 100)']:.3g}x from 100 to 1000 calls"
    return None


# -- 4. GELU's kernel against the two products in the profile --------------------------------------------
def _profile_rows(step, device: torch.device, steps: int) -> tuple[dict, list[tuple[str, int, float]]]:
    """Profile `steps` calls of `step` as section 5 does; ({operator: (count, us per call)}, the device's
    kernel rows as (name, count, us per call)). The time is device time on a GPU, CPU time on the CPU."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    from gpulab.notebook import lesson
    step()                                              # warm-up outside the profile
    sync(device)
    if device.type == "cuda":
        with gpu_profile(cpu=True, acc_events=True) as prof:
            for _ in range(steps):
                step()
            sync(device)
    else:
        quieted = lesson.quiet_profiler_log()
        try:
            with profile(activities=[ProfilerActivity.CPU], acc_events=True) as prof:
                for _ in range(steps):
                    step()
        finally:
            if quieted:
                import os
                os.environ.pop("KINETO_LOG_LEVEL", None)
    ops, kernels = {}, []
    for row in prof.key_averages():
        if row.device_type == DeviceType.CUDA:
            kernels.append((row.key, row.count, row.self_device_time_total / row.count))
        else:
            total = row.device_time_total if device.type == "cuda" else row.cpu_time_total
            ops[row.key] = (row.count, total / row.count)
    return ops, kernels


def _gelu(scale: str) -> dict:
    device = pick_device()
    cfg = config(scale)
    width, batch, steps = cfg["profile_width"], cfg["profile_batch"], 5
    out: dict = _where(scale, device)
    with memory_guard(quiet=True):
        torch.manual_seed(0)
        mlp = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(),
                                  torch.nn.Linear(width, width)).to(device)
        x = torch.randn(batch, width, device=device)
        ops, kernels = _profile_rows(lambda: mlp(x).square().mean().backward(), device, steps)
        del mlp, x
    unit = "device us" if device.type == "cuda" else "CPU us"
    for op in ("aten::addmm", "aten::gelu", "aten::mm", "aten::gelu_backward"):
        count, us = ops.get(op, (0, 0.0))
        out[f"{op}: calls per step"] = count / steps
        out[f"{op}: {unit} per call"] = us
    gelu_kernels = [k for k in kernels if "gelu" in k[0].lower()]
    out["kernels named *gelu* (forward + backward)"] = len(gelu_kernels)
    for name, count, us in gelu_kernels:
        short = name if len(name) <= 90 else name[:87] + "..."
        out[f"kernel {short}: us per call"] = us
    out["gelu / one forward product"] = (out[f"aten::gelu: {unit} per call"] / out[f"aten::addmm: {unit} per call"]
                                         if out[f"aten::addmm: {unit} per call"] else "-")
    out["bytes GELU reads + writes"] = 2 * batch * width * 4
    out["FLOP of one forward product"] = 2 * batch * width * width
    return out


def _gelu_claim(f: dict) -> str | None:
    if f["aten::addmm: calls per step"] != 2:
        return f"the forward ran {f['aten::addmm: calls per step']:g} products (addmm) per step, not the MLP's two"
    if f["aten::gelu: calls per step"] != 1 or f["aten::gelu_backward: calls per step"] != 1:
        return "GELU did not run once forward and once backward per step"
    if f["device"] == "cuda" and f["kernels named *gelu* (forward + backward)"] < 2:
        return "the profile shows no GELU kernel for the forward and one for the backward"
    if _gpu_full(f) and not f["gelu / one forward product"] < 0.25:
        return f"GELU's kernel took {f['gelu / one forward product']:.3g}x a forward product's, not a small share"
    return None


# -- 5. events against kernel time, growing n -----------------------------------------------------------
SWEEP = {"tiny": [16, 32, 64, 128], "full": [32, 64, 128, 256, 512, 1024, 2048, 4096]}
AGREE = 1.1         # events within 10 % of the kernel time


def _events_sweep(scale: str) -> dict:
    device = pick_device()
    out: dict = _where(scale, device)
    agree = None
    ratios = []
    with memory_guard(quiet=True):
        for n in SWEEP[scale]:
            r = events_vs_kernel(n, calls=50)
            out[f"n={n}: events ms"] = r.events_ms
            out[f"n={n}: kernel ms"] = "-" if r.kernel_ms is None else r.kernel_ms
            out[f"n={n}: events / kernel"] = "-" if r.ratio is None else r.ratio
            if r.ratio is not None:
                ratios.append(r.ratio)
                if agree is None and r.ratio <= AGREE:
                    agree = n
    out["first n where events are within 10% of the kernel"] = (agree if agree is not None else
                                                               "none in the sweep" if ratios else "needs a GPU")
    out["ratios measured"] = len(ratios)
    return out


def _events_sweep_claim(f: dict) -> str | None:
    sizes = SWEEP[f["scale"]]
    if f["device"] != "cuda":
        return None if f["ratios measured"] == 0 else "the profiler's kernel time was read without a GPU"
    if f["ratios measured"] != len(sizes):
        return "the profiler read no kernel time for some sizes"
    if not _gpu_full(f):
        return None
    small, large = f[f"n={sizes[0]}: events / kernel"], f[f"n={sizes[-1]}: events / kernel"]
    if not small > 1.5:
        return f"the n={sizes[0]} product was not launch-bound: events / kernel {small:.3g}"
    if not large <= AGREE:
        return f"at n={sizes[-1]} the events still read {large:.3g}x the kernel time"
    return None


# -- 6. the L2 flush against the tensor's size ----------------------------------------------------------
SHARES = (0.25, 1.0, 4.0)


def _l2_shares(scale: str) -> dict:
    device = pick_device()
    out: dict = _where(scale, device)
    with memory_guard(quiet=True):
        for s in SHARES:
            r = l2_warm_vs_flushed(calls=50, share=s)
            if r is None:
                out[f"share {s:g}"] = "refused: needs a CUDA GPU"
                continue
            out["L2 MiB"] = r.l2_bytes / 2**20
            out[f"share {s:g}: MiB summed"] = r.nbytes / 2**20
            out[f"share {s:g}: bytes as asked"] = r.nbytes == int(r.l2_bytes * s) // 4 * 4
            out[f"share {s:g}: warm us"] = r.warm_ms * 1e3 if r.warm_ms else "-"
            out[f"share {s:g}: flushed us"] = r.flushed_ms * 1e3 if r.flushed_ms else "-"
            out[f"share {s:g}: flushed / warm"] = r.ratio if r.ratio else "-"
    return out


def _l2_shares_claim(f: dict) -> str | None:
    if f["device"] != "cuda":
        refused = all(str(f[f"share {s:g}"]).startswith("refused") for s in SHARES)
        return None if refused else "l2_warm_vs_flushed measured something without a GPU"
    for s in SHARES:
        if not f[f"share {s:g}: bytes as asked"]:
            return f"the tensor at share {s:g} was not that share of L2"
    if not _gpu_full(f):
        return None
    small, big = f["share 0.25: flushed / warm"], f["share 4: flushed / warm"]
    if not (isinstance(small, float) and isinstance(big, float)):
        return "the profiler read no kernel time for a sum"
    if not small > big:
        return f"the flush mattered no more for a quarter of L2 ({small:.3g}x) than for 4x L2 ({big:.3g}x)"
    if not big < 1.3:
        return f"at 4x L2 the flushed sum still took {big:.3g}x the warm one"
    return None


ANSWERS = [
    Answer("01", 1, run=one_thread_on_cpu(_randn), expect=_randn_claim, text=(
        "Time `lambda: torch.randn(n, n, device=device)` with `benchmark(..., sync=False)` and with "
        "`benchmark(...)` over the sweep's sizes (the run also reads the fill kernel's own time under `aten::randn` "
        "from the profiler on a GPU). Without sync, the host clock reads only what it takes to allocate the output "
        "from the caching allocator and queue one fill kernel: the launch cost, flat in n. With sync it reads "
        "the fill itself, which writes 4n^2 bytes of Philox-generated normals and so grows with n^2: at small n "
        "launching costs more than generating, at the sweep's largest n on a GPU generating costs far more. On "
        "the CPU there is no queue: torch.randn returns when the numbers exist, so both clocks grow with n^2 "
        "alike, which the run checks.")),
    Answer("01", 2, run=one_thread_on_cpu(_sync_inside), expect=_sync_inside_claim, text=(
        "Time `benchmark(lambda: (a @ b, sync()), sync=False)`: the host clock now waits for the product, so for "
        "the lesson's product it reads what the CUDA events read plus one synchronize's round trip "
        "(microseconds): right. For a small product it reads launch + kernel + synchronize in series, more than the "
        "events' back-to-back rate, because nothing overlaps any more. That is the cost in a training loop: "
        "a synchronize every step (a `loss.item()`, a print of a tensor) drains the queue, so the host cannot "
        "queue step k+1 while the GPU runs step k, and the host's per-step work (Python, launches, data) adds "
        "to the GPU's instead of hiding under it. The run times a small and section 5's MLP, steps back to back "
        "against a sync after each: the time lost is at most the smaller of the two per-step times, so at most about "
        "2x, and largest where host and GPU take about as long (the graded exercise). On the CPU sync() is a no-op.")),
    Answer("01", 3, run=one_thread_on_cpu(_thousand), expect=_thousand_claim, text=(
        "Run `benchmark(work, repeat=100)` and `benchmark(work, repeat=1000)`. The median barely moves: it is "
        "the middle of the distribution, and 100 samples already pin it within the spread. The maximum tends to "
        "grow with the number of calls (within one run it cannot fall: compare the first 100 of the 1000 with "
        "all of them), because it is the rarest event caught (an OS interrupt, a clock change, another "
        "process, a page fault on the host), so it measures the run's length, not the kernel. The run also "
        "splits the 1000 calls into ten blocks of 100: their medians agree closely, their maxima do not, "
        "which it checks. The timing distribution is skewed to the right, so the mean sits above the median "
        "and a handful of outliers move it (compare the mean with the slowest 1% left out): it mixes the "
        "kernel's cost with how often something interrupted it. Report the median with its IQR.")),
    Answer("01", 4, run=_gelu, expect=_gelu_claim, text=(
        "On a GPU the table sorted by self device time shows GELU as an elementwise kernel whose name holds "
        "`GeluCUDAKernelImpl` (and `GeluBackwardCUDAKernelImpl` in backward), under `aten::gelu` and "
        "`aten::gelu_backward`; the two forward products are the `aten::addmm` rows (backward adds `aten::mm`). "
        "GELU is a small share of a product's time: it reads and writes batch x width floats, a memory-bound "
        "pass, while each product does 2 x batch x width^2 FLOP, so the ratio shrinks about as 1/width. That "
        "makes GELU cheap here but not free: it is a separate round trip through memory, the kind fusion removes "
        "(notebook 12; cuBLASLt can even apply GELU in a product's epilogue). On the CPU the table has no "
        "kernels and its CPU times mix dispatch overhead with the work; the run checks the structure (two "
        "addmm, one GELU each way per step) everywhere and the small share on a GPU at full size.")),
    Answer("01", 5, run=_events_sweep, expect=_events_sweep_claim, text=(
        "Call `events_vs_kernel(n, calls=50)` for n doubling from 32 to 4096 and read `ratio` (events / "
        "kernel). At small n the ratio is well above 1: the host needs longer to issue each product "
        "(Python, dispatch, cuBLAS's launch) than the GPU needs to run it, so it idles between the start mark "
        "and the kernel and the events hold that wait. As 2n^3 FLOP grow past the launch cost, the queue stays "
        "full, the end mark follows each kernel at once and the ratio falls to about 1: the first n with the "
        "ratio within 10% is where this GPU stops being launch-bound for fp32 products (the run prints it). A "
        "faster GPU or a slower host moves that n up. On the CPU there are no kernels: only the events column "
        "(host clock) is read.")),
    Answer("01", 6, run=_l2_shares, expect=_l2_shares_claim, text=(
        "Call `l2_warm_vs_flushed(calls=50, share=s)` for s = 0.25, 1 and 4 and compare `ratio` (flushed / "
        "warm, both the profiler's kernel time). At a quarter of L2 the whole tensor stays in L2 between calls, "
        "so the warm repeat reads at L2's bandwidth and the flushed one at HBM's: the flush matters. At s = 1 "
        "the warm advantage shrinks sharply: a streaming read as large as the cache evicts its own lines before "
        "the next call comes back to them (under LRU-like replacement a cyclic read of the cache's size almost "
        "never hits), and on A100/H100-class GPUs the L2 is two partitions (NVIDIA's whitepapers), so not all of "
        "the nominal `L2_cache_size` serves every SM; "
        "at s = 4 each call's reads have evicted everything the next call needs, so warm and flushed both read "
        "HBM and the ratio is about 1. What remains there is small, e.g. the flush's dirty lines being written "
        "back during the sum. So the flush matters only for operands that fit comfortably in L2; on the CPU "
        "this needs a GPU and the function refuses (returns None), which the run checks.")),
]
