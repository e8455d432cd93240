"""Profiling, then timing, in one process: importing gpulab asks Kineto to detach CUPTI when a profile ends
(TEARDOWN_CUPTI=1), and `release_cupti()` makes that happen at once. Without it, on the H200 (torch 2.11), a
small kernel's launch cost doubled after one diagnosis (results/zoo/2026-12-01-h200-cupti-probes/probe-cupti-h200-2026-12-01.json), and
with teardown alone every second session of twenty back to back recorded no kernel
(results/zoo/2026-12-01-h200-cupti-probes/probe-cupti-h200-2026-12-01-b.json); with release_cupti() after each, all twenty did
(results/zoo/2026-12-01-h200-cupti-probes/probe-cupti-h200-2026-12-01-c.json)."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

RESULTS = Path(__file__).resolve().parents[2] / "results" / "zoo" / "2026-12-01-h200-cupti-probes"


def _teardown_after_import(env_value):
    env = {k: v for k, v in os.environ.items() if k != "TEARDOWN_CUPTI"}
    if env_value is not None:
        env["TEARDOWN_CUPTI"] = env_value
    code = "import os, gpulab; print(os.environ.get('TEARDOWN_CUPTI'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return out.stdout.strip()


def test_importing_gpulab_asks_for_the_teardown_and_keeps_the_users_choice():
    assert _teardown_after_import(None) == "1"
    assert _teardown_after_import("0") == "0", "a TEARDOWN_CUPTI the user set must be kept"


def test_release_cupti_does_nothing_without_cuda(monkeypatch):
    from gpulab.core import timing

    started = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr("torch.profiler.profile", lambda *a, **k: started.append(1))
    timing.release_cupti()
    assert not started


def test_the_committed_probes_say_what_the_comments_say():
    before = json.loads((RESULTS / "probe-cupti-h200-2026-12-01.json").read_text())
    assert before["launch_us_fresh"] < 7.0 and before["steps"]["mlp_eager_small"]["launch_us_after"] > 13.0
    alone = json.loads((RESULTS / "probe-cupti-h200-2026-12-01-b.json").read_text())
    assert alone["TEARDOWN_CUPTI"] == "1" and alone["quick_sessions_kernels"][1::2] == [0] * 10
    released = json.loads((RESULTS / "probe-cupti-h200-2026-12-01-c.json").read_text())
    assert released["quick_sessions_kernels"] == [50] * 20


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: CUPTI records GPU kernels only")
def test_sessions_back_to_back_each_record_their_kernels_and_launches_recover():
    from torch.profiler import ProfilerActivity, profile

    import gpulab  # noqa: F401 - sets TEARDOWN_CUPTI
    from gpulab.core.timing import gpu_kernels, release_cupti

    x = torch.ones(1 << 16, device="cuda")

    def launch_us():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(2000):
            x.add_(1)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / 2000 * 1e6

    launch_us()
    fresh = launch_us()
    counts = []
    for _ in range(6):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                x.mul_(1.0001)
            torch.cuda.synchronize()
        counts.append(len(gpu_kernels(prof)))
        release_cupti()
    assert counts == [20] * 6, f"kernels recorded per session: {counts} (a session lost to CUPTI's teardown reads 0)"
    after = launch_us()
    assert after < 1.5 * fresh, f"a launch took {after:.1f} us after the profiles, {fresh:.1f} us before"


def test_gpu_profile_releases_cupti_when_it_ends(monkeypatch):
    """gpulab's own profiles run under timing.gpu_profile, which calls release_cupti when the session ends."""
    from gpulab.core import timing

    calls = []
    monkeypatch.setattr(timing, "release_cupti", lambda: calls.append("released"))
    with timing.gpu_profile(cpu=True) as prof:
        torch.ones(4).sum()
        assert calls == []
    assert calls == ["released"] and prof is not None
