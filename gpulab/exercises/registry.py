"""Every graded exercise, found in the modules `gpulab/exercises/eNN_*.py` (one per notebook, each with a list
`TASKS`). Adding an exercise is a task in its lesson's module: nothing else lists it."""
from __future__ import annotations

import functools
import importlib
import pkgutil

from gpulab.exercises.task import Task


@functools.cache
def tasks() -> dict[str, Task]:
    import gpulab.exercises as package
    found: dict[str, Task] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.name[:1] == "e" and info.name[1:3].isdigit():
            module = importlib.import_module(f"gpulab.exercises.{info.name}")
            for t in getattr(module, "TASKS", ()):
                if t.name in found:
                    raise ValueError(f"two exercises are named {t.name!r}")
                if not t.name.startswith(f"{t.lesson}.") or info.name[1:3] != t.lesson:
                    raise ValueError(f"exercise {t.name!r} (lesson {t.lesson}) is defined in {info.name}")
                found[t.name] = t
    return found


def task(name: str) -> Task:
    """The exercise called `name` ("01.sync"); a clear error naming the ones there are."""
    all_tasks = tasks()
    if name not in all_tasks:
        raise KeyError(f"no exercise {name!r}; there are: {', '.join(all_tasks)}")
    return all_tasks[name]


def for_lesson(lesson: str) -> list[Task]:
    return [t for t in tasks().values() if t.lesson == lesson]
