"""Notebook 13's speedrun: the capstone's GPT trained to the fp32 baseline's validation loss, as fast as you can.

    from gpulab.exercises.speedrun import speedrun, make_train
    result = speedrun(my_make_train, seeds=3)      # in a fresh process, like every graded exercise
    print(result.text())

The script as given is `make_train(model)`: fp32, eager, AdamW, one step per call of `train(x, y)`. Yours has the
same signature. The harness (`run_to_loss`) builds the byte-level GPT of lesson 13's time-to-loss section
(`config(scale)["ttl"]`) from a seed, trains it on random windows of the standard library's source and evaluates
it on held-out files every `eval_every` steps; the time is the host clock around the factory's call and the training
steps (the device synchronized; evaluation and the first step, which compiles where `torch.compile` is on, not
counted, as the modded-nanogpt records count them). The first step's update, and anything the factory trained, is
undone before the clock runs: the parameters are put back as built (a factory that pre-trained the model off the
clock reached the loss 12x sooner at the tiny size before this).

Grading (grading.md's speedrun rules):
- the target is the validation loss the script as given reaches in `budget_s` seconds of training (seed 0), measured
  in the same process first;
- your script runs from `seeds` different weights and batch orders (at least 3); each must reach the target within
  STEP_CAP x the baseline's steps (and WALL_CAP x its seconds), else the run fails with its loss;
- the result is the mean time to the target, with its 95 % confidence interval (Student's t);
- a new best needs a one-sided Welch t-test p < 0.01 against the previous best's times (your own earlier best in
  the results store, or the lesson's fix's). The nanoGPT speedrun records ask p < 0.01 of another claim: that a
  record's mean validation loss reaches the target.
"""
from __future__ import annotations

import math
import os
import statistics
import textwrap
from dataclasses import dataclass, field

import torch

P_NEW_BEST = 0.01
MIN_SEEDS = 3


def make_train(model):
    """The script as given: fp32, eager, AdamW; one training step on (x, y) per call."""
    from gpulab.models.precision import language_model_loss
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train(x, y):
        loss = language_model_loss(model, x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()
    return train


def make_train_fixed(model):
    """The lesson's fix, as far as this GPU allows: 16-bit autocast (bf16; fp16 with GradScaler without bf16) and a
    fused AdamW on a GPU; on the CPU the script as given (nothing there to gain)."""
    from gpulab.models.precision import half_dtype, language_model_loss
    device = next(model.parameters()).device
    if device.type != "cuda":
        return make_train(model)
    half = half_dtype()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    scaler = torch.amp.GradScaler("cuda") if half == torch.float16 else None

    def train(x, y):
        with torch.autocast("cuda", dtype=half):
            loss = language_model_loss(model, x, y)
        optimizer.zero_grad(set_to_none=True)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        return loss.detach()
    return train


# -- statistics ------------------------------------------------------------------------------------------------------
def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1, a - 1
    c, d = 1.0, 1 - qab * x / qap
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1 + aa * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-14:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1 - front * _betacf(b, a, 1 - x) / b


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with `df` degrees of freedom."""
    p = 0.5 * _betainc(df / 2, 0.5, df / (df + t * t))
    return p if t >= 0 else 1 - p


def t_quantile(q: float, df: float) -> float:
    """The t with P(T <= t) = q (bisection on `t_sf`)."""
    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        if 1 - t_sf(mid, df) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def mean_ci(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """(mean, half-width of its `level` confidence interval)."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return mean, math.inf
    return mean, t_quantile(0.5 + level / 2, n - 1) * statistics.stdev(values) / math.sqrt(n)


def welch_p_faster(new: list[float], old: list[float]) -> float:
    """One-sided Welch t-test: the p-value of "the new times are shorter than the old" (small: they are)."""
    if len(new) < 2 or len(old) < 2:
        return 1.0
    vn, vo = statistics.variance(new) / len(new), statistics.variance(old) / len(old)
    if vn + vo == 0:
        return 0.0 if statistics.fmean(new) < statistics.fmean(old) else 1.0
    t = (statistics.fmean(old) - statistics.fmean(new)) / math.sqrt(vn + vo)
    df = (vn + vo) ** 2 / ((vn ** 2 / (len(new) - 1) if vn else 0) + (vo ** 2 / (len(old) - 1) if vo else 0))
    return t_sf(t, df)


# -- the harness -----------------------------------------------------------------------------------------------------
STEP_CAP = 4            # a run may take at most this many times the baseline's steps to reach the target
WALL_CAP = 10           # ... and this many times its training seconds (a host busy with other work slows both)


def run_to_loss(factory, *, seed: int, scale: str, device: torch.device, target: float | None = None,
                budget_s: float | None = None, max_steps: int | None = None) -> dict:
    """Train lesson 13's time-to-loss GPT from `seed` with `factory(model)`'s steps. Without `target`: for `budget_s`
    seconds (the baseline; its last loss is the target). With it: until an evaluation is at or below it, or
    `max_steps`, or WALL_CAP x `budget_s` (a cap on steps, not only seconds: a slower moment of a shared host must not
    fail a run that learns as fast). Returns steps, seconds (training only), the losses, and whether the target was
    reached."""
    from gpulab.core.timing import stopwatch
    from gpulab.lessons.capstone.jobs import JOBS
    from gpulab.lessons.capstone.knobs import config
    from gpulab.lessons.capstone.time_to_loss import validation_loss
    from gpulab.models import text
    knobs = config(scale)["ttl"]
    cfg = dict(knobs["gpt"])
    budget_s = knobs["budget_s"] if budget_s is None else budget_s
    limit_s = budget_s * (WALL_CAP if target is not None else 1.0)
    train_text, val_text = text.stdlib_source(knobs["text_bytes"])
    val = [text.windows(val_text, cfg["batch"], cfg["seq"], torch.Generator().manual_seed(10_000 + i))
           for i in range(knobs["eval_batches"])]
    g = torch.Generator().manual_seed(seed)

    def batch():
        x, y = text.windows(train_text, cfg["batch"], cfg["seq"], g)
        return x.to(device), y.to(device)
    torch.manual_seed(seed)
    model = JOBS["gpt"].build(cfg, device)
    start = [p.detach().clone() for p in model.parameters()]
    with stopwatch(device=device) as setup:            # building the optimizer (or anything else) is on the clock
        train = factory(model)
    train(*batch())                                    # the first step: compiling, not counted...
    now = list(model.parameters())
    if [p.shape for p in now] != [p.shape for p in start]:
        raise ValueError("the factory or the first step changed the model's parameters (their number or shapes): "
                         "a speedrun trains the model as built")
    with torch.no_grad():                              # ...and its update undone, with whatever the factory trained
        for p, p0 in zip(now, start):
            p.copy_(p0)
    del start
    steps, seconds, losses = 1, setup.ms / 1e3, [validation_loss(model, val, device)]
    while seconds < limit_s and (max_steps is None or steps < max_steps):
        with stopwatch(device=device) as segment:
            for _ in range(knobs["eval_every"]):
                train(*batch())
        steps, seconds = steps + knobs["eval_every"], seconds + segment.ms / 1e3
        losses.append(validation_loss(model, val, device))
        if not math.isfinite(losses[-1]):
            break
        if target is not None and losses[-1] <= target:
            return {"steps": steps, "seconds": seconds, "loss": losses[-1], "reached": True, "losses": losses}
    return {"steps": steps, "seconds": seconds, "loss": losses[-1], "reached": target is None, "losses": losses}


def _speedrun(path: str, scale: str, seeds: int, previous: list[float] | None, env: dict) -> dict:
    from gpulab.core.device import pick_device
    from gpulab.exercises.grader import COURSE_ENV, load_submission, tampered
    for key in COURSE_ENV:
        if env.get(key) is not None:
            os.environ[key] = env[key]
    os.environ["GPULAB_SCALE"] = scale
    device = pick_device()
    sub = load_submission(path)
    if tampered():
        return {"state": "suspicious", "why": [f"the submission replaced {', '.join(tampered())}"]}
    base = run_to_loss(make_train, seed=0, scale=scale, device=device)
    target = base["loss"]
    runs = [run_to_loss(sub, seed=s, scale=scale, device=device, target=target, max_steps=STEP_CAP * base["steps"])
            for s in range(1, seeds + 1)]
    if tampered():
        return {"state": "suspicious", "why": [f"the submission replaced {', '.join(tampered())} while it ran"]}
    out = {"target": target, "baseline_s": base["seconds"], "runs": runs, "device": str(device), "scale": scale}
    missed = [i + 1 for i, r in enumerate(runs) if not r["reached"]]
    if missed:
        last = ", ".join(f"{runs[i - 1]['loss']:.4f}" for i in missed)
        return {**out, "state": "failed",
                "why": [f"seed(s) {missed} did not reach the target loss {target:.4f} in the time allowed "
                        f"(last losses {last})"]}
    times = [r["seconds"] for r in runs]
    mean, half = mean_ci(times)
    p = welch_p_faster(times, previous) if previous else None
    return {**out, "state": "passed", "times": times, "mean_s": mean, "ci_s": half, "p_vs_best": p,
            "new_best": previous is None or (p is not None and p < P_NEW_BEST),
            "why": [f"the fp32 script as given reached {target:.4f} in {base['seconds']:.2f} s of training (seed 0)",
                    f"yours: {mean:.2f} s +- {half:.2f} (95 % CI) over {seeds} seeds: "
                    + ", ".join(f"{t:.2f}" for t in times),
                    f"the script as given's time (seed 0) / yours: {base['seconds'] / mean:.2f}x (above 1: yours is "
                    f"faster)"]}


def _child(path, scale, seeds, previous, env, conn):
    try:
        conn.send(_speedrun(path, scale, seeds, previous, env))
    except BaseException as err:                  # noqa: BLE001 -- the submission's error is its result
        conn.send({"state": "failed", "why": [f"raised {type(err).__name__}: {err}"]})
    finally:
        conn.close()


@dataclass
class SpeedrunResult:
    state: str
    why: list[str]
    detail: dict = field(default_factory=dict)

    def text(self) -> str:
        d = self.detail
        head = f"speedrun: {self.state.upper()}"
        if self.state == "passed":    # every seed reached the target: a valid entry, whatever its speed
            head += ": every seed reached the target loss; " + (
                "the first on this GPU's board, so its best so far" if d.get("new_best") and d.get("p_vs_best") is None
                else "a new best" if d.get("new_best") else
                f"not a new best (p = {d['p_vs_best']:.3f} against the previous best, {P_NEW_BEST} needed)")
        return "\n".join([head, *[f"  - {w}" for w in self.why]])


def race(record) -> tuple:
    """Which race a speedrun record ran in: its GPU, scale and GPU profile (a tiny CPU run, another GPU's or an
    emulated class's is another race). The previous best and the room's board compare within one race."""
    from gpulab.core.results import record_profile
    return record.gpu, record.scale, record_profile(record)


def previous_best(store=None, scale: str | None = None) -> list[float] | None:
    """The times of the fastest passed speedrun in the results store in this run's race (`race`), or None."""
    from gpulab.core.device import resolve_scale
    from gpulab.core.profiles import active_profile
    from gpulab.core.results import current_gpu_name, results_store
    profile = active_profile()
    now = (current_gpu_name(), resolve_scale(scale), profile.key if profile is not None else None)
    recs = [r for r in (store or results_store()).records(lesson="13", name="speedrun")
            if r.extra.get("state") == "passed" and r.extra.get("times") and race(r) == now]
    return min(recs, key=lambda r: r.value).extra["times"] if recs else None


def speedrun(factory, *, seeds: int = MIN_SEEDS, scale: str | None = None, timeout_s: float = 1800.0,
             quiet: bool = False, who: str = "you") -> SpeedrunResult:
    """Run `factory` (or its source) to the fp32 baseline's loss from `seeds` seeds in a fresh process; record it."""
    import shutil
    import tempfile
    from pathlib import Path
    from gpulab.core.device import resolve_scale
    from gpulab.core.results import results_store
    from gpulab.exercises.exercise import SubmissionError, submission_source
    from gpulab.exercises.grader import run_forked
    if seeds < MIN_SEEDS:
        raise ValueError(f"a speedrun needs at least {MIN_SEEDS} seeds, got {seeds}")
    try:
        source = submission_source(factory)
    except SubmissionError as err:
        r = SpeedrunResult("failed", [f"not run: {err}"])
        print(r.text()) if not quiet else None
        return r
    scale = resolve_scale(scale)
    previous = previous_best(scale=scale)
    folder = Path(tempfile.mkdtemp(prefix="gpulab-speedrun-"))
    (folder / "submission.py").write_text(source)
    try:
        d, why, wall = run_forked(_child, (str(folder / "submission.py"), scale, seeds, previous), timeout_s)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if d is None:
        d = {"state": "failed", "why": [why]}
    d["wall_s"] = wall
    r = SpeedrunResult(d.get("state", "failed"), list(d.get("why", [])), d)
    if r.state == "passed":
        results_store().record("13", "speedrun", d["mean_s"], "s", state=r.state, who=who, times=d["times"],
                               ci_s=d["ci_s"], target=d["target"], p_vs_best=d.get("p_vs_best"),
                               new_best=d["new_best"], seeds=seeds)
    if not quiet:
        print(r.text())
    return r


def show() -> None:
    """Print the script as given."""
    import inspect
    print(textwrap.dedent(inspect.getsource(make_train)))
