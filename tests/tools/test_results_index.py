"""results/: one folder per run with a manifest, and the README's table generated from the manifests."""
import json
from pathlib import Path

import pytest

from gpulab.tools import results_index as RI

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "results"


def test_the_readme_table_is_the_manifests():
    assert RI.main(["--check"]) == 0, "results/README.md is stale: run python -m gpulab.tools.results_index"


def test_every_file_of_a_run_is_in_a_run_folder_with_a_manifest():
    loose = [p.name for p in RESULTS.iterdir() if p.is_file() and p.name != "README.md"]
    assert not loose, f"files outside a run folder: {loose}"
    runs = {m["run"]: m["files"] for m in RI.manifests(RESULTS)}
    for folder in RESULTS.iterdir():
        if folder.is_dir() and folder.name != "zoo":
            assert (folder / "manifest.json").exists(), f"{folder.name}/ has no manifest.json"
            assert runs[folder.name], f"{folder.name}/ holds no files"


def _run(tmp_path, empty=False, **change):
    results = tmp_path / "results"
    (results / "r1").mkdir(parents=True)
    (results / "r1" / "store.json").write_text("{}")
    m = {"kind": RI.KIND, "run": "r1", "gpu": "G", "driver": None, "torch": "2", "date": "2026-12-01", "commit": None,
         "command": None, "what": "a | b", **change}
    if empty:
        (results / "r1" / "store.json").unlink()
    (results / "r1" / "manifest.json").write_text(json.dumps({k: v for k, v in m.items() if v != "DROP"}))
    (results / "README.md").write_text(f"# x\n\n{RI.START}\n{RI.END}\n\ntail\n")
    return results


def test_the_table_links_each_run_and_file_and_escapes_pipes(tmp_path):
    results = _run(tmp_path)
    assert RI.main(["--results", str(results), "--check"]) == 1       # stale until written
    assert RI.main(["--results", str(results)]) == 0
    text = (results / "README.md").read_text()
    assert "[`r1/`](r1/)" in text and "[`store.json`](r1/store.json)" in text and "a \\| b" in text
    assert text.endswith("tail\n") and RI.main(["--results", str(results), "--check"]) == 0


@pytest.mark.parametrize("change, says", [
    ({"torch": "DROP"}, "no torch"),
    ({"run": "r2"}, "its folder is 'r1'"),
    ({"empty": True}, "nothing but its manifest"),
])
def test_a_bad_manifest_says_what_is_wrong(tmp_path, capsys, change, says):
    results = _run(tmp_path, **change)
    assert RI.main(["--results", str(results)]) == 2
    assert says in capsys.readouterr().err
