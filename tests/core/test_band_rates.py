"""No class's band judges a GPU by another class's rates: for every GPU in gpulab.core.specs, the band of
its own class admits the ratios its own datasheet implies, and the low end it is judged against (the
class's, lowered by the lesson's `band_floor`) sits below them."""
import math

import pytest

from gpulab.core.bands import judged_low, load_bands
from gpulab.core.specs import DATASHEETS
from gpulab.lessons import l00_gpu_ceilings as L00
from gpulab.lessons import l06_mixed_precision as L06

# A GPU running at this fraction of its datasheet ratio must not FAIL (a power cap, a shared card).
KEPT = 0.9


def _class(sheet) -> str:
    return "geforce" if "geforce" in sheet.model.lower() else "tensor-core"


def _ratio(sheet) -> float:
    return L00.datasheet_ratio(sheet.model, bf16=sheet.bf16 is not None)


@pytest.mark.parametrize("sheet", DATASHEETS, ids=lambda s: s.model)
def test_lesson_00_band_of_each_class_admits_its_own_datasheets(sheet, monkeypatch):
    band = load_bands().band(_class(sheet), "00")
    ratio = _ratio(sheet)
    assert band.low <= ratio <= band.high, (
        f"{sheet.model} ({_class(sheet)}): datasheet 16-bit / fp32 {ratio:.3g} is outside its class's band "
        f"[{band.low:g}, {band.high:g}]: the band was set from another class's rates")

    class Facts:
        name, bf16 = sheet.model, sheet.bf16 is not None
    monkeypatch.setattr(L00, "device_facts", lambda: Facts)
    low, _ = judged_low(band, L00)
    assert low <= KEPT * ratio, (f"{sheet.model}: judged against {low:.3g}, above {KEPT:g} of its datasheet "
                                 f"ratio {ratio:.3g}")


def test_a_band_set_from_other_rates_fails_the_check():
    """The check above can fail: the tensor-core band [4, 25] put on a GeForce card (2.0x on its datasheet)."""
    sheet = next(s for s in DATASHEETS if "4090" in s.model)
    wrong = load_bands().band("tensor-core", "00")
    assert not wrong.low <= _ratio(sheet) <= wrong.high


@pytest.mark.parametrize("sheet", DATASHEETS, ids=lambda s: s.model)
def test_lesson_06_floors_come_from_the_gpus_own_rates(sheet):
    """Notebook 06's 16-bit and TF32 speed-up floors, from each datasheet's own rates, are at most what those
    rates allow (Amdahl with PRODUCT_SHARE_MIN of the step in products), and TF32 at the fp32 rate (GeForce)
    asks for no speed-up at all."""
    half = (sheet.bf16 or sheet.fp16) / sheet.fp32
    floor = L06.speedup_floor(half)
    assert floor <= 1 / ((1 - L06.PRODUCT_SHARE_MIN) + L06.PRODUCT_SHARE_MIN / half) + 1e-12
    if sheet.tf32 is not None:
        tf32 = L06.speedup_floor(sheet.tf32 / sheet.fp32)
        assert tf32 <= sheet.tf32 / sheet.fp32 + 1e-12
        if math.isclose(sheet.tf32, sheet.fp32):
            assert tf32 == pytest.approx(1.0)
