"""Every run of notebook 13, memoized (`Runs`), and correct before fast: each run checked against its fp32
reference from the same weights on the same batches (`Runs.checked`, `Runs.parts`, the comparisons of
`capstone.checks`) before its time counts, the verdict kept as a `Checked`. `loss_tolerance` and
`reference_options` say what a run's losses may differ by and which fp32 run it is compared with; `TIERS`
says it in a line. `Runs.fit_batches` fits each job to this GPU's memory and fp32 speed."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from gpulab.core.ceilings import ceilings
from gpulab.core.device import device_facts, resolve_scale
from gpulab.lessons.capstone import checks as K
from gpulab.lessons.capstone.jobs import JOBS, fit_model, job_config
from gpulab.lessons.capstone.knobs import CONFIG, LOSS_STEPS, MEMORY_CAP, STATE_SHARE, STEP_SHARE
from gpulab.lessons.capstone.options import Options, numerics_format, systems_only
from gpulab.lessons.capstone.runner import Check, JobResult, run_job, sampled
from gpulab.models import precision as P
from gpulab.models.sizing import fit_batch, memory_budget


# -- correct before fast -----------------------------------------------------------------------------
def loss_tolerance(job: str, options: Options) -> tuple[float, str]:
    """(largest accepted relative loss difference to the fp32 reference, why) over the first LOSS_STEPS steps.

    - 16-bit autocast: products round their inputs to 8 (bf16) or 11 (fp16) significant bits, up to 4e-3
      each; through tens of layers and two AdamW updates the loss moves by a few of those: 3e-2.
    - TF32 (10-bit mantissa inputs, fp32 sums): 1e-2.
    - FP8 (the blocks' linear products on e4m3 inputs and e5m2 gradients, one scale per tensor):
      `precision.FP8_TOLERANCE`, a single forward product's bound, 6e-2.
    - fp32 throughout: only the order of sums changes (memory layout, fused kernels, compiled code): 2e-3.

    Loose on purpose, and the weakest of the four comparisons (`Runs.parts`): the losses see a run gone wrong,
    not a dropped gradient (zeroing every FP8 weight gradient moved the tiny GPT's loss by 0.2 % on the CPU:
    tests/lessons/test_l13_capstone.py::test_zeroing_every_fp8_weight_gradient_hardly_moves_the_loss).
    """
    if options.fp8:
        return P.FP8_TOLERANCE, ("FP8 rounds each linear product's inputs to 3 mantissa bits: a product is off by "
                                 "up to about 6 %")
    if options.amp != "none":
        return 3e-2, f"{options.amp} autocast rounds products to 16 bits"
    if options.tf32:
        return 1e-2, "TF32 rounds product inputs to 10 mantissa bits"
    return 2e-3, "fp32 throughout: only the order of sums differs"


def reference_options(job: str, options: Options) -> Options:
    """The fp32 run `options` is compared with: the baseline, except that the CNN keeps its accumulation.
    BatchNorm normalizes each micro-batch with that micro-batch's own statistics, so for the CNN splitting
    the batch changes the arithmetic (by several percent at the tiny size) and belongs to the model; the GPT
    has no batch statistics, and its split batch is checked against the whole one."""
    return Options(accumulation=options.accumulation) if job == "cnn" else Options()


TIERS = ("The checks, each against the fp32 reference from the same weights on the same batches "
         f"(`capstone.checks`): losses of the first {LOSS_STEPS} updates; how far each tensor moved (within "
         f"{1 / K.MOVE_MAX:g} to {K.MOVE_MAX:g} times the reference's); systems toggles, in fp32, their parameters "
         f"after {LOSS_STEPS} updates within {K.SYSTEMS_MAX:g}x the noise floor of the runs with their batch rows "
         f"reordered; numerics toggles (tf32, amp, fp8), the first update's gradients within {K.NUMERICS_MAX:g}x "
         "how far the reference's own gradients move when its step is computed in the run's format. Each figure is "
         "the share of its allowance used (at most 1 passes).")


@dataclass(frozen=True)
class Checked:
    """A run and its checks against its fp32 reference (`Runs.parts`) on the same batches."""

    result: JobResult | None
    status: str                  # "baseline", "ok", "mismatch", "out of memory", "skipped: ..."
    parts: tuple[K.Part, ...] = ()
    why: str = ""

    @property
    def counted(self) -> bool:
        """Whether its time counts: the baseline itself, or a run that passed every check."""
        return self.status in ("baseline", "ok")

    @property
    def summary(self) -> str:
        """Each check's share of its allowance, for a table cell ("-" without checks)."""
        return ", ".join(f"{p.name} {p.used:.2g}" for p in self.parts) or "-"

    def part(self, name: str) -> K.Part | None:
        return next((p for p in self.parts if p.name == name), None)


class Runs:
    """Every run of a notebook, memoized by (job, options, batch, ...): a configuration runs once.

        runs = Runs()
        runs("gpt", Options(amp="bf16"))                 # a JobResult
        runs.checked("gpt", Options(amp="bf16"))         # the same, with its checks

    `checked` compares the run with its fp32 reference at the same batch (`reference_options`: its timed run
    if there is one, else an untimed run), which keeps its noise floors, and keeps every check in `checks`.
    A run with systems toggles under 16-bit or TF32 has them checked in fp32 first, by an untimed run.

    All runs are at one `scale` ("tiny" or "full"; None: the course's, read once here): it gives the
    jobs' sizes that `configs` leaves out, and every run's timing budget (`run_job(..., scale=)`).
    """

    def __init__(self, configs: dict[str, dict] | None = None, runner: Callable[..., JobResult] = run_job,
                 scale: str | None = None, **run_kw: Any):
        self.scale = resolve_scale(scale)
        self.configs = {job: dict((configs or {}).get(job) or job_config(job, self.scale)) for job in JOBS}
        self.runner, self.run_kw = runner, run_kw
        self.results: dict[tuple, JobResult] = {}
        self.checks: list[tuple[str, Checked]] = []
        self.lowered: dict[str, str] = {}          # job -> why `fit_batches` lowered its batch
        self._formats: dict[str, tuple[str, ...]] = {}

    def batch(self, job: str, batch: int | None = None) -> int:
        return batch or self.configs[job]["batch"]

    def floors(self, job: str) -> tuple[str, ...]:
        """The noise floors a reference run of `job` keeps (`checks`): its rows reordered, and its first update's
        gradients computed in each format the notebook trains `job` in here: TF32 where it runs, the 16-bit type
        `best_half` picks, FP8 for the GPT where it runs. Another format (fp16 on a GPU with bf16, in the panel)
        is measured when a run asks for it (`rounded`)."""
        if job not in self._formats:
            facts = device_facts()
            fmts = [f for f in ("tf32", P.best_half(facts)) if P.refusal(f, facts) is None]
            if job == "gpt" and P.fp8_refusal(facts) is None:
                fmts.append("fp8")
            self._formats[job] = ("reorder", *fmts)
        return self._formats[job]

    def fit_batches(self, jobs: Sequence[str] | None = None, cap: int = MEMORY_CAP) -> int | None:
        """Fit each job to this GPU, on a GPU (None on the CPU, where nothing changes; else the memory
        budget, min(cap, half the free GPU memory)), saying in `lowered` what changed and why:

        1. the model: while its fp32 training state (weights, gradients and AdamW's two moments: 16
           bytes a parameter) would take over STATE_SHARE of the budget, halve its width (and heads,
           so a head stays 128 wide) down to 1024, then its blocks down to 2 (`fit_model`): the
           full GPT's 0.6 G parameters need 9.8 GB before any activation, more than half a T4's;
        2. the batch: halved until the fp32 baseline step fits the budget, extrapolated from two small
           untimed steps (`sizing.fit_batch`, at 1/8 and 1/4 of the batch);
        3. the time: halved while that step, its FLOPs (counted on the small steps) over STEP_SHARE of
           this GPU's fp32 matmul ceiling, would take longer than the scale's `step_s`, so a slow
           GPU finishes the notebook in about the time a fast one does.
        """
        budget = memory_budget(cap=cap)
        if budget is None:
            return None
        step_s = CONFIG[self.scale].get("step_s")
        fp32 = ceilings().get("matmul_fp32") if step_s else None
        for job in jobs or tuple(self.configs):
            why = []
            fitted, said = fit_model(job, self.configs[job], int(STATE_SHARE * budget))
            if said:
                self.configs[job] = fitted
                why.append(said)
            wanted = self.configs[job]["batch"]
            probe = max(1, wanted // 8)
            batch = fit_batch(lambda b: self(job, Options(), b, timed=False).peak_bytes, wanted, budget, probe=probe)
            if batch < wanted:
                why.append(f"batch {wanted} -> {batch}: memory budget {budget / 2**30:.1f} GiB")
            if fp32 is not None:
                small = self(job, Options(), probe, timed=False)          # fit_batch's first probe, memoized
                per_sample = small.flops_per_step / small.batch
                seconds = lambda b: b * per_sample / (STEP_SHARE * fp32.value * 1e12)
                before = batch
                while batch > 1 and seconds(batch) > step_s:
                    batch //= 2
                if batch < before:
                    why.append(f"batch {before} -> {batch}: an fp32 step of {before} would take about "
                               f"{seconds(before):.1f} s at {STEP_SHARE:.0%} of this GPU's {fp32.value:.1f} "
                               f"TFLOP/s fp32 ({fp32.source}), over {step_s} s")
            self.configs[job]["batch"] = batch
            if why:
                self.lowered[job] = "; ".join(why)
        return budget

    def __call__(self, job: str, options: Options = Options(), batch: int | None = None, *, timed: bool = True,
                 monitor: bool = False, floors: Sequence[str] = (), check: Check | None = None,
                 own_floor: bool = False) -> JobResult:
        """The run's result, run now if it has not run before (`floors`, `check`, `own_floor`: `run_job`'s)."""
        batch = self.batch(job, batch)
        key = (job, options, batch, timed, monitor, tuple(floors), own_floor)
        if key not in self.results:
            self.results[key] = self.runner(job, options, batch, config=self.configs[job], scale=self.scale,
                                            timed=timed, monitor=monitor, floors=tuple(floors), check=check,
                                            own_floor=own_floor, **self.run_kw)
        return self.results[key]

    def reference(self, job: str, batch: int | None = None, options: Options = Options()) -> JobResult:
        """The fp32 reference run of `options` (`reference_options`) at `batch`, with its noise floors
        (`floors`): a timed run if there is one, else an untimed run of LOSS_STEPS steps."""
        batch = self.batch(job, batch)
        ref, floors = reference_options(job, options), self.floors(job)
        for (j, o, b, timed, _, f, _), r in self.results.items():
            if (j, o, b, f) == (job, ref, batch, floors) and timed:
                return r
        return self(job, ref, batch, timed=False, floors=floors)

    def rounded(self, job: str, ref: JobResult, fmt: str) -> list | None:
        """The reference's first-update gradients computed in `fmt` (the numerics floor): kept by the reference
        run where `floors` names `fmt`, else measured now by an untimed run of it."""
        if ref.sample is None:
            return None
        if fmt not in ref.sample.rounded:
            extra = self(job, ref.options, ref.batch, timed=False, floors=(fmt,))
            return extra.sample.rounded[fmt] if extra.sample is not None else None
        return ref.sample.rounded[fmt]

    def parts(self, job: str, options: Options, ref: JobResult, losses: Sequence[float], sample: K.Sample | None,
              systems: K.Part | None = None, own_floor: Callable[[], K.Sample] | None = None) -> list[K.Part]:
        """The checks of a run with `options` against its reference `ref` (`capstone.checks`): its losses;
        with samples (a test's runner keeps none), how far each tensor moved; its systems toggles (`systems`,
        found by an fp32 run of them, or measured here where this run is that fp32 run: against the reference's
        noise floor, and its own too (`own_floor`) where the first alone does not pass); its numerics toggles."""
        tol, tol_why = loss_tolerance(job, options)
        out = [K.losses(ref.losses, losses, tol, tol_why)]
        if sample is None or ref.sample is None:
            return out + ([systems] if systems else [])
        _, names = sampled(job, self.configs[job])
        out.append(K.movement(ref.sample.p0, ref.sample.pk, sample.pk, names))
        if systems is None and systems_only(options) == options:
            systems = self.systems_part(ref, sample, options, own_floor)
        if systems is not None:
            out.append(systems)
        fmt = numerics_format(options)
        if fmt is not None:
            floor = self.rounded(job, ref, fmt)
            out.append(K.numerics(ref.sample.g1, sample.g1, floor, names, fmt) if floor is not None else
                       K.Part("numerics", False, math.inf, f"the reference kept no {fmt} floor"))
        return out

    def systems_part(self, ref: JobResult, sample: K.Sample, fp32: Options,
                     own_floor: Callable[[], K.Sample] | None = None) -> K.Part:
        """`checks.systems`: an fp32 run's parameters after LOSS_STEPS updates against the reference's, within
        SYSTEMS_MAX times the noise floor of the reference with its batch rows reordered; where that alone
        does not pass, the run's own floor too (`own_floor()`: the run measures it then). A toggle that
        reorders the sums inside every product (channels_last's convolution kernels) moves the parameters
        further than reordering the batch's rows does, and the run with its own rows reordered measures that."""
        what = f"the fp32 run with {' + '.join(fp32.on())}"
        part = K.systems(ref.sample.p0, ref.sample.pk, sample.pk, [(ref.sample.reordered, ref.sample.pk)],
                         LOSS_STEPS, what)
        if part.ok or own_floor is None:
            return part
        sample = own_floor()
        return K.systems(ref.sample.p0, ref.sample.pk, sample.pk, [(ref.sample.reordered, ref.sample.pk),
                                                                   (sample.reordered, sample.pk)], LOSS_STEPS, what)

    def checked(self, job: str, options: Options = Options(), batch: int | None = None, *,
                monitor: bool = False) -> Checked:
        """The run, checked against its fp32 reference (`parts`) before it is timed; out of memory becomes a
        status. A run with systems toggles under 16-bit or TF32 has them checked first, by an untimed fp32 run
        of them alone (`systems_only`): in 16-bit, rounding would hide what they change."""
        try:
            ref_options = reference_options(job, options)
            if options == ref_options:
                out = Checked(self(job, options, batch, monitor=monitor, floors=self.floors(job)), "baseline",
                              why="the fp32 reference itself")
            else:
                ref = self.reference(job, batch, options)
                fp32, systems = systems_only(options), None
                if fp32 not in (options, ref_options):
                    def systems_check(losses: tuple, skipped: tuple, sample: K.Sample, own) -> list[K.Part]:
                        return [] if ref.sample is None else [self.systems_part(ref, sample, fp32, own)]
                    s = self(job, fp32, batch, timed=False, own_floor=True, check=systems_check)
                    systems = s.parts[0] if s.parts else None

                def check(losses: tuple, skipped: tuple, sample: K.Sample, own) -> list[K.Part]:
                    return self.parts(job, options, ref, losses, sample, systems, own)
                result = self(job, options, batch, monitor=monitor, own_floor=fp32 == options, check=check)
                parts = result.parts or tuple(self.parts(job, options, ref, result.losses, result.sample, systems))
                said = K.skipped_text(result.skipped_updates, result.first_scale)
                failed = [p.why for p in parts if not p.ok]
                why = "; ".join(([said] if said else []) + (failed or [p.why for p in parts]))
                out = Checked(result, "mismatch" if failed else "ok", parts, why)
        except torch.OutOfMemoryError as err:
            out = Checked(None, "out of memory", why=str(err).splitlines()[0])
            del err
        self.checks.append((f"{job}: {options.label} (batch {self.batch(job, batch)})", out))
        return out

    def mismatches(self) -> list[str]:
        """Every checked run that did not train the same model as its reference (`checked`'s "mismatch"), once."""
        return list(dict.fromkeys(name for name, c in self.checks if c.status == "mismatch"))

    def compared(self) -> int:
        """How many distinct runs were compared with their fp32 reference (a memoized run asked for again, the
        references themselves and runs that ran out of memory not counted)."""
        return len({name for name, c in self.checks if c.status in ("ok", "mismatch")})
