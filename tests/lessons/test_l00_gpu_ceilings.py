"""gpulab.lessons.l00_gpu_ceilings: notebook 00's experiments, at tiny sizes on the CPU."""
import json

import pytest
import torch

from gpulab.core import ceilings
from gpulab.lessons import l00_gpu_ceilings as L00
from gpulab.core.ceilings import CEILING_NAMES
from gpulab.lessons.l00_gpu_ceilings import PRECISIONS, TOLERANCE, copy_experiment, matmul_error, matmul_experiment, measure_ceilings, supported_precisions, transfer_experiment
from gpulab.core.device import device_facts, facts_for_capability
from gpulab.core.results import ResultsStore
from gpulab.core.timing import Timing

pytestmark = pytest.mark.usefixtures("on_cpu")     # the CPU path, also on a GPU machine

H100 = facts_for_capability("NVIDIA H100 80GB HBM3", 9, 0)
ROW = {"lesson": "00", "unit": "TFLOP/s", "gpu": "CPU", "device": "cpu", "torch": "2.4.0",
       "host": "lab"}


@pytest.fixture
def store(results_path):
    return ResultsStore(results_path)


# -- which precisions -------------------------------------------------------------------
def test_cpu_precisions():
    assert supported_precisions(device_facts(torch.device("cpu"))) == ["fp32", "bf16"]
    assert supported_precisions() == ["fp32", "bf16"]


def test_gpu_precisions_follow_the_architecture():
    assert supported_precisions(facts_for_capability("Tesla P100", 6, 0)) == ["fp32", "fp16"]
    assert supported_precisions(facts_for_capability("Tesla V100", 7, 0)) == ["fp32", "fp16"]
    assert supported_precisions(facts_for_capability("NVIDIA A100", 8, 0)) == [
        "fp32", "tf32", "fp16", "bf16"]
    assert supported_precisions(H100) == ["fp32", "tf32", "fp16", "bf16"]


def test_every_precision_has_a_tolerance():
    assert set(TOLERANCE) == set(PRECISIONS)


# -- correctness check ------------------------------------------------------------------
def test_matmul_error_fp32_is_tiny_and_repeatable():
    err = matmul_error("fp32", n=64)
    assert 0 <= err < TOLERANCE["fp32"]
    assert matmul_error("fp32", n=64) == err


def test_matmul_error_bf16_is_larger_but_within_tolerance():
    bf16, fp32 = matmul_error("bf16", n=64), matmul_error("fp32", n=64)
    assert 1e-4 < bf16 < TOLERANCE["bf16"]
    assert bf16 > 100 * fp32


def test_matmul_error_refuses_unknown_precision():
    with pytest.raises(ValueError, match="precision must be one of fp32, tf32, fp16, bf16"):
        matmul_error("fp64", n=16)


# -- matmul_experiment ----------------------------------------------------------------------
def test_matmul_experiment_fp32():
    r = matmul_experiment("fp32", n=64)
    assert set(r) == {"TFLOP/s", "ms", "rel. error"}
    assert isinstance(r["ms"], Timing) and r["ms"].method == "perf_counter"
    assert r["TFLOP/s"] > 0
    assert r["TFLOP/s"] == pytest.approx(2 * 64**3 / (r["ms"].median_ms / 1e3) / 1e12)
    assert r["rel. error"] <= TOLERANCE["fp32"]


def test_matmul_experiment_bf16():
    r = matmul_experiment("bf16", n=64)
    assert r["TFLOP/s"] > 0 and r["rel. error"] <= TOLERANCE["bf16"]


def test_matmul_experiment_restores_the_fp32_mode():
    before = torch.get_float32_matmul_precision()
    matmul_experiment("tf32", n=32)
    assert torch.get_float32_matmul_precision() == before


@pytest.mark.parametrize("n", [8, 15, 65537])
def test_matmul_experiment_refuses_bad_sizes(n):
    with pytest.raises(ValueError, match=f"n must be between 16 and 65536 \\(got {n}\\)"):
        matmul_experiment("fp32", n=n)


def test_matmul_experiment_refuses_bad_precision():
    with pytest.raises(ValueError, match="precision must be one of"):
        matmul_experiment("int8", n=64)


def test_matmul_experiment_refuses_a_wrong_result(monkeypatch):
    monkeypatch.setattr(L00, "matmul_error", lambda precision, n: 0.5)
    with pytest.raises(AssertionError, match="bf16 matmul is wrong: relative error 5.00e-01"):
        matmul_experiment("bf16", n=64)


# -- copies -----------------------------------------------------------------------------------
def test_copy_experiment():
    r = copy_experiment(1)
    assert isinstance(r["ms"], Timing)
    assert r["GB/s"] > 0
    assert r["GB/s"] == pytest.approx(2 * 2**20 / (r["ms"].median_ms / 1e3) / 1e9)


def test_copy_experiment_refuses_zero():
    with pytest.raises(ValueError, match="mib must be >= 1"):
        copy_experiment(0)


def test_transfer_experiment_needs_a_gpu():
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        transfer_experiment("h2d", pinned=True, mib=1)


def test_transfer_experiment_refuses_bad_direction():
    with pytest.raises(ValueError, match="direction must be 'h2d' or 'd2h'"):
        transfer_experiment("sideways")


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_transfer_experiment_times_pageable_copies_on_the_host_clock(monkeypatch, direction):
    """A pageable copy's staging is CPU work, timed on the host clock between synchronizations like all CPU work
    (issue 40; events miss CPU work that overlaps earlier GPU work); a pinned copy, the copy engine's work alone,
    is not. Run on the CPU with the GPU check bypassed and pinning a no-op, so only the choice of clock is under
    test."""
    monkeypatch.setattr(L00, "require_cuda", lambda why, device=None: torch.device("cpu"))
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: self)
    pageable = transfer_experiment(direction, pinned=False, mib=1)
    pinned = transfer_experiment(direction, pinned=True, mib=1)
    assert pageable["ms"].method == "host clock, synchronized", pageable["ms"].method
    assert pinned["ms"].method != "host clock, synchronized", pinned["ms"].method   # events on a GPU
    assert pageable["GB/s"] > 0 and pinned["GB/s"] > 0


# -- measure_ceilings and ceilings() ----------------------------------------------------------
def test_measure_ceilings_on_cpu_records_its_ceilings(store):
    """Per precision the n x n product and the sweep's best (the ceiling, never below the n x n one);
    the copy, read and write streams. Every record is read back by ceilings() as it was found."""
    lines = []
    found = measure_ceilings(store, sizes={"n": 64, "copy_mib": 1, "sweep_shapes": [(32, 32, 32), (64, 64, 64)]},
                             progress=lines.append)
    assert list(found) == ["matmul_fp32_n64", "matmul_fp32", "matmul_bf16_n64", "matmul_bf16", "copy_bandwidth",
                           "read_bandwidth", "write_bandwidth"]
    assert all(v > 0 for v in found.values())
    assert found["matmul_fp32"] >= found["matmul_fp32_n64"] and found["matmul_bf16"] >= found["matmul_bf16_n64"]
    recs = store.records()
    assert [(r.lesson, r.name, r.unit) for r in recs] == [("00", k, "GB/s" if "band" in k else "TFLOP/s") for k in found]
    assert recs[0].extra["n"] == 64 and recs[1].extra["shapes"] == 2 and recs[4].extra["mib"] == 1
    assert [r.value for r in recs] == list(found.values())
    assert len(lines) == 5 and lines[0].startswith("matmul fp32 n=64:") and "best of 2 shapes" in lines[0]
    found = {k: v for k, v in found.items() if "_n64" not in k}          # ceilings() names only the ceilings

    back = ceilings.ceilings(store)
    assert set(back) == set(found)
    for name, value in found.items():
        assert back[name].value == value
        assert back[name].unit == CEILING_NAMES[name]
        assert back[name].source.startswith("measured ") and back[name].source.endswith("(tiny)")


def test_ceilings_prefer_full_size_over_newer_tiny_runs(store, monkeypatch):
    monkeypatch.setenv("GPULAB_SCALE", "full")
    store.record("00", "matmul_fp32", 40.0, "TFLOP/s")
    store.record("00", "matmul_fp32", 45.0, "TFLOP/s")
    monkeypatch.setenv("GPULAB_SCALE", "tiny")
    store.record("00", "matmul_fp32", 0.1, "TFLOP/s")
    c = ceilings.ceilings(store)["matmul_fp32"]
    assert c.value == 45.0 and c.source.endswith("(full)")


def test_ceilings_use_tiny_runs_when_no_full_one(results_path, store):
    results_path.write_text(json.dumps({"schema": 1, "records": [
        {**ROW, "name": "matmul_bf16", "value": 0.5, "scale": "tiny", "time": "T1"},
        {**ROW, "name": "matmul_bf16", "value": 0.7, "scale": "tiny", "time": "T2"},
    ]}))
    c = ceilings.ceilings(store)["matmul_bf16"]
    assert (c.value, c.source) == (0.7, "measured T2 (tiny)")


def test_ceilings_ignore_other_lessons_and_other_gpus(results_path, store):
    results_path.write_text(json.dumps({"schema": 1, "records": [
        {**ROW, "name": "matmul_fp32", "value": 1.0, "scale": "tiny", "time": "T", "lesson": "03"},
        {**ROW, "name": "matmul_fp32", "value": 2.0, "scale": "full", "time": "T",
         "gpu": "NVIDIA H100 80GB HBM3"},
    ]}))
    assert ceilings.ceilings(store) == {}          # CPU: nothing measured, no datasheet


def test_ceilings_fall_back_to_the_datasheet(store, monkeypatch):
    monkeypatch.setattr(ceilings, "device_facts", lambda: H100)
    store.record("00", "matmul_fp32", 50.0, "TFLOP/s")
    c = ceilings.ceilings(store)
    assert set(c) == {"matmul_fp32", "matmul_tf32", "matmul_fp16", "matmul_bf16", "copy_bandwidth"}
    assert c["matmul_fp32"].value == 50.0 and c["matmul_fp32"].source.startswith("measured")
    assert c["matmul_bf16"].value == 989.0
    assert c["copy_bandwidth"].value == 3350.0 and c["copy_bandwidth"].unit == "GB/s"
    assert c["matmul_tf32"].source == "datasheet: " + H100.datasheet.source


def test_datasheet_gaps_stay_gaps(store, monkeypatch):
    v100 = facts_for_capability("Tesla V100-SXM2-16GB", 7, 0)
    monkeypatch.setattr(ceilings, "device_facts", lambda: v100)
    assert set(ceilings.ceilings(store)) == {"matmul_fp32", "matmul_fp16", "copy_bandwidth"}


# -- on a GPU -------------------------------------------------------------------------------
@pytest.mark.gpu
def test_pinned_transfers_beat_pageable(monkeypatch):
    monkeypatch.delenv("GPULAB_DEVICE")
    pageable = transfer_experiment("h2d", pinned=False, mib=256)["GB/s"]
    pinned = transfer_experiment("h2d", pinned=True, mib=256)["GB/s"]
    assert pinned > pageable > 0


def test_peak_sweep_keeps_the_best_shape_and_checks_first():
    from gpulab.lessons.l00_gpu_ceilings import peak_sweep
    shapes = [(32, 32, 32), (64, 64, 64), (64, 32, 64)]
    got = peak_sweep("fp32", shapes, budget_s=0.01)
    assert [s for s, _ in got["rows"]] == shapes
    assert got["best"] == max(v for _, v in got["rows"]) and got["shape"] in shapes
    assert got["rel. error"] < 1e-5


def test_sustained_reports_a_rate_and_says_when_nvml_is_absent():
    from gpulab.lessons.l00_gpu_ceilings import sustained
    got = sustained("fp32", (64, 64, 64), seconds=0.05)
    assert got["TFLOP/s"] > 0 and got["first"] > 0 and got["seconds"] > 0
    assert got["sm_clock_mhz"] is None and got["power_w"] is None        # the CPU: no NVML


@pytest.mark.parametrize("kind", ["read", "write"])
def test_stream_experiment_measures_one_way_traffic(kind):
    from gpulab.lessons.l00_gpu_ceilings import stream_experiment
    got = stream_experiment(kind, 4)
    assert got["GB/s"] > 0 and got["kernel"] in ("sum", "amax", "fill_", "zero_")
    with pytest.raises(ValueError):
        stream_experiment("sideways", 4)


def test_memory_floor_divides_by_the_fastest_stream():
    from gpulab.lessons.l00_gpu_ceilings import memory_floor_ms
    ms, how = memory_floor_ms(4e9, 0.0, {"read_bandwidth": 4000.0, "write_bandwidth": 3000.0, "copy_bandwidth": 3500.0})
    assert ms == pytest.approx(1.0) and "read 4,000" in how            # 4 GB at the fastest, 4,000 GB/s
    ms, how = memory_floor_ms(4e9, 0.0, {"read_bandwidth": 3000.0, "write_bandwidth": 4000.0, "copy_bandwidth": 2000.0})
    assert ms == pytest.approx(1.0) and "write 4,000" in how           # a read can be as fast as the fastest stream
    ms, how = memory_floor_ms(2e9, 0.0, {"copy_bandwidth": 2000.0})
    assert ms == pytest.approx(1.0) and "not a strict floor" in how
    with pytest.raises(ValueError):
        memory_floor_ms(1.0, 1.0, {})


def test_copy_experiment_launch_free_says_how_it_timed():
    r = copy_experiment(1, launch_free=True)
    assert r["GB/s"] > 0 and r["copies"] >= 1
    if torch.cuda.is_available():
        assert r["copies"] == 256 and "CUDA graph" in r["how"]
        assert r["GB/s"] == pytest.approx(2 * 2**20 / (r["ms"].median_ms / 256 / 1e3) / 1e9)
    else:
        assert r["copies"] == 1 and "no CUDA graph" in r["how"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: on the CPU there is no launch to remove")
def test_a_small_copy_launch_free_is_faster_than_one_launch_per_copy():
    assert copy_experiment(1, launch_free=True)["GB/s"] > 2 * copy_experiment(1)["GB/s"]


def test_a_power_capped_board_is_held_to_a_lower_share_of_its_datasheet():
    # issue 40: a healthy 70 W T4 runs a long fp16 product at its power limit, well under half of 65 TFLOP/s
    from gpulab.core.specs import datasheet_for
    from gpulab.lessons.l00_gpu_ceilings import DATASHEET_SHARE_LOW, datasheet_share_low
    t4, l4, h200 = datasheet_for("Tesla T4"), datasheet_for("NVIDIA L4"), datasheet_for("NVIDIA H200")
    assert t4.power_capped and l4.power_capped and not h200.power_capped
    low_t4, why = datasheet_share_low(t4)
    assert low_t4 < DATASHEET_SHARE_LOW and "70 W" in why
    assert datasheet_share_low(h200)[0] == DATASHEET_SHARE_LOW
    assert not datasheet_for("NVIDIA L40S").power_capped            # "L4" is not "L40S"


def test_the_copy_share_low_end_passes_every_committed_full_size_copy():
    """Notebook 00's "copy bandwidth / datasheet" check takes its low end from COPY_SHARE_LOW (issue 40: it was a
    constant in the cell): every committed full-size copy of a GPU in the datasheet table passes it, below 1."""
    from gpulab.core.figures import Tag, committed_records, reference_records
    from gpulab.core.specs import datasheet_for
    from gpulab.lessons.l00_gpu_ceilings import COPY_SHARE_LOW
    shares = [r.value / datasheet_for(r.gpu).mem_gbps
              for r in reference_records(Tag("00", "copy_bandwidth"), committed_records()) if datasheet_for(r.gpu)]
    assert shares, "no committed full-size copy_bandwidth record of a GPU in the datasheet table"
    assert COPY_SHARE_LOW <= min(shares) and max(shares) < 1.0, (COPY_SHARE_LOW, min(shares), max(shares))
