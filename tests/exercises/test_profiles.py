"""Every graded exercise under each GPU profile the portability matrix represents (tests/test_portability.py,
which leaves the notebooks' graded cells to this file): the class's control flow (fp16 + GradScaler where a T4
has no bf16, ...) at the tiny size on the CPU. The lesson's fix must pass or say why it cannot run; the
profile reaches the grading process from the notebook's environment at each grading."""
import pytest

from gpulab.exercises import exercise
from gpulab.exercises.registry import tasks

REPRESENTATIVES = ("t4", "rtx4090")


@pytest.mark.parametrize("profile", REPRESENTATIVES)
def test_every_exercise_runs_under_the_profile(profile, monkeypatch):
    monkeypatch.setenv("GPULAB_PROFILE", profile)
    problems = []
    for name in sorted(tasks()):
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
