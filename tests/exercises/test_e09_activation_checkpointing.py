"""09.checkpoint: wrong submissions are rejected with their reason; the lesson's fix passes. Graded at the tiny
size on the CPU, in the grader's fresh process (speed and peak memory are not judged there: a step without any
checkpointing passes here and fails the memory budget on a GPU)."""
import textwrap

from gpulab.exercises import exercise

NAME = "09.checkpoint"


def grade(source: str):
    return exercise(NAME).check(textwrap.dedent(source), quiet=True, who="test")


def reason(v) -> str:
    return " ".join(v.why).lower()


def test_the_lessons_fix_passes():
    v = exercise(NAME).check(exercise(NAME).task.reference, quiet=True, who="reference")
    assert v.state == "passed", v.why
    assert "peak memory is not judged on the cpu" in reason(v)


def test_blocks_run_without_gradients_are_not_checkpointing():
    # "saves memory" by running the first blocks under no_grad: they keep nothing, and they no longer train
    v = grade("""
        import torch
        from gpulab.models.transformer import loss_fn
        def make_step(model, optimizer):
            def step(x, y):
                h = x
                with torch.no_grad():
                    for block in model.blocks[:2]:
                        h = block(h)
                for block in model.blocks[2:]:
                    h = block(h)
                loss = loss_fn(model.head(model.ln_f(h)), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                return loss
            return step
        """)
    assert v.state == "failed", v.why
    assert "not the same training" in reason(v)


def test_bf16_autocast_is_past_the_systems_tier():
    # faster by another lesson's knob: 16-bit rounding is not what checkpointing may change
    v = grade("""
        import torch
        from torch.utils.checkpoint import checkpoint
        from gpulab.models.transformer import loss_fn
        def make_step(model, optimizer):
            def step(x, y):
                with torch.autocast(x.device.type, dtype=torch.bfloat16):
                    h = x
                    for i, block in enumerate(model.blocks):
                        h = checkpoint(block, h, use_reentrant=False) if i < 2 else block(h)
                    out = model.head(model.ln_f(h))
                loss = loss_fn(out, y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                return loss
            return step
        """)
    assert v.state == "failed", v.why
    assert "noise floor" in reason(v) and "downcast" in reason(v)
