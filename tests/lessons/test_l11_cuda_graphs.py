import pytest
import torch

from gpulab.core.device import require_cuda
from gpulab.lessons.l11_cuda_graphs import MLP, NO_GRAPHS, capture_violation, make_mlp_step, max_difference, tiny_ops, tiny_ops_reference

CPU = torch.device("cpu")


def test_tiny_ops_matches_reference():
    x = torch.randn(64)
    for count in (1, 2, 7, 400):
        assert max_difference(tiny_ops(x, count), tiny_ops_reference(x, count)) < 1e-4


def test_tiny_ops_refuses_zero():
    with pytest.raises(ValueError):
        tiny_ops(torch.zeros(1), 0)


def test_require_cuda_refuses_cpu():
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        require_cuda(NO_GRAPHS, CPU)


def test_mlp_step_matches_backward():
    torch.manual_seed(0)
    model = MLP(width=16, depth=3)
    x, t = torch.randn(4, 16), torch.randn(4, 16)
    loss, *grads = make_mlp_step(model)(x, t)
    model(x, t).backward()
    assert max_difference(grads, [p.grad for p in model.parameters()]) < 1e-6
    assert len(grads) == 6 and loss.ndim == 0


def test_mlp_step_returns_a_detached_loss():
    # A loss that still holds its autograd graph keeps the gradient-accumulator nodes (and the
    # stream they were made on) alive, which breaks a later CUDA graph capture (pytorch#164302).
    model = MLP(width=8, depth=2)
    loss, *grads = make_mlp_step(model)(torch.randn(2, 8), torch.randn(2, 8))
    assert loss.grad_fn is None and not loss.requires_grad
    assert all(g.grad_fn is None for g in grads)


def test_mlp_step_accepts_a_compiled_module():
    # `loss_model or model` called len() on torch.compile's wrapper, which raises: found on the H200.
    model = MLP(width=8, depth=2)
    make_mlp_step(model, torch.compile(model))      # compiles lazily: nothing runs here


@pytest.mark.gpu
def test_mlp_step_captures_after_an_eager_step():
    from gpulab.lessons.l11_cuda_graphs import capture
    model = MLP(width=64, depth=3).cuda()
    x, t = torch.randn(8, 64, device="cuda"), torch.randn(8, 64, device="cuda")
    step = make_mlp_step(model)
    eager = [r.clone() for r in step(x, t)]          # an eager step first, as notebook 11 does
    graph, out = capture(step, x, t)
    graph.replay()
    assert max_difference(out, eager) < 1e-3


def test_max_difference_checks_lengths():
    with pytest.raises(ValueError):
        max_difference([torch.zeros(1)], [torch.zeros(1), torch.zeros(1)])


@pytest.mark.cpu_only
def test_capture_violation_refuses_cpu():
    with pytest.raises(ValueError):
        capture_violation("item")


def test_capture_violation_refuses_unknown_kind():
    with pytest.raises(ValueError, match="kind"):
        capture_violation("print")


def test_capture_violations_refuse_an_unknown_kind_before_starting_anything():
    from gpulab.lessons.l11_cuda_graphs import capture_violations
    with pytest.raises(ValueError, match="kind"):
        capture_violations(("item", "print"))


@pytest.mark.gpu
def test_capture_violations_each_raise_in_their_own_process():
    from gpulab.lessons.l11_cuda_graphs import capture_violations
    said = capture_violations()
    assert set(said) == {"item", "synchronize"}
    assert all(text.startswith("raised ") for text in said.values()), said


def test_cudagraph_skips_and_gpu_memory_on_the_cpu(on_cpu):
    from gpulab.lessons.l11_cuda_graphs import cudagraph_skips, gpu_memory, step_profile
    assert isinstance(cudagraph_skips(), int) and cudagraph_skips() >= 0
    if not torch.cuda.is_available():
        assert gpu_memory() == (0, 0)
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        step_profile(lambda: None)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_step_profile_and_graph_pool_on_a_gpu():
    from gpulab.lessons.l11_cuda_graphs import capture, gpu_memory, step_profile
    x = torch.randn(1024, device="cuda")
    g, out = capture(lambda v: tiny_ops(v, 50), x)
    p = step_profile(g.replay, steps=5)
    assert p["kernels"] == pytest.approx(50) and 0 < p["GPU busy ms"] <= p["wall ms"]
    torch.cuda.empty_cache()
    held = gpu_memory()[1]
    del g, out
    torch.cuda.empty_cache()
    assert gpu_memory()[1] < held           # the graph's private pool went back with the graph


def test_graph_pool_memory_refuses_the_cpu_with_the_lessons_reason():
    import gpulab.lessons.l11_cuda_graphs as L
    if torch.cuda.is_available():
        pytest.skip("on a GPU it measures; this checks the CPU's refusal")
    with pytest.raises(ValueError, match="CUDA"):
        L.graph_pool_memory(64, 2, 8)


def test_the_graph_pool_script_is_valid_python_for_any_sizes():
    import ast
    import gpulab.lessons.l11_cuda_graphs as L
    ast.parse(L.POOL_SCRIPT.format(width=512, depth=8, batch=64, device="cuda:0"))


def test_pool_split_separates_the_graphs_pool_from_what_outlives_it():
    """Issue 24: the 144 MiB called the graph's pool was mostly cuBLAS workspaces, which outlive the graph."""
    from gpulab.lessons.l11_cuda_graphs import pool_split
    MiB = 2**20
    rows = [("before capture", 0, 10 * MiB), ("graph captured", 0, 160 * MiB),
            ("static outputs deleted, graph alive", 0, 154 * MiB), ("graph deleted, empty_cache()", 0, 149 * MiB),
            ("cuBLAS workspaces cleared", 0, 12 * MiB)]
    got = pool_split(rows)
    assert got == {"private pool": 5.0, "kept after delete": 139.0, "cuBLAS workspaces": 137.0}
    assert pool_split(rows[:4])["cuBLAS workspaces"] is None
