"""`gpulab room --learners [--watch]`: the live room, one row per learner's results file, marks for
runs that were shared, emulated or tiny, and files half-written at one look read again at the next."""
import json

from gpulab.core.results import ResultsStore
from gpulab.tools import cli
from gpulab.tools import room as R


def test_one_row_per_learner_with_their_marks_and_a_half_written_file(tmp_path):
    ann = ResultsStore(tmp_path / "ann.json")
    ann.record("01", "synced_ms", 2.0, "ms", scale="tiny")
    ann.record("03", "speedup", 2.5, "x", scale="tiny", shared="a MIG slice")
    ResultsStore(tmp_path / "bob.json").record("00", "matmul_bf16", 700.0, "TFLOP/s", scale="full", profile="t4")
    (tmp_path / "cy.json").write_text('{"schema": 1, "records": [{"lesson": "01"')         # being written
    (tmp_path / "bench.json").write_text(json.dumps({"kind": "gpulab-bench", "rows": []}))   # not a learner
    rows = {r.name: r for r in R.learners(tmp_path)}
    assert set(rows) == {"ann", "bob", "cy"}
    assert rows["ann"].lessons == ("01", "03") and rows["ann"].records == 2
    assert "shared" in rows["ann"].marks and "tiny" in rows["ann"].marks
    assert "profile t4" in rows["bob"].marks
    assert rows["cy"].problem.startswith("not readable JSON yet")
    text = R.format_learners(list(rows.values()))
    assert "not read: not readable JSON yet" in text and "3 learner(s)" in text


def test_watch_reads_the_folder_again_each_round(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("time.sleep", lambda s: (tmp_path / "dee.json").write_text(
        json.dumps({"schema": 1, "records": []})))
    assert cli.main(["room", str(tmp_path), "--learners", "--watch", "0.01", "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("learner(s)") == 2 and "0 learner(s)" in out and "1 learner(s)" in out
    assert cli.main(["room", str(tmp_path / "none"), "--learners"]) == 2
    assert cli.main(["room", str(tmp_path), "--watch", "0"]) == 2
