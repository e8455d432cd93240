"""The course as a learner meets it: JupyterLab in a real (headless) browser.

Makes a fresh clone of this working tree (its tracked and not-ignored files,
committed in a temporary git repository) and starts JupyterLab there with the
README's command (`bash setup.sh lab`, on a free localhost port with a token),
which opens the learner's git-ignored working copy my-notebooks/. Drives Debian's
Chromium through Playwright: checks notebook 00's tables; in 01 waits for the
widget panel to render, changes a toggle, presses Run and checks that a new run
appears; saves each lesson into the working copy, as a learner's autosave would; shows the instructor's live exercises' board (`room_board`) of a room
where two learners were graded in the test process, a pass and a cheat; then checks that the clone is still clean
(`git status --porcelain` empty, notebooks/ as committed) while my-notebooks/ holds
the outputs.

Which lessons (`BROWSER_LESSONS`): every lesson's kernel code runs under nbval, and under the GPU
profiles in tests/test_portability.py; what only a browser shows is the front end (widgets render,
a toggle reruns, a figure appears, JupyterLab saves into the working copy), and two lessons show
all of it. Running all sixteen here took 352 s of a 14.7-minute CI run on 2 cores (2026-12-03), where
issue 7 set this test's limit at 3 minutes (four took 232 s on 2026-12-07: 06 and 13 left, see BROWSER_LESSONS);
the portability matrix runs the other lessons that branch
on the device under this test's profile instead, through nbclient, at about half a browser run's cost.

Needs /usr/bin/chromium (Debian's `chromium` package; never a browser download).
Without it the test is skipped, unless GPULAB_REQUIRE_BROWSER=1 (as in CI), when
it fails. Screenshots land in test-artifacts/browser/, named after the notebook:
`NN_name-MM-step.png` for every step, and for the lessons in SHOWCASE (01)
each output with a figure or a widget as `NN_name-DEVICE-output-KK.png` (DEVICE: cpu
or cuda), in notebook order.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHROMIUM = os.environ.get("GPULAB_CHROMIUM", "/usr/bin/chromium")
# The lessons run in JupyterLab under this GPU profile (its control flow on the CPU), so the portability
# matrix (tests/test_portability.py) need not run every lesson under it a second time; the plain CPU flow
# is nbval's pass over notebooks/.
PROFILE = "t4"
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
# What JupyterLab shows instead of a widget when its front end is missing or broken.
WIDGET_FAILURES = ("Loading widget...", "Error displaying widget", "model not found",
                   "A Jupyter widget could not be displayed")

# Lessons whose figures and widgets are screenshot one by one (on the CPU as well).
SHOWCASE = ("01_measuring_time.ipynb",)
# The lessons run here (tests/test_portability.py reads this line: it runs the rest under PROFILE)
# 06 and 13 left on 2026-12-07: their run-throughs took 51 s and 80 s of the test's 232 s in one run (06 136 s in
# the next, beside the hub test), against issue 7's 3 minutes; their kernel code runs under nbval and under both
# profiles in the matrix, and their panels are the Panel that 01 renders, toggles and plots here.
BROWSER_LESSONS = ("00", "01")
RUN_ALL_TIMEOUT_MS = 420_000      # one lesson's run-all at tiny size on a busy 2-core machine
SAVED: list[str] = []             # the lessons saved into the working copy, in order

pytestmark = pytest.mark.browser


def _require_browser() -> None:
    if Path(CHROMIUM).is_file():
        return
    why = f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)"
    if os.environ.get("GPULAB_REQUIRE_BROWSER") == "1":
        pytest.fail(why + "; GPULAB_REQUIRE_BROWSER=1 demands the browser test")
    pytest.skip(why)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "gpulab test", "GIT_AUTHOR_EMAIL": "test@example.org",
           "GIT_COMMITTER_NAME": "gpulab test", "GIT_COMMITTER_EMAIL": "test@example.org"}
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True, env=env).stdout


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """A fresh clone of the working tree as it is now (tracked and not-ignored files), committed
    in a repository of its own; nothing the test does touches this repository's files."""
    _require_browser()
    if shutil.which("git") is None:
        pytest.skip("needs git")
    repo = tmp_path_factory.mktemp("clone")
    listed = _git(ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():                                   # a tracked file may be deleted here
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, repo / rel)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "a fresh clone")
    assert _git(repo, "status", "--porcelain") == ""
    return repo


@pytest.fixture(scope="module")
def lab(clone, tmp_path_factory):
    """JupyterLab started by the README's command in the clone, on its default working copy; always stopped."""
    pytest.importorskip("playwright.sync_api")
    work = tmp_path_factory.mktemp("lab")
    port, token = _free_port(), secrets.token_hex(16)
    env = {k: v for k, v in os.environ.items() if k != "GPULAB_NOTEBOOKS"}   # the default working copy
    env.update(
        GPULAB_PORT=str(port), GPULAB_RESULTS=str(work / "results.json"), GPULAB_PROFILE=PROFILE,
        # This interpreter's environment as it is (installing would re-point its editable gpulab at the
        # clone), and the clone's gpulab first on the path, so the kernels run the clone's code.
        GPULAB_VENV=sys.prefix, GPULAB_SKIP_INSTALL="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(clone), os.environ.get("PYTHONPATH")])),
        JUPYTERLAB_WORKSPACES_DIR=str(work / "workspaces"))
    log = open(work / "lab.log", "w")
    proc = subprocess.Popen(
        ["bash", str(clone / "setup.sh"), "lab", "--no-browser", f"--ServerApp.token={token}",
         "--LabApp.expose_app_in_browser=True"],
        cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/status?token={token}", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("JupyterLab did not start:\n" + (work / "lab.log").read_text()[-3000:])
                time.sleep(0.5)
        yield {"url": f"http://127.0.0.1:{port}", "token": token, "clone": clone, "log": work / "lab.log"}
    finally:
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)                 # the server and every kernel it started
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        log.close()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


class Steps:
    """Takes a screenshot after every step, so a failure shows where it stopped."""

    def __init__(self, page, name: str):
        self.page, self.name, self.n = page, name, 0
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        for old in ARTIFACTS.glob(f"{name}-*.png"):          # a previous run's shots of this notebook
            old.unlink()

    def shot(self, what: str) -> None:
        self.n += 1
        self.page.screenshot(path=str(ARTIFACTS / f"{self.name}-{self.n:02d}-{what}.png"), full_page=False)


def open_and_run_all(page, lab, notebook: str, steps: Steps) -> None:
    # A workspace of its own, reset: only this notebook open, and it is the current widget.
    workspace = notebook.split("_")[0]
    page.goto(f"{lab['url']}/lab/workspaces/w{workspace}/tree/{notebook}?reset&token={lab['token']}")
    page.wait_for_function("window.jupyterapp !== undefined", timeout=60_000)
    page.evaluate("window.jupyterapp.started")
    page.wait_for_selector(".jp-Notebook", timeout=60_000)
    page.wait_for_function(  # our notebook is current, its kernel up and idle
        "window.jupyterapp.shell.currentWidget"
        f" && window.jupyterapp.shell.currentWidget.context.path === '{notebook}'"
        " && window.jupyterapp.shell.currentWidget.sessionContext"
        " && window.jupyterapp.shell.currentWidget.sessionContext.session"
        " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel"
        " && window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle'",
        timeout=90_000)
    news = page.locator(".jp-toast-button", has_text="No")   # "notified about Jupyter news?"
    if news.count():
        news.first.click()
    steps.shot("opened")
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    try:
        page.wait_for_function(  # every code cell has run (an execution count, not '*')
            "[...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]"
            ".every(p => /\\[\\d+\\]/.test(p.textContent))", timeout=RUN_ALL_TIMEOUT_MS)
    except Exception:
        assert_no_errors(page, steps)          # run-all stops at a failed cell: name it, not the timeout
        raise
    steps.shot("ran-all")


def save_and_shut_down(page, lab, notebook: str) -> None:
    """Save the notebook as JupyterLab's autosave would (into the working copy), then stop its kernel."""
    page.evaluate("window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_function("!window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=30_000)
    SAVED.append(notebook)
    page.evaluate("window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")


def _device() -> str:
    """What the kernels run on, as named in the showcase screenshots: cpu or cuda."""
    forced = os.environ.get("GPULAB_DEVICE", "auto")
    if forced in ("cpu", "cuda"):
        return forced
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def shoot_outputs(page, notebook: str, limit: int = 12) -> list[Path]:
    """One screenshot per output holding a figure or a widget, in notebook order:
    NN_name-DEVICE-output-KK.png."""
    stem, paths = f"{notebook[:-len('.ipynb')]}-{_device()}", []
    outputs = page.locator(".jp-Cell-outputWrapper").filter(
        has=page.locator("img, .jupyter-widgets, .widget-output"))
    for k in range(min(outputs.count(), limit)):
        out = outputs.nth(k)
        out.scroll_into_view_if_needed()
        page.wait_for_timeout(200)
        path = ARTIFACTS / f"{stem}-output-{k + 1:02d}.png"
        out.screenshot(path=str(path))
        paths.append(path)
    return paths


def assert_no_errors(page, steps: Steps) -> None:
    errors = page.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    tracebacks = [t for t in errors.all_inner_texts() if "Traceback" in t or "Error" in t]
    assert not tracebacks, f"a cell failed: {tracebacks[0][:500]}"


def assert_widgets_rendered(page, steps: Steps) -> None:
    text = page.locator(".jp-Notebook").inner_text()
    broken = [w for w in WIDGET_FAILURES if w in text]
    if broken or page.locator(".jupyter-widgets").count() == 0:
        page.locator(".jp-CodeCell", has_text="Panel(").last.scroll_into_view_if_needed()
        steps.shot("widgets-missing")
        pytest.fail("the ipywidgets front end did not render the lesson's panel "
                    f"(page shows {broken or 'no .jupyter-widgets element'}). Is the JupyterLab widget "
                    "extension installed? `gpulab doctor` checks it; the fix: "
                    "pip install --force-reinstall jupyterlab_widgets, then restart JupyterLab.")


def panel_runs(page) -> int:
    """How many runs the panel's table lists (rows minus the header)."""
    table = page.locator(".widget-output table").first
    return max(table.locator("tr").count() - 1, 0)


@contextlib.contextmanager
def ran_notebook(browser, lab, notebook: str, name: str | None = None):
    """A page with `notebook` opened and run through without a failed cell; a screenshot
    is saved if anything in the block fails; the notebook is always saved into the working
    copy, its kernel stopped and the page closed."""
    name = name or notebook[:-len(".ipynb")]
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    steps = Steps(page, name)
    failed = False
    try:
        open_and_run_all(page, lab, notebook, steps)
        assert_no_errors(page, steps)
        if notebook in SHOWCASE:
            for old in ARTIFACTS.glob(f"{notebook[:-len('.ipynb')]}-*-output-*.png"):
                old.unlink()
            assert shoot_outputs(page, notebook), f"{notebook} showed no figure or widget"
        yield page, steps
    except Exception:
        failed = True
        steps.shot("failed")
        raise
    finally:
        try:
            save_and_shut_down(page, lab, notebook)
        except Exception:
            if not failed:         # else the lesson's own failure is the one to report
                raise
        finally:
            page.close()


def test_notebook_00_shows_the_ceilings_table(lab, browser):
    with ran_notebook(browser, lab, "00_gpu_ceilings.ipynb") as (page, steps):
        seen = page.locator(".jp-OutputArea-output table", has_text="matmul fp32").last
        seen.wait_for(timeout=30_000)
        seen.scroll_into_view_if_needed()
        steps.shot("ceilings-table")
        text = seen.inner_text()
        assert "device copy" in text and "TFLOP/s" in text
        facts = page.locator(".jp-OutputArea-output table", has_text="compute capability").first
        facts.scroll_into_view_if_needed()
        assert "architecture" in facts.text_content()


def test_a_lesson_panel_renders_and_reacts_to_a_toggle(lab, browser):
    with ran_notebook(browser, lab, "01_measuring_time.ipynb") as (page, steps):
        page.wait_for_timeout(1000)
        assert_widgets_rendered(page, steps)
        run_button = page.locator(".jupyter-widgets button", has_text="Run").first
        run_button.scroll_into_view_if_needed()
        page.wait_for_selector(".widget-output table", timeout=30_000)
        before = panel_runs(page)
        assert before >= 1, "the panel shows no run after the notebook ran"
        steps.shot("panel-before")
        checkbox = page.locator(".widget-checkbox input[type=checkbox]").first   # "synchronize"
        was = checkbox.is_checked()
        checkbox.click()
        assert checkbox.is_checked() != was
        run_button.click()
        page.wait_for_function(
            f"document.querySelector('.widget-output table')"
            f" && document.querySelector('.widget-output table').querySelectorAll('tr').length - 1 > {before}",
            timeout=60_000)
        after = panel_runs(page)
        last_row = page.locator(".widget-output table tr").last.inner_text()
        page.locator(".widget-output table").first.scroll_into_view_if_needed()
        steps.shot("panel-after")
        assert after == before + 1
        assert ("True" if not was else "False") in last_row, f"the new run did not use the toggle: {last_row}"
        page.locator(".widget-output img").first.wait_for(timeout=30_000)   # the plot follows the table


# A learner's submission that patches the grader's clock (as tests/workshop/test_hub_load.py's cheat): suspicious
CHEAT = ("import time\ntime.perf_counter = lambda: 0.0\n"
         "def make_step(model, optimizer):\n    return lambda x, y, host: None\n")


def test_the_instructors_board_shows_the_rooms_graded_exercises(lab, browser, tmp_path, monkeypatch):
    """Two learners really graded on 01.sync at tiny size (the lesson's fix, and a clock-patching cheat) into a
    room folder; a notebook in JupyterLab calls `room_board(folder)`: the page shows both, passed and SUSPICIOUS
    (format_board's words), and the "updated" line moves on as the background thread reads the folder again."""
    import json
    import re

    from gpulab.exercises import exercise
    room = tmp_path / "room"
    room.mkdir()
    ex = exercise("01.sync")
    for learner, submission, want in (("ana", ex.task.reference, "passed"), ("ben", CHEAT, "suspicious")):
        monkeypatch.setenv("GPULAB_RESULTS", str(room / f"{learner}.json"))
        verdict = ex.check(submission, scale="tiny", quiet=True)
        assert verdict.state == want, f"{learner}'s submission graded {verdict.state}, not {want}:\n{verdict}"
    notebook = "room_board.ipynb"
    cell = f"from gpulab.tools.board import room_board\nboard = room_board({str(room)!r}, every_s=1)"
    (lab["clone"] / "my-notebooks" / notebook).write_text(json.dumps({
        "cells": [{"cell_type": "code", "id": "board", "metadata": {}, "source": cell, "outputs": [],
                   "execution_count": None}],
        "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}},
        "nbformat": 4, "nbformat_minor": 5}))
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    steps = Steps(page, "room_board")
    try:
        open_and_run_all(page, lab, notebook, steps)
        assert_no_errors(page, steps)
        table = page.locator(".widget-html table.gpulab-board")
        table.wait_for(timeout=30_000)
        rows = table.locator("tr").all_inner_texts()
        ana = [r for r in rows if r.startswith("ana")]
        ben = [r for r in rows if r.startswith("ben")]
        assert len(rows) == 3 and len(ana) == len(ben) == 1, f"the board's rows: {rows}"
        assert "01.sync" in ana[0] and "passed" in ana[0] and "SUSPICIOUS" not in ana[0], ana[0]
        assert "01.sync" in ben[0] and "SUSPICIOUS" in ben[0], ben[0]
        assert table.locator("tr.gpulab-suspicious").count() == 1
        assert "1 passed" in page.locator(".widget-html", has_text="submission(s) by 2 learner(s)").inner_text()
        status = page.locator(".widget-html", has_text="updated")
        first = re.search(r"updated \d\d:\d\d:\d\d", status.inner_text())
        assert first, f"no 'updated HH:MM:SS' line: {status.inner_text()!r}"
        steps.shot("board")
        page.wait_for_function(   # the background thread's next look reaches the page
            "[...document.querySelectorAll('.widget-html')].some(e => /updated \\d\\d:\\d\\d:\\d\\d/.test("
            f"e.textContent) && !e.textContent.includes({first.group(0)!r}))", timeout=15_000)
        page.locator(".jupyter-widgets button", has_text="Stop").click()
        page.wait_for_function("[...document.querySelectorAll('.widget-html')].some(e => "
                               "e.textContent.includes('(stopped)'))", timeout=15_000)
        steps.shot("stopped")
    except Exception:
        steps.shot("failed")
        raise
    finally:
        try:        # not saved: the notebook is this test's own, not a lesson of the working copy
            page.evaluate("window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")
        finally:
            page.close()


def test_the_clone_is_still_clean_after_jupyterlab_ran_the_lessons(lab):
    """Everything JupyterLab saved went into the git-ignored working copy; notebooks/ is as committed."""
    clone = lab["clone"]
    assert "made your working copy my-notebooks/" in lab["log"].read_text()
    if not SAVED:
        pytest.skip("no lesson ran in this session")
    status = _git(clone, "status", "--porcelain", "--untracked-files=all")
    assert status == "", f"running the lessons left the clone dirty:\n{status}"
    for notebook in SAVED:
        mine = clone / "my-notebooks" / notebook
        assert mine.read_bytes() != (clone / "notebooks" / notebook).read_bytes(), \
            f"{notebook}: JupyterLab's save did not reach the working copy my-notebooks/"
        _git(clone, "check-ignore", "-q", str(mine.relative_to(clone)))
