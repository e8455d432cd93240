"""05.pinned: the lesson's fix passes, and copies made cheaper by sending something else are rejected with their
reason. Graded at the tiny size on the CPU, in the grader's fresh process (no pinned memory or bus there: only
correctness is judged; a pinned buffer overwritten before its copy has finished shows only on a GPU)."""
import textwrap

import pytest

from gpulab.exercises import exercise

NAME = "05.pinned"


def grade(source: str):
    return exercise(NAME).check(textwrap.dedent(source), quiet=True, who="test")


def reason(v) -> str:
    return " ".join(v.why).lower()


def test_the_lessons_fix_passes():
    v = exercise(NAME).check(exercise(NAME).task.reference, quiet=True, who="reference")
    assert v.state == "passed", v.why
    assert "noise floor" in reason(v)


WRONG = {
    # half the bytes over the bus: the batch rounded to fp16 on the host, another model's inputs
    "sent as fp16": ("""
        import torch
        def make_step(model, optimizer):
            device = next(model.parameters()).device
            def step(x, y):
                x, y = x.half().to(device).float(), y.half().to(device).float()
                loss = torch.nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                return loss
            return step
        """, "more than 4x the floor"),
    # the batch copied to the GPU once and kept: every later step trains on the first batch again
    "first batch kept": ("""
        import torch
        def make_step(model, optimizer):
            device = next(model.parameters()).device
            kept = []
            def step(x, y):
                if not kept:
                    kept.extend([x.to(device), y.to(device)])
                loss = torch.nn.functional.mse_loss(model(kept[0]), kept[1])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                return loss
            return step
        """, "more than 4x the floor"),
}


@pytest.mark.parametrize("case", WRONG, ids=list(WRONG))
def test_a_copy_that_sends_something_else_is_rejected(case):
    source, word = WRONG[case]
    v = grade(source)
    assert v.state == "failed", v.why
    assert word in reason(v)
