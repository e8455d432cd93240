"""Answer 11.1's claim that eager's time per op is a flat launch cost, at the edges of its band per device
(n11.FLAT): a CPU under load gets 2x either way, a GPU 1.5x; a chain's time read as a time per op (4x) fails both."""
import pytest

from gpulab.exercises.answers import n11
from gpulab.lessons.l11_cuda_graphs import config


def found(device, ratio):
    counts = config("tiny")["counts"]
    sizes = n11.ELEMENTS["tiny"]
    f = {"device": device, "scale": "tiny", "100 ops: eager us/op": 10.0, f"{counts[-1]} ops: eager us/op": 10.0 * ratio,
         f"{sizes[0]} elements: eager us/op": 10.0, f"{sizes[-1]} elements: eager us/op": 100.0,
         f"{counts[-1]} ops: graph us/op": 1.0}                # a replay faster per op than eager: the next claim holds
    return f


@pytest.mark.parametrize("device, ratio, holds", [
    ("cpu", 0.616, True), ("cpu", 0.49, False), ("cpu", 1.99, True), ("cpu", 2.01, False), ("cpu", 4.0, False),
    ("cuda", 0.66, False), ("cuda", 0.68, True), ("cuda", 1.49, True), ("cuda", 1.51, False)])
def test_the_flat_launch_cost_band(device, ratio, holds):
    why = n11._launch_claim(found(device, ratio))
    assert (why is None or "flat launch cost" not in why) == holds, why
