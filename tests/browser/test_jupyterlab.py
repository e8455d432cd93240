"""The course as a learner meets it: JupyterLab in a real (headless) browser.

Starts JupyterLab with the README's command (`bash setup.sh lab`, on a free
localhost port with a token), drives Debian's Chromium through Playwright,
runs a lesson, waits for its widget panel to render, changes a toggle, presses
Run and checks that a new run appears; then checks notebook 00's tables.

Needs /usr/bin/chromium (Debian's `chromium` package; never a browser download).
Without it the test is skipped, unless GPULAB_REQUIRE_BROWSER=1 (as in CI), when
it fails. A screenshot of every step lands in test-artifacts/browser/.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHROMIUM = os.environ.get("GPULAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
# What JupyterLab shows instead of a widget when its front end is missing or broken.
WIDGET_FAILURES = ("Loading widget...", "Error displaying widget", "model not found",
                   "A Jupyter widget could not be displayed")

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


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab started by the README's command, on a copy of the notebooks; always stopped."""
    _require_browser()
    pytest.importorskip("playwright.sync_api")
    work = tmp_path_factory.mktemp("lab")
    shutil.copytree(ROOT / "notebooks", work / "notebooks")   # run-all must not touch the repo's files
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "GPULAB_PORT": str(port), "GPULAB_NOTEBOOKS": str(work / "notebooks"),
           "GPULAB_RESULTS": str(work / "results.json")}
    log = open(work / "lab.log", "w")
    proc = subprocess.Popen(
        ["bash", str(ROOT / "setup.sh"), "lab", "--no-browser", f"--ServerApp.token={token}",
         "--LabApp.expose_app_in_browser=True"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
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
        yield {"url": f"http://127.0.0.1:{port}", "token": token}
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
    page.wait_for_function(  # every code cell has run (an execution count, not '*')
        "[...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]"
        ".every(p => /\\[\\d+\\]/.test(p.textContent))", timeout=150_000)
    steps.shot("ran-all")


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
def ran_notebook(browser, lab, notebook: str, name: str):
    """A page with `notebook` opened and run through without a failed cell; a screenshot
    is saved if anything in the block fails, and the page is always closed."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    steps = Steps(page, name)
    try:
        open_and_run_all(page, lab, notebook, steps)
        assert_no_errors(page, steps)
        yield page, steps
    except Exception:
        steps.shot("failed")
        raise
    finally:
        page.close()


def test_a_lesson_panel_renders_and_reacts_to_a_toggle(lab, browser):
    with ran_notebook(browser, lab, "01_measuring_time.ipynb", "lesson01") as (page, steps):
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


def test_notebook_00_shows_the_ceilings_table(lab, browser):
    with ran_notebook(browser, lab, "00_gpu_ceilings.ipynb", "lesson00") as (page, steps):
        seen = page.locator(".jp-OutputArea-output table", has_text="matmul fp32").last
        seen.wait_for(timeout=30_000)
        seen.scroll_into_view_if_needed()
        steps.shot("ceilings-table")
        text = seen.inner_text()
        assert "device copy" in text and "TFLOP/s" in text
        facts = page.locator(".jp-OutputArea-output table", has_text="compute capability").first
        facts.scroll_into_view_if_needed()
        assert "architecture" in facts.text_content()
