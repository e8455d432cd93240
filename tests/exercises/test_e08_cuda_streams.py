"""Exercise 08.streams: wrong fixes of the one-stream copy-and-compute loop are rejected with their reason (tiny
size, CPU, in the grader's fresh process, as a learner's submission is graded)."""
import textwrap

from gpulab.exercises import exercise

NAME = "08.streams"


def grade(source: str):
    return exercise(NAME).check(textwrap.dedent(source), quiet=True)


def reason(v) -> str:
    return " ".join(v.why).lower()


def test_a_prefetch_that_overwrites_the_chunk_before_it_is_used_is_rejected():
    # the next chunk fetched into `ahead` before the current one is read from it: chunk i computed on chunk i+1
    v = grade("""
        import torch
        def copy_and_compute(chunks, w):
            ahead = chunks[0].to(w.device, non_blocking=True)
            means = []
            for i in range(len(chunks)):
                if i + 1 < len(chunks):
                    ahead = chunks[i + 1].to(w.device, non_blocking=True)
                h = ahead
                for _ in range(4):
                    h = torch.relu(h @ w)
                means.append(h.float().mean(0))
            return torch.stack(means)
        """)
    assert v.state == "failed", v.why
    assert "call 1's output differs" in reason(v)


def test_products_in_fp32_change_the_numerics():
    # the chunks upcast to fp32: another result than the 16-bit products of the code as given
    v = grade("""
        import torch
        def copy_and_compute(chunks, w):
            means = []
            for chunk in chunks:
                h = chunk.to(w.device, non_blocking=True).float()
                for _ in range(4):
                    h = torch.relu(h @ w.float())
                means.append(h.mean(0))
            return torch.stack(means)
        """)
    assert v.state == "failed", v.why
    assert "differs from the reference's" in reason(v)


def test_a_chunk_left_out_is_rejected():
    v = grade("""
        import torch
        def copy_and_compute(chunks, w):
            means = []
            for chunk in chunks[:-1]:
                h = chunk.to(w.device, non_blocking=True)
                for _ in range(4):
                    h = torch.relu(h @ w)
                means.append(h.float().mean(0))
            return torch.stack(means)
        """)
    assert v.state == "failed", v.why
    assert "shape differs" in reason(v)
