"""gpulab.notebook.widgets: controls, the experiment Panel, MonitorPanel."""
import ipywidgets as W
import pytest
import torch

from gpulab.core.timing import summarize
from gpulab.notebook.widgets import Choice, IntRange, MonitorPanel, Panel, Toggle, explain_error

CONTROLS = {"dtype": Choice(("fp32", "bf16")), "n": IntRange(64, 1024, step=64), "pinned": Toggle()}
DEFAULT_ARGS = {"dtype": "bf16", "n": 256, "pinned": False}


def make_experiment(result=None, error=None):
    """An experiment that records its calls; returns {"ms": n / 100} unless told otherwise."""
    calls = []

    def experiment(dtype="bf16", n=256, pinned=False):
        calls.append({"dtype": dtype, "n": n, "pinned": pinned})
        if error is not None:
            raise error
        return {"ms": n / 100} if result is None else result
    experiment.calls = calls
    return experiment


def make_panel(experiment=None, **kw):
    experiment = experiment or make_experiment()
    return Panel(experiment, CONTROLS, metric="ms", **kw), experiment


# -- controls ------------------------------------------------------------------------
def test_int_range_accepts_whole_numbers_in_range():
    r = IntRange(64, 1024, step=64)
    assert r.validate("n", 64) == 64
    assert r.validate("n", 1024) == 1024
    assert r.validate("n", "512") == 512          # typed text
    assert r.validate("n", 512.0) == 512


@pytest.mark.parametrize("value, message", [
    (32, "n must be between 64 and 1024 (got 32)."),
    (2048, "n must be between 64 and 1024 (got 2048)."),
    (100, "n must be 64 plus a multiple of 64 (got 100)."),
    (128.5, "n must be a whole number (got 128.5)."),
    ("abc", "n must be a whole number (got 'abc')."),
    (None, "n must be a whole number (got None)."),
])
def test_int_range_refuses(value, message):
    with pytest.raises(ValueError) as info:
        IntRange(64, 1024, step=64).validate("n", value)
    assert str(info.value) == message


def test_int_range_refuses_a_bool():
    with pytest.raises(ValueError, match="whole number"):
        IntRange(0, 10).validate("n", True)


def test_choice_and_toggle():
    assert Choice(("fp32", "bf16")).validate("dtype", "fp32") == "fp32"
    with pytest.raises(ValueError, match=r"dtype must be one of 'fp32', 'bf16' \(got 'fp16'\)"):
        Choice(("fp32", "bf16")).validate("dtype", "fp16")
    assert Toggle().validate("pinned", True) is True
    with pytest.raises(ValueError, match=r"pinned must be True or False \(got 'yes'\)"):
        Toggle().validate("pinned", "yes")
    with pytest.raises(ValueError):
        Toggle().validate("pinned", 1)


def test_controls_make_matching_widgets():
    choice = Choice(("fp32", "bf16"), label="precision").widget("dtype", "bf16")
    assert isinstance(choice, W.ToggleButtons)
    assert choice.options == ("fp32", "bf16") and choice.value == "bf16"
    assert choice.description == "precision"
    box = IntRange(64, 1024).widget("n", 256)
    assert isinstance(box, W.IntText) and box.value == 256 and box.description == "n"
    assert isinstance(Toggle().widget("pinned", True), W.Checkbox)


# -- the panel: default run ------------------------------------------------------------
def test_panel_runs_the_defaults_once():
    panel, exp = make_panel()
    assert exp.calls == [DEFAULT_ARGS]
    assert panel.history == [(DEFAULT_ARGS, {"ms": 2.56})]
    assert panel.last_message == "run #1 done."


def test_panel_without_default_run():
    panel, exp = make_panel(run_default=False)
    assert exp.calls == [] and panel.history == []
    assert panel.table_html() == "<p>no runs yet</p>"


def test_panel_defaults_override_the_function_defaults():
    panel, exp = make_panel(defaults={"n": 512})
    assert exp.calls == [{**DEFAULT_ARGS, "n": 512}]
    assert panel.inputs["n"].value == 512


def test_panel_refuses_invalid_defaults():
    with pytest.raises(ValueError, match="between 64 and 1024"):
        make_panel(defaults={"n": 5})


def test_control_for_a_missing_argument_is_a_type_error():
    with pytest.raises(TypeError, match=r"experiment\(\) has no argument\(s\) \['batch'\]"):
        Panel(make_experiment(), {"batch": IntRange(1, 64)}, metric="ms")


# -- refused values -------------------------------------------------------------------
@pytest.mark.parametrize("values, message", [
    ({"n": 2048}, "Refused: n must be between 64 and 1024 (got 2048)."),
    ({"n": 100}, "Refused: n must be 64 plus a multiple of 64 (got 100)."),
    ({"n": "lots"}, "Refused: n must be a whole number (got 'lots')."),
    ({"dtype": "fp16"}, "Refused: dtype must be one of 'fp32', 'bf16' (got 'fp16')."),
    ({"batch": 8}, "Refused: unknown setting(s): batch; this panel has dtype, n, pinned."),
])
def test_invalid_values_are_refused_and_nothing_runs(values, message, capsys):
    panel, exp = make_panel()
    before = list(panel.history)
    assert panel.run(**values) is None
    assert panel.last_message == message
    assert message in capsys.readouterr().out
    assert "Refused" in panel.status.value
    assert len(exp.calls) == 1                  # only the default run
    assert panel.history == before


def test_typed_number_is_converted_before_the_run():
    panel, exp = make_panel(run_default=False)
    panel.run(n="512")
    assert exp.calls == [{**DEFAULT_ARGS, "n": 512}]


# -- the button --------------------------------------------------------------------------
def test_button_runs_with_the_widget_values():
    panel, exp = make_panel()
    panel.inputs["dtype"].value = "fp32"
    panel.inputs["n"].value = 512
    panel.inputs["pinned"].value = True
    panel.button.click()
    assert exp.calls[-1] == {"dtype": "fp32", "n": 512, "pinned": True}
    assert len(panel.history) == 2
    assert panel.button.disabled is False


def test_button_with_out_of_range_box_value_is_refused():
    panel, exp = make_panel()
    panel.inputs["n"].value = 4096
    panel.button.click()
    assert len(exp.calls) == 1
    assert panel.last_message == "Refused: n must be between 64 and 1024 (got 4096)."


# -- errors inside the experiment -------------------------------------------------------
def test_value_error_in_experiment_is_refused(capsys):
    panel, exp = make_panel(make_experiment(error=ValueError("n too big for this GPU")),
                            run_default=False)
    assert panel.run() is None
    assert panel.last_message == "Refused: n too big for this GPU"
    assert panel.history == [] and len(exp.calls) == 1


def test_runtime_error_is_caught_and_explained(capsys):
    panel, _ = make_panel(make_experiment(error=RuntimeError("kernel exploded")),
                          run_default=False)
    assert panel.run() is None
    assert panel.last_message == "The experiment failed with RuntimeError: kernel exploded"
    assert "RuntimeError: kernel exploded" in capsys.readouterr().err   # short traceback
    assert panel.history == [] and panel.button.disabled is False


def test_out_of_memory_is_explained_without_traceback(capsys):
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
    panel, _ = make_panel(make_experiment(error=oom), run_default=False)
    assert panel.run(n=1024) is None
    msg = panel.last_message
    assert msg.startswith("Out of GPU memory")
    assert "(CUDA out of memory. Tried to allocate 2.00 GiB)" in msg
    assert "more detail" not in msg
    assert capsys.readouterr().err == ""
    assert panel.history == []


def test_panel_survives_an_error_and_runs_again():
    results = iter([RuntimeError("flaky"), {"ms": 1.0}])

    def experiment(n=256):
        r = next(results)
        if isinstance(r, Exception):
            raise r
        return r
    panel = Panel(experiment, {"n": IntRange(64, 1024)}, metric="ms", run_default=False)
    assert panel.run(n=256) is None                      # a click: the error is shown, not raised
    assert "RuntimeError: flaky" in panel.last_message
    assert panel.history == []
    assert panel.run(n=128) == {"ms": 1.0}
    assert panel.history == [({"n": 128}, {"ms": 1.0})]


def test_a_bug_in_the_default_run_is_raised_so_nbval_sees_it():
    def experiment(n=256):
        raise TypeError("'bool' object is not callable")
    with pytest.raises(TypeError, match="not callable"):
        Panel(experiment, {"n": IntRange(64, 1024)}, metric="ms")


def test_a_refusal_or_oom_in_the_default_run_is_only_reported():
    def experiment(n=256):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    panel = Panel(experiment, {"n": IntRange(64, 1024)}, metric="ms")
    assert panel.history == [] and "Out of GPU memory" in panel.last_message


def test_explain_error():
    assert explain_error(ValueError("bad n")) == "Refused: bad n"
    assert explain_error(KeyError("x")) == "The experiment failed with KeyError: 'x'"
    assert explain_error(torch.OutOfMemoryError("CUDA out of memory.")).startswith(
        "Out of GPU memory: this setting needs more memory than the GPU has free.")


def test_missing_metric_is_reported():
    panel, _ = make_panel(make_experiment(result={"GB/s": 3.0}), run_default=False)
    assert panel.run() is None
    assert panel.last_message == "the experiment returned no 'ms'; it returned ['GB/s']"
    assert panel.history == []


# -- history, table, figure --------------------------------------------------------------
def test_history_keeps_earlier_runs():
    panel, _ = make_panel()
    panel.run(n=512)
    panel.run(dtype="fp32")
    assert [args["n"] for args, _ in panel.history] == [256, 512, 256]
    table = panel.table_html()
    assert table.count("<tr>") == 1 + 3            # header + one row per run
    assert "<th>run</th><th>dtype</th><th>n</th><th>pinned</th><th>ms</th>" in table
    assert "<td>2</td><td>bf16</td><td>512</td><td>False</td><td>5.12</td>" in table
    fig = panel.figure()
    (ax,) = fig.axes
    assert len(ax.patches) == 3
    assert [t.get_text() for t in ax.get_xticklabels()] == ["#1 default", "#2 n=512", "#3 dtype=fp32"]


def test_timing_results_show_median_and_spread():
    t = summarize([1.0, 2.0, 3.0, 4.0, 5.0], "cpu", "perf_counter")
    panel, _ = make_panel(make_experiment(result={"ms": t}))
    assert "<td>3 ms ± 1</td>" in panel.table_html()
    (ax,) = panel.figure().axes
    assert [p.get_height() for p in ax.patches] == [3.0]


def test_clear_forgets_the_runs():
    panel, exp = make_panel()
    panel.run(n=512)
    panel.clear_button.click()
    assert panel.history == []
    assert panel.last_message == "runs cleared."
    assert panel.table_html() == "<p>no runs yet</p>"
    panel.run()
    assert panel.last_message == "run #1 done."


# -- MonitorPanel ------------------------------------------------------------------------
def test_monitor_panel_on_cpu_runs_the_load_and_says_the_monitor_is_off(on_cpu, capsys):
    calls = []
    mp = MonitorPanel(load=lambda: calls.append(1), load_seconds=0.05)
    assert len(calls) >= 1
    assert mp.status.value == "GPU monitor off: the course is running on the CPU."
    assert "GPU monitor off" in capsys.readouterr().out
    assert mp.image.value[:8] == b"\x89PNG\r\n\x1a\n"   # the 'no samples' figure


def test_monitor_panel_without_load(on_cpu):
    mp = MonitorPanel(run_default=False)
    assert mp.load_button.disabled is True
    assert mp.status.value == ""
    mp.start_button.value = True
    assert "running on the CPU" in mp.status.value
    mp.start_button.value = False
    assert mp.image.value[:4] == b"\x89PNG"


@pytest.mark.parametrize("args, message", [
    ((16, 8), "IntRange min 16 is above max 8"),
    ((1, 8, 0), "IntRange step must be 1 or more"),
    ((1, 8, -2), "IntRange step must be 1 or more"),
    ((1.5, 8), "IntRange min must be a whole number"),
])
def test_an_impossible_int_range_is_refused_when_made(args, message):
    from gpulab.notebook.controls import IntRange as Range
    with pytest.raises(ValueError, match=message):
        Range(*args)
