"""gpulab: the helper package of the gpulab course. The layout is the architecture:

    core/      shared services: device, specs, timing, memory, monitor, results, ceilings, bands,
               measured, plots, children, launcher (imports nothing else from gpulab)
    notebook/  what a notebook uses around its lesson: lesson (template helpers), widgets (the panel)
    models/    what the lessons train: cnn, gpt, transformer, precision, sizing, step (one train_step)
    lessons/   one module per notebook (l00_gpu_ceilings ... l14_multi_gpu): knobs, experiments, headline;
               lesson 14's parts in lessons/multigpu/
    tools/     bench, room, coursetime, cli (`gpulab doctor | bench | room | report | diagnose`)
    diagnose/  your own training step: events, analyze, rules, core (`gpulab.diagnose(step)`), and the
               labelled cases that prove the rules (cases, suite)
"""
import importlib
import os

__version__ = "0.1.0"

# After a torch.profiler session Kineto leaves CUPTI attached unless TEARDOWN_CUPTI=1, and every later kernel
# launch in the process pays CUPTI's callbacks: on the H200 (torch 2.11) one small kernel's launch went from
# 6.7 to 13.4 us after one `gpulab.diagnose`, and host-bound zoo steps timed after profiles ran up to twice as
# slow as in a fresh process (results/zoo/2026-12-01-h200-cupti-probes/probe-cupti-h200-2026-12-01.json). The course profiles and then
# times in one process (notebooks 01, 11, 12, 14, diagnose and notebook 15), so it asks Kineto to detach CUPTI
# when each session ends (cuptiFinalize; the next session attaches again). A value the user set is kept;
# PyTorch itself sets "0" where teardown is known to crash (CUDA graphs before CUDA 12.6).
os.environ.setdefault("TEARDOWN_CUPTI", "1")

# The everyday helpers, importable from the top (`from gpulab import benchmark`). Loaded on first use,
# so that `python -m gpulab.tools.coursetime` runs where torch is not installed.
_EXPORTS = {
    "by_scale": "gpulab.core.device", "device_facts": "gpulab.core.device", "pick_device": "gpulab.core.device",
    "scale": "gpulab.core.device", "sync": "gpulab.core.device",
    "fmt_bytes": "gpulab.core.memory", "memory_guard": "gpulab.core.memory", "memory_now": "gpulab.core.memory",
    "track_peak": "gpulab.core.memory", "results_store": "gpulab.core.results",
    "Timing": "gpulab.core.timing", "benchmark": "gpulab.core.timing",
    "diagnose": "gpulab.diagnose",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name == "diagnose":      # the package, which is callable: gpulab.diagnose(step), and gpulab.diagnose.skippable
        return importlib.import_module("gpulab.diagnose")
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'gpulab' has no attribute {name!r}")
