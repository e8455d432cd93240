"""One kernel's time is not promised by two fixes: the products of attention written by hand are attention_math's
to replace where that rule fires, not misaligned_gemm's to pad (kernel_rules.misaligned_gemm)."""
import dataclasses

import pytest

from gpulab.diagnose import rules as R

from test_rules import WINDOW, facts, gemm

ODD = {"dtype": "bf16", "math_": "bf16", "tensor_cores": True, "misaligned": True, "shapes": ((768, 197, 64), (768, 64, 197))}


def attention_product(ms):
    return dataclasses.replace(gemm(ms, **ODD), op="aten::bmm", attention=True)


def test_misaligned_gemm_leaves_the_attention_products_to_attention_math_where_it_fires():
    fires = R.ATTENTION_SHARE_MIN * WINDOW                     # attention by hand at its threshold: it fires
    step = facts(gemms=(attention_product(0.2 * WINDOW),), attention_math_ms=fires, attention_shape=(197, 197))
    assert R.attention_math(step) is not None and R.misaligned_gemm(step) is None
    # the same products, attention under its threshold (it stays silent): padding them is misaligned_gemm's fix
    silent = facts(gemms=(attention_product(0.2 * WINDOW),), attention_math_ms=fires * 0.99, attention_shape=(197, 197))
    assert R.attention_math(silent) is None
    assert R.misaligned_gemm(silent).share == pytest.approx(0.2)
    # a misaligned product that is not attention's is still counted beside it
    both = facts(gemms=(attention_product(0.2 * WINDOW), gemm(0.1 * WINDOW, **ODD)), attention_math_ms=fires,
                 attention_shape=(197, 197))
    assert R.misaligned_gemm(both).share == pytest.approx(0.1)
