"""gpulab.core.rates: the Amdahl model the bands, notebook 06's checks and its text share, and the rate a printed
prediction divides by (this GPU's ceilings, or a profile's datasheet: never another GPU's)."""
import dataclasses
import math

import pytest

import gpulab.core.ceilings as C
from gpulab.core import rates as R
from gpulab.core.ceilings import Ceiling
from gpulab.core.device import facts_for_capability


def test_the_floor_and_the_ceiling_bracket_every_share_of_the_step():
    for r in (1.5, 2.0, 4.0, 8.0, 14.8):
        floor, most = R.speedup_floor(r, cap=math.inf), R.speedup_ceiling(r)
        for s in (R.PRODUCT_SHARE_MIN, 0.75, R.PRODUCT_SHARE_MAX):
            for rest in (1.0, R.HALF_BYTES_GAIN):
                assert floor - 1e-12 <= 1 / ((1 - s) / rest + s / r) <= most + 1e-12, (r, s, rest)
    assert R.speedup_ceiling(2.0) == pytest.approx(2.0)          # a GeForce card: products and bytes both 2x
    assert R.speedup_floor(2.0) == pytest.approx(1 / (0.4 + 0.3))
    with pytest.raises(ValueError):
        R.speedup_ceiling(0.0)


def test_lesson_ranges():
    assert (R.lesson_floor("00", 8.0), R.lesson_most("00", 8.0)) == (8.0, 8.0)
    assert R.lesson_floor("07", 8.0) is None and R.lesson_most("07", 8.0) == 8.0
    assert R.lesson_most("13", 2.0) > R.lesson_most("06", 2.0)     # fusion adds to what 16-bit bytes give
    with pytest.raises(KeyError):
        R.lesson_floor("11", 2.0)


def _ceilings(**tflops):
    return lambda store=None: {f"matmul_{p}": Ceiling(f"matmul_{p}", v, "TFLOP/s", "measured 2026-12-03 (full)")
                               for p, v in tflops.items()}


def test_a_prediction_divides_by_this_gpus_measured_ceiling(monkeypatch):
    monkeypatch.setattr(C, "ceilings", _ceilings(bf16=700.0))
    rate, source = R.matmul_rate("bf16", facts_for_capability("NVIDIA H200", 9, 0))
    assert rate == 700.0 and source.startswith("this GPU's bf16 ceiling, measured")


def test_under_a_profile_without_a_measurement_the_profiles_datasheet_says_so(monkeypatch):
    """Issue 40: notebook 11 predicted with the H200's datasheet on every GPU; under the t4 profile it is the T4's,
    at the rate a 70 W board holds at its power limit, and it says the timings are this machine's."""
    monkeypatch.setattr(C, "ceilings", _ceilings())
    t4 = dataclasses.replace(facts_for_capability("Tesla T4", 7, 5), profile="t4", emulated_on="NVIDIA H200")
    rate, source = R.matmul_rate("fp16", t4)
    assert rate == pytest.approx(24.0) and "t4 profile's datasheet" in source and "power limit" in source
    assert R.matmul_rate("fp32", t4)[0] == 8.1
    none, why = R.matmul_rate("bf16", facts_for_capability("NVIDIA GeForce RTX 9999", 12, 0))
    assert none is None and "run notebook 00" in why
