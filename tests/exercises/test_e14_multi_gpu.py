"""Exercise 14.buckets: wrong fixes of the per-parameter all-reduce are rejected with their reason (tiny size, CPU,
gloo in a world of one, in the grader's fresh process, as a learner's submission is graded)."""
import textwrap

from gpulab.exercises import exercise

NAME = "14.buckets"


def grade(source: str):
    return exercise(NAME).check(textwrap.dedent(source), quiet=True)


def reason(v) -> str:
    return " ".join(v.why).lower()


def test_a_step_that_skips_the_all_reduce_is_rejected():
    # in a world of one the parameters cannot tell: the collectives do
    v = grade("""
        def make_step(model, optimizer):
            def step(x, y):
                loss = model(x, y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                return loss.detach()
            return step
        """)
    assert v.state == "failed", v.why
    assert "every gradient must be averaged" in reason(v)


def test_a_bucket_of_only_the_weights_is_rejected():
    # the biases left out of the bucket
    v = grade("""
        import torch
        import torch.distributed as dist
        def make_step(model, optimizer):
            def step(x, y):
                loss = model(x, y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grads = [p.grad for p in model.parameters() if p.dim() == 2]
                bucket = torch.cat([g.reshape(-1) for g in grads])
                dist.all_reduce(bucket)
                for b, g in zip(bucket.split([g.numel() for g in grads]), grads):
                    g.copy_(b.view_as(g))
                optimizer.step()
                return loss.detach()
            return step
        """)
    assert v.state == "failed", v.why
    assert "all-reduced" in reason(v)


def test_a_bucket_copied_back_in_the_wrong_order_is_rejected():
    v = grade("""
        import torch
        import torch.distributed as dist
        def make_step(model, optimizer):
            def step(x, y):
                loss = model(x, y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grads = [p.grad for p in model.parameters()]
                bucket = torch.cat([g.reshape(-1) for g in grads])
                dist.all_reduce(bucket)
                pieces = bucket.split([g.numel() for g in grads])
                for g, b in zip(grads, pieces):
                    g.copy_(b.flip(0).view_as(g))
                optimizer.step()
                return loss.detach()
            return step
        """)
    assert v.state == "failed", v.why
    assert "parameters" in reason(v)
