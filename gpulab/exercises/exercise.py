"""The learner's side of a graded exercise, in the notebook:

    ex = exercise("01.sync")       # says what to fix and shows the slow code
    def my_step(model, optimizer): ...   # your copy, edited
    ex.check(my_step)              # passed / failed / suspicious, with the numbers and why
    ex.hint(); ex.hint(2)          # two levels
    ex.solution()                  # the lesson's fix, shown, and graded like yours

`check` writes the function (and what it uses from the notebook: imports, helper functions, plain constants)
to a file and hands it to `gpulab.exercises.grader.grade`, which runs it in a fresh process. A function that
uses a tensor, a model or any other object of the notebook's is refused before grading, with its name: the
grader builds its own, and an object from the kernel could carry a cached answer.

Each verdict is kept in the results store (`exercise <name>`: the ratio, the state and the target), so the
room's board and `Exercise.state()` can read it; "not tried" until the first check.

`Prediction` is the other kind: the learner writes a number before a run, and `check(measured)` compares it
with the measurement after, within a band set by that measurement's spread.
"""
from __future__ import annotations

import builtins
import inspect
import math
import os
import shutil
import tempfile
import textwrap
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpulab.exercises.grader import ENTRY
from gpulab.exercises.registry import for_lesson, task as find_task
from gpulab.exercises.task import Task

STATES = ("not tried", "passed", "failed", "suspicious", "cannot run", "error")
_PLAIN = (int, float, str, bool, type(None))


class SubmissionError(ValueError):
    """The function cannot be handed to a fresh process as it is: the message says what to change."""


def _plain(value) -> bool:
    if isinstance(value, _PLAIN):
        return not (isinstance(value, float) and not math.isfinite(value))
    return isinstance(value, (tuple, list)) and all(_plain(v) for v in value) or (
        isinstance(value, dict) and all(_plain(k) and _plain(v) for k, v in value.items()))


# The instructions that read or write a module-level name. `co_names` also holds attribute names (`x.device`,
# `model.blocks`), which made a notebook's global `device` or `blocks` look used by any function that read an
# attribute of that name.
_GLOBAL_OPS = {"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_FROM_DICT_OR_GLOBALS"}


def _names(code: types.CodeType) -> set[str]:
    """The global names `code` (and the code nested in it: lambdas, comprehensions, inner functions) reads."""
    import dis
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname in _GLOBAL_OPS}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _decorator_names(f) -> set[str]:
    """The names a function's decorators use (`@torch.compile(...)`: torch), which its code object does not hold."""
    import ast
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(f)))
    except (OSError, TypeError, SyntaxError):
        return set()
    found = set()
    for node in tree.body[:1]:
        for dec in getattr(node, "decorator_list", ()):
            found |= {n.id for n in ast.walk(dec) if isinstance(n, ast.Name)}
    return found


def submission_source(fn: Callable | str) -> str:
    """The text of a submission file for `fn`: its imports, the notebook's helpers it calls, and its source,
    ending with `__gpulab_entry__ = <name>`. A string is taken as the source itself (its last top-level `def`)."""
    if isinstance(fn, str):
        import ast
        tree = ast.parse(fn)
        defs = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        if not defs:
            raise SubmissionError("the source defines no function (def ...)")
        return f"{fn.rstrip()}\n\n{ENTRY} = {defs[-1]}\n"
    if not inspect.isfunction(fn):
        raise SubmissionError(f"check() takes a function defined with def (or its source as a string), "
                              f"got {type(fn).__name__}")
    fn = inspect.unwrap(fn)       # a decorated function (@torch.compile): its own code; the decorator is in its source
    if fn.__closure__:
        raise SubmissionError(f"{fn.__name__} uses variables of an enclosing function "
                              f"({', '.join(fn.__code__.co_freevars)}): define it at the top level of a cell")
    imports: list[str] = []
    helpers: list[str] = []
    done: set[str] = set()

    def visit(f: types.FunctionType) -> None:
        for name in sorted(_names(f.__code__) | _decorator_names(f)):
            if name in done or name not in f.__globals__:
                continue
            done.add(name)
            value = f.__globals__[name]
            if isinstance(value, types.ModuleType):
                imports.append(f"import {value.__name__} as {name}" if value.__name__ != name
                               else f"import {name}")
            elif (inspect.isfunction(value) or inspect.isclass(value)) and value.__module__ == f.__module__:
                if inspect.isfunction(value):
                    value = inspect.unwrap(value)
                    visit(value)
                try:
                    helpers.append(textwrap.dedent(inspect.getsource(value)))
                except (OSError, TypeError):
                    raise SubmissionError(f"{fn.__name__} uses {name}, whose source cannot be read") from None
            elif (inspect.isfunction(value) or inspect.isclass(value) or callable(value)) and \
                    (hasattr(value, "__qualname__") or hasattr(value, "__name__")) and \
                    getattr(value, "__module__", None) and not value.__module__.startswith("__"):
                # a function or class of a module (not a callable object built in the notebook: a model)
                qual = getattr(value, "__qualname__", getattr(value, "__name__", name))
                if "." in qual or "<" in qual:
                    raise SubmissionError(f"{fn.__name__} uses {name}, which cannot be imported by name")
                imports.append(f"from {value.__module__} import {qual} as {name}" if qual != name
                               else f"from {value.__module__} import {name}")
            elif _plain(value):
                imports.append(f"{name} = {value!r}")
            elif hasattr(builtins, name):
                continue
            else:
                raise SubmissionError(
                    f"{fn.__name__} uses {name!r}, a {type(value).__name__} from the notebook. The grader runs your "
                    "function in a fresh process, where the notebook's objects do not exist (and must not: one could "
                    "hold a cached answer): build it inside the function, or pass it in as the signature allows.")
    visit(fn)
    try:
        own = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        raise SubmissionError(f"the source of {fn.__name__} cannot be read: pass it as a string") from None
    parts = ["# written by gpulab.exercises for the grader: your function and what it uses", *imports, "",
             *helpers, own, f"{ENTRY} = {fn.__name__}"]
    return "\n".join(parts) + "\n"


@dataclass
class Verdict:
    """What the grader said: `state` (passed, failed, suspicious, cannot run, error), `why` (lines), the ratio to
    the slow code and the target, and the rest of the grader's dict in `detail`."""

    task: str
    state: str
    why: list[str]
    ratio: float | None = None
    target: float | None = None
    reference_ratio: float | None = None
    speed_judged: bool = False
    grading_s: float | None = None
    detail: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict) -> "Verdict":
        return cls(task=d.get("task", "?"), state=d.get("state", "error"), why=list(d.get("why", [])),
                   ratio=d.get("ratio"), target=d.get("target"), reference_ratio=d.get("reference_ratio"),
                   speed_judged=bool(d.get("speed_judged")), grading_s=d.get("grading_s"), detail=d)

    @property
    def passed(self) -> bool:
        return self.state == "passed"

    def headline(self) -> str:
        if self.ratio is None:
            return f"{self.task}: {self.state.upper()}"
        if self.state == "passed" and not self.speed_judged:
            # correct, and no more: on the CPU, or where the lesson's own fix gains nothing measurable here, the
            # code as given passes too, and its ratio is noise (the lines below give it and why)
            return f"{self.task}: CORRECT (speed not judged here): it passed the check against the reference; see why below"
        if not self.speed_judged and not str(self.detail.get("device", "")).startswith("cuda"):
            return f"{self.task}: {self.state.upper()}"          # on the CPU a ratio says nothing (see why below)
        speed = (f"{self.ratio:.2f}x the slow code, target {self.target:.2f}x" if self.speed_judged and self.target
                 else f"{self.ratio:.2f}x the slow code (speed not judged here)")
        return f"{self.task}: {self.state.upper()}: {speed}"

    def text(self) -> str:
        d = self.detail
        lines = [self.headline(), *[f"  - {w}" for w in self.why]]
        if d.get("ms") and str(d.get("device", "")).startswith("cuda"):      # on the CPU: noise (see why)
            ms = d["ms"]
            lines.append(f"  - timed in turns: {d['rounds']} rounds of {d['calls']} call(s); per call slow "
                         f"{ms['slow']:.4g} ms, reference {ms['reference']:.4g} ms, yours {ms['submission']:.4g} ms "
                         f""
                         + (f"(host clock around a device synchronize, {d.get('device')})" if d.get("device", "").startswith("cuda")
                            else "(host clock, on the CPU)"))
        if d.get("physics"):
            lines.append(f"  - against the ceilings: {d['physics']}")
        if d.get("traceback"):
            lines.append("  - where it raised:\n" + textwrap.indent(d["traceback"].rstrip(), "      "))
        if self.grading_s is not None:
            lines.append(f"  - graded in {self.grading_s:.1f} s in a fresh process")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()


def record_verdict(v: Verdict, lesson: str, who: str) -> None:
    """Keep the verdict in the results store (the room's board reads it)."""
    from gpulab.core.results import results_store
    value = v.ratio if v.ratio is not None and math.isfinite(v.ratio) else 0.0
    results_store().record(lesson, f"exercise {v.task}", value, "x", state=v.state, who=who,
                           target=v.target, reference_ratio=v.reference_ratio, speed_judged=v.speed_judged,
                           why=v.why[-1] if v.why else "", grading_s=v.grading_s)


class Exercise:
    """A graded exercise of a lesson: `show()`, `check(fn)`, `hint(level)`, `solution()`, `state()`."""

    def __init__(self, task: Task):
        self.task = task

    def __repr__(self) -> str:
        return f"<exercise {self.task.name}: {self.task.title} ({self.state()})>"

    def show(self) -> None:
        t = self.task
        print(f"Exercise {t.name}: {t.title}\n")
        print(textwrap.fill(t.what, 100))
        print(f"\nGraded on this machine: correct first ({t.tier} tier), then timed in turns against the slow code "
              f"and the lesson's fix; pass at {t.share:.0%} of the fix's measured gain. The code as given:\n")
        _show_code(t.slow)

    def hint(self, level: int = 1) -> None:
        if level not in (1, 2):
            print("hint(1) or hint(2)")
            return
        print(f"Hint {level}: {self.task.hints[level - 1]}")

    def check(self, fn: Callable | str, *, scale: str | None = None, budget_s: float | None = None,
              timeout_s: float = 300.0, quiet: bool = False, who: str = "you") -> Verdict:
        """Grade `fn` in a fresh process; print and return the verdict. Never raises for the submission's faults."""
        from gpulab.core.device import resolve_scale
        from gpulab.exercises.grader import grade
        try:
            source = submission_source(fn)
        except SubmissionError as err:
            v = Verdict(self.task.name, "failed", [f"not graded: {err}"])
            if not quiet:
                print(v.text())
            return _strict(v)
        folder = Path(tempfile.mkdtemp(prefix=f"gpulab-{self.task.name}-"))
        path = folder / "submission.py"
        path.write_text(source)
        scale = resolve_scale(scale)
        budget = budget_s if budget_s is not None else (10.0 if scale == "full" else 0.5)
        try:
            v = Verdict.from_dict(grade(self.task.name, str(path), scale=scale, budget_s=budget, timeout_s=timeout_s))
        finally:
            shutil.rmtree(folder, ignore_errors=True)     # the verdict quotes the lines that matter
        record_verdict(v, self.task.lesson, who)
        if not quiet:
            print(v.text())
        return _strict(v)

    def solution(self, run: bool = True) -> Verdict | None:
        """Show the lesson's fix and (by default) grade it exactly as a submission is graded."""
        print(f"The lesson's fix for {self.task.name}:\n")
        _show_code(self.task.reference)
        return self.check(self.task.reference, who="reference") if run else None

    def state(self) -> str:
        from gpulab.core.results import results_store
        rec = results_store().latest(f"exercise {self.task.name}", lesson=self.task.lesson)
        return rec.extra.get("state", "not tried") if rec is not None else "not tried"


STRICT_ENV = "GPULAB_GRADING_STRICT"    # 1 (conftest.py, notebooks on the CPU): a check that did not grade raises


class NotGraded(RuntimeError):
    """Under GPULAB_GRADING_STRICT=1: a notebook's check did not grade its code (refused, crashed, or on the CPU,
    where only correctness is judged, not CORRECT). nbval then fails the cell: the code a notebook hands to
    `check` is the code as given or the lesson's fix, and both must be graded and train the same model."""


def _strict(v: Verdict) -> Verdict:
    if os.environ.get(STRICT_ENV) != "1":
        return v
    not_graded = v.state in ("cannot run", "error") or any(w.startswith("not graded") for w in v.why)
    if not_graded or (not v.speed_judged and v.state != "passed"):
        raise NotGraded(f"{v.task}: the notebook's own code was not graded CORRECT ({STRICT_ENV}=1): "
                        + " | ".join(v.why[:3]))
    return v


def _show_code(fn: Callable) -> None:
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        print(f"(the source of {fn.__name__} cannot be read)")
        return
    try:
        from IPython.display import Markdown, display
        display(Markdown(f"```python\n{source}```\n*`{fn.__module__}.{fn.__name__}`*"))
    except ImportError:
        print(source)


def exercise(name: str) -> Exercise:
    """The graded exercise called `name`, e.g. exercise("01.sync")."""
    return Exercise(find_task(name))


def exercises(lesson: str) -> list[Exercise]:
    return [Exercise(t) for t in for_lesson(lesson)]


# -- predictions -----------------------------------------------------------------------------------------------------
PREDICTION_BAND = 0.25      # within 25 % of the measurement, or its own spread times SPREAD_TIMES where that is wider
SPREAD_TIMES = 3.0


@dataclass
class Prediction:
    """Write a number before the run (`guess`), then `check(measured, spread)` after it. The band is
    +-PREDICTION_BAND of the measurement, widened to SPREAD_TIMES x its spread (IQR / median) where that is wider:
    a noisy measurement cannot grade a guess more sharply than it knows itself."""

    name: str
    lesson: str
    question: str
    unit: str = "x"
    guess: float | None = None

    def check(self, measured: float, spread: float = 0.0) -> str:
        from gpulab.core.results import results_store
        if self.guess is None or not isinstance(self.guess, (int, float)) or not math.isfinite(self.guess):
            state, text = "not tried", (f"{self.name}: write your prediction first ({self.name}.guess = a number in "
                                        f"{self.unit}), then run the measurement again")
        else:
            band = max(PREDICTION_BAND, SPREAD_TIMES * abs(spread))
            low, high = measured / (1 + band), measured * (1 + band)
            ok = low <= self.guess <= high
            state = "passed" if ok else "failed"
            text = (f"{self.name}: you predicted {self.guess:.3g} {self.unit}; measured {measured:.3g} {self.unit} "
                    f"(band {low:.3g} to {high:.3g}: +-{band:.0%}): {'PASSED' if ok else 'FAILED'}"
                    + ("" if ok else f" ({'too high' if self.guess > high else 'too low'}: what did you assume?)"))
            results_store().record(self.lesson, f"prediction {self.name}", float(self.guess), self.unit, state=state,
                                   measured=measured, band=band)
        print(text)
        return state

