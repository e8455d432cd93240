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
