"""gpulab.models.precision and the modules of lessons 06 and 07 on the CPU: refusals per architecture, the TF32
switches, AMP steps, underflow counting, the checked matrix product, the lessons' knobs."""
import pytest
import torch
from torch import nn

from gpulab.lessons import l06_mixed_precision as L06
from gpulab.models import precision as P
from gpulab.lessons import l07_tensor_core_alignment as L07
from gpulab.models.step import train_step
from gpulab.core.device import SettingError, device_facts, facts_for_capability

VOLTA = facts_for_capability("Tesla V100-SXM2-32GB", 7, 0)
TURING = facts_for_capability("Tesla T4", 7, 5)
PASCAL = facts_for_capability("Tesla P100-PCIE-16GB", 6, 0)
AMPERE = facts_for_capability("NVIDIA A100-SXM4-80GB", 8, 0)
HOPPER = facts_for_capability("NVIDIA H200", 9, 0)


def test_precisions_and_specs():
    assert P.PRECISIONS == ("fp32", "tf32", "fp16", "bf16")
    assert [P.SPECS[p].scaler for p in P.PRECISIONS] == [False, False, True, False]
    assert P.SPECS["tf32"].dtype is None and P.SPECS["tf32"].fp32_mode == "tf32"
    assert P.SPECS["bf16"].dtype is torch.bfloat16 and P.SPECS["fp16"].dtype is torch.float16


@pytest.mark.parametrize("facts, expected", [
    (PASCAL, ["fp32", "fp16"]), (VOLTA, ["fp32", "fp16"]), (TURING, ["fp32", "fp16"]),
    (AMPERE, ["fp32", "tf32", "fp16", "bf16"]), (HOPPER, ["fp32", "tf32", "fp16", "bf16"]),
])
def test_supported_per_architecture(facts, expected):
    assert P.supported(facts) == expected


def test_refusals_say_why():
    assert "Ampere" in P.refusal("tf32", VOLTA) and "Turing" in P.refusal("bf16", TURING)
    assert "GradScaler" in P.refusal("bf16", VOLTA)
    assert "must be one of" in P.refusal("fp8", HOPPER)
    with pytest.raises(ValueError, match="no TF32"):
        P.check("tf32", VOLTA)
    assert P.check("bf16", HOPPER) is P.SPECS["bf16"]


@pytest.mark.cpu_only
def test_on_the_cpu_tf32_is_refused_and_the_rest_runs():
    facts = device_facts()
    assert P.supported(facts) == ["fp32", "fp16", "bf16"]
    assert "CPU" in P.refusal("tf32", facts)
    assert P.best_half(facts) == "bf16"


def test_best_half():
    assert P.best_half(VOLTA) == "fp16" and P.best_half(AMPERE) == "bf16"


def test_what_to_expect_follows_the_architecture():
    assert "no Tensor Cores" in P.what_to_expect(PASCAL)[0]
    volta = " ".join(P.what_to_expect(VOLTA))
    assert "generation-1" in volta and "No TF32 and no bf16" in volta
    hopper = " ".join(P.what_to_expect(HOPPER))
    assert "generation-4" in hopper and "FP8" in hopper and "no scaler" in hopper
    assert "FP8" not in " ".join(P.what_to_expect(AMPERE))


def _switches():
    return P.matmul_fp32_mode(), P.conv_fp32_mode()


def test_fp32_math_sets_both_switches_and_restores_them():
    before = _switches()
    with P.fp32_math("tf32"):
        assert _switches() == ("tf32", "tf32")
    with P.fp32_math("ieee"):
        assert _switches() == ("ieee", "ieee")
    assert _switches() == before
    with pytest.raises(RuntimeError):
        with P.fp32_math("ieee"):
            raise RuntimeError("boom")
    assert _switches() == before
    with pytest.raises(SettingError):
        with P.fp32_math("medium"):
            pass


def test_fp32_math_uses_the_new_cudnn_switch_when_it_exists():
    conv = getattr(torch.backends.cudnn, "conv", None)
    if conv is None or not hasattr(conv, "fp32_precision"):
        pytest.skip("this torch has only cudnn.allow_tf32")
    before = conv.fp32_precision
    with P.fp32_math("ieee"):
        assert conv.fp32_precision == "ieee"
    assert conv.fp32_precision == before


def _classifier():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(32, 16, generator=g)
    y = (x[:, :4].argmax(1))             # learnable
    return model, x, y


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_train_step_learns_in_each_precision(precision):
    model, x, y = _classifier()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = P.make_scaler(precision)
    assert (scaler is not None) == (precision == "fp16")
    losses = [train_step(model, x, y, loss=P.classification_loss, optimizer=opt, precision=precision, scaler=scaler).item() for _ in range(20)]
    assert losses[-1] < 0.7 * losses[0]
    assert all(p.dtype == torch.float32 for p in model.parameters())    # fp32 master weights


def test_fp16_without_a_scaler_is_refused():
    model, x, y = _classifier()
    with pytest.raises(ValueError, match="GradScaler"):
        train_step(model, x, y, loss=P.classification_loss, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                   precision="fp16")


def test_accumulated_step_gives_the_whole_batch_gradient_and_its_mean_loss():
    import copy
    model, x, y = _classifier()
    twin = copy.deepcopy(model)
    grads = {}

    def keep(opt_model):
        class Keep(torch.optim.SGD):      # read the gradients the step is about to apply
            def step(self, closure=None):
                grads[opt_model] = [p.grad.clone() for p in opt_model.parameters()]
                return super().step(closure)
        return Keep(opt_model.parameters(), lr=0.1)

    with P.fp32_math("ieee"):
        whole = train_step(model, x, y, loss=P.classification_loss, optimizer=keep(model))
        parts = train_step(twin, x, y, loss=P.classification_loss, optimizer=keep(twin), accumulation=4)
    assert torch.allclose(whole, parts, rtol=1e-5)                        # the mean of the four means
    for g, h in zip(grads[model], grads[twin]):
        assert torch.allclose(g, h, rtol=1e-4, atol=1e-6)
    for p, q in zip(model.parameters(), twin.parameters()):             # and the same update
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_accumulation_must_be_a_whole_number_of_micro_batches(bad):
    model, x, y = _classifier()
    with pytest.raises(ValueError, match="accumulation"):
        train_step(model, x, y, loss=P.classification_loss, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                   accumulation=bad)


def test_train_step_refuses_fp16_autocast_without_a_scaler():
    model, x, y = _classifier()
    with pytest.raises(ValueError, match="GradScaler"):
        train_step(model, x, y, loss=P.classification_loss, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                   precision=torch.float16)


def test_underflow_is_counted_and_the_scaler_prevents_it():
    model, x, y = _classifier()
    ref = L06.unscaled_gradients(model, x, y, P.classification_loss, "fp32")
    assert ref.dtype == torch.float32 and ref.numel() == sum(p.numel() for p in model.parameters())
    assert all(p.grad is None for p in model.parameters())          # gradients are handed back
    lost16 = L06.lost_fraction(L06.unscaled_gradients(model, x, y, P.classification_loss, "fp16", weight=1e-7), ref)
    scaled = L06.unscaled_gradients(model, x, y, P.classification_loss, "fp16", weight=1e-7, scale=2.0**16)
    lostbf = L06.lost_fraction(L06.unscaled_gradients(model, x, y, P.classification_loss, "bf16", weight=1e-7), ref)
    assert lost16 > 0.5
    assert L06.lost_fraction(scaled, ref) < 0.01 and lostbf < 0.01
    # unscale_ divides in fp32: the scaled gradients are the fp32 ones, up to fp16 rounding
    assert ((scaled - 1e-7 * ref).norm() / (1e-7 * ref).norm()).item() < 1e-2


def test_lost_fraction_counts_only_entries_alive_in_the_reference():
    ref = torch.tensor([0.0, 1.0, 2.0, 3.0])
    assert L06.lost_fraction(torch.tensor([0.0, 0.0, 2.0, 3.0]), ref) == pytest.approx(1 / 3)
    assert L06.lost_fraction(torch.zeros(4), torch.zeros(4)) == 0.0


def test_loss_curve():
    c = L06.LossCurve([4.0, 3.0, 2.0, 1.0], skipped=1)
    assert list(c) == [4.0, 3.0, 2.0, 1.0] and c.skipped == 1
    assert c.window(2) == 1.5 and "1 skipped" in str(c) and str(L06.LossCurve([2.0, 1.0])) == "2 steps: 2 -> 1"


def _workload():
    model, x, y = _classifier()
    return L06.Workload("mlp", model, lambda b: [(x[:b], y[:b]), (x[b:2 * b], y[b:2 * b])], P.classification_loss,
                      lambda m: torch.optim.SGD(m.parameters(), lr=0.1), unit="samples/s")


def test_workload_reset_restores_the_starting_weights():
    work = _workload()
    start = [p.detach().clone() for p in work.model.parameters()]
    opt = work.reset()
    train_step(work.model, *work.batches(8)[0], loss=work.loss_fn, optimizer=opt)
    assert not all(torch.equal(a, b) for a, b in zip(start, work.model.parameters()))
    work.reset()
    assert all(torch.equal(a, b) for a, b in zip(start, work.model.parameters()))


def test_precision_run_trains_times_and_refuses():
    work = _workload()
    r = L06.precision_run(work, "bf16", 8, steps=6, repeat=3, warmup=1)
    assert set(r) == {"samples/s", "ms per step", "peak (GiB)", "loss curve", "pace"}
    assert r["pace"] is None                       # what paces the step: measured on GPUs only
    assert len(r["loss curve"]) == 6 and r["ms per step"].n == 3 and r["samples/s"] > 0
    if not torch.cuda.is_available():
        assert r["peak (GiB)"] == "not measured on the CPU"
    again = L06.precision_run(work, "bf16", 8, steps=6, repeat=1, warmup=0)
    assert list(again["loss curve"]) == list(r["loss curve"])          # same start, same data
    with pytest.raises(ValueError):
        L06.precision_run(work, "fp8", 8, steps=1)


def test_first_loss_agrees_across_precisions():
    work = _workload()
    x, y = work.batches(8)[0]
    ref = L06.first_loss(work, x, y, "fp32")
    assert L06.first_loss(work, x, y, "fp32") == ref
    assert abs(L06.first_loss(work, x, y, "bf16") - ref) < 2e-2 * abs(ref)


@pytest.mark.parametrize("n, expected", [(4095, 2), (4094, 4), (4100, 8), (4088, 16), (4064, 64), (4096, 256),
                                         (50257, 2), (50304, 256)])
def test_alignment_in_bytes(n, expected):
    assert L07.alignment(n) == expected


def test_alignment_of_other_element_sizes():
    assert L07.alignment(4095, element_bytes=4) == 4 and L07.alignment(4, element_bytes=4) == 16


def test_gemm_experiment_checks_then_times():
    r = L07.gemm_experiment(64, "bf16", repeat=3)
    assert set(r) == {"TFLOP/s", "ms", "rel. error"}
    assert r["rel. error"] <= P.GEMM_TOLERANCE["bf16"] and r["TFLOP/s"] > 0 and r["ms"].n == 3
    rect = L07.gemm_experiment(48, "fp32", m=16, k=33, repeat=1)
    assert rect["rel. error"] <= P.GEMM_TOLERANCE["fp32"]


def test_gemm_experiment_refuses_bad_sizes():
    with pytest.raises(ValueError, match="between 16 and 65536"):
        L07.gemm_experiment(8, "bf16")
    with pytest.raises(ValueError, match="must be one of"):
        L07.gemm_experiment(64, "int8")


@pytest.mark.cpu_only
def test_gemm_experiment_refuses_what_the_cpu_cannot_do():
    with pytest.raises(ValueError, match="stops at 2048"):
        L07.gemm_experiment(4096, "bf16")
    with pytest.raises(ValueError, match="TF32"):
        L07.gemm_experiment(64, "tf32")


@pytest.mark.gpu
def test_on_a_gpu_tf32_changes_the_product_and_ieee_does_not():
    a = torch.randn(512, 512, device="cuda")
    with P.fp32_math("ieee"):
        ref = a @ a
    with P.fp32_math("tf32"):
        tf = a @ a
    err = ((tf - ref).norm() / ref.norm()).item()
    assert 0 < err < P.GEMM_TOLERANCE["tf32"] if device_facts().tf32 else err == 0


def test_step_peak_is_none_on_the_cpu_and_leaves_no_gradients():
    work = _workload()
    assert L06.step_peak(work, 8) is None
    assert all(p.grad is None for p in work.model.parameters())
    assert L06.FIRST_LOSS_TOLERANCE["fp32"] == 0.0 and set(L06.FIRST_LOSS_TOLERANCE) == set(P.PRECISIONS)


def test_half_dtype_follows_best_half():
    from dataclasses import replace
    facts = P.device_facts()
    assert P.half_dtype(replace(facts, bf16=True)) is torch.bfloat16
    assert P.half_dtype(replace(facts, bf16=False)) is torch.float16


def test_lesson_configs_hold_both_scales_and_the_shared_resnet50():
    from gpulab.models.cnn import RESNET50
    for L in (L06, L07):
        assert set(L.CONFIG) == {"tiny", "full"} and set(L.CONFIG["tiny"]) == set(L.CONFIG["full"])
        assert L.config("full") == L.CONFIG["full"] and L.config("tiny") is not L.CONFIG["tiny"]
    assert L06.config("full")["cnn"] == RESNET50["full"] and L07.config("full")["cnn"] == RESNET50["full"]
    assert L07.config("full")["cudnn"]["depths"] == RESNET50["full"]["depths"]
    full = L07.config("full")                       # the sizes HEADLINE names
    assert (full["aligned"], full["misaligned"]) == (4096, 4095) and "n=4096 / n=4095" in L07.HEADLINE
    assert {full["aligned"], full["misaligned"]} <= set(full["sizes"])
    tiny = L07.config("tiny")
    assert {tiny["aligned"], tiny["misaligned"]} <= set(tiny["sizes"]) and max(tiny["sizes"]) <= 2048


@pytest.mark.cpu_only
def test_what_is_timed_on_the_cpu():
    assert L06.timed_precisions() == ["fp32", "bf16"]          # fp16 autocast is no fast path on the CPU
    assert L07.gemm_precisions() == ["bf16"]


def test_what_is_timed_on_each_gpu():
    assert L06.timed_precisions(VOLTA) == ["fp32", "fp16"]
    assert L06.timed_precisions(HOPPER) == ["fp32", "tf32", "fp16", "bf16"]
    assert L07.gemm_precisions(VOLTA) == ["fp16"] and L07.gemm_precisions(HOPPER) == ["fp16", "bf16"]


def test_fp32_math_text_says_a_gpu_without_tf32_runs_ieee_whatever_the_switches():
    """Issue 40: notebook 03 printed "fp32 convolutions run as: tf32" on Turing and Volta, which have no TF32."""
    import torch
    from gpulab.core.device import facts_for_capability
    t4 = facts_for_capability("Tesla T4", 7, 5)
    a100 = facts_for_capability("NVIDIA A100-SXM4-80GB", 8, 0)
    cuda = torch.device("cuda")
    text = P.fp32_math_text(cuda, t4)
    assert "run as IEEE fp32" in text and "has no TF32" in text and "run as: tf32" not in text
    assert P.fp32_math_text(cuda, a100).startswith("fp32 convolutions run as: ")
    assert "CPU" in P.fp32_math_text(torch.device("cpu"))


def test_what_to_expect_gives_this_gpus_rates_not_a_data_centre_parts():
    # issue 40, 06[5]: "fp16 several times faster" and "TF32 speeds up fp32" were printed for every class
    from gpulab.core.specs import datasheet_for
    ada = facts_for_capability("NVIDIA GeForce RTX 4090", 8, 9)
    text = " ".join(P.what_to_expect(ada))
    sheet = datasheet_for("NVIDIA GeForce RTX 4090")
    assert f"about {sheet.bf16 / sheet.fp32:.2g}x fp32" in text and "several times" not in text
    assert "hardly speeds up fp32" in text                            # TF32 at the fp32 rate on GeForce
    hopper = " ".join(P.what_to_expect(HOPPER))
    assert "about 15x fp32" in hopper and "7.4x the fp32 rate" in hopper   # 989 / 67, 495 / 67
    unknown = " ".join(P.what_to_expect(facts_for_capability("NVIDIA GeForce RTX 5070", 12, 0)))
    if facts_for_capability("NVIDIA GeForce RTX 5070", 12, 0).geforce:
        assert "about twice fp32" in unknown and "about the fp32 rate" in unknown


def test_what_to_expect_says_a_power_capped_board_holds_less_than_its_datasheet():
    # issue 40: a 70 W T4 at its power limit ran a long fp16 product at about 24 of its 65 TFLOP/s
    t4 = " ".join(P.what_to_expect(facts_for_capability("Tesla T4", 7, 5)))
    assert "about 8x fp32's rate" in t4 and "a 70 W board cannot hold that" in t4 and "between 3x and 8x" in t4
    assert "cannot hold" not in " ".join(P.what_to_expect(HOPPER))
