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
from gpulab.core.predict import Plan, Work
from gpulab.core.timing import benchmark
from gpulab.models.precision import half_dtype

# -- knobs ------------------------------------------------------------------------------------------
TITLE = "CUDA streams"
HEADLINE = "copy + matmul, overlapped / serial ms"      # the metric bands.toml judges
CONFIG = {
    # copy_mib: the pinned host->device copy; matmul_n: the 16-bit n x n matmul it hides under (the headline's
    # pair) where this GPU's ceilings are unknown; at full size on a GPU `sized` replaces it with the n whose
    # product takes as long as the copy (`matmul_n_for`), within [min_n, max_n];
    # softmax_cols: columns of section 8's softmaxes (8 rows of them, or 4096 rows of the same bytes)
    "tiny": dict(copy_mib=8, matmul_n=256, min_n=256, max_n=256, softmax_cols=1 << 14),
    "full": dict(copy_mib=256, matmul_n=8192, min_n=2048, max_n=16384, softmax_cols=1 << 22),
}


def config(scale: str | None = None) -> dict:
    """This lesson's knobs at a scale ('tiny' or 'full'; default: the course's, `GPULAB_SCALE`)."""
    return dict(CONFIG[resolve_scale(scale)])


def matmul_n_for(copy_mib: float, h2d_gbps: float, matmul_tflops: float, lo: int = 256, hi: int = 16384) -> int:
    """The n (a multiple of 256, within [lo, hi]) whose n x n product, 2 n^3 FLOPs at `matmul_tflops`,
    takes as long as copying `copy_mib` MiB at `h2d_gbps`: then the overlap has the most to hide."""
    copy_s = copy_mib * 2**20 / (h2d_gbps * 1e9)
    n = (copy_s * matmul_tflops * 1e12 / 2) ** (1 / 3)
    return int(min(max(round(n / 256) * 256, lo), hi))


def sized(scale: str | None = None) -> dict:
    """`config(scale)` with `matmul_n` sized to this GPU: at full size on a GPU whose pinned host->device
    and 16-bit matmul ceilings notebook 00 measured, the n of `matmul_n_for`, so copy and product take
    about the same time on a T4 as on an H200 (`sized_from` says which). Notebook 08 and `headline`."""
    cfg = config(scale)
    cfg["sized_from"] = "the config (no ceilings here)"
    if resolve_scale(scale) != "full" or not torch.cuda.is_available():
        return cfg
    from gpulab.core.ceilings import ceilings
    from gpulab.models.precision import best_half

    ceil = ceilings()
    h2d, mm = ceil.get("h2d_pinned"), ceil.get(f"matmul_{best_half()}")
    if h2d is not None and mm is not None and h2d.source.startswith("measured"):
        cfg["matmul_n"] = matmul_n_for(cfg["copy_mib"], h2d.value, mm.value, cfg["min_n"], cfg["max_n"])
        cfg["sized_from"] = f"this GPU's ceilings: {h2d.value:.1f} GB/s pinned, {mm.value:.0f} TFLOP/s {best_half()}"
    return cfg


def plan(scale: str | None = None) -> Plan:
    """What notebook 08 asks of the GPU at `scale` (gpulab.core.predict). By construction its product takes
    as long as its copy, so the copy's bytes stand for both: each timed copy+product pair is about two
    copies' time. Everything is timed with `benchmark`'s wall-clock budget (host time) except the
    warm-ups, the check and the timeline: about 20 pairs; the section-8 concurrency runs are budgeted too."""
    cfg = config(scale)
    pair_bytes = 2 * cfg["copy_mib"] * 2**20       # copy + a product of the same duration
    return Plan(host_s=HOST_S, work=[Work("h2d_pinned", 20 * pair_bytes, 1.0, "20 untimed copy+matmul pairs")],
                host_source=HOST_SOURCE)


HOST_S = 18.2    # seconds no GPU changes: the reference run below, less its GPU work
HOST_SOURCE = ("wall time of notebook 08 in results/course/2026-11-30-h200-00-to-09-at-775ae4a/h200-2026-11-30-course-timings.tsv (H200, torch 2.11, "
               "2026-11-30) minus its GPU work at that run's ceilings")

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
                      copy_stream: "torch.cuda.Stream | None" = None, join: bool = True) -> None:
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
    if join:                                  # join=False: notebook 08's exercise 5, the timing that goes wrong
        current.wait_stream(copy_stream)      # join: the copy is done before what follows


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

    def run(self, overlap: bool, join: bool = True) -> None:
        """One copy and one product, serial on the current stream or overlapped (`copy_then_compute`;
        `join=False` leaves out its `wait_stream`, notebook 08's exercise 5)."""
        copy_then_compute(self.host, self.dev, self.a, self.b, self.out, overlap, self.copy_stream, join=join)

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
    """A host->device copy and a matmul of `sized(scale)`'s sizes, serial on one stream and overlapped on
    two (`CopyAndMatmul`, as notebook 08 times it), in bf16 where native, else fp16; checked first."""
    try:
        device = require_cuda(NO_STREAMS)
    except ValueError as err:
        raise Skipped(str(err)) from None
    cfg = sized(scale)
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
