import pytest
import torch

from gpulab.core.plots import stream_timeline_plot
from gpulab.core.device import require_cuda
from gpulab.lessons.l08_cuda_streams import NO_STREAMS, Span, copy_then_compute, predict_overlap

CPU = torch.device("cpu")


def test_predict_overlap_reference_numbers():
    p = predict_overlap(4.9, 1.4)
    assert p["serial_ms"] == pytest.approx(6.3)
    assert p["overlapped_ms"] == pytest.approx(4.9)
    assert p["saved_ms"] == pytest.approx(1.4)
    assert p["overlapped / serial"] == pytest.approx(4.9 / 6.3)


def test_predict_overlap_refuses_negative():
    with pytest.raises(ValueError):
        predict_overlap(-1.0, 1.0)


def test_require_cuda_refuses_cpu():
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        require_cuda(NO_STREAMS, CPU)


def test_serial_copy_then_compute_on_cpu():
    host, dev = torch.arange(6.0), torch.zeros(6)
    a, b, out = torch.eye(3), torch.full((3, 3), 2.0), torch.empty(3, 3)
    copy_then_compute(host, dev, a, b, out, overlap=False)
    assert torch.equal(dev, host) and torch.equal(out, b)


def test_overlap_needs_a_stream():
    with pytest.raises(ValueError, match="copy_stream"):
        copy_then_compute(torch.zeros(1), torch.zeros(1), torch.eye(1), torch.eye(1),
                          torch.empty(1, 1), overlap=True)


def test_span_and_timeline_plot():
    runs = {"serial": [Span("stream 0", "copy", 0.0, 4.9), Span("stream 0", "matmul", 4.9, 6.3)],
            "overlapped": [Span("copy stream", "copy", 0.0, 4.9), Span("default", "matmul", 0.0, 1.4)]}
    assert runs["serial"][1].ms == pytest.approx(1.4)
    fig = stream_timeline_plot(runs, title="t")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "serial: stream 0", "overlapped: copy stream", "overlapped: default"]
    assert len(ax.patches) == 4


def test_copy_and_matmul_refuses_the_cpu_and_bad_sizes(on_cpu):
    from gpulab.lessons.l08_cuda_streams import CopyAndMatmul
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        CopyAndMatmul.make(1, 64)
    with pytest.raises(ValueError, match="mib and n must be >= 1"):
        CopyAndMatmul.make(0, 64)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_copy_and_matmul_checks_then_runs_both_ways():
    from gpulab.lessons.l08_cuda_streams import CopyAndMatmul
    job = CopyAndMatmul.make(4, 512)
    assert job.host.is_pinned() and "exact" in job.check()
    job.run(overlap=True)
    torch.cuda.synchronize()
    assert torch.equal(job.dev.cpu(), job.host)


def test_config_holds_the_headline_sizes():
    from gpulab.lessons.l08_cuda_streams import config
    assert config("full")["copy_mib"] == 256 and config("full")["matmul_n"] == 8192     # notebook 08's H200 figures
    assert config("tiny")["matmul_n"] < config("full")["matmul_n"]


def test_matmul_n_for_makes_the_product_as_long_as_the_copy():
    from gpulab.lessons.l08_cuda_streams import matmul_n_for
    n = matmul_n_for(256, h2d_gbps=55.0, matmul_tflops=686.0, lo=256, hi=1 << 20)
    copy_s = 256 * 2**20 / 55e9
    assert n % 256 == 0
    assert 2 * n**3 / 686e12 == pytest.approx(copy_s, rel=0.1)
    # a slower GPU with a slower link gets a smaller product; the bounds hold
    assert matmul_n_for(256, 12.0, 30.0) < n
    assert matmul_n_for(256, 1.0, 1e6, lo=256, hi=4096) == 4096
    assert matmul_n_for(1, 1e6, 1.0, lo=512, hi=4096) == 512


def test_sized_keeps_the_config_off_a_gpu():
    from gpulab.lessons.l08_cuda_streams import config, sized
    got = sized("full")
    assert got["matmul_n"] == config("full")["matmul_n"] and "no ceilings" in got["sized_from"]
