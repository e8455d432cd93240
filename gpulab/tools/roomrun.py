"""A room on one GPU: N learners running notebooks at once, each in its own process (and, under a MIG-slice
profile, on its own slice's worth of SMs), against one learner alone; what each notebook took per learner,
whether every notebook passed, every check's outcome, and the spread of each headline across learners.

    python -m gpulab.tools.roomrun --learners 7 --profile h200-1g --notebooks 00,01,02 --out room-run/

runs one learner alone first (the reference), then all of them at once. Each learner is a pytest run of
the notebooks under nbval, one pytest per notebook, timed (as `bash setup.sh test notebooks/` runs them),
with its own results store and check log (GPULAB_CHECKS) in --out; `summarize(out)` (also printed, and
written to --out/summary.json and summary.md) reads them back. On the CPU it runs at tiny size.

Without MIG, kernels of different processes take turns on the GPU (time-slicing): seven learners each ran at
about a seventh of one alone (docs/instructors.md, "A room of seven"). `--mps` runs the room under CUDA MPS instead (NVIDIA's
Multi-Process Service: one server runs every learner's kernels side by side), each learner limited to its
slice's share of the SMs by CUDA_MPS_ACTIVE_THREAD_PERCENTAGE in place of the profile's green context (under
MPS, the percentage and a green context's SMs are two ways to one limit, used one at a time: NVIDIA's answer on
its developer forum, "How to use CUDA Green Context with MPS"). That is closer to MIG slices, which run side by side; the
memory bandwidth, L2 and power stay shared. roomrun starts the MPS control daemon (`nvidia-cuda-mps-control
-d`, its pipe and log folders under --out/mps) and stops it at the end; where it cannot, it says why and the
room runs time-sliced.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import math
import shutil
import time
from collections import Counter
from pathlib import Path

from gpulab.core.results import FILE_KINDS

ROOT = Path(__file__).resolve().parents[2]


def _notebooks(spec: str) -> list[Path]:
    chosen = []
    for key in [k.strip() for k in spec.split(",") if k.strip()]:
        found = sorted((ROOT / "notebooks").glob(f"{key}*.ipynb"))
        if len(found) != 1:
            raise ValueError(f"--notebooks {key}: expected one notebook to match, found {len(found)}")
        chosen.append(found[0])
    return chosen


# roomrun's own files (what ran, not measurements): `gpulab room` reads a room folder's stores and skips these
KIND = FILE_KINDS["roomrun"]
TIMINGS_KIND, CODES_KIND, SUMMARY_KIND = f"{KIND} timings", f"{KIND} exit codes", f"{KIND} summary"


def learner_env(out: Path, name: str, profile: str, scale: str | None, mps: dict | None = None,
                learners: int = 1) -> dict:
    env = {**os.environ, "GPULAB_RESULTS": str(out / "room" / f"{name}.json"),
           "GPULAB_CHECKS": str(out / "checks" / f"{name}.jsonl"), "GPULAB_LEARNER": name,
           # every cell's seconds (the root conftest.py): where a learner's time went, not only the notebook's
           "GPULAB_TIMINGS": str(out / "timings" / f"{name}-cells.tsv"), "MPLBACKEND": "Agg"}
    if profile:
        env["GPULAB_PROFILE"] = profile
    if scale:
        env["GPULAB_SCALE"] = scale
    if mps and mps.get("running"):
        # the learner is an MPS client: the server's pipe, and its slice's share of the SMs
        env.update(CUDA_MPS_PIPE_DIRECTORY=mps["pipe"], CUDA_MPS_LOG_DIRECTORY=mps["log"])
        if mps.get("percentage"):
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(mps["percentage"])
        if name != "alone":
            # the room says the GPU is shared rather than leave it to gpulab's NVML check, which leaves the MPS
            # server out (monitor.is_mps_server; on the H200 NVML listed it as a compute process of 0.1 GiB)
            # and was not seen listing the other learners: they were declared shared here before it looked
            env["GPULAB_SHARED_GPU"] = f"MPS, {learners} learners side by side"
    return env


def mps_percentage(slice_sms: int | None, gpu_sms: int | None) -> int | None:
    """CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for a slice of `slice_sms` of the GPU's `gpu_sms` SMs, rounded down (16 of
    132: 12 %, 15.8 SMs; MPS provisions whole SMs, so the count a client gets is read back by `probe_mps`).
    None without both counts (no SM limit)."""
    if not slice_sms or not gpu_sms or slice_sms >= gpu_sms:
        return None
    return max(1, math.floor(100 * slice_sms / gpu_sms))


def probe_mps(env: dict) -> tuple[int | None, str]:
    """A first MPS client (a child process with the room's MPS settings): the SM count CUDA gives it, or None
    and why. The daemon's `-d` only forks it; the server starts with its first client, and a client that
    cannot reach it runs without MPS, so this is where a broken MPS shows."""
    code = ("import torch; torch.zeros(1, device='cuda'); "
            "print(torch.cuda.get_device_properties(0).multi_processor_count)")
    try:
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, f"the probe client did not finish ({type(err).__name__})"
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        return None, f"the probe client failed ({said[-1] if said else 'exit ' + str(done.returncode)})"
    try:
        return int(done.stdout.strip().splitlines()[-1]), ""
    except (ValueError, IndexError):
        return None, f"the probe client printed {done.stdout.strip()[:80]!r}"


def _gpu_sms() -> int | None:
    """The GPU's SM count, read by the same child process as `probe_mps` but outside MPS, so this process holds
    no CUDA context when MPS starts. None without a CUDA GPU."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
    return probe_mps(env)[0]


def start_mps(out: Path, profile: str, gpu_sms: int | None = None, control: str = "nvidia-cuda-mps-control") -> dict:
    """Start the MPS control daemon for the room: {"running": True, "pipe", "log", "percentage", "why"}, or
    {"running": False, "why": the reason} (no daemon binary, no GPU, the daemon refused to start)."""
    binary = shutil.which(control)
    if binary is None:
        return {"running": False, "why": f"{control} not found: the room runs time-sliced"}
    gpu_sms = gpu_sms if gpu_sms is not None else _gpu_sms()
    if gpu_sms is None:
        return {"running": False, "why": "no CUDA GPU: the room runs without MPS"}
    from gpulab.core.profiles import PROFILES
    prof = PROFILES.get(profile) if profile else None
    pct = mps_percentage(getattr(prof, "sm_count", None), gpu_sms)
    pipe, log = out / "mps" / "pipe", out / "mps" / "log"
    pipe.mkdir(parents=True, exist_ok=True)
    log.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(pipe), "CUDA_MPS_LOG_DIRECTORY": str(log)}
    try:
        done = subprocess.run([binary, "-d"], env=env, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"running": False, "why": f"{control} -d did not start ({type(err).__name__}: {err}): the room runs time-sliced"}
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        return {"running": False, "why": f"{control} -d exited {done.returncode}"
                + (f" ({said[-1]})" if said else "") + ": the room runs time-sliced"}
    mps = {"running": True, "pipe": str(pipe), "log": str(log), "percentage": pct, "gpu_sms": gpu_sms, "control": binary}
    client_env = {**env, **({"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(pct)} if pct else {})}
    client_sms, problem = probe_mps(client_env)
    if client_sms is None:
        stop_mps(mps)
        return {"running": False, "why": f"MPS did not serve a client ({problem}): the room runs time-sliced"}
    tried = ""
    if pct:
        pct, client_sms, tried = _closest_share(client_env, prof.sm_count, pct, client_sms)
        mps["percentage"] = pct
    share = (f"each learner at most {pct} % of the GPU's {gpu_sms} SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, for the "
             f"{profile} profile's {prof.sm_count}); a probe client was given {client_sms}{tried}" if pct
             else f"no SM limit per learner; a probe client was given {client_sms} SMs")
    return {**mps, "client_sms": client_sms, "why": f"MPS: the learners' kernels run side by side; {share}"}


def _closest_share(env: dict, slice_sms: int, pct: int, got: int, tries: int = 4) -> tuple[int, int, str]:
    """MPS gives fewer SMs than a percentage's exact share (on the H200, 12 % of 132 SMs gave 14, not 15.8:
    results/room/2026-12-03-h200-mps-06): from the share rounded down, probe one percent more at a time (at
    most `tries`) while the client gets fewer SMs than the slice; keep the percentage whose count comes
    closest to the slice's, the smaller on a tie. Returns (percentage, its SM count, what was tried)."""
    seen = {pct: got}
    while got < slice_sms and len(seen) <= tries and pct < 100:
        pct += 1
        got, _ = probe_mps({**env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(pct)})
        if got is None:
            break
        seen[pct] = got
    best = min(seen, key=lambda p: (abs(seen[p] - slice_sms), seen[p] > slice_sms, p))
    tried = "" if len(seen) == 1 else " (" + ", ".join(f"{p} %: {n}" for p, n in seen.items()) + " SMs)"
    return best, seen[best], tried


def stop_mps(mps: dict | None) -> None:
    """Ask the room's MPS control daemon to quit (it stops its server once no client is left)."""
    if not mps or not mps.get("running"):
        return
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": mps["pipe"], "CUDA_MPS_LOG_DIRECTORY": mps["log"]}
    try:
        subprocess.run([mps["control"]], input="quit\n", env=env, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        pass


def start(out: Path, name: str, notebooks: list[Path], profile: str, scale: str | None,
          mps: dict | None = None, learners: int = 1) -> subprocess.Popen:
    """The learner: a process that runs the notebooks one after the other (`child`)."""
    for sub in ("room", "timings", "checks", "logs"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    log = (out / "logs" / f"{name}.txt").open("w")
    return subprocess.Popen([sys.executable, "-m", "gpulab.tools.roomrun", "--child", name, "--out", str(out),
                             *map(str, notebooks)],
                            cwd=ROOT, env=learner_env(out, name, profile, scale, mps, learners), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)


def _wait(p: subprocess.Popen, timeout_s: float) -> int | str:
    """The learner's exit code, or "timeout" after `timeout_s`: then its whole process group is killed (its
    pytest and the notebook's kernel too, which would otherwise keep the GPU busy for the next learners)."""
    try:
        return p.wait(timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
        _stop(p)
        return "timeout"


def _stop(p: subprocess.Popen) -> None:
    """Kill the learner's whole process group and reap the learner."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


def child(out: Path, name: str, notebooks: list[str]) -> int:
    """One learner's notebooks, each under nbval in its own pytest, timed on the host clock; writes
    out/timings/<name>.json ({notebook: {"seconds", "rc"}}) after each. Exit 1 if any failed."""
    times: dict = {}
    for nb in notebooks:
        t0 = time.perf_counter()
        rc = subprocess.call([sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env",
                              "-p", "no:cacheprovider", "-q", nb], cwd=ROOT)
        times[Path(nb).stem] = {"seconds": round(time.perf_counter() - t0, 1), "rc": rc}
        (out / "timings" / f"{name}.json").write_text(json.dumps({"kind": TIMINGS_KIND, "notebooks": times}, indent=1))
    return int(any(t["rc"] for t in times.values()))


def run(out: Path, learners: int, notebooks: list[Path], profile: str = "", scale: str | None = None,
        timeout_s: float = 3600, alone: bool = True, mps: bool = False) -> dict:
    """The learner alone (if `alone`), then `learners` at once; {name: pytest's exit code}. With `mps`, under
    an MPS server (`start_mps`), the learner alone too, so the two columns compare like with like."""
    codes, procs = {}, {}
    out.mkdir(parents=True, exist_ok=True)
    server = start_mps(out, profile) if mps else None
    if server is not None:
        print(f"roomrun: {server['why']}", flush=True)
    try:       # each learner runs in a session of its own: an interrupt here must stop them (and their kernels) too
        if alone:
            procs["alone"] = start(out, "alone", notebooks, profile, scale, server, learners)
            codes["alone"] = _wait(procs["alone"], timeout_s)
        procs.update({f"learner{i}": start(out, f"learner{i}", notebooks, profile, scale, server, learners)
                      for i in range(1, learners + 1)})
        end = time.monotonic() + timeout_s
        for name, p in procs.items():
            if name != "alone":
                codes[name] = _wait(p, end - time.monotonic())
    finally:       # also when roomrun itself is stopped (SIGTERM, an interrupt): the summary can still be made
        for name, p in procs.items():
            if p.poll() is None:
                _stop(p)
                codes.setdefault(name, "stopped")       # roomrun was stopped while this learner ran
        stop_mps(server)
        ran = {"kind": CODES_KIND, "codes": codes, "notebooks": [nb.stem for nb in notebooks]}
        if server is not None:
            ran["mps"] = {k: server.get(k) for k in ("running", "percentage", "gpu_sms", "client_sms", "why")}
        (out / "exit_codes.json").write_text(json.dumps(ran, indent=1))
    return codes


def _timings(path: Path) -> dict:
    """{notebook: seconds} from a learner's timings file; {notebook: "failed"} where its pytest failed."""
    if not path.exists():
        return {}
    try:
        rows = json.loads(path.read_text()).get("notebooks", {})
    except (json.JSONDecodeError, AttributeError):
        return {}
    return {nb: ("failed" if row["rc"] else float(row["seconds"])) for nb, row in rows.items()}


def _checks(path: Path) -> list[dict]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _headlines(path: Path) -> dict:
    """{(lesson, metric): value} of each bench headline the learner's notebooks recorded (profile records
    included: every learner ran under the same one)."""
    from gpulab.core.results import read_records
    from gpulab.tools.room import read_store
    if not path.exists():
        return {}
    return {(m.lesson, m.metric): m.value for m in read_store(read_records(path), str(path), profiles=True)}


def summarize(out: Path) -> dict:
    ran = json.loads((out / "exit_codes.json").read_text()) if (out / "exit_codes.json").exists() else {}
    codes = ran.get("codes", {})
    # a learner stopped before its first notebook ended wrote no store: it is still one of the room
    names = sorted({p.stem for p in (out / "room").glob("*.json")} | set(codes)) if (out / "room").exists() else sorted(codes)
    learners = [n for n in names if n != "alone"]
    times = {n: _timings(out / "timings" / f"{n}.json") for n in names}
    checks = {n: _checks(out / "checks" / f"{n}.jsonl") for n in names}
    heads = {n: _headlines(out / "room" / f"{n}.json") for n in names}
    notebooks = sorted({nb for t in times.values() for nb in t} | set(ran.get("notebooks", [])))
    per_notebook = {}
    for nb in notebooks:
        secs = [times[n][nb] for n in learners if isinstance(times[n].get(nb), float)]
        per_notebook[nb] = {"alone_s": times.get("alone", {}).get(nb), "learners_s": {n: times[n].get(nb) for n in learners},
                            "median_s": statistics.median(secs) if secs else None,
                            "min_s": min(secs, default=None), "max_s": max(secs, default=None),
                            "failed": [n for n in learners if times[n].get(nb) == "failed"],
                            # no time: the learner's run was stopped (exit code "timeout") before it got there
                            "unfinished": [f"{n} ({codes[n]})" if codes.get(n) in ("timeout", "stopped") else n
                                           for n in learners if nb not in times[n]]}
    spread = {}
    for key in sorted({k for h in heads.values() for k in h}):
        values = [heads[n][key] for n in learners if key in heads[n]]
        spread[f"{key[0]} {key[1]}"] = {
            "alone": heads.get("alone", {}).get(key), "n": len(values),
            "median": statistics.median(values) if values else None,
            "min": min(values, default=None), "max": max(values, default=None),
            "spread_pct": (100 * (max(values) - min(values)) / statistics.median(values)
                           if len(values) > 1 and statistics.median(values) else None)}
    outcome = {n: dict(sorted(Counter(c["status"] for c in checks[n]).items())) for n in names}
    not_passed = [{"learner": n, **{k: c.get(k) for k in ("lesson", "name", "status", "measured", "why")}}
                  for n in names for c in checks[n] if c["status"] not in ("pass",)]
    summary = {"kind": SUMMARY_KIND, "sharing": ran.get("mps", {}).get("why") or "time-sliced (no MPS)",
               "exit_codes": codes, "notebooks": per_notebook, "headline_spread": spread, "checks": outcome,
               "checks_not_passed": not_passed}
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    (out / "summary.md").write_text(markdown(summary))
    return summary


def markdown(s: dict) -> str:
    lines = ["| notebook | alone (s) | learners: median [min, max] (s) | failed | not finished |", "|---|---|---|---|---|"]
    for nb, row in s["notebooks"].items():
        spread = ("-" if row["median_s"] is None
                  else f"{row['median_s']} [{row.get('min_s', '-')}, {row.get('max_s', '-')}] (n={sum(isinstance(v, float) for v in row['learners_s'].values())})")
        lines.append(f"| {nb} | {row['alone_s'] if row['alone_s'] is not None else '-'} | {spread} | "
                     f"{', '.join(row['failed']) or '-'} | {', '.join(row.get('unfinished', [])) or '-'} |")
    lines += ["", "| headline | alone | learners: median [min, max] | spread |", "|---|---|---|---|"]
    for key, h in s["headline_spread"].items():
        fmt = (lambda v: f"{v:.3g}" if isinstance(v, float) else "-")
        lines.append(f"| {key} | {fmt(h['alone'])} | {fmt(h['median'])} [{fmt(h['min'])}, {fmt(h['max'])}] (n={h['n']}) | "
                     f"{fmt(h['spread_pct']) + ' %' if h['spread_pct'] is not None else '-'} |")
    lines += ["", "checks per learner: " + "; ".join(f"{n}: {c}" for n, c in s["checks"].items())]
    lines += ["", f"how the learners shared the GPU: {s.get('sharing', 'time-sliced (no MPS)')}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gpulab.tools.roomrun", description=__doc__.split("\n\n")[0])
    p.add_argument("--learners", type=int, default=7)
    p.add_argument("--profile", default="", help="GPULAB_PROFILE for every learner (e.g. h200-1g)")
    p.add_argument("--notebooks", default="00,01,02,03,04,05,06,07,08")
    p.add_argument("--scale", default=None, help="GPULAB_SCALE (default: the course's, full on a GPU)")
    p.add_argument("--out", required=True)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--no-alone", action="store_true", help="skip the learner-alone reference run")
    p.add_argument("--mps", action="store_true", help="run the room under CUDA MPS (learners side by side, each "
                   "limited to its slice's share of the SMs), where the MPS control daemon can start")
    p.add_argument("--summarize-only", action="store_true")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)     # one learner's process (`start`)
    p.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    out = Path(a.out)
    if a.child:
        return child(out, a.child, a.paths)
    if a.learners < 1:
        print("roomrun: --learners must be at least 1", file=sys.stderr)
        return 2
    try:
        notebooks = _notebooks(a.notebooks)
    except ValueError as err:
        print(f"roomrun: {err}", file=sys.stderr)
        return 2
    if not a.summarize_only:
        # stopped by `timeout` or a job scheduler (SIGTERM): unwind, so `run` stops every learner and the MPS daemon
        previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
        try:
            run(out, a.learners, notebooks, a.profile, a.scale, a.timeout, alone=not a.no_alone, mps=a.mps)
        finally:
            signal.signal(signal.SIGTERM, previous)
    print(markdown(summarize(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
