"""03.workers: the lesson's fix (worker processes) passes, and loaders that serve other batches are rejected with
their reason. Graded at the tiny size on the CPU, in the grader's fresh process, with real DataLoader workers
(speed is not judged there: the workers share the CPU with the step they should run beside)."""
import textwrap

import pytest

from gpulab.exercises import exercise

NAME = "03.workers"


def grade(source: str):
    return exercise(NAME).check(textwrap.dedent(source), quiet=True, who="test")


def reason(v) -> str:
    return " ".join(v.why).lower()


def test_the_lessons_fix_passes_with_workers():
    v = exercise(NAME).check(exercise(NAME).task.reference, quiet=True, who="reference")
    assert v.state == "passed", v.why
    assert "noise floor" in reason(v)
    assert v.detail["sizes"]["workers"] >= 1


WRONG = {
    # workers, and shuffling "as training loops do": other batches, in another order
    "shuffled": ("""
        import torch
        def make_loader(dataset, batch_size):
            return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=2)
        """, "more than 4x the floor"),
    # smaller batches "so that more workers have work": not the batches the step trains on
    "half batches": ("""
        import torch
        def make_loader(dataset, batch_size):
            return torch.utils.data.DataLoader(dataset, batch_size=batch_size // 2, num_workers=2)
        """, "batch_size"),
    # each worker given the whole dataset (an IterableDataset-style mistake): every batch served once per worker
    "every worker serves everything": ("""
        import torch
        class _All(torch.utils.data.IterableDataset):
            def __init__(self, data):
                self.data = data
            def __iter__(self):
                return (self.data[i] for i in range(len(self.data)))
        def make_loader(dataset, batch_size):
            return torch.utils.data.DataLoader(_All(dataset), batch_size=batch_size, num_workers=2)
        """, "batches; the dataset makes"),
    # the first epoch's batches kept and served again: fast, and stale (every epoch's dataset is fresh)
    "cached batches": ("""
        import torch
        _kept = []
        def make_loader(dataset, batch_size):
            if not _kept:
                _kept.extend(torch.utils.data.DataLoader(dataset, batch_size=batch_size, num_workers=0))
            return list(_kept)
        """, "more than 4x the floor"),
}


@pytest.mark.parametrize("case", WRONG, ids=list(WRONG))
def test_a_loader_that_serves_other_batches_is_rejected(case):
    source, word = WRONG[case]
    v = grade(source)
    assert v.state == "failed", v.why
    assert word in reason(v)
