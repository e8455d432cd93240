"""Reference answers to notebook 05's free-text exercises (PCIe transfers)."""
from __future__ import annotations

from gpulab.exercises.answers import Answer

MiB = 2**20


def _ex1(scale: str) -> dict:
    from gpulab.core.memory import memory_guard
    from gpulab.lessons.l05_pcie_transfers import config, log_sizes, transfer_bandwidth
    cfg = config(scale)
    sizes = log_sizes(cfg["smallest_bytes"], cfg["largest_bytes"], per_octave=1)
    with memory_guard():
        gbps = [transfer_bandwidth(n, "h2d", pinned=True, budget_s=0.1)["GB/s"] for n in sizes]
    large = gbps[-1]
    half = next((n for n, g in zip(sizes, gbps) if g >= large / 2), sizes[-1])
    # section 2's formula: rate = n / (overhead + n / peak) is half the peak where n = overhead x peak
    return {"large-copy GB/s": large, "smallest rate GB/s": gbps[0], "first size at half the large rate (KiB)": half / 1024,
            "implied per-copy overhead (us)": half / (large * 1e9) * 1e6}


def _expect1(f: dict) -> str | None:
    if not f["smallest rate GB/s"] < f["large-copy GB/s"] / 2:
        return "the smallest copy already reached half the large-copy rate: no per-copy overhead shows"
    if not f["implied per-copy overhead (us)"] > 0:
        return "no positive overhead follows from the half-rate size"
    return None


def _batch_shape(scale: str) -> tuple[int, ...]:
    return (256, 3, 224, 224) if scale == "full" else (8, 3, 224, 224)


def _ex2(scale: str) -> dict:
    import math
    from gpulab.core.memory import memory_guard
    from gpulab.lessons.l05_pcie_transfers import transfer_bandwidth
    nbytes = math.prod(_batch_shape(scale)) * 4
    with memory_guard():
        rate = {p: transfer_bandwidth(nbytes, "h2d", pinned=p, budget_s=0.2)["GB/s"] for p in (False, True)}
    return {"batch": "x".join(map(str, _batch_shape(scale))) + " fp32", "MB": nbytes / 1e6,
            "pageable GB/s": rate[False], "pinned GB/s": rate[True],
            "pageable copy ms": nbytes / (rate[False] * 1e9) * 1e3, "pinned copy ms": nbytes / (rate[True] * 1e9) * 1e3}


def _expect2(f: dict) -> str | None:
    if not f["pinned copy ms"] < f["pageable copy ms"]:
        return "the pinned copy of the batch was not faster than the pageable one"
    return None


def _ex3(scale: str) -> dict:
    import math
    import torch
    from gpulab.core.device import pick_device
    device = pick_device()
    shape = _batch_shape(scale)
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)        # what a decoder gives
    on_host = images.float().div_(255)                   # converted first: 4 bytes an element cross the bus
    on_gpu = images.to(device).float().div_(255)         # sent as uint8: 1 byte an element, converted there
    back = on_gpu.cpu()
    # in units of fp32's rounding step at each value (one ulp): 0 where the two conversions agree exactly
    ulps = float(((back - on_host).abs() / torch.finfo(torch.float32).eps / on_host.abs().clamp_min(1e-30)).max())
    out = {"fp32 batch bytes": on_host.numel() * on_host.element_size(),
           "uint8 batch bytes": images.numel() * images.element_size(),
           "largest difference, in fp32 rounding steps": ulps, "identical": torch.equal(back, on_host),
           "elements": math.prod(shape)}
    out["times fewer bytes"] = out["fp32 batch bytes"] / out["uint8 batch bytes"]
    del on_gpu, on_host, images
    return out


def _expect3(f: dict) -> str | None:
    if not f["largest difference, in fp32 rounding steps"] <= 1.0:
        return (f"converting on the device differed from converting on the host by "
                f"{f['largest difference, in fp32 rounding steps']:.3g} fp32 rounding steps, more than one")
    if f["times fewer bytes"] != 4:
        return f"uint8 sent {f['times fewer bytes']}x fewer bytes, not 4x"
    return None


def _ex4(scale: str) -> dict:
    import torch
    from gpulab.core.memory import memory_guard
    from gpulab.lessons.l05_pcie_transfers import cpu_threads, log_sizes, pin_then_copy
    top = 256 * MiB if scale == "full" else 16 * MiB
    sizes = log_sizes(MiB, top)[::2]
    threads = sorted({1, 2, torch.get_num_threads()})
    out: dict = {}
    worst = float("inf")
    with memory_guard():
        for k in threads:
            beats = []
            for n in sizes:
                with cpu_threads(k):
                    r = pin_then_copy(n, budget_s=0.1)
                if r["pin_memory() + copy"] > r["pageable copy"]:
                    beats.append(n)
                worst = min(worst, r["pinned once, copy"] / r["pin_memory() + copy"])
            out[f"{k} threads: sizes (MiB) where pin+copy beats pageable"] = (
                " ".join(str(n // MiB) for n in beats) or "none")
    out["least (pinned once) / (pin_memory() + copy) rate"] = worst
    return out


def _expect4(f: dict) -> str | None:
    if not f["least (pinned once) / (pin_memory() + copy) rate"] > 0.95:
        return "pinning right before the copy was faster than copying from a buffer pinned once"
    return None


def _ex5(scale: str) -> dict:
    import torch
    from gpulab.core.device import pick_device
    from gpulab.core.timing import benchmark
    from gpulab.lessons.l05_pcie_transfers import config, random_bytes
    device = pick_device()
    nbytes = config(scale)["zero_page_bytes"]
    clock = "host" if device.type == "cuda" else "auto"      # on the CPU: the staging memcpy alone
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    out: dict = {"copy": "host->device, pageable" if device.type == "cuda" else "host->host (the staging memcpy; no bus)"}
    for name in ("untouched", "one byte per page", "random"):
        buf = random_bytes(nbytes) if name == "random" else torch.empty(nbytes, dtype=torch.uint8)
        if name == "one byte per page":
            buf[::4096] = 1
        dst.copy_(buf)
        if not torch.equal(dst.cpu(), buf):
            raise AssertionError(f"the copy of the {name} buffer produced different data")
        if name == "one byte per page":
            out["pages written, seen in the copy"] = int(dst[::4096].sum().item()) == -(-nbytes // 4096)
        out[f"{name} GB/s"] = benchmark(lambda: dst.copy_(buf), budget_s=0.2, device=device, clock=clock
                                        ).per_second(nbytes) / 1e9
    out["device"] = device.type
    return out


def _expect5(f: dict) -> str | None:
    import math
    if not f["pages written, seen in the copy"]:
        return "the copy did not carry the byte written to every page"
    if f["device"] != "cuda" or f["untouched GB/s"] < 1.3 * f["random GB/s"]:
        return None         # the rates are judged on a GPU, where the zero page makes a gap to close
    touched = f["one byte per page GB/s"]
    if not abs(math.log(touched / f["random GB/s"])) < abs(math.log(touched / f["untouched GB/s"])):
        return "with every page written the copy still ran nearer the untouched rate than the random one"
    return None


def _ex6(scale: str) -> dict:
    from gpulab.core.memory import memory_guard
    from gpulab.lessons.l05_pcie_transfers import config
    nbytes = config(scale)["largest_bytes"]
    with memory_guard():
        correct, t = _duplex(nbytes)       # its buffers are freed when it returns
    out = {"both copies correct": correct, "h2d alone GB/s": t["h2d"].per_second(nbytes) / 1e9,
           "d2h alone GB/s": t["d2h"].per_second(nbytes) / 1e9,
           "together, total GB/s": t["both"].per_second(2 * nbytes) / 1e9}
    out["together / faster alone"] = out["together, total GB/s"] / max(out["h2d alone GB/s"], out["d2h alone GB/s"])
    return out


def _duplex(nbytes: int):
    import torch
    from gpulab.core.device import pick_device
    from gpulab.core.timing import benchmark
    from gpulab.lessons.l05_pcie_transfers import random_bytes
    device = pick_device()
    up_src = random_bytes(nbytes).pin_memory()
    down_dst = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    up_dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    down_src = up_src.flip(0).to(device)
    s_up, s_down = torch.cuda.Stream(device), torch.cuda.Stream(device)
    main = torch.cuda.current_stream(device)

    def up():
        s_up.wait_stream(main)
        with torch.cuda.stream(s_up):
            up_dst.copy_(up_src, non_blocking=True)
        main.wait_stream(s_up)

    def down():
        s_down.wait_stream(main)
        with torch.cuda.stream(s_down):
            down_dst.copy_(down_src, non_blocking=True)
        main.wait_stream(s_down)

    def both():
        s_up.wait_stream(main)
        s_down.wait_stream(main)
        with torch.cuda.stream(s_up):
            up_dst.copy_(up_src, non_blocking=True)
        with torch.cuda.stream(s_down):
            down_dst.copy_(down_src, non_blocking=True)
        main.wait_stream(s_up)
        main.wait_stream(s_down)

    both()
    torch.cuda.synchronize(device)
    correct = torch.equal(up_dst.cpu(), up_src) and torch.equal(down_dst, down_src.cpu())
    t = {name: benchmark(fn, budget_s=0.3, device=device) for name, fn in (("h2d", up), ("d2h", down), ("both", both))}
    return correct, t


def _expect6(f: dict) -> str | None:
    if not f["both copies correct"]:
        return "a copy made alongside the other produced different data"
    if not f["together / faster alone"] > 1.0:
        return "the two directions together moved no more bytes per second than one alone: they did not overlap"
    return None


ANSWERS = [
    Answer("05", 1, run=_ex1, expect=_expect1, needs="cuda", text=(
        "Read the pinned host->device row of the section-3 sweep: find the first size whose rate is at least "
        "half of the largest copy's. Section 2's model, rate = n / (overhead + n / peak), is half the peak "
        "exactly where n = overhead x peak, so the per-copy overhead is that size divided by the large-copy "
        "rate. It is the fixed cost of the call, the driver and starting the DMA engine, paid by every copy "
        "whatever its size.")),
    Answer("05", 2, run=_ex2, expect=_expect2, needs="cuda", text=(
        "The batch is 256 x 3 x 224 x 224 x 4 bytes, about 154 MB; divide it by the pageable and the pinned "
        "large-copy rates of your sweep (the run copies it with `transfer_bandwidth`; the tiny run, 8 "
        "images). Set the two times beside the step time notebook 03 printed for its model: a pageable copy "
        "that takes a large share of a step is worth pinning and overlapping, and a blocking pageable copy "
        "keeps the host from queueing the next step too.")),
    Answer("05", 3, run=_ex3, expect=_expect3, text=(
        "Keep the decoded images as uint8, copy them (`images.to(device)`) and convert there "
        "(`.float().div_(255)`): each element crosses the bus as 1 byte instead of 4, so four times fewer "
        "bytes, and the conversion is a cheap elementwise kernel on the GPU. The run checks that converting "
        "on the device gives the host's values to within one fp32 rounding step: on a CUDA GPU PyTorch divides "
        "by a scalar as a multiplication by its reciprocal, which can round the last bit differently from the "
        "CPU's division ('identical' says whether it did here), far below anything a network can notice.")),
    Answer("05", 4, run=_ex4, expect=_expect4, needs="cuda", text=(
        "Call `pin_then_copy(n)` for n = 1, 4, 16, 64, 256 MiB, each inside `cpu_threads(k)` (which sets "
        "`torch.set_num_threads(k)` and restores it) for k = 1, 2 and all threads, and compare "
        "'pin_memory() + copy' with 'pageable copy'. pin_memory() is PyTorch's CPU copy spread over the "
        "intra-op threads, so with many threads and large copies it can beat the driver's one-thread staging; "
        "with one thread, or small copies where the fixed costs dominate, it loses. A buffer pinned once "
        "always beats pinning right before each copy, which the run checks.")),
    Answer("05", 5, run=_ex5, expect=_expect5, text=(
        "Make the buffer with `torch.empty`, write `buf[::4096] = 1` and time `gpu.copy_(buf)` with "
        "`benchmark(..., clock='host')` beside the untouched and the random buffer. Writing one byte per 4 KiB "
        "page gives every page its own physical memory, so the staging copy now reads DRAM, not the kernel's "
        "one shared zero page from cache: on a GPU it runs at about the random buffer's rate. The run checks "
        "that the copy carries the byte written to every page (on the CPU it times the host memcpy alone).")),
    Answer("05", 6, run=_ex6, expect=_expect6, needs="cuda", text=(
        "Issue a pinned host->device copy on one `torch.cuda.Stream` and a pinned device->host copy on "
        "another, and time the pair against each alone. PCIe is full duplex and most GPUs have a copy "
        "engine per direction, so the two overlap and the total rate exceeds either alone; how close it gets "
        "to the sum depends on the host's memory and root complex. The run checks both copies' data and that "
        "together they move more bytes per second than the faster one alone.")),
]
