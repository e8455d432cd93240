"""Two ratios of a step's model FLOP/s to a peak, one name each (notebook 13, section 8). MFU (PaLM, Chowdhery
et al. 2022, appendix B): over the datasheet's dense 16-bit peak (`mfu`, `datasheet_peak`). The fraction of
measured peak: over the 16-bit peak notebook 00 measured on this GPU (`peak_fraction`, `bf16_peak`)."""
from __future__ import annotations

from gpulab.core.ceilings import Ceiling, ceilings
from gpulab.core.device import DeviceFacts, device_facts
from gpulab.lessons.capstone.runner import JobResult
from gpulab.models import precision as P


# -- model FLOPs utilization, and the fraction of measured peak -------------------------------------------
# Two ratios, one name each. MFU (PaLM, Chowdhery et al. 2022, appendix B): model FLOP/s over the theoretical
# peak, the datasheet's dense 16-bit rate. The fraction of measured peak: model FLOP/s over the 16-bit peak notebook
# 00 measured on this GPU (the best of its sweep over shapes), what this GPU's products really reach.
def bf16_peak(store=None) -> Ceiling | None:
    """The 16-bit matrix-product peak notebook 00 measured on this GPU (bf16, fp16 on a GPU without bf16), which
    the fraction of measured peak divides by; None if it has not measured one (a datasheet figure is MFU's)."""
    found = ceilings(store)
    peak = found.get("matmul_bf16") or found.get("matmul_fp16")
    return peak if peak is not None and peak.source.startswith("measured") else None


def peak_is_measured(peak: Ceiling | None) -> bool:
    """True for a peak notebook 00 measured at full size on this GPU (not at the tiny size)."""
    return peak is not None and peak.source.startswith("measured") and "(full)" in peak.source


def datasheet_peak(facts: DeviceFacts | None = None) -> float | None:
    """This GPU's datasheet dense 16-bit TFLOP/s (bf16 where native, else fp16), which MFU divides by; None on
    the CPU, under a GPU profile (its datasheet is not the GPU running it) or for a GPU not in the table."""
    facts = facts or device_facts()
    sheet = None if facts.profile or not facts.on_gpu else facts.datasheet
    return getattr(sheet, P.best_half(facts), None) if sheet is not None else None


def _tflops(tflops: float | JobResult | None) -> float | None:
    return tflops.tflops if isinstance(tflops, JobResult) else tflops


def peak_fraction(tflops: float | JobResult | None, peak: Ceiling | None) -> float | None:
    """The fraction of measured peak: model TFLOP/s over notebook 00's measured 16-bit peak (`bf16_peak`), a
    fraction; None without both. Not MFU, which divides by the datasheet's."""
    tflops = _tflops(tflops)
    if tflops is None or peak is None or peak.value <= 0:
        return None
    return tflops / peak.value


def mfu(tflops: float | JobResult | None, sheet_tflops: float | None) -> float | None:
    """Model FLOPs utilization as PaLM defines it: model TFLOP/s over the datasheet's dense 16-bit TFLOP/s
    (`datasheet_peak`), a fraction; None without both."""
    tflops = _tflops(tflops)
    if tflops is None or not sheet_tflops:
        return None
    return tflops / sheet_tflops
