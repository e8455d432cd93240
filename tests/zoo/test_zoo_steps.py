"""The zoo's steps (zoo/): each runs on the CPU at the tiny size, as written and with each of its fixes, and
each fix was checked to train the same model (results/zoo/2026-12-01-cpu-fix-checks/checks-cpu.json, made by
`python -m gpulab.diagnose.zoo check`); two fixes are checked again here, one that changes only the rounding
and one that changes nothing in the arithmetic."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gpulab.diagnose import zoo

CPU = torch.device("cpu")
STEPS = zoo.step_files()
CHECKS = json.loads((Path(__file__).resolve().parents[2] / "results" / "zoo" / "2026-12-01-cpu-fix-checks" / "checks-cpu.json").read_text())["checks"]
RULES = {"input_bound", "host_sync", "pageable_copy", "launch_bound", "fp32_matmuls", "misaligned_gemm",
         "memory_pressure", "host_code", "periodic_stall", "layout_transposes", "copy_not_overlapped",
         "no_sync_accumulation", "optimizer_unfused", "elementwise_unfused", "attention_math", "compile_recompiles",
         "compile_graph_breaks", "cudagraphs_skipped", "varying_shapes"}


def test_the_zoo_has_at_least_twenty_steps_and_five_written_as_tuned():
    assert len(STEPS) >= 20
    assert sum(1 for p in STEPS if p.stem.endswith("_tuned") or p.stem == "mlp_big_bf16") >= 5


def _run_steps(path):
    """Each fix of one zoo step, two steps each, at the tiny size on the CPU."""
    module = zoo.load(path)
    assert module.__doc__ and set(module.FIXES) <= RULES, f"{path.stem}: FIXES names a rule diagnose does not have"
    for fix in [None, *module.FIXES]:
        step = module.make_step(fix, scale="tiny", device=CPU)
        try:
            losses = [step() for _ in range(2)]
            assert all(math.isfinite(float(torch.as_tensor(loss).detach())) for loss in losses), (path.stem, fix, losses)
            assert any(p.requires_grad for p in step.model.parameters())
        finally:
            close = getattr(step, "close", None)
            if close:
                close()


# A step that makes its own one-process gloo group (the DDP steps) runs in a child process with a time limit: a
# fresh-clone CI run once hung inside gloo there (every thread in a futex wait) after a thousand other tests had
# run in the same process, and the test alone never did. A hang is a failure that says so, not a stuck CI.
CHILD_LIMIT_S = 180


@pytest.mark.parametrize("path", STEPS, ids=[p.stem for p in STEPS])
def test_step_runs_as_written_and_fixed(path, monkeypatch):
    monkeypatch.setenv("ZOO_COMPILE_BACKEND", "eager")       # the code path, not a compiler: seconds, not minutes
    if getattr(zoo.load(path), "NEEDS_GPUS", 1) == 1:
        _run_steps(path)
        return
    code = f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); " \
           f"from test_zoo_steps import _run_steps; from pathlib import Path; _run_steps(Path({str(path)!r}))"
    env = {**os.environ, "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                              timeout=CHILD_LIMIT_S, cwd=Path(__file__).resolve().parents[2])
    except subprocess.TimeoutExpired:
        pytest.fail(f"{path.stem}: the steps did not finish in {CHILD_LIMIT_S} s in a child process "
                    f"(a one-process gloo group hung); the child was killed")
    assert done.returncode == 0, f"{path.stem}: the child process failed:\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("path", STEPS, ids=[p.stem for p in STEPS])
def test_every_fix_was_checked_to_train_the_same_model(path):
    module = zoo.load(path)
    for rule in module.FIXES:
        check = CHECKS.get(path.stem, {}).get(rule)
        assert check is not None, f"{path.stem}/{rule}: no check in results/zoo/2026-12-01-cpu-fix-checks/checks-cpu.json; run the zoo's check"
        assert check["ok"], f"{path.stem}/{rule}: {check['why']}"


@pytest.mark.parametrize("name, fix", [("lstm_fp32", "fp32_matmuls"), ("gpt_item_every_step", "host_sync")])
def test_same_model_holds_again_here(name, fix):
    result = zoo.same_model(zoo.load(zoo.ZOO / f"{name}.py"), fix, CPU)
    assert result["ok"], result["why"]
    assert result["floor"] > 0


def test_a_fix_that_trains_another_model_fails_the_check(monkeypatch):
    module = zoo.load(zoo.ZOO / "gpt_item_every_step.py")
    real = module.make_step

    def other_start(fix=None, **kw):              # the "fix" also starts from other weights: another model
        step = real(None, **kw)
        if fix is not None:
            with torch.no_grad():
                for p in step.model.parameters():
                    p.mul_(1.01)
        return step
    monkeypatch.setattr(module, "make_step", other_start)
    result = zoo.same_model(module, "host_sync", CPU)
    assert not result["ok"], result["why"]
