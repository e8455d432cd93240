"""gpulab.tools.roomrun: learners at once against one alone, per-notebook times, checks, headline spread."""
import dataclasses
import json
import shutil

import nbformat

from gpulab.tools import room as R
from gpulab.tools import roomrun as RR


def _notebook(path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import os\n"
        "from gpulab.notebook import lesson\n"
        "from gpulab.core.results import results_store\n"
        "lesson.start('01')\n"
        "results_store().record('01', 'probe', 1.0, 'x')\n"
        "lesson.expect('probe ratio', 1.0, 0.5, 2.0)\n"
        "lesson.expect('impossible', 1.0, 5.0, 6.0)\n")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))
    return path


def test_a_room_of_two_is_run_and_summarized(tmp_path):
    nb = _notebook(tmp_path / "01_probe.ipynb")
    shutil.copy(RR.ROOT / "conftest.py", tmp_path)     # as the course's notebooks sit under it (cell timings)
    codes = RR.run(tmp_path / "out", 2, [nb], scale="tiny", timeout_s=300, alone=False)   # (alone: one more)
    assert codes == {"learner1": 0, "learner2": 0}, (tmp_path / "out" / "logs" / "learner1.txt").read_text()
    s = RR.summarize(tmp_path / "out")
    row = s["notebooks"]["01_probe"]
    assert row["alone_s"] is None and set(row["learners_s"]) == {"learner1", "learner2"}
    assert all(isinstance(v, float) for v in row["learners_s"].values())
    assert s["checks"]["learner1"] == {"FAIL": 1, "pass": 1}
    assert {c["name"] for c in s["checks_not_passed"]} == {"impossible"}
    assert (tmp_path / "out" / "summary.md").read_text().startswith("| notebook |")
    cells = (tmp_path / "out" / "timings" / "learner1-cells.tsv").read_text().splitlines()   # each cell's time
    code = sum(c.cell_type == "code" for c in nbformat.read(str(nb), as_version=4).cells)
    assert [line.split("\t")[2] for line in cells if "01_probe.ipynb::Cell" in line] == ["passed"] * code
    merged = R.merge(tmp_path / "out")      # an instructor's `gpulab room` over it: the stores, nothing bad
    assert merged.bad == [] and {k for _, k, _ in merged.files} == {"roomrun", "store"}


def test_the_spread_of_a_headline_across_learners(tmp_path, monkeypatch):
    out = tmp_path / "out"
    (out / "room").mkdir(parents=True)
    for n in ("alone", "learner1", "learner2", "learner3"):
        (out / "room" / f"{n}.json").write_text(json.dumps({"schema": 1, "records": []}))
    values = {"alone": 10.0, "learner1": 8.0, "learner2": 9.0, "learner3": 12.0}
    monkeypatch.setattr(RR, "_headlines", lambda path: {("06", "speed-up"): values[path.stem]})
    h = RR.summarize(out)["headline_spread"]["06 speed-up"]
    assert (h["alone"], h["median"], h["min"], h["max"], h["n"]) == (10.0, 9.0, 8.0, 12.0, 3)
    assert round(h["spread_pct"], 1) == 44.4


def test_bad_arguments_are_one_line(capsys, tmp_path):
    assert RR.main(["--notebooks", "99", "--out", str(tmp_path)]) == 2
    assert RR.main(["--learners", "0", "--out", str(tmp_path)]) == 2
    assert "roomrun:" in capsys.readouterr().err


def test_a_learner_stopped_before_a_notebook_is_named_not_finished(tmp_path):
    """A room whose learners ran out of time (exit code "timeout") before a notebook: the summary says who
    did not finish it, instead of a blank median."""
    out = tmp_path / "out"
    for d in ("room", "timings"):
        (out / d).mkdir(parents=True)
    for n in ("alone", "learner1", "learner2"):
        (out / "room" / f"{n}.json").write_text(json.dumps({"schema": 1, "records": []}))
    timings = lambda rows: json.dumps({"kind": RR.TIMINGS_KIND, "notebooks": rows})
    (out / "timings" / "alone.json").write_text(timings({"00_x": {"seconds": 64.0, "rc": 0}, "01_y": {"seconds": 30.0, "rc": 0}}))
    (out / "timings" / "learner1.json").write_text(timings({"00_x": {"seconds": 400.0, "rc": 0}}))
    (out / "exit_codes.json").write_text(json.dumps({"kind": RR.CODES_KIND,
                                                     "codes": {"alone": 0, "learner1": "timeout", "learner2": "timeout"}}))
    s = RR.summarize(out)
    assert s["notebooks"]["00_x"]["unfinished"] == ["learner2 (timeout)"]
    assert s["notebooks"]["01_y"]["unfinished"] == ["learner1 (timeout)", "learner2 (timeout)"]
    md = (out / "summary.md").read_text()
    assert "| 00_x | 64.0 | 400.0 [400.0, 400.0] (n=1) | - | learner2 (timeout) |" in md
    assert "| 01_y | 30.0 | - | - | learner1 (timeout), learner2 (timeout) |" in md


def test_learners_stopped_inside_their_first_notebook_are_still_the_room(tmp_path):
    """Seven learners stopped inside notebook 06 (run 2026-12-02, room-f) wrote no store and no timings: the
    summary still has the notebook's row, every learner named as not finished, not an empty room."""
    out = tmp_path / "out"
    (out / "room").mkdir(parents=True)
    (out / "exit_codes.json").write_text(json.dumps({"kind": RR.CODES_KIND, "notebooks": ["06_x"],
                                                     "codes": {"learner1": "timeout", "learner2": "timeout"}}))
    s = RR.summarize(out)
    assert s["notebooks"]["06_x"]["unfinished"] == ["learner1 (timeout)", "learner2 (timeout)"]
    assert "| 06_x | - | - | - | learner1 (timeout), learner2 (timeout) |" in (out / "summary.md").read_text()


def test_a_learner_past_its_time_is_stopped_with_everything_it_started(tmp_path):
    """On timeout the learner's whole process group goes (its pytest and kernel too), not only the learner."""
    import subprocess
    import sys
    import time
    marker = tmp_path / "grandchild.pid"
    p = subprocess.Popen([sys.executable, "-c",
                          "import subprocess, sys, time; "
                          f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
                          f"open({str(marker)!r}, 'w').write(str(c.pid)); time.sleep(60)"], start_new_session=True)
    for _ in range(100):
        if marker.exists() and marker.read_text():
            break
        time.sleep(0.05)
    assert RR._wait(p, 1.0) == "timeout"
    grandchild = int(marker.read_text())
    for _ in range(50):
        try:
            with open(f"/proc/{grandchild}/stat") as f:
                state = f.read().split()[2]
        except FileNotFoundError:
            break
        if state == "Z":            # killed, not yet reaped by init
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the learner's child {grandchild} still runs after the learner timed out")


def test_a_room_stopped_by_sigterm_stops_its_learners(tmp_path):
    """`timeout` (the device scripts) or a scheduler ends roomrun with SIGTERM: its learners, each in a session of
    its own, go with it instead of running on and keeping the GPU busy."""
    import signal
    import subprocess
    import sys
    import time
    out = tmp_path / "out"
    room = subprocess.Popen([sys.executable, "-m", "gpulab.tools.roomrun", "--learners", "2", "--no-alone",
                             "--notebooks", "13", "--scale", "tiny", "--out", str(out)], cwd=RR.ROOT)

    def learners() -> list[int]:
        ps = subprocess.run(["ps", "-eww", "-o", "sid=,args="], capture_output=True, text=True).stdout.splitlines()
        return sorted({int(line.split()[0]) for line in ps if "--child learner" in line and str(out) in line})

    try:
        for _ in range(300):
            if len(learners()) == 2:
                break
            time.sleep(0.1)
        sessions = learners()
        assert len(sessions) == 2, "the learners did not start"
        room.send_signal(signal.SIGTERM)
        assert room.wait(timeout=60) == 128 + signal.SIGTERM
    finally:                         # whatever failed above, leave nothing running
        room.kill()
        for sid in learners():
            subprocess.run(["pkill", "-KILL", "-s", str(sid)])
    for _ in range(100):
        ps = subprocess.run(["ps", "-eo", "sid=,stat="], capture_output=True, text=True).stdout.splitlines()
        alive = [line for line in ps if int(line.split()[0]) in sessions and not line.split()[1].startswith("Z")]
        if not alive:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"processes of the learners' sessions still run after SIGTERM: {alive}")
    codes = json.loads((out / "exit_codes.json").read_text())["codes"]      # run() unwound and wrote its file
    assert codes == {"learner1": "stopped", "learner2": "stopped"}, codes


def test_the_readmes_room_figures_are_the_committed_room_runs():
    """docs/instructors.md's "A room of seven on one H200" quotes results/room/2026-12-02-h200-time-sliced-*: each notebook's
    time alone and across the seven, the headlines' spread, one learner's fp32 matmul alone and in the room,
    and notebook 00's 16-bit sweep and sustained run with seven (run e) against alone (run a)."""
    import re
    import statistics
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    readme = " ".join((root / "docs" / "instructors.md").read_text().split())     # line breaks as spaces
    runs = [root / "results" / "room" / f"2026-12-02-h200-time-sliced-{k}" for k in ("00-01-04", "01-04", "02-05", "03-08", "00", "06")]
    alone, learners, heads = {}, {}, {}
    for run in runs:
        s = json.loads((run / "summary.json").read_text())
        for nb, row in s["notebooks"].items():
            if row["alone_s"] is not None:
                alone[nb] = row["alone_s"]
            if row["median_s"] is not None:
                learners[nb] = f"{row['median_s']} [{row['min_s']}, {row['max_s']}]"
            elif len(row["unfinished"]) == 7:
                learners.setdefault(nb, "none of the seven finished it in the time the run had left")
        for key, h in s["headline_spread"].items():
            heads.setdefault(key, {}).update({k: v for k, v in h.items() if v is not None})
    assert len(alone) == 8 and len(learners) == 8
    for nb in alone:
        assert f"| {nb} | {alone[nb]} | {learners[nb]} |" in readme, nb
    g = lambda v: f"{v:.3g}"
    h = heads["03 step time, 0 workers / best worker count"]
    assert f"from {g(h['alone'])} to {g(h['median'])} [{g(h['min'])}, {g(h['max'])}]" in readme
    h = heads["05 pinned / pageable host->device GB/s"]
    assert f"{g(h['median'])} [{g(h['min'])}, {g(h['max'])}] against {g(h['alone'])} alone" in readme
    h = heads["08 copy + matmul, overlapped / serial ms"]
    assert f"{g(h['median'])} [{g(h['min'])}, {g(h['max'])}] against {g(h['alone'])}" in readme
    h = heads["04 one program past a full wave / a full wave, ms"]
    assert f"{g(h['alone'])} alone, {g(h['median'])} [{g(h['min'])}, {g(h['max'])}] with" in readme
    stores = runs[0] / "room"
    value = lambda p: next(r["value"] for r in json.loads(p.read_text())["records"] if r["name"] == "matmul_fp32_n8192")
    room = statistics.median(value(p) for p in sorted(stores.glob("learner*.json")))
    assert f"{g(value(stores / 'alone.json'))} TFLOP/s alone and at {g(room)} (median) with seven" in readme
    fail = [json.loads(line) for line in (runs[0] / "checks" / "alone.jsonl").read_text().splitlines()]
    fail = next(c for c in fail if c["status"] == "FAIL")
    assert fail["lesson"] == "04" and f"check ({g(fail['measured'])}, above {g(fail['high'])})" in readme
    compute = {p.stem: next(r["value"] for r in json.loads(p.read_text())["records"] if r["name"] == "compute_ms")
               for p in sorted((runs[3] / "room").glob("*.json"))}
    seven = [v for k, v in compute.items() if k != "alone"]
    assert f"({compute['alone']:.3g} ms alone, {min(seven):.3g} to {max(seven):.3g} ms with seven)" in readme
    rec = lambda p, name: next(r for r in json.loads(p.read_text())["records"] if r["name"] == name)
    alone00, seven00 = runs[0] / "room" / "alone.json", sorted((runs[4] / "room").glob("learner*.json"))
    best = [rec(p, "matmul_bf16") for p in seven00]
    assert {tuple(r["extra"]["shape"]) for r in best} == {(3072, 3072, 3072)}
    assert rec(alone00, "matmul_bf16")["extra"]["shape"] == [12288] * 3
    sustained = [rec(p, "matmul_bf16_sustained") for p in seven00]
    assert (f"(12288 cubed, {g(rec(alone00, 'matmul_bf16')['value'])} TFLOP/s)" in readme
            and f"(3072 cubed, {g(statistics.median(r['value'] for r in best))} TFLOP/s median, about half a millisecond" in readme)
    assert 0.4 < 2 * 3072 ** 3 / (statistics.median(r["value"] for r in best) * 1e12) * 1e3 < 0.6      # ms a call
    assert (f"read {g(statistics.median(r['value'] for r in sustained))} (median, over "
            f"{statistics.median(r['extra']['seconds'] for r in sustained):.3g} s) against "
            f"{g(rec(alone00, 'matmul_bf16_sustained')['value'])} alone "
            f"({rec(alone00, 'matmul_bf16_sustained')['extra']['seconds']:.3g} s)") in readme
    first_path = min(seven00, key=lambda p: rec(p, "matmul_bf16_sustained")["time"])   # the one that came first
    first = rec(first_path, "matmul_bf16_sustained")
    others_copying = [rec(p, "d2h_pinned")["time"] for p in seven00 if p != first_path]
    assert all(t >= first["time"] for t in others_copying)  # the six were still in their copy cells
    assert f"sustained run came first, while the other six were timing host-device copies (copy engines, not SMs), read {g(first['value'])}" in readme
    fp32 = statistics.median(rec(p, "matmul_fp32")["value"] for p in seven00)
    assert f"sweep's best read {g(fp32)} against {g(rec(alone00, 'matmul_fp32')['value'])} alone" in readme
    ratio = json.loads((runs[4] / "summary.json").read_text())["headline_spread"]["00 16-bit / fp32 matmul TFLOP/s"]
    assert f"headline read {g(ratio['median'])} against {g(heads['00 16-bit / fp32 matmul TFLOP/s']['alone'])} alone" in readme
    words = {4: "four", 5: "five", 6: "six"}
    learners_00 = json.loads((runs[4] / "summary.json").read_text())["notebooks"]["00_gpu_ceilings"]["median_s"]
    assert f"Notebook 00 took {words[round(learners_00 / alone['00_gpu_ceilings'])]} times as long" in readme
    stopped = json.loads((runs[5] / "exit_codes.json").read_text())["codes"]
    cells = {(run / "logs" / f"{n}.txt").read_text().splitlines()[0].count(".") for n in stopped if n != "alone" for run in runs[5:]}
    # 06's code cells as the room ran it: the graded exercise's cells were added after (2026-12-04)
    graded = ("exercise(", "ex.check(", "ex.hint(")
    code06 = sum(c["cell_type"] == "code" and not any(g in "".join(c["source"]) for g in graded)
                 for c in json.loads(next((root / "notebooks").glob("06_*.ipynb")).read_text())["cells"])
    assert sum(v == "timeout" for v in stopped.values()) == 7 and len(cells) == 1
    assert f"stopped at its time limit after {cells.pop()} of 06's {code06} cells" in readme
    log = (root / "results" / "profiles" / "2026-12-02-h200-h200-1g-09-to-15" / "h200-2026-12-02-1g-09-15-log.txt").read_text()
    rc = dict(re.findall(r"== h200-1g (\d\d) [^\n]*\nrc=(\d+)", log))
    assert rc == {"09": "0", "10": "0", "11": "0", "12": "0", "13": "124", "14": "0", "15": "124"}, rc
    assert "09, 10, 11, 12 and 14 ran every cell" in readme and "13 and 15 ran out of the call's time" in readme


def test_mps_gives_each_learner_its_slices_share_of_the_sms():
    assert RR.mps_percentage(16, 132) == 12          # an H200 1g slice: 16 of 132 SMs, 12.1 %, rounded down
    assert RR.mps_percentage(14, 98) == 14
    assert RR.mps_percentage(None, 132) is None and RR.mps_percentage(16, None) is None
    assert RR.mps_percentage(132, 132) is None       # the whole GPU: no limit


def test_the_room_probes_for_the_share_that_gives_the_slices_sms(tmp_path, monkeypatch):
    """12 % of an H200's 132 SMs gave an MPS client 14, not the 1g slice's 16 (2026-12-03): the room tries one
    percent more at a time and keeps the share whose count comes closest to the slice's."""
    monkeypatch.setenv("PATH", f"{_fake_control(tmp_path)}:{__import__('os').environ['PATH']}")
    given = lambda pct: 2 * int(132 * pct / 100 / 2)            # a stand-in: whole SM pairs, rounded down
    asked = []
    monkeypatch.setattr(RR, "probe_mps", lambda env: (asked.append(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"])
                                                      or given(int(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"])), ""))
    mps = RR.start_mps(tmp_path / "out", "h200-1g", gpu_sms=132)
    assert asked == ["12", "13"] and mps["percentage"] == 13 and mps["client_sms"] == 16
    assert "a probe client was given 16 (12 %: 14, 13 %: 16 SMs)" in mps["why"]
    assert RR.learner_env(tmp_path / "out", "learner1", "h200-1g", "full", mps)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "13"
    over = {12: 14, 13: 20}                                     # one percent more overshoots further: keep 12
    monkeypatch.setattr(RR, "probe_mps", lambda env: (over[int(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"])], ""))
    assert RR._closest_share({}, 16, 12, 14, tries=1)[:2] == (12, 14)


def _fake_control(tmp_path, rc=0):
    """A stand-in for nvidia-cuda-mps-control: logs its arguments and standard input."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    tool = bin_dir / "nvidia-cuda-mps-control"
    tool.write_text(f"#!/bin/sh\necho \"args=$* pipe=$CUDA_MPS_PIPE_DIRECTORY\" >> {tmp_path}/calls.txt\n"
                    f"if [ -z \"$1\" ]; then cat >> {tmp_path}/calls.txt; fi\n"
                    f"[ {rc} = 0 ] || echo 'An instance of this daemon is already running' >&2\nexit {rc}\n")
    tool.chmod(0o755)
    return bin_dir


def test_the_mps_daemon_is_started_for_the_room_and_told_to_quit(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{_fake_control(tmp_path)}:{__import__('os').environ['PATH']}")
    seen = {}
    monkeypatch.setattr(RR, "probe_mps", lambda env: (seen.update(env) or 16, ""))    # what a client is given
    mps = RR.start_mps(tmp_path / "out", "h200-1g", gpu_sms=132)
    assert mps["running"] and mps["percentage"] == 12 and "12 % of the GPU's 132 SMs" in mps["why"]
    assert mps["client_sms"] == 16 and seen["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "12"
    env = RR.learner_env(tmp_path / "out", "learner1", "h200-1g", "full", mps, learners=7)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "12" and env["CUDA_MPS_PIPE_DIRECTORY"] == mps["pipe"]
    assert env["GPULAB_SHARED_GPU"] == "MPS, 7 learners side by side"
    alone = RR.learner_env(tmp_path / "out", "alone", "h200-1g", "full", mps, learners=7)
    assert "GPULAB_SHARED_GPU" not in alone and alone["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "12"
    RR.stop_mps(mps)
    calls = (tmp_path / "calls.txt").read_text()
    assert f"args=-d pipe={mps['pipe']}" in calls and "quit" in calls


def test_without_the_mps_daemon_the_room_says_why_and_runs_time_sliced(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    missing = RR.start_mps(tmp_path / "out", "h200-1g", gpu_sms=132)
    assert not missing["running"] and "not found" in missing["why"] and "time-sliced" in missing["why"]
    assert "CUDA_MPS_PIPE_DIRECTORY" not in RR.learner_env(tmp_path / "out", "learner1", "", None, missing)
    monkeypatch.setenv("PATH", f"{_fake_control(tmp_path, rc=1)}:/usr/bin:/bin")
    refused = RR.start_mps(tmp_path / "out", "h200-1g", gpu_sms=132)
    assert not refused["running"] and "exited 1" in refused["why"] and "already running" in refused["why"]
    monkeypatch.setenv("PATH", f"{_fake_control(tmp_path / 'again')}:/usr/bin:/bin")
    monkeypatch.setattr(RR, "probe_mps", lambda env: (None, "the probe client failed (no CUDA GPU)"))
    dead = RR.start_mps(tmp_path / "out", "h200-1g", gpu_sms=132)     # the daemon forked, no client was served
    assert not dead["running"] and "did not serve a client" in dead["why"] and "quit" in (tmp_path / "again" / "calls.txt").read_text()
    monkeypatch.setattr(RR, "_gpu_sms", lambda: None)          # what a machine without a CUDA GPU reads
    no_gpu = RR.start_mps(tmp_path / "out", "h200-1g")
    assert not no_gpu["running"] and "no CUDA GPU" in no_gpu["why"]


def test_an_mps_client_gets_no_green_context_and_mps_s_own_sm_count(monkeypatch):
    """Under MPS with a share of the SMs, MPS holds the limit: no green context is made, and the SM count the
    course uses is the one CUDA reports for this client. On the H200 MPS gave 14 SMs for the h200-1g
    profile's 16 (12 % of 132; results/room/2026-12-03-h200-mps-01-04-08): taking the profile's 16
    there made notebook 04's "full wave" two waves and its wave ratio read 1.00 instead of about 2."""
    import types
    import torch
    from gpulab.core import device as D
    monkeypatch.setenv("GPULAB_PROFILE", "h200-1g")
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "12")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/pipe")
    monkeypatch.setattr(D, "SM_LIMIT", {"sms": None, "why": "not yet"})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: types.SimpleNamespace(multi_processor_count=14))
    assert D.apply_profile_sm_limit(torch.device("cuda", 0)) == 14
    assert D.SM_LIMIT["sms"] == 14 and "context" not in D.SM_LIMIT
    assert D.SM_LIMIT["why"].startswith("MPS gave this process 14 SMs") and "profile's slice has 16" in D.SM_LIMIT["why"]
    cpu = D._real_facts(torch.device("cpu"))
    monkeypatch.setattr(D, "pick_device", lambda: torch.device("cpu"))
    assert D.device_facts().sm_count == 16          # on the CPU the profile's count (its control flow)
    gpu = dataclasses.replace(cpu, kind="cuda", sm_count=132)     # a GPU whose whole count CUDA would report
    monkeypatch.setattr(D, "_real_facts", lambda dev: gpu)
    assert D.device_facts().sm_count == 14          # on a GPU, the count MPS gave (SM_LIMIT), not the profile's
    other = next(k for k, p in __import__("gpulab.core.profiles", fromlist=["PROFILES"]).PROFILES.items()
                 if p.sm_count and k != "h200-1g")
    monkeypatch.setenv("GPULAB_PROFILE", other)         # a limit made for another profile is not this one's
    assert D.device_facts().sm_count == 132
    monkeypatch.setenv("GPULAB_PROFILE", "h200-1g")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d=None: types.SimpleNamespace(multi_processor_count=132))
    assert D.apply_profile_sm_limit(torch.device("cuda", 0)) is None     # no server limits it: a green context,
    assert D.SM_LIMIT["why"].startswith("green contexts unavailable")    # which this CPU build of torch has not
    monkeypatch.setattr(D, "SM_LIMIT", {"sms": None, "why": "MPS client, but CUDA could not say its SMs"})
    def no_cuda(d=None):
        raise RuntimeError("no CUDA GPU")
    monkeypatch.setattr(torch.cuda, "get_device_properties", no_cuda)
    assert D.apply_profile_sm_limit(torch.device("cuda", 0)) is None and "could not say its SMs" in D.SM_LIMIT["why"]


def test_the_readmes_mps_room_figures_are_the_committed_mps_runs():
    """docs/instructors.md's MPS room (results/room/2026-12-03-h200-mps-*) against its files: each
    notebook's row, the SMs the probe was given, the slowdown of the seven, 07's learner alone, the headlines,
    and 04's full wave of the profile's 16 programs on 14 SMs."""
    import statistics
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    readme = " ".join((root / "docs" / "instructors.md").read_text().split())
    runs = [root / "results" / "room" / f"2026-12-03-h200-mps-{k}" for k in ("06", "07", "01-04-08")]
    sliced = [root / "results" / "room" / f"2026-12-02-h200-time-sliced-{k}" for k in ("00-01-04", "01-04", "02-05", "03-08", "00", "06")]
    rows, heads, slow = {}, {}, {}
    for run in runs:
        s = json.loads((run / "summary.json").read_text())
        codes = json.loads((run / "exit_codes.json").read_text())
        assert set(codes["codes"].values()) == {0} and codes["mps"]["running"] and codes["mps"]["client_sms"] == 14
        assert all(not c.get("FAIL") for c in s["checks"].values())
        for nb, row in s["notebooks"].items():
            rows[nb] = f"| {nb} | {row['alone_s']} | {row['median_s']} [{row['min_s']}, {row['max_s']}] |"
            slow[nb] = row["median_s"] / row["alone_s"] - 1
        heads.update(s["headline_spread"])
    assert len(rows) == 5 and all(r in readme for r in rows.values()), [r for r in rows.values() if r not in readme]
    assert "the probe client was given 14 SMs, not the profile's 16" in readme
    rest = [v for nb, v in slow.items() if not nb.startswith("07")]
    assert f"In 01, 04, 06 and 08 the seven took {round(100 * min(rest))} to {round(100 * max(rest))} % longer (median)" in readme
    ts = {}
    for run in sliced:
        for nb, row in json.loads((run / "summary.json").read_text())["notebooks"].items():
            if row["alone_s"] is not None:
                ts.setdefault(nb, {})["alone"] = row["alone_s"]
            if row["median_s"] is not None:
                ts.setdefault(nb, {})["seven"] = row["median_s"]
    assert f"01 took {ts['01_measuring_time']['seven'] / ts['01_measuring_time']['alone']:.3g} times as long" in readme
    last = {nb: ts.get(nb, {}).get("seven") for nb in rows}       # the time-sliced column, from the rooms above
    assert last["06_mixed_precision"] is None and "07_tensor_core_alignment" not in ts
    last.update({"06_mixed_precision": "none finished", "07_tensor_core_alignment": "not run"})
    assert all(f"{rows[nb]} {last[nb]} |" in readme for nb in rows), last
    for nb in ("06_mixed_precision", "01_measuring_time"):
        mps_alone = next(json.loads((r / "summary.json").read_text())["notebooks"][nb]["alone_s"] for r in runs
                         if nb in json.loads((r / "summary.json").read_text())["notebooks"])
        assert f"{nb[:2]}: {mps_alone} against {ts[nb]['alone']}" in readme and mps_alone > ts[nb]["alone"]
    r07 = json.loads((runs[1] / "summary.json").read_text())["notebooks"]["07_tensor_core_alignment"]
    assert f"the learner alone took {round(r07['alone_s'] - r07['max_s'])} s longer than any of the seven" in readme
    recs = lambda p: {r["name"]: r for r in json.loads(p.read_text())["records"]}
    alone07 = recs(runs[1] / "room" / "alone.json")
    seven07 = [recs(p) for p in sorted((runs[1] / "room").glob("learner*.json"))]
    for name, r in alone07.items():       # "each speed it measured was the same as theirs or higher"
        med = statistics.median(s[name]["value"] for s in seven07)
        if r["unit"] in ("TFLOP/s", "img/s"):
            assert r["value"] >= 0.99 * med, name
        elif r["unit"] == "ms":
            assert r["value"] <= 1.01 * med, name
    g = lambda v: f"{v:.3g}"
    for key, fmt, f in (("06 CNN images/s, best 16-bit / fp32", "read {m} [{lo}, {hi}] with seven against {a}", g),
                        ("07 matmul TFLOP/s, n=4096 / n=4095", "held: {m} [{lo}, {hi}] against {a}", g),
                        ("08 copy + matmul, overlapped / serial ms", "read {m} [{lo}, {hi}] against {a}", "{:.2f}".format)):
        h = heads[key]
        assert fmt.format(m=f(h["median"]), lo=f(h["min"]), hi=f(h["max"]), a=f(h["alone"])) in readme, key
    smi = [line.split(", ") for line in (runs[0] / "smi.csv").read_text().splitlines()[1:]]
    rows = [(float(r[3].split()[0]), float(r[4].split()[0]), float(r[2].split()[0])) for r in smi if len(r) == 5]
    # with seven: the power at its 700 W limit while the SM clock was below its peak
    assert "700.00 W" in (runs[0] / "gpu.txt").read_text()
    assert any(w >= 0.98 * 700 and mhz < max(m for _, m, _ in rows) for w, mhz, _ in rows)
    assert "the 700 W power limit (nvidia-smi read the power at the limit and the SM clock below its peak" in readme
    assert any(0 < mib < 200 for _, _, mib in rows)    # the daemon's server holds memory with no learner running
    h = heads["04 one program past a full wave / a full wave, ms"]
    assert g(h["alone"]) == g(h["median"]) == "1" and "04's wave ratio read 1.00 alone and with seven" in readme
    waves = [r for r in recs(runs[2] / "room" / "alone.json").values() if r["name"] == "wave_step_ratio"]
    assert waves[0]["extra"]["programs"] == 16 and "MPS had given the process 14" in readme
    one = recs(runs[2] / "room" / "alone.json")["wave_one_wave_ms"]["value"]
    green = recs(sliced[0] / "room" / "alone.json")["wave_one_wave_ms"]["value"]
    assert f"its one-wave time, {one:.3g} ms, is twice the green context's" in readme and 1.9 < one / green < 2.1


def test_every_slice_profile_takes_the_count_mps_gives(monkeypatch):
    """Held out from the H200 case the fix was made on: every slice profile (A100, H100, H200 1g), given a count
    by MPS below, at or above its slice's, uses that count; given the whole GPU's, it is not limited by MPS."""
    import types
    import torch
    from gpulab.core import device as D
    from gpulab.core.profiles import PROFILES
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "10")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/pipe")
    slices = {k: p for k, p in PROFILES.items() if p.sm_count}
    assert len(slices) >= 3, slices
    for key, prof in slices.items():
        monkeypatch.setenv("GPULAB_PROFILE", key)
        for given in (prof.sm_count - 2, prof.sm_count, prof.sm_count + 2, 132):
            monkeypatch.setattr(D, "SM_LIMIT", {"sms": None, "why": "not yet"})
            monkeypatch.setattr(torch.cuda, "get_device_properties",
                                lambda d=None, n=given: types.SimpleNamespace(multi_processor_count=n))
            got = D.apply_profile_sm_limit(torch.device("cuda", 0))
            assert got == (given if given < 2 * prof.sm_count else None), (key, given, D.SM_LIMIT["why"])
