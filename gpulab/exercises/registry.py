"""Every graded exercise, found in the modules `gpulab/exercises/eNN_*.py` (one per notebook, each with a list
`TASKS`). Adding an exercise is a task in its lesson's module: nothing else lists it.

A lesson's exercises are read from its own module alone (`task`, `for_lesson`): a notebook's kernel and its grading
processes import one lesson's exercises, not all (e12's module builds a torch.compile'd function when imported,
1.7 s on 2 cores, 2026-12-07, which every notebook's kernel and fork server paid)."""
from __future__ import annotations

import functools
import importlib
import pkgutil

from gpulab.exercises.task import Task

PACKAGE = "gpulab.exercises"


def modules(lesson: str | None = None) -> list[str]:
    """The exercise modules' names (eNN_*), sorted; only lesson `lesson`'s where given."""
    import gpulab.exercises as package
    return sorted(i.name for i in pkgutil.iter_modules(package.__path__)
                  if i.name[:1] == "e" and i.name[1:3].isdigit() and (lesson is None or i.name[1:3] == lesson))


@functools.cache
def _module_tasks(name: str) -> tuple[Task, ...]:
    """Module `name`'s TASKS, each named after the lesson of its module ("NN.something"), or ValueError."""
    found = tuple(getattr(importlib.import_module(f"{PACKAGE}.{name}"), "TASKS", ()))
    for t in found:
        if not t.name.startswith(f"{t.lesson}.") or name[1:3] != t.lesson:
            raise ValueError(f"exercise {t.name!r} (lesson {t.lesson}) is defined in {name}")
    return found


@functools.cache
def tasks() -> dict[str, Task]:
    found: dict[str, Task] = {}
    for name in modules():
        for t in _module_tasks(name):
            if t.name in found:
                raise ValueError(f"two exercises are named {t.name!r}")
            found[t.name] = t
    return found


def for_lesson(lesson: str) -> list[Task]:
    return [t for name in modules(lesson) for t in _module_tasks(name)]


def task(name: str) -> Task:
    """The exercise called `name` ("01.sync"); a clear error naming the ones there are."""
    for t in for_lesson(name.split(".", 1)[0]):
        if t.name == name:
            return t
    all_tasks = tasks()
    if name not in all_tasks:
        raise KeyError(f"no exercise {name!r}; there are: {', '.join(all_tasks)}")
    return all_tasks[name]
