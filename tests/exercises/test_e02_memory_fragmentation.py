"""02.cache: the lesson's fix passes, and steps that "save memory" by training another model are rejected with
their reason. Graded at the tiny size on the CPU, in the grader's fresh process (the allocator is CUDA's: speed is
not judged there)."""
import textwrap

import pytest

from gpulab.exercises import exercise

NAME = "02.cache"


def grade(source: str):
    return exercise(NAME).check(textwrap.dedent(source), quiet=True, who="test")


def reason(v) -> str:
    return " ".join(v.why).lower()


def test_the_lessons_fix_passes():
    v = exercise(NAME).check(exercise(NAME).task.reference, quiet=True, who="reference")
    assert v.state == "passed", v.why
    assert "noise floor" in reason(v)


WRONG = {
    # the gradients freed before the update, "to give their memory back sooner": SGD then has nothing to apply
    "gradients freed before the update": ("""
        import torch
        def make_step(model, optimizer):
            def step(x, y):
                loss = torch.nn.functional.mse_loss(model(x), y)
                loss.backward()
                optimizer.zero_grad(set_to_none=True)
                optimizer.step()
                return loss
            return step
        """, "skipped backward or update"),
    # the forward in bf16 to halve the activations' memory: another model's rounding, past the systems tier
    "activations in bf16": ("""
        import torch
        def make_step(model, optimizer):
            kind = next(model.parameters()).device.type
            def step(x, y):
                with torch.autocast(kind, dtype=torch.bfloat16):
                    loss = torch.nn.functional.mse_loss(model(x).float(), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                return loss
            return step
        """, "more than 4x the floor"),
}


@pytest.mark.parametrize("case", WRONG, ids=list(WRONG))
def test_a_memory_saving_that_changes_the_training_is_rejected(case):
    source, word = WRONG[case]
    v = grade(source)
    assert v.state == "failed", v.why
    assert word in reason(v)
