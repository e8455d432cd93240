"""gpulab: the helper package of the gpulab course.

    device    which device, its facts, the size switch (GPULAB_SCALE)
    timing    benchmark(): the one timing function
    memory    allocator readings, peak tracking, the memory guard
    monitor   NVML sampler of GPU busy %, memory, clocks, PCIe, power
    plots     one plotting style for the course
    widgets   the experiment panel and the live monitor
    results   the results store (JSON, survives restarts)
    ceilings  notebook 00's measurements, read back by later lessons
    fragmentation  notebook 02's allocator pattern, in a fresh process per setting
    workloads models and data the lessons train (transformer, GPT, CNN)
    precision fp32/TF32/fp16/bf16 switches and the AMP step (06, 07)
    occupancy SM limits, the occupancy calculator, Triton kernels (04)
    fusion    byte counts and the memory floor of lesson 12
    data      lesson 03's dataset (importable by DataLoader workers)
    transfers lesson 05's host<->device copies at any size
    streams   lesson 08's overlap and per-stream timelines
    graphs    lesson 11's CUDA graph capture
    capstone  lesson 13's two jobs, every toggle, the waterfall and MFU
    distributed  lesson 14's multi-process experiments (torchrun, NCCL or gloo)
    bench     `gpulab bench`: each lesson's headline comparison, judged against bands.toml
    room      merge a room of learners' results into one table and chart
    coursetime  where a course run's time went (GPULAB_TIMINGS), per notebook
    lesson    notebook template helpers (start, self-checks, "What you saw")
    specs     architecture table and datasheet peaks (fallback only)
    cli       `gpulab doctor`, `bench`, `room`, `report`
"""
from gpulab.core.device import by_scale, device_facts, pick_device, scale, sync
from gpulab.core.memory import fmt_bytes, memory_guard, memory_now, track_peak
from gpulab.core.results import results_store
from gpulab.core.timing import Timing, benchmark

__version__ = "0.1.0"

__all__ = [
    "Timing", "benchmark", "by_scale", "device_facts", "fmt_bytes", "memory_guard",
    "memory_now", "pick_device", "results_store", "scale", "sync", "track_peak",
]
