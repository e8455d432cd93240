import re

from gpulab.tools import coursetime as CT


def test_sums_per_notebook_and_skips_bad_lines(tmp_path, capsys):
    f = tmp_path / "t.tsv"
    f.write_text("1.5\tnotebooks/00_a.ipynb::Cell 0\tpassed\n"
                 "2.0\tnotebooks/00_a.ipynb::Cell 1\tfailed\n"
                 "not a line\n"
                 "x\tnotebooks/01_b.ipynb::Cell 0\tpassed\n"
                 "4.0\tnotebooks/01_b.ipynb::Cell 0\tpassed\n")
    files = CT.per_file(CT.read(f))
    assert files == {"notebooks/00_a.ipynb": (3.5, 2, 1, None), "notebooks/01_b.ipynb": (4.0, 1, 0, None)}
    assert CT.main([str(f), "--slowest", "1"]) == 0
    out = capsys.readouterr().out
    assert "1 FAILED" in out and re.search(r"^total +7\.5 +- +3$", out, re.M) and "4.0 s  notebooks/01_b.ipynb::Cell 0" in out


def test_wall_time_per_notebook_counts_from_the_previous_ones_end(tmp_path, capsys):
    f = tmp_path / "t.tsv"
    f.write_text("0.000\t(session)\tstart\t100.0\n"
                 "1.5\tnotebooks/00_a.ipynb::Cell 0\tpassed\t104.0\n"     # 2.5 s of kernel start-up
                 "2.0\tnotebooks/00_a.ipynb::Cell 1\tpassed\t106.0\n"
                 "4.0\tnotebooks/01_b.ipynb::Cell 0\tpassed\t113.0\n")
    files = CT.per_file(CT.read(f))
    assert files["notebooks/00_a.ipynb"] == (3.5, 2, 0, 6.0)
    assert files["notebooks/01_b.ipynb"] == (4.0, 1, 0, 7.0)
    assert CT.main([str(f)]) == 0
    assert re.search(r"^total +7\.5 +13\.0 +3$", capsys.readouterr().out, re.M)


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
                           "tests/tools/test_coursetime.py::test_missing_or_empty_file_is_a_clear_error"],
                          env=env, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = CT.read(out)
    assert [r.outcome for r in rows] == ["start", "passed"]
    assert rows[1].nodeid.endswith("test_missing_or_empty_file_is_a_clear_error")
    assert rows[1].clock >= rows[0].clock > 0


# The committed H200 runs the predictor is held to, oldest first: (GPULAB_TIMINGS file, the results store
# whose notebook-00 records were that run's ceilings). Each notebook is checked on the newest run that has it,
# so a run of a few changed notebooks supersedes the whole-course run for those notebooks only.
PREDICTOR_RUNS = [
    ("h200-2026-11-30-s3-course-timings.tsv", "h200-2026-11-30-s3-course.json"),
    ("h200-2026-11-30-s3-course-2-timings.tsv", "h200-2026-11-30-s3-course.json"),
    ("h200-2026-11-30-s4-timings.tsv", "h200-2026-11-30-s4.json"),       # 00, 01, 02, 08, 10, 11, 12, 13
    ("h200-2026-11-30-s5-course-timings.tsv", "h200-2026-11-30-s5-course.json"),      # the newest: 00-09
    ("h200-2026-11-30-s5-course-2-timings.tsv", "h200-2026-11-30-s5-course.json"),    # and 10-14
    # two H200s: notebook 15 only (14's plan is for one GPU, and says so: with two it runs another plan)
    ("h200x2-2026-11-30-s9-timings.tsv", "h200x2-2026-11-30-s9.json", ("15",)),
    # notebook 15 after issue 23 (its chain now checks and diagnoses every round): the newest for 15
    ("h200-2026-12-01-n15e-timings.tsv", "h200-2026-12-01-n15e.json", ("15",)),
    # notebook 00 then 15, 15 sized from 00's ceilings (2026-12-02): the newest for both
    ("h200-2026-12-02-00-15-timings.tsv", "h200-2026-12-02-00-15.json", ("00", "15")),
    # notebook 00 then 13 with its sections 12b-14 (2026-12-02, 79501ed): the newest for both; 13's host time
    # was taken from this run, so for 13 it is a calibration, not a test of the predictor
    ("h200-2026-12-02-00-13-timings.tsv", "h200-2026-12-02-00-13.json", ("00", "13")),
    # notebooks 00, 13 and 15 (2026-12-03, f632d30): the newest for 00 and 13, whose host time was taken from
    # it (a calibration for 13, as above). Not for 15: its chain of fixes stops at the first fix that is not
    # kept, here after three rounds (128 s), where the run its plan names took five (225 s); the plan gives
    # the longer chain, the time a learner may have to wait
    ("h200-2026-12-03-00-13-15-timings.tsv", "h200-2026-12-03-00-13-15.json", ("00", "13")),
    # the whole course at 7027931 (2026-12-03, one store over three calls): the newest for every notebook. 12's and
    # 13's host times were taken from it (calibrations: 13 now includes section 14b, FP8 in the step); for the other
    # fourteen it is a test. 15 ran a five-round chain here (200 s)
    ("h200-2026-12-03-course-timings.tsv", "h200-2026-12-03-course.json"),
    # the whole course at 10599bc (2026-12-06, one store over three calls), on an H100: the first whole-course run
    # with the graded exercises, whose seconds (EXERCISE_S) were taken from it, so for their part a calibration. 13
    # ran in two parts (13_capstone_a, _b), counted as one; its host time up to the exercise was taken from an
    # earlier H100 run of 13 (e14eb7a). Not for 10 (a call's limit cut its first run; the file holds both) nor 15
    # (its chain stopped sooner than the five rounds its plan gives)
    ("h100-2026-12-06-course-timings.tsv", "h100-2026-12-06-course.json",
     ("00", "01", "02", "03", "04", "05", "06", "07", "08", "09", "11", "12", "13", "14")),
]


def test_the_predictor_is_within_30_percent_on_the_committed_runs(capsys):
    """docs/results.md says every notebook's predicted time came within 30 % of the committed run PREDICTOR_RUNS
    names for it (its newest, except 10 and 15)."""
    import re
    from pathlib import Path
    from gpulab.tools.coursetime import per_file, print_predictions, read
    errors = {}
    for timings, store, *only in PREDICTOR_RUNS:
        files = per_file(read(in_results(timings)))
        # the graded exercises' seconds count in runs from their day on (2026-12-04)
        exercises = re.search(r"\d{4}-\d\d-\d\d", timings).group(0) >= "2026-12-04"
        for name, *_, err in print_predictions(files, str(in_results(store)), "full", exercises):
            lesson = re.search(r"/(\d\d)_", name).group(1)
            failed = sum(files[n].failed for n in name.split(" + "))
            if failed == 0 and (not only or lesson in only[0]):   # a run with failed cells stopped early
                errors[lesson] = (err, timings)
    assert len(errors) == 16
    assert all(abs(e) <= 0.30 for e, _ in errors.values()), errors


def in_results(name: str):
    """A committed run's file by its name, in whichever run folder of results/ holds it."""
    from pathlib import Path
    found = sorted((Path(__file__).resolve().parents[2] / "results").rglob(name))
    assert len(found) == 1, f"{name}: {len(found)} files of that name under results/"
    return found[0]


def test_the_readmes_course_times_are_the_committed_runs():
    from pathlib import Path
    from gpulab.tools.coursetime import per_file, read
    root = Path(__file__).resolve().parents[2]
    walls = [round(sum(t.wall for t in per_file(read(in_results(f))).values()))
             for f in ("h200-2026-11-30-s5-course-timings.tsv", "h200-2026-11-30-s5-course-2-timings.tsv")]
    assert f"00-09 took {walls[0]} s and 10-14 {walls[1]} s" in (root / "docs" / "results.md").read_text()


def test_the_root_conftest_keeps_each_cells_text_outputs(tmp_path, monkeypatch):
    """GPULAB_OUTPUTS: one JSON line per nbval cell with its printed text (a GPU run's tables come back);
    images are left out, an error keeps its name and message."""
    import importlib.util
    import json
    from pathlib import Path
    from types import SimpleNamespace
    spec = importlib.util.spec_from_file_location("root_conftest", Path(__file__).resolve().parents[2] / "conftest.py")
    root = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(root)
    out = tmp_path / "outputs.jsonl"
    monkeypatch.setattr(root, "_OUTPUTS", str(out))
    cell = SimpleNamespace(nodeid="notebooks/13_capstone.ipynb::Cell 41", test_outputs=[
        {"output_type": "stream", "name": "stdout", "text": "batch 64: 512 TFLOP/s\n"},
        {"output_type": "display_data", "data": {"text/plain": "<Figure>", "image/png": "iVBOR"}},
        {"output_type": "execute_result", "data": {"text/plain": "0.71"}},
        {"output_type": "error", "ename": "ValueError", "evalue": "no", "traceback": []}])
    root.pytest_runtest_teardown(cell)
    root.pytest_runtest_teardown(SimpleNamespace(nodeid="tests/x.py::test_y"))    # not a notebook cell: nothing
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines == [{"test": cell.nodeid, "outputs": ["batch 64: 512 TFLOP/s\n", "0.71", "ValueError: no"]}]


def test_the_readmes_chain_times_for_15_are_the_committed_runs():
    """docs/results.md: 15's plan gives its longest chain (the 00-15 run: five rounds) and a shorter one takes less
    (the 00-13-15 run: three rounds); both wall times as coursetime reads them."""
    from pathlib import Path
    from gpulab.tools.coursetime import per_file, read
    root = Path(__file__).resolve().parents[2]
    wall = {f: round(per_file(read(in_results(f)))["notebooks/15_your_training_step.ipynb"].wall)
            for f in ("h200-2026-12-02-00-15-timings.tsv", "h200-2026-12-03-00-13-15-timings.tsv")}
    readme = " ".join((root / "docs" / "results.md").read_text().split())
    assert (f"five rounds in {wall['h200-2026-12-02-00-15-timings.tsv']} s, and a chain that stops sooner takes "
            f"less: three rounds in {wall['h200-2026-12-03-00-13-15-timings.tsv']} s") in readme


def test_the_readmes_exercise_figures_are_the_committed_run_and_the_plans():
    """docs/results.md: without the exercises' seconds the 2026-12-06 H100 run missed 01, 04, 05, 08 and 12 by 41-50 %;
    with them 13 took 507 s there and is predicted at 632 to 772 s on the profiles' derated datasheets."""
    import contextlib
    import io
    from pathlib import Path
    from gpulab.core.predict import EXERCISE_S, datasheet_ceilings, predict
    from gpulab.core.profiles import PROFILES
    from gpulab.notebook.lesson import lesson_module
    from gpulab.tools.coursetime import per_file, print_predictions, read
    files = per_file(read(in_results("h100-2026-12-06-course-timings.tsv")))
    with contextlib.redirect_stdout(io.StringIO()):
        rows = print_predictions(files, str(in_results("h100-2026-12-06-course.json")), "full", exercises=False)
    missed = [round(-100 * err) for name, *_, err in rows if name[10:12] in ("01", "04", "05", "08", "12")]
    walls = round(sum(t.wall for name, t in files.items() if "13_capstone" in name))
    full = [predict(lesson_module("13").plan("full"), datasheet_ceilings(p), exercise_s=EXERCISE_S["13"]).seconds
            for p in PROFILES.values()]
    text = " ".join((Path(__file__).resolve().parents[2] / "docs" / "results.md").read_text().split())
    assert f"by {min(missed)}-{max(missed)} %" in text
    assert f"took {walls} s on the H100 (its two parts, the second repeating the first code cell, 3 s) and is " \
           f"predicted at {round(min(full))} to {round(max(full))} s" in text
