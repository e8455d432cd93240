"""Reference answers to notebook 02's free-text exercises (memory fragmentation and the caching allocator)."""
from __future__ import annotations

import contextlib
import math

import torch

from gpulab.core.device import device_facts, pick_device
from gpulab.core.memory import memory_guard
from gpulab.exercises.answers import Answer
from gpulab.lessons.l02_memory_fragmentation import run_in_fresh_process
from gpulab.models.step import train_step
from gpulab.models.transformer import TransformerStack, param_bytes

A_MIB = 40              # phase A's block size, the lesson's default
PAGE_MIB = 20           # an expandable segment maps large-pool memory in pages of kLargeBuffer = 20 MiB


def _cap(scale: str) -> int:
    """The cap section 2 uses (4096 MiB, or half the GPU's memory in 512 MiB steps where that is less);
    1024 MiB at tiny: the same pattern with fewer segments."""
    half = max(512, (device_facts().memory_bytes or 2**33) // 2**20 // 2 // 512 * 512)
    return min(4096 if scale == "full" else 1024, half)


def _count(cap_mib: int) -> int:
    """Phase A's tensors: as many as fill ~85% of the cap (section 2)."""
    return int(0.85 * cap_mib / A_MIB)


def _summary(res, prefix: str) -> dict:
    """A FragResult's figures at the moment of the big request, under `prefix`."""
    live_segments = sum(any(state == "live" for _, state in seg) for seg in res.layout)
    mixed = sum(any(s == "live" for _, s in seg) and any(s == "free" for _, s in seg) for seg in res.layout)
    return {f"{prefix}: big tensor fits": res.ok,
            f"{prefix}: allocated MiB": res.allocated_mib,
            f"{prefix}: reserved MiB": res.reserved_mib,
            f"{prefix}: free under the cap / request": res.free_in_cap_mib / res.big_mib,
            f"{prefix}: largest free block MiB": res.largest_free_block_mib,
            f"{prefix}: segments": res.segments,
            f"{prefix}: segments holding a live tensor": live_segments,
            f"{prefix}: segments holding a live tensor and a free block": mixed,
            f"{prefix}: cudaMalloc retries": res.num_alloc_retries}


# -- 1. phase B of 36 MiB and of 8 MiB --------------------------------------------------------------
def _ex1(scale: str) -> dict:
    cap = _cap(scale)
    out: dict = {"device": "cuda", "scale": scale, "cap MiB": cap, "A tensors": _count(cap),
                 "request MiB": int(0.4 * cap)}
    for b in (36, 8):
        out.update(_summary(run_in_fresh_process(cap_mib=cap, fix="none", b_mib=b), f"B {b} MiB"))
    out["B 8 MiB: tensors per A segment (40 // 8)"] = A_MIB // 8
    return out


def _expect1(f: dict) -> str | None:
    count = f["A tensors"]
    if f["B 36 MiB: big tensor fits"]:
        return "with B = 36 MiB the big tensor fitted: the live tensors left room for it"
    if f["B 36 MiB: free under the cap / request"] >= 1:
        return "with B = 36 MiB enough memory was free in total: the OOM is fragmentation, not a shortage"
    if abs(f["B 36 MiB: largest free block MiB"] - (A_MIB - 36)) > 0.5:
        return "with B = 36 MiB the largest free block is not the 4 MiB remainder of a split A segment"
    if not f["B 8 MiB: big tensor fits"]:
        return "with B = 8 MiB the big tensor still did not fit"
    packed = math.ceil(count / (A_MIB // 8))
    if f["B 8 MiB: segments holding a live tensor"] != packed:
        return (f"with B = 8 MiB the {count} tensors sit in {f['B 8 MiB: segments holding a live tensor']} "
                f"segments, not packed five to a segment ({packed})")
    if f["B 8 MiB: cudaMalloc retries"] < 1:
        return "with B = 8 MiB the big tensor fitted without the retry that releases the empty A segments"
    return None


# -- 2. max_split_size_mb:32 ------------------------------------------------------------------------
def _ex2(scale: str) -> dict:
    cap = _cap(scale)
    out: dict = {"device": "cuda", "scale": scale, "cap MiB": cap, "A tensors": _count(cap), "B MiB": 24}
    out.update(_summary(run_in_fresh_process(cap_mib=cap, fix="none"), "no setting"))
    res = run_in_fresh_process(cap_mib=cap, fix="none", alloc_conf="max_split_size_mb:32")
    out.update(_summary(res, "max_split_size_mb:32"))
    out["max_split_size_mb:32: segments that are one 24 MiB tensor"] = sum(
        len(seg) == 1 and seg[0][1] == "live" and abs(seg[0][0] - 24) < 0.5 for seg in res.layout)
    out["max_split_size_mb:32: allocator setting"] = res.alloc_conf
    return out


def _expect2(f: dict) -> str | None:
    p = "max_split_size_mb:32"
    if "max_split_size_mb:32" not in f[f"{p}: allocator setting"]:
        return "the child process did not start with max_split_size_mb:32"
    if f["no setting: big tensor fits"]:
        return "without the setting the big tensor fitted: the pattern did not fragment here"
    if not f[f"{p}: big tensor fits"]:
        return "with max_split_size_mb:32 the big tensor still did not fit"
    if f[f"{p}: segments holding a live tensor and a free block"] != 0:
        return "with max_split_size_mb:32 some segment was still split (a live tensor beside a free block)"
    if f[f"{p}: segments that are one 24 MiB tensor"] != f["A tensors"]:
        return "not every B tensor got a 24 MiB segment of its own"
    return None


# -- 3. phases of different shapes in a training script ------------------------------------------------
def _saved_for_backward(model: torch.nn.Module, x: torch.Tensor, grad: bool = True) -> tuple[int, int, bool]:
    """(bytes, largest tensor's bytes) of the activations the forward keeps for backward (parameters not
    counted; a storage saved twice counted once), and whether the output has a graph."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with contextlib.nullcontext() if grad else torch.no_grad():
            out = model(x)
    has_graph = out.requires_grad
    del out
    return sum(kept.values()), max(kept.values(), default=0), has_graph


def _ex3(scale: str) -> dict:
    device = pick_device()
    if device.type == "cpu":
        # one intra-op thread on the CPU: on a small shared machine two threads take turns, and a backward
        # pass of this tiny model jumps from milliseconds to most of a second; restored after
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return _phases(scale, device)
        finally:
            torch.set_num_threads(threads)
    return _phases(scale, device)


def _phases(scale: str, device: torch.device) -> dict:
    width, heads, seq, batch = (1024, 16, 1024, 8) if scale == "full" else (64, 4, 32, 4)
    out: dict = {"device": device.type, "scale": scale, "seq": seq}
    with memory_guard(quiet=True):
        torch.manual_seed(0)
        model = TransformerStack(2, width, heads, seq, device=device)
        # a changing sequence length: every activation is batch x seq x something
        for t in (seq, seq // 2):
            x = torch.randn(batch, t, width, device=device)
            total, largest, _ = _saved_for_backward(model, x)
            out[f"training forward, seq {t}: kept for backward (bytes)"] = total
            out[f"training forward, seq {t}: largest kept tensor (bytes)"] = largest
        out["kept bytes, seq / seq/2"] = (out[f"training forward, seq {seq}: kept for backward (bytes)"]
                                          / out[f"training forward, seq {seq // 2}: kept for backward (bytes)"])
        # validation: no graph, nothing kept; its tensors live for one operation each
        total, _, has_graph = _saved_for_backward(model, torch.randn(2 * batch, seq, width, device=device), grad=False)
        out["validation forward (no_grad, 2x batch): kept for backward (bytes)"] = total
        out["validation forward: output has a graph"] = has_graph
        # the optimizer's first step: Adam creates its state then, after backward has freed the activations
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        x, y = torch.randn(batch, seq, width, device=device), torch.randn(batch, seq, width, device=device)

        def state_bytes() -> int:
            return sum(v.numel() * v.element_size() for s in opt.state.values()
                       for k, v in s.items() if k in ("exp_avg", "exp_avg_sq"))

        out["parameter bytes"] = param_bytes(model)
        out["Adam state before step 1 (bytes)"] = state_bytes()
        train_step(model, x, y, optimizer=opt)
        out["Adam state after step 1 (bytes)"] = state_bytes()
        train_step(model, x, y, optimizer=opt)
        out["Adam state after step 2 (bytes)"] = state_bytes()
        out["Adam state tensors (exp_avg, exp_avg_sq) per parameter"] = (
            sum(k in ("exp_avg", "exp_avg_sq") for s in opt.state.values() for k in s)
            / sum(1 for _ in model.parameters()))
        del model, opt, x, y
    return out


def _expect3(f: dict) -> str | None:
    seq = f["seq"]
    ratio = f["kept bytes, seq / seq/2"]
    if not 1.9 <= ratio <= 4.1:
        return f"halving the sequence length changed the kept activations by {ratio:.2f}x, not 2x to 4x"
    big, small = (f[f"training forward, seq {t}: largest kept tensor (bytes)"] for t in (seq, seq // 2))
    if big < 1.9 * small:
        return "the largest kept tensor did not grow with the sequence length: the shapes did not change"
    if (f["validation forward (no_grad, 2x batch): kept for backward (bytes)"] != 0
            or f["validation forward: output has a graph"]):
        return "the forward under no_grad kept tensors for backward"
    if f["Adam state before step 1 (bytes)"] != 0:
        return "Adam held state before its first step"
    if f["Adam state after step 1 (bytes)"] != 2 * f["parameter bytes"]:
        return "Adam's first step did not create two parameter-sized tensors per parameter"
    if f["Adam state after step 2 (bytes)"] != f["Adam state after step 1 (bytes)"]:
        return "Adam's state changed size after the first step"
    return None


# -- 4. expandable segments: reserved before and after the request ------------------------------------
def _ex4(scale: str) -> dict:
    cap = _cap(scale)
    res = run_in_fresh_process(cap_mib=cap, fix="expandable_segments")
    need = res.allocated_mib + res.big_mib
    return {"device": "cuda", "scale": scale, "cap MiB": cap, "allocator setting": res.alloc_conf,
            "big tensor fits": res.ok, "allocated MiB (B tensors)": res.allocated_mib,
            "request MiB": res.big_mib, "reserved before the request MiB": res.reserved_mib,
            "reserved + request MiB (what the cap check compares)": res.reserved_mib + res.big_mib,
            "free mapped tail after B, before the request MiB": res.reserved_mib - res.allocated_mib,
            "reserved after the request MiB": res.reserved_after_mib,
            "allocated + request MiB": need,
            "allocated + request, in whole 20 MiB pages MiB": math.ceil(need / PAGE_MIB - 1e-9) * PAGE_MIB,
            "reserved after - (allocated + request) MiB": res.reserved_after_mib - need,
            "cudaMalloc retries": res.num_alloc_retries}


def _expect4(f: dict) -> str | None:
    if "expandable_segments:True" not in f["allocator setting"]:
        return "the child process did not start with expandable_segments"
    if not f["big tensor fits"]:
        return "with expandable_segments the big tensor did not fit"
    if f["reserved + request MiB (what the cap check compares)"] <= f["cap MiB"]:
        return "reserved + request was within the cap: the allocator had no reason to retry"
    if f["cudaMalloc retries"] < 1:
        return "the big tensor was mapped without a retry: nothing was unmapped first"
    extra = f["reserved after - (allocated + request) MiB"]
    if not -0.5 <= extra < PAGE_MIB:
        return (f"reserved after the request exceeds allocated + request by {extra:.1f} MiB, not by less than "
                f"one {PAGE_MIB} MiB page")
    return None


ANSWERS = [
    Answer("02", 1, run=_ex1, expect=_expect1, needs="cuda", text=(
        "Run `run_in_fresh_process(fix=\"none\", b_mib=36)` and `(..., b_mib=8)` and read 'free under the cap / "
        "request', the largest free block and the segments. With B = 36 MiB the OOM survives, but it is no longer "
        "fragmentation: as many 36 MiB tensors as A had 40 MiB ones hold about three quarters of the cap, so less "
        "than the 40% request is free even in total (each segment keeps a 4 MiB remainder; the ratio is below 1). "
        "With B = 8 MiB the big tensor fits: a request over 1 MiB goes to the large pool, where best fit takes "
        "the smallest cached block that holds it, which after the first split is that segment's 32 MiB "
        "remainder, so five B tensors pack into each A segment and most A segments stay empty; the big request "
        "passes the cap at first, and the allocator's retry releases those empty segments and succeeds. The "
        "10 MiB line does not decide it: it sets the size of a new segment (20 MiB for a 1-10 MiB request), "
        "and no new segment is needed here; what matters is whether A's remainder holds another B (b <= a/2). "
        "Needs a CUDA GPU: the caching allocator is CUDA's.")),
    Answer("02", 2, run=_ex2, expect=_expect2, needs="cuda", text=(
        "It changes the splitting rule. Cached blocks of 32 MiB or more become 'oversize': they are never split, "
        "and serve only requests of 32 MiB or more that they exceed by less than 20 MiB. A 24 MiB B request can "
        "no longer take a cached 40 MiB A segment, so it gets a 24 MiB segment of its own from cudaMalloc; where "
        "that would pass the cap, the allocator first frees one oversize cached block and tries again. A's "
        "segments stay whole and free, so at the big request the allocator releases them and the big tensor "
        "fits. The run compares with the plain run (OOM) and checks that no segment holds a live tensor beside "
        "a free block. It helps here because 32 lies between B's 24 and A's 40; the price is a cudaMalloc per "
        "B tensor and a cudaFree per released A segment (each synchronizes the device), and oversize cached "
        "blocks no longer serve smaller requests, so a training loop reuses its cache less.")),
    Answer("02", 3, run=_ex3, expect=_expect3, text=(
        "Validation every N steps: its forward runs under no_grad, keeps nothing for backward and often uses a "
        "larger batch, so its short-lived tensors have other sizes, carved out of the training step's cached "
        "blocks. A changing sequence length (dynamic padding, length bucketing, a curriculum): every activation "
        "is batch x seq x something, so a longer batch asks for blocks larger than any cached one, and a "
        "shorter one splits the longer one's blocks. The optimizer's first step: Adam creates exp_avg and "
        "exp_avg_sq, twice the parameters' bytes and long-lived, only then, just after backward freed the "
        "activations, so they split cached activation blocks: the notebook's phase B exactly. The run shows "
        "each on the course's TransformerStack: the bytes kept for backward halve with the sequence length "
        "(linear with fused attention), a no_grad forward keeps none, and Adam holds nothing before step 1 and "
        "exactly twice the parameter bytes after. Cures: run the longest shape first, pad to few lengths, or "
        "set expandable_segments.")),
    Answer("02", 4, run=_ex4, expect=_expect4, needs="cuda", text=(
        "Run `run_in_fresh_process(fix=\"expandable_segments\")` and compare reserved_mib (at the request) "
        "with reserved_after_mib. Phase A mapped 20 MiB pages into one segment's address range, and after A is "
        "freed they stay mapped as one free block; B's tensors are carved from its start, packed together. The "
        "request does not fit in the free tail, and the cap check compares reserved plus the whole request "
        "with the cap, which it passes, so the allocator retries (a cudaMalloc retry): it unmaps every whole "
        "page inside free blocks, the tail after B, then maps pages for the big tensor starting where B ends. "
        "What stays reserved is allocated + request rounded up to whole 20 MiB pages: the page holding B's "
        "last bytes stays mapped (the big tensor begins inside it) and the big tensor's end rounds up to a "
        "page, so it exceeds allocated + request by less than one page. Reserved after can be more than "
        "before: the tail was given back and more mapped. Needs a CUDA GPU with virtual memory management.")),
]
