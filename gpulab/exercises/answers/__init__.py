"""Reference answers to the free-text exercises (issue 39, item 6): every numbered item of a notebook's
"## Exercises" list that is not the graded one has an `Answer` here, in the module of its notebook (`n03.py` for
notebook 03), and `tests/exercises/test_answers.py` runs each at the tiny size on the CPU (an answer that needs a
GPU, Triton or two GPUs says so, and the test skips it with that reason).

In a notebook:

    from gpulab.exercises.answers import answer
    answer("03", 2)             # the reference answer to exercise 2: what to do, what to look for; then runs it here

An answer's `run(scale)` does the exercise as written, with the course's own functions, at `scale` ("tiny" or
"full") on this machine's device, and returns what it measured as a dict of named values (printed beside the prose).
Its `text` says what to do and how to read the result; it quotes no figure of its own (a figure depends on the GPU:
the run prints this one's). `expect(found)` states what the answer claims about the result as a check that can fail,
and returns why it failed, or None; where a claim holds only on a GPU (a speedup), it returns None on the CPU and says
so in `text`.
"""
from __future__ import annotations

import importlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class Answer:
    notebook: str                                   # "03"
    number: int                                     # its number in the notebook's "## Exercises" list
    text: str                                       # what to do, what to look for, and why
    run: Callable[[str], dict] | None = None        # does the exercise at "tiny" or "full"; what it measured
    expect: Callable[[dict], str | None] | None = None   # the answer's claim about `run`'s result, checked
    needs: str | None = None                        # "cuda", "triton", "2 gpus", "notebook 00's ceilings": else skip

    def missing(self) -> str | None:
        """Why `run` cannot run on this machine (what it needs), or None."""
        if self.needs is None:
            return None
        import torch
        if self.needs in ("cuda", "triton", "2 gpus") and not torch.cuda.is_available():
            return f"exercise {self.number} of notebook {self.notebook} needs a CUDA GPU"
        if self.needs == "triton":
            from gpulab.lessons.l04_occupancy_and_waves import triton_status
            ok, why = triton_status(torch.device("cuda"))
            return None if ok else f"exercise {self.number} of notebook {self.notebook} needs Triton: {why}"
        if self.needs == "2 gpus" and torch.cuda.device_count() < 2:
            return f"exercise {self.number} of notebook {self.notebook} needs two GPUs, this machine has one"
        return None


def one_thread_on_cpu(run: Callable[[str], dict]) -> Callable[[str], dict]:
    """`run` with PyTorch on one CPU thread when the device is the CPU, restored after: on a small shared machine
    two threads wait for each other, and a 1 MiB copy or a 128 x 128 product jumps from microseconds to
    milliseconds. A GPU run is left as it is."""
    import functools
    import torch
    from gpulab.core.device import pick_device

    @functools.wraps(run)
    def wrapped(scale: str) -> dict:
        if pick_device().type != "cpu":
            return run(scale)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return run(scale)
        finally:
            torch.set_num_threads(threads)
    return wrapped


def answers(notebook: str) -> dict[int, Answer]:
    """Notebook `notebook`'s reference answers, by exercise number."""
    try:
        mod = importlib.import_module(f"gpulab.exercises.answers.n{notebook}")
    except ModuleNotFoundError as err:
        raise ValueError(f"no reference answers for notebook {notebook!r} (gpulab/exercises/answers/n{notebook}.py)") from err
    found = {a.number: a for a in mod.ANSWERS}
    if len(found) != len(mod.ANSWERS):
        raise ValueError(f"notebook {notebook}: two answers have one number")
    return found


def exercise_items(notebook: str) -> dict[int, str]:
    """The numbered items of the notebook's "## Exercises" cell, by number (the item's text, its lines joined)."""
    [path] = sorted((ROOT / "notebooks").glob(f"{notebook}_*.ipynb"))
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and src.lstrip().startswith("## Exercises"):
            items = re.split(r"^(\d+)\. ", src, flags=re.M)[1:]
            return {int(n): " ".join(t.split()) for n, t in zip(items[::2], items[1::2])}
    raise ValueError(f"{path.name} has no '## Exercises' cell")


def is_graded(item: str) -> bool:
    """The graded exercise's item ("The graded exercise above: ..."): its answer is `ex.solution()`."""
    return item.startswith("The graded exercise")


def answer(notebook: str, number: int, *, run: bool = True, scale: str | None = None) -> dict | None:
    """Print the reference answer to exercise `number` of notebook `notebook`; with `run`, do it here and print
    what it measured (and whether the answer's claim held). Returns the measurement, or None."""
    from gpulab.core.device import resolve_scale
    items = exercise_items(notebook)
    if number not in items:
        raise ValueError(f"notebook {notebook} has exercises {min(items)}-{max(items)}, not {number}")
    if is_graded(items[number]):
        print(f"Exercise {number} is the graded one: `ex.solution()` shows and runs the reference fix.")
        return None
    a = answers(notebook).get(number)
    if a is None:
        raise ValueError(f"notebook {notebook}'s exercise {number} has no reference answer yet")
    print(f"Exercise {number}: {items[number]}\n\nAnswer: {a.text}")
    if not run or a.run is None:
        return None
    why = a.missing()
    if why:
        print(f"\nNot run here: {why}.")
        return None
    found = a.run(resolve_scale(scale))
    print("\nMeasured here:")
    for k, v in found.items():
        print(f"  {k}: {v:.4g}" if isinstance(v, float) else f"  {k}: {v}")
    if a.expect is not None:
        failed = a.expect(found)
        print("\nThe answer's claim " + ("held here." if failed is None else f"did NOT hold here: {failed}"))
    return found
