"""gpulab.tools.cli: `gpulab doctor` on this (GPU-less) machine and with simulated problems."""
import json
import os
import shutil
import subprocess
from importlib.metadata import PackageNotFoundError, distribution

import pytest
import torch

from gpulab.tools import cli
from gpulab.core import monitor
from gpulab.tools.cli import FAIL, OK, WARN, doctor_findings, main


def findings(**kw):
    return {f.check: f for f in doctor_findings(**kw)}


def run_main(argv, capsys):
    code = main(argv)
    return code, capsys.readouterr().out


# -- usage -------------------------------------------------------------------------------
def test_no_command_prints_usage_and_fails(capsys):
    code, out = run_main([], capsys)
    assert code == 2
    assert out.startswith("usage: gpulab doctor [--cpu-ok] [--json]")


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_succeeds(flag, capsys):
    code, out = run_main([flag], capsys)
    assert code == 0 and "usage: gpulab doctor" in out


def test_unknown_command_fails(capsys):
    code, out = run_main(["frobnicate"], capsys)
    assert code == 2 and "usage:" in out


def test_unknown_doctor_option_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["doctor", "--bogus"])
    assert info.value.code == 2


# -- doctor on this machine ---------------------------------------------------------------
@pytest.mark.cpu_only
def test_doctor_without_gpu_is_not_ready(capsys):
    code, out = run_main(["doctor"], capsys)
    assert code == 1
    assert "FAIL  GPU" in out
    assert "fix: run the course on a machine with an NVIDIA GPU" in out
    assert "NOT READY: 2 problem(s) above." in out        # the GPU and NVML


@pytest.mark.cpu_only
def test_doctor_cpu_ok_accepts_a_cpu_machine(capsys):
    code, out = run_main(["doctor", "--cpu-ok"], capsys)
    assert code == 0
    assert "FAIL" not in out
    assert "warn  GPU" in out
    assert out.rstrip().endswith("Ready for the course. (GPU side: not checked, --cpu-ok)")


@pytest.mark.cpu_only
def test_doctor_json(capsys):
    code, out = run_main(["doctor", "--json"], capsys)
    rows = json.loads(out)
    assert code == 1
    assert all(set(r) == {"check", "status", "detail", "fix"} for r in rows)
    by_check = {r["check"]: r for r in rows}
    assert by_check["GPU"]["status"] == FAIL
    assert "no CUDA GPU" in by_check["GPU"]["detail"]
    assert "libnvidia-ml.so" in by_check["NVIDIA driver / NVML"]["detail"]
    assert by_check["python"]["status"] == OK


def test_doctor_lists_checks_in_order():
    checks = list(findings())
    assert checks[:2] == ["python", "torch"]
    assert checks[-4:] == ["JupyterLab widget extension", "GPULAB_DEVICE", "GPULAB_SCALE", "GPULAB_PROFILE"]
    assert {"GPU", "NVIDIA driver / NVML", "Triton", "ipywidgets", "nvidia-ml-py"} <= set(checks)


def console_script():
    """The `gpulab` script of the environment running the tests: beside sys.executable (a venv's bin/,
    which `bash setup.sh test` does not put on PATH), else on PATH; None only if gpulab is not installed."""
    import sys
    import sysconfig
    from pathlib import Path
    names = ("gpulab.exe", "gpulab") if os.name == "nt" else ("gpulab",)
    for folder in (Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))):
        for name in names:
            if (folder / name).is_file():
                return str(folder / name)
    return shutil.which("gpulab")


def test_the_console_script_is_found_without_path(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")          # as under `bash setup.sh test`: .venv/bin not on PATH
    exe = console_script()
    if exe is None:
        with pytest.raises(PackageNotFoundError):
            distribution("gpulab")
        pytest.skip("the gpulab package is not installed (pip install -e .), so it has no console script")
    assert os.access(exe, os.X_OK)


@pytest.mark.cpu_only
def test_console_script_doctor():
    exe = console_script()
    if exe is None:
        with pytest.raises(PackageNotFoundError):     # installed, yet no script: that is a failure
            distribution("gpulab")
        pytest.skip("the gpulab package is not installed (pip install -e .), so it has no console script")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULAB_")}
    proc = subprocess.run([exe, "doctor"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 1
    assert "NOT READY" in proc.stdout
    assert "fix:" in proc.stdout


# -- simulated problems ---------------------------------------------------------------------
def test_missing_widget_extension_fails_with_a_fix(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_widget_extension", lambda: None)
    ext = findings(cpu_ok=True)["JupyterLab widget extension"]
    assert ext.status == FAIL
    assert "jupyterlab-manager is not installed" in ext.detail
    assert "pip install --force-reinstall jupyterlab_widgets" in ext.fix
    code, out = run_main(["doctor", "--cpu-ok"], capsys)
    assert code == 1 and "NOT READY" in out


def test_bad_gpulab_scale_is_a_failure(monkeypatch, capsys):
    monkeypatch.setenv("GPULAB_SCALE", "medium")
    row = findings(cpu_ok=True)["GPULAB_SCALE"]
    assert row.status == FAIL
    assert "allowed values are tiny, full, auto" in row.detail
    assert row.fix == "unset GPULAB_SCALE, or set tiny, full or auto"
    code, out = run_main(["doctor", "--cpu-ok"], capsys)
    assert code == 1 and "FAIL  GPULAB_SCALE" in out


def test_good_gpulab_scale_is_reported(monkeypatch):
    monkeypatch.setenv("GPULAB_SCALE", "full")
    row = findings()["GPULAB_SCALE"]
    assert (row.status, row.detail) == (OK, "lessons run at scale=full")


def test_bad_gpulab_device_is_a_failure(monkeypatch, capsys):
    monkeypatch.setenv("GPULAB_SCALE", "tiny")
    monkeypatch.setenv("GPULAB_DEVICE", "gpu")
    code, out = run_main(["doctor", "--cpu-ok"], capsys)
    assert code == 1 and "GPULAB_DEVICE" in out


def test_missing_package_fails_with_pip_command(monkeypatch):
    real = cli._version
    monkeypatch.setattr(cli, "_version", lambda d: None if d == "matplotlib" else real(d))
    row = findings(cpu_ok=True)["matplotlib"]
    assert (row.status, row.detail) == (FAIL, "missing (every plot)")
    assert row.fix.startswith("pip install matplotlib")


def test_deprecated_pynvml_distribution_is_a_warning(monkeypatch):
    real = cli._version
    monkeypatch.setattr(cli, "_version", lambda d: "11.5.0" if d == "pynvml" else real(d))
    row = findings()["pynvml package"]
    assert row.status == WARN
    assert row.fix == "pip uninstall pynvml  (gpulab needs only nvidia-ml-py)"


def test_no_deprecated_pynvml_row_normally(monkeypatch):
    real = cli._version
    monkeypatch.setattr(cli, "_version", lambda d: None if d == "pynvml" else real(d))
    assert "pynvml package" not in findings()


def test_missing_pynvml_module_is_explained(monkeypatch):
    def no_module():
        raise ImportError("No module named 'pynvml'")
    monkeypatch.setattr(monitor, "import_pynvml", no_module)
    row = findings(cpu_ok=True)["NVIDIA driver / NVML"]
    assert row.status == WARN
    assert "pip install nvidia-ml-py" in row.detail


@pytest.mark.cpu_only
def test_gpu_machine_with_cpu_torch_fails_even_with_cpu_ok(monkeypatch):
    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build")
    monkeypatch.setattr(monitor, "nvml_status",
                        lambda: (True, "NVML ready: driver 550.54.15, 1 GPU(s)."))
    found = findings(cpu_ok=True)
    assert found["GPU"].status == FAIL
    assert found["GPU"].detail == "this machine has an NVIDIA GPU but PyTorch is a CPU build"
    assert "install a CUDA build" in found["GPU"].fix
    assert found["NVIDIA driver / NVML"].status == OK


@pytest.mark.cpu_only
def test_cpu_ok_turns_gpu_failures_into_warnings():
    strict, relaxed = findings(), findings(cpu_ok=True)
    assert strict["GPU"].status == FAIL and relaxed["GPU"].status == WARN
    assert strict["NVIDIA driver / NVML"].status == FAIL
    assert relaxed["NVIDIA driver / NVML"].status == WARN


# -- rows that contradict each other or the README (issue 16) -------------------------------------
def no_triton(monkeypatch):
    real = cli.importlib.import_module
    def fake(name, *a, **kw):
        if name == "triton":
            raise ImportError("No module named 'triton'")
        return real(name, *a, **kw)
    monkeypatch.setattr(cli.importlib, "import_module", fake)


@pytest.mark.cpu_only
def test_triton_is_not_a_problem_on_a_machine_without_a_gpu(monkeypatch, capsys):
    no_triton(monkeypatch)
    row = findings()["Triton"]
    assert row.status == OK and row.fix == ""
    assert "only needed on a GPU" in row.detail
    code, out = run_main(["doctor"], capsys)
    assert "reinstall torch" not in out and "warn  Triton" not in out


@pytest.mark.cpu_only
def test_triton_on_a_gpu_machine_with_cpu_torch_points_at_the_cuda_build(monkeypatch):
    if torch.version.cuda is not None:
        pytest.skip("this torch is a CUDA build")
    no_triton(monkeypatch)
    monkeypatch.setattr(monitor, "nvml_status", lambda: (True, "NVML ready: driver 550.54.15, 1 GPU(s)."))
    row = findings(cpu_ok=True)["Triton"]
    assert row.status == WARN and "CUDA build of torch" in row.fix


def test_nvml_fix_suggests_nvidia_ml_py_only_when_it_is_missing(monkeypatch):
    monkeypatch.setattr(monitor, "nvml_status", lambda: (False, "NVML's library (libnvidia-ml.so) was not found"))
    found = findings(cpu_ok=True)
    if found["nvidia-ml-py"].status == OK:
        assert "nvidia-ml-py" not in found["NVIDIA driver / NVML"].fix
    def no_module():
        raise ImportError("No module named 'pynvml'")
    monkeypatch.setattr(monitor, "import_pynvml", no_module)
    assert "pip install nvidia-ml-py" in findings(cpu_ok=True)["NVIDIA driver / NVML"].fix


@pytest.mark.cpu_only
def test_gpulab_device_cuda_without_a_gpu_is_not_told_to_set_cuda(monkeypatch):
    monkeypatch.setenv("GPULAB_DEVICE", "cuda")
    row = findings(cpu_ok=True)["GPULAB_DEVICE"]
    assert row.status == FAIL and "sees no CUDA GPU" in row.detail
    assert "cuda" not in row.fix.replace("CUDA GPU", "") and "cpu" in row.fix


# -- gpulab diagnose SCRIPT ------------------------------------------------------------------------
STEP_SCRIPT = '''
import torch
def make_step():
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    def step():
        loss = model(torch.randn(8, 16)).square().mean()
        loss.backward(); opt.step(); opt.zero_grad()
    return step
if __name__ == "__main__":
    raise SystemExit("the script's own main block must not run under gpulab diagnose")
'''


def test_diagnose_a_script_writes_report_timeline_trace_and_json(tmp_path, capsys, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text(STEP_SCRIPT)
    monkeypatch.chdir(tmp_path)
    assert main(["diagnose", str(script), "--warmup", "1", "--steps", "2", "--json", "d.json"]) == 0
    out = capsys.readouterr().out
    assert "gpulab.diagnose: train on cpu" in out and "needs a GPU" in out
    assert (tmp_path / "train-timeline.png").stat().st_size > 0
    assert json.loads((tmp_path / "train-trace.json").read_text())          # Perfetto / chrome://tracing reads it
    assert json.loads((tmp_path / "d.json").read_text())["label"] == "train"


@pytest.mark.parametrize("body, words", [
    ("x = 1\n", "defines no 'make_step' or 'step'"),
    ("step = 3\n", "'step' is not callable"),
    ("def make_step():\n    return 5\n", "returned int, not a callable step"),
])
def test_diagnose_refuses_a_script_without_a_step(tmp_path, capsys, body, words):
    script = tmp_path / "s.py"
    script.write_text(body)
    assert main(["diagnose", str(script)]) == 2
    assert words in capsys.readouterr().err


def test_diagnose_refuses_a_missing_script_and_bad_counts(tmp_path, capsys):
    assert main(["diagnose", str(tmp_path / "none.py")]) == 2
    assert "no script" in capsys.readouterr().err
    (tmp_path / "s.py").write_text(STEP_SCRIPT)
    assert main(["diagnose", str(tmp_path / "s.py"), "--steps", "0"]) == 2
    assert "--steps >= 1" in capsys.readouterr().err


def test_diagnose_says_in_one_line_when_the_step_raises(tmp_path, capsys, monkeypatch):
    (tmp_path / "s.py").write_text("def step():\n    raise ValueError('my bug')\n")
    monkeypatch.chdir(tmp_path)
    assert main(["diagnose", "s.py"]) == 1
    err = capsys.readouterr().err
    assert "my bug" in err and "Traceback" not in err


# -- bad input, as a new user gives it: one line on stderr naming their file and line, no traceback (issue 7) --
def one_line(capsys, code, expected_code):
    """stderr, checked: the exit status, one line starting `gpulab diagnose: `, no traceback."""
    err = capsys.readouterr().err
    assert code == expected_code, err
    assert err.startswith("gpulab diagnose: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err.rstrip("\n")


@pytest.mark.parametrize("body, line", [
    ("import torch\n\ndef make_step(:\n    pass\n", "train.py:3: SyntaxError: "),
    ("def make_step():\n    x = 1\n      return x\n", "train.py:3: IndentationError: unexpected indent"),
    ('"""my step"""\nimport os\nimport gpulab_no_such_module\n',
     "train.py:3: ModuleNotFoundError: No module named 'gpulab_no_such_module'"),
    ("import torch\nWIDTH = 1 / 0\n", "train.py:2: ZeroDivisionError: division by zero"),
    ("def make_step():\n    width = -1\n    raise ValueError('bad width')\n",
     "train.py:3 in make_step: ValueError: bad width"),
    ("def check(w):\n    if w < 0:\n        raise ValueError('bad\\nwidth')\n\ndef make_step():\n    check(-1)\n",
     "train.py:3 in check: ValueError: bad width"),          # the innermost frame in the script; one line
    ("import sys\nsys.exit(3)\n", "train.py:2: the script called sys.exit(3) while loading"),
])
def test_diagnose_names_the_file_and_line_of_a_script_that_cannot_load(tmp_path, capsys, monkeypatch, body, line):
    (tmp_path / "train.py").write_text(body)
    monkeypatch.chdir(tmp_path)
    err = one_line(capsys, main(["diagnose", "train.py"]), 2)
    assert err.startswith(f"gpulab diagnose: {line}"), err
    assert not list(tmp_path.glob("train-*"))             # no step ran: no trace, no timeline


def test_diagnose_names_the_script_as_given_from_another_folder(tmp_path, capsys, monkeypatch):
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text("x = 1\ny = undefined_name\n")
    monkeypatch.chdir(tmp_path)
    err = one_line(capsys, main(["diagnose", "proj/train.py"]), 2)
    assert err == "gpulab diagnose: proj/train.py:2: NameError: name 'undefined_name' is not defined"


def test_diagnose_of_a_folder_says_it_is_no_script(tmp_path, capsys, monkeypatch):
    (tmp_path / "zoo").mkdir()
    (tmp_path / "zoo" / "__main__.py").write_text("raise SystemExit('a folder must not run')\n")
    monkeypatch.chdir(tmp_path)
    err = one_line(capsys, main(["diagnose", "zoo/"]), 2)
    assert err == ("gpulab diagnose: zoo/ is a folder, not a script: give a Python file that defines make_step()")
    assert one_line(capsys, main(["diagnose", "missing.py"]), 2) == "gpulab diagnose: no script missing.py"


def test_diagnose_of_a_notebook_says_how_to_make_a_script(tmp_path, capsys, monkeypatch):
    (tmp_path / "mine.ipynb").write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}')
    monkeypatch.chdir(tmp_path)
    err = one_line(capsys, main(["diagnose", "mine.ipynb"]), 2)
    assert "mine.ipynb is a notebook, not a script" in err and "nbconvert --to script mine.ipynb" in err


@pytest.mark.parametrize("name, value, words", [
    ("GPULAB_DEVICE", "nonsense", "GPULAB_DEVICE='nonsense' is not understood; allowed values are auto, cuda, cpu"),
    ("GPULAB_DEVICE", "cuda", "GPULAB_DEVICE=cuda but PyTorch sees no CUDA GPU"),
    ("GPULAB_SCALE", "huge", "GPULAB_SCALE='huge' is not understood; allowed values are tiny, full, auto"),
    ("GPULAB_PROFILE", "nonsense", "GPULAB_PROFILE='nonsense' is not understood; allowed values are v100, t4"),
])
def test_diagnose_refuses_a_bad_setting_before_running_the_script(tmp_path, capsys, monkeypatch, name, value, words):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)      # GPULAB_DEVICE=cuda on a machine without one
    monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)                             # were it to run anyway, its files stay in tmp_path
    script = tmp_path / "train.py"
    script.write_text("open(__file__ + '.ran', 'w').close()\n" + STEP_SCRIPT)
    err = one_line(capsys, main(["diagnose", str(script)]), 2)
    assert words in err
    assert not (tmp_path / "train.py.ran").exists()         # the setting is said first: the script never ran


RAISING_STEP = "import torch\ndef step():\n    x = torch.ones(2)\n    raise ValueError('my\\nbug')\n"


def test_diagnose_says_where_the_step_raised_in_one_line(tmp_path, capsys, monkeypatch):
    (tmp_path / "s.py").write_text(RAISING_STEP)
    monkeypatch.chdir(tmp_path)
    err = one_line(capsys, main(["diagnose", "s.py"]), 1)
    assert err.startswith("gpulab diagnose: s.py:4 in step: step() raised ValueError during the "), err
    assert "my bug" in err


def test_diagnose_names_the_step_line_inside_make_step(tmp_path, capsys, monkeypatch):
    (tmp_path / "t.py").write_text("def make_step():\n    def step():\n        return {}['batch']\n    return step\n")
    monkeypatch.chdir(tmp_path)
    err = one_line(capsys, main(["diagnose", "t.py", "--warmup", "0"]), 1)
    assert err.startswith("gpulab diagnose: t.py:3 in step: step() raised KeyError during the "), err
    assert "'batch'" in err


def test_diagnose_writes_trace_and_timeline_beside_the_script(tmp_path, capsys, monkeypatch):
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text(STEP_SCRIPT)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(["diagnose", "../proj/train.py", "--warmup", "0", "--steps", "1"]) == 0
    out = capsys.readouterr().out
    assert json.loads((tmp_path / "proj" / "train-trace.json").read_text())
    assert (tmp_path / "proj" / "train-timeline.png").stat().st_size > 0
    assert "timeline: ../proj/train-timeline.png" in out
    assert list((tmp_path / "elsewhere").iterdir()) == []    # nothing in the current folder


def test_diagnose_help_says_where_the_trace_and_timeline_go(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")                       # argparse wraps at hyphens otherwise
    with pytest.raises(SystemExit):
        main(["diagnose", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "default: beside SCRIPT, named STEM-trace.json" in out
    assert "default: beside SCRIPT, named STEM-timeline.png" in out and " here)" not in out


def test_bench_with_a_bad_gpulab_profile_exits_2_in_one_line_before_running(monkeypatch, capsys):
    from gpulab.tools import bench as B
    monkeypatch.setenv("GPULAB_PROFILE", "nonsense")
    monkeypatch.setattr(B, "run", lambda *a, **kw: pytest.fail("bench ran under a bad GPULAB_PROFILE"))
    assert main(["bench", "--no-progress", "--lessons", "01"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpulab bench: GPULAB_PROFILE='nonsense' is not understood; allowed values are v100, t4")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_gpulab_profile_unset_is_this_gpu_as_it_is(monkeypatch):
    monkeypatch.delenv("GPULAB_PROFILE", raising=False)
    row = findings()["GPULAB_PROFILE"]
    assert (row.status, row.detail) == (OK, "unset: this GPU as it is")


def test_gpulab_profile_says_what_it_emulates(monkeypatch):
    monkeypatch.setenv("GPULAB_PROFILE", "T4")
    row = findings()["GPULAB_PROFILE"]
    assert row.status == OK
    assert row.detail.startswith("emulating t4, Tesla T4 (compute capability 7.5, 15 GiB)"), row.detail


def test_bad_gpulab_profile_is_a_failure_with_the_allowed_values(monkeypatch, capsys):
    from gpulab.core.profiles import PROFILES
    monkeypatch.setenv("GPULAB_PROFILE", "nonsense")
    row = findings(cpu_ok=True)["GPULAB_PROFILE"]
    assert row.status == FAIL and "GPULAB_PROFILE='nonsense' is not understood" in row.detail
    assert row.fix == f"unset GPULAB_PROFILE (this GPU as it is), or set one of {', '.join(PROFILES)}"
    code, out = run_main(["doctor", "--cpu-ok"], capsys)
    assert code == 1 and "FAIL  GPULAB_PROFILE" in out


def test_readme_settings_table_lists_every_profile():
    from pathlib import Path
    from gpulab.core.profiles import PROFILES
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    (row,) = [line for line in readme.splitlines() if line.startswith("| `GPULAB_PROFILE` |")]
    assert all(f"`{key}`" in row for key in PROFILES), row
    assert "timings stay this GPU's" in row
    diagnose = (Path(__file__).resolve().parents[2] / "docs" / "diagnose.md").read_text(encoding="utf-8")
    assert "beside the script" in diagnose and "train-timeline.png" in diagnose
