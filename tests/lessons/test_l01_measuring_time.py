"""gpulab.lessons.l01_measuring_time: section 6's measurements (events against kernel time, a warm L2
against a flushed one, torch.utils.benchmark.Timer) on the CPU, and on a GPU where there is one."""
import pytest
import torch

from gpulab.lessons import l01_measuring_time as l01


def test_both_scales_name_the_launch_bound_product():
    for scale in ("tiny", "full"):
        cfg = l01.config(scale)
        assert cfg["launch_n"] < cfg["first_call_n"] and cfg["profiled_calls"] >= 10


def test_on_the_cpu_there_are_no_kernels_to_read(on_cpu):
    assert l01.kernel_ms_per_call(lambda: torch.ones(4) * 2, "aten::mul", calls=3) is None
    got = l01.events_vs_kernel(16, calls=5)
    assert got.n == 16 and got.events_ms > 0 and got.kernel_ms is None and got.ratio is None
    assert l01.l2_bytes() is None and l01.l2_warm_vs_flushed(calls=3) is None


def test_ratios():
    assert l01.EventsVsKernel(256, 0.03, 0.006).ratio == pytest.approx(5.0)
    assert l01.WarmVsFlushed(2**20, 2**21, 0.002, 0.003).ratio == pytest.approx(1.5)
    assert l01.WarmVsFlushed(2**20, 2**21, None, 0.003).ratio is None


def test_torch_timer_uses_this_process_threads(on_cpu):
    x = torch.randn(32, 32)
    m = l01.torch_timer("x @ x", {"x": x}, min_run_time=0.05)
    assert m.median > 0 and m.task_spec.num_threads == torch.get_num_threads()


@pytest.mark.gpu
def test_on_a_gpu_events_hold_the_launch_gap_and_a_flush_slows_a_cached_read():
    small = l01.events_vs_kernel(64, calls=50)
    assert small.kernel_ms is not None and small.events_ms > small.kernel_ms
    cache = l01.l2_warm_vs_flushed(calls=20, share=0.25)
    assert cache.warm_ms > 0 and cache.flushed_ms > 0 and cache.nbytes <= cache.l2_bytes
