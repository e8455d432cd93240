"""Start a Python module in N processes with torchrun, wait for it with a time limit, and read back rank 0's JSON.

    result = torchrun("gpulab.lessons.multigpu.cli", ["allreduce", "--out", OUT], nproc=2, backend="nccl",
                      timeout_s=120, what="allreduce (2 x nccl)")

runs `python -m torch.distributed.run --standalone --nproc-per-node N -m MODULE ARGS` in a child process of its
own session, with `launch_env`: NVLink multicast off (NCCL_NVLS_ENABLE=0), few OpenMP threads, gpulab importable
and, for NCCL, NCCL's INIT log (so the transport it chose can be read back: `nccl_report`). Every argument equal
to `OUT` becomes the path of a file in a fresh temporary folder, which rank 0 is to write its JSON result to.

The caller's process never joins a process group. A failure, a timeout or a missing result raises `LaunchError`
with the failing rank's message (a worker that calls `write_rank_error` leaves it beside OUT) and the last lines
the processes printed; on a timeout or an interrupt the processes are stopped (SIGTERM to torchrun, which stops
its workers, then SIGKILL to the whole session). A worker that calls `die_with_parent` ends if the launcher dies.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from gpulab.core.device import cpu_cores

BACKENDS = ("gloo", "nccl")

# NVLink SHARP (multicast through the NVSwitch) stays off in everything started here.
FIXED_ENV = {"NCCL_NVLS_ENABLE": "0"}

# an argument the launcher replaces with the path of the result file rank 0 writes
OUT = "{out}"


class LaunchError(RuntimeError):
    """A launched run failed, timed out or printed no result."""


def package_root() -> str:
    """The folder that holds the gpulab package: the launch's PYTHONPATH starts with it, and it is the working
    directory. (gpulab/ itself there would make its folders importable as top-level `core`, `models`, `notebook`
    and `tools`, shadowing any installed package of that name.)"""
    return str(Path(__file__).resolve().parents[2])


def launch_env(backend: str, nproc: int) -> dict[str, str]:
    """The environment of a launch: NVLS off, few OpenMP threads, gpulab importable."""
    env = dict(os.environ)
    env.update(FIXED_ENV)
    cores = cpu_cores()
    env["OMP_NUM_THREADS"] = "1" if backend == "gloo" else str(max(1, min(8, cores // max(1, nproc))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root(), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    if backend == "gloo":
        env["CUDA_VISIBLE_DEVICES"] = ""            # gloo parts stay off the GPUs
    else:
        env.setdefault("NCCL_DEBUG", "INFO")        # so the transport NCCL chose can be read back
        env.setdefault("NCCL_DEBUG_SUBSYS", "INIT")
    return env


def nccl_report(text: str) -> dict[str, Any]:
    """NCCL's version and the transports its channels use, from NCCL_DEBUG=INFO output."""
    version = re.search(r"NCCL version (\S+)", text)
    transports = sorted({m.group(1) for m in re.finditer(r"Channel \S+ : .* via (\S+)", text)})
    return {"version": version.group(1) if version else None, "transports": transports}


def write_rank_error(out: str, rank: int, err: BaseException) -> None:
    """In a worker: leave this rank's error beside the result file, for the launcher's message. The time comes
    first: the earliest error is the cause, later ones are other ranks losing their peer."""
    Path(f"{out}.rank{rank}.err").write_text(f"{time.time():.6f}\nrank {rank}: {type(err).__name__}: {err}\n")


def die_with_parent() -> None:
    """In a worker, on Linux: end this process if its launcher dies (so a killed launch leaves nothing behind)."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG


def tail(path: Path, lines: int = 12) -> str:
    """The last non-empty lines of a log, NCCL's INFO lines left out."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    keep = [ln for ln in text.splitlines() if ln.strip() and " NCCL INFO " not in ln]
    return "\n".join(keep[-lines:])


def stop(proc: subprocess.Popen) -> None:
    """Stop the launcher: SIGTERM first (torchrun then stops its workers), SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)     # its own session: start_new_session below
        proc.wait(timeout=15)


def first_error(folder: Path) -> str:
    """The message of the rank that failed first (each .err file starts with the time it was written)."""
    found = []
    for path in folder.glob("result.json.rank*.err"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            when, message = path.read_text().split("\n", 1)
            found.append((float(when), message.strip().splitlines()[0]))
    return min(found)[1] if found else ""


def torchrun(module: str, args: Sequence[str], nproc: int, backend: str, timeout_s: float = 120,
             what: str | None = None) -> dict:
    """Run `module` in `nproc` processes (torchrun) and return the JSON rank 0 wrote to `OUT`.

    Adds `launch_s` (the whole launch, process start-up included) and, for NCCL, `nccl` (version and
    transports from NCCL's log). `what` names the run in messages. Raises LaunchError on failure or timeout.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)} (got {backend!r}).")
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1 (got {nproc}).")
    what = what or f"{module} ({nproc} x {backend})"
    with tempfile.TemporaryDirectory(prefix="gpulab-dist-") as tmp:
        tmp_path = Path(tmp)
        out = tmp_path / "result.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               "-m", module] + [str(out) if a == OUT else a for a in args]
        stdout_path, stderr_path = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
        with open(stdout_path, "w") as so, open(stderr_path, "w") as se:
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, stdout=so, stderr=se, env=launch_env(backend, nproc),
                                    cwd=package_root(), start_new_session=True)
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                stop(proc)
                raise LaunchError(f"{what} did not finish within {timeout_s:g} s "
                                  f"and was stopped. Last lines:\n{tail(stderr_path) or tail(stdout_path)}") \
                    from None
            except BaseException:          # e.g. the learner interrupts the kernel: stop the children too
                stop(proc)
                raise
            launch_s = time.perf_counter() - t0
        if rc != 0:
            first = first_error(tmp_path)
            raise LaunchError(f"{what} failed (exit code {rc})"
                              + (f": {first}" if first else "") + f"\nLast lines:\n{tail(stderr_path)}")
        if not out.exists():
            raise LaunchError(f"{what} wrote no result.\n{tail(stderr_path)}")
        result = json.loads(out.read_text())
        result["launch_s"] = launch_s
        if backend == "nccl":
            result["nccl"] = nccl_report(stdout_path.read_text(errors="replace")
                                         + stderr_path.read_text(errors="replace"))
        return result
