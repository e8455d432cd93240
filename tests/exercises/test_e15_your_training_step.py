"""Exercise 15.diagnosed: wrong fixes of the step with a gc.collect() every step are rejected with their reason
(tiny size, CPU, in the grader's fresh process, as a learner's submission is graded)."""
import textwrap

from gpulab.exercises import exercise

NAME = "15.diagnosed"


def grade(source: str):
    return exercise(NAME).check(textwrap.dedent(source), quiet=True)


def reason(v) -> str:
    return " ".join(v.why).lower()


def test_dropping_zero_grad_with_the_collection_is_not_the_same_training():
    # a "clean-up" that takes more than the collection out: the gradients now add up over the steps
    v = grade("""
        import torch
        def make_step(model, optimizer):
            def step(x, y):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                return loss.detach()
            return step
        """)
    assert v.state == "failed", v.why
    assert "ended far from the reference's" in reason(v)


def test_a_loss_kept_from_the_first_step_is_rejected():
    # the step trains, but returns the loss it logged first: caught on the returned outputs
    v = grade("""
        import torch
        def make_step(model, optimizer):
            history = []
            def step(x, y):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                history.append(loss.detach())
                return history[0]
            return step
        """)
    assert v.state == "failed", v.why
    assert "loss differs" in reason(v)


def test_the_step_for_diagnosis_trains_the_exercise_model():
    import torch
    from gpulab.exercises.e15_your_training_step import make_step_fixed, step_for_diagnosis

    step = step_for_diagnosis(make_step_fixed, scale="tiny", device=torch.device("cpu"))
    first, second = float(step()), float(step())
    assert second < first          # the same batch twice: the loss falls


def test_an_update_every_other_call_is_not_the_same_training():
    # a cheat of the 2026-12-06 night's six questions: half the optimizer steps, each on two batches' averaged
    # gradients (accumulation the exercise did not ask for): half the update work per call, and the loss looks right
    v = grade("""
        import torch
        def make_step(model, optimizer):
            state = {"calls": 0}
            def step(x, y):
                loss = torch.nn.functional.cross_entropy(model(x), y) / 2
                loss.backward()
                state["calls"] += 1
                if state["calls"] % 2 == 0:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                return (2 * loss).detach()
            return step
        """)
    assert v.state == "failed", v.why
    assert "ended far from the reference's" in reason(v)
