"""Run several fresh Python processes at once, for experiments that need a new process each
(an allocator setting read at start-up, a CUDA context a failed capture may break) and time
nothing across processes: their start-up costs overlap instead of adding up.

    done = at_once({"a": [sys.executable, "-c", "print(1)"], "b": ([sys.executable, "-c", "print(2)"], env)})
    done["a"].returncode, done["a"].stdout

Each value is a command, or (command, environment). Every process is ended if one overruns
`timeout_s` (subprocess.TimeoutExpired is raised) or anything else goes wrong.
"""
from __future__ import annotations

import subprocess
import time
from typing import Hashable, Mapping, Sequence, Union


Command = Union[Sequence[str], tuple[Sequence[str], Mapping[str, str]]]


def at_once(commands: Mapping[Hashable, Command], timeout_s: float = 120.0) -> dict[Hashable, subprocess.CompletedProcess]:
    """Start every command, wait for all (at most `timeout_s` in all); their CompletedProcess by key."""
    procs: dict[Hashable, subprocess.Popen] = {}
    try:
        for key, cmd in commands.items():
            env = None
            if isinstance(cmd, tuple) and len(cmd) == 2 and isinstance(cmd[1], Mapping):
                cmd, env = cmd
            procs[key] = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                          env=None if env is None else dict(env))
        end = time.monotonic() + timeout_s
        done = {}
        for key, proc in procs.items():
            out, err = proc.communicate(timeout=max(end - time.monotonic(), 0.1))
            done[key] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        return done
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
