"""gpulab.core.launcher: the environment of a launch and NCCL's log read back. Real launches (success, a failing
rank, a timeout) run in tests/lessons/test_l14_multi_gpu.py, through lesson 14's `launch`."""
import os
from pathlib import Path

from gpulab.core import launcher as L


def test_nccl_report_parses_the_log():
    log = ("h:1:1 [0] NCCL INFO NCCL version 2.27.3+cuda13.0\n"
           "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n"
           "h:1:2 [1] NCCL INFO Channel 01/0 : 1[1] -> 0[0] via P2P/CUMEM/read\n")
    assert L.nccl_report(log) == {"version": "2.27.3+cuda13.0", "transports": ["P2P/CUMEM/read"]}
    assert L.nccl_report("") == {"version": None, "transports": []}


def test_launch_env_keeps_nvls_off(monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    for backend in L.BACKENDS:
        env = L.launch_env(backend, 2)
        assert env["NCCL_NVLS_ENABLE"] == "0"
    assert L.launch_env("gloo", 2)["OMP_NUM_THREADS"] == "1"


def test_the_first_rank_to_fail_is_named(tmp_path, monkeypatch):
    """Each failing rank leaves its error beside the result file; the earliest is the cause, the later ones are
    other ranks losing their peer."""
    out = str(tmp_path / "result.json")
    for rank, when, err in ((1, 20.0, RuntimeError("peer closed")), (0, 10.0, ValueError("bad input"))):
        monkeypatch.setattr(L.time, "time", lambda when=when: when)
        L.write_rank_error(out, rank, err)
    assert L.first_error(tmp_path) == "rank 0: ValueError: bad input"
    assert L.first_error(tmp_path / "nothing") == ""


def test_the_launch_imports_gpulab_as_a_package():
    """PYTHONPATH starts with the folder holding gpulab, not gpulab/ itself (which made its folders `core`, `models`,
    `notebook` and `tools` importable as top-level packages in every worker)."""
    first = Path(L.launch_env("gloo", 2)["PYTHONPATH"].split(os.pathsep)[0])
    assert (first / "gpulab" / "__init__.py").exists() and not (first / "core").is_dir()
