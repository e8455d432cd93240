"""gpulab.core.predict: each notebook's predicted time from its lesson's plan and the ceilings, and the
budget every notebook keeps on every GPU profile."""
import re
from pathlib import Path

import pytest

from gpulab.core.predict import (EXERCISE_S, BUDGET_S, DATASHEET_SHARE, Plan, Prediction, StepCap, Work, datasheet_ceilings,
                                 predict)
from gpulab.core.profiles import PROFILES
from gpulab.notebook.lesson import lesson_module, predicted_time

ROOT = Path(__file__).resolve().parents[2]
LESSONS = sorted(p.name[:2] for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_prediction_is_host_plus_work_over_share_of_ceiling():
    plan = Plan(host_s=10.0, work=[Work("matmul_bf16", 2e14, 0.5, "products"),
                                   Work("copy_bandwidth", 1e12, 1.0, "copies")])
    got = predict(plan, {"matmul_bf16": 100.0, "copy_bandwidth": 1000.0})
    assert got.gpu_s == pytest.approx(2e14 / (0.5 * 100e12) + 1e12 / 1000e9)   # 4 s + 1 s
    assert got.seconds == pytest.approx(15.0)
    assert "about 15 s" in got.line() and "within" in got.line()


def test_missing_ceiling_gives_no_figure_and_says_which():
    got = predict(Plan(5.0, [Work("h2d_pinned", 1e9)]), {"matmul_fp32": 10.0})
    assert got.seconds is None and got.missing == ("h2d_pinned",)
    assert "h2d_pinned" in got.line() and "notebook 00" in got.line()


def test_a_class_without_bf16_runs_it_in_fp16_and_without_tf32_skips_it():
    got = predict(Plan(0.0, [Work("matmul_bf16", 1e12), Work("matmul_tf32", 1e12)]),
                  {"matmul_fp16": 1.0, "matmul_fp32": 0.5})
    assert got.seconds == pytest.approx(1.0)


def test_a_step_cap_shrinks_its_jobs_work_and_nothing_else():
    """Lesson 13 halves a job's batch until its fp32 step takes at most step_s: every Work of that job
    shrinks by the same factor; other work does not; a GPU fast enough keeps the whole batch."""
    cap = StepCap("matmul_fp32", amount=4e12, share=0.5, seconds=1.0)      # 4 TFLOP a step
    plan = Plan(0.0, [Work("matmul_fp32", 8e12, 1.0, "steps", job="GPT"), Work("matmul_fp32", 8e12, 1.0, "other")],
                caps={"GPT": cap})
    slow = predict(plan, {"matmul_fp32": 2.0})        # a step would take 4 s: the job keeps a quarter
    assert cap.factor(2.0) == pytest.approx(0.25)
    assert slow.gpu_s == pytest.approx(0.25 * 4.0 + 4.0)
    fast = predict(plan, {"matmul_fp32": 100.0})      # 0.08 s a step: nothing lowered
    assert cap.factor(100.0) == 1.0 and fast.gpu_s == pytest.approx(2 * 8e12 / 100e12)
    missing = predict(Plan(0.0, [], caps={"GPT": StepCap("matmul_tf32", 1.0, 1.0, 1.0)}), {"matmul_fp32": 1.0})
    assert missing.seconds is None and missing.missing == ("matmul_tf32",)


def test_lesson_13s_cap_is_its_fit_batches_rule():
    """The plan caps each job's step as `Runs.fit_batches` does: the full config's step_s, at STEP_SHARE of fp32."""
    from gpulab.lessons import l13_capstone as C
    plan = C.plan("full")
    assert set(plan.caps) == {"GPT", "CNN"}
    for cap in plan.caps.values():
        assert (cap.ceiling, cap.share, cap.seconds) == ("matmul_fp32", C.STEP_SHARE, C.CONFIG["full"]["step_s"])
    assert not C.plan("tiny").caps                         # no cap on the CPU, as fit_batches has none


def test_over_budget_is_said():
    assert "OVER" in Prediction(BUDGET_S + 1, BUDGET_S, 1.0, ()).line()


@pytest.mark.parametrize("bad", [dict(share=0), dict(share=1.5), dict(amount=-1)])
def test_work_refuses_nonsense(bad):
    with pytest.raises(ValueError):
        Work(**{"ceiling": "matmul_fp32", "amount": 1.0, **bad})


def test_datasheet_ceilings_are_derated_and_leave_out_what_a_class_lacks():
    t4 = datasheet_ceilings(PROFILES["t4"])
    assert "matmul_bf16" not in t4 and "matmul_tf32" not in t4
    # issue 40: a 70 W T4 holds about 24 of its 65 TFLOP/s under a long product, less than DATASHEET_SHARE of it
    from gpulab.core.specs import POWER_CAPPED_HALF_SHARE
    assert t4["matmul_fp16"] == pytest.approx(65 * POWER_CAPPED_HALF_SHARE) and t4["matmul_fp16"] < 65 * DATASHEET_SHARE
    assert t4["matmul_fp32"] == pytest.approx(8.1 * DATASHEET_SHARE)
    assert datasheet_ceilings(PROFILES["h200"])["matmul_bf16"] == pytest.approx(989 * DATASHEET_SHARE)
    assert t4["h2d_pinned"] < datasheet_ceilings(PROFILES["h200"])["h2d_pinned"]     # PCIe gen 3 < gen 5


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_notebook_has_a_plan_whose_host_part_names_a_committed_run(lesson):
    module = lesson_module(lesson)
    assert module is not None and callable(getattr(module, "plan", None)), f"lesson {lesson} has no plan()"
    for scale in ("tiny", "full"):
        plan = module.plan(scale)
        assert isinstance(plan, Plan) and plan.host_s >= 0
    files = re.findall(r"results/[\w.\-]+", module.plan("full").host_source)
    assert files, f"lesson {lesson}: host_source names no committed run: {module.plan('full').host_source!r}"
    for f in files:
        assert (ROOT / f).exists(), f"lesson {lesson}: {f} is not committed"


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_notebook_keeps_the_budget_on_every_profile(profile):
    """At full size, on the profile's datasheet rates derated to DATASHEET_SHARE: a plan over the budget
    means that notebook must size its work from the ceilings (as 03, 08 and 13 do)."""
    rates = datasheet_ceilings(PROFILES[profile])
    over = {}
    for lesson in LESSONS:
        got = predict(lesson_module(lesson).plan("full"), rates, exercise_s=EXERCISE_S.get(lesson, 0.0))
        assert got.seconds is not None, f"lesson {lesson} on {profile}: missing {got.missing}"
        if got.lesson_s > BUDGET_S:             # the lesson's cells; the graded exercise is the learner's own wait
            over[lesson] = round(got.lesson_s)
    assert not over, f"over the {BUDGET_S:.0f} s budget on {profile}: {over}"


def test_the_exercise_seconds_are_the_committed_runs_cells():
    """EXERCISE_S: per notebook, the cells from its first `exercise(...)` cell to the end of its graded section, as
    timed in EXERCISE_SOURCE; 13 (run there in two parts) from its exercise's check on, the cell before it being
    in 13's host_s."""
    import json
    from gpulab.core.predict import EXERCISE_SOURCE
    seconds = {}
    for line in (ROOT / EXERCISE_SOURCE).read_text().splitlines():
        parts = line.split("\t")
        if "::Cell " in parts[1]:
            seconds[parts[1]] = float(parts[0])         # 10 ran twice there: its second, whole run
    got = {}
    for path in sorted((ROOT / "notebooks").glob("[01]*.ipynb")):
        code = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        lesson = path.name[:2]
        if lesson == "13":
            got[lesson] = sum(seconds[f"notebooks/13_capstone_b.ipynb::Cell {i}"] for i in range(2, 6))
            continue
        graded = [i for i, src in enumerate(code) if re.search(r'exercise\("\d\d|\bex\.check\(|\bex\.hint\(\)', src)]
        if graded:
            got[lesson] = sum(seconds[f"notebooks/{path.name}::Cell {i}"] for i in graded)
    assert {k: round(v, 1) for k, v in got.items()} == EXERCISE_S


def test_no_prediction_on_the_cpu():
    assert predicted_time("00") is None


def test_work_only_native_to_a_precision_is_skipped_where_the_class_lacks_it():
    """Issue 40: notebook 06's bf16 runs were counted at fp16's rate on a T4, which times none of them; only the
    panel's default run (the best 16-bit format) falls back to fp16 there."""
    own = Work("matmul_bf16", 1e12, 1.0, "bf16's own run", only_native=True)
    best = Work("matmul_bf16", 1e12, 1.0, "the best 16-bit format")
    t4 = {"matmul_fp32": 4.0, "matmul_fp16": 20.0}
    assert predict(Plan(0.0, [own]), t4).gpu_s == 0.0
    assert predict(Plan(0.0, [best]), t4).gpu_s == pytest.approx(1 / 20)
    assert predict(Plan(0.0, [own]), {"matmul_fp32": 4.0, "matmul_bf16": 10.0}).gpu_s == pytest.approx(1 / 10)
