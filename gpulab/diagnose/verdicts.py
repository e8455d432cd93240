"""A verdict and how it is judged: `Verdict` (what a rule found, what fixing it would buy, its Amdahl bound),
`verdict` (one made from a rule's share), `judge_gain` and `demote` (a fix measured against its promise). The rules
(`rules.py`, `kernel_rules.py`) make them; the ranking reads them."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

# Two verdicts expected to buy within this much of each other are ranked by how small their fix is
# (FIX_ORDER): a judgement on the timings' own spread (a few percent).
TIE = 0.02


@dataclass(frozen=True)
class Verdict:
    """A fired rule: the bottleneck, where the course teaches it, what its fix is expected to buy, what it
    can buy at most, and (after `confirm`) what a run of the fixed variant measured."""

    rule: str
    bottleneck: str           # a human name
    lesson: str               # "03"
    share: float              # the most of the step the fix can remove (0..1)
    bound: float              # 1 / (1 - share): the most the step can speed up
    evidence: str             # the numbers that fired it, and the user's lines they came from
    fix: str                  # what to change, one line
    actionable: bool = True   # False for "compute_bound" and a memory warning: no speed to win
    expected: float = -1.0    # the share the fix is expected to remove (-1: the same as share)
    blocked_by: str = ""      # the rule whose fix must come first (this one cannot work until then)
    measured: float | None = None   # the speed-up a run of the fixed variant measured (confirm.py)
    confirmation: str = ""    # how it was measured, or why it was not
    demoted: bool = False     # saved under half the expected saving when measured: marked, ranked by what it measured

    @property
    def expected_share(self) -> float:
        return self.share if self.expected < 0 else self.expected

    @property
    def expected_gain(self) -> float:
        s = self.expected_share
        return 1.0 / (1.0 - s) if s < 1.0 else math.inf

    @property
    def gain(self) -> float:
        """What ranks it: the measured speed-up where a variant was run, else the expected one."""
        return self.measured if self.measured is not None else self.expected_gain

    def to_dict(self) -> dict:
        """Plain values; an infinite gain (a share of 1) becomes None."""
        out = asdict(self)
        finite = lambda x: x if x is None or math.isfinite(x) else None      # noqa: E731
        out.update(bound=finite(self.bound), expected=self.expected_share, expected_gain=finite(self.expected_gain),
                   gain=finite(self.gain))
        return out


def verdict(rule: str, bottleneck: str, lesson: str, share: float, evidence: str, fix: str,
            actionable: bool = True, expected: float | None = None, blocked_by: str = "") -> Verdict:
    """A Verdict with its Amdahl bound: a step that loses `share` of its time runs 1 / (1 - share) faster."""
    share = min(max(share, 0.0), 1.0)
    bound = 1.0 / (1.0 - share) if share < 1.0 else float("inf")
    expected = share if expected is None else min(max(expected, 0.0), share)
    return Verdict(rule, bottleneck, lesson, share, bound, evidence, fix, actionable, expected, blocked_by)


def pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def evidence_lines(rows, n: int = 3) -> str:
    return "; ".join(rows[:n])


# -- a fix against its promise -----------------------------------------------------------------------
# A fix must save at least this share of what its verdict promised (issue 17).
PROMISE_KEPT_MIN = 0.5
# The gain may exceed the bound by the step timings' own spread (before + after, relative), and by at
# least this floor: a judgement, since three chunks of a few steps on the host clock rarely repeat closer.
NOISE_FLOOR = 0.01


def judge_gain(before_ms: float, after_ms: float, bound: float | None, spread_before: float = 0.0,
               spread_after: float = 0.0) -> dict:
    """A fix's measured gain against a promised speed-up (its verdict's bound or expected gain; None: no
    bound, infinite), from two unprofiled step times and their relative spreads. In time: `promised_ms` =
    before - before / bound (what the promise allowed the fix to save), `saved_ms` = before - after,
    `of_promised` their ratio. `within`: it saved at most the promise, give or take the steps' spread (the
    ratio before / after magnifies a small error in `after` when the promise is most of the step);
    `enough`: it saved at least PROMISE_KEPT_MIN of the promise; `of_promised_max`: the largest
    `of_promised` still within."""
    bound = math.inf if bound is None else bound
    promised = before_ms - before_ms / bound
    saved = before_ms - after_ms
    noise = max(spread_before + spread_after, NOISE_FLOOR)
    of_promised = saved / promised if promised > 0 else math.inf
    return {"speedup": before_ms / after_ms, "bound": bound, "promised_ms": promised, "saved_ms": saved,
            "of_promised": of_promised, "noise": noise,
            "of_promised_max": 1 + noise * before_ms / promised if promised > 0 else math.inf,
            "within": saved <= promised + noise * before_ms, "enough": of_promised >= PROMISE_KEPT_MIN}


def demote(v: Verdict, measured: float, why: str, step_ms: float | None = None, noise_ms: float = 0.0) -> Verdict:
    """`v` with a measured gain: demoted when it saved under PROMISE_KEPT_MIN of what it was expected to, and,
    given the step's time and its timings' spread (`noise_ms`: before's and after's spreads together), only when
    what it fell short by is more than that spread: a shortfall within the steps' own spread measures nothing
    (notebook 15 once demoted a fix on 6 ms saved against a 6.4 ms spread)."""
    kept = (1 - 1 / measured) / v.expected_share if v.expected_share > 0 else math.inf
    low = kept < PROMISE_KEPT_MIN
    note = why
    if low and step_ms is not None:
        short_ms = step_ms * (v.expected_share - (1 - 1 / measured))
        if short_ms <= noise_ms:
            low = False
            note += (f"; not demoted: it saved {kept:.0%} of the expected {pct(v.expected_share)}, but the "
                     f"{short_ms:.3g} ms it fell short by is within the steps' spread ({noise_ms:.3g} ms)")
    if low:
        note += f"; demoted: it saved {kept:.0%} of the expected {pct(v.expected_share)}"
    return replace(v, measured=measured, confirmation=note, demoted=low)
