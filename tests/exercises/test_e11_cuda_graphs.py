"""Exercise 11.graphs: wrong fixes of the launch-bound MLP step are rejected with their reason (tiny size, CPU,
in the grader's fresh process, as a learner's submission is graded)."""
import textwrap

from gpulab.exercises import exercise

NAME = "11.graphs"


def grade(source: str):
    return exercise(NAME).check(textwrap.dedent(source), quiet=True)


def reason(v) -> str:
    return " ".join(v.why).lower()


def test_a_replay_of_stale_static_inputs_is_rejected():
    # the capture's classic mistake: new batches never copied into the static inputs (emulated on the CPU)
    v = grade("""
        def make_step(model, optimizer):
            static = {}
            def step(x, y):
                if "x" not in static:
                    static["x"], static["y"] = x.clone(), y.clone()
                loss = model(static["x"], static["y"])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                return loss.detach()
            return step
        """)
    assert v.state == "failed", v.why
    assert "ended far from the reference's" in reason(v)


def test_warm_up_calls_that_do_not_train_are_rejected():
    # warm-up steps that only run forward and backward (no update) before the capture
    v = grade("""
        def make_step(model, optimizer):
            calls = [0]
            def step(x, y):
                calls[0] += 1
                optimizer.zero_grad(set_to_none=True)
                loss = model(x, y)
                loss.backward()
                if calls[0] > 2:
                    optimizer.step()
                return loss.detach()
            return step
        """)
    assert v.state == "failed", v.why
    assert "parameters" in reason(v)


def test_a_step_without_the_update_is_rejected():
    v = grade("""
        def make_step(model, optimizer):
            def step(x, y):
                loss = model(x, y)
                loss.backward()
                return loss.detach()
            return step
        """)
    assert v.state == "failed", v.why
    assert "ended far from" in reason(v)
