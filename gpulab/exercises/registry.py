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


@functools.cache
def _lesson_tasks(lesson: str) -> tuple[Task, ...]:
    """The exercises of one lesson, importing only its module (eNN_*.py). A notebook's kernel and its grading
    processes then import one lesson's exercises, not all: e12's module builds a torch.compile'd function when
    imported (1.7 s on 2 cores, 2026-12-07), which every notebook's kernel and fork server paid."""
    import gpulab.exercises as package
    found = []
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith(f"e{lesson}_"):
            module = importlib.import_module(f"gpulab.exercises.{info.name}")
            found += [t for t in getattr(module, "TASKS", ()) if t.lesson == lesson]
    return tuple(found)


def task(name: str) -> Task:
    """The exercise called `name` ("01.sync"); a clear error naming the ones there are."""
    lesson = name.split(".", 1)[0]
    for t in _lesson_tasks(lesson) if lesson.isdigit() else ():
        if t.name == name:
            return t
    all_tasks = tasks()
    if name not in all_tasks:
        raise KeyError(f"no exercise {name!r}; there are: {', '.join(all_tasks)}")
    return all_tasks[name]


def for_lesson(lesson: str) -> list[Task]:
    return list(_lesson_tasks(lesson))
