"""The variants `confirm` makes to the step's model from outside the step, and what says they took: the model
compiled in place (`compiled_in_place`, with CUDA graphs `cuda_graphs`), the step's own compile again with CUDA
graphs (`own_compile_graphed`), the model in channels_last (`channels_last`); and `Unavailable`, raised where a
variant cannot be made. Each is undone when it ends. Split from confirm.py (which ranks what they measure)."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from gpulab.diagnose.verdicts import Verdict


class Unavailable(Exception):
    """No variant can be made for this verdict here (the message says why)."""


def called_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules a step calls through `step.model`: the model itself where it has a forward (its class's or its
    own); where it has none, as an nn.ModuleList or nn.ModuleDict of the models a step trains (two networks that
    teach each other, a generator and its critic), its members, each once (a member without a forward: its own).
    A module without a forward that the step calls otherwise (its `encode` and `decode`) has its members compiled:
    part of what compiling it would make."""
    if type(model).forward is not torch.nn.Module.forward or "forward" in model.__dict__:     # its class's, or its own
        return [model]
    found: dict = {}
    for child in model.children():
        for m in called_modules(child):
            found.setdefault(id(m), m)
    return list(found.values())


def models_named(model) -> str:
    """How a measurement names what a variant made to `step.model`: "the model", or, for a container of several
    (`called_modules`), "each of the N models in step.model"."""
    n = len(called_modules(model)) if isinstance(model, torch.nn.Module) else 1
    return "the model" if n <= 1 else f"each of the {n} models in step.model"


@contextlib.contextmanager
def compiled_in_place(model: torch.nn.Module, **compile_kwargs) -> Iterator[None]:
    """`model.forward` replaced by its torch.compile'd self (so calling the model runs the compiled code, whoever
    calls it), put back after, and torch.compile's state reset (CUDA graphs' memory pool included); a container of
    models, each of its `called_modules` likewise. Public API only: the instance attribute `forward` shadows the
    class's method, and removing it restores it."""
    members = called_modules(model)
    if not members:
        raise Unavailable("the step's model (step.model) holds no module with a forward to compile")
    owns = [m.__dict__.get("forward") for m in members]          # a forward set on the instance before, kept
    try:
        for m in members:
            m.forward = torch.compile(m.forward, **compile_kwargs)
        yield
    finally:                                    # also where a member's compile raised before the others were made
        for m, own in zip(members, owns):
            if own is None:
                m.__dict__.pop("forward", None)
            else:
                m.forward = own
        torch.compiler.reset()


@contextlib.contextmanager
def cuda_graphs(model: torch.nn.Module, device: torch.device) -> Iterator[str]:
    """`model` compiled in place with torch.compile(mode="reduce-overhead") (`compiled_in_place`), undone after."""
    if device.type != "cuda":
        raise Unavailable("CUDA graphs exist only on a GPU")
    with compiled_in_place(model, mode="reduce-overhead"):
        yield 'the model compiled with mode="reduce-overhead" (CUDA graphs)'


# What `own_compile_graphed` does, in a measurement's words (its context yields it; confirm's report says it).
OWN_GRAPHS = "the step's own torch.compile again with CUDA graphs (what mode=\"reduce-overhead\" sets)"


@contextlib.contextmanager
def own_compile_graphed(device: torch.device) -> Iterator[str]:
    """The step's own torch.compile'd code compiled again with CUDA graphs: inductor's `triton.cudagraphs` (the
    option mode="reduce-overhead" sets) switched on and torch.compile's caches reset, so that the step's next call
    recompiles under it; both undone after. A synchronization inside the compiled forward is a graph break:
    CUDA Graph Trees record one graph per compiled region and run the code between the regions as it is (the
    PyTorch docs' "CUDAGraph Trees"). A step compiled with another backend than inductor is not changed by it:
    its time then measures no graphs (a launch verdict on it would be demoted by a measurement of nothing)."""
    if device.type != "cuda":
        raise Unavailable("CUDA graphs exist only on a GPU")
    from torch._inductor import config

    was = config.triton.cudagraphs
    torch.compiler.reset()
    config.triton.cudagraphs = True
    try:
        yield OWN_GRAPHS
    finally:
        torch.compiler.reset()            # with the option still on, so that the backends free the graphs' pool
        config.triton.cudagraphs = was
        try:
            from torch._inductor.cudagraph_trees import reset_cudagraph_trees
            reset_cudagraph_trees()
        except Exception:       # noqa: BLE001 - inductor internals; torch.compiler.reset() has done it where it can
            pass


@contextlib.contextmanager
def channels_last(model: torch.nn.Module) -> Iterator[str]:
    """layout_transposes' variant: `model` converted to channels_last in place (`Module.to(memory_format=)` keeps
    the Parameter objects, so the step's optimizer updates the same ones) and every 4-D tensor handed to its
    forward (each of its `called_modules`) converted likewise (a forward pre-hook); both undone after. An optimizer
    state made before (a momentum buffer) keeps its layout, which the update reads in its slower per-tensor path; a
    step that calls other modules than `step.model` converts only that one."""
    def converted(t):
        return t.contiguous(memory_format=torch.channels_last) if isinstance(t, torch.Tensor) and t.dim() == 4 else t

    def hook(module, args, kwargs):
        return tuple(converted(a) for a in args), {k: converted(x) for k, x in kwargs.items()}

    if not any(isinstance(m, (torch.nn.Conv2d, torch.nn.ConvTranspose2d)) for m in model.modules()):
        raise Unavailable("the step's model has no 2-D convolution (nn.Conv2d, nn.ConvTranspose2d) whose layout "
                          "channels_last would change")
    model.to(memory_format=torch.channels_last)
    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in called_modules(model)]
    try:
        yield "channels_last (the model and the 4-D tensors given to it)"
    finally:
        for handle in handles:
            handle.remove()
        model.to(memory_format=torch.contiguous_format)


def took_own_graphs(step: Callable) -> None:
    """Unavailable unless one run of `step` under `own_compile_graphed` compiled again and inductor skipped no
    CUDA graph: a step whose graphs inductor refused (a CPU input, a mutated input) would be timed as it is."""
    from gpulab.diagnose.core import compile_counters

    skips = compile_counters().get("cudagraph_skips", 0)
    took_graphs(step)
    if compile_counters().get("cudagraph_skips", 0) > skips:
        raise Unavailable("inductor skipped the CUDA graphs of the step's compiled code (TORCH_LOGS=perf_hints says why)")


def through_block(v: Verdict) -> Verdict:
    """A launch verdict blocked by compile_graph_breaks whose CUDA graphs were measured with the breaks left in
    (`own_compile_graphed`) and kept its promise: no longer blocked (the graphs worked around the breaks), ranked
    on that measurement; demoted, it stays blocked. On the H100 (2026-12-07) compile_graph_break's labels read
    2.23x for that fix against 1.44x for removing its four breaks a step, where the block had ranked the breaks
    first (results/zoo/2026-12-07-h100-issue41/NOTES.md): written after that reading."""
    from dataclasses import replace

    if v.rule != "launch_bound" or v.blocked_by != "compile_graph_breaks" or v.measured is None or v.demoted:
        return v
    return replace(v, blocked_by="", confirmation=v.confirmation + "; the graphs worked with the graph breaks left "
                   "in (one graph per compiled region), so it no longer waits for compile_graph_breaks")


def took_graphs(step: Callable) -> None:
    """Unavailable unless one run of `step` under the CUDA-graph variant compiled something: a step that does not
    call `step.model` itself (it calls a part of it, or another module) runs as before, and its time would
    measure nothing."""
    from gpulab.diagnose.core import compile_counters

    before = compile_counters().get("graphs", 0)
    step()
    if compile_counters().get("graphs", 0) == before:
        raise Unavailable("the step does not call its model (step.model) itself: compiling it changed nothing")
