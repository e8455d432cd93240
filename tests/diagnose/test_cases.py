"""The labelled cases of gpulab.diagnose.cases: every one builds and steps on the CPU at tiny size, its
fixed step computes what its bad step does, and nothing global is left changed."""
import time

import pytest
import torch

from gpulab.diagnose import RULES
from gpulab.diagnose.cases import CASES, Case, Pair, agree, case, loss_value

CPU = torch.device("cpu")


def settings() -> tuple:
    """The global switches a case may touch while it runs."""
    return (torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark,
            torch.backends.cudnn.allow_tf32, torch.get_num_threads())


@pytest.mark.parametrize("name", list(CASES))
def test_every_case_builds_agrees_and_steps_on_the_cpu(name):
    before = settings()
    t0 = time.perf_counter()
    pair = CASES[name].build("tiny", CPU)
    try:
        ok, why = agree(pair)              # one step of each, from the same weights on the same batch
        assert ok, why
        for _ in range(2):                 # and a few more: the batches go round, the state moves on
            assert torch.isfinite(torch.tensor(loss_value(pair.bad())))
            if pair.fixed is not None:
                assert torch.isfinite(torch.tensor(loss_value(pair.fixed())))
    finally:
        pair.cleanup()
    assert settings() == before
    assert time.perf_counter() - t0 < 10, "a tiny case must stay cheap: CI runs on 2 cores"


def test_the_cases_cover_every_rule_that_names_a_fix():
    labelled = {c.rule for c in CASES.values() if c.rule is not None}
    fixes = {r.__name__ for r in RULES} - {"compute_bound"}       # compute_bound is what is left, not a fix
    assert labelled == fixes
    assert len([c for c in CASES.values() if c.rule is not None]) >= 8
    assert CASES["capstone"].rule is None and CASES["capstone"].lesson == "13"
    for c in CASES.values():
        assert c.bad and c.fixed and len(c.lesson) == 2 and c.why_gpu


def test_cases_say_why_they_cannot_run_here():
    for c in CASES.values():
        why = c.unable(CPU)
        assert why is not None and why.startswith("needs a CUDA GPU: ") and c.why_gpu in why
    ddp = CASES["comm_not_overlapped"]
    assert ddp.needs_gpus == 2
    assert ddp.unable(torch.device("cuda"), gpus=1).startswith("needs 2 GPUs, this machine has 1")
    assert ddp.unable(torch.device("cuda"), gpus=2) is None
    assert CASES["input"].unable(torch.device("cuda"), gpus=1) is None


def test_a_case_that_needs_no_gpu_runs_anywhere():
    anywhere = Case("x", "input_bound", "03", "bad", "fixed", lambda s, d: None, needs_gpus=0)
    assert anywhere.unable(CPU) is None and not anywhere.needs_gpu


def test_agree_refuses_a_fixed_step_that_computes_something_else():
    pair = Pair(lambda: torch.tensor(2.0), lambda: 2.1, tolerance=1e-3, why_tolerance="a stated reason")
    ok, why = agree(pair)
    assert not ok
    assert "relative difference 5.0e-02 > 1e-03" in why and "a stated reason" in why
    ok, _ = agree(Pair(lambda: 2.0, lambda: float("nan")))
    assert not ok
    ok, why = agree(Pair(lambda: (torch.tensor(1.5), torch.zeros(3)), None))
    assert ok and "nothing to compare" in why


def test_loss_value_reads_floats_tensors_and_tuples():
    assert loss_value(1.25) == 1.25
    assert loss_value(torch.tensor(0.5)) == 0.5
    assert loss_value((torch.tensor(3.0), torch.ones(2))) == 3.0


def test_unknown_case_names_the_cases():
    with pytest.raises(ValueError, match="the cases are input, host_sync"):
        case("nope")
    assert case("input") is CASES["input"]


def test_ddp_makes_and_removes_its_own_process_group_on_the_cpu():
    import torch.distributed as dist

    pair = CASES["comm_not_overlapped"].build("tiny", CPU)
    assert dist.is_initialized() and dist.get_world_size() == 1
    pair.cleanup()
    assert not dist.is_initialized()
    assert pair.sizes["processes"] == 1


def test_the_cpu_fallbacks_say_what_they_cannot_show():
    for name, words in (("launch_bound", "CUDA graphs"), ("pageable_copy", "pinned memory"),
                        ("memory_pressure", "caching allocator")):
        pair = CASES[name].build("tiny", CPU)
        try:
            assert words in pair.note
        finally:
            pair.cleanup()


@pytest.mark.gpu
def test_the_memory_case_empties_the_cache_only_in_its_bad_step():
    device = torch.device("cuda", torch.cuda.current_device())
    pair = CASES["memory_pressure"].build("full", device)         # blocks large enough to own segments

    def frees(step) -> int:
        before = torch.cuda.memory_stats(device)["num_device_free"]
        step()
        torch.cuda.synchronize(device)
        return torch.cuda.memory_stats(device)["num_device_free"] - before

    try:
        pair.fixed()
        assert frees(pair.fixed) == 0            # the caching allocator keeps its blocks
        assert frees(pair.bad) > 0               # empty_cache() hands them back to the driver
    finally:
        pair.cleanup()


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["fp32_no_tensor_cores", "launch_bound", "misaligned_gemm"])
def test_gpu_cases_leave_the_math_switches_as_they_were(name):
    device = torch.device("cuda", torch.cuda.current_device())
    before = settings()
    pair = CASES[name].build("tiny", device)
    try:
        ok, why = agree(pair)
        assert ok, why
    finally:
        pair.cleanup()
    assert settings() == before
