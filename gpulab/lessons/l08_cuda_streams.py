"""Lesson 08, CUDA streams: overlap a host->device copy with compute, and draw what ran when.

Notebook 08 and `gpulab bench` share this module: its sizes (`CONFIG`, `config`) and `headline`, one
pinned host->device copy and one 16-bit matmul (`CopyAndMatmul`), timed serial on one stream and
overlapped on two.

- `predict_overlap`: serial = copy + compute; overlapped = max(copy, compute).
- `copy_then_compute`: the lesson's sequence, serial on one stream or overlapped on two,
  joined back to the current stream before it returns (so CUDA events on the current
  stream bracket all of it); `CopyAndMatmul`: its tensors, made once, and its check.
- `record_spans`: when each step started and ended on its stream (CUDA events per stream);
  the notebook draws them with `gpulab.core.plots.stream_timeline_plot`, one row per stream.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from gpulab.core.device import require_cuda, resolve_scale
from gpulab.core.measured import Measured, Skipped
from gpulab.core.timing import benchmark
from gpulab.models.precision import half_dtype

# -- knobs ------------------------------------------------------------------------------------------
TITLE = "CUDA streams"
HEADLINE = "copy + matmul, overlapped / serial ms"      # the metric bands.toml judges
CONFIG = {
    # copy_mib: the pinned host->device copy; matmul_n: the 16-bit n x n matmul it hides under (the headline's
    # pair); softmax_cols: columns of section 8's softmaxes (8 rows of them, or 4096 rows of the same bytes)
    "tiny": dict(copy_mib=8, matmul_n=256, softmax_cols=1 << 14),
    "full": dict(copy_mib=256, matmul_n=8192, softmax_cols=1 << 22),
}


def config(scale: str | None = None) -> dict:
    """This lesson's knobs at a scale ('tiny' or 'full'; default: the course's, `GPULAB_SCALE`)."""
    return dict(CONFIG[resolve_scale(scale)])


NO_STREAMS = "CUDA streams do not exist on the CPU"


def predict_overlap(copy_ms: float, compute_ms: float) -> dict[str, float]:
    """Back-of-envelope: one stream runs copy then compute; two streams run them side by side."""
    if copy_ms < 0 or compute_ms < 0:
        raise ValueError("times must be >= 0")
    serial = copy_ms + compute_ms
    overlapped = max(copy_ms, compute_ms)
    return {"serial_ms": serial, "overlapped_ms": overlapped,
            "saved_ms": serial - overlapped,
            "overlapped / serial": overlapped / serial if serial else 1.0}


def copy_then_compute(host: torch.Tensor, dev: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                      out: torch.Tensor, overlap: bool,
                      copy_stream: "torch.cuda.Stream | None" = None) -> None:
    """Copy `host` into `dev` and compute `out = a @ b`.

    Serial: both on the current stream, copy first. Overlapped: the copy on `copy_stream`,
    the matmul on the current stream; the current stream then waits for the copy stream,
    so anything queued after this call (the end event of a timing, a reader of `dev`) sees
    both results. `dev` and `out` are allocated once by the caller and live on, so no
    `record_stream` is needed here (notebook 08 shows when it is).
    """
    if not overlap:
        dev.copy_(host, non_blocking=True)
        torch.mm(a, b, out=out)
        return
    if copy_stream is None:
        raise ValueError("overlap=True needs a copy_stream")
    current = torch.cuda.current_stream()
    copy_stream.wait_stream(current)          # dev is not still being read by earlier work
    with torch.cuda.stream(copy_stream):
        dev.copy_(host, non_blocking=True)
    torch.mm(a, b, out=out)
    current.wait_stream(copy_stream)          # join: the copy is done before what follows


@dataclass
class CopyAndMatmul:
    """Notebook 08's two jobs, allocated once (so no `record_stream` is needed): a pinned host tensor
    of `mib` MiB copied into `dev`, and `out = a @ b`, n x n in `dtype`, on the device; `copy_stream`
    carries the copy when they overlap. Notebook 08 and `gpulab bench` both time `run`.

        job = CopyAndMatmul.make(config()["copy_mib"], config()["matmul_n"])
        job.check()                        # correct before fast
        benchmark(lambda: job.run(overlap=True))
    """

    host: torch.Tensor
    dev: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    out: torch.Tensor
    copy_stream: "torch.cuda.Stream"

    @classmethod
    def make(cls, mib: int, n: int, dtype: torch.dtype = torch.bfloat16, device: torch.device | None = None,
             seed: int = 0) -> "CopyAndMatmul":
        if mib < 1 or n < 1:
            raise ValueError(f"mib and n must be >= 1 (got mib={mib}, n={n})")
        device = require_cuda(NO_STREAMS, device)
        host = torch.randn(mib * 2**20 // 4, generator=torch.Generator().manual_seed(seed)).pin_memory()
        on_device = torch.Generator(device).manual_seed(seed)
        a = torch.randn(n, n, device=device, dtype=dtype, generator=on_device)
        b = torch.randn(n, n, device=device, dtype=dtype, generator=on_device)
        return cls(host, torch.empty(host.shape, device=device), a, b, torch.empty(n, n, device=device, dtype=dtype),
                   torch.cuda.Stream(device))

    def run(self, overlap: bool) -> None:
        """One copy and one product, serial on the current stream or overlapped (`copy_then_compute`)."""
        copy_then_compute(self.host, self.dev, self.a, self.b, self.out, overlap, self.copy_stream)

    def check(self) -> str:
        """Correct before fast: serial and overlapped each copy the host tensor exactly, and the two
        products agree (rtol and atol 1e-2: 16-bit). Raises AssertionError saying which differs."""
        self.dev.zero_()
        self.run(overlap=False)
        serial_out = self.out.clone()
        assert torch.equal(self.dev.cpu(), self.host), "the serial copy differs from the host tensor"
        self.dev.zero_()
        self.out.zero_()
        self.run(overlap=True)
        assert torch.equal(self.dev.cpu(), self.host), "the overlapped copy differs from the host tensor"
        torch.testing.assert_close(self.out, serial_out, rtol=1e-2, atol=1e-2,
                                   msg="the overlapped product differs from the serial one")
        return "copies exact; overlapped product within 1e-2 of the serial one"


@dataclass(frozen=True)
class Span:
    """One step on one stream: its start and end in ms from the start of the recording."""

    stream: str
    name: str
    start_ms: float
    end_ms: float

    @property
    def ms(self) -> float:
        return self.end_ms - self.start_ms


Step = tuple  # (stream label, step name, torch.cuda.Stream, fn)


def record_spans(steps: Sequence[Step]) -> list[Span]:
    """Run `steps` in order, each `fn()` queued on its stream, and time each with CUDA events
    recorded on that stream. Every stream first waits for a start event on the current
    stream; the current stream waits for all of them at the end. Returns the spans."""
    require_cuda(NO_STREAMS)
    current = torch.cuda.current_stream()
    base = torch.cuda.Event(enable_timing=True)
    base.record(current)
    streams = []
    for _, _, stream, _ in steps:
        if all(stream is not s for s in streams):
            streams.append(stream)
            stream.wait_event(base)
    marks = []
    for label, name, stream, fn in steps:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record(stream)
            fn()
            end.record(stream)
        marks.append((label, name, start, end))
    for stream in streams:
        current.wait_stream(stream)
    torch.cuda.synchronize()
    return [Span(label, name, base.elapsed_time(s), base.elapsed_time(e)) for label, name, s, e in marks]


def headline(scale: str | None = None) -> Measured:
    """A host->device copy and a matmul of `config(scale)`'s sizes, serial on one stream and overlapped on
    two (`CopyAndMatmul`, as notebook 08 times it), in bf16 where native, else fp16; checked first."""
    try:
        device = require_cuda(NO_STREAMS)
    except ValueError as err:
        raise Skipped(str(err)) from None
    cfg = config(scale)
    mib, n = cfg["copy_mib"], cfg["matmul_n"]
    job = CopyAndMatmul.make(mib, n, half_dtype(), device)
    try:
        said, correct = job.check(), True
    except AssertionError as err:
        said, correct = f"FAILED: {str(err).splitlines()[0]}", False
    serial = benchmark(lambda: job.run(overlap=False))
    overlapped = benchmark(lambda: job.run(overlap=True))
    del job
    return Measured(serial.median_ms, overlapped.median_ms, "ms", overlapped.median_ms / serial.median_ms,
                    correct, said, f"serial: copy {mib} MiB, then matmul n={n}", "overlapped on two streams")
