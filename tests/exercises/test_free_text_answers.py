"""Free-text exercises that could not be done as written (issue 39), each with its reference answer run here at
the tiny size on the CPU, as far as a CPU allows (what needs a GPU says so and is skipped)."""
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def test_02_a_second_block_below_10_mib_and_an_allocator_setting_reach_the_child(monkeypatch):
    """02, exercises 1-2: `run_in_fresh_process(fix="none", b_mib=8)` and `alloc_conf="max_split_size_mb:32"`: the
    block size reaches the child's command line and the setting its PYTORCH_CUDA_ALLOC_CONF (joined to the fix's)."""
    from gpulab.lessons import l02_memory_fragmentation as L
    seen = {}

    class Done:
        returncode, stdout, stderr = 1, "", "stopped by the test"

    def at_once(commands, timeout_s):
        seen.update(commands)
        return {k: Done() for k in commands}
    monkeypatch.setattr(L, "at_once", at_once)
    monkeypatch.setattr(L, "require_cuda", lambda why: None)
    with pytest.raises(RuntimeError, match="stopped by the test"):
        L.run_in_fresh_processes(["none", "expandable_segments"], b_mib=8, alloc_conf="max_split_size_mb:32")
    cmd, env = seen["none"]
    assert cmd[cmd.index("--b-mib") + 1] == "8" and env["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:32"
    assert seen["expandable_segments"][1]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True,max_split_size_mb:32"
    with pytest.raises(ValueError, match="1 <= b_mib < a_mib"):
        L.run_in_fresh_processes(["none"], b_mib=40)
    # run_pattern accepts 8 MiB now: on the CPU it stops at the CUDA refusal, not at the size
    with pytest.raises(Exception) as err:
        L.run_pattern(b_mib=8)
    assert "b_mib" not in str(err.value)


def test_03_more_workers_than_cores_runs():
    """03, exercise 3: more workers than cores, through the measurement itself (the panel stops at the core count)."""
    from gpulab.core.device import cpu_cores
    from gpulab.lessons.l03_input_pipeline import SmallCNN, loader_run, make_step
    model = SmallCNN(width=4, blocks=1)
    r = loader_run(make_step(model), 2 * cpu_cores(), batch=4, size=16, passes=1, steps=2, warmup=1,
                   device=torch.device("cpu"))
    assert r.step_ms > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="exercise 5 of 08 times two CUDA streams: it needs a GPU")
def test_08_the_overlapped_branch_without_its_join_runs():
    from gpulab.core.timing import benchmark
    from gpulab.lessons.l08_cuda_streams import CopyAndMatmul
    job = CopyAndMatmul.make(16, 512, torch.float16, torch.device("cuda"))
    assert benchmark(lambda: job.run(overlap=True, join=False)).median_ms > 0


def test_08_the_join_can_be_left_out():
    import inspect
    from gpulab.lessons.l08_cuda_streams import CopyAndMatmul, copy_then_compute
    assert "join" in inspect.signature(copy_then_compute).parameters
    assert "join" in inspect.signature(CopyAndMatmul.run).parameters


def test_15_the_records_file_exercise_5_names_is_there_and_reads():
    import json
    import re
    from gpulab.diagnose.core import from_record
    nb = json.loads((REPO / "notebooks" / "15_your_training_step.ipynb").read_text())
    text = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    [path] = re.findall(r'from_record\("\.\./(results/[^"]+)"\)', text)
    assert (REPO / path).exists(), f"exercise 5 names {path}, which is not in the repository"
    assert from_record(str(REPO / path)).report()


def test_02_a_cap_above_the_gpus_memory_is_refused_with_its_reason(monkeypatch):
    """Issue 40: a 4096 MiB cap on a GPU with less memory was a memory fraction above 1, which raised from CUDA."""
    import types
    from gpulab.lessons import l02_memory_fragmentation as L
    fake = types.SimpleNamespace(get_device_properties=lambda dev: types.SimpleNamespace(total_memory=2 * 2**30))
    monkeypatch.setattr(L, "require_cuda", lambda why: "cuda")
    monkeypatch.setattr(torch, "cuda", types.SimpleNamespace(**{**{k: getattr(torch.cuda, k) for k in ("OutOfMemoryError",)},
                                                                 **vars(fake)}))
    with pytest.raises(ValueError, match="more than this GPU's 2,048 MiB"):
        L.run_pattern(cap_mib=4096)
