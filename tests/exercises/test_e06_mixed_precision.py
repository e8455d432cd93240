"""06.amp: wrong submissions are rejected with their reason; the lesson's fix passes. Graded at the tiny size on
the CPU, in the grader's fresh process, as a learner's submission is (speed is not judged there)."""
import textwrap

from gpulab.exercises import exercise

NAME = "06.amp"


def grade(source: str):
    return exercise(NAME).check(textwrap.dedent(source), quiet=True, who="test")


def reason(v) -> str:
    return " ".join(v.why).lower()


def test_the_lessons_fix_passes():
    v = exercise(NAME).check(exercise(NAME).task.reference, quiet=True, who="reference")
    assert v.state == "passed", v.why
    assert "the lesson's own fix against the fp32 code" in reason(v)


def test_weights_cast_to_bf16_are_more_rounding_than_autocast():
    # the whole model in bf16: its updates are rounded away against the weights, far past autocast's rounding
    v = grade("""
        import torch
        def make_step(model, optimizer):
            model.to(torch.bfloat16)
            def step(x, y):
                optimizer.zero_grad(set_to_none=True)
                loss = model.loss(x, y)
                loss.backward()
                optimizer.step()
                return loss
            return step
        """)
    assert v.state == "failed", v.why
    assert "more rounding than the lesson's own fix" in reason(v)


def test_a_step_without_the_update_fails():
    v = grade("""
        import torch
        def make_step(model, optimizer):
            def step(x, y):
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast(x.device.type, dtype=torch.bfloat16):
                    loss = model.loss(x, y)
                loss.backward()
                return loss
            return step
        """)
    assert v.state == "failed", v.why
    assert "ended far from" in reason(v)
