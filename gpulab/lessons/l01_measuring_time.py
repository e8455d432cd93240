"""Lesson 01, measuring GPU time right: its knobs and its headline measurement.

The notebook shows the timing code itself (`gpulab.core.timing.benchmark`, `host_time_no_sync`);
this module holds what the notebook and `gpulab bench` share: the sizes, and `headline`, the
largest product of the notebook's sweep timed the wrong way (host clock, no synchronize) and
the right way (CUDA events after a synchronize).
"""
from __future__ import annotations

import torch

from gpulab.core.device import pick_device, resolve_scale, sync
from gpulab.core.measured import Measured
from gpulab.core.predict import Plan, Work
from gpulab.core.timing import benchmark

# -- knobs ------------------------------------------------------------------------------------------
TITLE = "measuring time"
HEADLINE = "CUDA events / host clock without sync, ms"      # the metric bands.toml judges
CONFIG = {
    # sizes of the notebook's sweep (n x n fp32 matrix products); the headline times the largest
    "tiny": dict(sizes=[64, 128, 256, 512], first_call_n=256, spread_n=32, profile_width=128, profile_batch=32),
    "full": dict(sizes=[256, 512, 1024, 2048, 4096, 8192], first_call_n=4096, spread_n=256, profile_width=4096,
                 profile_batch=1024),
}


def config(scale: str | None = None) -> dict:
    """This lesson's knobs at a scale ('tiny' or 'full'; default: the course's, `GPULAB_SCALE`)."""
    return dict(CONFIG[resolve_scale(scale)])


def plan(scale: str | None = None) -> Plan:
    """What notebook 01 asks of the GPU at `scale` (gpulab.core.predict): fp32 products timed the wrong
    way and the right way, a fixed 100-call spread, and five profiled MLP steps."""
    cfg = config(scale)
    calls = 3 + 1 + 3        # benchmark()'s least: 3 warm-up, 1 probe, 3 timed; the rest of its budget is host time
    no_sync = 3 + 10         # benchmark(sync=False): 3 warm-up + 10 calls on the host clock, all run by the GPU
    both = no_sync + calls   # sync_vs_no_sync: the wrong way, then the right way
    n = cfg["first_call_n"]
    # calls of the n x n product `work` (and the panel's, same n):
    work_calls = (1 + calls          # the first call, then the steady benchmark
                  + both             # host clock without sync against CUDA events
                  + 3 + 100          # the spread: repeat=100 after 3 warm-up calls
                  + calls + no_sync)  # the panel's default run, then panel.run(synchronize=False)
    sweep = both * sum(2 * s**3 for s in cfg["sizes"])      # sync_vs_no_sync over the sweep's sizes
    check = both * 2 * cfg["sizes"][-1] ** 3                 # the self-check (headline): the largest size again
    # the profiled MLP: 1 warm-up + 5 profiled steps, each forward + backward (3x the forward's 2 products)
    w, b = cfg["profile_width"], cfg["profile_batch"]
    mlp = 6 * 3 * 2 * (2 * b * w * w)
    # (the spread's small product, spread_n, is far below 1 % of this)
    work = [
        Work("matmul_fp32", work_calls * 2 * n**3, 1.0, f"{work_calls} fp32 products n={n}"),
        Work("matmul_fp32", sweep, 1.0, f"sync / no-sync sweep, n={cfg['sizes'][0]}..{cfg['sizes'][-1]}"),
        Work("matmul_fp32", check, 1.0, f"self-check: sync / no-sync at n={cfg['sizes'][-1]}"),
        Work("matmul_fp32", mlp, 0.5, f"6 MLP training steps, width {w}, batch {b}"),
    ]
    # host_s: see host_source; tiny runs the same formulas, with the full run's host time (tiny runs on
    # the CPU, where nothing is predicted: its plan is only for completeness)
    return Plan(host_s=15.0, work=work,
                host_source="wall time of notebook 01 in results/h200-2026-11-30-course-timings.tsv "
                            "(H200, torch 2.11, 2026-11-30) minus its GPU work at that run's ceilings")


def sync_vs_no_sync(n: int) -> tuple[float, float]:
    """(ms timed on the host clock without synchronizing, ms timed with CUDA events) of one n x n product."""
    device = pick_device()
    x = torch.randn(n, n, device=device)
    wrong = benchmark(lambda: x @ x, sync=False).median_ms
    sync()                                           # let the queued products finish before timing again
    right = benchmark(lambda: x @ x).median_ms
    del x
    return wrong, right


def headline(scale: str | None = None) -> Measured:
    """The largest product of the sweep, timed without synchronizing (wrong) and with CUDA events (right)."""
    n = config(scale)["sizes"][-1]
    wrong, right = sync_vs_no_sync(n)
    return Measured(wrong, right, "ms", right / wrong, True,
                    "nothing to compare: both columns time the same x @ x",
                    f"host clock, no sync (fp32 n={n})", "CUDA events + sync")
