"""gpulab.tools.bench and `gpulab bench`: the bands file, pass / FAIL / n/a, --check, a real tiny CPU run."""
import json
import math
import statistics
from pathlib import Path

from types import SimpleNamespace

import pytest

from gpulab.tools import bench as B
from gpulab.core.bands import CLASSES, Band, BandsError, gpu_class, load_bands
from gpulab.tools.bench import Experiment, judge
from gpulab.core.measured import Measured, Skipped
from gpulab.tools.cli import main
from gpulab.core.device import device_facts, facts_for_capability
from gpulab.core.results import Record, ResultsStore

ROOT = Path(__file__).resolve().parents[2]
GPU_CLASSES = ("tensor-core", "pre-volta")


# -- the committed bands file -----------------------------------------------------------------
def test_committed_bands_parse_and_every_band_names_its_source():
    bands = load_bands()
    assert set(bands.classes) == set(CLASSES)
    for cls, by_lesson in bands.bands.items():
        for lesson, band in by_lesson.items():
            assert len(band.source.strip()) > 20, f"{cls}.{lesson} says too little about where it comes from"
            if band.applies:
                assert band.low <= band.high and not (math.isinf(band.low) and math.isinf(band.high))
            else:
                assert band.why.strip()


def test_every_benched_lesson_has_a_band_for_every_gpu_class_with_the_same_metric():
    bands = load_bands()
    for cls in GPU_CLASSES:
        # a lesson's other self-checks judged by class are keyed "LL.name" ("13.peak"): the notebook reads them
        assert {k for k in bands.bands[cls] if "." not in k} == {e.lesson for e in B.REGISTRY}, cls
        assert all(k.partition(".")[0] in {e.lesson for e in B.REGISTRY} for k in bands.bands[cls]), cls
        for exp in B.REGISTRY:
            assert bands.band(cls, exp.lesson).metric == exp.metric, (cls, exp.lesson)
    assert bands.classes["cpu"]["applies"] is False and bands.classes["cpu"]["why"]


def test_committed_bands_hold_on_the_committed_h200_runs_with_margin():
    from gpulab.tools.room import merge

    room = merge(ROOT / "results")
    bands = load_bands()
    h200 = {}
    for m in room.measurements:
        if m.gpu == "NVIDIA H200":
            h200.setdefault(m.lesson, []).append(m.value)
    assert len(h200) >= 6                       # 00, 03, 04, 05, 06, 07, 08, 09 are committed
    for lesson, values in h200.items():
        band = bands.band("tensor-core", lesson)
        v = statistics.median(values)
        assert band.low <= v <= band.high, (lesson, v)
        for edge in (band.low, band.high):     # not on the edge: 5% of room at least
            assert math.isinf(edge) or abs(v - edge) >= 0.05 * v, (lesson, v, edge)


# -- reading bands files ----------------------------------------------------------------------
GOOD = """
[tensor-core.90]
metric = "fake ratio"
low = 2.0
high = 3.0
source = "a test"
[pre-volta.90]
metric = "fake ratio"
applies = false
why = "not on old GPUs"
source = "a test"
[cpu]
applies = false
why = "CPU run"
"""


def write(tmp_path, text, name="bands.toml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_small_bands_file_reads(tmp_path):
    bands = load_bands(write(tmp_path, GOOD))
    assert bands.band("tensor-core", "90") == Band("tensor-core", "90", "fake ratio", 2.0, 3.0, "a test")
    assert bands.band("pre-volta", "90").applies is False
    assert bands.band("cpu", "90") is None


def test_open_bounds_are_written_as_inf(tmp_path):
    band = load_bands(write(tmp_path, GOOD.replace("high = 3.0", "high = inf"))).band("tensor-core", "90")
    assert band.high == math.inf


@pytest.mark.parametrize("change, message", [
    (("[cpu]", "[cpus]"), "no [cpu] table"),
    (('source = "a test"\n[pre-volta', '[pre-volta'), "needs a 'source'"),
    (("low = 2.0", "low = 4.0"), "low 4.0 > high 3.0"),
    (("low = 2.0", 'low = "two"'), "needs a number 'low'"),
    (("low = 2.0\nhigh = 3.0", "low = -inf\nhigh = inf"), "bounds nothing"),
    (('why = "not on old GPUs"\n', ""), "needs a 'why'"),
    (('metric = "fake ratio"\nlow', "low"), "needs a 'metric'"),
    (("[tensor-core.90]", "[tensor-core.90\n"), "not valid TOML"),
])
def test_bad_bands_files_are_refused_with_the_reason(tmp_path, change, message):
    path = write(tmp_path, GOOD.replace(*change, 1))
    with pytest.raises(BandsError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_bands(path)


def test_a_missing_bands_file_is_a_clear_error(tmp_path):
    with pytest.raises(BandsError, match="cannot be read"):
        load_bands(tmp_path / "nope.toml")


# -- classes and judging ------------------------------------------------------------------------
def test_gpu_class_from_compute_capability():
    assert gpu_class(facts_for_capability("NVIDIA H200", 9, 0)) == "tensor-core"
    assert gpu_class(facts_for_capability("Tesla V100", 7, 0)) == "pre-ampere"        # no TF32, no bf16
    assert gpu_class(facts_for_capability("Tesla P100", 6, 0)) == "pre-volta"


def test_gpu_class_from_board_power_and_brand():
    """Issue 40: a T4 or an L4 (under 100 W in gpulab.core.specs) is power-capped before it is Turing or Ada; a
    GeForce card of any generation is geforce; a GPU not in the table falls back on its capability."""
    assert gpu_class(facts_for_capability("Tesla T4", 7, 5)) == "power-capped"
    assert gpu_class(facts_for_capability("NVIDIA L4", 8, 9)) == "power-capped"
    assert gpu_class(facts_for_capability("NVIDIA L40S", 8, 9)) == "tensor-core"
    assert gpu_class(facts_for_capability("NVIDIA GeForce RTX 2080 Ti", 7, 5)) == "geforce"
    assert gpu_class(facts_for_capability("NVIDIA GeForce RTX 5090", 12, 0)) == "geforce"
    assert gpu_class(facts_for_capability("Quadro RTX 8000", 7, 5)) == "pre-ampere"     # not in the table
    assert gpu_class(facts_for_capability("Some Future GPU", 10, 0)) == "tensor-core"


def test_a_narrow_class_judges_by_its_parent_where_it_sets_no_band(tmp_path):
    bands = load_bands(write(tmp_path, GOOD + '[geforce]\ninherits = "tensor-core"\n'))
    assert bands.band("geforce", "90").low == 2.0 and bands.band("geforce", "90").source.startswith("as [tensor-core]")
    assert bands.band("power-capped", "90") == bands.band("tensor-core", "90")      # no table: the parent's


@pytest.mark.parametrize("extra, message", [
    ('[pre-ampere]\n', 'needs inherits = "tensor-core"'),
    ('[power-capped]\ninherits = "tensor-core"\n[power-capped.90]\nmetric = "another ratio"\nlow = 1.0\n'
     'high = 2.0\nsource = "a test"\n', "measures 'another ratio'"),
])
def test_a_narrow_class_is_refused_unless_it_narrows_its_parent_with_the_same_ratio(tmp_path, extra, message):
    with pytest.raises(BandsError, match=message):
        load_bands(write(tmp_path, GOOD + extra))


@pytest.mark.cpu_only
def test_this_machine_is_the_cpu_class():
    assert gpu_class(device_facts()) == "cpu"


def fake_lesson(lesson, title, metric, run):
    """A registry entry for a stand-in lesson module gpulab.lessons.l<lesson>_fake."""
    module = SimpleNamespace(__name__=f"gpulab.lessons.l{lesson}_fake", TITLE=title, HEADLINE=metric,
                             headline=lambda scale=None: run())
    return Experiment(module)


FAKE = fake_lesson("90", "fake lesson", "fake ratio", lambda: None)


def measured(ratio=2.5, correct=True):
    return Measured(1.0, ratio, "x", ratio, correct, "checked")


@pytest.mark.parametrize("ratio, cls, size, status", [
    (2.5, "tensor-core", "full", "pass"),
    (2.0, "tensor-core", "full", "pass"),          # bounds are inclusive
    (3.5, "tensor-core", "full", "FAIL"),
    (1.0, "tensor-core", "full", "FAIL"),
    (float("nan"), "tensor-core", "full", "FAIL"),
    (9.0, "tensor-core", "tiny", "n/a"),           # bands are for full size
    (9.0, "pre-volta", "full", "n/a"),             # band marked not applicable
    (9.0, "cpu", "full", "n/a"),                   # the CPU class never passes or fails
])
def test_judge(tmp_path, ratio, cls, size, status):
    bands = load_bands(write(tmp_path, GOOD))
    got, why, _ = judge(FAKE, measured(ratio), bands, cls, size)
    assert got == status
    assert (why == "") == (status == "pass")


def test_judge_wrong_skipped_missing_band_and_metric_mismatch(tmp_path):
    bands = load_bands(write(tmp_path, GOOD))
    assert judge(FAKE, measured(correct=False), bands, "tensor-core", "full")[0] == "wrong"
    assert judge(FAKE, None, bands, "tensor-core", "full")[0] == "skipped"
    other = fake_lesson("91", "other", "fake ratio", lambda: None)
    status, why, _ = judge(other, measured(), bands, "tensor-core", "full")
    assert status == "n/a" and "no band for lesson 91" in why
    renamed = fake_lesson("90", "fake lesson", "another ratio", lambda: None)
    status, why, _ = judge(renamed, measured(), bands, "tensor-core", "full")
    assert status == "error" and "'fake ratio'" in why


# -- --check exit codes with a fake registry ----------------------------------------------------
@pytest.fixture
def fake_gpu(tmp_path, monkeypatch):
    """A registry of one fake experiment, judged as a Tensor-Core GPU at full size."""
    path = write(tmp_path, GOOD)
    outcome = {}

    def run_fake():
        if "raise" in outcome:
            raise outcome["raise"]
        return measured(outcome.get("ratio", 2.5), outcome.get("correct", True))

    monkeypatch.setattr(B, "REGISTRY", (fake_lesson("90", "fake lesson", "fake ratio", run_fake),))
    monkeypatch.setattr(B, "gpu_class", lambda facts=None: "tensor-core")
    monkeypatch.setenv("GPULAB_SCALE", "full")

    def bench(*extra):
        return main(["bench", "--bands", str(path), "--json", str(tmp_path / "out.json"), "--no-progress", *extra])
    bench.outcome = outcome
    bench.json = tmp_path / "out.json"
    return bench


def test_check_passes_inside_the_band(fake_gpu, capsys):
    assert fake_gpu("--check") == 0
    out = capsys.readouterr().out
    assert "fake ratio" in out and "pass" in out and "no row failed" in out


@pytest.mark.parametrize("outcome, status", [
    ({"ratio": 5.0}, "FAIL"),
    ({"correct": False}, "wrong"),
    ({"raise": RuntimeError("boom")}, "error"),
    ({"raise": AssertionError("bf16 matmul is wrong")}, "wrong"),
])
def test_check_fails_outside_the_band_or_on_a_wrong_result(fake_gpu, capsys, outcome, status):
    fake_gpu.outcome.update(outcome)
    assert fake_gpu("--check") == 1
    assert fake_gpu() == 0                      # without --check the table is only printed
    row = json.loads(fake_gpu.json.read_text())["rows"][0]
    assert row["status"] == status
    assert "1 row(s) failed: 90" in capsys.readouterr().out


def test_skipped_is_not_a_failure(fake_gpu):
    fake_gpu.outcome["raise"] = Skipped("needs a CUDA GPU: test")
    assert fake_gpu("--check") == 0
    row = json.loads(fake_gpu.json.read_text())["rows"][0]
    assert row["status"] == "skipped" and row["why"] == "needs a CUDA GPU: test"


@pytest.mark.parametrize("argv, message", [
    (["bench", "--lessons", "02"], "02: not in bench"),
    (["bench", "--lessons", "77"], "77: no such lesson"),
    (["bench", "--bands", "/nonexistent/bands.toml"], "cannot be read"),
])
def test_bad_arguments_exit_2_with_a_message(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_select_keeps_registry_order_and_pads_numbers():
    assert [e.lesson for e in B.select(["7", "05"])] == ["05", "07"]
    assert [e.lesson for e in B.select(None)] == [e.lesson for e in B.REGISTRY]


# -- a real tiny run on the CPU ----------------------------------------------------------------
def test_tiny_cpu_bench_through_the_cli(on_cpu, tmp_path, results_path, capsys):
    out_json = tmp_path / "bench.json"
    code = main(["bench", "--scale", "tiny", "--lessons", "01,07", "--json", str(out_json), "--check"])
    captured = capsys.readouterr()
    assert code == 0
    data = json.loads(out_json.read_text())
    assert data["kind"] == "gpulab-bench" and data["gpu"] == "CPU" and data["scale"] == "tiny"
    assert data["gpu_class"] == "cpu"
    rows = {r["lesson"]: r for r in data["rows"]}
    assert set(rows) == {"01", "07"}
    for r in rows.values():
        assert r["status"] == "n/a" and r["correct"] is True
        assert r["ratio"] > 0 and r["baseline"] > 0 and r["optimized"] > 0
    assert rows["07"]["unit"] == "TFLOP/s" and "n=255" in rows["07"]["baseline_label"]
    recs = ResultsStore(results_path).records(name="bench_ratio")
    assert {r.lesson for r in recs} == {"01", "07"} and all(r.extra["run_id"] == data["run_id"] for r in recs)
    assert "illustrative" in captured.out and "02 (" in captured.out      # CPU note and what is not benched
    assert "[" in captured.err and "2/2" in captured.err                    # the progress bar, on stderr


def test_gpu_only_lessons_are_skipped_on_the_cpu(on_cpu):
    report = B.run(B.select(["05", "08", "11"]), progress=False)
    assert [r.status for r in report.rows] == ["skipped"] * 3
    assert all("CUDA" in r.why for r in report.rows)
    assert not report.failed


# -- the table, the JSON, the store readers ---------------------------------------------------
def report_with(rows):
    return B.Report("run-1", "NVIDIA Fake", "tensor-core", "cuda", "2.11", "13.0", "full",
                    "2026-11-29T00:00:00+00:00", "host", "bands.toml", rows, {"12": "not in gpulab"})


def test_table_has_every_column_and_says_why():
    rows = [B.Row("05", "PCIe", "pinned / pageable", "pass", baseline=7.0, optimized=55.0, unit="GB/s",
                  baseline_label="pageable", optimized_label="pinned", ratio=55 / 7, band_low=2.0, band_high=30.0),
            B.Row("01", "timing", "right / wrong", "FAIL", "outside [10, inf]", baseline=1.0, optimized=5.0,
                  unit="ms", ratio=5.0, band_low=10.0, band_high=math.inf),
            B.Row("08", "streams", "overlapped / serial", "skipped", "needs a CUDA GPU")]
    text = B.format_table(report_with(rows))
    header = text.splitlines()[2].split()
    assert header == ["lesson", "headline", "baseline", "optimized", "ratio", "band", "status"]
    assert "7 GB/s (pageable)" in text and "55 GB/s (pinned)" in text and "7.86x" in text
    assert "2 - 30" in text and ">= 10" in text
    assert "01 FAIL: outside [10, inf]" in text and "08 skipped: needs a CUDA GPU" in text
    assert "not in bench: 12 (not in gpulab)" in text and "1 row(s) failed: 01" in text
    rows.append(B.Row("11", "graphs", "eager / replay", "FAIL", "ratio is nan", ratio=float("nan")))
    data = report_with(rows).to_json()
    assert data["rows"][1]["band_high"] is None                 # JSON has no inf or nan
    assert data["rows"][3]["ratio"] is None
    json.dumps(data, allow_nan=False)


def rec(lesson, name, value):
    return Record(lesson, name, value, "x", "GPU", "cuda", "2.11", "full", "2026-11-29T00:00:00+00:00")


def test_store_readers_pair_records_run_by_run():
    recs = [rec("00", "matmul_fp32", 50.0), rec("00", "matmul_fp16", 600.0), rec("00", "matmul_bf16", 700.0),
            rec("00", "matmul_fp32", 25.0), rec("00", "matmul_fp16", 300.0), rec("00", "matmul_bf16", 250.0)]
    assert B.REGISTRY[0].from_store(recs) == [14.0, 12.0]
    on_cpu = [rec("07", "gemm_aligned_speedup_bf16", 1.1)]
    exp07 = next(e for e in B.REGISTRY if e.lesson == "07")
    assert exp07.from_store(on_cpu) == [1.1]
    assert exp07.from_store(on_cpu + [rec("07", "gemm_aligned_speedup_fp16", 5.0)]) == [5.0]
    assert B.REGISTRY[0].from_store([rec("00", "matmul_fp32", 50.0)]) == []


def test_progress_bar_on_a_terminal_redraws_one_line():
    import io

    class Tty(io.StringIO):
        def isatty(self):
            return True

    stream = Tty()
    bar = B.Progress(2, stream)
    bar.show("00 ...")
    bar.step("00 done")
    bar.step("01 done")
    text = stream.getvalue()
    assert text.count("\r") == 3 and text.endswith("\n") and "2/2" in text


# -- bad settings and paths: one line on stderr, exit 2, no traceback (issue 16) ---------------
def one_line_error(capsys, prefix="gpulab bench: "):
    err = capsys.readouterr().err
    assert err.startswith(prefix) and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("name, value, message", [
    ("GPULAB_DEVICE", "banana", "GPULAB_DEVICE='banana' is not understood; allowed values are auto, cuda, cpu"),
    ("GPULAB_SCALE", "huge", "GPULAB_SCALE='huge' is not understood; allowed values are tiny, full, auto"),
])
def test_a_bad_setting_exits_2_with_its_own_explanation(monkeypatch, capsys, name, value, message):
    monkeypatch.setenv(name, value)
    assert main(["bench", "--no-progress", "--lessons", "01"]) == 2
    assert message in one_line_error(capsys)


@pytest.mark.cpu_only
def test_gpulab_device_cuda_without_a_gpu_exits_2(monkeypatch, capsys):
    monkeypatch.setenv("GPULAB_DEVICE", "cuda")
    assert main(["bench", "--no-progress", "--lessons", "01"]) == 2
    assert "GPULAB_DEVICE=cuda but PyTorch sees no CUDA GPU" in one_line_error(capsys)


def test_the_console_command_prints_no_traceback_for_a_bad_setting(tmp_path):
    import os
    import subprocess
    import sys
    env = {**os.environ, "GPULAB_DEVICE": "banana", "GPULAB_RESULTS": str(tmp_path / "r.json")}
    proc = subprocess.run([sys.executable, "-m", "gpulab.tools.cli", "bench", "--no-progress"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.startswith("gpulab bench: GPULAB_DEVICE='banana'") and "Traceback" not in proc.stderr


def test_scale_flag_overrides_a_bad_gpulab_scale_and_is_what_is_recorded(fake_gpu, monkeypatch, results_path, capsys):
    monkeypatch.setenv("GPULAB_SCALE", "huge")
    assert fake_gpu("--scale", "full") == 0
    (rec,) = ResultsStore(results_path).records(name="bench_ratio")
    assert rec.scale == "full"
    assert json.loads(fake_gpu.json.read_text())["scale"] == "full"


def test_a_json_path_that_cannot_be_written_exits_2_before_running(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    ran = []
    monkeypatch.setattr(B, "run", lambda *a, **kw: ran.append(1))
    assert main(["bench", "--no-progress", "--lessons", "01", "--json", str(blocker / "out.json")]) == 2
    err = one_line_error(capsys)
    assert "cannot write the JSON" in err and str(blocker) in err and ran == []


def test_an_unusable_results_store_is_one_line_and_the_bench_still_reports(fake_gpu, tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("GPULAB_RESULTS", str(blocker / "results.json"))
    assert fake_gpu("--check") == 0
    captured = capsys.readouterr()
    assert "fake ratio" in captured.out and "no row failed" in captured.out
    assert json.loads(fake_gpu.json.read_text())["rows"][0]["status"] == "pass"
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err and "Warning" not in captured.err
    assert captured.err.startswith("gpulab bench: nothing recorded in the results store")
    assert "is a file, not a folder" in captured.err and "recorded in" not in captured.out


def test_torch_compile_after_importing_the_lessons_gives_no_torchscript_deprecation_warning():
    # torch.compile's first call imports torch.utils.mkldnn, whose classes use @torch.jit.script_method,
    # which warns that TorchScript is deprecated: noise in every test run, not anything gpulab does.
    import subprocess
    import sys
    script = ("import warnings\n"
              "warnings.simplefilter('always')\n"
              "with warnings.catch_warnings(record=True) as caught:\n"
              "    warnings.simplefilter('always')\n"
              "    import gpulab.tools.bench, torch\n"
              "    torch.compile(torch.nn.Linear(2, 2))\n"
              "print([str(w.message) for w in caught if 'torch.jit' in str(w.message)])\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_a_default_json_folder_that_cannot_be_made_exits_2_before_running(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("GPULAB_RESULTS", str(blocker / "results.json"))
    ran = []
    monkeypatch.setattr(B, "run", lambda *a, **kw: ran.append(1))
    assert main(["bench", "--no-progress", "--lessons", "01"]) == 2
    err = one_line_error(capsys)
    assert "cannot write the JSON beside the results store" in err and "--json PATH" in err and ran == []


def test_judge_lowers_the_band_to_the_lessons_own_lower_prediction(tmp_path):
    """A lesson's band_floor() (lesson 03: this host's cores) lowers the class's low end, never raises it,
    and the verdict says so: bench and the notebook judge the same."""
    bands = load_bands(write(tmp_path, GOOD))
    small_host = fake_lesson("90", "fake lesson", "fake ratio", lambda: None)
    small_host.module.band_floor = lambda scale=None: (1.5, "2 CPU core(s)")
    status, why, _ = judge(small_host, measured(1.6), bands, "tensor-core", "full")
    assert status == "pass" and "lowered from 2: 2 CPU core(s)" in why
    status, why, _ = judge(small_host, measured(1.4), bands, "tensor-core", "full")
    assert status == "FAIL" and "outside [1.5, 3]" in why
    big_host = fake_lesson("90", "fake lesson", "fake ratio", lambda: None)
    big_host.module.band_floor = lambda scale=None: (6.0, "16 cores")
    assert judge(big_host, measured(1.6), bands, "tensor-core", "full")[0] == "FAIL"
    # a host that cannot show the effect at all (lesson 03 on one physical core): not judged, with the reason
    one_core = fake_lesson("90", "fake lesson", "fake ratio", lambda: None)
    one_core.module.band_floor = lambda scale=None: (None, "not judged on this host: 1 physical CPU core(s)")
    status, why, _ = judge(one_core, measured(1.0), bands, "tensor-core", "full")
    assert status == B.NA and "1 physical CPU core(s)" in why
