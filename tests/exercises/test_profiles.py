"""Every graded exercise under each GPU profile the portability matrix represents (tests/test_portability.py,
which leaves the notebooks' graded cells to this file): the class's control flow (fp16 + GradScaler where a T4
has no bf16, ...) at the tiny size on the CPU. The lesson's fix must pass or say why it cannot run; the
profile reaches the grading process from the notebook's environment at each grading."""
import pytest

from gpulab.exercises import exercise
from gpulab.exercises.registry import tasks

REPRESENTATIVES = ("t4", "rtx4090")


def branching() -> list[str]:
    """The exercises whose module reads the device's facts (the portability matrix's test, on the exercise's own
    module): the others take the same path under every profile."""
    import inspect
    from test_portability import BRANCHES
    return [name for name, t in sorted(tasks().items()) if BRANCHES.search(inspect.getsource(inspect.getmodule(t.slow)))]


def test_the_branching_exercises_include_the_16_bit_ones():
    assert {"06.amp", "13.capstone"} <= set(branching())


@pytest.mark.parametrize("profile", REPRESENTATIVES)
def test_every_exercise_runs_under_the_profile(profile, monkeypatch):
    monkeypatch.setenv("GPULAB_PROFILE", profile)
    problems = []
    for name in branching():
        ex = exercise(name)
        v = ex.check(ex.task.reference, quiet=True, who="reference")
        if v.state == "cannot run" and v.why:
            continue
        if v.state != "passed":
            problems.append(f"{name}: {v.state}: {v.why[-1] if v.why else ''}")
    assert not problems, f"under {profile}:\n" + "\n".join(problems)


def test_the_profile_reaches_the_grading_process(monkeypatch):
    """A profile set after the fork server started (by a grading without one) reaches the next grading."""
    monkeypatch.delenv("GPULAB_PROFILE", raising=False)
    ex = exercise("12.fusion")
    assert ex.check(ex.task.slow, quiet=True).detail["profile"] is None
    monkeypatch.setenv("GPULAB_PROFILE", "t4")
    assert ex.check(ex.task.slow, quiet=True).detail["profile"] == "t4"
    monkeypatch.delenv("GPULAB_PROFILE")
    assert ex.check(ex.task.slow, quiet=True).detail["profile"] is None
