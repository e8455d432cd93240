"""gpulab.notebook.lesson: start, show_source, expect, what_you_saw."""
import dataclasses

import pytest
from IPython.display import HTML, Markdown

from gpulab.notebook import lesson
from gpulab.notebook.lesson import expect
from gpulab.core.memory import fmt_bytes


@pytest.fixture
def shown(monkeypatch):
    """What the lesson helpers display, instead of showing it."""
    out = []
    monkeypatch.setattr(lesson, "display", out.append)
    return out


# -- expect -------------------------------------------------------------------------------
def test_expect_pass(capsys):
    check = expect("pinned speed-up", 2.5, low=2, high=4, why="pinned memory skips a copy")
    assert check.status == "pass"
    assert check.why == "pinned memory skips a copy"
    assert capsys.readouterr().out == (
        "   pass  pinned speed-up: 2.5 (expected [2, 4]) pinned memory skips a copy\n")


def test_expect_fail_below_the_band(capsys):
    check = expect("pinned speed-up", 1.2, low=2, high=4)
    assert check.status == "FAIL"
    assert check.why == "1.2 is below the band's low end 2: this GPU did not show the expected effect"
    assert capsys.readouterr().out.startswith("   FAIL  pinned speed-up: 1.2 (expected [2, 4])")


def test_expect_fail_above_the_band_gives_the_reason():
    check = expect("overhead", 9.0, high=5, why_fail="another process shares the GPU")
    assert (check.status, check.why) == ("FAIL", "9 is above the band's high end 5: another process shares the GPU")


def test_a_failure_never_prints_the_skip_reason(capsys):
    """Issue 15: at full size a real failure printed "tiny scale: ..."; the skip text is for skips only."""
    check = expect("speed-up", 1.0, low=2, applies=True, why_not="tiny scale: too small to show it",
                   why_fail="the products were launch-bound")
    out = capsys.readouterr().out
    assert check.status == "FAIL" and "tiny scale" not in out and "launch-bound" in out
    skipped = expect("speed-up", 1.0, low=2, applies=False, why_not="tiny scale: too small to show it",
                     why_fail="the products were launch-bound")
    assert skipped.status == "skipped" and skipped.why == "tiny scale: too small to show it"


def test_expect_one_sided_band(capsys):
    assert expect("speed-up", 100.0, low=2).status == "pass"
    assert "(expected [2, -])" in capsys.readouterr().out


def test_expect_not_applicable_is_skipped_never_passed(capsys):
    check = expect("pinned speed-up", 3.0, low=2, high=4, applies=False,
                   why_not="no GPU: nothing crosses PCIe")
    assert check.status == "skipped"
    assert check.why == "no GPU: nothing crosses PCIe"
    assert capsys.readouterr().out.startswith("skipped  pinned speed-up: 3 ")


def test_expect_without_a_measurement_is_skipped(capsys):
    check = expect("busy %", None, low=90)
    assert (check.status, check.why) == ("skipped", "not measurable here")
    assert "busy %: - (expected [90, -]) not measurable here" in capsys.readouterr().out


def test_check_is_frozen():
    check = expect("x", 1.0, low=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        check.status = "pass"


# -- display helpers ------------------------------------------------------------------------
def test_start_names_the_lesson_and_device(shown, on_cpu):
    lesson.start("01")
    (md,) = shown
    assert isinstance(md, Markdown)
    assert md.data.startswith("**Lesson 01.** Running on the CPU")
    assert "scale=tiny" in md.data


def test_show_source_shows_the_code(shown):
    lesson.show_source(fmt_bytes)
    (md,) = shown
    assert md.data.startswith("`gpulab.core.memory.fmt_bytes`:\n```python\ndef fmt_bytes(")
    assert md.data.rstrip().endswith("```")


def test_what_you_saw_table(shown, on_cpu):
    lesson.what_you_saw([("matmul TFLOP/s", 1.23456), ("note", "<b>bold</b>"), ("runs", 3)])
    (table,) = shown
    assert isinstance(table, HTML)
    html = table.data
    assert html.startswith("<b>What you saw</b>")
    assert "<tr><td>matmul TFLOP/s</td><td>1.235</td></tr>" in html
    assert "<td>&lt;b&gt;bold&lt;/b&gt;</td>" in html
    assert "<tr><td>runs</td><td>3</td></tr>" in html
    assert "scale=tiny — CPU: illustrative only" in html


def test_what_you_saw_custom_title(shown, on_cpu):
    lesson.what_you_saw([], title="Results & notes")
    assert shown[0].data.startswith("<b>Results &amp; notes</b>")


def test_what_you_saw_ends_with_the_notebooks_memory_check(shown, on_cpu, monkeypatch, capsys):
    """Issue 40, item 2: the closing table says whether memory is back at the notebook's start; under the CPU
    counting and strict modes a tensor held since an earlier cell fails it, after the table is shown."""
    import torch
    from gpulab.core import memory
    monkeypatch.delenv(memory.CPU_COUNT_ENV, raising=False)
    lesson.what_you_saw([])
    assert "<tr><td>memory allocated at the end</td><td>not measured (no CUDA allocator on the CPU)</td></tr>" \
        in shown[-1].data
    assert capsys.readouterr().out == "memory check: skipped on the CPU (no CUDA allocator to read).\n"
    monkeypatch.setenv(memory.CPU_COUNT_ENV, "1")
    monkeypatch.setenv(memory.STRICT_ENV, "1")
    monkeypatch.setattr(memory, "_start", {})
    lesson.start("01")                                   # the notebook's start: after its imports
    held = torch.ones(2**20)                             # 4 MiB from an "earlier cell"
    with pytest.raises(memory.MemoryNotReturned, match="4.0 MiB more than at the notebook's start"):
        lesson.what_you_saw([("x", 1)])
    assert "4.0 MiB more than at the notebook&#x27;s start (see the memory check)" in shown[-1].data
    lesson.what_you_saw([("x", 1)], keeps=(held,))      # declared: passes
    assert "back to the notebook&#x27;s start (" in shown[-1].data       # whatever this test process held then
    assert "), and 4.0 MiB kept on purpose</td>" in shown[-1].data



# -- bands from the one file -----------------------------------------------------------------------
def _facts_for(monkeypatch, facts):
    import gpulab.core.device as D
    monkeypatch.setattr(D, "device_facts", lambda device=None: facts)


@pytest.mark.parametrize("name, cc, measured, status, low", [
    ("NVIDIA H200", (9, 0), 13.3, "pass", 3.0),              # tensor-core band of lesson 00
    ("NVIDIA H200", (9, 0), 2.0, "FAIL", 3.0),
    ("NVIDIA GeForce RTX 4090", (8, 9), 2.0, "pass", 1.6),   # geforce: half-rate fp32-accumulate
    ("Tesla T4", (7, 5), 2.5, "pass", 1.3),                  # power-capped: 24 of 65 TFLOP/s at 70 W
    ("Tesla V100-SXM2-16GB", (7, 0), 4.0, "FAIL", 5.0),      # pre-ampere: its datasheet's 8x, not 3x
])
def test_expect_band_takes_the_band_of_this_gpus_class_from_bands_toml(monkeypatch, capsys, name, cc, measured,
                                                                       status, low):
    from gpulab.core.bands import gpu_class, load_bands
    from gpulab.core.device import facts_for_capability
    facts = facts_for_capability(name, *cc)
    _facts_for(monkeypatch, facts)
    check = lesson.expect_band("00", measured)
    band = load_bands().band(gpu_class(facts), "00")
    assert (check.status, check.low, band.low) == (status, low, low)
    assert check.name == "16-bit / fp32 matmul TFLOP/s"


def test_expect_band_skips_under_a_profile_and_where_no_band_applies(monkeypatch, capsys):
    import dataclasses
    from gpulab.core.device import facts_for_capability
    facts = dataclasses.replace(facts_for_capability("Tesla T4", 7, 5), profile="t4", emulated_on="NVIDIA H200")
    _facts_for(monkeypatch, facts)
    check = lesson.expect_band("00", 13.3)
    assert check.status == "skipped" and "emulating the t4 profile" in check.why
    # a band of memory is the model's, not this GPU's speed: judged under the profile too
    assert lesson.expect_band("09", 0.35).status == "pass"
    assert lesson.expect_band("10", 1.2).status == "FAIL"
    _facts_for(monkeypatch, facts_for_capability("Tesla P100", 6, 0))
    check = lesson.expect_band("00", 2.0)
    assert check.status == "skipped" and "no Tensor Cores" in check.why


def test_a_value_that_is_not_a_number_fails_and_says_so():
    check = expect("busy %", float("nan"), low=1.5, why_fail="the monitor read nothing")
    assert check.status == "FAIL" and "not a finite number" in check.why and "the monitor read nothing" in check.why


def test_a_value_never_prints_the_same_as_the_band_edge_it_missed(capsys):
    """Issue 24: '1.01 (expected [0.99, 1.01]) 1.01 is above the band's high end 1.01'."""
    check = lesson.expect("ratio", 1.0126, 0.99, 1.01)
    out = capsys.readouterr().out
    assert check.status == "FAIL" and "1.013 (expected [0.99, 1.01])" in out
    assert "1.013 is above the band's high end 1.01" in out
    assert lesson.distinct_digits(1.0126, 0.99, 1.01) == 4
    assert lesson.distinct_digits(0.98999, 0.99, None) == 5            # 0.98999 below 0.99
    assert lesson.distinct_digits(2.5, 1.0, 4.0) == 3                   # far from both: the usual 3
    for value, low, high in ((1.0126, 0.99, 1.01), (0.989999, 0.99, 1.5), (4.00001, 1.0, 4.0)):
        text = lesson.fail_text(value, low, high, "")
        shown, edge = text.split(" is ")[0], text.split(" end ")[1].split(":")[0]
        assert shown != edge, text


def test_under_a_profile_every_table_and_caption_says_whose_timings(monkeypatch):
    """Issue 24: "fp16 706 TFLOP/s" under the caption "Tesla T4" on an H200 emulating a T4."""
    import gpulab.core.device as D
    real = D.device_facts()
    emulated = dataclasses.replace(real, name="Tesla T4", profile="t4")
    monkeypatch.setattr(D, "device_facts", lambda device=None: emulated)
    monkeypatch.setattr(D, "_real_facts", lambda device: dataclasses.replace(real, name="NVIDIA H200"))
    assert D.device_label() == "NVIDIA H200 emulating t4 (Tesla T4)"
    shown = []
    monkeypatch.setattr(lesson, "display", lambda obj: shown.append(obj.data))
    lesson.show_table([("fp16", 706.0)], header=("precision", "TFLOP/s"))
    lesson.what_you_saw([("fp16", 706.0)])
    assert all("NVIDIA H200 emulating t4 (Tesla T4)" in html for html in shown), shown
    monkeypatch.setattr(D, "device_facts", lambda device=None: real)
    shown.clear()
    lesson.show_table([("fp16", 706.0)])
    assert "emulating" not in shown[0]


def test_a_device_column_is_totalled_over_the_device_rows_only():
    """An operator row carries its kernels' self device time again: PyTorch's table adds the device rows."""
    from types import SimpleNamespace as E
    from torch.autograd import DeviceType
    rows = [E(key="aten::mm", device_type=DeviceType.CPU, is_legacy=False, is_user_annotation=False,
              self_device_time_total=10.0, self_cpu_time_total=5.0),
            E(key="gemm_kernel", device_type=DeviceType.CUDA, is_legacy=False, is_user_annotation=False,
              self_device_time_total=10.0, self_cpu_time_total=0.0),
            E(key="my_range", device_type=DeviceType.CUDA, is_legacy=False, is_user_annotation=True,
              self_device_time_total=10.0, self_cpu_time_total=0.0)]
    assert lesson.column_total(rows, "self_device_time_total") == 10.0
    assert lesson.column_total(rows, "self_cpu_time_total") == 5.0
    legacy = [E(key="aten::mm", device_type=DeviceType.CPU, is_legacy=True, is_user_annotation=False,
                self_device_time_total=7.0)]
    assert lesson.column_total(legacy, "self_device_time_total") == 7.0


def test_checks_are_logged_where_gpulab_checks_says(tmp_path, monkeypatch, capsys):
    """A course run leaves every check (pass, FAIL, skipped) with its lesson in the GPULAB_CHECKS file;
    unset, nothing is written; an unwritable path is said, not raised."""
    import json

    from gpulab.notebook import lesson as L
    path = tmp_path / "checks.jsonl"
    monkeypatch.setattr(L, "_lesson", "06")
    L.expect("ratio", 1.0, 2.0, 3.0, why_fail="too slow")
    assert not path.exists()
    monkeypatch.setenv(L.CHECKS_ENV, str(path))
    L.expect("ratio", 1.0, 2.0, 3.0, why_fail="too slow")
    L.expect("other", None, applies=False, why_not="no GPU here")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["lesson"], r["name"], r["status"]) for r in rows] == [("06", "ratio", "FAIL"), ("06", "other", "skipped")]
    assert rows[0]["low"] == 2.0 and "too slow" in rows[0]["why"] and rows[1]["why"] == "no GPU here"
    assert {"gpu", "profile", "scale", "time"} <= set(rows[0])
    monkeypatch.setenv(L.CHECKS_ENV, str(tmp_path / "no-such-folder" / "x.jsonl"))
    L.expect("ratio", 2.5, 2.0, 3.0)
    assert "was not logged" in capsys.readouterr().out


def test_a_check_outside_its_band_on_a_shared_gpu_says_shared_not_fail(monkeypatch, capsys):
    from gpulab.notebook import lesson as L
    monkeypatch.setattr(L, "_shared_gpu", lambda: "2 other processes on it")
    out = L.expect("ratio", 1.0, 2.0, 3.0, why_fail="too slow")
    assert out.status == "shared" and "not judged: this GPU is shared (2 other processes on it)" in out.why
    assert "too slow" in out.why and "FAIL" not in capsys.readouterr().out
    assert L.expect("ratio", 2.5, 2.0, 3.0).status == "pass"          # inside its band: a pass all the same
    monkeypatch.setattr(L, "_shared_gpu", lambda: "")
    assert L.expect("ratio", 1.0, 2.0, 3.0).status == "FAIL"


def test_a_computed_band_edge_prints_in_a_few_digits():
    """13's FP8 check printed 'expected [1.200606673407482, -]'."""
    from gpulab.notebook.lesson import Check
    text = str(Check("FP8 / bf16", 2.0076, 1.200606673407482, None, "pass", ""))
    assert "(expected [1.2, -])" in text, text


def test_a_timed_check_is_shown_not_judged_under_a_gpu_profile(monkeypatch, capsys):
    """07's vocabulary check and 09's time checks: under a profile the sizes are the class's, the timing this
    GPU's; a ratio far outside its band is then skipped with the reason, not failed. Without a profile it fails."""
    from gpulab.notebook import lesson as L
    monkeypatch.setattr(L, "emulated_profile", lambda: "t4")
    c = L.expect("step time, selective / full", 1.72, high=1.0, timed=True)
    assert c.status == "skipped" and "emulating the t4 profile" in c.why
    assert L.expect("memory, every block / none", 0.9, high=0.5).status == "FAIL"      # not timed: judged
    monkeypatch.setattr(L, "emulated_profile", lambda: None)
    assert L.expect("step time, selective / full", 1.72, high=1.0, timed=True).status == "FAIL"
