"""The portability matrix: the notebooks under the GPU profiles learners bring, on the CPU.

Under `GPULAB_PROFILE` the course takes a GPU class's control flow (its precisions, TF32, bf16, FP8,
memory) with CPU tensors, so a crash only that class would hit (notebook 00 indexing a bf16 result
that a T4 never measures) fails here, in CI, without the GPU.

How the matrix was chosen, to stay well inside CI's time on 2 cores:
- profiles: one per distinct control flow. The profiles' facts differ only in compute capability
  and what it implies; `signature` groups them (before Ampere: no TF32, no bf16; Ampere and later:
  TF32 and bf16). One representative each: t4, rtx4090. `test_representatives_cover_every_profile`
  fails if a new profile brings a new signature.
- notebooks: those whose code, or the code of the lesson module they import, reads the device's
  facts (`BRANCHES`); the others cannot take another path under a profile. The selection is computed,
  so a lesson that starts branching on the device joins the matrix by itself.
- where the browser test runs (CI), it runs its lessons (`BROWSER_LESSONS`) in JupyterLab under one
  representative (its PROFILE): the matrix leaves those pairs out (`MATRIX`), and runs every other
  branching lesson under every representative.
"""
import json
import os
import re
from pathlib import Path

import pytest
from kernels import PollingKernelManager      # tests/kernels.py

from gpulab.core.device import facts_for_capability
from gpulab.core.profiles import PROFILES

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
BRANCHES = re.compile(r"device_facts|facts\.|supported\(|supported_precisions|refusal|best_half|half_dtype|"
                      r"gpu_class|timed_precisions|gemm_precisions|what_to_expect|all_on\(")
REPRESENTATIVES = ("t4", "rtx4090")


def signature(key: str) -> tuple:
    """What a profile changes in the course's control flow: the capability flags that choose which code
    runs today (Tensor Cores, TF32, bf16). FP8 only adds a sentence to `precision.what_to_expect` (its unit
    tests cover it), and the GeForce class only picks a band, which is never judged under a profile. When a
    lesson starts branching on another fact, add it here: this test then asks for a representative of
    every new group."""
    p = PROFILES[key]
    f = facts_for_capability(p.name, *p.compute_capability, geforce=p.geforce)
    return (f.tensor_core_generation is not None, f.tf32, f.bf16)


def test_representatives_cover_every_profile():
    covered = {signature(k) for k in REPRESENTATIVES}
    missing = [k for k in PROFILES if signature(k) not in covered]
    assert not missing, f"profiles with a control flow the matrix does not run: {missing}"


def branching_notebooks() -> list[Path]:
    chosen = []
    for path in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        code = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                         if c["cell_type"] == "code")
        module = ROOT / "gpulab" / "lessons" / f"l{path.stem}.py"
        if BRANCHES.search(code) or (module.exists() and BRANCHES.search(module.read_text())):
            chosen.append(path)
    return chosen


# The matrix tests control flow, not numbers: each benchmark spends a tenth of its timing budget (at least 3
# samples still). Timing was 82 s of the kernels' 294 s in this file on 2 cores (py-spy, 2026-12-07).
TIMING_BUDGET = "0.1"
GRADED = ("exercise(", "ex.check(", "ex.hint(", "ex.show(", "ex.solution(", "speedrun(")


# Between two lessons in one kernel: the user's names go (a name a lesson forgot to define fails as in a fresh
# kernel), its figures are closed; the modules stay imported, which is what sharing the kernel saves.
RESET = "%reset -f\nimport gc as _gc, matplotlib.pyplot as _plt\n_plt.close('all'); _gc.collect(); del _gc, _plt"
# profile -> (kernel manager, client) of the kernel its lessons share in this file (shared=True)
KERNELS: dict[str, tuple] = {}


def run_notebook(path: Path, profile: str, timeout: int = 600, shared: bool = False) -> None:
    """Execute every cell of `path` at tiny size on the CPU under `profile`; CellExecutionError on a failure.
    The graded exercise's cells are left out: tests/exercises/test_profiles.py grades every exercise under each
    representative, at a fraction of the cost (a grading process per notebook run cost CI about a minute).
    `shared`: in the kernel this file keeps for `profile`, after RESET, instead of a fresh one: starting a kernel and
    importing torch and gpulab was 92 s of the kernels' 294 s here (py-spy, 2 cores, 2026-12-07). A lesson that fails
    takes its kernel down with it: the next starts a fresh one. nbval runs every lesson in a fresh kernel."""
    nb = nbformat.read(path, as_version=4)
    nb.cells = [c for c in nb.cells if not (c.cell_type == "code" and any(g in c.source for g in GRADED))]
    kept = KERNELS.get(profile) if shared else None
    if kept:
        nb.cells.insert(0, nbformat.v4.new_code_cell(RESET))
    env = {"GPULAB_PROFILE": profile, "GPULAB_DEVICE": "cpu", "GPULAB_SCALE": "tiny",
           "MPLBACKEND": "Agg", "GPULAB_TIMING_BUDGET": TIMING_BUDGET}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)                  # the kernel inherits this process's environment
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                     kernel_manager_class=PollingKernelManager,
                                     resources={"metadata": {"path": str(path.parent)}},
                                     **({"km": kept[0]} if kept else {}))
    if kept:
        client.kc = kept[1]
    try:
        client.execute(cleanup_kc=not shared)
        if shared:
            KERNELS[profile] = (client.km, client.kc)
    except BaseException:
        if shared:
            KERNELS.pop(profile, None)
            client._cleanup_kernel()
        raise
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module", autouse=True)
def _shared_kernels_stop():
    yield
    while KERNELS:
        km, kc = KERNELS.popitem()[1]
        client = nbclient.NotebookClient(nbformat.v4.new_notebook(), km=km)
        client.kc = kc
        client._cleanup_kernel()


def browser_profile() -> str | None:
    """The profile tests/browser runs its lessons under in JupyterLab, where that test will run (CI demands
    it: GPULAB_REQUIRE_BROWSER=1; elsewhere, where Chromium is installed): those runs cover its control flow."""
    text = (ROOT / "tests" / "browser" / "test_jupyterlab.py").read_text()
    found = re.search(r'^PROFILE = "(\w+)"', text, re.M)
    runs = os.environ.get("GPULAB_REQUIRE_BROWSER") == "1" or Path(os.environ.get("GPULAB_CHROMIUM",
                                                                              "/usr/bin/chromium")).exists()
    return found.group(1) if found and runs else None


def browser_lessons() -> set[str]:
    """The lessons (two-digit numbers) tests/browser runs in JupyterLab: its BROWSER_LESSONS line."""
    text = (ROOT / "tests" / "browser" / "test_jupyterlab.py").read_text()
    found = re.search(r"^BROWSER_LESSONS = \(([^)]*)\)", text, re.M)
    return set(re.findall(r'"(\d\d)"', found.group(1))) if found else set()


# (notebook, profile) pairs: every branching lesson under every representative, less what the browser runs
MATRIX = [(nb, p) for p in REPRESENTATIVES for nb in branching_notebooks()
          if not (p == browser_profile() and nb.name[:2] in browser_lessons())]


def test_the_browser_pass_and_the_matrix_cover_every_branching_lesson_under_every_representative():
    browser = browser_profile()
    covered = set(MATRIX) | {(nb, browser) for nb in branching_notebooks()
                             if browser is not None and nb.name[:2] in browser_lessons()}
    wanted = {(nb, p) for nb in branching_notebooks() for p in REPRESENTATIVES}
    assert covered == wanted, sorted((nb.name, p) for nb, p in wanted - covered)
    assert browser_lessons() >= {"00", "01"}, "the browser test's lesson list was not found"


@pytest.mark.parametrize("notebook,profile", MATRIX, ids=lambda v: v if isinstance(v, str) else v.stem[:2])
def test_notebook_runs_under_profile(notebook, profile):
    run_notebook(notebook, profile, shared=True)


def test_the_matrix_catches_a_planted_device_dependent_crash(tmp_path):
    """A cell that indexes a bf16 result unconditionally runs on an A100 and fails on a T4."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "from gpulab.lessons.l00_gpu_ceilings import supported_precisions\n"
        "tflops = {p: 1.0 for p in supported_precisions()}\n"
        "print(tflops['bf16'])\n")]
    path = tmp_path / "planted.ipynb"
    nbformat.write(nb, path)
    run_notebook(path, "a100", timeout=120)
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="KeyError"):
        run_notebook(path, "t4", timeout=120)


def test_a_shared_kernel_forgets_the_lesson_before_and_a_failure_ends_it(tmp_path):
    """In the kernel lessons share under a profile, a name the lesson before defined is gone (NameError, as in a
    fresh kernel), and a lesson that fails leaves no kernel behind for the next."""
    def notebook(name, source):
        nb = nbformat.v4.new_notebook()
        nb.cells = [nbformat.v4.new_code_cell(source)]
        nbformat.write(nb, tmp_path / name)
        return tmp_path / name
    KERNELS.pop("t4", None)
    run_notebook(notebook("a.ipynb", "import os\nleft_behind = os.getpid()"), "t4", timeout=120, shared=True)
    assert "t4" in KERNELS
    with pytest.raises(nbclient.exceptions.CellExecutionError, match="NameError"):
        run_notebook(notebook("b.ipynb", "print(left_behind)"), "t4", timeout=120, shared=True)
    assert "t4" not in KERNELS


def test_a_check_against_the_datasheet_is_skipped_under_a_profile():
    """Issue 24: under the T4 profile notebook 00 printed "FAIL copy bandwidth / datasheet: 13.2": an H200's
    copy divided by a T4's datasheet. A code cell that checks (lesson.expect) or draws a figure against the
    datasheet must say what happens under a profile (facts.profile) in that cell."""
    import json
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    offenders = []
    for path in sorted((root / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            src = "".join(cell["source"])
            if cell["cell_type"] != "code" or not re.search(r"\bsheet\.|\.datasheet\b", src):
                continue
            judged = "lesson.expect" in src or "hlines=" in src
            if judged and "profile" not in src:
                offenders.append(f"{path.name} cell {i}")
    assert not offenders, "checks against a datasheet with no word on profiles: " + ", ".join(offenders)
