"""Reference answers to notebook 08's free-text exercises (CUDA streams). CUDA streams do not exist on the CPU
(`torch.cuda.Stream` needs CUDA), so every answer here needs a GPU; speed claims are judged at full size only,
where the kernels are long enough for launch overhead not to hide them."""
from __future__ import annotations

from gpulab.exercises.answers import Answer


def _job(scale: str, mib: int | None = None, n: int | None = None):
    """The notebook's job (section 2): `CopyAndMatmul.make(mib, n, half, device)` at `sized(scale)`'s sizes."""
    from gpulab.core.device import pick_device
    from gpulab.lessons.l08_cuda_streams import CopyAndMatmul, sized
    from gpulab.models.precision import half_dtype
    cfg = sized(scale)
    return CopyAndMatmul.make(mib or cfg["copy_mib"], n or cfg["matmul_n"], half_dtype(), pick_device())


def _ms(fn) -> float:
    from gpulab.core.timing import benchmark
    return benchmark(fn).median_ms


def _ex1(scale: str) -> dict:
    import torch
    from gpulab.core.memory import memory_guard
    out: dict = {"scale": scale}
    with memory_guard(quiet=True):
        trial = _job(scale)
        trial.check()
        for o in (False, True):
            out[f"pinned, {'overlapped' if o else 'serial'} ms"] = _ms(lambda o=o: trial.run(o))
        trial.host = torch.empty(trial.host.shape).copy_(trial.host)       # the exercise's edit
        out["host pinned after the edit"] = trial.host.is_pinned()
        out["check after the edit"] = trial.check()                       # raises if a result differs
        for o in (False, True):
            out[f"pageable, {'overlapped' if o else 'serial'} ms"] = _ms(lambda o=o: trial.run(o))
        del trial
    for h in ("pinned", "pageable"):
        out[f"{h}: overlapped / serial"] = out[f"{h}, overlapped ms"] / out[f"{h}, serial ms"]
    return out


def _expect1(f: dict) -> str | None:
    if f["host pinned after the edit"]:
        return "the new host tensor is still pinned"
    if f["scale"] != "full":
        return None
    if not f["pageable, overlapped ms"] > f["pinned, overlapped ms"]:
        return "the overlapped run from pageable memory was not slower than from pinned memory"
    if not f["pageable: overlapped / serial"] > f["pinned: overlapped / serial"]:
        return "the overlap hid as large a share of the serial time from pageable memory as from pinned"
    return None


def _ns(scale: str) -> list[int]:
    from gpulab.lessons.l08_cuda_streams import config
    if scale != "full":
        return [256, 512, 1024, 2048]
    cfg = config("full")
    ns, n = [], float(cfg["min_n"])
    while n <= cfg["max_n"]:
        ns.append(int(round(n / 256) * 256))
        n *= 2 ** 0.5
    return sorted(set(ns))


def _ex2(scale: str) -> dict:
    import torch
    from gpulab.core.memory import memory_guard
    from gpulab.lessons.l08_cuda_streams import config, matmul_n_for, predict_overlap
    mib = config(scale)["copy_mib"]            # 256 MiB at full size
    ns = _ns(scale)
    rows = {}
    with memory_guard(quiet=True):
        for n in ns:
            trial = _job(scale, mib, n)
            trial.check()
            rows[n] = {"serial": _ms(lambda: trial.run(False)), "overlapped": _ms(lambda: trial.run(True)),
                       "copy": _ms(lambda: trial.dev.copy_(trial.host, non_blocking=True)),
                       "matmul": _ms(lambda: torch.mm(trial.a, trial.b, out=trial.out))}
            del trial
    saving = {n: r["serial"] - r["overlapped"] for n, r in rows.items()}
    top = max(saving.values())
    knee = next(n for n in ns if saving[n] >= 0.9 * top)
    copy_ms = sorted(r["copy"] for r in rows.values())[len(rows) // 2]
    gbps = mib * 2**20 / (copy_ms * 1e6)
    tflops = 2 * ns[-1] ** 3 / (rows[ns[-1]]["matmul"] * 1e9)
    predicted_knee = matmul_n_for(mib, gbps, tflops, ns[0], ns[-1])
    worst = max(abs(r["overlapped"] / predict_overlap(r["copy"], r["matmul"])["overlapped_ms"] - 1)
                for r in rows.values())
    out: dict = {"scale": scale, "copy MiB": mib, "n tried": " ".join(map(str, ns))}
    for n in ns:
        out[f"n={n}: serial / overlapped ms"] = f"{rows[n]['serial']:.3f} / {rows[n]['overlapped']:.3f}"
    out.update({"n where the saving stops growing (90% of its largest)": knee,
                "predicted n (matmul as long as the copy, measured rates)": predicted_knee,
                "measured / predicted n": knee / predicted_knee,
                "worst |measured / predict_overlap - 1| of the overlapped time": worst,
                "overlapped never above serial": all(r["overlapped"] <= 1.05 * r["serial"] for r in rows.values()),
                "smallest n": ns[0], "largest n": ns[-1]})
    return out


def _expect2(f: dict) -> str | None:
    if f["scale"] != "full":
        return None
    if not f["overlapped never above serial"]:
        return "at some n the overlapped run took longer than the serial one"
    if not f["smallest n"] < f["predicted n (matmul as long as the copy, measured rates)"] < f["largest n"]:
        return None         # the predicted n lies at an end of the panel's range: no knee inside it to compare
    if not 0.5 <= f["measured / predicted n"] <= 2:
        return "the saving stopped growing more than a factor 2 away from where matmul time equals copy time"
    return None


def _chunked(job, chunks: int = 4) -> None:
    """The copy in `chunks` pieces on the copy stream, the product in as many row blocks on the current stream,
    block i waiting only for chunk i (an event recorded after each chunk's copy)."""
    import torch
    current = torch.cuda.current_stream()
    job.copy_stream.wait_stream(current)          # dev is not still being read by earlier work
    ready = []
    with torch.cuda.stream(job.copy_stream):
        for src, dst in zip(job.host.chunk(chunks), job.dev.chunk(chunks)):
            dst.copy_(src, non_blocking=True)
            event = torch.cuda.Event()
            event.record(job.copy_stream)
            ready.append(event)
    for event, rows, out_rows in zip(ready, job.a.chunk(chunks), job.out.chunk(chunks)):
        current.wait_event(event)                  # this block's chunk has arrived
        torch.mm(rows, job.b, out=out_rows)
    current.wait_stream(job.copy_stream)           # the join, as copy_then_compute's


def _ex3(scale: str) -> dict:
    import torch
    from gpulab.core.memory import memory_guard
    out: dict = {"scale": scale}
    with memory_guard(quiet=True):
        job = _job(scale)
        job.check()
        job.run(overlap=False)
        serial_out = job.out.clone()
        job.dev.zero_()
        job.out.zero_()
        _chunked(job)
        out["copy exact"] = torch.equal(job.dev.cpu(), job.host)
        out["product matches the serial one"] = torch.allclose(job.out, serial_out, rtol=1e-2, atol=1e-2)
        out["serial ms"] = _ms(lambda: job.run(False))
        out["overlapped, one piece ms"] = _ms(lambda: job.run(True))
        out["4 chunks ms"] = _ms(lambda: _chunked(job))
        del job, serial_out
    out["4 chunks / serial"] = out["4 chunks ms"] / out["serial ms"]
    return out


def _expect3(f: dict) -> str | None:
    if not f["copy exact"]:
        return "the chunked copy left other data than the host tensor"
    if not f["product matches the serial one"]:
        return "the row-block product differs from the serial one"
    if f["scale"] == "full" and not f["4 chunks ms"] < f["serial ms"]:
        return "the chunked version was not faster than copy-then-multiply on one stream"
    return None


def _run_k(fn, xa, xb, two_streams: bool, streams, k: int):
    """Section 8's run_k: k calls of fn on each input, on the current stream or half on each of two streams."""
    import torch
    if not two_streams:
        outs = []
        for _ in range(k):
            outs = [fn(xa), fn(xb)]
        return outs
    s1, s2 = streams
    cur = torch.cuda.current_stream()
    s1.wait_stream(cur)
    s2.wait_stream(cur)
    with torch.cuda.stream(s1):
        for _ in range(k):
            oa = fn(xa)
    with torch.cuda.stream(s2):
        for _ in range(k):
            ob = fn(xb)
    cur.wait_stream(s1)
    cur.wait_stream(s2)
    oa.record_stream(cur)
    ob.record_stream(cur)
    return [oa, ob]


def _ex4(scale: str) -> dict:
    import torch
    from gpulab.core.device import device_facts, pick_device
    from gpulab.core.memory import memory_guard
    from gpulab.lessons.l08_cuda_streams import config
    device = pick_device()
    cols, k = config(scale)["softmax_cols"], 4
    sms = device_facts(device).sm_count or 8
    counts = sorted({8, max(8, sms // 4), sms, 2 * sms})      # rows around this GPU's (or slice's) SM count
    out: dict = {"scale": scale, "SMs": sms}
    agree = True
    streams = (torch.cuda.Stream(device), torch.cuda.Stream(device))

    def fn(t):
        return t.softmax(dim=1)

    with memory_guard(quiet=True):
        for rows in counts:
            shape = (rows, max(1, 8 * cols // rows))               # the bytes of section 8's 8-row softmax
            xa, xb = torch.randn(shape, device=device), torch.randn(shape, device=device)
            one = _run_k(fn, xa, xb, False, streams, k)
            two = _run_k(fn, xa, xb, True, streams, k)
            agree = agree and all(torch.allclose(o2, o1, rtol=1e-2, atol=1e-5) for o1, o2 in zip(one, two))
            del one, two
            t1 = _ms(lambda: _run_k(fn, xa, xb, False, streams, k))
            t2 = _ms(lambda: _run_k(fn, xa, xb, True, streams, k))
            out[f"{rows} rows: speed-up on two streams"] = t1 / t2
            del xa, xb
    out["two streams give the one-stream results"] = agree
    out["rows tried"] = counts
    helped = [r for r in counts if out[f"{r} rows: speed-up on two streams"] >= 1.15]
    out["most rows where two streams gained >= 15%"] = max(helped) if helped else "none"
    return out


def _expect4(f: dict) -> str | None:
    if not f["two streams give the one-stream results"]:
        return "the softmaxes on two streams gave other results than on one"
    if f["scale"] != "full":
        return None
    most = max(f["rows tried"])
    narrow, wide = f["8 rows: speed-up on two streams"], f[f"{most} rows: speed-up on two streams"]
    if not narrow > 1.0:
        return f"8-row softmaxes ran no faster on two streams ({narrow:.2f}x)"
    if not wide < narrow:
        return (f"{most} rows, twice this GPU's {f['SMs']} SMs, gained as much from a second stream "
                f"({wide:.2f}x) as 8 rows ({narrow:.2f}x)")
    return None


def _ex5(scale: str) -> dict:
    import torch
    from gpulab.core.memory import memory_guard
    out: dict = {"scale": scale}
    with memory_guard(quiet=True):
        job = _job(scale)
        job.check()
        out["copy alone ms"] = _ms(lambda: job.dev.copy_(job.host, non_blocking=True))
        out["matmul alone ms"] = _ms(lambda: torch.mm(job.a, job.b, out=job.out))
        out["joined ms"] = _ms(lambda: job.run(overlap=True))
        out["join=False ms"] = _ms(lambda: job.run(overlap=True, join=False))
        torch.cuda.synchronize()
        end = torch.cuda.Event()
        job.run(overlap=True, join=False)
        end.record()                    # where the timing's end event goes: on the current stream
        end.synchronize()
        out["copy still running when the end event passed"] = not job.copy_stream.query()
        torch.cuda.synchronize()
        del job
    out["join=False / matmul alone"] = out["join=False ms"] / out["matmul alone ms"]
    return out


def _expect5(f: dict) -> str | None:
    if f["scale"] != "full":
        return None
    if not f["join=False / matmul alone"] <= 1.25:
        return "without the join the timing measured more than the matmul"
    if f["copy alone ms"] > 1.25 * f["matmul alone ms"] and not f["join=False ms"] < 0.9 * f["joined ms"]:
        return "with a copy longer than the matmul, leaving out the join did not shorten the measured time"
    return None


ANSWERS = [
    Answer("08", 1, run=_ex1, expect=_expect1, needs="cuda", text=(
        "Replace the pinned host tensor with a pageable copy (`is_pinned()` is then False; `check` still "
        "passes) and time serial and overlapped again. The overlapped time climbs to about the serial one: "
        "a copy from pageable memory is staged by the CPU through a pinned buffer, and `non_blocking=True` "
        "returns only once the data is staged, so the matmul is queued after the copy has nearly finished and "
        "there is nothing left to hide it under (CUDA Runtime API docs, 'API synchronization behavior'). On a "
        "GPU at full size the run checks that the pageable overlap is slower and hides a smaller share.")),
    Answer("08", 2, run=_ex2, expect=_expect2, needs="cuda", text=(
        "Keep mib = 256 and step n up (the run uses about sqrt(2) steps from 2048 to 16384), timing each with "
        "the overlap on and off. Overlapped time stays at the copy's time while the matmul is shorter, then "
        "grows with the matmul; the saving, serial minus overlapped, grows until the matmul takes as long as "
        "the copy and then stays at the copy's time. `predict_overlap(copy_ms, matmul_ms)` says the same, "
        "and `matmul_n_for` gives the n where the two times are equal; on a GPU at full size the run checks "
        "that the measured n is within a factor 2 of it.")),
    Answer("08", 3, run=_ex3, expect=_expect3, needs="cuda", text=(
        "On the copy stream copy `host.chunk(4)` into `dev.chunk(4)`, recording a `torch.cuda.Event` after "
        "each; on the default stream, before multiplying row block i of `a` (`a.chunk(4)[i] @ b` into "
        "`out.chunk(4)[i]`), call `wait_event` on chunk i's event; join at the end. Block 0 starts as soon as "
        "chunk 0 has arrived, so only a quarter of the copy is exposed, as a prefetching data loader exposes "
        "only the first batch's copy. The run checks that the copy is exact and the product matches the "
        "serial one, and on a GPU at full size that it beats copy-then-multiply on one stream.")),
    Answer("08", 4, run=_ex4, expect=_expect4, needs="cuda", text=(
        "Run section 8's softmax with 8 rows, a quarter of this GPU's SM count, the SM count and twice it, "
        "over the same bytes (the run keeps rows x cols fixed). PyTorch's softmax over long rows gives each row one thread block, so a kernel fills at most "
        "`rows` SMs (times the blocks an SM holds at once); a second stream helps while one kernel leaves SMs "
        "idle and stops helping once the rows reach about the GPU's SM count "
        "(`gpulab.core.device.device_facts().sm_count`, which under a MIG slice is the slice's: 40 on a T4, "
        "132 on an H200, NVIDIA's datasheets). The run checks the results agree and, on a GPU at full size, "
        "that twice the SM count gains less than 8 rows.")),
    Answer("08", 5, run=_ex5, expect=_expect5, needs="cuda", text=(
        "With `join=False` the current stream never waits for the copy stream, so `benchmark`'s end event, "
        "recorded on the current stream, fires when the matmul is done, whether or not the copy is: the "
        "number is the matmul's time, and the copy's is missing from it, not saved. It is also unsafe: "
        "anything queued after the call on the current stream may read `dev` before the copy lands. The run "
        "times both and the matmul alone, and reports whether the copy was still running when the end event "
        "passed; on a GPU at full size it checks that the join=False time is about the matmul alone.")),
]
