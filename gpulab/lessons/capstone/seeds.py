"""The seed articles' tables redone on this GPU (notebook 13, section 10): seed 000's V100 table (fp32, AMP, AMP
with aligned sizes, memory pooling) and seed 004's RTX 4090 table (the batch doubling with AMP and checkpointing,
GPU utilization sampled by NVML), each row mapped to the configuration that corresponds to it here
(`seed_v100_rows`, `seed_4090_rows`) and shown beside the seed's figures (`seed_v100_table`, `seed_4090_table`,
`seed_notes`)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from gpulab.lessons.capstone.options import Options
from gpulab.lessons.capstone.runs import Checked, Runs
from gpulab.lessons.capstone.waterfall import gib


# -- the seeds' tables -------------------------------------------------------------------------------
# Seed 000 (V100), "benchmark comparison on a V100": memory (GB), training speed (iter/s), speed-up.
SEED_V100 = (
    ("Baseline (FP32)", 12.4, 45, 1.0),
    ("AMP (FP16/FP32 mixed)", 6.8, 120, 2.67),
    ("AMP + Tensor Core", 6.8, 138, 3.07),
    ("AMP + memory pooling", 5.9, 135, 3.0),
)


# Seed 004 (RTX 4090): batch size, throughput (img/s), GPU utilization (%).
SEED_4090 = (
    ("Baseline", 32, 125, 58),
    ("+AMP", 64, 214, 72),
    ("+Checkpointing", 128, 187, 68),
    ("All combined", 256, 362, 89),
)


NO_POOLING = ("no toggle corresponds: PyTorch's caching allocator already pools GPU memory in every run; "
              "lesson 02 compares allocator settings, each in a fresh process")


@dataclass(frozen=True)
class SeedRow:
    """One row of a seed's table beside the configuration that corresponds to it on this GPU."""

    seed: tuple
    options: Options | None
    batch: int | None
    checked: Checked | None
    why: str = ""


def seed_v100_rows(runs: Runs, job: str = "gpt", batch: int | None = None, half: str = "bf16") -> list[SeedRow]:
    """Seed 000's rows on `job`: fp32; AMP; AMP + "Tensor Core" (sizes aligned: the GPT's vocabulary);
    "memory pooling" has no counterpart (NO_POOLING)."""
    amp = Options(amp=half)
    configs = [Options(), amp, amp.adding("aligned") if job == "gpt" else amp.adding("channels_last"), None]
    out = []
    for seed, options in zip(SEED_V100, configs):
        if options is None:
            out.append(SeedRow(seed, None, None, None, NO_POOLING))
        else:
            out.append(SeedRow(seed, options, runs.batch(job, batch), runs.checked(job, options, batch)))
    return out


def seed_4090_rows(runs: Runs, best: Options, job: str = "cnn", batch: int | None = None,
                   half: str = "bf16") -> list[SeedRow]:
    """Seed 004's rows on `job`, its batches doubling from `batch` (default: the seed's 32) as the seed's
    did: fp32; AMP at 2x; AMP + checkpointing at 4x; `best` (every speed toggle) + checkpointing at 8x.
    GPU busy % is sampled during each timed run (NVML), like the seed's utilization column."""
    b = batch or SEED_4090[0][1]
    configs = [(Options(), b), (Options(amp=half), 2 * b), (Options(amp=half, checkpointing=True), 4 * b),
               (dataclasses.replace(best, checkpointing=True), 8 * b)]
    return [SeedRow(seed, o, n, runs.checked(job, o, n, monitor=True)) for seed, (o, n) in zip(SEED_4090, configs)]


def seed_4090_batch(runs: Runs, budget: int | None, job: str = "cnn", wanted: int | None = None) -> tuple[int, str]:
    """Seed 004's first batch here: `wanted` (default: the seed's 32), halved while the last row's fp32 check (every
    row is compared with an fp32 run at its own batch, 8x the first) would not fit the memory `budget`, its peak
    extrapolated from the fp32 reference's peak per sample at the fitted batch (weights included: an overestimate).
    Returns the batch and why it changed ("" where it did not, or without a budget: the CPU)."""
    start = b = wanted or SEED_4090[0][1]
    ref = runs.reference(job) if budget else None
    if ref is None or not ref.peak_bytes:
        return b, ""
    per_sample = ref.peak_bytes / runs.batch(job)
    while b > 1 and 8 * b * per_sample > budget:
        b //= 2
    return b, ("" if b == start else
               f"here: the rows start at batch {b}, not {start}: the fp32 check of the last row, at {8 * start}, would "
               f"take about {8 * start * per_sample / 2**30:.1f} GiB, over this GPU's memory budget of "
               f"{budget / 2**30:.1f} GiB")


SEED_V100_HEADER = ("seed row (V100)", "seed GB", "seed iter/s", "seed speed-up", "here: configuration",
                    "here: peak GiB", "here: steps/s", "here: speed-up", "here: memory vs fp32", "seed memory vs fp32")


SEED_4090_HEADER = ("seed row (RTX 4090)", "seed batch", "seed img/s", "seed speed-up", "seed GPU util.",
                    "here: configuration", "here: batch", "here: img/s", "here: speed-up", "here: GPU busy")


def seed_v100_table(rows: Sequence[SeedRow]) -> list[tuple]:
    """SEED_V100_HEADER rows: the seed's figures and ratios beside ours (ratios to each table's first row)."""
    base = rows[0].checked.result if rows[0].checked else None
    out = []
    for r in rows:
        name, gb, its, x = r.seed
        seed = (name, gb, its, f"{x:.2f}x")
        seed_mem = f"{gb / rows[0].seed[1]:.2f}x"
        res = r.checked.result if r.checked else None
        if res is None or res.time is None or base is None or not r.checked.counted:
            why = "none (see below)" if r.why else (r.checked.status.split(":")[0] if r.checked else "-")
            out.append(seed + (why, "-", "-", "-", "-", seed_mem))
            continue
        steps = 1e3 / res.step_ms
        mem = "-" if res.peak_bytes is None or not base.peak_bytes else f"{res.peak_bytes / base.peak_bytes:.2f}x"
        out.append(seed + (res.options.label, gib(res.peak_bytes), f"{steps:.3g}",
                           f"{res.items_per_s / base.items_per_s:.2f}x", mem, seed_mem))
    return out


def seed_4090_table(rows: Sequence[SeedRow]) -> list[tuple]:
    """SEED_4090_HEADER rows: the seed's figures and speed-ups beside ours, with GPU busy % from NVML."""
    base = rows[0].checked.result if rows[0].checked else None
    out = []
    for r in rows:
        name, b, rate, util = r.seed
        seed = (name, b, rate, f"{rate / rows[0].seed[2]:.2f}x", f"{util}%")
        res = r.checked.result if r.checked else None
        if res is None or res.time is None or base is None or not r.checked.counted:
            out.append(seed + (r.options.label if r.options else "-", r.batch, r.checked.status, "-", "-"))
            continue
        busy = f"{res.busy_pct:.0f}%" if res.busy_pct is not None else "n/a (see below)"
        out.append(seed + (res.options.label, r.batch, f"{res.items_per_s:,.0f}",
                           f"{res.items_per_s / base.items_per_s:.2f}x", busy))
    return out


def seed_notes(rows: Sequence[SeedRow]) -> list[str]:
    """The lines below a seed table: each reason its cells only point to, once."""
    notes = []
    for r in rows:
        res = r.checked.result if r.checked else None
        if r.why:
            line = f"{r.seed[0]}: {r.why}"
        elif r.checked and ":" in r.checked.status:
            line = f"{r.seed[0]}: {r.checked.status}"
        elif r.checked and r.checked.status == "out of memory":
            line = f"{r.seed[0]}: out of memory, the row or the fp32 run it is checked against ({r.checked.why})"
        elif res is not None and res.time is not None and res.busy_pct is None and r.checked.counted:
            line = f"here: GPU busy: n/a ({res.monitor_status or 'no NVML'})"
        else:
            continue
        if line not in notes:
            notes.append(line)
    return notes
