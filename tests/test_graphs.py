import pytest
import torch

from gpulab.device import require_cuda
from gpulab.graphs import (MLP, NO_GRAPHS, capture_violation, make_mlp_step, max_difference,
                           tiny_ops, tiny_ops_reference)

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
