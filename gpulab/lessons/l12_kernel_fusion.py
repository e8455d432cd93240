"""Lesson 12, kernel fusion against the memory floor: its knobs, helpers and headline measurement.

Notebook 12 (`notebooks/12_kernel_fusion.ipynb`) and `gpulab bench` share what is here: the size
(`CONFIG`, `config(scale)`), and `headline(scale)`, the seed's `(x + y).relu().mean(dim=1)` eager
against `torch.compile`, the compiled result checked against eager before either is timed.

- `fused_operation(x, y)`: the seed article's function, the one every variant runs.
- `bytes_moved(n)`: the bytes `(x + y).relu().mean(dim=1)` on n x n fp32 must read and write,
  unfused (eager PyTorch), with add and relu fused, and fully fused (the floor).
- `compile_backend()`: which torch.compile backend the lesson uses here, and why.
- `check_close(out, ref)`: correct before fast; the largest difference, or AssertionError.
- `kernels_launched(fn)`: the GPU kernels one call launches (torch.profiler); None on the CPU.
- `plan_from_kernels(kernels, assumed)`: which of the plans above those kernels follow.

The bandwidth to divide by is `gpulab.lessons.l00_gpu_ceilings.bandwidth_ceiling()`: notebook 00's
measurement, else the datasheet (labelled), else a copy measured now (labelled).
"""
from __future__ import annotations

import importlib
import os
import shutil
import warnings
from typing import Callable
import torch
from gpulab.core.device import pick_device, resolve_scale, sync
from gpulab.core.measured import Measured
from gpulab.core.predict import Plan, Work
from gpulab.core.timing import MIN_CALLS, benchmark, gpu_kernels, gpu_profile


def _import_torchs_torchscript_module_quietly() -> None:
    """Import torch.utils.mkldnn now, with its TorchScript deprecation warning silenced.

    torch.compile's first call imports torch._inductor, which imports torch.utils.mkldnn, whose
    classes are defined with `@torch.jit.script_method`: each warns "`torch.jit.script_method` is
    deprecated". That is torch's own module, not this lesson's code; the lesson compares eager with
    torch.compile, and notebook 12 shows TorchScript only as the historical fusion route (handling
    its warnings there). Importing the module once, here, under a filter for that one message, keeps
    the warning out of every later torch.compile (the module is then cached) without a global filter.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.script_method` is deprecated",
                                category=DeprecationWarning)
        import torch.utils.mkldnn  # noqa: F401


_import_torchs_torchscript_module_quietly()


# -- knobs ------------------------------------------------------------------------------------------
TITLE = "kernel fusion"
HEADLINE = "eager / torch.compile ms"      # the metric bands.toml judges
CONFIG = {
    # n of the n x n fp32 inputs x and y: 8192 moves 0.5 GB at the floor, far more than any L2 cache holds
    "tiny": dict(n=512),
    "full": dict(n=8192),
}


def config(scale: str | None = None) -> dict:
    """This lesson's knobs at a scale ('tiny' or 'full'; default: the course's, `GPULAB_SCALE`)."""
    return dict(CONFIG[resolve_scale(scale)])


def plan(scale: str | None = None) -> Plan:
    """What notebook 12 asks of the GPU at `scale` (gpulab.core.predict): calls of (x + y).relu().mean(1)
    on n x n fp32, each moving `bytes_moved(n)` of its plan at the memory bandwidth. Host time: imports,
    torch.compile's compilations (the notebook's and headline()'s after its reset), TorchScript,
    the profiler, and the part of each `benchmark` that only fills its wall-clock budget."""
    n = config(scale)["n"]
    moved = bytes_moved(n)
    # a `benchmark` call at its fewest: 3 warm-up calls, 1 probe, 3 timed (more only fill its time budget)
    bench = MIN_CALLS       # benchmark()'s least; the rest of its budget is host time
    eager = (1              # the reference
             + 3 + 1        # the first three calls, the check
             + bench        # the timing table
             + 1            # the profiled call (kernels_launched)
             + 1 + bench    # headline(): the reference of its check, its eager timing
             + 1            # the panel's first run (torch.compile): the reference of its check
             + 2 + bench)   # panel.run(variant="eager"): the call and the reference, then the timing
    script = 3 + 1 + bench + 1                  # first calls, check, table, profiled call
    compiled = (3 + 1 + bench + 1               # the same as TorchScript's
                + 1 + bench                     # headline(): checked, then timed
                + 1 + bench)                    # the panel's first run: checked, then timed
    inputs = 2 + 2 + 2 + 2                      # torch.randn x, y: notebook, headline(), the panel's two runs
    return Plan(
        # wall time on the H200 minus its GPU work; the tiny scale keeps the full run's figure (no
        # tiny reference run to calibrate it on)
        host_s=15.5,
        work=[
            # eager moved 4060 GB/s on the H200 (0.95 of its copy), torch.compile 1.05, TorchScript 0.78
            Work("copy_bandwidth", eager * moved["unfused"], 0.9, f"{eager} eager calls, n={n} (unfused)"),
            Work("copy_bandwidth", script * moved["add+relu fused"], 0.8,
                 f"{script} TorchScript calls (add+relu fused, as on the H200)"),
            Work("copy_bandwidth", compiled * moved["fully fused"], 0.9,
                 f"{compiled} torch.compile calls (fully fused)"),
            Work("copy_bandwidth", inputs * n * n * 4, 0.8, f"{inputs} random n x n fp32 inputs written"),
        ],
        host_source="wall time of notebook 12 (15.5 s) in results/course/2026-12-03-h200-00-to-15/h200-2026-12-03-course-timings.tsv (one "
                    "H200, torch 2.11, 2026-12-03, the whole course at 7027931) minus its GPU work at the ceilings in "
                    "results/course/2026-12-03-h200-00-to-15/h200-2026-12-03-course.json (under 0.1 s); committed H200 runs took 13.7 "
                    "to 20.6 s (its compiles: inductor's cache on disk shortens a second run)",
    )


PLANS = {
    "unfused": "eager: add writes x+y, relu reads it and writes its result, mean reads that",
    "add+relu fused": "one kernel for add and relu writes one intermediate, mean reads it",
    "fully fused": "one kernel reads x and y once and writes only the n means (the floor)",
}


def fused_operation(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The seed article's function: (x + y).relu().mean(dim=1). Eager it runs three kernels
    (add, relu, mean) and writes two intermediates; fused it reads x and y once. Notebook 12."""
    return (x + y).relu().mean(dim=1)


def bytes_moved(n: int, element_bytes: int = 4) -> dict[str, int]:
    """Bytes read + written by (x + y).relu().mean(dim=1) on n x n inputs, per plan. Notebook 12.

    unfused:        add (read 2, write 1) + relu (read 1, write 1) + mean (read 1) = 6 n^2, + n out
    add+relu fused: add+relu (read 2, write 1) + mean (read 1)                   = 4 n^2, + n out
    fully fused:    read x and y once                                            = 2 n^2, + n out
    """
    if n < 1:
        raise ValueError(f"n must be >= 1 (got {n}).")
    sq, out = n * n * element_bytes, n * element_bytes
    return {"unfused": 6 * sq + out, "add+relu fused": 4 * sq + out, "fully fused": 2 * sq + out}


def compile_backend(device: torch.device | None = None) -> tuple[str, str]:
    """(backend, why): the torch.compile backend the lesson uses on this machine. Notebook 12."""
    device = device or pick_device()
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        try:
            importlib.import_module("triton")        # inductor generates Triton kernels on a GPU
        except Exception as err:  # noqa: BLE001
            return "aot_eager", (f"aot_eager: `import triton` failed ({type(err).__name__}), and inductor "
                                 "needs Triton on a GPU; aot_eager runs PyTorch's own kernels, so nothing is fused")
        if major < 7:
            return "aot_eager", (f"aot_eager: this GPU (compute capability {major}.{minor}) is too old for Triton, "
                                 "which inductor needs; aot_eager runs PyTorch's own kernels, so nothing is fused")
        return "inductor", "inductor, PyTorch's default: it generates fused Triton kernels for the GPU"
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if compiler:
        return "inductor", ("inductor, PyTorch's default: on the CPU it writes one fused C++ loop and "
                            f"compiles it with {os.path.basename(compiler.split()[0])}")
    return "aot_eager", ("aot_eager: no C++ compiler found, and inductor needs one on the CPU; aot_eager "
                         "traces the function but runs PyTorch's own kernels, so nothing is fused")


def check_close(out: torch.Tensor, ref: torch.Tensor, rtol: float = 1e-5, atol: float = 1e-5) -> float:
    """Largest |out - ref|; AssertionError unless |out - ref| <= atol + rtol |ref| everywhere. Notebook 12."""
    if out.shape != ref.shape:
        raise AssertionError(f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}")
    diff = (out.double() - ref.double()).abs()
    worst = float(diff.max()) if diff.numel() else 0.0
    if not torch.all(diff <= atol + rtol * ref.double().abs()):
        raise AssertionError(f"not close to the reference: largest difference {worst:.3g} "
                             f"(tolerance {atol:g} + {rtol:g} x |reference|)")
    return worst


def kernels_launched(fn: Callable[[], object], device: torch.device | None = None) -> list[str] | None:
    """Names of the GPU kernels one call of `fn` launches, in order (torch.profiler); None on the CPU.

    Call `fn` once before, so that compilation and warm-up are not what is counted. Notebook 12.
    """
    device = device or pick_device()
    if device.type != "cuda":
        return None
    sync(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # profiler start-up notices are not the lesson
        with gpu_profile() as prof:
            fn()
            sync(device)
    names = [name for name, _, _ in gpu_kernels(prof)]
    return [n for n in names if not n.startswith(("Memcpy", "Memset"))]


def plan_from_kernels(kernels: list[str] | None, assumed: str) -> str:
    """The traffic plan a variant followed, from the GPU kernels it launched: three or more
    kernels are unfused, two are add+relu fused, one is fully fused. Without a kernel list (the
    CPU), `assumed`. Notebook 12."""
    if assumed not in PLANS:
        raise ValueError(f"assumed must be one of {', '.join(PLANS)} (got {assumed!r}).")
    if kernels is None:
        return assumed
    return {1: "fully fused", 2: "add+relu fused"}.get(len(kernels), "unfused")


def headline(scale: str | None = None) -> Measured:
    """The seed's (x + y).relu().mean(1) on n x n fp32 (`config(scale)`), eager against torch.compile
    (`fused_operation`, `compile_backend`); the compiled result is checked against eager first."""
    device = pick_device()
    n = config(scale)["n"]
    torch.manual_seed(0)
    x = torch.randn(n, n, device=device)
    y = torch.randn(n, n, device=device)
    backend, why = compile_backend(device)
    torch.compiler.reset()
    compiled = torch.compile(fused_operation, backend=backend)
    worst = check_close(compiled(x, y), fused_operation(x, y))      # raises if it differs (1e-5)
    eager = benchmark(lambda: fused_operation(x, y))
    fused = benchmark(lambda: compiled(x, y))
    del x, y
    return Measured(eager.median_ms, fused.median_ms, "ms", eager.median_ms / fused.median_ms, True,
                    f"compiled vs eager: largest difference {worst:.1e} (<= 1e-5)",
                    f"eager, fp32 {n} x {n}", f"torch.compile ({backend})")
