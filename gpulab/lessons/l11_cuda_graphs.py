"""Lesson 11, CUDA Graphs: record a sequence of kernel launches once, replay it with one launch.

Notebook 11 (`notebooks/11_cuda_graphs.ipynb`) and `gpulab bench` share what is here: the sizes
(`CONFIG`, `config(scale)`), and `headline(scale)`, 400 tiny elementwise ops eager against one
CUDA graph replay, each checked before it is timed.

- `tiny_ops(x, count)`: a launch-bound workload: `count` elementwise kernels on a small tensor.
- `tiny_ops_reference(x, count)`: the same result in closed form, to check any variant.
- `capture(fn, *static_inputs)`: warm up on a side stream, capture `fn` into a
  `torch.cuda.CUDAGraph` (PyTorch's documented recipe) and return the graph and its static output.
- `MLP` / `make_mlp_step`: a small MLP's forward + backward, the model-sized launch-bound case.
- `capture_violation(kind)`: breaks a capture rule in a fresh process (a failed capture can leave
  the CUDA context unusable) and returns what PyTorch said.
- `cudagraph_skips()`: how often torch.compile declined to record CUDA graphs in this process;
  `step_profile(fn)` / `step_profiles(fns)`: where a step's time goes, host against GPU (host clock, profiler
  kernels), and `pace_verdict`: what that says sets the step's pace;
  `gpu_memory()`: allocated and reserved bytes, to see what a graph's private pool holds.
"""
from __future__ import annotations

import gc
import inspect
import json
import math
import statistics
import sys
import time
from typing import Callable
import torch
from torch import nn
from gpulab.core.children import at_once
from gpulab.core.device import require_cuda, resolve_scale
from gpulab.core.measured import Measured, Skipped
from gpulab.core.predict import Plan, Work
from gpulab.core.timing import GPU_PACED_MIN, benchmark, capture_graph, interleaved, pace


# -- knobs ------------------------------------------------------------------------------------------
TITLE = "CUDA graphs"
HEADLINE = "400 tiny ops, eager / graph replay ms"      # the metric bands.toml judges
CONFIG = {
    "tiny": dict(
        n_ops=400,                    # tiny elementwise kernels in the headline's chain (one launch each)
        numel=1024,                   # elements of the tensor they work on: tiny on purpose
        counts=[1, 10, 100, 400],     # chain lengths of the launch-cost sweep (includes n_ops)
        mlp_width=64, mlp_depth=8, mlp_batch=32,      # the small MLP stepped eager, graphed and compiled
        big_n=256,                    # n of the four bf16 n x n matmuls (compute-bound at full size)
    ),
    "full": dict(
        n_ops=400,
        numel=1024,
        counts=[1, 10, 100, 400, 1000],
        mlp_width=512, mlp_depth=8, mlp_batch=256,
        big_n=8192,
    ),
}


def config(scale: str | None = None) -> dict:
    """This lesson's knobs at a scale ('tiny' or 'full'; default: the course's, `GPULAB_SCALE`)."""
    return dict(CONFIG[resolve_scale(scale)])


def plan(scale: str | None = None) -> Plan:
    """What notebook 11 asks of the GPU at `scale` (gpulab.core.predict): only section 5's 16-bit matmuls (bf16
    where the GPU runs it natively, else fp16: gpulab.core.predict's FALLBACK) are GPU work. The tiny-op chains (sweep, headline, panel) and the small MLP's steps are bound by
    kernel launches, not by the GPU: host time, as are torch.compile's compilation, the capture-rule
    child processes and the wall-clock budgets `benchmark` times for."""
    cfg = config(scale)
    n = cfg["big_n"]
    # one `four_matmuls` call: 4 bf16 n x n @ n x n products, 2 n^3 FLOPs each
    four = 4 * 2 * n**3
    # `interleaved` (eager and replay in turns) calls each variant warmup + 1 times, then rounds x repeat times
    turns = {k: v.default for k, v in inspect.signature(interleaved).parameters.items()}
    per_variant = turns["warmup"] + 1 + turns["rounds"] * turns["repeat"]
    calls = (3 + 1          # capture(): 3 warm-up calls on the side stream, then one replay to check
             + 1            # the eager reference the replay is checked against
             + 2 * per_variant)     # eager and the replay, timed in turns
    return Plan(
        # wall time on the H200 minus its GPU work (imports, compile, launch-bound loops, budgets);
        # the tiny scale keeps the full run's figure (no tiny reference run to calibrate it on)
        host_s=32.5,
        work=[Work("matmul_bf16", calls * four, 0.9, f"{calls} x 4 16-bit matmuls n={n} (section 5)")],
        host_source="wall time of notebook 11 in results/course/2026-11-30-h200-10-to-14-at-775ae4a/h200-2026-11-30-course-2-timings.tsv (one H200, "
                    "torch 2.11, 2026-11-30) minus its GPU work at the ceilings in results/course/2026-11-30-h200-00-to-09-at-775ae4a/h200-2026-11-30-course.json",
    )


NO_GRAPHS = "CUDA graphs record CUDA kernel launches"


def tiny_ops(x: torch.Tensor, count: int) -> torch.Tensor:
    """`count` tiny elementwise kernels, alternating x * 0.999 and x + 0.001 (one launch each)."""
    if count < 1:
        raise ValueError(f"count must be >= 1 (got {count})")
    for i in range(count):
        x = x * 0.999 if i % 2 == 0 else x + 0.001
    return x


def tiny_ops_reference(x: torch.Tensor, count: int) -> torch.Tensor:
    """The same result in closed form (float64): for checking, not for timing."""
    y = x.double()
    for i in range(count):
        y = y * 0.999 if i % 2 == 0 else y + 0.001
    return y


def capture(fn: Callable[..., object], *static_inputs: torch.Tensor, warmup: int = 3):
    """Capture `fn(*static_inputs)` into a CUDA graph; return (graph, static output): `timing.capture_graph`
    (warm-up on a side stream, then the capture, as PyTorch's CUDA Graphs docs show), on a CUDA GPU only.
    Replaying reads the static inputs' memory and writes the static output's: to run on new data, `.copy_()`
    it into the static inputs.
    """
    require_cuda(NO_GRAPHS)
    return capture_graph(fn, *static_inputs, warmup=warmup)


class MLP(nn.Module):
    """`depth` Linear+ReLU layers of `width`, then a mean-squared-error loss against `target`."""

    def __init__(self, width: int = 512, depth: int = 8):
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.net = nn.Sequential(*layers[:-1])

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(self.net(x), target)


def make_mlp_step(model: nn.Module, loss_model: Callable | None = None):
    """One training step's forward + backward, returning (loss, *gradients).

    Uses `torch.autograd.grad`, not `.backward()`, so parameters' `.grad` is never touched:
    eager, graphed and compiled steps then compare their outputs directly.
    `loss_model` (e.g. a compiled `model`) replaces `model` for the forward.

    The loss is returned *detached*. A loss that keeps its autograd graph alive also keeps the
    parameters' gradient-accumulator nodes alive, and each node remembers the stream it was
    created on. An eager step on the default stream followed by a capture then makes autograd
    wait on the legacy default stream from inside the capture, and CUDA refuses with
    `cudaErrorStreamCaptureImplicit` ("operation would make the legacy stream depend on a
    capturing blocking stream"); see pytorch/pytorch#164302. This is what broke the first
    version of notebook 11 on the H200.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    run = model if loss_model is None else loss_model     # not `or`: a compiled module has no truth value

    def step(x: torch.Tensor, target: torch.Tensor):
        loss = run(x, target)
        grads = torch.autograd.grad(loss, params)
        return (loss.detach(), *grads)

    return step


def max_difference(a, b) -> float:
    """Largest |a - b| over a tensor or matching sequences of tensors."""
    if isinstance(a, torch.Tensor):
        a, b = [a], [b]
    if len(a) != len(b):
        raise ValueError(f"{len(a)} tensors vs {len(b)}")
    return max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b))


def cudagraph_skips() -> int:
    """How often torch.compile has declined to record CUDA graphs in this process (inductor's counter,
    `torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]`): read it before and after a
    `mode="reduce-overhead"` run; a difference means that run used compiled kernels without graphs
    (its log says why: `TORCH_LOGS="perf_hints,cudagraphs"`; torch 2.13 writes the reason to the cudagraphs log)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:                      # pragma: no cover - a torch without dynamo
        return 0
    return int(counters["inductor"]["cudagraph_skips"])


STEP_PROFILE_STEPS = 20


def _host_and_wall(fn: Callable[[], object], steps: int) -> dict[str, float]:
    """After one warm call and a synchronize: `steps` calls back to back, each one's issue time on the host clock
    (no synchronize between them), then the wall time until the GPU has finished them too."""
    fn()
    torch.cuda.synchronize()
    issue = []
    t0 = time.perf_counter()
    for _ in range(steps):
        t = time.perf_counter()
        fn()
        issue.append(time.perf_counter() - t)
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    return {"host ms": host * 1e3 / steps, "host median ms": statistics.median(issue) * 1e3,
            "host max ms": max(issue) * 1e3, "wall ms": wall * 1e3 / steps}


def _busy(fn: Callable[[], object], steps: int) -> dict[str, float]:
    busy = pace(fn, steps, torch.device("cuda", torch.cuda.current_device()))
    return {"GPU busy ms": busy.busy_ms if busy else math.nan,          # busy unknown: nan, not 0
            "kernels": busy.kernels if busy else math.nan}


def step_profile(fn: Callable[[], object], steps: int = STEP_PROFILE_STEPS) -> dict[str, float]:
    """Where one step's time goes, per step, after one warm call:
    - `host ms`: host clock while `steps` calls are issued, before any synchronize, over `steps` (the CPU's own
      work; it includes waiting only if the GPU's launch queue fills); `host median ms` and `host max ms`: the
      median and the longest of the calls' issue times one by one (a mean far above the median is a few slow
      calls: a garbage collection, a recompile);
    - `wall ms`: host clock until the GPU has finished them too, over `steps`;
    - `GPU busy ms`: time at least one kernel (or copy) ran, over a second run of `steps` calls under a
      kernel-only profile (`timing.pace`); `kernels`: how many ran per step.
    A step whose host ms is close to its wall ms while the GPU is busy a fraction of it is host-bound:
    the CPU, not the GPU, sets its pace (`pace_verdict`). CUDA only. To compare variants, `step_profiles` times
    every one's host and wall before profiling any."""
    require_cuda(NO_GRAPHS)
    return {**_host_and_wall(fn, steps), **_busy(fn, steps)}


def step_profiles(fns: dict[str, Callable[[], object]], steps: int = STEP_PROFILE_STEPS) -> dict[str, dict[str, float]]:
    """`step_profile` of each variant, with every variant's host and wall time read before any profiler runs,
    then each one's GPU busy time: a variant timed right after another's profile would carry whatever the
    profiler session left behind (notebook 11 once timed its compiled step after two). CUDA only."""
    require_cuda(NO_GRAPHS)
    times = {name: _host_and_wall(fn, steps) for name, fn in fns.items()}
    return {name: {**times[name], **_busy(fn, steps)} for name, fn in fns.items()}


def pace_verdict(host_ms: float, wall_ms: float, busy_ms: float) -> tuple[str, str]:
    """What sets a step's pace, from `step_profile`'s figures, and why: "the GPU" where its kernels fill at least
    `timing.GPU_PACED_MIN` of the step (timing.pace's line); else "the host" where the host takes at least as long
    to issue a step as the GPU to run it (the GPU waits for launches: host-bound), whatever the wall time adds
    (a shared GPU, the queue draining at the end); else "something else" (the host issues faster than the GPU
    runs, yet the GPU idles: a synchronization, a copy, another process); "unknown" without a busy time."""
    if not all(math.isfinite(v) for v in (host_ms, wall_ms, busy_ms)) or wall_ms <= 0:
        return "unknown", "the GPU's busy time was not measured (the profiler recorded nothing)"
    share = min(busy_ms / wall_ms, 1.0)
    if share >= GPU_PACED_MIN:
        return "the GPU", f"its kernels fill {share:.0%} of the step (at least {GPU_PACED_MIN:.0%})"
    if host_ms >= busy_ms:
        return "the host", (f"the GPU is busy {share:.0%} of the step and the host needs {host_ms:.3g} ms to issue "
                            f"what the GPU runs in {busy_ms:.3g} ms: host-bound")
    return "something else", (f"the GPU is busy {share:.0%} of the step, yet the host issues it in {host_ms:.3g} ms, "
                              f"less than the GPU's {busy_ms:.3g} ms: the GPU waits on something else (a "
                              "synchronization, a copy, another process on the GPU)")


def gpu_memory() -> tuple[int, int]:
    """(allocated, reserved) bytes on the current CUDA device, after a garbage collection and a
    synchronize; (0, 0) without CUDA. Reserved holds what the caching allocator keeps, a CUDA graph's
    private pool included, until the graph is freed and `torch.cuda.empty_cache()` runs."""
    gc.collect()
    if not torch.cuda.is_available():
        return 0, 0
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()


POOL_SCRIPT = r'''
import gc, json, torch
from gpulab.core.device import float32_matmul
from gpulab.lessons.l11_cuda_graphs import MLP, capture, make_mlp_step
def memory():
    gc.collect(); torch.cuda.synchronize(device); torch.cuda.empty_cache()
    return torch.cuda.memory_allocated(device), torch.cuda.memory_reserved(device)
torch.manual_seed(0)
device = torch.device({device!r})
torch.cuda.set_device(device.index if device.index is not None else torch.cuda.current_device())
model = MLP({width}, {depth}).to(device)
x, t = torch.randn({batch}, {width}, device=device), torch.randn({batch}, {width}, device=device)
step = make_mlp_step(model)
rows = [("before capture", memory())]
with float32_matmul("tf32"):
    graph, out = capture(step, x, t)
rows.append(("graph captured", memory()))
del out
rows.append(("static outputs deleted, graph alive", memory()))
del graph
rows.append(("graph deleted, empty_cache()", memory()))
clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)     # private; empty_cache() leaves them
if clear is not None:
    clear()
    rows.append(("cuBLAS workspaces cleared", memory()))
print(json.dumps(rows))
'''


def graph_pool_memory(width: int, depth: int, batch: int, timeout_s: float = 120.0) -> list[tuple[str, int, int]]:
    """A CUDA graph's private memory pool, measured in a fresh Python process (so this kernel's own
    graphs, compiled steps and caches do not blur it, and a failed capture cannot leave this kernel's CUDA
    context unusable): (moment, allocated bytes, reserved bytes) before capturing notebook 11's MLP step,
    after, once its static outputs are deleted, once the graph is deleted, and (where PyTorch has the
    private `torch._C._cuda_clearCublasWorkspaces`) once cuBLAS's per-stream workspaces are cleared: what
    outlives the graph is not its pool but those workspaces, which `empty_cache()` leaves (PyTorch's CUDA
    notes). `pool_split(rows)` reads the three parts. Raises RuntimeError with the child's last error line."""
    device = require_cuda(NO_GRAPHS)            # the course's device choice, passed to the child
    code = POOL_SCRIPT.format(width=int(width), depth=int(depth), batch=int(batch), device=str(device))
    proc = at_once({"pool": [sys.executable, "-c", code]}, timeout_s)["pool"]
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise RuntimeError(f"the graph-pool process failed (exit {proc.returncode}): {last}")
    return [(what, a, r) for what, (a, r) in json.loads(proc.stdout.strip().splitlines()[-1])]


def pool_split(rows: list[tuple[str, int, int]]) -> dict[str, float | None]:
    """From `graph_pool_memory`'s rows, in MiB of reserved memory: "private pool" (what deleting the graph
    gave back), "kept after delete" (what stayed reserved against the start), and "cuBLAS workspaces"
    (what clearing them then gave back; None where it could not be cleared)."""
    reserved = {what: r for what, _, r in rows}
    mib = 2**20
    before = reserved["before capture"]
    alive = reserved["static outputs deleted, graph alive"]
    gone = reserved["graph deleted, empty_cache()"]
    cleared = reserved.get("cuBLAS workspaces cleared")
    return {"private pool": (alive - gone) / mib, "kept after delete": (gone - before) / mib,
            "cuBLAS workspaces": None if cleared is None else (gone - cleared) / mib}


_VIOLATION = r'''
import torch
kind = {kind!r}
x = torch.ones(1024, device="cuda")
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    y = x * 2
torch.cuda.current_stream().wait_stream(side)
g = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(g):
        y = x * 2
        if kind == "item":
            y.sum().item()
        else:
            torch.cuda.synchronize()
    print("captured without error", flush=True)
except Exception as err:
    print(f"raised {{type(err).__module__}}.{{type(err).__qualname__}}: {{(str(err).strip().splitlines() or [''])[0]}}", flush=True)
    ctx = err.__context__
    if ctx is not None:
        print(f"  while handling {{type(ctx).__qualname__}}: {{(str(ctx).strip().splitlines() or [''])[0]}}", flush=True)
'''


VIOLATIONS = ("item", "synchronize")


def capture_violations(kinds=VIOLATIONS, timeout_s: float = 60.0) -> dict[str, str]:
    """Break capture rules ("item": `.item()`, "synchronize": `torch.cuda.synchronize()`) inside
    `torch.cuda.graph`, each in its own fresh Python process (a failed capture can leave the CUDA
    context unusable), all at once since nothing is timed; return what each printed."""
    kinds = list(kinds)
    bad = [k for k in kinds if k not in VIOLATIONS]
    if bad:
        raise ValueError(f"kind must be 'item' or 'synchronize' (got {bad[0]!r})")
    require_cuda(NO_GRAPHS)
    done = at_once({k: [sys.executable, "-c", _VIOLATION.format(kind=k)] for k in kinds}, timeout_s)
    out = {}
    for k, proc in done.items():
        text = proc.stdout.strip()
        if proc.returncode != 0:
            last = proc.stderr.strip().splitlines()[-1:] or ["(no message)"]
            text += f"\nthe process died (exit {proc.returncode}): {last[0]}"
        out[k] = text
    return out


def capture_violation(kind: str, timeout_s: float = 60.0) -> str:
    """One rule broken in a fresh process (see `capture_violations`); what it printed."""
    return capture_violations([kind], timeout_s)[kind]


def headline(scale: str | None = None) -> Measured:
    """`n_ops` tiny elementwise ops on `numel` elements (`config(scale)`), eager against one CUDA graph
    replay (`capture`): eager checked against float64, the replay against eager, then both timed."""
    try:
        device = require_cuda(NO_GRAPHS)
    except ValueError as err:
        raise Skipped(str(err)) from None
    cfg = config(scale)
    n_ops = cfg["n_ops"]
    x = torch.randn(cfg["numel"], device=device)
    eager_out = tiny_ops(x, n_ops)
    eager_err = max_difference(eager_out, tiny_ops_reference(x, n_ops))
    graph, graph_out = capture(lambda t: tiny_ops(t, n_ops), x)
    graph.replay()
    replay_diff = max_difference(graph_out, eager_out)
    eager = benchmark(lambda: tiny_ops(x, n_ops))
    replay = benchmark(graph.replay)
    del graph, graph_out, eager_out, x
    return Measured(eager.median_ms, replay.median_ms, "ms", eager.median_ms / replay.median_ms,
                    eager_err <= 1e-4 and replay_diff == 0.0,
                    f"eager vs float64 {eager_err:.1e} (<= 1e-4); replay vs eager {replay_diff:.1e} (must be 0)",
                    f"eager, {n_ops} launches", "one CUDA graph replay")
