"""Exercise 13.capstone (numerics tier): wrong fixes of the fp32 GPT step are rejected with their reason (tiny size,
CPU, in the grader's fresh process, as a learner's submission is graded)."""
import textwrap

from gpulab.exercises import exercise

NAME = "13.capstone"


def grade(source: str):
    return exercise(NAME).check(textwrap.dedent(source), quiet=True)


def reason(v) -> str:
    return " ".join(v.why).lower()


def test_weights_cast_to_bf16_are_not_mixed_precision():
    # model.to(bfloat16): the weights and AdamW's updates rounded to 8 bits, not only the products
    v = grade("""
        import torch
        def make_step(model, optimizer):
            model.to(torch.bfloat16)
            def step(x, y):
                loss = model.loss(x, y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                return loss.detach()
            return step
        """)
    assert v.state == "failed", v.why
    assert "more rounding than the lesson's own fix" in reason(v)


def test_another_learning_rate_is_not_the_same_training():
    v = grade("""
        import torch
        def make_step(model, optimizer):
            fused = torch.optim.AdamW(model.parameters(), lr=4 * optimizer.defaults["lr"], fused=True)
            def step(x, y):
                with torch.autocast(x.device.type, dtype=torch.bfloat16):
                    loss = model.loss(x, y)
                fused.zero_grad(set_to_none=True)
                loss.backward()
                fused.step()
                return loss.detach()
            return step
        """)
    assert v.state == "failed", v.why
    assert "parameters" in reason(v)


def test_a_step_without_the_update_is_rejected():
    v = grade("""
        import torch
        def make_step(model, optimizer):
            def step(x, y):
                with torch.autocast(x.device.type, dtype=torch.bfloat16):
                    loss = model.loss(x, y)
                loss.backward()
                return loss.detach()
            return step
        """)
    assert v.state == "failed", v.why
    assert "ended far from" in reason(v)


def test_a_backward_cut_after_the_first_block_is_rejected():
    # a cheat of the 2026-12-06 evening's reread: a forward hook detaches the first block's output, so backward
    # stops there (less work) and the embeddings and that block never train; the loss of a few calls looks right
    v = grade("""
        import torch
        def make_step(model, optimizer):
            model.blocks[0].register_forward_hook(lambda m, i, o: o.detach())
            same = {k: optimizer.defaults[k] for k in ("lr", "betas", "eps", "weight_decay")}
            fused = torch.optim.AdamW(model.parameters(), **same)
            def step(x, y):
                with torch.autocast(x.device.type, dtype=torch.bfloat16):
                    loss = model.loss(x, y)
                fused.zero_grad(set_to_none=True)
                loss.backward()
                fused.step()
                return loss.detach()
            return step
        """)
    assert v.state == "failed", v.why
    assert "parameters" in reason(v)
