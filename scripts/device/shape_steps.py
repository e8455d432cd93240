"""Each step's time and batch shape, one zoo step and one of its fixes, on the lent GPU (issue 41: do the slow steps of
a shape-changing step's fix come with shapes met for the first time, or with shapes it has run before?).

usage: python scripts/device/shape_steps.py STEP FIX|none FUNC STEPS OUT.json
  FUNC: the zoo module's function that returns each batch's tensor (its shape is the step's shape), wrapped here to
  read it; the last call in a step wins (a padding function after the batch maker).
Each step is timed alone by gpulab's `stopwatch` (the host clock, the device synchronized on both sides: the step
includes host work, the batch and the optimizer), so a step's time is its own, not its neighbours'. The runs of
results/zoo/2026-12-07-h100-issue41-h/ were made by af3bdda's copy, which timed the same way with its own loop."""
import importlib
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "zoo"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gpulab.core.timing import stopwatch  # noqa: E402


def main(name: str, fix: str, func: str, steps: int, out: str) -> None:
    mod = importlib.import_module(name)
    seen: list = []
    original = getattr(mod, func)

    def wrapped(*args, **kwargs):
        result = original(*args, **kwargs)
        tensor = result.get("input_ids") if isinstance(result, dict) else result
        seen.append(tuple(tensor.shape))
        return result

    setattr(mod, func, wrapped)
    device = torch.device(os.environ.get("SHAPE_STEPS_DEVICE", "cuda"))       # cpu and tiny: to try the script here
    step = mod.make_step(None if fix == "none" else fix, scale=os.environ.get("SHAPE_STEPS_SCALE", "full"),
                         device=device)
    rows, first = [], set()
    for i in range(steps):
        with stopwatch(device=device) as call:
            step()
        ms = call.ms
        shape = seen[-1] if seen else None
        rows.append({"i": i, "shape": shape, "ms": ms, "new": shape not in first,
                     "switch": bool(rows) and shape != rows[-1]["shape"]})
        first.add(shape)
    Path(out).write_text(json.dumps({"kind": "gpulab zoo shape steps (scripts/device/shape_steps.py)",
                                     "step": name, "fix": fix, "torch": torch.__version__,
                                     "gpu": torch.cuda.get_device_name() if device.type == "cuda" else "CPU",
                                     "rows": rows}))
    times = sorted(r["ms"] for r in rows)
    median = times[len(times) // 2]
    slow = [r for r in rows if r["ms"] > 3 * median]
    print(f"{name} {fix}: {steps} steps, {len(first)} shapes, median {median:.3g} ms, mean "
          f"{sum(times) / len(times):.3g} ms; {len(slow)} over 3x the median, {sum(r['new'] for r in slow)} of them "
          f"a shape's first step; of the last half: median "
          f"{sorted(r['ms'] for r in rows[steps // 2:])[steps // 4]:.3g} ms, "
          f"{sum(r['ms'] > 3 * median for r in rows[steps // 2:])} slow")
    seen_before = [r for r in rows if not r["new"]]
    for switch in (False, True):
        part = sorted(r["ms"] for r in seen_before if r["switch"] == switch)
        if part:
            print(f"  shapes run before, {'another shape' if switch else 'the same shape'} as the step before: "
                  f"{len(part)} steps, median {part[len(part) // 2]:.3g} ms, mean {sum(part) / len(part):.3g} ms, "
                  f"{sum(t > 3 * median for t in part)} over 3x the median")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
