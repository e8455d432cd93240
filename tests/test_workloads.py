"""gpulab.workloads: the lessons' model, batches, memory counting and the batch search (CPU)."""
import pytest
import torch

from gpulab.workloads import (TransformerStack, fits_budget, largest_batch, make_batch, predicted_memory,
                              saved_for_backward, train_step)


def small(k=0):
    torch.manual_seed(0)
    return TransformerStack(4, 32, 4, 16, checkpoint_every=k)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 6])
def test_checkpointing_gives_the_same_gradients(k):
    m = small()
    x, y = make_batch(m, 2)
    ref_loss = train_step(m, x, y)
    ref = [p.grad.clone() for p in m.parameters()]
    m.checkpoint_every = k
    assert torch.allclose(train_step(m, x, y), ref_loss)
    for p, r in zip(m.parameters(), ref):
        assert torch.allclose(p.grad, r, rtol=1e-5, atol=1e-7)


def test_negative_granularity_is_refused():
    m = small(-1)
    with pytest.raises(ValueError, match="checkpoint_every"):
        m(make_batch(m, 1)[0])


def test_make_batch_is_deterministic_and_targets_the_next_position():
    m = small()
    x1, y1 = make_batch(m, 3, seed=5)
    x2, _ = make_batch(m, 3, seed=5)
    assert x1.shape == y1.shape == (3, 16, 32)
    assert torch.equal(x1, x2) and torch.equal(x1[:, 1:], y1[:, :-1])


@pytest.mark.parametrize("k", [0, 1, 2, 4])
def test_kept_bytes_match_the_fp32_prediction(k):
    m = small(k)
    with saved_for_backward(m) as kept:
        train_step(m, *make_batch(m, 2))
    predicted, _ = predicted_memory(4, 2, 16, 32, params=0, k=k, half=False)
    assert 1.0 <= kept.bytes / predicted < 1.05      # + LayerNorm statistics and the one extra position


def test_fits_budget_says_nothing_on_the_cpu():
    assert fits_budget(small(), 2, budget=2**40) == (False, None)


@pytest.mark.parametrize("limit_fit, expected", [(1, 1), (37, 37), (300, 300), (5000, 1024)])
def test_largest_batch_finds_the_boundary(limit_fit, expected):
    best, trials = largest_batch(lambda b: (b <= limit_fit, b), start=1, limit=1024)
    assert best == expected
    assert len(trials) <= 20
    fitted = [b for b, ok, _ in trials if ok]
    # no trial is more than twice the largest batch that had fitted before it
    for i, (b, _, _) in enumerate(trials[1:], 1):
        assert b <= 2 * max(x for x, ok, _ in trials[:i] if ok)
    assert max(fitted) == best


def test_largest_batch_resolution_and_nothing_fits():
    best, _ = largest_batch(lambda b: (b <= 50, b), start=1, limit=1024, resolution=8)
    assert 48 >= best >= 42
    assert largest_batch(lambda b: (False, None), start=1)[0] == 0
