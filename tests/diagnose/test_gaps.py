"""What made the GPU wait, gap by gap (gpulab.diagnose.gaps through analyze): a wait's refill, a full launch queue,
torch.compile's compiling, what made each sync wait, shapes that change from step to step, the optimizer's ops."""
import pytest

from gpulab.diagnose import gaps as G
from gpulab.diagnose.analyze import analyze
from gpulab.diagnose.events import GPU, OP, RUNTIME, STEP_RANGE, Event

USER = ("train.py", 12, "step")


def step(a, b):
    return Event(OP, STEP_RANGE, a, b, stream=1)


def op(name, a, b, corr=0, **kw):
    return Event(OP, name, a, b, stream=1, corr=corr, **kw)


def call(name, a, b, corr=0, op_id=0):
    return Event(RUNTIME, name, a, b, stream=1, corr=corr, op_id=op_id)


def kernel(a, b, corr=0, op_id=0):
    return Event(GPU, "k", a, b, stream=7, corr=corr, op_id=op_id)


def launched(name, a, b, corr, kernel_at, kernel_us=5.0):
    """An op [a, b] that launches one kernel at its start; the kernel runs from kernel_at."""
    return [op(name, a, b, corr=corr, site=USER), call("cudaLaunchKernel", a + 1, a + 3, corr=1000 + corr, op_id=corr),
            Event(GPU, f"{name}_k", kernel_at, kernel_at + kernel_us, stream=7, corr=1000 + corr, op_id=corr)]


def test_the_gap_a_wait_leaves_is_the_waits_until_the_gpu_has_work_again():
    """A per-sample loop: each iteration launches a tiny kernel and then waits for it. The GPU idles during the
    wait and during the next launch; without the wait the launches would have queued ahead, so both are the
    sync's. The first launch of the step, before any wait, stays the launches'."""
    events = [step(0, 400)]
    t, corr = 0.0, 1
    for _ in range(4):              # launch 0-50 (its kernel 45-50), wait 50-100 in bool(): a branch on its value
        events += launched("aten::eq", t, t + 50, corr, t + 45)
        events += [op("aten::is_nonzero", t + 50, t + 100, corr=500 + corr, site=USER),
                   call("cudaStreamSynchronize", t + 50, t + 100, op_id=500 + corr)]
        t += 100
        corr += 1
    f = analyze(events)
    # launching: the first 50 us, and the last 5 us of each later launch (its kernel already running)
    assert f.host_by_cause["launch"] == pytest.approx(0.065)
    assert f.host_by_cause["after_sync"] == pytest.approx(0.135)       # each later launch until its kernel starts
    assert f.idle_by_cause["after_sync"] == pytest.approx(0.135)
    assert f.idle_by_cause["launch"] == pytest.approx(0.045)            # the step's first launch, queue empty
    assert f.host_by_cause["sync"] == pytest.approx(0.2)
    assert f.sync_kinds == (("train.py:12 (step)", "", "branch", 4.0),)
    assert f.host_sites["after_sync"][0][0] == "train.py:12 (step)"
    # a gap that began before the wait did (the host was slow, then read a finished value) is not the wait's
    late = [step(0, 300)] + launched("aten::mm", 0, 20, 1, 10) + [op("aten::add", 20, 200, site=USER),
                                                                   call("cudaLaunchKernel", 190, 195, corr=9, op_id=0),
                                                                   call("cudaStreamSynchronize", 200, 210),
                                                                   kernel(250, 260, corr=9)]
    assert analyze(late).host_by_cause["after_sync"] == 0.0


def test_a_long_launch_on_a_busy_gpu_is_a_full_queue_not_idle_time():
    """The host blocked in cudaLaunchKernel for 400 us while the GPU ran a long kernel: host time "queue_full",
    none of it idle; a slow launch while the GPU idles stays "launch"."""
    events = [step(0, 1000), op("aten::mm", 0, 10, corr=1), call("cudaLaunchKernel", 1, 5, corr=101, op_id=1),
              kernel(6, 900, corr=101),
              op("aten::mm", 100, 520, corr=2), call("cudaLaunchKernel", 110, 510, corr=102, op_id=2),
              kernel(900, 950, corr=102)]
    f = analyze(events)
    assert f.host_by_cause["queue_full"] == pytest.approx(0.4) and f.idle_by_cause["queue_full"] == 0.0
    assert G.queue_full([call("cudaLaunchKernel", 0, G.QUEUE_FULL_US - 1)], [(0, 100)]) == []
    assert G.queue_full([call("cudaLaunchKernel", 0, G.QUEUE_FULL_US)], [(10, 100)]) == [(10, G.QUEUE_FULL_US)]


def test_torch_compiles_own_work_is_compiling():
    events = [step(0, 1000), op("_compile.compile_inner (dynamo_timed)", 100, 700),
              op("aten::empty", 200, 300, corr=3), kernel(900, 950)]
    f = analyze(events)
    assert f.host_by_cause["compile"] == pytest.approx(0.6) and f.idle_by_cause["compile"] == pytest.approx(0.6)
    assert G.is_compile(op("entire_frame_compile", 0, 1)) and not G.is_compile(op("Torch-Compiled Region: 0/0", 0, 1))


@pytest.mark.parametrize("names, kind", [
    (("aten::index", "aten::nonzero", "aten::_local_scalar_dense"), "shape"),
    (("aten::is_nonzero", "aten::item", "aten::_local_scalar_dense"), "branch"),
    (("aten::item", "aten::_local_scalar_dense"), "read"),
    (("aten::to", "aten::_to_copy", "aten::copy_"), "copy"),
    ((), "wait"),
])
def test_what_made_a_sync_wait(names, kind):
    assert G.sync_kind([op(n, 0, 10) for n in names]) == kind


def test_ops_by_thread_finds_the_ops_around_a_moment():
    running = G.OpsByThread([op("aten::is_nonzero", 0, 100), op("aten::item", 10, 90), op("aten::add", 120, 130)])
    assert [e.name for e in running.at(1, 50)] == ["aten::is_nonzero", "aten::item"]
    assert running.at(1, 110) == [] and running.at(2, 50) == []


def test_shapes_that_change_from_step_to_step_and_those_that_do_not():
    """An embedding whose batch length changes each step; a linear layer looping over two widths every step
    (its shapes vary within a step, the same every step); a log line that runs in one step only."""
    events, windows = [], []
    for i, length in enumerate((87, 112, 64)):
        a = 1000 * i
        windows.append((a, a + 900))
        events += [op("aten::embedding", a + 10, a + 20, site=USER, shapes=((30522, 256), (32, length))),
                   op("aten::linear", a + 30, a + 40, site=("m.py", 5, "forward"), shapes=((32, 256),)),
                   op("aten::linear", a + 50, a + 60, site=("m.py", 5, "forward"), shapes=((32, 512),))]
    events.append(op("aten::add", 100, 110, site=("train.py", 90, "log"), shapes=((1,),)))
    out = G.shape_changes(events, windows)
    # the input that changes is the embedding's second (the ids), not its weight
    assert out == (("train.py:12 (step)", "aten::embedding", ((32, 64), (32, 87), (32, 112)), 3),)
    assert G.shape_changes(events[:3] * 1, windows[:1]) == ()                  # one step: nothing to compare


def test_analyze_reads_shape_changes_data_dependent_ops_and_the_optimizers_ops():
    events = []
    for i, length in enumerate((40, 56)):
        a = 1000 * i
        events += [step(a, a + 900), op("aten::embedding", a + 10, a + 20, site=USER, shapes=((100, 8), (4, length))),
                   op("aten::nonzero", a + 30, a + 40, site=("m.py", 9, "forward")),
                   op("Optimizer.step#SGD.step", a + 100, a + 200),
                   op("aten::_foreach_mul_", a + 110, a + 120, corr=10 + i),
                   call("cudaLaunchKernel", a + 111, a + 113, corr=100 + i, op_id=10 + i),
                   kernel(a + 115, a + 125, 100 + i, 10 + i)]
    f = analyze(events)
    assert f.shape_changes == (("train.py:12 (step)", "aten::embedding", ((4, 40), (4, 56)), 2),)
    assert f.data_dependent == (("m.py:9 (forward)", "aten::nonzero", 1.0),)
    assert f.optimizer_ops == ("aten::_foreach_mul_",) and f.optimizer_name == "SGD"


# -- a new shape's first run, set apart ----------------------------------------------------------------------------
CHANGES = (("train.py:12 (step)", "aten::embedding", ((4, 40), (4, 56)), 2),)


def test_steps_at_the_new_shape_factor_are_set_apart_only_where_the_shapes_change():
    w = [(0, 100), (100, 100 + 100 * G.NEW_SHAPE_FACTOR), (400, 500)]
    assert G.settled_windows(w, CHANGES) == ([w[0], w[2]], [w[1]])           # 3x the shortest: a first run
    below = [(0, 100), (100, 100 + 100 * G.NEW_SHAPE_FACTOR - 1), (400, 500)]
    assert G.settled_windows(below, CHANGES) == (below, [])                   # just under: every step read
    assert G.settled_windows(w, ()) == (w, [])                               # same shapes: a slow step is a stall
    assert G.settled_windows([(0, 300), (300, 600)], CHANGES) == ([(0, 300), (300, 600)], [])     # none faster


def test_a_step_slow_with_its_own_gpu_work_or_with_shapes_run_elsewhere_is_kept():
    """A batch 4x longer is 4x the GPU's work: its extra time is busy time, not a first run. Its extra time half
    idle and half busy, plus a microsecond of idle: a first run. Its shapes all ran in a kept step: a stall."""
    w = [(0, 100), (100, 500), (500, 600)]
    assert G.settled_windows(w, CHANGES, busy=[80, 380, 80]) == (w, [])                   # extra 300 busy, 100 idle
    assert G.settled_windows(w, CHANGES, busy=[80, 230, 80]) == (w, [])                   # 150 busy, 150 idle: kept
    assert G.settled_windows(w, CHANGES, busy=[80, 229, 80]) == ([w[0], w[2]], [w[1]])    # 149 busy, 151 idle
    a, b = {("t.py", "aten::mm", ((4, 8),))}, {("t.py", "aten::mm", ((4, 9),))}
    assert G.settled_windows(w, CHANGES, keys=[a, b, a]) == ([w[0], w[2]], [w[1]])       # (4, 9) ran nowhere else
    assert G.settled_windows(w, CHANGES, keys=[a | b, b, a]) == (w, [])                  # (4, 9) ran in step 0


def test_the_span_is_one_per_run_of_kept_steps_cut_where_a_set_apart_step_starts():
    w = [(0, 100), (100, 450), (450, 560), (560, 660), (670, 1000)]
    assert G.runs_span(w, w) == [(0, 1000)]                                   # all kept: first start to last end
    assert G.runs_span(w, [w[0], w[2], w[3]]) == [(0, 100), (450, 660)]        # the gap 660-670 inside a run is its
    tail = [(0, 130), (100, 450), (450, 560)]                                 # step 0's GPU work runs to 130
    assert G.runs_span(tail, [tail[0], tail[2]]) == [(0, 100), (450, 560)]     # cut where step 1 starts


def test_what_the_first_runs_cost_is_read_from_the_timed_steps():
    n = G.new_shape_facts([10.0, 95.0, 11.0, 12.0, 29.9, 30.0], profiled=5, first=2)
    assert n == {"profiled": 5, "profiled_first": 2, "timed": 6, "timed_first": 2, "settled_ms": 11.5,
                 "first_ms": (30.0, 95.0)}                                     # 29.9 ms is under 3x 10 ms: settled
    assert G.new_shape_facts([10.0, 95.0, 11.0], 5, 2, busy_ms=20.0)["settled_ms"] == 20.0   # not under its GPU work


def test_analyze_reads_the_settled_steps_and_says_what_the_first_runs_cost():
    """Three steps of which the second met a new shape (its launch took 9x longer): the facts are the other two's,
    the step time is the timed steps' settled median, and no stall or light profile is read."""
    from gpulab.diagnose.facts import StallFacts
    events, starts = [], (0, 1000, 10000)
    for i, (a, length) in enumerate(zip(starts, (40, 56, 40))):
        end = a + (8900 if i == 1 else 900)
        events += [step(a, end), op("aten::embedding", a + 10, a + 20, site=USER, shapes=((100, 8), (4, length))),
                   *launched("aten::mm", a + 30, end - 100, 50 + i, kernel_at=end - 90, kernel_us=50.0)]
    stalls = StallFacts(step_ms=(1.0, 1.2, 9.0, 1.1), slow=(2,), median_ms=1.1, mean_ms=3.1, period=None)
    f = analyze(events, step_ms=3.1, stalls=stalls, light_busy_ms=0.1, light_step_ms=3.0)
    assert f.steps == 2 and f.new_shapes["profiled_first"] == 1 and f.new_shapes["timed_first"] == 1
    assert f.step_ms == pytest.approx(1.1) and f.stalls is None and f.light_step_ms is None
    assert f.window_ms == pytest.approx(0.9)                                   # the two 900 us steps, not 9.9 ms
    assert f.shape_changes[0][1] == "aten::embedding"                          # the evidence keeps every step
    same = [e if e.name != "aten::embedding" else Event(e.kind, e.name, e.start_us, e.end_us, stream=e.stream,
                                                          site=USER, shapes=((100, 8), (4, 40))) for e in events]
    g = analyze(same, step_ms=3.1, stalls=stalls)                              # the same shapes: a slow step is read
    assert g.new_shapes is None and g.steps == 3 and g.stalls is stalls and g.step_ms == 3.1
    every = StallFacts(step_ms=(1.0, 1.2, 9.0, 1.1, 1.0, 9.1), slow=(2, 5), median_ms=1.1, mean_ms=3.9, period=3)
    h = analyze(events, step_ms=3.9, stalls=every)                             # slow every 3 steps: a periodic stall
    assert h.new_shapes is None and h.steps == 3 and h.stalls is every        # (a checkpoint), not a shape's first run


def test_first_runs_among_the_timed_steps_alone_give_the_settled_step_where_the_host_chose_the_shapes():
    """hf_trainer_dynamic_padding in a fresh process (one H100, 2026-12-07): 14 of 20 timed steps met a new length
    and took 125-234 ms, the profiled steps none; the diagnosis read the median, 119 ms, where the step settles near
    22 ms. No profiled step is set apart, and the settled step is the fast timed steps' median. Not where every timed
    step is slow (no settled step to read), nor where the GPU's values choose the shapes (nonzero: its syncs are the
    evidence), nor where the shapes do not change (a slow step is a stall)."""
    from gpulab.diagnose.facts import StallFacts
    events = []
    for i, (a, length) in enumerate(zip((0, 1000, 2000), (40, 56, 72))):
        events += [step(a, a + 900), op("aten::embedding", a + 10, a + 20, site=USER, shapes=((100, 8), (4, length))),
                   *launched("aten::mm", a + 30, a + 800, 50 + i, kernel_at=a + 810, kernel_us=50.0)]
    stalls = StallFacts(step_ms=(1.0, 9.0, 1.2, 9.5, 1.1), slow=(1, 3), median_ms=1.1, mean_ms=4.4, period=None)
    f = analyze(events, step_ms=1.2, stalls=stalls, light_busy_ms=0.1, light_step_ms=3.0)
    assert f.steps == 3 and f.new_shapes["profiled_first"] == 0 and f.new_shapes["timed_first"] == 2
    assert f.step_ms == pytest.approx(1.1) and f.stalls is None and f.light_step_ms is None
    even = StallFacts(step_ms=(9.0, 9.5, 9.2), slow=(), median_ms=9.2, mean_ms=9.2, period=None)
    assert analyze(events, step_ms=9.2, stalls=even).new_shapes is None           # none 3x the fastest
    fixed = [e if e.name != "aten::embedding" else Event(e.kind, e.name, e.start_us, e.end_us, stream=e.stream,
                                                           site=USER, shapes=((100, 8), (4, 40))) for e in events]
    assert analyze(fixed, step_ms=1.2, stalls=stalls).new_shapes is None          # the same shapes: stalls
    gpu_chosen = events + [op("aten::nonzero", a + 850, a + 860, site=("m.py", 9, "forward")) for a in (0, 1000, 2000)]
    assert analyze(gpu_chosen, step_ms=1.2, stalls=stalls).new_shapes is None     # the GPU's values chose them


def test_timed_steps_alone_are_not_first_runs_where_the_gpus_work_or_a_line_explains_them():
    """Review of 134fb54: with no profiled step to tell, slow timed steps are not called first runs where a bigger
    batch's own GPU work could make them (under NEW_SHAPE_FACTOR x the GPU's largest profiled step), where the fast
    ones are under the GPU's work per step (the host ran ahead inside a chunk: a step's host time is not its time),
    or where the stall search traced them to a line of their own."""
    from gpulab.diagnose.facts import StallFacts

    def events(kernel_us):
        out = []
        for i, (a, length, us) in enumerate(zip((0, 1000, 2000), (40, 56, 72), kernel_us)):
            out += [step(a, a + 900), op("aten::embedding", a + 10, a + 20, site=USER, shapes=((100, 8), (4, length))),
                    *launched("aten::mm", a + 30, a + 60, 50 + i, kernel_at=a + 100, kernel_us=us)]
        return out
    stall = lambda ms, **kw: StallFacts(step_ms=ms, slow=(1, 3), median_ms=sorted(ms)[2], mean_ms=sum(ms) / len(ms),  # noqa: E731
                                        period=None, **kw)
    gpu_work = stall((0.45, 1.5, 0.5, 1.6, 0.48))                  # fastest 0.45: 1.5 is a first run by the timed
    assert analyze(events((100, 400, 700)), step_ms=0.5, stalls=gpu_work).new_shapes is None    # steps; 3x 0.7 is 2.1
    assert analyze(events((100, 400, 400)), step_ms=0.5, stalls=gpu_work).new_shapes             # 3x 0.4 is 1.2: is one
    ahead = stall((0.1, 1.5, 0.12, 1.6, 0.11))                     # fast steps 0.11 ms, the GPU's work 0.4 ms
    assert analyze(events((400, 400, 400)), step_ms=0.5, stalls=ahead).new_shapes is None
    traced = stall((0.45, 1.5, 0.5, 1.6, 0.48), site="train.py:40 (step)", site_ms=1.0)
    assert analyze(events((100, 400, 400)), step_ms=0.5, stalls=traced).new_shapes is None


def test_the_first_runs_extra_host_time_is_named_by_op_self_time():
    """A shape's first run spent 90 ms more in a library op (cuDNN attention's plan, on an H100) nested in a
    wrapper: the op's own time is named, not its parent's (which only contains it), and an op under a tenth of the
    largest extra is left out."""
    def one(a, attn_us, mm_us):
        return [op("aten::scaled_dot_product_attention", a, a + attn_us + 20),
                op("aten::_cudnn_attention_forward", a + 10, a + 10 + attn_us),
                op("aten::mm", a + attn_us + 30, a + attn_us + 30 + mm_us)]
    ops = one(0, 100, 50) + one(1_000_000, 90_100, 60) + one(2_000_000, 100, 5_000)
    kept, first = [(0, 500_000), (2_000_000, 2_500_000)], [(1_000_000, 1_500_000)]
    assert G.self_ms_by_op(ops, first[0]) == pytest.approx({"aten::scaled_dot_product_attention": 0.02,
                                                            "aten::_cudnn_attention_forward": 90.1, "aten::mm": 0.06})
    (name, extra), = G.first_run_ops(ops, kept, first)          # mm: 0.06 ms against 2.5 ms kept, none extra
    assert name == "aten::_cudnn_attention_forward" and extra == pytest.approx(90.0)
    tenth = ops + [op("aten::add_", 1_200_000, 1_208_900)]       # 8.9 ms extra: under a tenth of 90, left out
    assert [n for n, _ in G.first_run_ops(tenth, kept, first)] == ["aten::_cudnn_attention_forward"]
    both = ops + [op("aten::add_", 1_200_000, 1_209_100)]        # 9.1 ms: named second
    assert [n for n, _ in G.first_run_ops(both, kept, first)] == ["aten::_cudnn_attention_forward", "aten::add_"]
