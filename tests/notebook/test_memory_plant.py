"""Issue 40, item 2: every notebook's memory checks can fail, shown with a planted leak.

The notebooks' own test run (nbval, the root conftest.py) plants GPULAB_MEMORY_PLANT bytes right after each
notebook's first code cell, in the CPU counting and strict modes: every check against the notebook's start must
count them (PlantNotSeen, naming them, if one does not), then leaves them out, so the same run is the control.
That covers every such check of all 16 notebooks without running any notebook twice; the first tests here hold
the wiring to that. The last one runs the start of one notebook for real without the probe: a tensor left in a
global after its first cell makes its first memory check raise, naming at least the planted bytes.
"""
import importlib.util
import json
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
MODES = ("GPULAB_MEMORY_CPU", "GPULAB_MEMORY_STRICT", "GPULAB_MEMORY_PLANT", "GPULAB_GRADING_STRICT")
UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def root_conftest():
    spec = importlib.util.spec_from_file_location("gpulab_root_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class IPyNbCell(SimpleNamespace):
    """Stands in for nbval's item: the hook knows it by its class name."""


def test_the_notebook_run_plants_a_leak_after_each_notebooks_first_cell(monkeypatch):
    conftest = root_conftest()
    monkeypatch.setattr(conftest, "_notebooks_on_cpu", lambda: True)
    a, b = SimpleNamespace(name="00"), SimpleNamespace(name="01")
    items = [IPyNbCell(parent=a, cell=SimpleNamespace(source="import torch")),
             IPyNbCell(parent=a, cell=SimpleNamespace(source="x = 1")),
             SimpleNamespace(parent=None, cell=SimpleNamespace(source="a unit test")),
             IPyNbCell(parent=b, cell=SimpleNamespace(source="lesson.start('01')"))]
    saved = {name: os.environ.get(name) for name in MODES}
    try:
        conftest.pytest_collection_modifyitems(None, items)
        assert {name: os.environ[name] for name in MODES} == conftest.MEMORY_MODES
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    planted = f".plant_leak({8 * 2**20})"
    assert items[0].cell.source.startswith("import torch\n") and planted in items[0].cell.source
    assert items[3].cell.source.startswith("lesson.start('01')\n") and planted in items[3].cell.source
    assert items[1].cell.source == "x = 1" and items[2].cell.source == "a unit test"


def test_every_notebook_starts_its_accounting_in_its_first_code_cell():
    """The plant goes after the first code cell: that cell must be the one that records the notebook's start."""
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        code = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        assert "lesson.start(" in "".join(code[0]["source"]), path.name


def test_a_leak_left_after_the_first_cell_fails_the_first_memory_check(monkeypatch, tmp_path):
    """Notebook 02 (memory) at the tiny size on the CPU, counting and strict: its first cell, then 3 MiB left in a
    global, as a forgetful cell would, then its cells up to the first one that checks memory (section 7's)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("GPULAB_MEMORY_CPU", "1")
    monkeypatch.setenv("GPULAB_MEMORY_STRICT", "1")
    monkeypatch.setenv("GPULAB_DEVICE", "cpu")
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path / "results.json"))
    planted = 3 * 2**20
    nb = nbformat.read(NOTEBOOKS / "02_memory_fragmentation.ipynb", as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    cells = [code[0], nbformat.v4.new_code_cell(f"_planted = torch.ones({planted}, dtype=torch.uint8)"), *code[1:]]
    from kernels import PollingKernelManager      # tests/kernels.py

    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=300, kernel_manager_class=PollingKernelManager,
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    failed = None
    with client.setup_kernel():
        for i, cell in enumerate(cells):
            try:
                client.execute_cell(cell, i)
            except nbclient.exceptions.CellExecutionError as err:
                failed = err
                break
            said = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
            assert "memory check" not in said, f"a memory check passed with {planted} bytes planted:\n{said}"
    assert failed is not None and failed.ename == "MemoryNotReturned", failed
    found = re.search(r"([\d.]+) (B|KiB|MiB|GiB) more than at the notebook's start", failed.evalue)
    assert found, failed.evalue
    assert float(found[1]) * UNITS[found[2]] >= planted - 0.05 * 2**20, failed.evalue    # fmt_bytes rounds
    assert "held since an earlier cell, not declared as kept" in failed.evalue
