"""07.align: wrong submissions are rejected with their reason; the lesson's fix and an equivalent padding pass.
Graded at the tiny size on the CPU, in the grader's fresh process (speed is not judged there)."""
import textwrap

import pytest

from gpulab.exercises import exercise

NAME = "07.align"


def grade(source: str):
    return exercise(NAME).check(textwrap.dedent(source), quiet=True, who="test")


def reason(v) -> str:
    return " ".join(v.why).lower()


def test_the_lessons_fix_passes():
    v = exercise(NAME).check(exercise(NAME).task.reference, quiet=True, who="reference")
    assert v.state == "passed", v.why


WRONG = {
    # padded with ones: every sum gains the padding's products
    "ones": ("""
        import torch
        def product(a, b):
            k, n = a.shape[1], b.shape[1]
            a = torch.nn.functional.pad(a, (0, -k % 64), value=1.0)
            b = torch.nn.functional.pad(b, (0, -n % 64, 0, -k % 64), value=1.0)
            return (a @ b)[:, :n]
        """, "differs"),
    # the padded result returned whole: m x (n + pad)
    "not sliced": ("""
        import torch
        def product(a, b):
            k, n = a.shape[1], b.shape[1]
            a = torch.nn.functional.pad(a, (0, -k % 64))
            b = torch.nn.functional.pad(b, (0, -n % 64, 0, -k % 64))
            return a @ b
        """, "shape differs"),
    # aligned by dropping the last columns of a and rows of b instead of padding
    "truncated": ("""
        def product(a, b):
            k = a.shape[1] // 8 * 8
            return a[:, :k] @ b[:k]
        """, "differs"),
    # inputs rounded through FP8 (e4m3, one scale per tensor): several 16-bit roundings off
    "fp8": ("""
        import torch
        def product(a, b):
            f8 = torch.float8_e4m3fn
            sa, sb = a.abs().max() / 448, b.abs().max() / 448
            return ((a / sa).to(f8).to(a.dtype) * sa) @ ((b / sb).to(f8).to(b.dtype) * sb)
        """, "differs"),
}


@pytest.mark.parametrize("case", WRONG, ids=list(WRONG))
def test_a_wrong_product_is_rejected(case):
    source, word = WRONG[case]
    v = grade(source)
    assert v.state == "failed", v.why
    assert word in reason(v)
