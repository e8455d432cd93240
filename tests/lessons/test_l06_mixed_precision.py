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
    # fp32 also runs section 7's noise floor of the loss curves: `steps` more, on the batches reversed
    assert f"GPT: {run + 2 / 3 + 12 / cfg['gpt']['batch'] + cfg['steps']:.3g} fp32 training steps" in whats


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


def _facts(name, cc, **profile):
    import dataclasses
    from gpulab.core.device import facts_for_capability
    return dataclasses.replace(facts_for_capability(name, *cc), **profile)


def test_expectations_take_the_cnn_band_of_this_gpus_class(monkeypatch):
    """Issue 40, 06: the CNN band on GeForce was the data-centre band; section 2 says, and section 9 judges by, the
    band of the GPU's own class."""
    from gpulab.core.bands import load_bands
    from gpulab.lessons.l06_mixed_precision import expectations
    bands = load_bands()
    for name, cc, cls in (("NVIDIA GeForce RTX 4090", (8, 9), "geforce"), ("Tesla T4", (7, 5), "power-capped"),
                          ("Tesla V100-SXM2-16GB", (7, 0), "pre-ampere"), ("NVIDIA H200", (9, 0), "tensor-core")):
        cnn = expectations(_facts(name, cc))["cnn"]
        band = bands.band(cls, "06")
        assert cnn.applies and (cnn.low, cnn.high) == (band.low, band.high) and cls in cnn.why, name
    under = expectations(_facts("Tesla T4", (7, 5), profile="t4", emulated_on="NVIDIA H200"))["cnn"]
    assert not under.applies and "emulating the t4 profile" in under.why
    on_cpu = expectations(_facts("Tesla T4", (7, 5), profile="t4", emulated_on="x86_64", real_kind="cpu"))
    assert "CPU run (the t4 profile's control flow)" in on_cpu["cnn"].why and "CPU run" in on_cpu["gpt"].why
    assert "no TF32 on Turing" in on_cpu["tf32"].why          # the class's reason first: it holds on a real T4 too


def test_the_tf32_check_is_skipped_with_its_reason_where_it_cannot_happen(monkeypatch):
    """Issue 40, 06: on Turing the TF32 check was silently absent; it is now skipped, saying why, as on Volta, on
    GeForce (TF32 at the fp32 rate) and on the CPU; where TF32 is fast it applies with a floor from the same rates."""
    from gpulab.core.ceilings import Ceiling
    from gpulab.lessons import l06_mixed_precision as L06

    def ceilings_of(**tflops):
        return lambda store=None: {f"matmul_{p}": Ceiling(f"matmul_{p}", v, "TFLOP/s", "measured now (full)")
                                   for p, v in tflops.items()}
    import gpulab.core.ceilings as C
    monkeypatch.setattr(C, "ceilings", ceilings_of(fp32=50.0, tf32=350.0, fp16=700.0, bf16=700.0))
    turing = L06.expectations(_facts("Tesla T4", (7, 5)))["tf32"]
    assert not turing.applies and "no TF32 on Turing" in turing.why and "Ampere (8.0)" in turing.why
    assert "skipped here: no TF32 on Turing" in turing.line()
    assert "no TF32 on Volta" in L06.expectations(_facts("Tesla V100-SXM2-16GB", (7, 0)))["tf32"].why
    hopper = L06.expectations(_facts("NVIDIA H200", (9, 0)))
    assert hopper["tf32"].applies and hopper["tf32"].low == pytest.approx(L06.TF32_CAP)
    assert hopper["gpt"].applies and hopper["gpt"].low == pytest.approx(2.0) and "700 / fp32 50" in hopper["gpt"].why
    monkeypatch.setattr(C, "ceilings", ceilings_of(fp32=82.0, tf32=82.0, bf16=160.0))     # a 4090's rates
    ada = L06.expectations(_facts("NVIDIA GeForce RTX 4090", (8, 9)))
    assert not ada["tf32"].applies and "not much faster" in ada["tf32"].why
    assert ada["gpt"].low == pytest.approx(L06.speedup_floor(160 / 82))
    monkeypatch.setattr(C, "ceilings", ceilings_of())                                     # notebook 00 not run
    assert "run notebook 00" in L06.expectations(_facts("NVIDIA H200", (9, 0)))["gpt"].why


def _curve(start, end, steps=32, rate=0.8):
    """A loss curve falling from start towards end (exponentially, by `rate` a step), as LossCurve."""
    from gpulab.lessons.l06_mixed_precision import LossCurve
    return LossCurve([end + (start - end) * rate**i for i in range(steps)])


def test_the_loss_curves_are_judged_against_a_measured_noise_floor():
    """Issue 40, review of 06: the curves passed within 5 % of the starting loss, 0.46 nats for the GPT (9.19 at the
    start, fp32 ending at 0.073): a 16-bit GPT ending near 0.5 passed. Now the gap to fp32 is judged against fp32 on
    the batches in reverse order (the floor), at most CURVE_MAX_FLOOR times it or CURVE_ABS of fp32's loss."""
    from gpulab.lessons.l06_mixed_precision import CURVE_MAX_FLOOR, curve_verdict
    fp32 = _curve(9.19, 0.073)
    reordered = _curve(9.19, 0.075)                        # floor: 0.002
    close = curve_verdict(_curve(9.19, 0.080), fp32, reordered)
    assert close.ok and close.share < 1 and "within" in close.why
    learned_less = curve_verdict(_curve(9.19, 0.5), fp32, reordered)     # 7x fp32's final loss
    assert not learned_less.ok and learned_less.share > 1 and "MORE than" in learned_less.why
    assert learned_less.allowed == pytest.approx(CURVE_MAX_FLOOR * learned_less.floor)
    # a floor of zero: a gap under CURVE_ABS of fp32's loss still passes (no plot shows it), more does not
    assert curve_verdict(_curve(9.19, 0.0732), fp32, fp32).ok
    assert not curve_verdict(_curve(9.19, 0.08), fp32, fp32).ok


def test_updates_the_gradscaler_skipped_are_compared_at_as_many_applied_updates():
    """An fp16 run that skipped k updates at the start is fp32's curve k steps late: compared with fp32's window k
    steps earlier it passes, and the message says so; without the shift the same lag would read as a gap."""
    from gpulab.lessons.l06_mixed_precision import LossCurve, curve_verdict
    fp32 = _curve(7.1, 4.0, rate=0.95)          # still falling at the end, as the CNN's curve is
    late = LossCurve([fp32[0], fp32[0]] + list(fp32[:30]), skipped=2)     # two skipped updates, then fp32's path
    reordered = _curve(7.1, 4.005, rate=0.95)
    v = curve_verdict(late, fp32, reordered)
    assert v.ok and v.gap == pytest.approx(0.0, abs=1e-12) and "skipped 2 update(s)" in v.why
    assert not curve_verdict(LossCurve(late, skipped=0), fp32, reordered).ok       # the same lag, not accounted


def test_a_floor_that_says_nothing_fails_with_its_reason():
    from gpulab.lessons.l06_mixed_precision import LossCurve, curve_verdict
    fp32 = _curve(2.0, 1.0)
    v = curve_verdict(fp32, fp32, _curve(2.0, 1.8))          # the reversed run barely learned: floor ~ the fall
    assert not v.ok and v.share == float("inf") and "cannot tell two runs apart" in v.why
    v = curve_verdict(LossCurve(list(fp32[:-1]) + [float("nan")]), fp32, fp32)
    assert not v.ok and "nan" in v.why
    with pytest.raises(ValueError, match="same length"):
        curve_verdict(_curve(2.0, 1.0, steps=10), fp32, fp32)
