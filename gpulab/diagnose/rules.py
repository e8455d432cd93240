"""The rules: which bottleneck is yours, and what fixing it is expected to buy.

Each rule is a small function `rule(facts) -> Verdict | None` that reads `Facts` (analyze.py) and fires
when its evidence crosses a threshold. Every threshold is a named constant with its reason.

A fired rule names two shares of the (unprofiled) step:

- `share`, the most its fix can remove: the time its cause took on the host's path (at most the GPU's
  idle time), or the time its kernels took beyond what the fastest kernel could do. The step can get at
  most `bound = 1 / (1 - share)` times faster (Amdahl's law): a ceiling, kept beside the estimate.
- `expected`, what the fix is expected to remove: the same where the fix removes the cause whole, less
  where it cannot (a 16-bit product still takes its FLOPs at the peak this GPU measured; a fused
  optimizer still reads and writes every parameter once).

Where a safe variant of the step can be run (TF32 or autocast, pinned staging, the same batch replayed),
`gpulab.diagnose.confirm` runs it and the verdict carries the measured gain; a verdict whose measured saving
is under half the expected saving is demoted, and says so. `run_rules(facts)` runs every rule (skipping,
with the reason, those that need a GPU when there is none) and `rank` orders what fired: by measured gain
(a demoted verdict by what it measured), else expected gain; a fix that pays only once another is made
("blocked_by": a synchronizing call such as `.item()` inside the model's forward splits the graphs
torch.compile captures, so it moves out first) comes right after that one, unless a measurement says otherwise
(a compiled model's CUDA graphs, made with its graph breaks left in, kept their promise: `model_variants.through_block`);
"compute_bound" and the other notes (what is left, not a fix) last.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from gpulab.core.memory import fmt_bytes
from gpulab.core.timing import GPU_PACED_MIN
from gpulab.diagnose.facts import Facts
from gpulab.diagnose.kernel_rules import (  # noqa: F401 - the GPU-side rules and their thresholds, re-exported
    ATTENTION_SHARE_MIN, COMM_EXPOSED_SHARE_MIN, COPY_EXPOSED_SHARE_MIN, ELEMENTWISE_SHARE_MIN, FP32_GEMM_SHARE_MIN,
    FUSED_PASSES, MISALIGNED_SHARE_MIN, NO_SYNC_SHARE_MIN, OPTIMIZER_SHARE_MIN, TRANSPOSE_SHARE_MIN,
    UNKNOWN_FLOPS_SAVING, attention_math, comm_not_overlapped, copy_not_overlapped, elementwise_unfused,
    fp32_matmuls, fused_fraction, layout_transposes, misaligned_gemm, no_sync_accumulation, optimizer_unfused)
from gpulab.diagnose.verdicts import (  # noqa: F401 - re-exported
    NOISE_FLOOR, PROMISE_KEPT_MIN, TIE, Verdict, demote, evidence_lines, judge_gain, pct, verdict)

# -- thresholds ------------------------------------------------------------------------------------
# A DataLoader wait of 5 % of the step or more: the TensorBoard PyTorch profiler plugin
# (torch_tb_profiler, RunProfile.analyze) recommends DataLoader workers when "X % of the step time is in
# DataLoader" exceeds 5 %; below it, tuning the pipeline buys too little to be worth a lesson.
INPUT_SHARE_MIN = 0.05
# The same 5 % for the other host-side causes whose fix is a line or two: a synchronization, a pageable
# copy, the allocator, the user's own Python, a periodic stall, an exposed copy, DataParallel.
SYNC_SHARE_MIN = 0.05
PAGEABLE_SHARE_MIN = 0.05
ALLOCATOR_SHARE_MIN = 0.05
HOST_CODE_SHARE_MIN = 0.05
STALL_SHARE_MIN = 0.05
DATA_PARALLEL_SHARE_MIN = 0.05
# Host-side launch overhead above 10 % of the step. The fix (CUDA graphs, torch.compile) changes how the
# step is built, so it must buy more than the one-line fixes above before it is suggested.
LAUNCH_SHARE_MIN = 0.10
# ...and only when the host launched most kernels one at a time: at least half as many launch calls as
# kernels. A step replayed from a CUDA graph (one cudaGraphLaunch for all its kernels) already has the
# fix; what idles it is the loop around it, not kernel launches.
LAUNCHES_PER_KERNEL_MIN = 0.5
# Graph breaks whose eager stretches take 5 % of the step, and CUDA graphs that inductor skipped while
# the host spends 5 % launching: both are found by reading compile's own reasons (TORCH_LOGS).
GRAPH_BREAK_SHARE_MIN = 0.05
CUDAGRAPH_SKIP_SHARE_MIN = 0.05
# Peak *allocated* memory at or above 90 % of what this process may use: a judgement, not a measured edge
# - with under a tenth left, the allocator has little room to find blocks and retries (frees its cache,
# synchronizes) as soon as the allocation pattern shifts. Reserved memory is not the measure: its cache of
# free blocks is reused and given back under pressure.
PEAK_ALLOCATED_FRAC_MAX = 0.90
# The GPU busy at least 90 % of the step: the host keeps it fed, so what is left is the kernels' own
# speed (MFU). Below it, idle time is a larger lever than any kernel. The notebooks' "paced by" line
# (`timing.Pace`) draws the same line.
COMPUTE_BUSY_MIN = GPU_PACED_MIN

# -- host-side rules: a cause on the host's path ---------------------------------------------------------
def input_bound(f: Facts) -> Verdict | None:
    """The host makes or waits for the next batch while the GPU waits: a DataLoader's `__next__`, or the
    batch made in the main thread before it is copied. Share: that host time, at most the GPU's idle
    (`Facts.idle`): with the batches made elsewhere, the step needs the rest of the host's work and the
    GPU's, and no less."""
    ms = f.idle("input")
    share = f.share(ms)
    if share < INPUT_SHARE_MIN:
        return None
    where = f.sites("input")
    main = f.precopy_ms > 0.5 * f.host_by_cause.get("input", 0.0)
    how = ("made in the main thread before its copy to the GPU" if main else "waited for from the DataLoader")
    fix = ("move the batch making into a Dataset and load it with DataLoader(num_workers>0, pin_memory=True, "
           "persistent_workers=True)" if main else
           "DataLoader(num_workers>0, pin_memory=True, persistent_workers=True, prefetch_factor)")
    return verdict("input_bound", "input pipeline (the host makes the batch while the GPU waits)", "03", share,
                   f"the host spent {f.host('input'):.3g} ms per step on the batch ({how}), the GPU idle "
                   f"{f.base_idle_ms:.3g} ms; at most {ms:.3g} ms ({pct(share)}) to win (threshold "
                   f"{pct(INPUT_SHARE_MIN)})" + (f"; where: {where}" if where else ""), fix)


SYNC_KINDS = {"shape": "an output size the GPU decides (nonzero, a boolean mask)", "branch": "a branch on a GPU value",
              "read": "a value read back", "copy": "a blocking copy", "wait": "an explicit wait"}


def _sync_rows(f: Facts, where=lambda site, via: True) -> list[str]:
    kinds = {(site, via): kind for site, via, kind, _ in f.sync_kinds}
    rows = [f"{site or '(no line of yours)'}" + (f" via {via}" if via and via != site else "")
            + (f" [{SYNC_KINDS[kinds[(site, via)]]}]" if kinds.get((site, via)) in SYNC_KINDS else "")
            + f": blocked {ms:.3g} ms, {n:.2g} call(s) per step" for site, via, ms, n in f.syncs
            if ms > 0 and where(site, via)]
    if not rows and f.hidden_syncs:
        rows = [f"{site or '(no line of yours)'}" + (f" via {via}" if via and via != site else "")
                for site, via, *_ in f.hidden_syncs if where(site, via)]
    return rows


def host_sync(f: Facts) -> Verdict | None:
    """The host waits for the GPU (`.item()`, `.cpu()`, a branch on a GPU value, `nonzero`, a blocking copy,
    `torch.cuda.synchronize()`), so nothing is queued ahead: the GPU idles while the host is blocked, and again
    from the moment the wait returns until the host has refilled the queue the wait emptied ("after_sync": a
    step that never waits has that work queued while the GPU still runs). Share: both, at most the GPU's idle;
    without the wait, the host's other work overlaps the GPU's."""
    ms = min(f.idle("sync") + f.idle("after_sync"), f.base_idle_ms)
    share = f.share(ms)
    if share < SYNC_SHARE_MIN:
        return None
    rows = _sync_rows(f)
    scaler = any("grad_scaler" in via for _, via, *_ in f.syncs)
    fix = ("keep values on the GPU (no .item()/.cpu()/print per step; read them every N steps); "
           "copy with non_blocking=True from pinned memory")
    if any(kind == "shape" for *_, kind, _ in f.sync_kinds):
        fix += "; give data-dependent work fixed shapes (a mask or padding instead of nonzero/boolean indexing)"
    if scaler:
        fix += "; GradScaler's own .item() goes with a fused optimizer (fused=True)"
    return verdict("host_sync", "host synchronization (.item(), .cpu(), a blocking copy)", "01", share,
                   f"the host was blocked {f.host('sync'):.3g} ms per step waiting for the GPU, then refilled the "
                   f"queue each wait had emptied while the GPU idled {f.idle('after_sync'):.3g} ms; the GPU idle "
                   f"{f.base_idle_ms:.3g} ms in all; at most {ms:.3g} ms ({pct(share)}) to win (threshold "
                   f"{pct(SYNC_SHARE_MIN)}); where: {evidence_lines(rows) or 'not found'}", fix)


def pageable_copy(f: Facts) -> Verdict | None:
    """Host<->device copies from pageable memory: the host stages them through a pinned buffer and waits.
    Fires on that host time (the wait included), at most `room`: the unprofiled step's GPU idle and the
    copies' own GPU time (with the GPU's other work read from the kernel-only profile, as every host rule
    reads it: the full profiler stretches the GPU's work). Expected: that host time and the GPU's idle while
    the host refilled the queue each copy's wait had emptied ("after_sync" at the copies' lines): pinned and
    copied with non_blocking=True, a host-to-device copy does not wait. Share: the most the fix can remove:
    the copies' GPU time too, since from pinned memory the copy itself runs faster and beside compute
    (lesson 05 measures pinned against pageable bandwidth); and where the step's only waits are its
    host-to-device copies, all of `room`, since without a wait the host can queue work ahead of the GPU. On an
    H100 (2026-12-06, results/course/2026-12-06-h100-03-06-07-08-15/), notebook 15's round of pinning saved
    1.26x against a share of 1.16x: both share and expected were capped at the step minus the GPU's other
    work as the full profile measured it, which left 2.0 ms where the fix removed 2.9 (likely the profiler's
    stretch of the GPU's work: after the fix it read 12.2 ms busy against the kernel-only profile's 11.0; that
    round's own facts were not kept)."""
    room = min(f.base_idle_ms + f.pageable_copy_ms, f.base_ms)
    if f.share(min(f.host("pageable_copy"), room)) < PAGEABLE_SHARE_MIN:
        return None
    lines = set(f.pinnable_sites)        # host-to-device only: pinning cannot remove a read-back's wait
    refill = min(sum(ms for site, _, ms in f.host_sites.get("after_sync", ()) if site in lines) * f.host_scale,
                 f.base_idle_ms)
    share = f.share(min(f.host("pageable_copy") + refill, room))
    other_waits = [site for site, _, ms, _ in f.syncs if ms > 0 and site not in lines]
    bound = f.share(room if lines and not other_waits else
                    min(f.host("pageable_copy") + f.pageable_copy_ms + refill, room))
    rows = [f"{site or '(no line of yours)'}: {fmt_bytes(int(nbytes))} per step, {host_ms:.3g} ms on the host"
            for site, host_ms, nbytes in f.pageable_copies]
    return verdict("pageable_copy", "pageable host<->device copies", "05", bound,
                   f"the host staged pageable copies for {f.host('pageable_copy'):.3g} ms per step, then refilled the "
                   f"queue their waits had emptied while the GPU idled {refill:.3g} ms ({pct(share)} of the step "
                   f"at most; threshold {pct(PAGEABLE_SHARE_MIN)})"
                   + ("" if other_waits else "; no other wait in the step, so the host could queue work ahead")
                   + f"; where: {evidence_lines(rows) or 'not found'}",
                   "pin the host tensors (pin_memory=True, or a pinned buffer reused after its copy's event) and "
                   "copy with .to(device, non_blocking=True)", expected=share)


def _has_syncs(f: Facts) -> bool:
    return any(ms > 0 for _, _, ms, _ in f.syncs) or bool(f.hidden_syncs)


def _launch_idle(f: Facts, share_min: float, one_by_one: bool = True) -> float | None:
    """The GPU's idle while the host launched (ms per unprofiled step), or None below `share_min` of the step
    or, with `one_by_one`, where the kernels are not launched one by one (a replayed graph launches many with
    one call): what launch_bound and cudagraphs_skipped both read. cudagraphs_skipped passes
    `one_by_one=False` where it knows the compiled code's own launching stretch, and judges that instead: a
    step whose backward still replays a graph while its forward was skipped launches fewer calls than it runs
    kernels (the zoo's gpt_masked_targets_reduce_overhead on the H200, 2026-12-02: 49 launch calls and 123
    kernels a step, its forward one by one) yet gains 1.39x from the fix."""
    ms = f.idle("launch")
    if f.share(ms) < share_min:
        return None
    if (one_by_one and f.launches_per_step is not None
            and f.launches_per_step < LAUNCHES_PER_KERNEL_MIN * f.kernels_per_step):
        return None
    return ms


def _in_forward(site: str, via: str) -> bool:
    """A synchronizing call made inside a module's forward (the user's `forward`, or torch.nn's modules):
    inside what torch.compile captures, where it splits the graph (a `.item()` is a graph break)."""
    return "(forward)" in site or "torch/nn/modules/" in via


def _graphable(f: Facts, ms: float) -> tuple[float, float, float]:
    """(what CUDA graphs of the model can take of `ms` launch idle, the optimizer's and GradScaler's part they
    leave, the recurrent layers' part they leave): the model's graphs leave the optimizer's launches on the
    host, and the recurrent layers', which Dynamo runs eagerly (on the H200, 2026-12-01, lstm_tuned's
    torch.compile bought 1.01x)."""
    opt = min((f.optimizer_host_ms + f.scaler_host_ms) * f.host_scale, ms)
    rnn = min(f.rnn_host_ms * f.host_scale, ms - opt)
    return ms - opt - rnn, opt, rnn


def _shapes_vary(f: Facts) -> bool:
    """Shapes that change from step to step because the host chose them (a batch padded to its own longest
    sequence, a token budget): those the GPU's values decide (nonzero, masks) are their syncs' evidence."""
    return bool(f.shape_changes) and not f.data_dependent


def graphs_blocked_by(f: Facts) -> str:
    """Why CUDA graphs of the model cannot work on this step, as the rule whose fix must come first ("" if
    nothing stops them): a synchronization inside the model's forward (a graph cannot capture a wait for the
    GPU, nor a branch on a GPU value; in a compiled model each is a graph break first), or shapes that change
    from step to step (a graph replays one shape: one graph per shape)."""
    timed = [(site, via) for site, via, ms, _ in f.syncs if ms > 0] + [(site, via) for site, via, *_ in f.hidden_syncs]
    if any(_in_forward(site, via) for site, via in timed):
        return "compile_graph_breaks" if f.compiled_regions > 0 else "host_sync"
    if _shapes_vary(f):
        return "compile_recompiles" if f.compiled_regions > 0 else "varying_shapes"
    return ""


def launch_bound(f: Facts) -> Verdict | None:
    """The host cannot issue kernels as fast as the GPU runs them: the GPU's gaps in which the host was issuing
    work to an empty queue (not the gaps a synchronization left: `host_sync`'s). Share: that idle time: a
    replayed CUDA graph runs none of it; expected: that time less the optimizer's (and GradScaler's) host time
    and the recurrent layers', which the model's graphs leave outside. The usual fix captures the model
    (torch.compile(model, mode="reduce-overhead")): a synchronization outside the model (a metric's `.item()`,
    GradScaler's inf check) stays outside its graphs and does not stop it; one inside the model's forward, or
    shapes that change from step to step, do (`graphs_blocked_by`): that rule's fix comes first."""
    ms = _launch_idle(f, LAUNCH_SHARE_MIN)
    if ms is None:
        return None
    blocked = graphs_blocked_by(f)
    fix = ("capture the model's forward and backward as CUDA graphs (torch.compile(model, mode='reduce-overhead'), "
           "torch.compiler.cudagraph_mark_step_begin() before each step) or fuse small ops")
    if blocked in ("host_sync", "compile_graph_breaks"):
        fix = (f"first move the synchronizations out of the model's forward (a graph cannot capture them: "
               f"{evidence_lines(_sync_rows(f, _in_forward), 1)}); then " + fix)
    elif blocked:
        fix = "first give the step a few fixed shapes (a graph replays one shape); then " + fix
    elif _has_syncs(f):
        fix += (f"; the step's synchronizations ({evidence_lines(_sync_rows(f), 1)}) are outside the model and stay "
                "outside its graphs (a capture of the whole step with torch.cuda.graph would need them gone)")
    graphs, opt, rnn = _graphable(f, ms)
    if f.share(graphs) < LAUNCH_SHARE_MIN:       # what the graphs could take is under the threshold
        return None
    return verdict("launch_bound", "kernel launch overhead (the host issues work slower than the GPU runs it)", "11",
                   f.share(ms), f"the GPU idled {ms:.3g} ms per step while the host issued work to an empty queue "
                   f"({f.host('launch'):.3g} ms of host time issuing work; the GPU idle {f.base_idle_ms:.3g} ms in all); "
                   f"{f.kernels_per_step:.0f} kernels per step, median {f.median_kernel_us or 0:.3g} us (threshold "
                   f"{pct(LAUNCH_SHARE_MIN)})" + (f"; where: {f.sites('launch')}" if f.sites("launch") else "")
                   + (f"; the optimizer's {opt:.3g} ms stay outside the graphs" if opt > 0 else "")
                   + (f"; the recurrent layers' {rnn:.3g} ms too (torch.compile runs nn.LSTM/GRU/RNN eagerly)"
                      if rnn > 0 else ""), fix,
                   expected=f.share(graphs), blocked_by=blocked)


# What a few shapes still cost under CUDA graphs, said with each shape verdict's fix. On one H100 (2026-12-07,
# results/zoo/2026-12-07-h100-issue41-h/shape-steps/), each step timed alone: bert_variable_lengths_compile's fix
# (3 padded lengths) compiled in each length's first step (5.6-16.8 s), recorded in its second (26-40 ms) and then
# ran 4.3 ms steps; fairseq_token_batches' fix (rows to 16, lengths to 32) met 25 shapes in 300 steps, the last at
# step 278, each first step 126-711 ms (besides its three compiles, 15.6-16.0 s) and second 35-63 ms (one 825 ms),
# the others 12.1 ms. The zoo's labels time a window of about a second: there the first runs took most of bert's gain
# (1.2x) and more than all of fairseq's (0.39x).
FIRST_RUNS = ("each padded shape still costs its first step a compile or a warm-up and its second a recording: the "
              "gain comes once every shape has run twice, so count the shapes the padding leaves, rows x lengths")


def varying_shapes(f: Facts) -> Verdict | None:
    """The step's shapes change from step to step (a batch padded to its own longest sequence, batches built to
    a token budget), so CUDA graphs cannot take its launch gaps: a graph replays one shape, and
    torch.compile(mode="reduce-overhead") records one per shape. Eager kernels do not care about the shapes,
    so this fires only where the launch gaps are worth the graphs (launch_bound's bar) and the step is not
    compiled (there compile_recompiles is the same cause). Share: the launch gaps that graphs could then take
    (launch_bound's share); expected: launch_bound's expected, the fix being a few shapes and then the graphs.
    Evidence: the lines whose ops saw other shapes in other profiled steps, and the shapes."""
    if not _shapes_vary(f) or f.compiled_regions > 0:
        return None
    ms = _launch_idle(f, LAUNCH_SHARE_MIN)
    if ms is None:
        return None
    graphs, _, _ = _graphable(f, ms)
    if f.share(graphs) < LAUNCH_SHARE_MIN:
        return None
    rows = [f"{site or '(no line of yours)'} {op.replace('aten::', '')}: "
            + ", ".join("x".join(map(str, shape)) for shape in shapes) + f" across {steps} steps"
            for site, op, shapes, steps in f.shape_changes]
    return verdict("varying_shapes", "shapes that change from step to step (no CUDA graph can replay them)", "11",
                   f.share(ms), f"the shapes changed between the profiled steps, so CUDA graphs cannot take the "
                   f"{ms:.3g} ms per step the GPU idled while the host issued work (threshold {pct(LAUNCH_SHARE_MIN)}); "
                   f"where: {evidence_lines(rows)}",
                   "pad or bucket to a few shapes (DataCollatorWithPadding(pad_to_multiple_of=...), length buckets), "
                   "then capture each as CUDA graphs (torch.compile(mode='reduce-overhead'); " + FIRST_RUNS + "); or "
                   "torch.compile(dynamic=True) / torch._dynamo.mark_dynamic to compile one graph for all of them",
                   expected=f.share(graphs))


def host_code(f: Facts) -> Verdict | None:
    """The host runs the user's own Python (outside PyTorch, after the batch is on the GPU: logging,
    metrics, bookkeeping, the garbage collector) while the GPU waits. Share: that time, at most the idle."""
    ms = f.idle("host_code")
    share = f.share(ms)
    if share < HOST_CODE_SHARE_MIN:
        return None
    return verdict("host_code", "your own Python on the host's path", "03", share,
                   f"the host ran your code for {f.host('host_code'):.3g} ms per step while the GPU idled "
                   f"{f.base_idle_ms:.3g} ms (threshold {pct(HOST_CODE_SHARE_MIN)}); where: "
                   f"{f.sites('host_code') or 'not found'}",
                   "take it off the step: do it every N steps, in a DataLoader worker or a thread, or on the GPU")


def memory_pressure(f: Facts) -> Verdict | None:
    """The host waits in cudaMalloc / cudaFree (the caching allocator asking the driver, its retries, an
    `empty_cache()`). Share: that host time, at most the idle."""
    m = f.memory
    ms = f.idle("allocator")
    share = f.share(ms)
    retries = m.alloc_retries if m else 0
    if not (retries > 0 or share >= ALLOCATOR_SHARE_MIN):
        return None
    evidence = [f"the host waited in the allocator {f.host('allocator'):.3g} ms per step ({pct(share)}; threshold "
                f"{pct(ALLOCATOR_SHARE_MIN)})"]
    if m is not None:
        evidence.append(f"{retries} allocation retries in {m.steps} steps; peak allocated "
                        f"{fmt_bytes(m.peak_allocated_bytes)} of {fmt_bytes(m.total_bytes)} ({m.cap_source}), the "
                        f"allocator's cache {fmt_bytes(m.cached_bytes)} more")
    if f.sites("allocator"):
        evidence.append(f"where: {f.sites('allocator')}")
    return verdict("memory_pressure", "memory pressure / fragmentation (the allocator on the host's path)", "02",
                   share, "; ".join(evidence),
                   "keep shapes steady, no empty_cache() in the loop, PYTORCH_ALLOC_CONF=expandable_segments:True")


def memory_full(f: Facts) -> Verdict | None:
    """Tensors hold nearly all the memory this process may use (its cap where one is set): not slow yet,
    but one larger batch or a shape change away from retries and out-of-memory. No speed to win: a note."""
    m = f.memory
    if m is None or not m.total_bytes or m.peak_allocated_frac < PEAK_ALLOCATED_FRAC_MAX:
        return None
    return verdict("memory_full", "memory nearly full", "09", 0.0,
                   f"peak allocated {fmt_bytes(m.peak_allocated_bytes)} of {fmt_bytes(m.total_bytes)} "
                   f"({pct(m.peak_allocated_frac)}, {m.cap_source}; threshold {pct(PEAK_ALLOCATED_FRAC_MAX)}); "
                   f"the allocator's cache {fmt_bytes(m.cached_bytes)} on top, reusable",
                   "room for a larger batch: activation checkpointing or a smaller micro-batch with accumulation",
                   actionable=False)


def periodic_stall(f: Facts) -> Verdict | None:
    """Some steps take several times the typical one, every N steps (a log line with a read-back, a
    checkpoint, the garbage collector's full collections, a recompile). Share: the slow steps' excess over
    the typical step, per step. Slow steps at uneven intervals are reported, not a verdict: a busy host
    (another process, a page fault) makes those too, and no line of the step is theirs. Where every timed
    chunk had its slow step, no chunk times the step without one, and a host blocked on a full launch queue
    makes the same pattern while the GPU is busy (each chunk starts after a synchronize with the queue empty:
    its first steps take only the host's launch time, its last wait for the GPU): the share is then at most the
    step's GPU idle. On the H100 (2026-12-06) cnn_tf32_off_inside, a GPU-bound step with no periodic work, read
    host steps of 9.5, 9.4, 9.3, 24.6 and 50.7 ms in every chunk of 5 (a stall of 16 %) with the GPU idle 1 % of
    its step. The bound also caps periodic work the GPU does itself (a checkpoint's copies, an evaluation) when it
    falls in every chunk: such work is busy time, not idle, and the verdict then under-reads it."""
    s = f.stalls
    if s is None or not s.slow or s.mean_ms <= 0 or s.period is None:
        return None
    share = min(max(s.mean_ms - s.median_ms, 0.0) / s.mean_ms, 1.0)
    bounded = ""
    if s.every_chunk and f.base_ms > 0 and share > f.base_idle_ms / f.base_ms:
        bounded = (f"; every timed chunk had a slow step, so the excess ({pct(share)}) is bounded by the GPU's idle "
                   f"time, {pct(f.base_idle_ms / f.base_ms)} of the step: the slow steps may be a host blocked on a "
                   "full launch queue while the GPU works")
        share = f.base_idle_ms / f.base_ms
    if share < STALL_SHARE_MIN:
        return None
    every = f"every {s.period} steps" if s.period else "at uneven intervals"
    slow = [s.step_ms[i] for i in s.slow]
    where = (f"; the slow step spent {s.site_ms:.3g} ms more than a typical one in {s.site}" if s.site else "")
    return verdict("periodic_stall", "periodic stall (a slow step every few)", "01", share,
                   f"{len(s.slow)} of {len(s.step_ms)} timed steps took over 3x the median host step "
                   f"({max(slow):.3g} ms at most, median {statistics_median(s.step_ms):.3g} ms), {every}; the mean "
                   f"step {s.mean_ms:.3g} ms against the median {s.median_ms:.3g} ms (threshold "
                   f"{pct(STALL_SHARE_MIN)}){where}{bounded}",
                   "do it less often or off the step's path (a thread, torch.distributed.checkpoint.async_save; "
                   "gc.freeze() after start-up)")


def statistics_median(values) -> float:
    import statistics
    return statistics.median(values)


def data_parallel(f: Facts) -> Verdict | None:
    """nn.DataParallel: one process replicates the model and scatters and gathers every step (lesson 14).
    Share: its host time, at most the idle."""
    ms = min(f.data_parallel_ms * f.host_scale, f.base_idle_ms)
    share = f.share(ms)
    if f.data_parallel_ms <= 0 or share < DATA_PARALLEL_SHARE_MIN:
        return None
    return verdict("data_parallel", "nn.DataParallel (one process drives every GPU)", "14", share,
                   f"the host spent {f.data_parallel_ms * f.host_scale:.3g} ms per step in DataParallel.forward "
                   f"(threshold {pct(DATA_PARALLEL_SHARE_MIN)})",
                   "DistributedDataParallel, one process per GPU (torchrun)")


# -- torch.compile ----------------------------------------------------------------------------------------
def _compiled(f: Facts, key: str) -> tuple[int, int]:
    """(during warm-up, during the measured steps) of a compile counter."""
    c = f.compile or {}
    before, warm, after = (c.get(k, {}) for k in ("before", "warm", "after"))
    return warm.get(key, 0) - before.get(key, 0), after.get(key, 0) - warm.get(key, 0)


def compile_recompiles(f: Facts) -> Verdict | None:
    """torch.compile compiled new graphs during the measured steps: the step's shapes (or guarded values)
    keep changing. Share: the slow steps' excess over the median, per step (a compile is a stall)."""
    _, measured = _compiled(f, "graphs")
    if measured <= 0:
        return None
    s = f.stalls
    share = min(max(s.mean_ms - s.median_ms, 0.0) / s.mean_ms, 1.0) if s and s.mean_ms > 0 else 0.0
    if share < STALL_SHARE_MIN:         # compiled, but the window does not show it costing the step anything
        return None
    return verdict("compile_recompiles", "torch.compile recompiling during training", "12", share,
                   f"{measured} new graph(s) compiled during the measured steps"
                   + (f"; the mean step {s.mean_ms:.3g} ms against the median {s.median_ms:.3g} ms" if s else ""),
                   "give the compiled code few shapes: pad to a few bucket lengths, or mark the dimension dynamic "
                   "(torch._dynamo.mark_dynamic)")


def compile_graph_breaks(f: Facts) -> Verdict | None:
    """A compiled model split into several graphs (graph breaks): Python runs between them every step,
    and nothing fuses across a break. Share: the host time between the compiled regions, at most the idle."""
    if f.compiled_regions < 2:
        return None
    ms = min(f.between_regions_ms * f.host_scale, f.base_idle_ms)
    share = f.share(ms)
    if share < GRAPH_BREAK_SHARE_MIN:
        return None
    reasons = list((f.compile.get("after") or {}).get("graph_breaks", {}))[:2]
    return verdict("compile_graph_breaks", "torch.compile graph breaks", "12", share,
                   f"{f.compiled_regions:.2g} compiled regions per step, {f.between_regions_ms * f.host_scale:.3g} ms "
                   f"of host time between them (threshold {pct(GRAPH_BREAK_SHARE_MIN)})"
                   + (f"; dynamo's reasons: {'; '.join(reasons)}" if reasons else ""),
                   "remove what breaks the graph (.item(), print, data-dependent Python); TORCH_LOGS=graph_breaks "
                   "names each one")


def cudagraphs_skipped(f: Facts) -> Verdict | None:
    """torch.compile(mode="reduce-overhead") where inductor skipped its CUDA graphs: the kernels are still
    launched one at a time. Share: the host's launch time, at most the idle (what the graphs would save);
    expected: the host time inside the compiled code (its forward regions and compiled backward) from each
    one's first launch to its last, the only part a replayed graph takes off the host: the guards dynamo runs
    before and the autograd wrappers around it stay (cudagraph trees add their own checks and input copies);
    less the GPU time of the kernels queued in that stretch, which the graph still runs back to back.
    On the H200 the zoo's reduce_overhead_skipped gained 1.33x where the whole launch time had promised 26.6x
    (2026-12-01), and 1.18x (settled labels, 2026-12-02) where the whole compiled host time promised 2.2x and
    the launch stretch 1.46x (run H, 2026-12-02: 48 % kept; the stretch's own kernels were still counted)."""
    warm, measured = _compiled(f, "cudagraph_skips")
    if warm + measured <= 0 or f.compiled_regions <= 0:
        return None
    ms = _launch_idle(f, CUDAGRAPH_SKIP_SHARE_MIN, one_by_one=f.compiled_launch_ms is None)
    if ms is None:
        return None
    if f.compiled_launch_ms is not None:    # a replayed graph still runs the stretch's kernels, back to back
        replaced = max(f.compiled_launch_ms * f.host_scale - f.compiled_launch_busy_ms, 0.0)
        if f.share(replaced) < CUDAGRAPH_SKIP_SHARE_MIN:     # the compiled code is not launched one by one
            return None
    else:
        replaced = None if f.compiled_host_ms is None else f.compiled_host_ms * f.host_scale
    inside = ms if replaced is None else min(ms, replaced)
    return verdict("cudagraphs_skipped", "CUDA graphs skipped by torch.compile", "11", f.share(ms),
                   f"inductor skipped CUDA graphs {warm + measured} time(s); the host spent {f.host('launch'):.3g} ms "
                   f"per step launching (threshold {pct(CUDAGRAPH_SKIP_SHARE_MIN)})"
                   + (f", {f.compiled_host_ms * f.host_scale:.3g} ms of the step inside the compiled code"
                      if f.compiled_host_ms is not None else "")
                   + (f", {f.compiled_launch_ms * f.host_scale:.3g} ms of it between its first launch and its last, "
                      f"{f.compiled_launch_busy_ms:.3g} ms of which its kernels keep the GPU busy (a replayed graph "
                      "takes the rest off the step; dynamo's guards and the autograd wrappers stay)"
                      if f.compiled_launch_ms is not None else ""),
                   "remove what inductor names (its cudagraphs log: TORCH_LOGS=perf_hints,cudagraphs), such as an "
                   "input other than a parameter or buffer mutated in place", expected=f.share(inside))


def compute_bound(f: Facts) -> Verdict | None:
    """The device is kept busy: what is left is how fast its kernels run. Share: 1 - (the fraction of measured
    peak: the step's FLOP/s over the 16-bit peak notebook 00 measured), what it would save at that peak: an
    estimate, not a bound, since some shapes beat notebook 00's best (`Facts.kernel_ceiling_tflops`); 0 when
    unknown. The evidence gives MFU too, against the datasheet's peak (PaLM's definition): two ratios, two names.
    `rank` shows it last, and only when no other rule fired."""
    busy = f.share(f.busy_ms)
    if busy < COMPUTE_BUSY_MIN:
        return None
    gemm = sum(f.busy_by_class.get(c, 0.0) for c in ("gemm_tensor_core", "gemm_no_tensor_core", "gemm_unknown"))
    elementwise = f.busy_by_class["elementwise_norm"] > gemm
    lesson = "12" if elementwise else "13"
    measured = f.measured_peak_fraction
    if measured is None:
        rate = ("fraction of measured peak unknown: run notebook 00 to measure this GPU's peak" if not f.peak_tflops
                else "fraction of measured peak unknown: no FLOP count for the step")
        share = 0.0
    else:
        rate = (f"{f.tflops:.3g} TFLOP/s = {pct(measured)} of the measured peak, {f.peak_tflops:.3g} TFLOP/s "
                f"({f.peak_source})" + (f"; MFU {pct(f.mfu)} of the datasheet's {f.kernel_ceiling_tflops:.3g} TFLOP/s"
                                        if f.mfu is not None else ""))
        share = 1.0 - min(measured, 1.0)
    fix = ("fuse the elementwise and normalization kernels (torch.compile)" if elementwise
           else "larger matrix products, 16-bit math, fused attention: lesson 13's stack")
    return verdict("compute_bound", "compute-bound: the kernels themselves", lesson, share,
                   f"device busy {pct(busy)} of the step (threshold {pct(COMPUTE_BUSY_MIN)}); {rate}", fix,
                   actionable=False)


@dataclass(frozen=True)
class Rule:
    """One rule's facts, in one row of `TABLE`: adding a rule is its function and a row here."""
    check: Callable[[Facts], "Verdict | None"]      # the rule; its name is the function's
    short: str                                      # the diagnosis suite's column head
    tie: int | None                                 # among fixes expected to buy about as much (TIE), the lower
                                                    # first (the smaller fix); None: a note, no fix
    gpu_only: str | None                            # why it cannot run on the CPU, where it reads what only a GPU records

    @property
    def name(self) -> str:
        return self.check.__name__


# The rules in the order they are run (the suite's columns' order)
TABLE: tuple[Rule, ...] = (
    Rule(input_bound, "input", 8, None),
    Rule(host_sync, "sync", 0, "needs a GPU: on the CPU the host never waits for a device"),
    Rule(pageable_copy, "pageable", 1, "needs a GPU: on the CPU there are no host<->device copies"),
    Rule(launch_bound, "launch", 17, "needs a GPU: on the CPU there are no kernels to launch or time"),
    Rule(host_code, "host", 6, None),
    Rule(periodic_stall, "stall", 7, None),
    Rule(fp32_matmuls, "fp32", 9, "needs a GPU: Tensor Cores and their kernel names exist only there"),
    Rule(misaligned_gemm, "misalign", 2, "needs a GPU: Tensor Core tile alignment matters only there"),
    Rule(layout_transposes, "layout", 3, "needs a GPU: cuDNN's layout conversions run only there"),
    Rule(attention_math, "attn", 5, "needs a GPU: the fused attention kernels it compares with run there"),
    Rule(optimizer_unfused, "optim", 4, "needs a GPU: fused optimizers are CUDA kernels"),
    Rule(elementwise_unfused, "eltwise", 16, "needs a GPU: kernel times exist only there"),
    Rule(memory_pressure, "memory", 10, "needs a GPU: the CUDA caching allocator's statistics exist only there"),
    Rule(memory_full, "full", None, "needs a GPU: the CUDA caching allocator's statistics exist only there"),
    Rule(copy_not_overlapped, "copy", 11, "needs a GPU: on the CPU there are no host<->device copies"),
    Rule(comm_not_overlapped, "comm", 18, "needs a GPU: NCCL communication kernels run only there"),
    Rule(no_sync_accumulation, "nosync", 12, "needs a GPU: NCCL communication kernels run only there"),
    Rule(data_parallel, "dp", 19, None),
    Rule(compile_recompiles, "recomp", 14, None),
    Rule(compile_graph_breaks, "breaks", 13, None),
    Rule(cudagraphs_skipped, "cgskip", 15, "needs a GPU: CUDA graphs exist only there"),
    Rule(varying_shapes, "shapes", 20, "needs a GPU: CUDA graphs exist only there"),
    Rule(compute_bound, "compute", None, None),
)
RULES: list[Callable[[Facts], Verdict | None]] = [r.check for r in TABLE]
GPU_ONLY = {r.name: r.gpu_only for r in TABLE if r.gpu_only}
FIX_ORDER = tuple(r.name for r in sorted((r for r in TABLE if r.tie is not None), key=lambda r: r.tie))
SHORT = {r.name: r.short for r in TABLE}


def rank_key(gain: float, rule: str) -> tuple:
    """Where a fix of this gain and rule ranks (smaller first): by gain in steps of TIE, then the smaller fix."""
    order = {r: i for i, r in enumerate(FIX_ORDER)}
    return (-round(math.log(gain) / math.log1p(TIE)) if gain > 1 and math.isfinite(gain) else
            (-math.inf if gain == math.inf else 0), order.get(rule, len(order)))


def rank(verdicts: list[Verdict]) -> list[Verdict]:
    """Fixes by gain (measured, else expected: a demoted fix by what it measured; a fix others wait for by
    the best of theirs), the smaller fix first among near-equals; a blocked fix right after the one blocking
    it; what is not a fix last."""
    fixes = [v for v in verdicts if v.actionable]
    # a fix that others wait for is worth what they unlock: it ranks as high as the best fix it blocks
    unlocks = {}
    for v in fixes:
        if v.blocked_by:
            unlocks[v.blocked_by] = max(unlocks.get(v.blocked_by, 1.0), v.gain)

    fixes.sort(key=lambda v: rank_key(max(v.gain, unlocks.get(v.rule, 1.0)), v.rule))
    present = {v.rule for v in fixes}
    out = [v for v in fixes if not (v.blocked_by and v.blocked_by in present)]
    for v in fixes:                    # a blocked fix after the fix that unblocks it (and the ones it unblocked before)
        if v.blocked_by and v.blocked_by in present:
            at = max(i for i, w in enumerate(out) if w.rule == v.blocked_by or w.blocked_by == v.blocked_by)
            out.insert(at + 1, v)
    return out + [v for v in verdicts if not v.actionable]


def run_rules(f: Facts, rules: list | None = None) -> tuple[list[Verdict], dict[str, str]]:
    """(verdicts, ranked; {rule: why it was skipped}). "compute_bound" shows only when no fix fired; a
    skipped CUDA graph replaces the general launch verdict."""
    fired, skipped = [], {}
    for rule in rules if rules is not None else RULES:
        name = rule.__name__
        if not f.on_gpu and name in GPU_ONLY:
            skipped[name] = GPU_ONLY[name]
            continue
        v = rule(f)
        if v is not None:
            fired.append(v)
    names = {v.rule for v in fired}
    if "cudagraphs_skipped" in names:
        fired = [v for v in fired if v.rule != "launch_bound"]
    for v in list(fired):          # a fix blocked by a cause no rule fired on: that cause, as its first step
        if v.blocked_by and v.blocked_by not in {w.rule for w in fired} and v.blocked_by in PREREQUISITES:
            fired.append(PREREQUISITES[v.blocked_by](f, v))
    for v in [v for v in fired if v.blocked_by]:     # the blocker's share includes the gaps it keeps the fix from
        fired = [exposing(f, w, v) if w.rule == v.blocked_by else w for w in fired]
    if any(v.actionable for v in fired):
        fired = [v for v in fired if v.rule != "compute_bound"]
    return rank(fired), skipped


def sync_first(f: Facts, blocked: Verdict) -> Verdict:
    """host_sync as the step before `blocked` (a CUDA graph cannot capture a synchronizing step), when its
    own share is under its threshold: what removing the syncs saves by itself, and what it unlocks."""
    ms = f.idle("sync")
    return verdict("host_sync", "host synchronization (.item(), .cpu(), a blocking copy)", "01", f.share(ms),
                   f"the host was blocked {f.host('sync'):.3g} ms per step waiting for the GPU (the profiler slows the "
                   f"host, so the unprofiled wait can be longer); it must go before {blocked.rule} (up to "
                   f"{blocked.bound:.3g}x) can work; where: {evidence_lines(_sync_rows(f)) or 'not found'}",
                   "keep values on the GPU (no .item()/.cpu()/print per step; read them every N steps)")


def break_first(f: Facts, blocked: Verdict) -> Verdict:
    """compile_graph_breaks as the step before `blocked`, when a compiled model's forward synchronizes (a
    value read back to Python: Dynamo breaks the graph there) and the host time between its regions is
    under the rule's own threshold: the breaks split the graphs CUDA graphs would capture."""
    ms = min(f.between_regions_ms * f.host_scale, f.base_idle_ms) + f.idle("sync")
    rows = _sync_rows(f, _in_forward)
    return verdict("compile_graph_breaks", "torch.compile graph breaks", "12", f.share(ms),
                   f"the compiled model's forward reads values back to Python, and each read is a graph break "
                   f"({f.compiled_regions:.2g} compiled regions per step); they must go before {blocked.rule} "
                   f"(up to {blocked.bound:.3g}x) can work; where: {evidence_lines(rows) or 'not found'}",
                   "keep the values as tensors inside forward (.detach(), no .item()/.cpu()/print) and read them "
                   "outside the compiled model every N steps; TORCH_LOGS=graph_breaks names each break")


def shapes_first(f: Facts, blocked: Verdict) -> Verdict:
    """varying_shapes (or, in a compiled step, compile_recompiles) as the step before `blocked` when its own rule
    stayed silent: the shapes change from step to step and a CUDA graph replays one shape; its share and
    expected are the graphs' that it unlocks (its fix is a few shapes, then the graphs)."""
    rows = [f"{site or '(no line of yours)'} {op.replace('aten::', '')}: "
            + ", ".join("x".join(map(str, shape)) for shape in shapes) for site, op, shapes, _ in f.shape_changes]
    return verdict(blocked.blocked_by, "shapes that change from step to step (no CUDA graph can replay them)", "11",
                   blocked.share, f"the shapes changed between the profiled steps; they must settle before "
                   f"{blocked.rule} (up to {blocked.bound:.3g}x) can work; where: {evidence_lines(rows) or 'not found'}",
                   "pad or bucket to a few shapes, then capture each as CUDA graphs (" + FIRST_RUNS + "); or "
                   "torch.compile(dynamic=True) / torch._dynamo.mark_dynamic", expected=blocked.expected_share)


def exposing(f: Facts, blocker: Verdict, blocked: Verdict) -> Verdict:
    """`blocker` with the gaps it keeps `blocked`'s fix from added to its share (at most the GPU's idle): with it
    gone, that fix can take them too. Its expected stays what its own fix saves alone; a blocker whose share is
    already the blocked fix's (varying_shapes, shapes_first's) is left as it is."""
    if blocker.share >= blocked.share and blocker.rule in ("varying_shapes", "compile_recompiles"):
        return blocker
    share = min(blocker.share + blocked.share, f.share(f.base_idle_ms) if f.on_gpu else 1.0)
    if share <= blocker.share:
        return blocker
    out = verdict(blocker.rule, blocker.bottleneck, blocker.lesson, share,
                  blocker.evidence + f"; with it gone, {blocked.rule}'s fix can take {pct(blocked.share)} more of the "
                  f"step: at most {1 / (1 - share) if share < 1 else float('inf'):.3g}x together",
                  blocker.fix, blocker.actionable, blocker.expected_share, blocker.blocked_by)
    return out


PREREQUISITES = {"host_sync": sync_first, "compile_graph_breaks": break_first, "varying_shapes": shapes_first,
                 "compile_recompiles": shapes_first}


