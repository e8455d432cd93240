"""The expected band of each lesson's headline ratio, per GPU class: `gpulab/core/bands.toml`.

`load_bands()` reads and checks the file (every band names its metric and its source; a class or a
band that does not apply says why); `gpu_class(facts)` is 'tensor-core' (compute capability 7.0 and
newer), one of the classes that narrow it ('power-capped', 'geforce', 'pre-ampere': their rates differ from a
data-centre part's), 'pre-volta' or 'cpu'. `gpulab bench` judges each headline against its class's band (keyed by
the lesson, "13"); a lesson's other self-checks judged by class have bands keyed "LL.name" ("13.peak"), which
only the notebook reads.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from gpulab.core.device import device_facts


REQUIRED_CLASSES = ("tensor-core", "pre-volta", "cpu")
# Narrower classes a bands file may add, each with the class it narrows. One takes every band of that class
# except those it sets itself (`inherits` in its table; a band it sets must measure the same metric), and a
# file without it judges those GPUs by that class. Each exists because its 16-bit / fp32 rates differ from a
# data-centre part's (gpulab.core.specs: `half_ratio_range`):
# - power-capped: a board under specs.POWER_CAPPED_W (T4, L4) holds well under its datasheet's 16-bit rate;
# - geforce: 16-bit products with fp32 accumulation at half the rate, 2-4x fp32;
# - pre-ampere: Volta and Turing (compute capability 7.x), no TF32 and no native bf16.
OPTIONAL_CLASSES = {"power-capped": "tensor-core", "geforce": "tensor-core", "pre-ampere": "tensor-core"}
CLASSES = REQUIRED_CLASSES + tuple(OPTIONAL_CLASSES)


BANDS_PATH = Path(__file__).with_name("bands.toml")


# -- bands ------------------------------------------------------------------------------------
# What a band's ratio is of. A "time" ratio is this GPU's speed, so it is not judged under a GPU profile (the
# timings are the real GPU's); a "memory" ratio is set by the model's shape and the allocator, the same on
# the emulated class, and is judged there too.
MEASURES = ("time", "memory")


class BandsError(ValueError):
    """The bands file is missing something or says something impossible."""


@dataclass(frozen=True)
class Band:
    gpu_class: str
    lesson: str
    metric: str
    low: float
    high: float
    source: str
    applies: bool = True
    why: str = ""               # why the band does not apply (applies=False)
    measures: str = "time"      # what the ratio is of: "time" (this GPU's speed) or "memory" (the model's bytes)


@dataclass(frozen=True)
class Bands:
    path: str
    classes: dict[str, dict[str, Any]]          # class -> its settings (applies, why, source, description)
    bands: dict[str, dict[str, Band]]           # class -> lesson -> band

    def band(self, gpu_class: str, lesson: str) -> Band | None:
        if gpu_class not in self.bands and gpu_class in OPTIONAL_CLASSES:
            gpu_class = OPTIONAL_CLASSES[gpu_class]
        return self.bands.get(gpu_class, {}).get(lesson)

    def settings(self, gpu_class: str) -> dict[str, Any]:
        """The class's own settings (applies, why, description), or those of the class it narrows."""
        if gpu_class not in self.classes and gpu_class in OPTIONAL_CLASSES:
            gpu_class = OPTIONAL_CLASSES[gpu_class]
        return self.classes.get(gpu_class, {})


def _toml():
    try:
        import tomllib
    except ModuleNotFoundError:          # Python 3.10
        import tomli as tomllib
    return tomllib


def load_bands(path: str | os.PathLike | None = None) -> Bands:
    """Read and check a bands file (default: gpulab/bands.toml); BandsError says what is wrong."""
    path = Path(path) if path is not None else BANDS_PATH
    tomllib = _toml()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise BandsError(f"bands file {path}: cannot be read ({err.strerror or err})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise BandsError(f"bands file {path}: not valid TOML ({err})") from None
    classes, bands = {}, {}
    for cls in CLASSES:
        table = data.get(cls)
        if table is None and cls in OPTIONAL_CLASSES:
            continue
        if not isinstance(table, dict):
            raise BandsError(f"bands file {path}: no [{cls}] table (classes: {', '.join(CLASSES)})")
        settings = {k: v for k, v in table.items() if not isinstance(v, dict)}
        if not isinstance(settings.get("applies", True), bool):
            raise BandsError(f"bands file {path}: [{cls}] applies must be true or false")
        if settings.get("applies", True) is False and not str(settings.get("why", "")).strip():
            raise BandsError(f"bands file {path}: [{cls}] does not apply, so it needs a 'why'")
        classes[cls] = settings
        bands[cls] = {}
        for lesson, raw in table.items():
            if isinstance(raw, dict):
                bands[cls][lesson] = _band(path, cls, lesson, raw)
    for cls, parent in OPTIONAL_CLASSES.items():
        if cls in classes:
            if classes[cls].get("inherits") != parent:
                raise BandsError(f"bands file {path}: [{cls}] needs inherits = \"{parent}\" (it narrows that class)")
            for lesson, b in bands[cls].items():
                if lesson in bands[parent] and b.metric != bands[parent][lesson].metric:
                    raise BandsError(f"bands file {path}: [{cls}.{lesson}] measures '{b.metric}', but the class it "
                                     f"narrows measures '{bands[parent][lesson].metric}': the same ratio, or none")
            bands[cls] = {**{k: dataclasses.replace(b, gpu_class=cls, source=f"as [{parent}]: {b.source}")
                             for k, b in bands[parent].items()}, **bands[cls]}
    extra = sorted(set(data) - set(CLASSES))
    if extra:
        raise BandsError(f"bands file {path}: unknown class(es) {', '.join(extra)} (classes: {', '.join(CLASSES)})")
    return Bands(str(path), classes, bands)


def _band(path: Path, cls: str, lesson: str, raw: dict) -> Band:
    where = f"bands file {path}: [{cls}.{lesson}]"
    metric, source = raw.get("metric"), raw.get("source")
    if not isinstance(metric, str) or not metric.strip():
        raise BandsError(f"{where} needs a 'metric'")
    if not isinstance(source, str) or not source.strip():
        raise BandsError(f"{where} needs a 'source': where the band comes from")
    applies = raw.get("applies", True)
    if not isinstance(applies, bool):
        raise BandsError(f"{where} applies must be true or false")
    measures = raw.get("measures", "time")
    if measures not in MEASURES:
        raise BandsError(f"{where} measures must be one of {', '.join(MEASURES)}, not {measures!r}")
    if not applies:
        why = raw.get("why")
        if not isinstance(why, str) or not why.strip():
            raise BandsError(f"{where} does not apply, so it needs a 'why'")
        return Band(cls, lesson, metric, -math.inf, math.inf, source, False, why, measures)
    low, high = raw.get("low"), raw.get("high")
    for name, v in (("low", low), ("high", high)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v):
            raise BandsError(f"{where} needs a number '{name}' (use -inf or inf for no bound)")
    if low > high:
        raise BandsError(f"{where} low {low} > high {high}")
    if math.isinf(low) and math.isinf(high):
        raise BandsError(f"{where} bounds nothing: give low or high (or applies = false and a why)")
    return Band(cls, lesson, metric, float(low), float(high), source, True, "", measures)


def gpu_class(facts=None) -> str:
    """This device's class, from its facts (under a GPU profile the profile's: its compute capability, name
    and datasheet): 'cpu'; 'pre-volta' (below compute capability 7.0: no Tensor Cores); 'power-capped' (a
    board in gpulab.core.specs under POWER_CAPPED_W, a T4 or an L4: the power limit, not the architecture,
    sets its 16-bit rate); 'geforce' (a consumer Tensor-Core card: 16-bit products with fp32 accumulation at
    half rate); 'pre-ampere' (Volta or Turing: no TF32, no native bf16); else 'tensor-core'. The first that
    fits wins: a T4 is power-capped and Turing, and its power limit moves its ratios most."""
    facts = facts or device_facts()
    if facts.kind != "cuda" or facts.compute_capability is None:
        return "cpu"
    cc = tuple(facts.compute_capability)
    if cc < (7, 0):
        return "pre-volta"
    if facts.datasheet is not None and facts.datasheet.power_capped:
        return "power-capped"
    if facts.geforce:
        return "geforce"
    if cc < (8, 0):
        return "pre-ampere"
    return "tensor-core"


def judged_low(band: "Band", module=None) -> tuple[float | None, str]:
    """The low end a measurement is judged against: the band's, or lower where the lesson's module has a
    `band_floor()` (this machine's own prediction: lesson 03 its CPU cores, lesson 05 its memcpy against its
    link) that is lower; with the reason it was lowered ("" if not). One rule for `gpulab bench` and the
    notebooks' `lesson.expect_band`. A `band_floor()` of None says this machine cannot show the effect at all
    (lesson 03 on one physical core): the low end is then None and the reason says why, and the check is
    skipped, not passed."""
    floor = getattr(module, "band_floor", None) if module is not None else None
    if floor is None:
        return band.low, ""
    predicted, why = floor()
    if predicted is None:
        return None, why
    if predicted < band.low:
        return predicted, f"low end lowered from {band.low:g}: {why}"
    return band.low, ""

