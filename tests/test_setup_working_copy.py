"""`bash setup.sh lab` opens the learner's own copy of the lessons, never notebooks/.

JupyterLab saves outputs into the notebooks it has open, so `setup.sh lab` makes a
git-ignored working copy (my-notebooks/) from notebooks/ on first start and points
JupyterLab's root there; `setup.sh reset NN` starts one lesson afresh. Each test runs
the real setup.sh in a small git clone under tmp_path (setup.sh, .gitignore,
notebooks/), with a stand-in virtual environment whose `python` succeeds at
everything and whose `jupyter` records its arguments instead of starting a server.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))

pytestmark = pytest.mark.skipif(shutil.which("git") is None or shutil.which("bash") is None,
                                reason="needs git and bash")


def _git(clone: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.org"}
    return subprocess.run(["git", "-C", str(clone), *args], check=True, capture_output=True,
                          text=True, env=env).stdout


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.ipynb"))}


@pytest.fixture
def clone(tmp_path) -> Path:
    """A fresh clone: this repository's setup.sh, .gitignore and notebooks/, committed."""
    repo = tmp_path / "clone"
    (repo / "notebooks").mkdir(parents=True)
    for name in ("setup.sh", ".gitignore"):
        shutil.copy2(ROOT / name, repo / name)
    for name in LESSONS:
        shutil.copy2(ROOT / "notebooks" / name, repo / "notebooks" / name)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "clone")
    return repo


@pytest.fixture
def venv(tmp_path) -> Path:
    """A stand-in .venv: `python` answers yes to everything (torch present, pip install done),
    `jupyter` writes its arguments to jupyter-args.json and exits."""
    v = tmp_path / "venv"
    (v / "bin").mkdir(parents=True)
    (v / "bin" / "python").write_text("#!/bin/sh\nexit 0\n")
    (v / "bin" / "jupyter").write_text(
        "#!/bin/sh\n"
        f"exec python3 -c 'import json, sys; json.dump(sys.argv[1:], open(\"{v}/jupyter-args.json\", \"w\"))' \"$@\"\n")
    for exe in ("python", "jupyter"):
        (v / "bin" / exe).chmod(0o755)
    return v


def setup_sh(clone: Path, venv: Path, *args: str, ok: bool = True, **env: str) -> str:
    """Run the clone's setup.sh; returns what it printed (stdout and stderr)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("GPULAB_")}
    full.update(GPULAB_VENV=str(venv), **env)
    out = subprocess.run(["bash", str(clone / "setup.sh"), *args], cwd=clone, env=full,
                         capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    assert (out.returncode == 0) == ok, f"setup.sh {' '.join(args)} exited {out.returncode}:\n{text}"
    return text


def jupyter_args(venv: Path) -> list[str]:
    return json.loads((venv / "jupyter-args.json").read_text())


def learner_edits(nb: Path, text: str = "my own note") -> None:
    """What JupyterLab's autosave does to a lesson: outputs and edits written into the file."""
    doc = json.loads(nb.read_text())
    doc["cells"].append({"cell_type": "markdown", "metadata": {}, "source": [text]})
    nb.write_text(json.dumps(doc, indent=1))


def test_first_start_makes_a_git_ignored_working_copy_and_jupyterlab_opens_it(clone, venv):
    before = _digests(clone / "notebooks")
    out = setup_sh(clone, venv, "lab", "--no-browser")
    work = clone / "my-notebooks"
    assert _digests(work) == before, "the working copy should hold every lesson, as in notebooks/"
    assert "made your working copy my-notebooks/" in out and f"({len(LESSONS)} lessons)" in out
    assert "bash setup.sh reset" in out
    args = jupyter_args(venv)
    assert args[0] == "lab" and "--ServerApp.root_dir=my-notebooks" in args and "--no-browser" in args
    assert "--port=8888" in args
    _git(clone, "check-ignore", "-q", f"my-notebooks/{LESSONS[0]}")    # exits non-zero if not ignored
    learner_edits(work / LESSONS[2])                                    # a learner works in a lesson
    assert _git(clone, "status", "--porcelain") == ""
    assert _digests(clone / "notebooks") == before


def test_a_second_start_keeps_the_learners_work(clone, venv):
    setup_sh(clone, venv, "lab")
    nb = clone / "my-notebooks" / LESSONS[3]
    learner_edits(nb)
    edited = nb.read_bytes()
    out = setup_sh(clone, venv, "lab")
    assert nb.read_bytes() == edited
    assert "made your working copy" not in out and "opens your working copy my-notebooks/" in out
    assert "new lessons" not in out
    assert _git(clone, "status", "--porcelain") == ""


def test_a_new_lesson_after_a_pull_is_copied_without_overwriting(clone, venv):
    setup_sh(clone, venv, "lab")
    mine = clone / "my-notebooks" / LESSONS[1]
    learner_edits(mine)
    edited = mine.read_bytes()
    shutil.copy2(clone / "notebooks" / LESSONS[0], clone / "notebooks" / "99_new_lesson.ipynb")
    _git(clone, "add", "-A")
    _git(clone, "commit", "-q", "-m", "a new lesson")                  # what a git pull brings
    out = setup_sh(clone, venv, "lab")
    assert (clone / "my-notebooks" / "99_new_lesson.ipynb").read_bytes() == \
        (clone / "notebooks" / "99_new_lesson.ipynb").read_bytes()
    assert "new lessons in notebooks/, copied into my-notebooks/: 99_new_lesson.ipynb" in out
    assert mine.read_bytes() == edited
    assert _git(clone, "status", "--porcelain") == ""


def test_a_lesson_changed_upstream_is_named_and_left_alone(clone, venv):
    setup_sh(clone, venv, "lab")
    mine = clone / "my-notebooks" / LESSONS[3]
    learner_edits(mine)
    edited = mine.read_bytes()
    learner_edits(clone / "notebooks" / LESSONS[3], "a fix from upstream")
    out = setup_sh(clone, venv, "lab")
    nn = LESSONS[3].split("_")[0]
    assert "changed in notebooks/ since you copied them" in out and f"bash setup.sh reset {nn}" in out
    assert mine.read_bytes() == edited


def test_reset_restores_one_lesson_keeps_the_old_copy_and_the_others(clone, venv):
    before = _digests(clone / "notebooks")
    setup_sh(clone, venv, "lab")
    work = clone / "my-notebooks"
    target, other = LESSONS[3], LESSONS[5]
    learner_edits(work / target, "work to replace")
    learner_edits(work / other, "work to keep")
    other_edited = (work / other).read_bytes()
    nn = target.split("_")[0]
    out = setup_sh(clone, tmp_venv_absent := clone / "no-venv", "reset", nn)   # installs nothing
    assert not tmp_venv_absent.exists()
    assert (work / target).read_bytes() == (clone / "notebooks" / target).read_bytes()
    assert (work / other).read_bytes() == other_edited
    kept = list((work / "replaced").glob(f"{target[:-len('.ipynb')]}-*.ipynb"))
    assert len(kept) == 1 and "work to replace" in kept[0].read_text()
    assert f"replaced my-notebooks/{target} with a fresh copy of notebooks/{target}" in out
    assert str(kept[0].relative_to(clone)) in out
    assert _digests(clone / "notebooks") == before
    assert _git(clone, "status", "--porcelain") == ""
    # Resetting a clean lesson replaces nothing; the next start still keeps the other lesson's work.
    again = setup_sh(clone, venv, "reset", f"my-notebooks/{target}")
    assert "nothing replaced" in again and len(list((work / "replaced").iterdir())) == 1
    setup_sh(clone, venv, "lab")
    assert (work / other).read_bytes() == other_edited


def test_reset_all_and_unknown_lessons(clone, venv):
    setup_sh(clone, venv, "lab")
    work = clone / "my-notebooks"
    for name in LESSONS[:2]:
        learner_edits(work / name)
    out = setup_sh(clone, venv, "reset", "all")
    assert _digests(work) == _digests(clone / "notebooks")
    assert out.count("replaced my-notebooks/") == 2
    bad = setup_sh(clone, venv, "reset", "77", ok=False)
    assert "found 0" in bad and LESSONS[0] in bad
    assert "found" in setup_sh(clone, venv, "reset", "1", ok=False)    # 10..14: more than one
    assert "usage" in setup_sh(clone, venv, "reset", ok=False)


def test_gpulab_notebooks_can_name_another_folder_or_the_tracked_one(clone, venv, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    out = setup_sh(clone, venv, "lab", GPULAB_NOTEBOOKS=str(elsewhere))
    assert _digests(elsewhere) == _digests(clone / "notebooks")
    assert f"--ServerApp.root_dir={elsewhere}" in jupyter_args(venv)
    assert not (clone / "my-notebooks").exists()
    out = setup_sh(clone, venv, "lab", GPULAB_NOTEBOOKS="notebooks")
    assert "--ServerApp.root_dir=notebooks" in jupyter_args(venv)
    assert "saves outputs into the tracked lessons" in out
    assert sorted(p.name for p in (clone / "notebooks").iterdir()) == LESSONS
    assert setup_sh(clone, venv, "reset", "00", ok=False, GPULAB_NOTEBOOKS="notebooks")
    out = setup_sh(clone, venv, "lab", GPULAB_NOTEBOOKS="unignored")
    assert "git does not ignore unignored/" in out


def test_a_port_of_the_learners_own_is_the_only_port(clone, venv):
    """jupyter refuses two ports ("port only accepts one value"): a --port given to setup.sh replaces the default."""
    for given in (["--port", "8899"], ["--port=8899"], ["--ServerApp.port=8899"]):
        setup_sh(clone, venv, "lab", *given)
        args = jupyter_args(venv)
        assert [a for a in args if "port" in a] == [a for a in given if "port" in a], args
