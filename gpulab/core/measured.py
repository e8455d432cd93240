"""What a lesson's headline measurement returns (`Measured`), and how it says it cannot run here
(`Skipped`). Each `gpulab.lessons.lNN_*.headline(scale)` returns one; notebooks and `gpulab bench` read it.
"""
from __future__ import annotations

from dataclasses import dataclass


class Skipped(Exception):
    """The experiment cannot run on this machine (e.g. it needs a CUDA GPU); the message says why."""


@dataclass(frozen=True)
class Measured:
    """What one headline experiment measured. `ratio` is defined as in the lesson's own self-check."""

    baseline: float
    optimized: float
    unit: str
    ratio: float
    correct: bool              # the optimized variant matched the baseline before it was timed
    check: str                 # what was checked, with the numbers
    baseline_label: str = "baseline"
    optimized_label: str = "optimized"
    notes: str = ""
