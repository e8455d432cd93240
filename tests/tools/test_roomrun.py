"""gpulab.tools.roomrun: learners at once against one alone, per-notebook times, checks, headline spread."""
import json

import nbformat

from gpulab.tools import roomrun as RR


def _notebook(path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import os\n"
        "from gpulab.notebook import lesson\n"
        "from gpulab.core.results import results_store\n"
        "lesson.start('01')\n"
        "results_store().record('01', 'probe', 1.0, 'x')\n"
        "lesson.expect('probe ratio', 1.0, 0.5, 2.0)\n"
        "lesson.expect('impossible', 1.0, 5.0, 6.0)\n")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))
    return path


def test_a_room_of_two_is_run_and_summarized(tmp_path):
    nb = _notebook(tmp_path / "01_probe.ipynb")
    codes = RR.run(tmp_path / "out", 2, [nb], scale="tiny", timeout_s=300, alone=False)   # (alone: one more)
    assert codes == {"learner1": 0, "learner2": 0}, (tmp_path / "out" / "logs" / "learner1.txt").read_text()
    s = RR.summarize(tmp_path / "out")
    row = s["notebooks"]["01_probe"]
    assert row["alone_s"] is None and set(row["learners_s"]) == {"learner1", "learner2"}
    assert all(isinstance(v, float) for v in row["learners_s"].values())
    assert s["checks"]["learner1"] == {"FAIL": 1, "pass": 1}
    assert {c["name"] for c in s["checks_not_passed"]} == {"impossible"}
    assert (tmp_path / "out" / "summary.md").read_text().startswith("| notebook |")


def test_the_spread_of_a_headline_across_learners(tmp_path, monkeypatch):
    out = tmp_path / "out"
    (out / "room").mkdir(parents=True)
    for n in ("alone", "learner1", "learner2", "learner3"):
        (out / "room" / f"{n}.json").write_text(json.dumps({"schema": 1, "records": []}))
    values = {"alone": 10.0, "learner1": 8.0, "learner2": 9.0, "learner3": 12.0}
    monkeypatch.setattr(RR, "_headlines", lambda path: {("06", "speed-up"): values[path.stem]})
    h = RR.summarize(out)["headline_spread"]["06 speed-up"]
    assert (h["alone"], h["median"], h["min"], h["max"], h["n"]) == (10.0, 9.0, 8.0, 12.0, 3)
    assert round(h["spread_pct"], 1) == 44.4


def test_bad_arguments_are_one_line(capsys, tmp_path):
    assert RR.main(["--notebooks", "99", "--out", str(tmp_path)]) == 2
    assert RR.main(["--learners", "0", "--out", str(tmp_path)]) == 2
    assert "roomrun:" in capsys.readouterr().err
