"""10.accumulate: the classic accumulation mistakes are rejected with their reason; the lesson's fix passes. Graded
at the tiny size on the CPU, in the grader's fresh process (speed and peak memory are not judged there: one whole
batch passes here and fails the memory budget on a GPU)."""
import textwrap

import pytest

from gpulab.exercises import exercise

NAME = "10.accumulate"


def grade(source: str):
    return exercise(NAME).check(textwrap.dedent(source), quiet=True, who="test")


def reason(v) -> str:
    return " ".join(v.why).lower()


def test_the_lessons_fix_passes():
    v = exercise(NAME).check(exercise(NAME).task.reference, quiet=True, who="reference")
    assert v.state == "passed", v.why
    assert "the lesson's own fix against the fp32 code" in reason(v)


WRONG = {
    # each micro-batch's loss not divided: the gradients add up to twice the batch's
    "undivided": ("""
        from gpulab.models.transformer import loss_fn
        def make_step(model, optimizer):
            def step(x, y):
                optimizer.zero_grad(set_to_none=True)
                total = 0.0
                for xs, ys in zip(x.chunk(2), y.chunk(2)):
                    loss = loss_fn(model(xs), ys)
                    loss.backward()
                    total = total + loss.detach() / 2
                optimizer.step()
                return total
            return step
        """, "ended far from"),
    # zero_grad inside the loop: only the last micro-batch's gradient is left for the update
    "zero_grad each micro-batch": ("""
        from gpulab.models.transformer import loss_fn
        def make_step(model, optimizer):
            def step(x, y):
                total = 0.0
                for xs, ys in zip(x.chunk(2), y.chunk(2)):
                    optimizer.zero_grad(set_to_none=True)
                    loss = loss_fn(model(xs), ys) / 2
                    loss.backward()
                    total = total + loss.detach()
                optimizer.step()
                return total
            return step
        """, "ended far from"),
    # the right update, but the last micro-batch's loss returned as the batch's
    "last loss": ("""
        from gpulab.models.transformer import loss_fn
        def make_step(model, optimizer):
            def step(x, y):
                optimizer.zero_grad(set_to_none=True)
                for xs, ys in zip(x.chunk(2), y.chunk(2)):
                    loss = loss_fn(model(xs), ys) / 2
                    loss.backward()
                optimizer.step()
                return loss * 2
            return step
        """, "loss differs"),
}


@pytest.mark.parametrize("case", WRONG, ids=list(WRONG))
def test_an_accumulation_mistake_is_rejected(case):
    source, word = WRONG[case]
    v = grade(source)
    assert v.state == "failed", v.why
    assert word in reason(v)
