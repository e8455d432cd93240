"""Reference answers to notebook 12's free-text exercises (kernel fusion against the memory floor)."""
from __future__ import annotations


import torch

from gpulab.core.ceilings import ceilings
from gpulab.core.device import pick_device
from gpulab.core.timing import benchmark
from gpulab.exercises.answers import Answer, one_thread_on_cpu
from gpulab.lessons.l00_gpu_ceilings import bandwidth_ceiling, memory_floor_ms
from gpulab.lessons.l12_kernel_fusion import (bytes_moved, check_close, compile_backend, config, fused_operation,
                                              kernels_launched)

TOL = dict(rtol=1e-5, atol=1e-5)      # section 5's tolerance


def _inputs(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    return torch.randn(n, n, device=device), torch.randn(n, n, device=device)


def _where(scale: str, device: torch.device) -> dict:
    return {"device": device.type, "scale": scale}


def _gpu_full(found: dict) -> bool:
    return found["device"] == "cuda" and found["scale"] == "full"


def _floor_ms(n: int) -> float:
    """Section 2's floor: x and y read once, n means written, at the fastest rate notebook 00 saw."""
    rates = {name: c.value for name, c in ceilings().items()}
    rates.setdefault("copy_bandwidth", bandwidth_ceiling().value)
    return memory_floor_ms(2 * n * n * 4, n * 4, rates)[0]


# -- 1. paying back the first call ------------------------------------------------------------------
def _payback(scale: str) -> dict:
    device = pick_device()
    n = config(scale)["n"]
    x, y = _inputs(n, device)
    backend, _ = compile_backend(device)
    torch.compiler.reset()
    compiled = torch.compile(fused_operation, backend=backend)
    first_ms = benchmark(lambda: compiled(x, y), warmup=0, repeat=1, device=device).median_ms
    worst = check_close(compiled(x, y), fused_operation(x, y), **TOL)
    warm_ms = benchmark(lambda: compiled(x, y), device=device).median_ms
    eager_ms = benchmark(lambda: fused_operation(x, y), device=device).median_ms
    torch.compiler.reset()
    saved = eager_ms - warm_ms
    steps = 10_000
    return {**_where(scale, device), "backend": backend, "first call ms": first_ms, "warm call ms": warm_ms,
            "eager call ms": eager_ms, "largest difference": worst,
            "first call / warm call": first_ms / warm_ms,
            "calls to pay back (first - warm) / (eager - warm)": (first_ms - warm_ms) / saved if saved > 0 else "never",
            f"compiling's share of {steps} compiled calls": first_ms / (first_ms + (steps - 1) * warm_ms)}


def _payback_claim(f: dict) -> str | None:
    if f["first call ms"] <= f["warm call ms"]:
        return "the first call was not slower than a warm one: nothing was compiled in it"
    if _gpu_full(f) and f["backend"] == "inductor" and f["calls to pay back (first - warm) / (eager - warm)"] == "never":
        return "on a GPU at full size the compiled chain was not faster than eager, so compiling never pays back"
    return None


# -- 2. a fourth operation ----------------------------------------------------------------------------
def four_operations(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Exercise 2's chain: `* 0.5` before the mean."""
    return ((x + y).relu() * 0.5).mean(dim=1)


def _fourth(scale: str) -> dict:
    device = pick_device()
    n = config(scale)["n"]
    x, y = _inputs(n, device)
    backend, _ = compile_backend(device)
    torch.compiler.reset()
    c3 = torch.compile(fused_operation, backend=backend)
    c4 = torch.compile(four_operations, backend=backend)
    check_close(c3(x, y), fused_operation(x, y), **TOL)
    worst = check_close(c4(x, y), four_operations(x, y), **TOL)
    t = {name: benchmark(lambda fn=fn: fn(x, y), device=device).median_ms
         for name, fn in (("eager 3 ops", fused_operation), ("eager 4 ops", four_operations),
                          ("compiled 3 ops", c3), ("compiled 4 ops", c4))}
    k4 = kernels_launched(lambda: c4(x, y), device)
    torch.compiler.reset()
    sq = n * n * 4
    return {**_where(scale, device), "backend": backend, "largest difference (4 ops)": worst,
            "eager traffic predicted, 4 ops, bytes": bytes_moved(n)["unfused"] + 2 * sq,   # the mul reads and writes n^2
            "fused floor, 4 ops, bytes": bytes_moved(n)["fully fused"],
            **{f"{k} ms": v for k, v in t.items()},
            "eager 4 / 3 ops": t["eager 4 ops"] / t["eager 3 ops"],
            "compiled 4 / 3 ops": t["compiled 4 ops"] / t["compiled 3 ops"],
            "kernels, compiled 4 ops": "-" if k4 is None else len(k4)}


def _fourth_claim(f: dict) -> str | None:
    if f["eager traffic predicted, 4 ops, bytes"] <= f["fused floor, 4 ops, bytes"]:
        return "the unfused prediction is not above the floor"
    if f["device"] == "cuda" and f["backend"] == "inductor" and f["kernels, compiled 4 ops"] != 1:
        return f"inductor launched {f['kernels, compiled 4 ops']} kernels for the four operations, not one"
    if _gpu_full(f) and f["backend"] == "inductor":
        if f["eager 4 / 3 ops"] < 1.1:
            return "eager's time did not grow with its extra pass over n^2 floats"
        if f["compiled 4 / 3 ops"] > 1.15:
            return "the fused kernel slowed down with a fourth operation, though it reads the same bytes"
    return None


# -- 3. mean(dim=0) --------------------------------------------------------------------------------
def _columns(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x + y).relu().mean(dim=0)


def _dim0(scale: str) -> dict:
    device = pick_device()
    n = config(scale)["n"]
    x, y = _inputs(n, device)
    # the column means are the row means of the transposed inputs: same bytes, the other direction
    worst = check_close(_columns(x, y), fused_operation(x.t().contiguous(), y.t().contiguous()), **TOL)
    rows = benchmark(lambda: fused_operation(x, y), device=device).median_ms
    cols = benchmark(lambda: _columns(x, y), device=device).median_ms
    return {**_where(scale, device), "mean(dim=1) ms": rows, "mean(dim=0) ms": cols,
            "dim=0 / dim=1": cols / rows, "largest difference vs transposed rows": worst}


def _dim0_claim(f: dict) -> str | None:
    return None if f["largest difference vs transposed rows"] <= 1e-4 else "the column means differ"


# -- 4. halving n ------------------------------------------------------------------------------------
def _halving(scale: str) -> dict:
    device = pick_device()
    n = config(scale)["n"]
    backend, _ = compile_backend(device)
    torch.compiler.reset()
    compiled = torch.compile(fused_operation, backend=backend)
    out: dict = {**_where(scale, device)}
    sizes = []
    while n >= 64:                        # the panel's smallest n
        x, y = _inputs(n, device)
        ref = fused_operation(x, y)
        check_close(compiled(x, y), ref, **TOL)
        out[f"eager ms, n={n}"] = benchmark(lambda: fused_operation(x, y), device=device).median_ms
        out[f"compiled ms, n={n}"] = benchmark(lambda: compiled(x, y), device=device).median_ms
        sizes.append(n)
        n //= 2
    torch.compiler.reset()
    small, next_up = sizes[-1], sizes[-2]
    ms = [out[f"eager ms, n={small}"], out[f"compiled ms, n={small}"]]
    out.update({"smallest n": small, f"slowest / fastest variant at n={small}": max(ms) / min(ms),
                f"eager n={small} / n={next_up} (bytes: 0.25)": out[f"eager ms, n={small}"] / out[f"eager ms, n={next_up}"]})
    return out


def _halving_claim(f: dict) -> str | None:
    if f["device"] != "cuda":
        return None
    small = f["smallest n"]
    ratio = next(v for k, v in f.items() if k.startswith(f"eager n={small} /"))
    if ratio < 0.5:
        return f"eager's time still fell with the bytes at n={small}: not yet launch-bound"
    if f[f"slowest / fastest variant at n={small}"] > 3:
        return f"the variants still differ by more than 3x at n={small}"
    return None


# -- 5. max-autotune --------------------------------------------------------------------------------
def _autotune(scale: str) -> dict:
    device = pick_device()
    n = config(scale)["n"]
    x, y = _inputs(n, device)
    backend, why = compile_backend(device)
    if backend != "inductor":                  # mode= is inductor's: other backends take no mode
        return {**_where(scale), "backend": backend, "skipped": f"max-autotune is an inductor mode; here {why}"}
    torch.compiler.reset()
    default = torch.compile(fused_operation, backend=backend)
    tuned = torch.compile(fused_operation, backend=backend, mode="max-autotune")
    ref = fused_operation(x, y)
    check_close(default(x, y), ref, **TOL)
    worst = check_close(tuned(x, y), ref, **TOL)
    d = benchmark(lambda: default(x, y), device=device).median_ms
    t = benchmark(lambda: tuned(x, y), device=device).median_ms
    floor = _floor_ms(n)
    torch.compiler.reset()
    return {**_where(scale, device), "backend": backend, "default ms": d, "max-autotune ms": t,
            "default / max-autotune": d / t, "memory floor ms": floor, "default x floor": d / floor,
            "max-autotune x floor": t / floor, "largest difference (max-autotune)": worst}


def _autotune_claim(f: dict) -> str | None:
    if "skipped" in f:
        return None
    if _gpu_full(f) and f["backend"] == "inductor" and f["max-autotune x floor"] < 0.9:
        return "max-autotune came out below the memory floor: notebook 00 undershot this GPU's bandwidth"
    return None


ANSWERS = [
    Answer("12", 1, run=one_thread_on_cpu(_payback), expect=_payback_claim, text=(
        "Time the compiled function's first call alone (`benchmark(..., warmup=0, repeat=1)` after "
        "`torch.compiler.reset()`), then its warm calls and eager's: the calls it takes to pay back are "
        "(first - warm) / (eager - warm), since each warm call saves eager minus warm. The first call traces the "
        "function with TorchDynamo, generates and compiles a kernel (Triton on a GPU, C++ on the CPU), which costs "
        "far more than any warm call; inductor's on-disk cache shortens it on a second run. Over a 10,000-step "
        "training run the compile is a one-off, a small share of the run (printed), so it matters only for short "
        "jobs or for shapes that change and compile again. On the CPU compiling can fail to pay back at all.")),
    Answer("12", 2, run=one_thread_on_cpu(_fourth), expect=_fourth_claim, text=(
        "`* 0.5` is one more elementwise kernel for eager: it reads and writes n^2 floats, so eager's traffic "
        "grows from 6n^2 + n to 8n^2 + n floats, while the fused floor stays 2n^2 + n (x and y read once, n means "
        "written): the constant sits in registers. Check the compiled four-operation chain against eager first, "
        "then time both chains both ways. On a GPU at full size eager's time grows with its extra pass and the "
        "compiled one barely moves: inductor still emits one kernel (section 7's profiler count), so fusion's "
        "advantage grows with every operation you add.")),
    Answer("12", 3, run=one_thread_on_cpu(_dim0), expect=_dim0_claim, text=(
        "`(x + y).relu().mean(dim=0)` moves the same bytes and gives the column means, which equal the row means "
        "of the transposed inputs (the run checks that). Time both directions. Row-major storage makes a row "
        "contiguous, but a GPU reduction over columns can still read coalesced: neighbouring threads take "
        "neighbouring columns, so each step of the loop reads one contiguous row segment. If the two times are "
        "close, the reduction kernel handled both layouts at memory speed; a large gap would show a strided "
        "access pattern. On the CPU caches and vector units decide, and the ratio is only illustrative.")),
    Answer("12", 4, run=one_thread_on_cpu(_halving), expect=_halving_claim, text=(
        "Halve n from the lesson's size down to the panel's 64 and time eager and the compiled chain at each "
        "(each checked first). Each halving quarters the bytes, so while memory sets the time it falls about 4x "
        "per step; below some size it stops falling and every variant converges. What is left is fixed cost per "
        "call: kernel launches (eager launches three, compiled one) plus the host's work to issue them and, for "
        "torch.compile, its guard checks, the launch cost notebook 01 measured. On a GPU the run checks that at "
        "the smallest size eager no longer falls with the bytes and the variants are within 3x of each other.")),
    Answer("12", 5, run=one_thread_on_cpu(_autotune), expect=_autotune_claim, text=(
        "Compile the function twice, once by default and once with `mode=\"max-autotune\"` (it benchmarks "
        "several kernel configurations at compile time and keeps the fastest), check both against eager, and "
        "time them against section 2's memory floor. A kernel that reads x and y once is already near the "
        "floor by default on a GPU, so autotuning has little left to find: compare 'default x floor' with "
        "'max-autotune x floor'. What remains between them and 1.0 is the kernel's own efficiency (tail "
        "effects, the reduction's last step), not bytes. No kernel can go below the floor; the run checks that "
        "on a GPU at full size.")),
]
