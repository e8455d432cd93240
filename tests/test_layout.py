"""The package's layout is its architecture, and each lesson's measurement exists once.

- `gpulab/core` imports nothing from the rest of gpulab, and every folder imports only from the floors below it
  (`LAYERS`; the one declared exception: lesson 15 stands on `diagnose/`), as the package table of
  docs/adding-a-lesson.md says, in that order;
- every `gpulab bench` row is a lesson module's `headline(scale)`, and the bench builds no workload itself;
- every benched lesson's notebook runs its self-check on that same `headline()`;
- no private name of a gpulab module is used from another module;
- `python -m gpulab.tools.coursetime` works without torch.
"""
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpulab.tools import bench as B

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gpulab"
NOTEBOOKS = ROOT / "notebooks"


def gpulab_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every `import gpulab...` / `from gpulab... import ...` in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "gpulab" \
                and node.level == 0:
            found.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] == "gpulab"]
    return found


def test_core_imports_nothing_else_from_gpulab():
    wrong = []
    for path in sorted((PACKAGE / "core").glob("*.py")):
        for line, module, names in gpulab_imports(path):
            targets = [module] if module != "gpulab" else [f"gpulab.{n}" for n in names]
            wrong += [f"{path.relative_to(ROOT)}:{line} imports {t}" for t in targets
                      if not t.startswith("gpulab.core")]
    assert not wrong, "gpulab.core must not depend on the rest of gpulab:\n" + "\n".join(wrong)


# The package's floors, lowest first: a folder may import from the floors below it, not from above (the
# exercises stand on the diagnosis: notebook 15's answers diagnose a step)
LAYERS = [("core",), ("models",), ("lessons",), ("notebook",), ("diagnose",), ("exercises",), ("tools",)]
# Arrows that run up, declared: (the file, the folder it imports), each with why
DECLARED_UP = {("lessons/l15_your_training_step.py", "diagnose"): "lesson 15 is the diagnosis's own lesson"}


def folder_arrows() -> list[tuple[str, str, int, str]]:
    """(file under gpulab/, the gpulab folder it imports, line, module) for every import across folders."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if len(rel.parts) < 2:
            continue
        for line, module, names in gpulab_imports(path):
            targets = [module] if module != "gpulab" else [f"gpulab.{n}" for n in names]
            for t in targets:
                parts = t.split(".")
                if len(parts) > 1 and parts[1] != rel.parts[0]:
                    out.append((rel.as_posix(), parts[1], line, t))
    return out


def arrows_up(arrows) -> tuple[list[str], set]:
    """(the arrows that run up or sideways, not declared; the declared ones found)."""
    floor = {name: i for i, names in enumerate(LAYERS) for name in names}
    wrong, used = [], set()
    for file, target, line, module in arrows:
        source = file.split("/")[0]
        if floor[target] < floor[source]:
            continue
        if (file, target) in DECLARED_UP:
            used.add((file, target))
            continue
        wrong.append(f"gpulab/{file}:{line} imports {module}: {source} is on floor {floor[source]}, {target} on "
                     f"{floor[target]} (a folder imports only from the floors below it)")
    return wrong, used


def test_every_folder_imports_only_from_the_floors_below_it():
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert sorted(n for names in LAYERS for n in names) == folders, "LAYERS must name every package folder once"
    wrong, used = arrows_up(folder_arrows())
    assert not wrong, "\n".join(wrong)
    assert used == set(DECLARED_UP), f"declared arrows no longer there: {sorted(set(DECLARED_UP) - used)}"


def test_the_layering_check_sees_an_arrow_up_and_a_sideways_one():
    wrong, used = arrows_up([("lessons/l13_capstone.py", "notebook", 1, "gpulab.notebook"),      # up
                             ("lessons/l03_input_pipeline.py", "models", 2, "gpulab.models.cnn"),  # down: fine
                             ("lessons/l15_your_training_step.py", "diagnose", 3, "gpulab.diagnose")])  # declared
    assert len(wrong) == 1 and "l13_capstone.py:1 imports gpulab.notebook" in wrong[0]
    assert used == {("lessons/l15_your_training_step.py", "diagnose")}


def test_every_package_folder_is_what_the_package_page_says_in_floor_order():
    folders = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert folders == ["core", "diagnose", "exercises", "lessons", "models", "notebook", "tools"]
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py"]     # nothing flat beside them
    page = (ROOT / "docs" / "adding-a-lesson.md").read_text()
    rows = re.findall(r"^\| `gpulab/(\w+)/` \|", page, re.M)
    assert sorted(rows) == folders, f"the package table of docs/adding-a-lesson.md names {rows}, the package has {folders}"
    assert rows == [f for floor in LAYERS for f in floor], f"the package table is not in floor order (LAYERS): {rows}"


def lesson_modules() -> list[Path]:
    return sorted((PACKAGE / "lessons").glob("l[0-9][0-9]_*.py"))


def test_each_lesson_module_is_named_like_its_notebook():
    notebooks = {p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")}
    for path in lesson_modules():
        assert path.stem[1:] in notebooks, f"{path.name} has no notebook {path.stem[1:]}.ipynb"


def test_every_bench_row_is_a_lessons_headline():
    for exp in B.REGISTRY:
        module = exp.module
        assert module.__name__.startswith("gpulab.lessons.l"), module.__name__
        assert callable(module.headline) and exp.lesson == module.__name__.rsplit(".", 1)[1][1:3]
        assert list(__import__("inspect").signature(module.headline).parameters)[0] == "scale"
        assert isinstance(module.TITLE, str) and isinstance(module.HEADLINE, str)


def test_bench_builds_no_workload_of_its_own():
    """The bench holds no configuration, model or training step: those are the lessons'."""
    source = (PACKAGE / "tools" / "bench.py").read_text()
    for line, module, names in gpulab_imports(PACKAGE / "tools" / "bench.py"):
        assert not module.startswith("gpulab.models"), f"bench.py:{line} imports {module}"
    for pattern in (r"by_scale\(", r"torch\.randn\(", r"ResNetish\(", r"TransformerStack\(", r"GPT\(",
                    r"train_step\(", r"benchmark\(", r"\bconfig\("):
        assert not re.search(pattern, source), f"bench.py constructs or times a workload itself: {pattern}"


def notebook_code(path: Path) -> list[str]:
    nb = json.loads(path.read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


@pytest.mark.parametrize("exp", B.REGISTRY, ids=lambda e: e.lesson)
def test_each_benched_notebook_self_checks_the_same_headline(exp):
    module = exp.module.__name__.rsplit(".", 1)[1]
    notebook = NOTEBOOKS / f"{module[1:]}.ipynb"
    cells = notebook_code(notebook)
    code = "\n".join(cells)
    imports = re.findall(rf"from gpulab\.lessons\.{module} import (\([^)]*\)|[^\n]*)", code)
    assert any(re.search(r"\bheadline\b", names) for names in imports) or \
        re.search(rf"from gpulab\.lessons import {module} as (\w+)", code), \
        f"{notebook.name} does not import headline from gpulab.lessons.{module}"
    results = re.findall(r"^\s*(\w+)\s*=\s*(?:\w+\.)?headline\(", code, flags=re.M)
    assert results, f"{notebook.name} never calls headline()"
    assert any(re.search(r"expect(_band)?\(", cell) and any(f"{r}.ratio" in cell for r in results) for cell in cells), \
        f"{notebook.name}: no self-check (lesson.expect) reads the ratio of headline()'s result"


def test_no_private_name_crosses_a_module():
    """`from gpulab.x import _y` or `module._y` on a gpulab module imported under a name."""
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        aliases = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpulab"):
                for a in node.names:
                    if a.name.startswith("_"):
                        wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} imports private {a.name}")
                    if node.module in ("gpulab", "gpulab.core", "gpulab.lessons", "gpulab.models",
                                       "gpulab.notebook", "gpulab.tools"):
                        aliases.add(a.asname or a.name)
            elif isinstance(node, ast.Import):
                aliases |= {a.asname for a in node.names if a.name.startswith("gpulab") and a.asname}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in aliases and node.attr.startswith("_") and not node.attr.startswith("__"):
                wrong.append(f"{path.relative_to(ROOT)}:{node.lineno} uses {node.value.id}.{node.attr}")
    assert not wrong, "\n".join(wrong)


def test_coursetime_runs_without_torch(tmp_path):
    timings = tmp_path / "t.tsv"
    timings.write_text("0.000\t(session)\tstart\t100.0\n"
                       "2.500\tnotebooks/00_gpu_ceilings.ipynb::Cell 0\tpassed\t102.5\n")
    blocked = ("import sys, runpy; sys.modules['torch'] = None; "
               f"sys.argv = ['coursetime', {str(timings)!r}]; "
               "runpy.run_module('gpulab.tools.coursetime', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "00" in proc.stdout


@pytest.mark.parametrize("exp", B.REGISTRY, ids=lambda e: e.lesson)
def test_each_benched_notebook_takes_its_headline_band_from_bands_toml(exp):
    """One source for bands: the notebook's headline self-check reads gpulab/core/bands.toml
    (`lesson.expect_band`), the same band `gpulab bench` judges with, never a copy of it."""
    module = exp.module.__name__.rsplit(".", 1)[1]
    code = "\n".join(notebook_code(NOTEBOOKS / f"{module[1:]}.ipynb"))
    assert f'expect_band("{exp.lesson}"' in code, f"{module[1:]}.ipynb does not check its headline with expect_band"


def test_every_notebook_cell_has_a_unique_id():
    """nbformat 4.5 wants an id on every cell (nbformat warns now and will refuse later): cells added to
    notebook 13 by a script without one once slipped through, seen only as a warning in CI's log."""
    import json
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        if (nb["nbformat"], nb["nbformat_minor"]) >= (4, 5):
            missing = [i for i, c in enumerate(nb["cells"]) if "id" not in c]
            assert not missing, f"{path.name}: cells {missing} have no id"
            ids = [c["id"] for c in nb["cells"]]
            assert len(ids) == len(set(ids)), f"{path.name}: two cells share an id"


# Issue 42's bound on a room of the package: a newcomer reads a module whole
MAX_MODULE_LINES = 700


def test_no_test_file_is_over_the_bound_either():
    """The tests are read as often as the package: the same bound (test_l13_capstone, test_rules and test_analyze
    were split by section on 2026-12-07)."""
    long = {p.relative_to(ROOT).as_posix(): n for p in sorted((ROOT / "tests").rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, f"over {MAX_MODULE_LINES} lines (split the file by its sections): " + ", ".join(
        f"{p} {n}" for p, n in long.items())


def test_no_module_of_the_package_is_over_the_bound():
    long = {p.relative_to(ROOT).as_posix(): n for p in sorted(PACKAGE.rglob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, (f"over {MAX_MODULE_LINES} lines (split the module by its jobs, as lessons/capstone/ is): "
                      + ", ".join(f"{p} {n}" for p, n in long.items()))
