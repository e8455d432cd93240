

def test_a_compiled_model_stays_compiled_after_the_scan_step_and_the_dtype_spy():
    """Met under a dispatch mode (FlopCounterMode, the 16-bit spy), Dynamo gives a compiled frame up and runs
    it eagerly from then on (seen on the H200: a compiled GPT diagnosed as eager). Both run it uncompiled."""
    import torch
    from gpulab.diagnose.confirm import product_dtypes
    from gpulab.diagnose.core import scan_step

    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    compiled = torch.compile(model, backend="aot_eager")
    x = torch.randn(4, 8)

    def step():
        compiled(x).sum().backward()

    def regions() -> int:
        with torch.profiler.profile() as prof:
            step()
        return sum("Torch-Compiled Region" in e.name for e in prof.events())

    step()
    step()
    assert regions() > 0
    flops, _ = scan_step(step, torch.device("cpu"))
    assert flops and flops > 0
    assert product_dtypes(step) == {torch.float32}
    assert regions() > 0, "the compiled model ran eagerly after a step under a dispatch mode"
    torch._dynamo.reset()


def test_nvml_readings_cover_the_probe_chunk_too():
    """A 3 s window of 467 ms chunks: benchmark's probe and six samples, 3.27 s of steps; the readings kept are that
    less NVML's first period (1 s), over NVML_MIN_S (the samples alone left 1.8 s and NVML unread)."""
    import pytest
    from gpulab.diagnose import core
    chunks = [[93.4] * 5 for _ in range(7)]            # 7 chunks of 5 steps of 93.4 ms
    assert core.nvml_covered_s(chunks) == pytest.approx(7 * 0.467 - core.NVML_PERIOD_MAX_S)
    assert core.nvml_covered_s(chunks) >= core.NVML_MIN_S
