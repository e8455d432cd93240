"""gpulab.lessons.l09_activation_checkpointing, issue 15: selective checkpointing (same model, the policy
sees the products and keeps them), the optimizer's state in the memory prediction, and the GPU-only
measurements' answers on the CPU."""
import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy

import gpulab.lessons.l09_activation_checkpointing as L09
from gpulab.lessons.l09_activation_checkpointing import (ADAMW_BYTES, CheckpointedStack, adamw_for_measuring,
                                                         checkpointing_check, kept_bytes, save_matmuls, scaler_for,
                                                         stack_params, step_peak)
from gpulab.models.sizing import predicted_memory
from gpulab.models.step import GRAD_TOL, train_step
from gpulab.models.transformer import TransformerStack, make_batch


def small_stack(**kw) -> CheckpointedStack:
    torch.manual_seed(0)
    return CheckpointedStack(4, 32, 4, 16, **kw)


def test_selective_checkpointing_computes_the_same_loss_and_gradients():
    model = small_stack()
    x, y = make_batch(model, 2, seed=1)
    ref_loss, checked = checkpointing_check(model, x, y, ks=(1, 3), selective=True)
    for loss, diff in checked.values():
        assert abs(loss - ref_loss) <= GRAD_TOL * abs(ref_loss) and diff <= GRAD_TOL
    assert model.selective is False and model.checkpoint_every == 0          # left plain


def test_the_policy_keeps_products_and_recomputes_the_rest(monkeypatch):
    assert save_matmuls(None, torch.ops.aten.addmm.default) == CheckpointPolicy.MUST_SAVE
    assert save_matmuls(None, torch.ops.aten.mm.default) == CheckpointPolicy.MUST_SAVE
    assert save_matmuls(None, torch.ops.aten.gelu.default) == CheckpointPolicy.PREFER_RECOMPUTE
    assert save_matmuls(None, torch.ops.aten.native_layer_norm.default) == CheckpointPolicy.PREFER_RECOMPUTE
    seen = []

    def watching(ctx, op, *args, **kwargs):
        seen.append(op)
        return save_matmuls(ctx, op, *args, **kwargs)

    monkeypatch.setattr(L09, "save_matmuls", watching)
    model = small_stack(selective=True, checkpoint_every=1)
    x, y = make_batch(model, 2)
    train_step(model, x, y)
    assert torch.ops.aten.addmm.default in seen and any(op in L09.SAVE_OPS for op in seen if "attention" in str(op))


def test_selective_needs_segments():
    model = small_stack(selective=True)          # checkpoint_every = 0
    x, y = make_batch(model, 2)
    with pytest.raises(ValueError, match="selective checkpointing works on checkpointed segments"):
        model(x)
    with pytest.raises(ValueError, match="CheckpointedStack"):
        checkpointing_check(TransformerStack(2, 32, 4, 16), x, y, ks=(1,), selective=True)


def test_predicted_memory_counts_the_optimizer_state():
    cfg = dict(n_blocks=12, batch=32, seq=1024, width=1024, params=stack_params(n_blocks=12, width=1024))
    for k in (0, 1):
        kept, peak = predicted_memory(**cfg, k=k)
        kept8, peak8 = predicted_memory(**cfg, k=k, optimizer_bytes=ADAMW_BYTES)
        assert kept8 == kept and peak8 - peak == ADAMW_BYTES * cfg["params"]
    assert predicted_memory(**cfg) == predicted_memory(**cfg, optimizer_bytes=0)    # lessons 09, 10, bench: unchanged
    with pytest.raises(ValueError, match="optimizer_bytes"):
        predicted_memory(**cfg, optimizer_bytes=-1)
    assert ADAMW_BYTES == 8


def test_adamw_for_measuring_leaves_the_weights_as_they_were():
    model = small_stack()
    before = [p.detach().clone() for p in model.parameters()]
    opt = adamw_for_measuring(model)
    x, y = make_batch(model, 2)
    train_step(model, x, y, optimizer=opt)
    train_step(model, x, y, optimizer=opt)
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))
    assert all(set(s) >= {"exp_avg", "exp_avg_sq"} for s in opt.state.values())       # the state exists


def test_the_gpu_measurements_say_none_on_the_cpu(on_cpu):
    model = small_stack()
    assert kept_bytes(model, 2) is None
    assert step_peak(model, 2) is None and step_peak(model, 2, None, adamw_for_measuring) is None
    assert scaler_for(None, torch.device("cpu")) is None and scaler_for(torch.bfloat16, torch.device("cpu")) is None
    assert isinstance(scaler_for(torch.float16, torch.device("cpu")), torch.amp.GradScaler)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_adamw_adds_its_state_and_selective_keeps_less():
    torch.manual_seed(0)
    model = CheckpointedStack(4, 256, 4, 128, device=torch.device("cuda"))
    params = sum(p.numel() for p in model.parameters())
    plain = step_peak(model, 8, torch.bfloat16)
    with_adamw = step_peak(model, 8, torch.bfloat16, adamw_for_measuring)
    assert 7 <= (with_adamw - plain) / params <= 10
    full = kept_bytes(model, 8, torch.bfloat16)
    model.checkpoint_every, model.selective = 1, True
    assert kept_bytes(model, 8, torch.bfloat16) < full
