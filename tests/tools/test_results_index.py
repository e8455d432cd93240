"""results/: one folder per run, grouped by kind and named <date>-<gpu>-<what>, with a manifest; the README's index
generated from the manifests; every reference to a run folder in the tree names one that exists."""
import json
import re
import subprocess
from pathlib import Path

import pytest

from gpulab.tools import results_index as RI

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"


def test_the_readme_index_is_the_manifests():
    assert RI.main(["--check"]) == 0, "results/README.md is stale: run python -m gpulab.tools.results_index"


def test_every_file_of_a_run_is_in_a_run_folder_of_its_kind_with_a_manifest():
    loose = [p.name for p in RESULTS.iterdir() if p.is_file() and p.name != "README.md"]
    assert not loose, f"files outside a run folder: {loose}"
    kinds = sorted(p.name for p in RESULTS.iterdir() if p.is_dir())
    assert set(kinds) <= set(RI.KINDS), f"folders of results/ that are not a kind of run: {set(kinds) - set(RI.KINDS)}"
    runs = {(m["kind_of_run"], m["run"]): m["files"] for m in RI.manifests(RESULTS)}
    for kind in kinds:
        loose = [p.name for p in (RESULTS / kind).iterdir() if not p.is_dir()]
        assert not loose, f"files in results/{kind}/ outside a run folder: {loose}"
        for folder in (RESULTS / kind).iterdir():
            assert (folder / "manifest.json").exists(), f"results/{kind}/{folder.name}/ has no manifest.json"
            assert runs[kind, folder.name], f"results/{kind}/{folder.name}/ holds no files"
    assert len(runs) > 70 and {k for k, _ in runs} == set(RI.KINDS)


def _tracked_text() -> dict[str, str]:
    """Every tracked text file outside results/'s run files (their logs and stores keep the paths they wrote)."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    out = {}
    for name in names.stdout.split("\0"):
        path = ROOT / name
        if not name or not path.is_file() or path.suffix in {".gz", ".png"}:
            continue
        if name.startswith("results/") and not (name == "results/README.md" or path.name in ("manifest.json", "NOTES.md")):
            continue
        try:
            out[name] = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
    return out


def test_every_run_folder_the_tree_names_exists():
    """A path into results/ in code, tests, notebooks or prose names a kind and a run folder that exist; a run
    folder right under results/ (the flat layout before issue 42, named after the GPU first) is stale."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    kinds = "|".join(RI.KINDS)
    stale, missing = [], []
    for name, text in _tracked_text().items():
        for m in re.finditer(r"results/(?:h200|bench-|h200x2)[\w-]*", text):
            stale.append(f"{name}: {m.group(0)}")
        for m in re.finditer(rf"results/({kinds})/(\d{{4}}-\d\d-\d\d-[a-z0-9-]*[a-z0-9])(?![\w*-])", text):
            if not (RESULTS / m.group(1) / m.group(2)).is_dir():
                missing.append(f"{name}: {m.group(0)}")
    assert not stale, "paths of the old results/ layout (run the rename script of issue 42):\n" + "\n".join(stale)
    assert not missing, "paths to run folders that do not exist:\n" + "\n".join(missing)


def _run(tmp_path, empty=False, kind="course", folder="2026-12-01-h200-00", **change):
    results = tmp_path / "results"
    (results / kind / folder).mkdir(parents=True)
    (results / kind / folder / "store.json").write_text("{}")
    m = {"kind": RI.KIND, "run": folder, "gpu": "NVIDIA H200 (one)", "driver": None, "torch": "2",
         "date": "2026-12-01", "commit": None, "command": None, "what": "a | b", **change}
    if empty:
        (results / kind / folder / "store.json").unlink()
    (results / kind / folder / "manifest.json").write_text(json.dumps({k: v for k, v in m.items() if v != "DROP"}))
    (results / "README.md").write_text(f"# x\n\n{RI.START}\n{RI.END}\n\ntail\n")
    return results


def test_the_index_links_each_run_under_its_kind_and_escapes_pipes(tmp_path):
    results = _run(tmp_path, commit="abc1234")
    assert RI.main(["--results", str(results), "--check"]) == 1       # stale until written
    assert RI.main(["--results", str(results)]) == 0
    text = (results / "README.md").read_text()
    assert "### course" in text and "### zoo" not in text            # a kind with no run has no table
    assert "| 2026-12-01 | H200 | abc1234 | [a \\| b](course/2026-12-01-h200-00/) |" in text
    assert text.endswith("tail\n") and RI.main(["--results", str(results), "--check"]) == 0


@pytest.mark.parametrize("change, says", [
    ({"torch": "DROP"}, "no torch"),
    ({"run": "r2"}, "its folder is '2026-12-01-h200-00'"),
    ({"empty": True}, "nothing but its manifest"),
    ({"kind": "courses"}, "results/courses/ is not a kind of run"),
    ({"folder": "h200-2026-12-01-n15b", "run": "h200-2026-12-01-n15b"}, "not named <date>-<gpu>-<what>"),
    ({"date": "2026-12-02"}, "the name's date 2026-12-01 is not the manifest's 2026-12-02"),
    ({"gpu": "NVIDIA H200 (2 of one host)"}, "the name's GPU 'h200' is not the manifest's"),
    ({"commit": "at b35edb4 and more"}, "is not a commit"),
    ({"what": "two\nlines"}, "is one line"),
    ({"what": "x" * (RI.WHAT_MAX + 1)}, f"at most {RI.WHAT_MAX} characters"),
])
def test_a_bad_manifest_or_folder_says_what_is_wrong(tmp_path, capsys, change, says):
    results = _run(tmp_path, **change)
    assert RI.main(["--results", str(results)]) == 2
    assert says in capsys.readouterr().err


def test_the_gpu_part_of_a_name_from_the_manifest():
    assert RI.gpu_slug("NVIDIA H200 (one; driver 580.159.04; power limit 700 W)") == "h200"
    assert RI.gpu_slug("NVIDIA H200 (2 of one host; driver 580.159.04)") == "h200x2"
    assert RI.gpu_slug("NVIDIA H200 under `GPULAB_PROFILE=t4`") == "h200"
    assert RI.gpu_slug("NVIDIA H100 80GB HBM3 (one; driver 580.159.04)") == "h100"
    assert RI.gpu_slug("NVIDIA GeForce RTX 4090") == "rtx4090" and RI.gpu_slug("NVIDIA A100-SXM4-80GB") == "a100"
    assert RI.gpu_slug("CPU") == "cpu" and RI.gpu_short("NVIDIA H200 (2 of one host)") == "2x H200"
    assert RI.gpu_short("NVIDIA H100 80GB HBM3 (one)") == "H100" and RI.gpu_short("CPU") == "CPU"
