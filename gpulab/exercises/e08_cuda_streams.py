"""Notebook 08's graded exercise: chunks copied to the GPU and computed on, all on one stream.

A batch arrives in pinned host memory as CHUNKS chunks; each goes through LAYERS 16-bit products on the GPU. On
one stream the copy engine and the SMs take turns: chunk i's products wait for its copy, and chunk i+1's copy
waits for chunk i's products. With the copies on a side stream, chunk i+1 crosses the bus while chunk i is
multiplied (`wait_stream` before a chunk is read, `record_stream` so its memory is not reused while the
current stream still reads it): the call takes about max(copies, products) instead of their sum.

Sizing at full size, from this GPU's ceilings: the width d is chosen so that a chunk's LAYERS products
(2 d^2 FLOP a row each) take as long as its copy (2 d bytes a row in 16-bit) at this GPU's 16-bit matmul rate
and pinned host->device bandwidth, d = rate / (bandwidth x LAYERS); the rows so that a chunk's copy takes
CHUNK_MS. Both ceilings come from notebook 00 (the bandwidth, where notebook 00 has not run, from a short probe
here; the matmul rate from the datasheet).

Measured on an H200 (2026-12-04, torch 2.11; d 4608, 2944 rows a chunk, 207 MiB a call, 54 GB/s probed): the
reference 1.45x (IQR 0.03; 10.3 ms on one stream, 7.0 ms on two), the target 1.23x. Predicted: about 1.6-1.8x on an
H200 and on a T4. With copy and
compute per chunk equal (c each), one stream takes 2 c a chunk and two streams c a chunk plus one exposed copy:
CHUNKS 2 c / ((CHUNKS + 1) c) = 1.78x for 8 chunks; a datasheet matmul rate higher than the one reached makes
the products longer than the copies, which lowers it a little. A one-copy-engine GPU (a T4) overlaps a
host->device copy with kernels just as well: the gain does not depend on the GPU's speed.

The chunks come as a list (a Python list of pinned tensors): the grader clones each tensor argument before a
call, and a clone of a pinned tensor is not pinned (PyTorch's `Tensor.options()` drops the flag), so a tensor
argument would arrive pageable and no copy from it could overlap anything.
"""
from __future__ import annotations

import time

import torch

from gpulab.exercises.task import Runner, Task, Workload, matmul_rate
from gpulab.models.precision import best_half, half_dtype

LAYERS = 4          # 16-bit products per chunk
CHUNKS = 8          # chunks per call
CHUNK_MS = 0.5      # a chunk's copy at full size


def copy_and_compute(chunks, w):
    """The code as given: each chunk is copied to the GPU, then multiplied LAYERS times by w (with a ReLU), all
    on the current stream: the copy engine and the SMs take turns. Returns each chunk's column means."""
    means = []
    for chunk in chunks:
        h = chunk.to(w.device, non_blocking=True)
        for _ in range(LAYERS):
            h = torch.relu(h @ w)
        means.append(h.float().mean(0))
    return torch.stack(means)


def copy_and_compute_overlapped(chunks, w):
    """The lesson's fix: chunk i+1 is copied on a side stream while chunk i is multiplied on the current one.
    Before a chunk is read the current stream waits for its copy (`wait_stream`); `record_stream` keeps the
    allocator from handing its memory (allocated on the side stream) to the next copy while the current stream
    still reads it. On the CPU (no streams) the plain loop."""
    if w.device.type != "cuda":
        return copy_and_compute(chunks, w)
    current, side = torch.cuda.current_stream(), torch.cuda.Stream()
    side.wait_stream(current)
    with torch.cuda.stream(side):
        ahead = chunks[0].to(w.device, non_blocking=True)
    means = []
    for i in range(len(chunks)):
        current.wait_stream(side)                 # chunk i has arrived
        h = ahead
        h.record_stream(current)                  # read on the current stream: not freed before it is done
        if i + 1 < len(chunks):
            with torch.cuda.stream(side):         # chunk i+1 crosses the bus while chunk i is multiplied
                ahead = chunks[i + 1].to(w.device, non_blocking=True)
        for _ in range(LAYERS):
            h = torch.relu(h @ w)
        means.append(h.float().mean(0))
    return torch.stack(means)


def h2d_pinned_gbps(device: torch.device) -> tuple[float, str]:
    """This GPU's pinned host->device bandwidth: notebook 00's measurement, else a short probe (64 MiB copies)."""
    from gpulab.core.ceilings import ceilings
    c = ceilings().get("h2d_pinned")
    if c is not None:
        return c.value, c.source
    host = torch.empty(64 * 2**20, dtype=torch.uint8).pin_memory()
    dev = torch.empty(host.shape, dtype=torch.uint8, device=device)
    dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(5):
        dev.copy_(host, non_blocking=True)
    torch.cuda.synchronize(device)
    return 5 * host.numel() / (time.perf_counter() - t0) / 1e9, "probed here (notebook 00 has not measured it)"


def build(scale: str, device: torch.device):
    dtype = half_dtype() if device.type == "cuda" else torch.bfloat16
    if scale == "full" and device.type == "cuda":
        gbps, bw_source = h2d_pinned_gbps(device)
        tflops, mm_source = matmul_rate(device, best_half())
        tflops = tflops or 100.0
        d = int(min(8192, max(512, round(tflops * 1e12 / (gbps * 1e9 * LAYERS) / 128) * 128)))
        rows = int(max(256, round(CHUNK_MS / 1e3 * gbps * 1e9 / (2 * d) / 128) * 128))
        why = (f"{best_half()} products as long as the copies: {tflops:.0f} TFLOP/s ({mm_source}), "
               f"{gbps:.1f} GB/s pinned ({bw_source}); a chunk's copy ~{CHUNK_MS:g} ms")
    else:
        d, rows, why = 64, 32, "tiny"

    def draw(gen):           # drawn where the generator lives (the GPU), then the chunks go to pinned host memory
        chunks = [torch.randn(rows, d, generator=gen, device=gen.device).to(dtype) for _ in range(CHUNKS)]
        return chunks, (torch.randn(d, d, generator=gen, device=gen.device) / d**0.5).to(dtype)

    def to_device(inputs):
        chunks, w = inputs
        if device.type == "cuda":
            chunks = [torch.empty(c.shape, dtype=c.dtype, pin_memory=True).copy_(c) for c in chunks]
        return chunks, w.to(device)
    return Workload(instantiate=lambda fn: Runner(call=lambda inputs: fn(*inputs)), draw=draw, to_device=to_device,
                    rtol=2e-4, atol=1e-5,     # the same kernels on the same data: only a changed computation differs
                    sizes={"chunks": CHUNKS, "rows": rows, "d": d, "layers": LAYERS, "dtype": str(dtype),
                           "MiB copied a call": round(CHUNKS * rows * d * 2 / 2**20, 1), "sized by": why})


TASKS = [Task(
    name="08.streams", lesson="08", title="chunks copied and computed on one stream", tier="systems",
    slow=copy_and_compute, reference=copy_and_compute_overlapped, build=build,
    what=("copy_and_compute(chunks, w) copies each chunk of a batch (a list of pinned host tensors) to the GPU and "
          "multiplies it LAYERS times by w, all on the current stream, so the copies and the products take turns. "
          "Make the copy of the next chunk run while the current one is multiplied. Your function takes the same "
          "arguments and returns the same tensor; every copy and product must have finished, as seen from the "
          "current stream, when it returns."),
    hints=("While chunk i is being multiplied, what is the copy engine doing? Which stream is chunk i+1's copy "
           "queued on, and what must it wait for there?",
           "Queue chunk i+1's .to(device, non_blocking=True) on a torch.cuda.Stream() (with torch.cuda.stream(side)) "
           "before chunk i's products; before using a chunk call torch.cuda.current_stream().wait_stream(side), and "
           "chunk.record_stream(torch.cuda.current_stream()) on the copied tensor. Keep the plain loop when w is not "
           "on a GPU."),
)]
