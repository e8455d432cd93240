"""The labelled cases of gpulab.diagnose.cases: every one builds and steps on the CPU at tiny size, its
fixed step trains the same model as its bad step (`same_model`: parameters after a few updates against a
measured noise floor), and nothing global is left changed."""
import time

import pytest
import torch

from gpulab.diagnose import RULES
from gpulab.diagnose.cases import CASES, Case, case
from gpulab.diagnose.suite import same_model
from gpulab.models.same import FLOOR_MAX, SAME_MAX_FLOOR, compare, distance, loss_value

CPU = torch.device("cpu")


def settings() -> tuple:
    """The global switches a case may touch while it runs."""
    return (torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark,
            torch.backends.cudnn.allow_tf32, torch.get_num_threads())


@pytest.mark.parametrize("name", list(CASES))
def test_every_case_builds_agrees_and_steps_on_the_cpu(name):
    before = settings()
    t0 = time.perf_counter()
    ok, why = same_model(CASES[name], "tiny", CPU)       # correct before fast
    assert ok, why
    pair = CASES[name].build("tiny", CPU)
    try:
        assert pair.models, "a case names the models its correctness check compares"
        for _ in range(2):                 # and a few more: the batches go round, the state moves on
            assert torch.isfinite(torch.tensor(loss_value(pair.bad())))
            if pair.fixed is not None:
                assert torch.isfinite(torch.tensor(loss_value(pair.fixed())))
    finally:
        pair.cleanup()
    assert settings() == before
    assert time.perf_counter() - t0 < 10, "a tiny case must stay cheap: CI runs on 2 cores"


# Rules whose fix no case here and no step of the zoo measures yet: their verdicts rank by expectation only.
UNMEASURED = {"data_parallel"}
# Notes, not fixes: what is left (compute_bound), memory nearly full (memory_full), elementwise work whose
# fusion gain is not predicted (elementwise_unfused: ranked only on a measurement, confirm.promoted, which the
# zoo's labels hold through zoo_label.GENERIC).
NOT_FIXES = {"compute_bound", "memory_full", "elementwise_unfused"}


def test_every_rule_that_names_a_fix_is_measured_by_a_case_or_the_zoo():
    from gpulab.diagnose import zoo

    labelled = {c.rule for c in CASES.values() if c.rule is not None}
    in_zoo = {rule for path in zoo.step_files() for rule in zoo.load(path).FIXES}
    fixes = {r.__name__ for r in RULES} - NOT_FIXES
    assert fixes - labelled - in_zoo == UNMEASURED
    assert labelled <= fixes
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
    anywhere = Case("x", "input_bound", "03", "bad", "fixed", lambda s, d, reorder=False: None, needs_gpus=0)
    assert anywhere.unable(CPU) is None and not anywhere.needs_gpu


def test_compare_refuses_a_fixed_step_that_trains_another_model():
    p0 = [torch.zeros(4)]
    bad = [torch.tensor([1.0, 1.0, 1.0, 1.0])]                    # moved by 2
    noise = [torch.tensor([1.0, 1.0, 1.0, 1.001])]               # a noise floor of 0.0005 of the movement
    near = [torch.tensor([1.0, 1.0, 1.0, 1.002])]                # 0.001: within 4x the floor
    far = [torch.tensor([1.0, 1.0, 1.0, 1.1])]                   # 0.05: far beyond it
    assert compare(p0, bad, near, [(noise, bad)])["ok"]
    result = compare(p0, bad, far, [(noise, bad)])
    assert not result["ok"] and "MORE than" in result["why"] and f"{SAME_MAX_FLOOR:g}x" in result["why"]
    assert compare(p0, bad, bad, [])["ok"]                        # identical: under SAME_ABS whatever the floor
    assert not compare(p0, bad, [torch.tensor([float("nan")] * 4)], [(noise, bad)])["ok"]


def test_a_floor_as_large_as_the_movement_cannot_tell_and_fails():
    p0, bad = [torch.zeros(2)], [torch.ones(2)]
    wild = [torch.tensor([1.0 + 2 * FLOOR_MAX, 1.0])]
    result = compare(p0, bad, wild, [(wild, bad)])
    assert not result["ok"] and "cannot tell" in result["why"]


def test_distance_compares_the_rows_two_models_share():
    small, padded = [torch.ones(3, 2)], [torch.cat([torch.ones(3, 2), torch.full((2, 2), 9.0)])]
    assert distance(small, padded) == 0.0
    assert distance([torch.ones(2)], [torch.zeros(2)]) == pytest.approx(2 ** 0.5)


def test_same_model_fails_a_case_whose_fix_changes_the_training():
    real = CASES["fp32_no_tensor_cores"]

    def build(scale, device, reorder=False):
        pair = real.build(scale, device, reorder=reorder)
        with torch.no_grad():                       # the "fix" starts from other weights
            for p in pair.models[1].parameters():
                p.add_(0.05)
        return pair
    ok, why = same_model(Case("other", real.rule, real.lesson, real.bad, real.fixed, build), "tiny", CPU)
    assert not ok, why


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
    ok, why = same_model(CASES[name], "tiny", device)
    assert ok, why
    assert settings() == before
