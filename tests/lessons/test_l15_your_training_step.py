"""Lesson 15's slow step and its fixes, on the CPU at tiny size."""
import pytest
import torch

from gpulab.lessons import l15_your_training_step as L

CPU = torch.device("cpu")


def test_the_slow_step_trains_and_every_fix_changes_one_habit():
    cfg = L.config("tiny")
    step = L.TrainingStep(L.Options(), cfg, CPU, passes=1)
    try:
        first = step()
        assert isinstance(first, float) and first > 0          # .item() every step: a float
    finally:
        step.close()
    slow = L.Options()
    for rule, fix in L.fixes(cfg).items():
        changed = {k for k in vars(slow) if getattr(fix(slow), k) != getattr(slow, k)}
        assert len(changed) == 1, (rule, changed)


def test_the_input_fix_doubles_the_workers_up_to_the_cores(monkeypatch):
    import gpulab.lessons.l03_input_pipeline as L03
    monkeypatch.setattr(L, "cpu_cores", lambda: 16)
    monkeypatch.setattr(L03, "cpu_cores", lambda: 16)
    more = L.fixes({"workers": 8})["input_bound"]
    assert more(L.Options()).workers == 8
    assert more(L.Options(workers=8)).workers == 16
    assert more(L.Options(workers=16)) == L.Options(workers=16)      # no core left: the fix changes nothing


def test_bad_options_are_refused_with_a_reason():
    with pytest.raises(ValueError, match="precision"):
        L.TrainingStep(L.Options(precision="fp8"), L.config("tiny"), CPU, passes=1)
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        L.TrainingStep(L.Options(pinned=True), L.config("tiny"), CPU, passes=1)


def test_measured_gain_against_the_bound():
    g = L.measured_gain(100.0, 20.0, bound=5.0)                  # promised 80 % of the step, saved 80 %
    assert g["speedup"] == pytest.approx(5.0) and g["of_promised"] == pytest.approx(1.0)
    assert L.measured_gain(100.0, 60.0, bound=2.0)["of_promised"] == pytest.approx(0.8)
    # an H200 run where pinning saved 120 % of its promise (16.77 -> 10.62 ms, bound 1.438x; results/course/
    # 2026-11-30-h200-15-at-ad297bd/): within it if the steps spread as widely as the pinned step did in the next run
    # (6 of 11.5 ms), beyond it if they repeat within 1 %
    g = L.measured_gain(16.77, 10.62, bound=1.438, spread_before=0.0, spread_after=0.52)
    assert g["of_promised"] == pytest.approx(1.20, abs=0.01) and g["within"] and g["enough"]
    assert g["of_promised_max"] > g["of_promised"]
    over = L.measured_gain(16.77, 10.62, bound=1.438, spread_before=0.01, spread_after=0.01)
    assert not over["within"] and over["of_promised_max"] < over["of_promised"]
    assert L.measured_gain(10.0, 10.0, bound=1.0)["of_promised"] is None     # nothing promised


def test_the_step_flops_count_every_layer():
    # 6 FLOPs per multiply-add per sample: in->w, (depth-1) w->w, w->classes
    assert L.step_flops(12, 8, 2, 10, batch=1) == 6 * (12 * 8 + 8 * 8 + 8 * 10)


def test_the_fp16_fix_trains_through_a_grad_scaler():
    """A GPU without bf16 (a T4, a V100) takes this path: fp16 autocast with loss scaling. Run here on
    the CPU's own autocast and scaler, so the code is exercised where CI runs."""
    step = L.TrainingStep(L.Options(precision="16-bit"), L.config("tiny"), CPU, passes=1)
    try:
        step.half = torch.float16
        step.scaler = torch.amp.GradScaler("cpu")
        before = [p.detach().clone() for p in step.model.parameters()]
        loss = step()
        assert loss > 0 and step.scaler.get_scale() > 0
        assert any(not torch.equal(a, p) for a, p in zip(before, step.model.parameters()))   # it trained
    finally:
        step.close()


def test_where_it_went_lists_the_largest_changes_first():
    from types import SimpleNamespace

    from gpulab.diagnose.analyze import CAUSES, Facts
    from gpulab.lessons.l15_your_training_step import fmt_changes, where_it_went

    def diag(host_by_cause, busy_by_class, step_ms):
        """A diagnosis whose host spent `host_by_cause` on each cause while the GPU ran `busy_by_class`."""
        busy = sum(busy_by_class.values())
        host = dict.fromkeys(CAUSES, 0.0) | host_by_cause
        facts = Facts(on_gpu=True, steps=1, window_ms=step_ms, busy_ms=busy, idle_ms=step_ms - busy,
                      idle_by_cause={"other": step_ms - busy}, busy_by_class=busy_by_class, step_ms=step_ms,
                      host_by_cause=host)
        return SimpleNamespace(facts=facts, busy_by_class=busy_by_class)

    # pinning: the copy's staging and its kernel shrink, and so does the input hand-over
    before = diag({"input": 2.0, "pageable_copy": 3.0, "launch": 0.5}, {"copy": 1.5, "gemm_tensor_core": 5.0}, 12.0)
    after = diag({"input": 0.5, "launch": 0.5}, {"copy": 0.3, "gemm_tensor_core": 5.0}, 6.3)
    changes = where_it_went(before, after)
    assert [name for name, _ in changes] == ["idle pageable_copy", "idle input", "busy copy"]
    assert changes[0][1] == pytest.approx(-3.0) and changes[2][1] == pytest.approx(-1.2)
    assert fmt_changes(changes) == "idle pageable_copy -3 ms, idle input -1.5 ms, busy copy -1.2 ms"
    # the idle a cause can be charged is at most the GPU's: 8 ms on the host against 5.5 ms of idle
    capped = diag({"input": 8.0}, {"copy": 1.5, "gemm_tensor_core": 5.0}, 12.0)
    assert where_it_went(capped, after, top=1) == [("idle input", pytest.approx(0.5 - 5.5))]


def test_every_fix_is_named_by_a_rule_of_the_diagnosis():
    from gpulab.diagnose.rules import RULES

    assert set(L.fixes(L.config("tiny"))) <= {r.__name__ for r in RULES}


def test_the_width_fits_the_parameter_copies_the_notebook_holds_in_the_gpus_memory():
    # The H200 of 2026-12-03 under the t4 profile (15 GiB, 2 cores) sized the MLP 16384 wide from the step's
    # time alone; cell 4 ran out of memory. Any FLOP budget: PARAM_COPIES fp32 copies fit in the memory's share.
    cfg = L.config("full")
    n_in, d, c = 3 * cfg["size"] ** 2, cfg["depth"], cfg["classes"]

    def params(w):
        with torch.device("meta"):                         # shapes only: nothing allocated or initialised
            return sum(p.numel() for p in L.mlp(n_in, w, d, c, torch.device("meta")).parameters())

    for gib in (15, 16, 24, 40):
        memory = gib * 2 ** 30
        w = L.width_for(cfg, 1e18, memory)
        assert w % 64 == 0 and cfg["min_width"] <= w < cfg["max_width"], w
        assert 4 * L.PARAM_COPIES * params(w) <= L.MEMORY_SHARE * memory, (gib, w)
        assert 4 * L.PARAM_COPIES * params(w + 64) > L.MEMORY_SHARE * memory, (gib, w)   # the widest that fits
    assert L.width_for(cfg, 1e18, 80 * 2 ** 30) == cfg["max_width"]       # 80 GiB and more: the time decides
    assert L.width_for(cfg, 1e18) == cfg["max_width"]
    small = L.width_for(cfg, 6 * cfg["batch"] * (n_in * 1024 + (d - 1) * 1024 ** 2), 80 * 2 ** 30)
    assert small == 1024                                                   # the time decides when it is the lower


def test_param_copies_is_the_most_copies_alive_at_once_with_the_slow_step_beside(monkeypatch):
    """Counted while same_training runs beside a trained slow step, as notebook 15's cell does: every parameter
    list still referenced (weakly held, so a forgotten holder counts), and every live step's weights, momentum
    and gradients, at each parameter copy and each optimizer step. The most at once is at most PARAM_COPIES."""
    import weakref
    import gpulab.models.same as same     # where `trained` takes its copies of the parameters
    lists, steps, peak = [], weakref.WeakSet(), [0]
    copy, init, sgd_step = same.parameters, L.TrainingStep.__init__, torch.optim.SGD.step

    def alive():
        n = sum(r() is not None for r in lists)
        for s in list(steps):
            if s.model is not None:
                n += 1 + bool(s.optimizer.state) + any(p.grad is not None for p in s.model.parameters())
        peak[0] = max(peak[0], n)

    def counting_copy(model):
        out = copy(model)
        lists.append(weakref.ref(out[0]))
        alive()
        return out

    def counting_init(self, *a, **k):
        init(self, *a, **k)
        steps.add(self)

    def counting_step(self, *a, **k):
        alive()                                            # the gradients are there, the momentum from step 2
        return sgd_step(self, *a, **k)

    monkeypatch.setattr(same, "parameters", counting_copy)
    monkeypatch.setattr(L.TrainingStep, "__init__", counting_init)
    monkeypatch.setattr(torch.optim.SGD, "step", counting_step)
    cfg = L.config("tiny")
    slow = L.TrainingStep(L.Options(), cfg, torch.device("cpu"), width=cfg["width"], passes=1)
    slow()
    slow()                                                 # the notebook's slow step: weights and momentum
    ok, why = L.same_training(L.Options(precision="16-bit"), cfg, torch.device("cpu"), cfg["width"], 1, k=2)
    assert ok, why                                         # a change of precision: the fp32 floors too, six lists
    assert 2 + 6 + 3 <= peak[0] <= L.PARAM_COPIES, peak[0]
    slow.close()
    assert slow.model is None and slow.optimizer is None   # a closed step holds no copy


def test_the_width_says_what_set_it(monkeypatch):
    """Notebook 15 prints why its MLP is as wide as it is: the step's time, the memory, or no ceiling to size from."""
    from types import SimpleNamespace
    cfg = L.config("full")
    gpu = torch.device("cuda", 0)                          # only its type is read before the stubs below
    monkeypatch.setattr(L, "first_workers", lambda cfg: 2)
    monkeypatch.setattr(L, "free_memory", lambda device: (0, 15 * 2 ** 30))
    monkeypatch.setattr(L, "ceilings", lambda: {})
    assert "no measured fp32 ceiling" in L.model_width_why(cfg, cfg["sample_ms"], gpu)[1]

    def ceiling(tflops):
        monkeypatch.setattr(L, "ceilings", lambda: {"matmul_fp32": SimpleNamespace(value=tflops, source="measured")})

    ceiling(50.0)                                          # an H200's fp32 under a T4's 2 cores: memory decides
    w, why = L.model_width_why(cfg, cfg["sample_ms"], gpu)
    assert w == L.width_for(cfg, 1e18, 15 * 2 ** 30) and why.startswith("capped by memory") and "15.0 GiB" in why
    ceiling(4.5)                                           # a T4's own fp32: the step's time decides
    w, why = L.model_width_why(cfg, cfg["sample_ms"], gpu)
    assert w < L.width_for(cfg, 1e18, 15 * 2 ** 30) and why.startswith("set by the step's time") and "4.5 TFLOP/s" in why
    assert L.model_width_why(L.config("tiny"), 0.05, gpu)[1] == "the config's width at this scale"


def test_each_round_is_compared_with_the_round_before_it(monkeypatch):
    """Issue 40: after the 16-bit round, a round compared with the fp32 slow step had the 16-bit rounding in its
    floor and could hardly fail. Against the previous round, with no change of precision, the floor is the
    reordering alone: a real change (another learning rate) fails, more workers pass."""
    from dataclasses import replace
    cfg = L.config("tiny")
    cpu = torch.device("cpu")
    half = L.Options(precision="16-bit")
    ok, why = L.same_training(replace(half, workers=1), cfg, cpu, cfg["width"], 1, k=2, before=half)
    assert ok and "16-bit rounding" not in why and "previous round" in why, why
    init = L.TrainingStep.__init__

    def planted(self, options=L.Options(), *a, **k):       # the 2-worker step learns 1 % faster: a real change
        init(self, options, *a, **k)
        if options.workers == 2:
            for g in self.optimizer.param_groups:
                g["lr"] *= 1.01
    monkeypatch.setattr(L.TrainingStep, "__init__", planted)
    real = L.same_training(replace(half, workers=2), cfg, cpu, cfg["width"], 1, k=2, before=half)
    assert not real[0], real[1]


def test_the_16_bit_round_fails_a_step_that_lost_a_gradient(monkeypatch):
    """The round that changes the precision compares the 16-bit step with its own fp32 twin in the floor, the very
    distance it judges; each tensor's movement is what can fail: a 16-bit step whose first layer's gradient is lost
    (flushed to zero) moves that tensor nowhere and is refused, the honest 16-bit step passes."""
    cfg = L.config("tiny")
    cpu = torch.device("cpu")
    half = L.Options(precision="16-bit")
    ok, why = L.same_training(half, cfg, cpu, cfg["width"], 1, k=2)
    assert ok and "tensors moved" in why, why
    init = L.TrainingStep.__init__

    def planted(self, options=L.Options(), *a, **k):
        init(self, options, *a, **k)
        if options.precision == "16-bit" and self.half is not torch.float32:   # lost only where 16-bit is on
            next(self.model.parameters()).register_hook(torch.zeros_like)
    monkeypatch.setattr(L.TrainingStep, "__init__", planted)
    lost = L.same_training(half, cfg, cpu, cfg["width"], 1, k=2)
    assert "within 4x the floor" in lost[1], lost[1]          # the floor comparison passes: it holds this distance
    assert not lost[0] and "tensor 0 is outside it" in lost[1], lost[1]


def test_a_rounds_record_keeps_what_its_verdict_was_computed_from():
    """Issue 40: the pinning round's bound on the H100 (2026-12-06) could not be recomputed from the records; each
    round's fix_bound record now keeps the diagnosis's facts the rules read, as plain JSON values."""
    import json
    from types import SimpleNamespace
    from gpulab.diagnose.facts import Facts
    f = Facts(on_gpu=True, steps=5, window_ms=12.5, busy_ms=12.2, idle_ms=0.3, idle_by_cause={}, busy_by_class={},
              step_ms=11.28, light_busy_ms=11.0, light_step_ms=11.9, pageable_copy_ms=0.2,
              host_by_cause={"pageable_copy": 1.7, "launch": 3.8, "sync": 0.0},
              syncs=(("l15.py:232", "", 0.06, 1.0),), host_sites={"after_sync": (("l15.py:232", "", 0.29),)},
              pinnable_sites=("l15.py:231", "l15.py:232"))
    got = L.round_facts(SimpleNamespace(facts=f))
    assert got["light_busy_ms"] == 11.0 and got["busy_ms"] == 12.2 and got["host_ms"] == {"pageable_copy": 1.7, "launch": 3.8}
    assert got["after_sync"] == [["l15.py:232", 0.29]] and got["pinnable_sites"] == ["l15.py:231", "l15.py:232"]
    assert json.loads(json.dumps(got)) == got
