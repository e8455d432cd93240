"""Issue 15: a failed check says why it failed. Every self-check in every notebook (`lesson.expect`,
`lesson.expect_band`) gives its own failure text (`why_fail=`), distinct from its skip text (`why_not=`),
and the failure text never reads like a skip ("tiny scale", "CPU run", "has not measured"...)."""
import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SKIP_WORDS = ("tiny scale", "tiny size", "cpu run", "on the cpu", "has not measured", "not run", "skipped")


def checks(path: Path) -> list[ast.Call]:
    """Every call of lesson.expect / lesson.expect_band in the notebook's code cells."""
    calls = []
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        tree = ast.parse("\n".join(line for line in src.splitlines() if not line.lstrip().startswith(("%", "!"))))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("expect", "expect_band")
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "lesson"):
                calls.append(node)
    return calls


def strings(node: ast.AST) -> str:
    """The literal text in an expression (string constants and f-string parts), lower-cased."""
    return " ".join(n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)).lower()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_every_check_says_why_it_failed_in_its_own_words(path):
    wrong = []
    for call in checks(path):
        kw = {k.arg: k.value for k in call.keywords}
        where = f"{path.name}: line {call.lineno} of its cell, {ast.unparse(call)[:80]}"
        if isinstance(kw.get("applies"), ast.Constant) and kw["applies"].value is False:
            continue                                  # a check that never runs has no failure
        if len(call.args) > 1 and isinstance(call.args[1], ast.Constant) and call.args[1].value is None:
            continue                                  # nothing measured: always skipped
        fail = kw.get("why_fail")
        if fail is None or not strings(fail).strip():
            wrong.append(f"{where}: no why_fail text")
            continue
        if "why_not" in kw and ast.unparse(fail) == ast.unparse(kw["why_not"]):
            wrong.append(f"{where}: why_fail is its why_not")
        said = strings(fail)
        if any(re.search(rf"\b{re.escape(w)}\b", said) for w in SKIP_WORDS):
            wrong.append(f"{where}: why_fail reads like a skip ({said[:60]!r})")
    assert not wrong, "\n".join(wrong)


def test_the_scan_finds_the_checks():
    assert sum(len(checks(p)) for p in NOTEBOOKS) > 30
