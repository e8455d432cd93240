"""What every step of the zoo shares: the device and size it runs at, its 16-bit type, a seeded
generator and the row order of the noise-floor run. Nothing here is a training habit: the habits are
in each step's own file, written the way practitioners write them."""
from __future__ import annotations

import functools

import numpy as np
import torch

from gpulab.core.device import pick_device, resolve_scale


def setup(device=None, scale: str | None = None, seed: int = 0) -> tuple[torch.device, str]:
    """(device, scale) for a step: the course's device and size unless given; seeds torch."""
    device = torch.device(device) if device is not None else pick_device()
    scale = resolve_scale(scale)
    torch.manual_seed(seed)
    return device, scale


def half_dtype(device: torch.device, *, lstm: bool = False) -> torch.dtype:
    """bf16 where the GPU runs it natively (and on the CPU), else fp16 (which needs a GradScaler).
    ZOO_FP32=1 makes it fp32 (autocast then disables itself): the zoo's correctness check runs a variant
    so to see how far its 16-bit rounding alone moves the parameters. `lstm`: the step runs an nn.LSTM under
    autocast, which some CPUs cannot run in bf16 (then fp32: see `cpu_runs_bf16_lstm`)."""
    import os
    if os.environ.get("ZOO_FP32"):
        return torch.float32
    if device.type == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
        return torch.float16
    if device.type == "cpu" and lstm and not cpu_runs_bf16_lstm():
        return torch.float32
    return torch.bfloat16


@functools.cache
def cpu_runs_bf16_lstm() -> bool:
    """Whether this CPU's oneDNN runs an nn.LSTM under bf16 autocast. On an AVX2 CPU without AVX-512 (an AMD EPYC,
    2026-12-07, torch 2.13.0+cpu) it raises "could not create a primitive descriptor for the LSTM forward propagation
    primitive". Tried on a one-unit LSTM, with the torch generator's state put back (the steps are seeded)."""
    with torch.random.fork_rng(devices=[]):
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                torch.nn.LSTM(2, 2)(torch.zeros(1, 1, 2))
        except RuntimeError:
            return False
    return True


def rng(seed: int, step: int = 0) -> np.random.Generator:
    """A numpy generator for batch `step` of a run seeded `seed`: every variant of a step (as written,
    fixed, reordered) sees the same data in the same order."""
    return np.random.default_rng([seed, step])


def rows(n: int, reorder: bool) -> torch.Tensor | None:
    """The row order of a batch of n rows: None as given, or a fixed permutation (`reorder=True`), which
    changes only the order of the reductions over the batch: the zoo's noise floor."""
    if not reorder:
        return None
    return torch.randperm(n, generator=torch.Generator().manual_seed(12345))


def reordered(perm: torch.Tensor | None, *tensors):
    """`tensors` with their rows in `perm`'s order (unchanged when perm is None)."""
    if perm is None:
        return tensors if len(tensors) > 1 else tensors[0]
    out = tuple(t[perm.to(t.device)] for t in tensors)
    return out if len(out) > 1 else out[0]


def compile_backend(device: torch.device) -> str:
    """torch.compile's backend: inductor on a GPU; on the CPU aot_eager (no C++ compiler needed, and
    seconds instead of minutes at the tiny size CI runs). ZOO_COMPILE_BACKEND overrides it: the zoo's
    correctness check compares code paths, not compilers, and sets aot_eager to spare inductor compiles."""
    import os
    return os.environ.get("ZOO_COMPILE_BACKEND") or ("inductor" if device.type == "cuda" else "aot_eager")


def reduce_overhead(model, device: torch.device):
    """The CUDA-graph fix as the zoo applies it: (torch.compile(model, mode="reduce-overhead"), the call to make
    before each step: torch.compiler.cudagraph_mark_step_begin). On the CPU, where CUDA graphs do not exist,
    the plain compile and nothing to call: the correctness check still runs the compiled code path."""
    cuda = device.type == "cuda"
    compiled = torch.compile(model, backend=compile_backend(device), mode="reduce-overhead" if cuda else None)
    return compiled, (torch.compiler.cudagraph_mark_step_begin if cuda else (lambda: None))


# The CUDA-graph fix's line in a step's FIXES.
GRAPHS_FIX = ('torch.compile(model, mode="reduce-overhead") (CUDA graphs of the forward and backward), with '
              "torch.compiler.cudagraph_mark_step_begin() before each step (CPU: the plain compile)")
