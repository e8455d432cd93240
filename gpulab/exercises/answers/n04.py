"""Reference answers to notebook 04's free-text exercises (occupancy and waves)."""
from __future__ import annotations

from gpulab.exercises.answers import Answer

CCS = {"H200": (9, 0), "T4": (7, 5), "RTX 4090": (8, 9)}


def _ex1(scale: str) -> dict:
    from gpulab.lessons.l04_occupancy_and_waves import occupancy, sm_limits
    out = {}
    for name, cc in CCS.items():
        full = [r for r in range(0, 256) if occupancy(cc, 256, r).percent == 100.0]
        out[f"{name}: last register count at 100%"] = max(full)
        out[f"{name}: warps/SM"] = sm_limits(cc).max_warps
        out[f"{name}: occupancy % one register more"] = occupancy(cc, 256, max(full) + 1).percent
    return out


def _expect1(f: dict) -> str | None:
    from gpulab.lessons.l04_occupancy_and_waves import sm_limits
    for name, cc in CCS.items():
        r, warps = f[f"{name}: last register count at 100%"], f[f"{name}: warps/SM"]
        # every resident warp gets its registers (rounded up to 256 per warp) out of the 64 K of the SM
        if warps * -(-r * 32 // 256) * 256 > sm_limits(cc).registers:
            return f"{name}: {r} registers x {warps} warps would not fit in the register file"
        if f[f"{name}: occupancy % one register more"] >= 100.0:
            return f"{name}: one register more than {r} still gives 100%"
    if not f["T4: last register count at 100%"] > f["H200: last register count at 100%"]:
        return "the T4 does not tolerate more registers than the H200"
    return None


def _sweep(scale: str) -> dict:
    from gpulab.core.memory import memory_guard
    from gpulab.lessons.l04_occupancy_and_waves import BLOCK_SIZES, NUM_WARPS, bandwidth_elements, bandwidth_experiment
    n = bandwidth_elements(scale)
    configs = [(b, 4) for b in BLOCK_SIZES] + [(4096, w) for w in NUM_WARPS if w != 4]
    with memory_guard():
        return {c: bandwidth_experiment(*c, n=n) for c in configs}


def _ex2(scale: str) -> dict:
    runs = _sweep(scale)
    best = max(runs, key=lambda c: runs[c]["GB/s"])
    slowest = min(runs, key=lambda c: runs[c]["GB/s"])
    top_occ = max(r["occupancy %"] for r in runs.values())
    return {"fastest": f"BLOCK_SIZE {best[0]}, {best[1]} warps", "fastest GB/s": runs[best]["GB/s"],
            "fastest occupancy %": runs[best]["occupancy %"], "highest occupancy % in the sweep": top_occ,
            "fastest KiB in flight/SM": runs[best]["KiB in flight/SM"],
            "slowest": f"BLOCK_SIZE {slowest[0]}, {slowest[1]} warps", "slowest GB/s": runs[slowest]["GB/s"],
            "slowest occupancy %": runs[slowest]["occupancy %"],
            "slowest KiB in flight/SM": runs[slowest]["KiB in flight/SM"], "slowest spills": runs[slowest]["spills"]}


def _expect2(f: dict) -> str | None:
    if f["slowest KiB in flight/SM"] >= f["fastest KiB in flight/SM"] and f["slowest spills"] == 0:
        return (f"the slowest configuration had as many KiB in flight per SM as the fastest "
                f"({f['slowest KiB in flight/SM']:.0f} vs {f['fastest KiB in flight/SM']:.0f}) and no spills")
    return None


def _ex3(scale: str) -> dict:
    from gpulab.core.memory import memory_guard
    from gpulab.lessons.l04_occupancy_and_waves import WaveKernel
    with memory_guard():
        wave = WaveKernel(iters=512, block=4096, num_warps=4)       # compiles, checks its output
        sms, slots = wave.sms, wave.slots
        t = {p: wave.time(p).median_ms for p in (1, sms, sms + 1, slots, slots + 1)}
        del wave
    return {"SMs": sms, "programs per SM": slots // sms, "slots": slots, "1 program ms": t[1],
            "SMs programs ms": t[sms], "SMs+1 programs ms": t[sms + 1],
            "slots programs ms": t[slots], "slots+1 programs ms": t[slots + 1],
            "full wave / one program per SM": t[slots] / t[sms],
            "step at slots+1 (ratio)": t[slots + 1] / t[slots]}


def _expect3(f: dict) -> str | None:
    k = f["programs per SM"]
    if k < 2:
        return f"the calculator put {k} program per SM: not the co-resident case the exercise asks about"
    if not f["full wave / one program per SM"] > 1.5:
        return ("a full wave of co-resident programs took about as long as one program per SM: "
                "they did not share the SM's arithmetic")
    if not f["step at slots+1 (ratio)"] < 1.5:
        return f"one program past the calculator's wave still cost {f['step at slots+1 (ratio)']:.2f}x"
    return None


N_RANGE = list(range(8192, 8704 + 1, 64))


def _tiles(m: int, n: int) -> int:
    return -(-m // 128) * -(-n // 256)


def _ex4(scale: str) -> dict:
    import torch
    from gpulab.core.device import device_facts, pick_device
    from gpulab.core.timing import benchmark
    device = pick_device()
    sms = device_facts(device).sm_count or 132          # the CPU has no SMs: the H200's 132 for the arithmetic
    out: dict = {"SMs (132 = the H200's, on the CPU)": sms}
    waves = {n: -(-_tiles(8192, n) // sms) for n in N_RANGE}
    out["tile waves per N"] = " ".join(f"{n}:{w}" for n, w in waves.items())
    out["first N whose tiles need one more wave"] = next(
        (n for a, n in zip(N_RANGE, N_RANGE[1:]) if waves[n] > waves[a]), "none in the range")
    cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)
    div = 1 if device.type == "cuda" and scale == "full" else 32        # tiny: the same sweep at 1/32 the sizes
    dtype = torch.bfloat16 if device.type == "cpu" or cuda_bf16 else torch.float16
    m = 8192 // div
    a = torch.randn(m, m, device=device).to(dtype)
    times, errs = {}, []
    for n in N_RANGE:
        b = torch.randn(m, n // div, device=device).to(dtype)
        c = a @ b
        ref = a.float() @ b.float()
        errs.append((torch.linalg.norm(c.float() - ref) / torch.linalg.norm(ref)).item())
        times[n] = benchmark(lambda: a @ b, warmup=2, repeat=5, device=device).median_ms
        del c, ref
    out["sizes"] = f"{m} x N/{div} x {m}, {dtype}".replace("N/1 ", "N ")
    out["ms per N"] = " ".join(f"{n}:{t:.3g}" for n, t in times.items())
    out["largest relative error"] = max(errs)
    out["device"] = device.type
    return out


def _expect4(f: dict) -> str | None:
    if f["largest relative error"] > 2e-2:
        return f"a 16-bit product differed from the fp32 one by {f['largest relative error']:.1e} (> 2e-2)"
    sms = f["SMs (132 = the H200's, on the CPU)"]
    first = f["first N whose tiles need one more wave"]
    if first != "none in the range":
        prev = first - 64
        if -(-_tiles(8192, first) // sms) <= -(-_tiles(8192, prev) // sms):
            return f"N={first} does not need more waves of 128 x 256 tiles than N={prev}"
    return None


def _ex5(scale: str) -> dict:
    runs = _sweep(scale)
    top = max(r["occupancy %"] for r in runs.values())
    high = [c for c, r in runs.items() if r["occupancy %"] == top]
    low = [c for c, r in runs.items() if r["occupancy %"] < top]
    high_best = max(runs[c]["GB/s"] for c in high)
    low_best = max(low, key=lambda c: runs[c]["GB/s"]) if low else None
    out = {"highest occupancy %": top, "best GB/s at the highest occupancy": high_best,
           "configurations below it": len(low)}
    if low_best:
        out |= {"best lower-occupancy configuration": f"BLOCK_SIZE {low_best[0]}, {low_best[1]} warps",
                "its occupancy %": runs[low_best]["occupancy %"], "its GB/s": runs[low_best]["GB/s"],
                "its KiB in flight/SM": runs[low_best]["KiB in flight/SM"]}
    return out


def _expect5(f: dict) -> str | None:
    if not f["configurations below it"]:
        return "every configuration had the same occupancy: the sweep cannot separate occupancy from speed"
    if f["its GB/s"] < 0.9 * f["best GB/s at the highest occupancy"]:
        return ("every configuration with lower occupancy was more than 10% slower than the highest-occupancy "
                "ones: here occupancy did decide the speed")
    return None


ANSWERS = [
    Answer("04", 1, run=_ex1, expect=_expect1, text=(
        "In the calculator keep threads at 256 and raise registers until the occupancy drops below 100%, for "
        "cc 9.0, 7.5 and 8.9; the run does the same search with `occupancy()`. A block's registers come out "
        "of the same 64 K-register file on all three, but full occupancy means a different number of warps: "
        "64 per SM on Hopper, 48 on Ada, only 32 on Turing (the CUDA Programming Guide's compute-capability "
        "table). Fewer warps share the file, so each warp can have more of it: the T4 stays at 100% up to "
        "twice the H200's register count, but its 100% is half as many warps.")),
    Answer("04", 2, run=_ex2, expect=_expect2, needs="triton", text=(
        "Run the section-4 sweep (or each configuration in the panel) and sort by GB/s. The fastest is often "
        "not the highest-occupancy one: what a memory-bound kernel needs is enough loads in flight to cover "
        "the memory's latency (Little's law), and many elements per thread give that as well as many warps. "
        "The slow ones have few KiB in flight per SM (small blocks held back by the blocks-per-SM limit), "
        "or spill registers to local memory; the run checks that the slowest is one of those.")),
    Answer("04", 3, run=_ex3, expect=_expect3, needs="triton", text=(
        "Build the kernel and read `wave.occupancy`: with 4 warps a program, the SM holds many programs, so "
        "the calculator's wave is SMs x programs per SM. But co-resident programs share the SM's FMA units: "
        "a full wave takes several times as long as one program per SM, and the time grows about linearly "
        "with the programs each SM gets rather than in one jump. The step at the calculator's wave size is "
        "only the cost of one lone program, a small fraction of the wave: the big step of the original "
        "kernel appears only when one program fills an SM's arithmetic by itself.")),
    Answer("04", 4, run=_ex4, expect=_expect4, text=(
        "Time `a @ b` with a 8192 x 8192 and b 8192 x N in bf16 (fp16 where the GPU has no native bf16) with "
        "`benchmark`, for each N; the tiny run does the same sweep at 1/32 of the sizes, where no steps show. "
        "With 128 x 256 tiles the output has 64 x ceil(N/256) tiles, and the run lists how many waves of the "
        "SM count each N needs and the first N that needs one more. On a GPU the time tends to rise at those "
        "N, but cuBLAS picks its tile shape per size (and on Hopper can split the work, stream-K), so the "
        "steps can be blurred or moved: the measured times, not the tile model, are the answer.")),
    Answer("04", 5, run=_ex5, expect=_expect5, needs="triton", text=(
        "Low occupancy is a problem only when it leaves too little work in flight: too few bytes requested "
        "to cover memory latency for a memory-bound kernel, or too few independent instructions for the "
        "arithmetic units. The run compares the highest-occupancy configurations of the section-4 sweep "
        "with the best of the lower-occupancy ones, which keeps up by having more elements per thread. To "
        "tell, measure achieved bandwidth or FLOP/s against notebook 00's ceilings (and the profiler's "
        "stall reasons); occupancy alone is a reason to look, not a diagnosis.")),
]
