"""This device's ceilings, as notebook 00 recorded them, read back for later lessons.

`ceilings()` returns the newest measurement of each ceiling (made under the same GPU profile, or none) (`CEILING_NAMES`: matmul TFLOP/s per
precision, device-copy and host<->device GB/s) from the results store, full-size runs first, and a
datasheet figure (`core.specs`) only where nothing was measured. The measurements themselves are
lesson 00's (`gpulab.lessons.l00_gpu_ceilings`). A ceiling is a rate, so a zero or negative
measurement (a broken or hand-edited store) is never used as one: the newest positive one is.
"""
from __future__ import annotations

from dataclasses import dataclass
from gpulab.core.device import device_facts
from gpulab.core.profiles import active_profile
from gpulab.core.results import Record, ResultsStore, current_gpu_name, record_profile, results_store


@dataclass(frozen=True)
class Ceiling:
    name: str
    value: float
    unit: str
    source: str   # "measured <time> (<scale>)" or "datasheet: ..."


CEILING_NAMES = {
    **{f"matmul_{p}": "TFLOP/s" for p in ("fp32", "tf32", "fp16", "bf16")},
    "copy_bandwidth": "GB/s", "read_bandwidth": "GB/s", "write_bandwidth": "GB/s",
    "h2d_pageable": "GB/s", "h2d_pinned": "GB/s", "d2h_pageable": "GB/s", "d2h_pinned": "GB/s",
}


def ceilings(store: ResultsStore | None = None) -> dict[str, Ceiling]:
    """This device's ceilings for later lessons: the newest measurement from notebook 00,
    preferring full-size runs; a datasheet figure only where nothing was measured (and never under a
    GPU profile, whose datasheet is not this GPU's)."""
    store = store or results_store()
    gpu = current_gpu_name()
    profile = active_profile()
    key = profile.key if profile else None

    def newest(name: str, scale: str | None) -> Record | None:
        # only records made the same way: under this profile (its precisions), or without one
        usable = [r for r in store.records(lesson="00", name=name, gpu=gpu, scale=scale)
                  if r.value > 0 and record_profile(r) == key]
        return usable[-1] if usable else None

    out: dict[str, Ceiling] = {}
    for name, unit in CEILING_NAMES.items():
        rec = newest(name, "full") or newest(name, None)
        if rec is not None:
            out[name] = Ceiling(name, rec.value, unit, f"measured {rec.time} ({rec.scale})")
    facts = device_facts()
    # Under a GPU profile the datasheet is the emulated card's while every timing is this GPU's: a
    # measured figure compares like with like, the profile's datasheet would not.
    sheet = None if facts.profile else facts.datasheet
    if sheet is not None:
        fallback = {"matmul_fp32": sheet.fp32, "matmul_tf32": sheet.tf32, "matmul_fp16": sheet.fp16,
                    "matmul_bf16": sheet.bf16, "copy_bandwidth": sheet.mem_gbps}
        for name, value in fallback.items():
            if name not in out and value is not None:
                out[name] = Ceiling(name, float(value), CEILING_NAMES[name],
                                    f"datasheet: {sheet.source}")
    return out
