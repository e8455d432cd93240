"""The variants made to the step's model from outside (gpulab.diagnose.model_variants) where `step.model` is a
container of the models the step trains, and the reduce-overhead compile measured after a default compile that did
not pay (confirm.graphs_after_fusing). CPU only: the compile backend and the GPU timings are stand-ins; what is
judged is what gets compiled and what gets decided."""
import contextlib
from types import SimpleNamespace

import pytest
import torch

from gpulab.diagnose import confirm as C
from gpulab.diagnose import model_variants as M
from gpulab.diagnose import rules as R
from gpulab.diagnose.core import Diagnosis
from gpulab.diagnose.facts import CAUSES, CLASSES, Facts
from gpulab.diagnose.rules import verdict

CPU = torch.device("cpu")


def diagnosis(host_code_ms: float, step_ms: float) -> Diagnosis:
    """A CPU diagnosis from Facts: a `step_ms` step whose host spent `host_code_ms` in its own code."""
    host = dict.fromkeys(CAUSES, 0.0) | {"host_code": host_code_ms}
    facts = Facts(on_gpu=False, steps=1, window_ms=step_ms, busy_ms=step_ms - host_code_ms, idle_ms=host_code_ms,
                  idle_by_cause=dict(host), busy_by_class=dict.fromkeys(CLASSES, 0.0), host_by_cause=host,
                  step_ms=step_ms, precopy_ms=0.0)
    return Diagnosis.from_facts(facts, device="cpu")


def convnet():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten())


def test_called_modules_are_the_model_or_the_members_of_a_container_without_a_forward():
    a, b, c = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    assert M.called_modules(a) == [a]
    seq = torch.nn.Sequential(a, b)                        # a container with a forward: the step calls it whole
    assert M.called_modules(seq) == [seq]
    pair = torch.nn.ModuleList([a, b])                     # co-teaching: two networks, each called by the step
    assert M.called_modules(pair) == [a, b]
    nested = torch.nn.ModuleDict({"gen": torch.nn.ModuleList([a, b]), "critic": c, "again": a})
    assert M.called_modules(nested) == [a, b, c]          # each once, a container's members in order
    assert M.called_modules(torch.nn.ModuleList()) == []
    wrapper = torch.nn.ModuleList([a])                      # a forward set on the instance: the step calls it
    wrapper.forward = lambda x: a(x)
    assert M.called_modules(wrapper) == [wrapper]


def test_a_container_of_models_has_each_member_compiled_in_place_and_put_back():
    """coteaching_numpy_argsort (H100, 2026-12-07): step.model is an nn.ModuleList of the two networks; compiling
    the list compiled nothing ('the step does not call its model itself'), so its compile and CUDA-graph variants
    were never measured. Each member is compiled now; the list is put back as it was."""
    ran = []

    def backend(gm, example_inputs):
        def counted(*args):
            ran.append(len(args))
            return gm.forward(*args)
        return counted

    a, b = convnet(), convnet()
    pair = torch.nn.ModuleList([a, b])
    x = torch.randn(2, 3, 6, 6)
    want = (a(x), b(x))
    with C.compiled_in_place(pair, backend=backend):
        assert "forward" in a.__dict__ and "forward" in b.__dict__ and "forward" not in pair.__dict__
        got = (a(x), b(x))
        assert len(ran) == 2, ran          # both members ran compiled code (one compiled graph may serve both)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert "forward" not in a.__dict__ and "forward" not in b.__dict__
    with pytest.raises(M.Unavailable, match="no module with a forward"):
        with C.compiled_in_place(torch.nn.ModuleList(), backend=backend):
            pass


def test_a_container_of_convnets_has_every_members_input_in_channels_last():
    """The channels_last variant's hook on a container nobody calls would never run: each member gets it."""
    a, b = convnet(), convnet()
    pair = torch.nn.ModuleList([a, b])
    seen = []
    for m in (a, b):
        m.register_forward_hook(lambda m, args, out: seen.append(args[0].is_contiguous(memory_format=torch.channels_last)))
    x = torch.randn(2, 3, 6, 6)
    with C.channels_last(pair):
        a(x), b(x)
        assert a[0].weight.is_contiguous(memory_format=torch.channels_last)
    a(x)
    assert seen == [True, True, False]
    assert not a._forward_pre_hooks and not b._forward_pre_hooks and a[0].weight.is_contiguous()


def test_the_reduce_overhead_compile_is_measured_after_a_default_compile_that_did_not_pay(monkeypatch):
    """torchvision_reference_classification (H100, 2026-12-07): the model compiled by default measured 0.979x
    (13.9 -> 14.2 ms), a note still, and no launch verdict fired (the GPU idled 0.78 ms of 13.9); the labels'
    reduce-overhead compile read 1.58x and 1.53x. A compile that does not pay alone is what a host pacing the
    fused step looks like: the graphs are measured too, and must beat the compiled step beyond the spreads and the
    step as written by COMPILE_PROMOTE_MIN beyond its spread. Stand-in timings; the decision is judged."""
    gpu = torch.device("cuda")                      # a device object only: nothing runs on it here
    d = diagnosis(0.1, 13.9)
    d.step_spread_ms = 0.03
    note = verdict("elementwise_unfused", "unfused elementwise work", "12", 0.6, "e", "torch.compile",
                   actionable=False)
    monkeypatch.setattr(C, "graphs_variant", lambda v, facts, step, device: (contextlib.nullcontext(), step, None))
    monkeypatch.setattr(R, "graphs_blocked_by", lambda f: "")

    def graphs(ms, spread=0.05):
        monkeypatch.setattr(C, "measure", lambda *a, **k: SimpleNamespace(median_ms=ms, spread_ms=spread))
        return C.graphs_after_fusing(d, [note], lambda: None, gpu, 5, fused_ms=14.2, fused_spread_ms=0.05)

    assert C.after_fusing_wants_graphs([note])       # a note, measured and not promoted, still asks
    (v,) = graphs(8.8)                               # 1.58x
    assert v.rule == "launch_bound" and v.actionable and v.measured == pytest.approx(13.9 / 8.8)
    assert R.rank([note, v])[0] is v
    # faster than the compiled step, but not COMPILE_PROMOTE_MIN faster than the step as written: nothing
    edge = (13.9 - 0.03 - 0.05) / C.COMPILE_PROMOTE_MIN
    assert graphs(edge + 0.01) == []
    assert len(graphs(edge - 0.01)) == 1
    # within the spreads of the compiled step: nothing (a promoted compile, so the step-as-written gate passes)
    monkeypatch.setattr(C, "measure", lambda *a, **k: SimpleNamespace(median_ms=9.95, spread_ms=0.05))
    assert C.graphs_after_fusing(d, [note], lambda: None, gpu, 5, fused_ms=10.0, fused_spread_ms=0.05) == []
    monkeypatch.setattr(C, "measure", lambda *a, **k: SimpleNamespace(median_ms=9.85, spread_ms=0.05))
    assert len(C.graphs_after_fusing(d, [note], lambda: None, gpu, 5, fused_ms=10.0, fused_spread_ms=0.05)) == 1
    # a launch verdict fired already: its own variant measures it
    launch = verdict("launch_bound", "launch", "11", 0.2, "e", "graphs")
    assert not C.after_fusing_wants_graphs([note, launch])
    assert C.graphs_after_fusing(d, [note, launch], lambda: None, gpu, 5, 14.2, 0.05) == []


def test_confirm_runs_the_graphs_after_a_note_that_stayed_a_note(monkeypatch):
    """confirm_verdicts asks graphs_after_fusing after the elementwise note's compile, promoted or not."""
    monkeypatch.setattr(C, "COMPILE_KWARGS", {"backend": "eager"})
    asked = []
    monkeypatch.setattr(C, "graphs_after_fusing", lambda d, out, step, device, steps, ms, spread: asked.append(ms) or [])
    model = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)

    def step():
        model(x).sum().backward()
    step.model = model
    d = diagnosis(0.1, 5.0)            # 5 ms as written; the compiled step runs in far less
    d.verdicts = [verdict("elementwise_unfused", "unfused", "12", 0.5, "e", "torch.compile", actionable=False)]
    C.confirm_verdicts(d, step, CPU, steps=1)
    assert len(asked) == 1
    d = diagnosis(0.1, 1e-6)           # 'as written' faster than anything: the note stays a note
    d.verdicts = [verdict("elementwise_unfused", "unfused", "12", 0.5, "e", "torch.compile", actionable=False)]
    C.confirm_verdicts(d, step, CPU, steps=1)
    assert len(asked) == 2 and not d.verdicts[0].actionable


def test_a_compile_that_raises_on_the_second_member_leaves_the_first_as_it_was(monkeypatch):
    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    real = torch.compile
    made = []

    def compile_once(fn, **kwargs):
        if made:
            raise RuntimeError("no compiler for this one")
        made.append(fn)
        return real(fn, **kwargs)
    monkeypatch.setattr(torch, "compile", compile_once)
    with pytest.raises(RuntimeError, match="no compiler"):
        with M.compiled_in_place(torch.nn.ModuleList([a, b]), backend="eager"):
            pass
    assert made and "forward" not in a.__dict__ and "forward" not in b.__dict__


def test_a_step_that_trains_a_modulelist_of_two_models_has_its_compile_measured(monkeypatch):
    """Through confirm_verdicts, as coteaching_numpy_argsort's diagnosis runs it: its compile variant said "not
    measured: the step does not call its model (step.model) itself" before; now both members are compiled."""
    monkeypatch.setattr(C, "COMPILE_KWARGS", {"backend": "eager"})
    a, b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)

    def step():
        (a(x).sum() + b(x).sum()).backward()
    step.model = torch.nn.ModuleList([a, b])
    d = diagnosis(0.1, 5.0)
    d.verdicts = [verdict("elementwise_unfused", "unfused", "12", 0.5, "e", "torch.compile", actionable=False)]
    C.confirm_verdicts(d, step, CPU, steps=1)
    (v,) = d.verdicts
    assert "with each of the 2 models in step.model compiled (torch.compile, default mode)" in v.confirmation, \
        v.confirmation                                       # measured, and said of both models
    assert "forward" not in a.__dict__ and "forward" not in b.__dict__
