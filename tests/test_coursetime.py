from gpulab import coursetime as CT


def test_sums_per_notebook_and_skips_bad_lines(tmp_path, capsys):
    f = tmp_path / "t.tsv"
    f.write_text("1.5\tnotebooks/00_a.ipynb::Cell 0\tpassed\n"
                 "2.0\tnotebooks/00_a.ipynb::Cell 1\tfailed\n"
                 "not a line\n"
                 "x\tnotebooks/01_b.ipynb::Cell 0\tpassed\n"
                 "4.0\tnotebooks/01_b.ipynb::Cell 0\tpassed\n")
    files = CT.per_file(CT.read(f))
    assert files == {"notebooks/00_a.ipynb": (3.5, 2, 1), "notebooks/01_b.ipynb": (4.0, 1, 0)}
    assert CT.main([str(f), "--slowest", "1"]) == 0
    out = capsys.readouterr().out
    assert "1 FAILED" in out and "7.5 s" in out and "4.0 s  notebooks/01_b.ipynb::Cell 0" in out


def test_missing_or_empty_file_is_a_clear_error(tmp_path, capsys):
    assert CT.main([str(tmp_path / "none.tsv")]) == 2
    (tmp_path / "empty.tsv").write_text("")
    assert CT.main([str(tmp_path / "empty.tsv")]) == 2
    assert "no timings" in capsys.readouterr().err


def test_the_root_conftest_writes_one_line_per_test(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path
    out = tmp_path / "timings.tsv"
    env = dict(os.environ, GPULAB_TIMINGS=str(out))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_coursetime.py::test_missing_or_empty_file_is_a_clear_error"],
                          env=env, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = CT.read(out)
    assert len(rows) == 1 and rows[0][1].endswith("test_missing_or_empty_file_is_a_clear_error")
    assert rows[0][2] == "passed"
