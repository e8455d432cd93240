"""GPU profiles (GPULAB_PROFILE): the course behaves as on a class of GPU learners bring."""
import dataclasses
from types import SimpleNamespace

import pytest
import torch

from gpulab.core import device as D
from gpulab.core.profiles import PROFILES
from gpulab.models.precision import refusal, supported


def test_every_profile_names_its_source_and_a_known_architecture():
    for p in PROFILES.values():
        assert p.source and p.memory_gib > 0 and p.power_w > 0
        assert "unrecognised" not in D.facts_for_capability(p.name, *p.compute_capability).architecture


@pytest.mark.parametrize("key, tf32, bf16, fp8", [
    ("v100", False, False, False), ("t4", False, False, False), ("a10", True, True, False),
    ("rtx4090", True, True, True), ("a100", True, True, False), ("h100", True, True, True)])
def test_a_profile_reports_its_class_capabilities(monkeypatch, on_cpu, key, tf32, bf16, fp8):
    monkeypatch.setenv("GPULAB_PROFILE", key)
    f = D.device_facts()
    assert (f.kind, f.profile, f.tf32, f.bf16, f.fp8) == ("cuda", key, tf32, bf16, fp8)
    assert f.compute_capability == PROFILES[key].compute_capability and f.emulated_on
    assert f.memory_gib == pytest.approx(PROFILES[key].memory_gib)


def test_a_t4_refuses_bf16_and_tf32_the_way_a_real_one_does(monkeypatch, on_cpu):
    monkeypatch.setenv("GPULAB_PROFILE", "t4")
    facts = D.device_facts()
    assert supported(facts) == ["fp32", "fp16"]
    real_t4 = D.facts_for_capability("Tesla T4", 7, 5)
    for p in ("bf16", "tf32"):
        assert refusal(p, facts) == refusal(p, real_t4) is not None


def test_the_first_line_says_it_is_emulated_and_whose_timings_they_are(monkeypatch, on_cpu):
    monkeypatch.setenv("GPULAB_PROFILE", "rtx4090")
    line = D.describe()
    assert line.startswith("Emulating the rtx4090 profile") and "every timing" in line and "this machine's" in line


def test_no_profile_is_this_device_as_it_is(monkeypatch, on_cpu):
    monkeypatch.delenv("GPULAB_PROFILE", raising=False)
    assert D.device_facts().profile is None and "Emulating" not in D.describe()


def test_an_unknown_profile_is_a_setting_error_naming_the_allowed_ones(monkeypatch, on_cpu):
    monkeypatch.setenv("GPULAB_PROFILE", "banana")
    with pytest.raises(D.SettingError, match="allowed values are v100, t4"):
        D.device_facts()


def test_on_a_gpu_the_memory_is_capped_to_the_profiles(monkeypatch):
    monkeypatch.setenv("GPULAB_PROFILE", "t4")
    calls = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=141 * 2**30))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: calls.append(f))
    fraction = D.apply_profile_memory_cap(torch.device("cuda", 0))
    assert calls == [fraction] and fraction == pytest.approx(15 / 141)
    monkeypatch.delenv("GPULAB_PROFILE")
    assert D.apply_profile_memory_cap(torch.device("cuda", 0)) is None


def test_under_a_profile_ceilings_never_fall_back_to_the_emulated_cards_datasheet(monkeypatch, results_path):
    import dataclasses
    import gpulab.core.ceilings as CE
    from gpulab.core.results import ResultsStore
    h100 = D.facts_for_capability("NVIDIA H100 80GB HBM3", 9, 0)
    monkeypatch.setattr(CE, "device_facts", lambda device=None: h100)
    assert CE.ceilings(ResultsStore(results_path))["matmul_bf16"].source.startswith("datasheet")
    monkeypatch.setattr(CE, "device_facts", lambda device=None: dataclasses.replace(h100, profile="h100"))
    assert CE.ceilings(ResultsStore(results_path)) == {}


def test_fp16_gradients_alone_need_no_scaler_but_an_update_does():
    from gpulab.models.step import train_step
    model = torch.nn.Linear(8, 8)
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    train_step(model, x, y, precision=torch.float16)                  # lessons 09 and 10: gradients only
    assert all(p.grad is not None for p in model.parameters())
    with pytest.raises(ValueError, match="GradScaler"):
        train_step(model, x, y, precision=torch.float16, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))


def test_records_made_under_a_profile_are_marked_and_kept_apart(monkeypatch, on_cpu, results_path, tmp_path):
    """A record made under GPULAB_PROFILE says so; ceilings() reads only records made the same way, and
    gpulab room leaves profile runs out (their timings are the emulating GPU's)."""
    from gpulab.core.ceilings import ceilings
    from gpulab.core.results import ResultsStore, record_profile
    from gpulab.tools.room import read_store
    store = ResultsStore(results_path)
    plain = store.record("00", "matmul_fp32", 10.0, "TFLOP/s")
    monkeypatch.setenv("GPULAB_PROFILE", "t4")
    marked = store.record("00", "matmul_fp32", 3.0, "TFLOP/s")
    assert record_profile(plain) is None and record_profile(marked) == "t4"
    assert ceilings(store)["matmul_fp32"].value == 3.0             # under t4: the t4 run's record
    monkeypatch.delenv("GPULAB_PROFILE")
    assert ceilings(store)["matmul_fp32"].value == 10.0            # without: never the profile's
    fake = [dataclasses.replace(r, name="bench_ratio", extra={**r.extra, "metric": "m"}) for r in store.records()]
    assert [m.value for m in read_store(fake, "x", registry=())] == [10.0]


def test_a_t4_profile_limits_the_cpu_to_colabs_two_cores(monkeypatch):
    """Issue 24: a Colab T4 has 2 vCPUs; emulated on a 16-core host the workers had 16."""
    import os
    monkeypatch.setenv("GPULAB_PROFILE", "t4")
    pinned = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cores: pinned.append(sorted(cores)), raising=False)
    threads = torch.get_num_threads()
    try:
        assert D.cpu_cores() == 2
        assert D.apply_profile_cpu_limit() == 2 and pinned == [[0, 1]]
        assert torch.get_num_threads() <= 2
    finally:
        torch.set_num_threads(threads)
    monkeypatch.setenv("GPULAB_PROFILE", "rtx4090")             # no typical host: this one's cores
    assert D.cpu_cores() == 16 and D.apply_profile_cpu_limit() is None
    monkeypatch.delenv("GPULAB_PROFILE")
    assert D.cpu_cores() == 16 and D.apply_profile_cpu_limit() is None
