"""Helpers for the notebook template: the opening line, showing lesson code,
self-checks against a stated band, and the closing "What you saw" table.
"""
from __future__ import annotations

import html
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Sequence
from IPython.display import HTML, Markdown, display
from gpulab.core.device import describe, pick_device


def start(lesson: str) -> None:
    """First output of every notebook: where it runs, at what size, and what the numbers mean."""
    display(Markdown(f"**Lesson {lesson}.** {describe()}"))


def show_source(fn: Callable) -> None:
    """Show the code of a gpulab function, so the lesson's code is read where it is used."""
    src = inspect.getsource(fn)
    display(Markdown(f"`{fn.__module__}.{fn.__qualname__}`:\n```python\n{src}```"))


@dataclass(frozen=True)
class Check:
    name: str
    measured: float | None
    low: float | None
    high: float | None
    status: str   # "pass", "FAIL", "skipped"
    why: str

    def __str__(self) -> str:
        band = f"[{self.low if self.low is not None else '-'}, {self.high if self.high is not None else '-'}]"
        value = "-" if self.measured is None else f"{self.measured:.3g}"
        return f"{self.status:>7}  {self.name}: {value} (expected {band}) {self.why}"


def expect(name: str, measured: float | None, low: float | None = None,
           high: float | None = None, applies: bool = True, why_not: str = "",
           why: str = "") -> Check:
    """Check a measured ratio against a band, or say why the check does not apply here.

    On the CPU (or a GPU that cannot show the effect) pass `applies=False` and a
    reason: the check is reported as skipped, never as passed.
    """
    if not applies or measured is None:
        check = Check(name, measured, low, high, "skipped", why_not or "not measurable here")
    else:
        ok = (low is None or measured >= low) and (high is None or measured <= high)
        check = Check(name, measured, low, high, "pass" if ok else "FAIL",
                      why if ok else (why_not or "this GPU does not show the expected effect"))
    print(check)
    return check


def show_table(rows: Sequence[Sequence[Any]], header: Sequence[str] | None = None) -> None:
    """Display rows as an HTML table (numbers to 4 significant figures)."""
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header) if header else ""
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in row) + "</tr>"
                   for row in rows)
    display(HTML(f"<table>{'<tr>' + head + '</tr>' if head else ''}{body}</table>"))


def what_you_saw(rows: Sequence[tuple[str, Any]], title: str = "What you saw") -> None:
    """The closing table of a notebook: this run's measured numbers, with the device."""
    from gpulab.core.device import device_facts, scale
    import torch

    facts = device_facts()
    body = "".join(f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(_fmt(v))}</td></tr>"
                   for k, v in rows)
    caption = (f"{facts.name}, torch {torch.__version__}, scale={scale()}"
               + ("" if pick_device().type == "cuda" else " — CPU: illustrative only"))
    display(HTML(f"<b>{html.escape(title)}</b> <i>({html.escape(caption)})</i>"
                 f"<table>{body}</table>"))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)
