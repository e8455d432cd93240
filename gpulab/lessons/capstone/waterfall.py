"""Notebook 13's waterfalls and the batch ladder. `waterfall` adds toggles one at a time, each row checked and
timed (`Runs.checked`); `attribute` gives each row's share of the total speed-up (in log space, so the shares add
to 100 %) and of the memory saved; `step_rows`, `step_notes`, `accumulation_notes` and `waterfall_figure` show them.
`batch_ladder` runs a step at larger batches and predicts the last from the line through the first two
(`step_line`); `ladder_rows` shows it."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from gpulab.core.ceilings import Ceiling
from gpulab.core.device import DeviceFacts, device_facts
from gpulab.lessons.capstone import checks as K
from gpulab.lessons.capstone.jobs import state_bytes
from gpulab.lessons.capstone.options import ORDERS, Options, problem
from gpulab.lessons.capstone.peaks import mfu, peak_fraction
from gpulab.lessons.capstone.runner import JobResult
from gpulab.lessons.capstone.runs import TIERS, Checked, Runs
from gpulab.models import precision as P


# -- the waterfall -----------------------------------------------------------------------------------
@dataclass
class Step:
    """One row of a waterfall: a toggle added to the options of the row before."""

    label: str
    options: Options
    checked: Checked
    speedup: float | None = None         # throughput / the first row's
    gain: float | None = None            # throughput / the previous counted row's
    share_pct: float | None = None       # share of the total speed-up, log space
    memory_saved: int | None = None      # peak bytes: previous counted row's minus this one's
    memory_share_pct: float | None = None

    @property
    def status(self) -> str:
        return self.checked.status

    @property
    def result(self) -> JobResult | None:
        return self.checked.result

    @property
    def counted(self) -> bool:
        return self.checked.counted


def waterfall(job: str, order: Sequence[str] | None = None, runs: Runs | None = None, base: Options = Options(),
              batch: int | None = None, facts: DeviceFacts | None = None, half: str | None = None,
              backend: str | None = None, monitor: bool = False) -> list[Step]:
    """Start from `base` and add each toggle of `order` in turn (cumulative), one run per row.

    A toggle this device or job cannot take is a "skipped: why" row and is not kept; a run that does not
    train the same model as its fp32 reference (`Runs.checked`) is a "mismatch" row: its time is not counted
    and its toggle is not kept. With `monitor`, every row's GPU busy % is sampled while it is timed (NVML;
    `accumulation_notes` reads it). Then `attribute` fills in speed-ups and shares.
    """
    runs = runs or Runs()
    facts = facts or device_facts()
    half = half or P.best_half(facts)
    order = ORDERS[job] if order is None else tuple(order)
    batch = runs.batch(job, batch)
    first = runs.checked(job, base, batch, monitor=monitor)
    steps = [Step("baseline" if base == Options() else base.label, base, first)]
    current = base
    for toggle in order:
        candidate = current.adding(toggle, half)
        why = problem(job, candidate, batch, facts, backend)
        if why:
            steps.append(Step(f"+ {toggle}", candidate, Checked(None, f"skipped: {why}")))
            continue
        c = runs.checked(job, candidate, batch, monitor=monitor)
        steps.append(Step(f"+ {toggle}", candidate, c))
        if c.counted:
            current = candidate
    return attribute(steps)


def attribute(steps: list[Step]) -> list[Step]:
    """Fill in each counted row's speed-up, gain and share of the total speed-up and memory saved.

    Shares of speed are taken in log space: with gains g_i from one counted row to the next, the total
    is their product, so log g_i / log total add up to 100% (a row that slows things down has a negative
    share). Memory shares are plain differences of peak memory over the total difference. A share is None
    where the total is too close to 1 (or 0 bytes) to divide by.
    """
    counted = [s for s in steps if s.counted and s.result is not None and s.result.items_per_s]
    if not counted:
        return steps
    base_rate = counted[0].result.items_per_s
    total = counted[-1].result.items_per_s / base_rate
    peaks = [s.result.peak_bytes for s in counted]
    have_memory = all(p is not None for p in peaks)
    memory_total = peaks[0] - peaks[-1] if have_memory else None
    previous = None
    for s in counted:
        rate = s.result.items_per_s
        s.speedup = rate / base_rate
        if previous is None:
            previous = s
            continue
        s.gain = rate / previous.result.items_per_s
        s.share_pct = 100 * math.log(s.gain) / math.log(total) if abs(math.log(total)) > 1e-9 else None
        if have_memory:
            s.memory_saved = previous.result.peak_bytes - s.result.peak_bytes
            s.memory_share_pct = 100 * s.memory_saved / memory_total if memory_total else None
        previous = s
    return steps


def fastest(steps: Sequence[Step]) -> Step:
    """The counted row with the highest throughput."""
    counted = [s for s in steps if s.counted and s.result is not None and s.result.items_per_s]
    if not counted:
        raise ValueError("no counted rows")
    return max(counted, key=lambda s: s.result.items_per_s)


# -- a bigger batch: the per-step part amortized -------------------------------------------------------
LADDER = (4, 8)          # the batches `batch_ladder` adds: these multiples of the waterfall's batch
LADDER_TOLERANCE = 0.15  # a predicted row's measured time within this share of the line's prediction


@dataclass
class LadderRow:
    """One batch of `batch_ladder`: its run (None where it did not run, with `why`), the time the line through
    the rows before it predicted (None for the rows that draw the line), and the memory it was expected to take."""

    batch: int
    result: JobResult | None
    predicted_ms: float | None = None
    predicted_bytes: float | None = None
    why: str = ""

    @property
    def ratio(self) -> float | None:
        """Measured over predicted step time (None without both)."""
        if self.result is None or self.result.step_ms is None or not self.predicted_ms:
            return None
        return self.result.step_ms / self.predicted_ms


def step_line(rows: Sequence[LadderRow]) -> tuple[float, float] | None:
    """(ms per step, ms per sample) of the line t(B) = per_step + B x per_sample through the first two rows
    that ran: a step's time is a part that does not grow with the batch (AdamW reading and writing every
    weight, its gradient and both moments; autocast's casts of the weights; the host's launches where
    they are not hidden) and a part that does (every product, norm and activation). None with fewer than two."""
    ran = [r for r in rows if r.result is not None and r.result.step_ms is not None][:2]
    if len(ran) < 2 or ran[0].batch == ran[1].batch:
        return None
    (b0, t0), (b1, t1) = ((r.batch, r.result.step_ms) for r in ran)
    per_sample = (t1 - t0) / (b1 - b0)
    return t0 - b0 * per_sample, per_sample


def batch_ladder(runs: "Runs", options: Options, job: str = "gpt", factors: Sequence[int] = LADDER,
                 budget: int | None = None, step_s: float | None = None) -> list[LadderRow]:
    """The step of `options` at the runs' batch B and at B x each of `factors`: the same code, so the loss
    check of B stands for all (the batch changes how many samples a step averages, not the arithmetic per
    sample). A batch runs only where it is expected to fit `budget` bytes (peak memory extrapolated along a
    line through the rows before it; from one row, the fp32 training state (`state_bytes`) fixed and the rest
    in proportion) and, with `step_s`, where its step is expected to take at most that long. From the third row on,
    the time `step_line` predicts from the first two is kept beside the measured one."""
    base = runs.batch(job)
    rows = [LadderRow(base, runs(job, options))]
    for f in factors:
        b = base * f
        done = [r for r in rows if r.result is not None and r.result.step_ms is not None]
        line = step_line(rows)
        predicted = None if line is None else line[0] + b * line[1]
        mem = [(r.batch, r.result.peak_bytes) for r in done if r.result.peak_bytes]
        if len(mem) >= 2:
            (m0b, m0), (m1b, m1) = mem[-2:]
            need = m1 + (b - m1b) * (m1 - m0) / (m1b - m0b)
        elif mem:           # from one row: the training state stays, the rest grows with the batch
            fixed = min(state_bytes(job, runs.configs[job]), mem[-1][1])
            need = fixed + (mem[-1][1] - fixed) * b / mem[-1][0]
        else:
            need = None
        guess = predicted if predicted is not None else (done[-1].result.step_ms * b / done[-1].batch if done else None)
        if budget is not None and need is not None and need > budget:
            rows.append(LadderRow(b, None, predicted, need, f"expected to need {need / 2**30:.1f} GiB, over the "
                                                          f"memory budget of {budget / 2**30:.1f} GiB"))
            continue
        if step_s is not None and guess is not None and guess > 1e3 * step_s:
            rows.append(LadderRow(b, None, predicted, need, f"a step expected to take {guess / 1e3:.2g} s, over "
                                                          f"{step_s} s"))
            continue
        try:
            rows.append(LadderRow(b, runs(job, options, b), predicted, need))
        except torch.OutOfMemoryError as err:
            rows.append(LadderRow(b, None, predicted, need, "out of memory: " + str(err).splitlines()[0]))
            del err
    return rows


def ladder_rows(rows: Sequence[LadderRow], peak: Ceiling | None, sheet_peak: float | None = None) -> list[tuple]:
    """The ladder as table rows: batch, step ms, predicted ms, tokens (or images) per second, model TFLOP/s,
    its fraction of the measured peak (`peak`) and its MFU (of the datasheet's `sheet_peak`)."""
    out = []
    for r in rows:
        res = r.result
        if res is None or res.time is None:
            out.append((r.batch, "-", "-" if r.predicted_ms is None else f"{r.predicted_ms:.4g}", "-", "-", "-", "-",
                        r.why or "not timed"))
            continue
        share, sheet = peak_fraction(res, peak), mfu(res, sheet_peak)
        out.append((r.batch, f"{res.step_ms:.4g}", "-" if r.predicted_ms is None else f"{r.predicted_ms:.4g}",
                    f"{res.items_per_s:,.0f}", f"{res.tflops:,.4g}", pct(None if share is None else 100 * share),
                    pct(None if sheet is None else 100 * sheet), gib(res.peak_bytes)))
    return out


LADDER_HEADER = ("batch", "step ms", "predicted ms", "per s", "model TFLOP/s", "of measured peak",
                 "MFU (of datasheet)", "peak memory / why not")


# -- tables and plots for the notebook ----------------------------------------------------------------
def gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.3g}"


def pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}%"


STEP_HEADER = ("step", "status", "ms per step", "throughput", "speed-up", "this step", "share of speed-up",
               "peak GiB", "memory saved GiB", "share of memory saved", "model TFLOP/s",
               "checks (share of allowance)", "first step ms", "notes")


def _short_status(s: Step) -> str:
    """A step's status for a table cell: the word before the reason ("skipped", ...); the reason goes below."""
    return s.status.split(":")[0] + (" (see below)" if ":" in s.status or s.status == "mismatch" else "")


def step_rows(steps: Sequence[Step], shares: bool = True) -> list[tuple]:
    """One table row per waterfall step (STEP_HEADER): what ran, whether it counted, and its shares.

    A skipped step's reason is not in its row (a sentence in one column of this wide table is squeezed to a
    word per line) but in `step_notes`. `shares=False` (on the CPU) leaves the share of speed-up out: "n/a".
    """
    rows = []
    for s in steps:
        r, c = s.result, s.checked
        if r is None or r.time is None:
            rows.append((s.label, _short_status(s)) + ("-",) * (len(STEP_HEADER) - 3)
                        + ("; ".join(n for n in r.notes if not n.startswith("not timed:")) if r else "",))
            continue
        share = pct(s.share_pct) if shares else ("n/a" if s.share_pct is not None else "-")
        rows.append((s.label, s.status, f"{r.step_ms:.4g}", f"{r.items_per_s:,.0f} {r.unit}",
                     "-" if s.speedup is None else f"{s.speedup:.2f}x", "-" if s.gain is None else f"{s.gain:.2f}x",
                     share, gib(r.peak_bytes),
                     "-" if s.memory_saved is None else gib(s.memory_saved), pct(s.memory_share_pct),
                     f"{r.tflops:.3g}", c.summary, f"{r.first_step_ms:,.0f}", "; ".join(r.notes)))
    return rows


CPU_SHARES = ("share of speed-up: n/a on the CPU. The toggles target GPU hardware (Tensor Cores, pinned copies, "
              "fused kernels), so their CPU gains are small and noisy, and a share of a total near 1x divides by "
              "almost zero: it comes out at hundreds of percent, positive and negative.")


def step_notes(steps: Sequence[Step], shares: bool = True) -> list[str]:
    """The lines below a `step_rows` table: why each step that did not count did not, the updates GradScaler
    skipped, the tensors where a passed numerics check could not see a dropped gradient ("blind"), that the CNN's
    accumulation is compared with fp32 split the same way, what the checks column holds (TIERS) and, with
    `shares=False`, why the shares are not shown."""
    notes = []
    for s in steps:
        if ":" in s.status:
            word, why = s.status.split(":", 1)
            toggle = s.label.removeprefix("+ ").strip()
            why = why.strip().removeprefix(f"{toggle}:").strip()
            notes.append(f"{s.label} {word}: {why}")
            continue
        if s.status == "mismatch":
            notes.append(f"{s.label} mismatch, not timed: {s.checked.why}")
            continue
        if s.result is not None and s.result.skipped_updates:
            notes.append(f"{s.label}: {K.skipped_text(s.result.skipped_updates, s.result.first_scale)}")
        numerics = s.checked.part("numerics")
        if numerics is not None and "; blind in " in numerics.why:
            notes.append(f"{s.label}: numerics check blind in " + numerics.why.split("; blind in ", 1)[1])
        if s.result is not None and s.result.job == "cnn" and s.options.accumulation > 1:
            notes.append(f"{s.label}: the CNN's accumulation has nothing to fail against: its reference is fp32 split "
                         f"into the same {s.options.accumulation} micro-batches by the same code (BatchNorm normalizes "
                         "each micro-batch by its own statistics, so the split is part of the model: "
                         "`C.reference_options`); its checks test the row's other toggles on the split")
    return notes + [TIERS] + ([] if shares else [CPU_SHARES])


HOST_PACED_BUSY = 90.0    # a timed run whose GPU was busy less than this % of the time (NVML) waited on the host


def accumulation_notes(steps: Sequence[Step]) -> list[str]:
    """What this run's numbers say about each counted row that splits the batch into more micro-batches than
    the counted row before it: its step and micro-batch times against the whole batch in one pass, and, where
    GPU busy % was sampled (`waterfall(monitor=True)`, NVML), who set the pace. A micro-batch launches the same
    kernels as the whole batch, each on fewer samples: where the GPU finishes them sooner than the host launches
    them, the GPU waits between kernels (busy under HOST_PACED_BUSY %) and the step is host-bound (lesson 11);
    where it stays busy, the smaller products themselves took longer per sample (lesson 04)."""
    out = []
    counted = [s for s in steps if s.counted and s.result is not None and s.result.step_ms]
    for before, s in zip(counted, counted[1:]):
        n = s.options.accumulation // before.options.accumulation
        if n <= 1:
            continue
        r, b = s.result, before.result
        micro = r.step_ms / s.options.accumulation
        whole = b.step_ms / before.options.accumulation
        line = (f"{s.label}: {r.step_ms:.4g} ms a step, {micro:.3g} ms for each of its {s.options.accumulation} "
                f"micro-batches of {r.batch // s.options.accumulation}, against {whole:.3g} ms for "
                f"{b.batch // before.options.accumulation} in one pass in the row before: 1/{n} of the samples took "
                f"{micro / whole:.0%} of the time")
        if micro / whole <= 1.1 / n:
            line += ": about its share, so splitting the batch cost nothing measurable here"
        elif r.busy_pct is None or b.busy_pct is None:
            line += (f". GPU busy % was not sampled ({r.monitor_status or b.monitor_status or 'no monitor'}), so "
                     "whether the host or the GPU set that pace is not measured here")
        elif r.busy_pct < HOST_PACED_BUSY:
            line += (f". The GPU was busy {r.busy_pct:.0f} % of the time (NVML) against {b.busy_pct:.0f} % before: it "
                     "waited between kernels for the host, which launches as many kernels per micro-batch as for "
                     "the whole batch. This step is host-bound (lesson 11: CUDA graphs or compile remove launches)")
        else:
            line += (f". The GPU was busy {r.busy_pct:.0f} % of the time (NVML) against {b.busy_pct:.0f} % before: "
                     "not waiting for the host; the smaller products took longer per sample on the GPU itself")
        out.append(line + ".")
    return out


def waterfall_figure(steps: Sequence[Step], title: str = "", memory: bool = False, shares: bool = True):
    """`plots.waterfall_plot` of the steps: cumulative speed-up (or, with `memory`, peak GiB), each step's
    gain and share written above its bar (`shares=False`, on the CPU: the gain only); steps that did not
    count drawn grey."""
    from gpulab.core import plots

    if memory:
        values = [None if not s.counted or s.result is None or s.result.peak_bytes is None
                  else s.result.peak_bytes / 2**30 for s in steps]
        notes = [("" if s.memory_share_pct is None else f"{s.memory_share_pct:.0f}%") if v is not None
                 else s.status.split(":")[0] for s, v in zip(steps, values)]
        return plots.waterfall_plot(list(zip((s.label for s in steps), values)), notes, ylabel="peak memory (GiB)",
                                    title=title, logy=False, total_label="end", higher_is_better=False)
    values = [s.speedup if s.counted else None for s in steps]
    notes = [("" if s.gain is None else f"{s.gain:.2f}x" + ("" if s.share_pct is None or not shares
                                                             else f", {s.share_pct:.0f}%")) if v is not None
             else s.status.split(":")[0] for s, v in zip(steps, values)]
    return plots.waterfall_plot(list(zip((s.label for s in steps), values)), notes, title=title)
