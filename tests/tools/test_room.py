"""gpulab.tools.room and `gpulab room` / `gpulab report`: merging a room's files, bad and old ones included."""
import json
import shutil
from pathlib import Path

import pytest

from gpulab.tools import room as R
from gpulab.tools.cli import main

ROOT = Path(__file__).resolve().parents[2]
RECORD = {"lesson": "05", "unit": "GB/s", "device": "cuda", "torch": "2.11.0+cu130", "scale": "full",
          "time": "2026-11-29T17:29:09+00:00", "host": "vm", "extra": {}}


def store_file(path, gpu, pinned, pageable, schema=1, **changes):
    rows = [{**RECORD, "gpu": gpu, "name": "h2d_pinned_largest_gbps", "value": pinned, **changes},
            {**RECORD, "gpu": gpu, "name": "h2d_pageable_largest_gbps", "value": pageable, **changes}]
    path.write_text(json.dumps({"schema": schema, "records": rows}), encoding="utf-8")
    return path


def bench_file(path, gpu, rows, **top):
    data = {"kind": "gpulab-bench", "schema": 1, "gpu": gpu, "torch": "2.11", "scale": "full",
            "time": "2026-11-30T10:00:00+00:00", "run_id": f"run-{path.stem}", "rows": rows, **top}
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def row(lesson, metric, ratio, status="pass", correct=True):
    return {"lesson": lesson, "metric": metric, "ratio": ratio, "status": status, "correct": correct}


PCIE = "pinned / pageable host->device GB/s"
STREAMS = "copy + matmul, overlapped / serial ms"


@pytest.fixture
def room_folder(tmp_path):
    """Two learners on an H200 (a store and a bench JSON), one on an A100, and every kind of bad file."""
    folder = tmp_path / "room"
    (folder / "late").mkdir(parents=True)
    store_file(folder / "alice.json", "NVIDIA H200", 55.0, 5.0)                   # 11x
    bench_file(folder / "bob.json", "NVIDIA H200", [row("05", PCIE, 7.0), row("08", STREAMS, 0.78),
                                                    row("06", "CNN images/s, best 16-bit / fp32", 9.9, "wrong", False)])
    bench_file(folder / "late" / "carol.json", "NVIDIA A100-SXM4-80GB", [row("05", PCIE, 2.5)])
    # an older gpulab: schema 0, records without host or extra; a bench file without schema or run_id
    old = store_file(folder / "old-store.json", "Tesla T4", 12.0, 4.0, schema=0)
    data = json.loads(old.read_text())
    for r in data["records"]:
        del r["host"], r["extra"]
    old.write_text(json.dumps(data))
    old_bench = {"kind": "gpulab-bench", "gpu": "Tesla T4", "rows": [row("08", STREAMS, 0.8), "junk", {"lesson": "05"}]}
    (folder / "old-bench.json").write_text(json.dumps(old_bench))
    # bad files
    (folder / "truncated.json").write_text('{"schema": 1, "records": [{"lesson": "05", "na')
    (folder / "corrupt.json").write_bytes(b"\x00\xff\xfe binary garbage")
    (folder / "list.json").write_text("[1, 2, 3]")
    (folder / "other.json").write_text('{"name": "a notebook setting"}')
    (folder / "bad-records.json").write_text('{"schema": 1, "records": {"not": "a list"}}')
    (folder / "bench-no-gpu.json").write_text('{"kind": "gpulab-bench", "rows": []}')
    (folder / "notes.txt").write_text("not a results file, and not *.json: ignored")
    return folder


def test_merge_reads_good_old_and_mixed_files_and_reports_bad_ones(room_folder):
    before = {p: p.read_bytes() for p in room_folder.rglob("*") if p.is_file()}
    room = R.merge(room_folder)
    bad = {Path(b.path).name: b.why for b in room.bad}
    assert set(bad) == {"truncated.json", "corrupt.json", "list.json", "other.json", "bad-records.json",
                        "bench-no-gpu.json"}
    assert "cut off" in bad["truncated.json"] and "UTF-8" in bad["corrupt.json"]
    assert "neither" in bad["list.json"] and "neither" in bad["other.json"]
    assert "cannot read" in bad["bad-records.json"] and "GPU's name" in bad["bench-no-gpu.json"]
    kinds = {Path(p).name: (k, n) for p, k, n in room.files}
    assert kinds == {"alice.json": ("store", 1), "bob.json": ("bench", 2), "carol.json": ("bench", 1),
                     "old-store.json": ("store", 1), "old-bench.json": ("bench", 1)}
    assert room.skipped_rows == 3             # bob's wrong row, two malformed rows of the old bench file
    assert room.gpus == ["NVIDIA A100-SXM4-80GB", "NVIDIA H200", "Tesla T4"]
    assert {p: p.read_bytes() for p in room_folder.rglob("*") if p.is_file()} == before   # nothing moved


def test_table_is_the_median_per_gpu_with_the_count(room_folder):
    table = R.cells(R.merge(room_folder))
    assert table[("05", PCIE)] == {"NVIDIA A100-SXM4-80GB": (2.5, 1), "NVIDIA H200": (9.0, 2), "Tesla T4": (3.0, 1)}
    assert table[("08", STREAMS)] == {"NVIDIA H200": (0.78, 1), "Tesla T4": (0.8, 1)}
    assert ("06", "CNN images/s, best 16-bit / fp32") not in table          # a wrong result is never merged
    text = R.format_table(R.merge(room_folder))
    assert "9x (median of 2)" in text and "2.5x" in text and "truncated.json: not JSON" in text
    md = R.format_table(R.merge(room_folder), markdown=True)
    assert "| lesson | headline | NVIDIA A100-SXM4-80GB | NVIDIA H200 | Tesla T4 |" in md


def test_tiny_runs_get_their_own_column(tmp_path):
    bench_file(tmp_path / "cpu.json", "CPU", [row("07", "matmul TFLOP/s, n=4096 / n=4095", 1.04, "n/a")],
               scale="tiny")
    assert R.merge(tmp_path).gpus == ["CPU (tiny)"]


def test_a_bench_run_in_both_its_json_and_a_store_counts_once(tmp_path):
    bench_file(tmp_path / "run.json", "NVIDIA H200", [row("05", PCIE, 7.0)], run_id="r1")
    rec = {**RECORD, "gpu": "NVIDIA H200", "lesson": "05", "name": "bench_ratio", "value": 7.0, "unit": "x",
           "extra": {"metric": PCIE, "run_id": "r1"}}
    (tmp_path / "store.json").write_text(json.dumps({"schema": 1, "records": [rec]}))
    assert R.cells(R.merge(tmp_path))[("05", PCIE)] == {"NVIDIA H200": (7.0, 1)}


def test_an_empty_folder_merges_to_nothing(tmp_path):
    room = R.merge(tmp_path)
    assert room.measurements == [] and room.bad == [] and R.cells(room) == {}
    assert "no *.json files" in R.format_table(room)
    assert R.room_plot(room) is not None


def test_the_committed_results_merge_without_bad_files():
    room = R.merge(ROOT / "results")
    assert room.bad == [] and room.gpus == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]      # the 2026-12-06 runs: an H100
    assert {m.lesson for m in room.measurements} >= {"00", "05", "06", "07", "08", "09"}


# -- the chart and the command ----------------------------------------------------------------
def test_plot_has_a_bar_per_lesson_and_gpu_and_saves_a_png(room_folder, tmp_path):
    fig = R.room_plot(R.merge(room_folder))
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["05", "08"]
    assert len(ax.patches) == 5              # 05: three GPUs, 08: two
    assert ax.get_yscale() == "log"
    out = tmp_path / "room.png"
    fig.savefig(out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_room_command_prints_the_table_and_writes_png_and_json(room_folder, tmp_path, capsys):
    png, js = tmp_path / "r.png", tmp_path / "r.json"
    assert main(["room", str(room_folder), "--png", str(png), "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "lesson" in out and "NVIDIA H200" in out and "bad files (skipped):" in out
    assert png.read_bytes()[:4] == b"\x89PNG"
    data = json.loads(js.read_text())
    assert {(c["lesson"], c["gpu"], c["count"]) for c in data["table"]} >= {("05", "NVIDIA H200", 2)}
    assert len(data["bad"]) == 6


def test_room_command_without_a_folder_exits_2(tmp_path, capsys):
    assert main(["room", str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err


# -- docs/results.md's "measured on" block ------------------------------------------------------
def test_readme_block_is_generated_from_the_committed_results():
    block = R.readme_block(ROOT / "docs" / "results.md")
    assert block is not None, "docs/results.md has no measured-on block"
    assert block == R.measured_on_block(ROOT / "results"), \
        "docs/results.md's measured-on block is stale or edited by hand: run `gpulab report --readme docs/results.md`"
    assert "NVIDIA H200" in block and "2.11.0+cu130" in block


def test_newest_bench_file_per_gpu_wins_over_store_runs(tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    store_file(folder / "store.json", "NVIDIA H200", 55.0, 5.0)
    bench_file(folder / "old.json", "NVIDIA H200", [row("05", PCIE, 6.0)], time="2026-11-30T09:00:00+00:00")
    bench_file(folder / "new.json", "NVIDIA H200", [row("05", PCIE, 7.5), row("08", STREAMS, 0.7)])
    block = R.measured_on_block(folder)
    assert "`results/new.json`" in block and "old.json" not in block and "store.json" not in block
    assert "| 05 | PCIe transfers: pinned / pageable host->device GB/s | 2 - 30 | 7.5x |" in block
    assert "2026-11-30" in block and "`gpulab bench` JSON" in block


def test_report_rewrites_only_the_block(tmp_path, capsys):
    readme = tmp_path / "README.md"
    shutil.copytree(ROOT / "results", tmp_path / "results")
    readme.write_text(f"# title\n\nbefore\n{R.README_START}\nstale 99x\n{R.README_END}\nafter\n")
    assert main(["report", "--readme", str(readme), "--results", str(tmp_path / "results")]) == 0
    text = readme.read_text()
    assert text.startswith("# title\n\nbefore\n") and text.endswith("\nafter\n") and "stale" not in text
    assert R.measured_on_block(tmp_path / "results").strip() in text     # the committed results, whatever they hold
    assert not R.update_readme(readme, tmp_path / "results")          # second run: nothing to change
    readme.write_text("no markers here")
    assert main(["report", "--readme", str(readme), "--results", str(tmp_path / "results")]) == 2
    assert "no <!-- measured-on:start -->" in capsys.readouterr().err


# -- absurd ratios, odd folder entries, output paths (issue 16) ---------------------------------
def test_absurd_ratios_are_skipped_and_listed_with_the_reason(tmp_path):
    bench_file(tmp_path / "bench.json", "NVIDIA H200",
               [row("05", PCIE, 1e308), row("08", STREAMS, 0.0), row("08", STREAMS, -2.0),
                row("08", STREAMS, float("inf")), row("08", STREAMS, float("nan")), row("05", PCIE, 1e-9),
                row("05", PCIE, 7.0), row("08", STREAMS, 0.78)])
    store_file(tmp_path / "store.json", "Tesla T4", 1e300, 1e-10)          # pinned / pageable overflows to inf
    rec = {**RECORD, "gpu": "Tesla T4", "lesson": "08", "name": "bench_ratio", "value": 1e12, "unit": "x",
           "extra": {"metric": STREAMS}}
    (tmp_path / "bench-in-store.json").write_text(json.dumps({"schema": 1, "records": [rec]}))
    room = R.merge(tmp_path)
    assert R.cells(room) == {("05", PCIE): {"NVIDIA H200": (7.0, 1)}, ("08", STREAMS): {"NVIDIA H200": (0.78, 1)}}
    why = [(Path(s.path).name, s.lesson, s.value, s.why) for s in room.refused]
    assert len(why) == 8
    assert ("bench.json", "05", 1e308, f"beyond the plausible bound {R.MAX_RATIO:g}") in why
    assert ("bench.json", "08", 0.0, "not positive") in why and ("bench.json", "08", -2.0, "not positive") in why
    assert ("bench.json", "05", 1e-9, f"below the plausible bound {R.MIN_RATIO:g}") in why
    assert sum(w == "not a finite number" for *_, w in why) == 3          # inf, nan, and the overflow
    assert {n for n, *_ in why} == {"bench.json", "store.json", "bench-in-store.json"}
    text = R.format_table(room)
    assert "implausible ratios (skipped; a real run gives 1e-08 to 1e+08):" in text and "1e+308" in text and "beyond the plausible bound" in text
    assert len(R.room_plot(room).axes[0].patches) == 2
    R.room_plot(room).savefig(tmp_path / "room.png")                  # the axis stays finite
    assert len(room.to_json()["refused"]) == 8
    json.dumps(room.to_json(), allow_nan=False)                       # refused values are written as text


def test_the_ratio_bounds_leave_every_committed_run_and_band_inside():
    room = R.merge(ROOT / "results")
    assert room.refused == []
    assert all(R.MIN_RATIO < m.value < R.MAX_RATIO for m in room.measurements)
    from gpulab.core.bands import load_bands
    bands = load_bands()
    for cls in bands.classes:
        for lesson in {e.lesson for e in R.REGISTRY}:
            band = bands.band(cls, lesson)
            if band is not None:
                assert band.low < R.MAX_RATIO and (band.high == float("inf") or band.high > R.MIN_RATIO)


def test_a_folder_named_json_and_a_broken_link_are_listed_not_silent(tmp_path):
    store_file(tmp_path / "alice.json", "NVIDIA H200", 55.0, 5.0)
    (tmp_path / "collected.json").mkdir()
    store_file(tmp_path / "collected.json" / "bob.json", "NVIDIA H200", 60.0, 6.0)   # still read, on its own
    (tmp_path / "gone.json").symlink_to(tmp_path / "nowhere.json")
    (tmp_path / "loop.json").symlink_to(tmp_path / "loop.json")
    room = R.merge(tmp_path)
    bad = {Path(b.path).name: b.why for b in room.bad}
    assert set(bad) == {"collected.json", "gone.json", "loop.json"}
    assert "a folder" in bad["collected.json"]
    assert "broken symbolic link" in bad["gone.json"] and "nowhere.json" in bad["gone.json"]
    assert "broken symbolic link" in bad["loop.json"]
    assert R.cells(room)[("05", PCIE)] == {"NVIDIA H200": (10.5, 2)}
    text = R.format_table(room)
    assert "collected.json: a folder" in text and "gone.json: a broken symbolic link" in text


@pytest.mark.parametrize("flag", ["--png", "--json"])
@pytest.mark.parametrize("where", ["missing-folder/out", "a-file/out", "a-folder"])
def test_room_output_that_cannot_be_written_exits_2_with_one_line(room_folder, tmp_path, capsys, flag, where):
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-folder").mkdir()
    target = tmp_path / where
    assert main(["room", str(room_folder), flag, str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpulab room: cannot write") and err.count("\n") == 1 and str(target) in err


@pytest.mark.parametrize("make", ["folder", "missing"])
def test_report_with_a_readme_it_cannot_read_exits_2(tmp_path, capsys, make):
    readme = tmp_path / "README.md"
    if make == "folder":
        readme.mkdir()
    assert main(["report", "--readme", str(readme), "--results", str(ROOT / "results")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpulab report: ") and err.count("\n") == 1 and str(readme) in err


def test_the_diagnosis_suites_json_is_not_a_bad_file(tmp_path):
    from gpulab.diagnose.suite import SUITE_KIND
    (tmp_path / "suite.json").write_text(json.dumps({"kind": SUITE_KIND, "cases": [], "matrix": ""}))
    (tmp_path / "other.json").write_text(json.dumps({"cases": []}))
    room = R.merge(tmp_path)
    assert [Path(b.path).name for b in room.bad] == ["other.json"] and room.measurements == []


def test_the_board_shows_each_learners_newest_own_verdict(tmp_path, monkeypatch):
    """The exercises' board: one row per learner and exercise, their own newest submission (not the solution
    they viewed), a pass on the CPU marked as not judged for speed, a suspicious one flagged."""
    from gpulab.core.results import ResultsStore
    from gpulab.tools import room as R
    a, b = ResultsStore(tmp_path / "ana.json"), ResultsStore(tmp_path / "ben.json")
    a.record("01", "exercise 01.sync", 0.0, "x", state="failed", who="you", target=None, speed_judged=False)
    a.record("01", "exercise 01.sync", 1.71, "x", state="passed", who="you", target=1.4, speed_judged=True)
    a.record("01", "exercise 01.sync", 1.8, "x", state="passed", who="reference", target=1.4, speed_judged=True)
    b.record("12", "exercise 12.fusion", 1.0, "x", state="suspicious", who="you", target=None, speed_judged=False)
    b.record("12", "fused_ms", 1.0, "ms")                         # not an exercise
    rows = R.exercise_board(tmp_path)
    assert [(r.learner, r.exercise, r.state, r.ratio) for r in rows] == [
        ("ana", "01.sync", "passed", 1.71), ("ben", "12.fusion", "suspicious", 1.0)]
    text = R.format_board(rows)
    assert "verified" in text and "SUSPICIOUS" in text and "1.40x" in text
    assert "2 submission(s) by 2 learner(s): 1 passed (1 verified by speed on a GPU), 1 suspicious" in text


def test_a_verdict_reached_before_timing_shows_no_ratio(tmp_path):
    """A patched timer is suspicious before anything is timed: its stored 0 is no ratio, and the board says '-'."""
    from gpulab.core.results import ResultsStore
    from gpulab.tools import room as R
    ResultsStore(tmp_path / "ben.json").record("01", "exercise 01.sync", 0.0, "x", state="suspicious", who="you",
                                                target=None, speed_judged=False)
    [row] = R.exercise_board(tmp_path)
    assert row.ratio is None and "0.00x" not in R.format_board([row])


def test_the_boards_speedrun_best_is_the_newest_runs_race(tmp_path):
    """A learner's tiny CPU speedrun (about 1 s) must not stand as their best beside a full-size GPU run of 30 s."""
    from gpulab.core.results import ResultsStore
    store = ResultsStore(tmp_path / "ana.json")
    store.record("13", "speedrun", 1.0, "s", scale="tiny", state="passed", who="you", times=[1.0], ci_s=0.1, seeds=3)
    store.record("13", "speedrun", 31.0, "s", scale="full", state="passed", who="you", times=[31.0], ci_s=1.0, seeds=3)
    store.record("13", "speedrun", 30.0, "s", scale="full", state="passed", who="you", times=[30.0], ci_s=1.0, seeds=3)
    [row] = [r for r in R.exercise_board(tmp_path) if r.exercise == "13.speedrun"]
    assert "30.00 s" in row.note
