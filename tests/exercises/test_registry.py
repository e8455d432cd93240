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


NOTEBOOK_CELL = '''
import torch
device = torch.device("cpu")
blocks = torch.nn.Sequential(torch.nn.Linear(2, 2))
step = lambda: None


def my_make_step(x, model, optimizer):
    y = x.to(x.device) * 2
    for b in model.blocks:
        y = b(y)
    optimizer.step()
    return [v * 2 for v in y]


def reads_the_notebooks_model(x):
    return blocks(x)
'''


def test_an_attribute_named_like_a_notebook_global_is_not_that_global(tmp_path):
    """Second review of 05, 08, 09 (2026-12-06): `x.device` and `model.blocks` made the notebook's globals `device`
    and `blocks` look used, so the code as given was refused ('uses device, a device from the notebook') or got an
    import of a Sequential that does not exist. Only global reads count; a model from the notebook is refused."""
    import linecache
    import types
    from gpulab.exercises.exercise import SubmissionError
    mod = types.ModuleType("notebook")
    mod.__dict__["__name__"] = "__main__"
    filename = str(tmp_path / "cell.py")
    linecache.cache[filename] = (len(NOTEBOOK_CELL), None, NOTEBOOK_CELL.splitlines(True), filename)
    exec(compile(NOTEBOOK_CELL, filename, "exec"), mod.__dict__)
    source = submission_source(mod.my_make_step)
    assert "device =" not in source and "blocks" not in source.split("def my_make_step")[0], source
    assert "import" not in source.split("def my_make_step")[0].replace("# written by gpulab.exercises", ""), source
    with pytest.raises(SubmissionError, match="'blocks', a Sequential from the notebook"):
        submission_source(mod.reads_the_notebooks_model)


def test_strict_grading_raises_where_the_notebooks_own_code_was_not_graded(monkeypatch):
    from gpulab.exercises.exercise import NotGraded, Verdict, _strict
    monkeypatch.setenv("GPULAB_GRADING_STRICT", "1")
    with pytest.raises(NotGraded, match="not graded: uses device"):
        _strict(Verdict("05.pinned", "failed", ["not graded: uses device"]))
    with pytest.raises(NotGraded):
        _strict(Verdict("09.checkpoint", "error", ["raised ImportError"]))
    assert _strict(Verdict("05.pinned", "passed", ["the same training"])).state == "passed"
    assert _strict(Verdict("05.pinned", "failed", ["too slow"], speed_judged=True)).state == "failed"
    monkeypatch.delenv("GPULAB_GRADING_STRICT")
    assert _strict(Verdict("05.pinned", "error", ["raised"])).state == "error"


def test_a_lesson_s_exercise_is_found_in_its_own_module_alone():
    """exercise("01.sync") imports e01 and no other lesson's module (e12's builds a torch.compile'd function when
    imported); an unknown name still lists every exercise."""
    import subprocess
    import sys
    code = ("import sys\nfrom gpulab.exercises.registry import task\nassert task('01.sync').lesson == '01'\n"
            "print(sorted(m for m in sys.modules if m[:20].startswith('gpulab.exercises.e') and m[18:20].isdigit()))\n"
            "try:\n    task('01.nothing')\nexcept KeyError as err:\n    print(err)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[0] == "['gpulab.exercises.e01_measuring_time']", out
    assert "no exercise '01.nothing'; there are: 01.sync" in out and "12.fusion" in out


def test_a_task_in_another_lesson_s_module_is_refused_on_either_path(monkeypatch):
    import types

    from gpulab.exercises import registry
    from gpulab.exercises.task import Task
    stray = Task(name="02.stray", lesson="02", title="", tier="systems", slow=None, reference=None, build=None,
                 what="", hints=("", ""))
    fake = types.SimpleNamespace(TASKS=[stray])
    monkeypatch.setattr(registry.importlib, "import_module", lambda name: fake)
    registry._module_tasks.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"exercise '02.stray' \(lesson 02\) is defined in e01_measuring_time"):
            registry.for_lesson("01")
    finally:
        registry._module_tasks.cache_clear()
