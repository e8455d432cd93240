"""Notebook 13's time to a validation loss (moved out of test_l13_capstone.py): the baseline's loss reached with the
same options, every run evaluated in fp32, the loader left out, the held-out text."""
import math

import pytest
import torch

from gpulab.lessons import l13_capstone as C
from gpulab.lessons.capstone import jobs as J, knobs as KN


# -- time to a validation loss -------------------------------------------------------------------------
def test_time_to_loss_reaches_the_baselines_loss_with_the_same_options_at_the_same_step():
    """The same options from the same seed train on the same windows: the run given the baseline's last loss
    as its target reaches it at the baseline's last evaluation, not before (deterministic on the CPU)."""
    base = C.time_to_loss(C.Options(), budget_s=0.3, scale="tiny")
    assert base.target is None and base.reached is None and len(base.points) >= 2
    assert base.points[-1][2] < base.points[0][2]                # it learns: the loss falls
    again = C.time_to_loss(C.Options(), target=base.final_loss, budget_s=60, scale="tiny")
    assert again.reached is not None and again.reached[0] == base.points[-1][0]
    assert [p[2] for p in again.points] == [p[2] for p in base.points]
    assert base.tokens_per_s > 0 and base.first_step_s > 0


def test_every_run_of_time_to_loss_is_evaluated_in_fp32():
    """Issue 40 (review of 13, finding 11): the validation loss was evaluated in each run's own precision (the
    all-on run under bf16 autocast) against a target the fp32 baseline measured in fp32. Now the same weights give
    the same loss whatever the run trains in: no autocast, TF32 off, FP8 layers as plain linear layers."""
    from gpulab.lessons.capstone import time_to_loss as TL
    from gpulab.models import precision as P, text
    cfg = dict(KN.CONFIG["tiny"]["ttl"]["gpt"])
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    model = J.JOBS["gpt"].build(cfg, cpu)
    train_text, val_text = text.stdlib_source(2**16)
    val = [text.windows(val_text, 4, cfg["seq"], torch.Generator().manual_seed(i)) for i in range(2)]
    fp32 = TL.validation_loss(model, val, cpu)
    P.to_fp8_training(model.blocks)
    assert TL.validation_loss(model, val, cpu) == fp32                     # FP8 layers evaluated as fp32 ones
    assert any(type(m) is P.Fp8Linear for m in model.modules())             # and still FP8 layers afterwards
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert TL.validation_loss(model, val, cpu) == fp32                  # autocast off inside
        with torch.no_grad():                                               # as it was: the run's own arithmetic
            own = sum(float(P.language_model_loss(model, x, y)) for x, y in val) / len(val)
        assert own != fp32


def test_time_to_loss_leaves_the_loader_out_and_refuses_what_cannot_run():
    c = C.time_to_loss(C.Options(loader=True), budget_s=0.05, scale="tiny")
    assert not c.options.loader and "loader left out" in c.notes[0]
    with pytest.raises(ValueError):
        C.time_to_loss(C.Options(cuda_graphs=True), budget_s=0.05, scale="tiny")     # graphs need compile


def test_the_stdlib_text_holds_out_whole_files_and_cuts_windows():
    from gpulab.models import text
    train, val = text.stdlib_source(2**20)
    assert train.dtype == torch.uint8 and 0 < val.numel() < train.numel()
    x, y = text.windows(train, 3, 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (3, 16) and x.dtype == torch.long and torch.equal(x[:, 1:], y[:, :-1])
    assert int(x.max()) < text.VOCAB
    with pytest.raises(ValueError, match="at least 64 KiB"):
        text.stdlib_source(100)
    with pytest.raises(ValueError, match="cannot give windows"):
        text.windows(train[:10], 1, 16, torch.Generator())


def test_training_step_is_the_jobs_step_as_a_callable_for_diagnose():
    with C.training_step("gpt", C.Options(fused=True), scale="tiny") as step:
        losses = [float(step()) for _ in range(3)]
    assert all(math.isfinite(v) for v in losses)
    with pytest.raises(ValueError):
        with C.training_step("gpt", C.Options(cuda_graphs=True), scale="tiny"):
            pass
