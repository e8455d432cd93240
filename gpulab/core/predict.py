"""How long a notebook takes on this GPU, said before it runs: its GPU work divided by this GPU's
ceilings (notebook 00's measurements), plus the host work that no GPU changes.

Each lesson module with a `plan(scale)` says what its notebook asks of the GPU at that scale:

- `Work(ceiling, amount, share, what)`: `amount` FLOPs (a matmul ceiling, TFLOP/s) or bytes (a
  bandwidth ceiling, GB/s) of fixed-count GPU work (warm-up steps, searches, loops of a set length),
  done at `share` of that ceiling (a plain large GEMM near 1, a training step about half);
- `host_s`: the seconds no GPU changes: the kernel's start-up and imports, torch.compile's
  compilation, the wall-clock budgets `benchmark(budget_s=...)` times for, CPU-side data work. It is
  the notebook's wall time on the reference run minus that run's predicted GPU work, and each plan
  names the run (`host_source`): a measurement of the host part, not a constant of any GPU.

`predict(plan)` adds them up against `ceilings()` (this GPU's measured figures);
`gpulab.notebook.lesson.start` prints the result in every notebook's first cell, beside the budget every notebook must keep on
every GPU the course supports (`BUDGET_S`). `datasheet_ceilings(profile)` gives a profile's rates from
its datasheet, derated by `DATASHEET_SHARE`, so a unit test can check each plan against the budget on
every profile before anyone owns that GPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

# Every notebook, on every GPU the course supports (tests/core/test_predict.py checks each plan on each
# profile's derated datasheet): a learner waits at most this long for one notebook's lesson, up to its graded
# exercise. The exercise is the learner's own wait, bounded by the grader's time limit (EXERCISE_S says how long it
# took); with it, 13 (the graded step and the speedrun's four training runs) took 507 s on an H100 and is
# predicted over this budget on every profile.
BUDGET_S = 600.0

# A measured ceiling is a share of the datasheet's: on the H200 (results/course/2026-11-30-h200-00-to-09-at-775ae4a/h200-2026-11-30-course.json)
# bf16 686 of 989 TFLOP/s (69 %), fp32 51 of 67 (76 %), device copy 4251 of 4800 GB/s (89 %); a 70 W
# T4 holds far less of its 65 TFLOP/s fp16. Half is the cautious figure the budget test derates by; a power-capped
# board's 16-bit rates take its sustained share instead (gpulab.core.specs.POWER_CAPPED_HALF_SHARE, 24 of 65).
DATASHEET_SHARE = 0.5

UNIT_SCALE = {"TFLOP/s": 1e12, "GB/s": 1e9}

# Where a class lacks a precision, the course runs its 16-bit work in fp16 where bf16 is missing (a T4, a
# V100), and skips its TF32 runs where there is no TF32 (before Ampere: `supported_precisions`, capstone's
# `refusal`), so that work costs nothing there. Only in `rates` given for a class (`datasheet_ceilings`,
# which leaves out what the class lacks): this GPU's own ceilings always name every precision it measured.
FALLBACK = {"matmul_bf16": "matmul_fp16"}

# Each notebook's graded exercise, in seconds: the cells from its first `exercise(...)` cell to the end of the graded
# section (show, check, hint; 13's speedrun). Host time, near the same on any GPU: a process
# forked, the correctness checks, then timing in turns until the ratios' spread is tight or the grader's 20 s budget
# is spent; the speedrun trains each of its four runs for about the baseline's wall-clock budget. Each lesson's
# host_s was measured before the exercises existed, except 13's, whose run stopped after its exercise's first cell
# (that cell is in 13's host_s, so not here). Measured on the whole-course run EXERCISE_SOURCE names (an H100);
# tests/core/test_predict.py holds every figure to that file.
EXERCISE_S = {"01": 12.2, "02": 11.7, "03": 36.6, "04": 14.7, "05": 16.0, "06": 14.0, "07": 11.1, "08": 15.8,
              "09": 13.2, "10": 13.8, "11": 12.7, "12": 9.4, "13": 188.0, "14": 20.3, "15": 21.5}
EXERCISE_SOURCE = "results/course/2026-12-06-h100-00-to-15/h100-2026-12-06-course-timings.tsv"
SKIPPED_WITHOUT = ("matmul_tf32",)


@dataclass(frozen=True)
class Work:
    """GPU work of a fixed count: `amount` FLOPs or bytes at `share` of the ceiling `ceiling`."""

    ceiling: str            # a name in gpulab.core.ceilings.CEILING_NAMES
    amount: float           # FLOPs (matmul_*) or bytes (the bandwidths)
    share: float = 1.0      # of the ceiling the work reaches
    what: str = ""
    job: str = ""           # the job whose batch it runs at, where the notebook caps that job's step (`StepCap`)
    # False: work a class without this precision skips (a bf16 run on a T4) rather than runs in FALLBACK's
    only_native: bool = False

    def __post_init__(self):
        if not 0 < self.share <= 1:
            raise ValueError(f"share must be in (0, 1], got {self.share}")
        if self.amount < 0:
            raise ValueError(f"amount must be >= 0, got {self.amount}")


@dataclass(frozen=True)
class StepCap:
    """A notebook that lowers a job's batch until one reference step of it (`amount` FLOPs at `share` of
    `ceiling`) takes at most `seconds` on this GPU (lesson 13's `Runs.fit_batches`): every Work of that job
    shrinks by the same factor, min(1, seconds / the step's time). The notebook halves the batch, so this
    continuous factor is an upper bound of what it keeps."""

    ceiling: str
    amount: float
    share: float
    seconds: float

    def factor(self, rate: float) -> float:
        step = self.amount / (self.share * units_per_second(self.ceiling, rate))
        return min(1.0, self.seconds / step) if step > 0 else 1.0


@dataclass(frozen=True)
class Plan:
    """What one notebook's run costs at one scale."""

    host_s: float
    work: Sequence[Work] = field(default_factory=tuple)
    host_source: str = ""
    caps: Mapping[str, StepCap] = field(default_factory=dict)    # job -> its step's time cap


@dataclass(frozen=True)
class Prediction:
    seconds: float | None       # host + GPU; None when a ceiling the work needs is unknown
    host_s: float
    gpu_s: float | None
    missing: tuple[str, ...]    # ceilings the work needs that are not known here
    budget_s: float = BUDGET_S
    exercise_s: float = 0.0     # the graded exercise's part of host_s (EXERCISE_S)

    @property
    def lesson_s(self) -> float | None:
        """The lesson's cells, up to its graded exercise: what BUDGET_S bounds."""
        return None if self.seconds is None else self.seconds - self.exercise_s

    def line(self) -> str:
        graded = (f" Its graded exercise then takes about {self.exercise_s:.0f} s more (host time, measured on the "
                  f"course's reference run)." if self.exercise_s else "")
        if self.seconds is None:
            return (f"Predicted time: unknown (no ceiling for {', '.join(self.missing)}: run notebook 00 first); "
                    f"host work alone about {self.host_s - self.exercise_s:.0f} s.{graded}")
        verdict = "within" if self.lesson_s <= self.budget_s else "OVER"
        return (f"Predicted time on this GPU: about {self.lesson_s:.0f} s up to the graded exercise (GPU work "
                f"{self.gpu_s:.0f} s at this GPU's ceilings, host work {self.host_s - self.exercise_s:.0f} s); "
                f"{verdict} the course's {self.budget_s:.0f} s per notebook.{graded}")


def units_per_second(ceiling_name: str, value: float) -> float:
    """FLOP/s or bytes/s of a ceiling given in its unit (TFLOP/s or GB/s)."""
    from gpulab.core.ceilings import CEILING_NAMES
    return value * UNIT_SCALE[CEILING_NAMES[ceiling_name]]


def predict(plan: Plan, rates: Mapping[str, float] | None = None, *, exercise_s: float = 0.0) -> Prediction:
    """Seconds `plan` takes: host_s (+ `exercise_s`, the notebook's graded exercise: `EXERCISE_S`) + each Work's
    amount / (share x its ceiling), times its job's `StepCap` factor where the plan caps that job's step. `rates`
    maps ceiling names to values in their units (TFLOP/s, GB/s); default: this GPU's (`ceilings()`)."""
    if rates is None:
        from gpulab.core.ceilings import ceilings
        rates = {name: c.value for name, c in ceilings().items()}
    gpu, missing = 0.0, []
    factors = {}
    for job, cap in plan.caps.items():
        if rates.get(cap.ceiling):
            factors[job] = cap.factor(rates[cap.ceiling])
        elif cap.ceiling not in missing:
            missing.append(cap.ceiling)
    for w in plan.work:
        rate = rates.get(w.ceiling)
        if rate is None and (w.ceiling in SKIPPED_WITHOUT or w.only_native) and "matmul_fp32" in rates:
            continue           # a class with fp32 but no TF32 (or without this precision, for `only_native` work) skips it
        if rate is None and w.ceiling in FALLBACK:
            rate = rates.get(FALLBACK[w.ceiling])
        if rate is None or rate <= 0:
            if w.ceiling not in missing:
                missing.append(w.ceiling)
            continue
        gpu += factors.get(w.job, 1.0) * w.amount / (w.share * units_per_second(w.ceiling, rate))
    host = plan.host_s + exercise_s
    if missing:
        return Prediction(None, host, None, tuple(missing), exercise_s=exercise_s)
    return Prediction(host + gpu, host, gpu, (), exercise_s=exercise_s)


def datasheet_ceilings(profile) -> dict[str, float]:
    """A profile's rates from its datasheet (and PCIe link), times DATASHEET_SHARE: what the budget test
    predicts with. Precisions the class lacks are absent; a plan needing them on that class would
    not run that work there, so the plan itself must leave it out."""
    from gpulab.core.specs import POWER_CAPPED_HALF_SHARE, datasheet_for, pcie_peak_gbps
    sheet = datasheet_for(profile.name)
    # a power-capped board (a T4, an L4) holds a smaller share of its 16-bit peak than DATASHEET_SHARE under a long
    # product: its sustained share (gpulab.core.specs.POWER_CAPPED_HALF_SHARE), the rate its class's bands use
    half_share = min(1.0, POWER_CAPPED_HALF_SHARE / DATASHEET_SHARE) if sheet.power_capped else 1.0
    rates = {"matmul_fp32": sheet.fp32, "matmul_tf32": sheet.tf32,
             "matmul_fp16": sheet.fp16 and sheet.fp16 * half_share,
             "matmul_bf16": sheet.bf16 and sheet.bf16 * half_share, "copy_bandwidth": sheet.mem_gbps}
    link = pcie_peak_gbps(profile.pcie_generation, 16)
    rates.update({name: link for name in ("h2d_pinned", "d2h_pinned")})
    # pageable copies go through a staging buffer at a fraction of the link (H200: 9 of 55 GB/s)
    rates.update({name: link / 6 for name in ("h2d_pageable", "d2h_pageable")})
    return {k: v * DATASHEET_SHARE for k, v in rates.items() if v is not None}
