"""What matrix-product rates allow a lesson's ratios to be, and where a prediction's rate comes from.

One model for three users, so they cannot disagree: the bands of `bands.toml` (held to it, class by class and
datasheet by datasheet, by tests/core/test_band_rates.py), the floors notebook 06's checks compute in the run,
and the "what to expect" text printed before them.

A step whose matrix products take a share s of its fp32 time and run r times faster in 16-bit, while the rest
(normalization, activations, the optimizer: memory traffic) gains g, takes (1 - s) / g + s / r of its fp32
time (Amdahl). Its least speed-up (`speedup_floor`) takes s at least PRODUCT_SHARE_MIN and g = 1 (the rest no
faster); its most (`speedup_ceiling`) takes s at most PRODUCT_SHARE_MAX and g the most the rest can gain:
HALF_BYTES_GAIN (16-bit data, half the bytes), times FUSION_GAIN where torch.compile also fuses (lesson 13).
r comes from a datasheet (`gpulab.core.specs.Datasheet.half_ratio_range`: a power-capped board's sustained
rate) or from this GPU's own ceilings (notebook 00).

`matmul_rate(precision)` is the rate a printed prediction divides by: this GPU's (notebook 00's measurement,
else its datasheet), or under a GPU profile with neither, the profile's datasheet; each with where it came from.
"""
from __future__ import annotations

import math

# The least share of an fp32 training step's time that its matrix products take: a judgement, not a measurement.
# A GPT block does 24 C^2 multiply-adds per token in its products against tens of C elementwise operations, and
# a ResNet-50 step is mostly convolutions, so in fp32 the products hold most of a step's time; 0.6 leaves room
# for the memory-bound rest (norms, softmax, the optimizer). Under it a 13x faster product (H200) still gives
# a floor of 2.2x; a 2x faster one (GeForce: 16-bit with fp32 accumulation) 1.43x.
PRODUCT_SHARE_MIN = 0.6
# The most: at least a tenth of an fp32 step is not a matrix product (the optimizer's update, the loss, the
# activations and norms between the products).
PRODUCT_SHARE_MAX = 0.9
# What 16-bit data gives memory-bound work at most: half the bytes, so half the time.
HALF_BYTES_GAIN = 2.0
# What fusing an elementwise chain gives it at most: lesson 12's eager chain moves 3x the bytes of the fused
# kernel (gpulab.lessons.l12_kernel_fusion.bytes_moved: 6 n^2 against 2 n^2).
FUSION_GAIN = 3.0


def speedup_floor(rate_ratio: float | None, share: float = PRODUCT_SHARE_MIN, cap: float = 2.0) -> float | None:
    """The least speed-up a step should show when its matrix products run `rate_ratio` times faster and take
    at least `share` of its time, the rest no faster (Amdahl: 1 / ((1 - share) + share / ratio)), capped at
    `cap` (`math.inf`: not capped). None: no ratio known."""
    if rate_ratio is None or rate_ratio <= 0:
        return None
    return min(cap, 1.0 / ((1.0 - share) + share / rate_ratio))


def speedup_ceiling(rate_ratio: float, rest_gain: float = HALF_BYTES_GAIN,
                    shares: tuple[float, float] = (PRODUCT_SHARE_MIN, PRODUCT_SHARE_MAX)) -> float:
    """The most a step can gain when its products run `rate_ratio` times faster, the rest at most `rest_gain`
    times, and the products take between `shares` of its fp32 time: 1 / (s / ratio + (1 - s) / rest_gain) at the
    better end of `shares` (the largest share where the products gain more than the rest, else the smallest)."""
    if rate_ratio <= 0 or rest_gain <= 0:
        raise ValueError(f"gains must be > 0 (got {rate_ratio}, {rest_gain})")
    return max(1.0 / (s / rate_ratio + (1.0 - s) / rest_gain) for s in shares)


# What each lesson's headline ratio can be, given the 16-bit / fp32 matrix-product ratio r of the GPU. Only the
# lessons whose ratio follows from the precisions' rates; the others' bands are set by what the rates do not
# touch (launches, waves, copies, bytes).
def lesson_floor(lesson: str, ratio: float) -> float | None:
    """The least a healthy GPU whose 16-bit / fp32 matrix-product ratio is `ratio` shows in lesson `lesson`'s
    headline, or None where the rates set no least:

    - 00, 16-bit / fp32 matmul: the ratio itself;
    - 06, the CNN's best 16-bit / fp32 images/s, and 13, the GPT with every toggle / fp32 tokens/s: Amdahl,
      the products at least PRODUCT_SHARE_MIN of the fp32 step, the rest no faster (`speedup_floor`, uncapped);
    - 07, aligned / misaligned 16-bit product: none (a misaligned kernel that keeps most of a slow Tensor Core
      rate loses little)."""
    if lesson == "00":
        return ratio
    if lesson in ("06", "13"):
        return speedup_floor(ratio, cap=math.inf)
    if lesson == "07":
        return None
    raise KeyError(f"lesson {lesson}'s ratio does not follow from matrix-product rates")


def lesson_most(lesson: str, ratio: float) -> float:
    """The most a GPU whose 16-bit / fp32 ratio is `ratio` can show in lesson `lesson`'s headline:

    - 00: the ratio;
    - 06: `speedup_ceiling` with the rest gaining HALF_BYTES_GAIN (16-bit bytes);
    - 07: the ratio (the misaligned product runs at least at the fp32 rate: on the H200 151 against 53
      TFLOP/s, results/course/2026-12-03-h200-00-to-15, gemm_tflops_bf16_4095 and matmul_fp32);
    - 13: `speedup_ceiling` with the rest gaining HALF_BYTES_GAIN x FUSION_GAIN (torch.compile fuses it)."""
    if lesson in ("00", "07"):
        return ratio
    if lesson == "06":
        return speedup_ceiling(ratio, HALF_BYTES_GAIN)
    if lesson == "13":
        return speedup_ceiling(ratio, HALF_BYTES_GAIN * FUSION_GAIN)
    raise KeyError(f"lesson {lesson}'s ratio does not follow from matrix-product rates")


RATE_LESSONS = ("00", "06", "07", "13")

POWER_NOTE = "the share a 70 W T4 holds at its power limit (gpulab.core.specs.POWER_CAPPED_HALF_SHARE)"


def matmul_rate(precision: str, facts=None) -> tuple[float | None, str]:
    """(TFLOP/s, where it comes from) of a large matrix product in `precision` here, for a prediction printed
    before measuring: this GPU's ceiling (gpulab.core.ceilings: notebook 00's measurement, else this GPU's
    datasheet); under a GPU profile with no measurement made under it, the profile's datasheet (a power-capped
    board's sustained rate), said so; (None, why) where neither is known (a CPU, a GPU not in the table before
    notebook 00 has run)."""
    from gpulab.core.ceilings import ceilings
    from gpulab.core.device import device_facts

    facts = facts or device_facts()
    c = ceilings().get(f"matmul_{precision}")
    if c is not None:
        whose = (f"this machine's ({facts.emulated_on}, running the {facts.profile} profile)" if facts.profile
                 else "this GPU's" if facts.on_gpu else "this CPU's")
        return c.value, (f"{whose} {precision} ceiling, {c.source}" if c.source.startswith("measured")
                         else f"{whose} {c.source}")
    sheet = facts.datasheet
    if facts.profile and sheet is not None:
        rate = {"fp32": sheet.fp32, "tf32": sheet.tf32}.get(precision)
        if precision in ("fp16", "bf16"):
            rate = sheet.sustained_half(bf16=precision == "bf16" and facts.bf16)
        if rate:
            capped = f", {POWER_NOTE}" if sheet.power_capped and precision in ("fp16", "bf16") else ""
            return rate, (f"the {facts.profile} profile's datasheet ({sheet.model}: {sheet.source}{capped}); "
                          "this machine runs the timings, so they will not match it")
    if not facts.on_gpu:
        return None, "no GPU here, and notebook 00 has not measured this CPU's products"
    return None, f"no {precision} ceiling for this GPU: run notebook 00 first"

