"""gpulab.lessons.l06_mixed_precision: which timed precision is PyTorch's default for each workload, and the
GPT's timed-step count (issue 15: at least 30 steps at full size, its 16-bit throughput varied between runs)."""
import pytest

from gpulab.lessons.l06_mixed_precision import config, plan, pytorch_default

ALL = ["fp32", "tf32", "fp16", "bf16"]


def test_pytorch_defaults_cnn_follows_convolutions_gpt_follows_matrix_products():
    # PyTorch's defaults: cuDNN convolutions on TF32, fp32 matrix products as IEEE fp32
    assert pytorch_default("CNN", "tf32", "ieee", ALL) == "tf32"
    assert pytorch_default("GPT", "tf32", "ieee", ALL) == "fp32"
    # a learner who switched matmuls to TF32 (torch.set_float32_matmul_precision("high"))
    assert pytorch_default("GPT", "tf32", "tf32", ALL) == "tf32"
    assert pytorch_default("CNN", "ieee", "tf32", ALL) == "fp32"


def test_without_tf32_the_default_is_fp32():
    """The CPU and pre-Ampere GPUs do not time TF32: there the default is plain fp32."""
    assert pytorch_default("CNN", "tf32", "ieee", ["fp32", "bf16"]) == "fp32"
    assert pytorch_default("GPT", "tf32", "tf32", ["fp32", "fp16"]) == "fp32"


def test_unknown_workload_is_refused():
    with pytest.raises(ValueError, match="workload"):
        pytorch_default("MLP", "tf32", "ieee", ALL)


def test_gpt_is_timed_over_at_least_30_steps_at_full_size():
    assert config("full")["gpt_repeat"] >= 30
    assert config("tiny")["gpt_repeat"] >= 3


def test_plan_counts_the_gpt_steps():
    """Each GPT precision: loss curve, 2 warm-up steps, `gpt_repeat` timed steps and the pace's profiled ones
    (+ first-loss forwards, and for fp32 fit_batch's probe steps at batches 4 and 8)."""
    from gpulab.lessons.l06_mixed_precision import PACE_STEPS
    cfg = config("full")
    run = cfg["steps"] + 2 + cfg["gpt_repeat"] + min(cfg["gpt_repeat"], PACE_STEPS)
    whats = [w.what for w in plan("full").work if w.what.startswith("GPT")]
    assert f"GPT: {run + 1 / 3:.3g} bf16 training steps" in whats
    assert f"GPT: {run + 2 / 3 + 12 / cfg['gpt']['batch']:.3g} fp32 training steps" in whats


def test_the_16bit_floor_follows_this_gpus_own_product_rates():
    """Issue 24: a GeForce card's 16-bit products with fp32 accumulation run at 2x its fp32 rate (4090: 165
    against 82.6 TFLOP/s), its TF32 at 1x: a band of >= 2 (GPT) or >= 1.3 (TF32) from a datacenter part fails
    there for no fault of the learner's. The floor comes from the ratio, by Amdahl over the products' share."""
    from gpulab.core.specs import DATASHEETS
    from gpulab.lessons.l06_mixed_precision import PRODUCT_SHARE_MIN, speedup_floor
    rtx = next(d for d in DATASHEETS if d.model == "GeForce RTX 4090")
    h200 = next(d for d in DATASHEETS if "H200" in d.model)
    assert speedup_floor(rtx.fp16 / rtx.fp32) == pytest.approx(1 / ((1 - PRODUCT_SHARE_MIN) + PRODUCT_SHARE_MIN / 2))
    assert speedup_floor(rtx.fp16 / rtx.fp32) < 1.5          # a 4090 is not asked for 2x
    assert speedup_floor(h200.bf16 / h200.fp32) == 2.0        # an H200 still is (capped)
    assert speedup_floor(rtx.tf32 / rtx.fp32, cap=1.3) == pytest.approx(1.0)
    assert speedup_floor(None) is None and speedup_floor(0.0) is None
