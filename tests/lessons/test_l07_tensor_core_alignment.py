"""gpulab.lessons.l07_tensor_core_alignment, issue 15: the cudnn.benchmark runner's steady steps come after
untimed warm-up steps, it runs either memory layout (the CNN panel's channels_last toggle), it can leave out
the new sizes, and the plan counts the panels' default runs."""
import subprocess

import torch

from gpulab.lessons.l07_tensor_core_alignment import (STEADY_WARMUP, config, conv_benchmark_in_fresh_process,
                                                      conv_step_times, plan)

TINY = dict(fixed=32, batch=2, precision="fp32", depths=(1,), width=4, classes=3)


def test_steady_steps_follow_the_warm_up_and_new_sizes_are_optional(on_cpu, monkeypatch):
    calls = []
    import gpulab.lessons.l07_tensor_core_alignment as L07
    real = L07.benchmark

    def counting(fn, **kw):
        calls.append(kw)
        return real(fn, **kw)

    monkeypatch.setattr(L07, "benchmark", counting)
    r = conv_step_times(False, varying=(), repeat=2, **TINY)
    assert set(r["samples_ms"]) == {"start-up", "first step", "steady"}
    assert len(r["samples_ms"]["steady"]) == 2
    steady = [kw for kw in calls if kw.get("repeat") == 2]
    assert steady and steady[0]["warmup"] == STEADY_WARMUP >= 3


def test_channels_last_runs_the_model_and_images_in_nhwc(on_cpu, monkeypatch):
    import gpulab.lessons.l07_tensor_core_alignment as L07
    seen = []
    real = L07.train_step

    def watching(model, x, y, **kw):
        seen.append((x.is_contiguous(memory_format=torch.channels_last),
                     model.blocks[0].conv2.weight.is_contiguous(memory_format=torch.channels_last)))
        return real(model, x, y, **kw)

    monkeypatch.setattr(L07, "train_step", watching)
    r = conv_step_times(False, varying=(40,), repeat=1, channels_last=True, **TINY)
    assert r["channels_last"] is True and seen and all(a and b for a, b in seen)


def test_the_child_process_gets_the_layout_and_no_new_sizes(monkeypatch):
    sent = []

    def fake(cmd, **kw):
        sent.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "stop here\n")

    monkeypatch.setattr(subprocess, "run", fake)
    try:
        conv_benchmark_in_fresh_process(False, fixed=32, varying=(), channels_last=True)
    except RuntimeError:
        pass
    cmd = sent[0]
    assert "--channels-last" in cmd and cmd[cmd.index("--varying") + 1] == ""


def test_cudnn_steady_steps_at_full_size():
    assert config("full")["cudnn_repeat"] >= 30
    whats = [w.what for w in plan("full").work]
    assert any(w.startswith("GPT panel") for w in whats) and any(w.startswith("CNN panel") for w in whats)


def test_on_a_shared_gpu_the_headline_times_its_two_products_in_turns(monkeypatch):
    import gpulab.core.monitor as M
    from gpulab.lessons import l07_tensor_core_alignment as L07
    monkeypatch.setattr(M, "sharing_mark", lambda device=None: {"shared": "2 other processes"})
    seen = {}

    def pair(a, b, p, repeat):
        seen["pair"] = (a, b)
        return 4.0, 1.0
    monkeypatch.setattr(L07, "gemm_pair_interleaved", pair)
    m = L07.headline("tiny")
    cfg = L07.config("tiny")
    assert seen["pair"] == (cfg["aligned"], cfg["misaligned"]) and m.ratio == 4.0
    assert "timed in turns" in m.check and "2 other processes" in m.check
    assert all(v > 0 for v in L07.gemm_pair_interleaved(64, 63, L07.gemm_precisions()[0], 3))


def _facts(name, cc, **profile):
    import dataclasses
    from gpulab.core.device import facts_for_capability
    return dataclasses.replace(facts_for_capability(name, *cc), **profile)


def test_the_vocabulary_check_asks_for_a_share_of_this_gpus_prediction():
    """Issue 40, review of 07: checks['vocab'] asked 1.1x of every class, while on GeForce and power-capped GPUs the
    misaligned products may cost nothing (bands.toml low 1.0). The floor is now a share of section 4's prediction
    from this GPU's own slow-down, skipped where that prediction is small; the H200's 1.31-1.40 against 2.08 pass."""
    from gpulab.lessons.l07_tensor_core_alignment import VOCAB_WORTH, vocab_floor
    low, why = vocab_floor(2.08)                 # the H200's prediction (2026-12-03)
    assert low is not None and low < 1.31 and low > 1.1 and "predicted" in why
    assert vocab_floor(1.9)[0] < vocab_floor(3.0)[0]
    none, why = vocab_floor(VOCAB_WORTH - 0.01)        # a GPU whose misaligned products cost little
    assert none is None and "not told from the steps' noise" in why


def test_the_layout_check_is_judged_by_class():
    """channels_last's 1.1x is asked where the class's alignment band has a low end above 1 (tensor-core,
    pre-ampere); on GeForce and power-capped GPUs it is shown, not judged, and under a profile not judged."""
    from gpulab.lessons.l07_tensor_core_alignment import LAYOUT_LOW, layout_floor
    assert layout_floor(_facts("NVIDIA H200", (9, 0))) == (LAYOUT_LOW, layout_floor(_facts("NVIDIA H200", (9, 0)))[1])
    assert layout_floor(_facts("Tesla V100-SXM2-16GB", (7, 0)))[0] == LAYOUT_LOW
    for name, cc, cls in (("NVIDIA GeForce RTX 4090", (8, 9), "geforce"), ("Tesla T4", (7, 5), "power-capped")):
        low, why = layout_floor(_facts(name, cc))
        assert low is None and f"[{cls}.07]" in why and "not judged" in why, name
    low, why = layout_floor(_facts("Tesla V100-SXM2-16GB", (7, 0), profile="v100", emulated_on="NVIDIA H200"))
    assert low is None and "emulating the v100 profile" in why
