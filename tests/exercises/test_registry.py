"""Every graded exercise: its slow code and the lesson's fix pass the correctness stage at the tiny size on the
CPU (the speed is not judged there, and the verdict says so), it has two hints and readable code, and its
notebook hands it to the learner."""
import inspect
import json
from pathlib import Path

import pytest

from gpulab.exercises import exercise
from gpulab.exercises.registry import tasks
from gpulab.exercises.exercise import submission_source

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
NAMES = sorted(tasks())


def test_every_notebook_from_01_has_a_graded_exercise():
    lessons = {t.lesson for t in tasks().values()}
    missing = [nb.name for nb in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")) if nb.name[:2] != "00"
               and nb.name[:2] not in lessons]
    assert not missing, f"notebooks without a graded exercise: {missing}"


@pytest.mark.parametrize("name", NAMES)
def test_the_notebook_hands_the_exercise_to_the_learner(name):
    t = tasks()[name]
    [nb] = NOTEBOOKS.glob(f"{t.lesson}_*.ipynb")
    code = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code")
    assert f'exercise("{name}")' in code, f"{nb.name} never calls exercise({name!r})"
    assert "ex.check(" in code


@pytest.mark.parametrize("name", NAMES)
def test_slow_code_and_fix_pass_on_the_cpu_and_say_the_speed_is_not_judged(name):
    ex = exercise(name)
    t = ex.task
    assert len(t.hints) == 2 and all(h.strip() for h in t.hints)
    for fn in (t.slow, t.reference):
        assert inspect.getdoc(fn), f"{fn.__name__} has no docstring"
        submission_source(fn)                     # each can be handed to the grader as a learner's function is
    for who, fn in (("as given", t.slow), ("reference", t.reference)):
        v = ex.check(fn, quiet=True, who=who)
        if v.state == "cannot run":
            assert v.why and v.why[0], "a task that cannot run must say why"
            continue
        assert v.state == "passed", f"{name} {who}: {v.why}"
        assert not v.speed_judged and any("correctness only" in w for w in v.why)
        assert v.grading_s < 10, f"{name} {who} took {v.grading_s:.1f} s to grade at the tiny size"
