"""The lessons' models (gpulab.models: transformer, gpt, cnn), batches, memory counting (sizing), the batch
search and lessons 07, 09 and 10's checks and knobs (CPU)."""
import pytest
import torch

from gpulab.models.transformer import TransformerStack, make_batch
from gpulab.models.sizing import fits_budget, largest_batch, predicted_memory, saved_for_backward
from gpulab.models.step import train_step


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


# -- lessons 06 and 07 ---------------------------------------------------------------------------
from torch import nn  # noqa: E402

from gpulab.models.gpt import GPT, padded_copy, token_batches
from gpulab.models.cnn import ResNetish, image_batches
from gpulab.lessons.l07_tensor_core_alignment import conv_benchmark_in_fresh_process, conv_step_times, main
from gpulab.models.sizing import count_flops, fit_batch  # noqa: E402


def test_resnetish_at_full_size_has_resnet50s_parameter_count():
    assert sum(p.numel() for p in ResNetish().parameters()) == 25_557_032     # torchvision's resnet50: the same


def tiny_cnn():
    torch.manual_seed(0)
    return ResNetish(depths=(1, 1), width=4, classes=3, image=16)


def test_resnetish_forward_and_synthetic_images():
    m = tiny_cnn()
    batches = image_batches(m, 5, count=2, seed=3)
    (x, y), (x2, _) = batches
    assert x.shape == (5, 3, 16, 16) and y.shape == (5,) and y.max() < 3 and not torch.equal(x, x2)
    assert m(x).shape == (5, 3)
    again = image_batches(m, 5, count=2, seed=3)
    assert torch.equal(again[0][0], x) and torch.equal(again[1][1], batches[1][1])
    other = image_batches(m, 2, count=1, size=24, channels_last=True)[0][0]
    assert other.shape == (2, 3, 24, 24) and other.is_contiguous(memory_format=torch.channels_last)


def tiny_gpt(pad_to=1):
    torch.manual_seed(0)
    return GPT(vocab=37, n_blocks=2, width=16, heads=2, seq=8, pad_to=pad_to)


def test_gpt_shapes_and_padding():
    m = tiny_gpt()
    x, y = token_batches(m, 3, count=1)[0]
    assert x.shape == y.shape == (3, 8) and m(x).shape == (3, 8, 37)
    assert tiny_gpt(pad_to=8).padded_vocab == 40 and tiny_gpt(pad_to=8).head.weight.shape == (40, 16)
    with pytest.raises(ValueError):
        GPT(vocab=1, n_blocks=1, width=16, heads=2, seq=8)


def test_token_batches_follow_one_permutation():
    m = tiny_gpt()
    batches = token_batches(m, 4, count=3, seed=2)
    follow = {}
    for x, y in batches:
        assert torch.equal(x[:, 1:], y[:, :-1])
        for a, b in zip(x.flatten().tolist(), y.flatten().tolist()):
            assert follow.setdefault(a, b) == b          # each token always has the same successor
    assert max(max(x.max().item(), y.max().item()) for x, y in batches) < 37


def test_padded_copy_is_the_same_model():
    m = tiny_gpt()
    p = padded_copy(m, 64)
    assert p.padded_vocab == 64 and p.vocab == 37
    assert torch.all(p.head.weight[37:] == 0) and torch.all(p.tok.weight[37:] == 0)
    x, y = token_batches(m, 2, count=1)[0]
    assert torch.allclose(p(x)[..., :37], m(x), atol=1e-6)
    assert torch.allclose(p.loss(x, y), m.loss(x, y), rtol=1e-6)
    m.loss(x, y).backward()
    p.loss(x, y).backward()
    assert torch.all(p.head.weight.grad[37:] == 0)
    assert torch.allclose(p.head.weight.grad[:37], m.head.weight.grad, atol=1e-6)


def test_count_flops_of_a_linear_layer():
    lin = nn.Linear(8, 4, bias=False)
    x = torch.randn(5, 8, requires_grad=True)
    assert count_flops(lambda: lin(x)) == 2 * 5 * 8 * 4
    assert count_flops(lambda: lin(x).sum().backward()) == 3 * 2 * 5 * 8 * 4     # forward, input and weight grads


def test_fit_batch():
    assert fit_batch(lambda b: None, 128, budget=None) == 128
    assert fit_batch(lambda b: None, 128, budget=2**30) == 128               # nothing measurable: unchanged
    peak = lambda b: 1000 + 100 * b                                           # noqa: E731
    assert fit_batch(peak, 128, budget=1000 + 100 * 128) == 128
    assert fit_batch(peak, 128, budget=1000 + 100 * 40) == 32
    assert fit_batch(peak, 128, budget=10) == 1


def test_conv_step_times_refuses_repeated_sizes():
    with pytest.raises(ValueError, match="must all differ"):
        conv_step_times(False, fixed=32, varying=(32, 40))
    assert main(["--benchmark", "off", "--fixed", "64", "--varying", "40"]) == 2    # 64 is the start-up size


def test_conv_benchmark_runs_in_a_fresh_process(on_cpu):
    r = conv_benchmark_in_fresh_process(True, fixed=32, varying=(40, 48), batch=2, precision="fp32",
                                        depths=(1,), width=4, classes=3, repeat=2)
    assert set(r) == {"start-up", "first step", "steady", "new sizes", "pace"}
    assert r["pace"] is None                       # what paces the steady steps: measured on GPUs only
    assert r["steady"].n == 2 and r["new sizes"].n == 2 and r["first step"].n == 1


def test_a_refusal_in_the_child_process_is_a_valueerror(monkeypatch):
    import subprocess

    def refused(cmd, **kw):
        assert cmd[1:3] == ["-m", "gpulab.lessons.l07_tensor_core_alignment"] and "--precision" in cmd
        return subprocess.CompletedProcess(cmd, 2, "", "gpulab.lessons.l07_tensor_core_alignment: TF32 is a Tensor Core format\n")

    monkeypatch.setattr(subprocess, "run", refused)
    with pytest.raises(ValueError, match="^TF32 is a Tensor Core format"):
        conv_benchmark_in_fresh_process(True, fixed=32, varying=(40,), precision="tf32")
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(cmd, 1, "", "Boom\n"))
    with pytest.raises(RuntimeError, match="Boom"):
        conv_benchmark_in_fresh_process(True, fixed=32, varying=(40,))


def test_checkpointing_check_finds_the_same_model_and_leaves_it_plain():
    from gpulab.models.step import GRAD_TOL
    from gpulab.models.transformer import TransformerStack, make_batch
    from gpulab.lessons.l09_activation_checkpointing import checkpointing_check
    torch.manual_seed(0)
    model = TransformerStack(4, 32, 4, 16, device=torch.device("cpu"))
    x, y = make_batch(model, 2, seed=1)
    ref_loss, checked = checkpointing_check(model, x, y, ks=(1, 3))
    assert set(checked) == {1, 3}
    for loss, diff in checked.values():
        assert abs(loss - ref_loss) <= GRAD_TOL * abs(ref_loss) and diff <= GRAD_TOL
    assert model.checkpoint_every == 0 and all(p.grad is None for p in model.parameters())


def test_accumulation_check_matches_and_measures_the_classic_mistake():
    from gpulab.models.step import GRAD_TOL
    from gpulab.models.transformer import TransformerStack, make_batch
    from gpulab.lessons.l10_gradient_accumulation import accumulation_check
    torch.manual_seed(0)
    model = TransformerStack(2, 32, 4, 16, device=torch.device("cpu"))
    x, y = make_batch(model, 8, seed=1)
    got = accumulation_check(model, x, y, 4)
    assert got["divided"] < GRAD_TOL
    assert got["undivided"] == pytest.approx(4.0, rel=1e-4)        # not divided: 4 times too large
    assert all(p.grad is None for p in model.parameters())
    with pytest.raises(ValueError, match="equal micro-batches"):
        accumulation_check(model, x[:6], y[:6], 4)


def test_predicted_batch_halves_until_half_the_free_memory_fits(monkeypatch):
    from gpulab.models import sizing as W
    cfg = dict(n_blocks=12, seq=1024, width=1024, params=152_206_336)
    assert W.predicted_batch(**cfg, batch=32, device=torch.device("cpu")) == 32          # CPU: unchanged
    peak32 = W.predicted_memory(**cfg, batch=32)[1]
    monkeypatch.setattr(W, "usable_memory", lambda device=None: (peak32 * 2, peak32 * 4))
    assert W.predicted_batch(**cfg, batch=32) == 32                       # fits half of the free memory
    monkeypatch.setattr(W, "usable_memory", lambda device=None: (peak32, peak32 * 4))
    got = W.predicted_batch(**cfg, batch=32)
    assert got < 32 and W.predicted_memory(**cfg, batch=got)[1] <= peak32 / 2
    assert W.predicted_memory(**cfg, batch=2 * got)[1] > peak32 / 2       # the largest halving that fits
    assert W.predicted_batch(**cfg, batch=32, times=4) < got              # a big batch of 4 x batch must fit


def test_lessons_09_and_10_measure_one_model_configuration():
    from gpulab.lessons import l09_activation_checkpointing as l09, l10_gradient_accumulation as l10
    from gpulab.models.transformer import STACK
    for scale in ("tiny", "full"):
        for lesson in (l09, l10):
            cfg = lesson.config(scale)
            assert {key: cfg[key] for key in STACK[scale]} == STACK[scale]
            cfg["n_blocks"] = -1                                   # a copy: the lesson's knobs stay as they are
            assert lesson.config(scale)["n_blocks"] == STACK[scale]["n_blocks"]


def test_checkpointed_blocks_hold_no_16bit_weight_copies_through_backward():
    """Issue 24: under non-reentrant checkpointing a checkpointed block's products save nothing, so the
    16-bit weight copies autocast made are not held until backward; the prediction counts 8 bytes per
    parameter plus the rebuilt blocks' copies."""
    from torch.utils.checkpoint import checkpoint
    from gpulab.models.sizing import predicted_memory

    lin = torch.nn.Linear(64, 64)
    x = torch.randn(4, 64, requires_grad=True)

    def saved_16bit_weights(run) -> int:
        seen = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: seen.append(t) or t, lambda t: t):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                run()
        return sum(t.dtype == torch.bfloat16 and tuple(t.shape) == (64, 64) for t in seen)

    assert saved_16bit_weights(lambda: lin(x)) == 1                                    # held for backward
    assert saved_16bit_weights(lambda: checkpoint(lin, x, use_reentrant=False)) == 0  # not held
    n, params = 12, 10**6
    base = dict(n_blocks=n, batch=1, seq=1, width=1, params=params)
    kept0, peak0 = predicted_memory(**base, k=0)
    kept4, peak4 = predicted_memory(**base, k=4)
    assert peak0 - kept0 == 10 * params                                # no rebuilt segment without checkpointing
    assert peak4 - kept4 - 4 * 36 == pytest.approx(8 * params + 2 * params * 4 / n, abs=1)
