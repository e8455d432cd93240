"""Why did notebook 00's bf16 sweep read 692 TFLOP/s at 4096^3 where notebook 13's FP8 section read 791 for
bf16 at 4096 in the same run (2026-12-03)? 00 times torch.mm(a, b, out=c) (A row-major, B row-major: NN);
13 times a @ w.t() (NT, a linear layer's layout), interleaved. Time each layout both ways, with NVML's
clock and power beside, then 00's own sweep twice."""
import json, os, sys, time
import torch
from gpulab.core.timing import benchmark, interleaved
from gpulab.core.monitor import GpuMonitor
from gpulab.lessons import l00_gpu_ceilings as L0

dev = torch.device("cuda")
out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "rows": []}

def rec(**kw):
    out["rows"].append(kw); print(json.dumps(kw), flush=True)

for n in (4096, 8192):
    g = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16, generator=g)
    c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
    fns = {"NN mm out=": lambda: torch.mm(a, b, out=c), "NN a@b": lambda: a @ b,
           "NT a@b.t()": lambda: a @ b.t(), "TN a.t()@b": lambda: a.t() @ b}
    flops = 2 * n ** 3
    for name, fn in fns.items():
        for calls in (1, 20):
            with GpuMonitor(interval_s=0.1, pcie=False, device=dev) as mon:
                t = benchmark(fn, budget_s=0.3, calls=calls)
            rec(n=n, layout=name, calls=calls, how="benchmark", tflops=t.per_second(flops) / 1e12,
                spread=t.spread_pct, samples=t.n, mhz=mon.mean("sm_clock_mhz"), watts=mon.mean("power_w"))
    ts = interleaved(fns, rounds=4, repeat=3, warmup=2)
    for name, t in ts.items():
        rec(n=n, layout=name, calls=1, how="interleaved", tflops=t.per_second(flops) / 1e12, spread=t.spread_pct, samples=t.n)
    del a, b, c
    torch.cuda.empty_cache()

shapes = L0.config("full")["sweep_shapes"]
for k in range(2):
    with GpuMonitor(interval_s=0.1, pcie=False, device=dev) as mon:
        s = L0.peak_sweep("bf16", shapes, L0.config("full")["sweep_budget_s"])
    rec(how=f"00's peak_sweep bf16, pass {k + 1}", best=s["best"], shape=list(s["shape"]),
        rows=[[list(sh), v] for sh, v in s["rows"]], mhz=mon.mean("sm_clock_mhz"), watts=mon.mean("power_w"))
json.dump(out, open(os.path.join(os.environ["OUT"], "peak-layouts.json"), "w"), indent=1)
