"""The controls of a panel, and the one vocabulary lessons validate their settings with.

`Choice(options)`, `Toggle()` and `IntRange(min, max, step)` each `validate(name, value)`: the value
back (a whole-number string or float is turned into an int), or ValueError saying what is allowed.
The widget panel (`notebook.widgets.Panel`) refuses bad input with that message, and a lesson's
options (the capstone's `Options`) check their fields with the same controls, so a toggle means the
same thing in a panel and in code. `widget(name, value)` builds the ipywidget (imported only then).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Choice:
    """One of a fixed set of values (shown as toggle buttons)."""

    options: tuple
    label: str = ""

    def validate(self, name: str, value: Any) -> Any:
        if value not in self.options:
            raise ValueError(f"{name} must be one of {', '.join(map(repr, self.options))} "
                             f"(got {value!r}).")
        return value

    def widget(self, name: str, value: Any) -> Any:
        import ipywidgets as W

        return W.ToggleButtons(options=list(self.options), value=value,
                               description=self.label or name, style={"button_width": "auto"})


@dataclass(frozen=True)
class Toggle:
    """On or off."""

    label: str = ""

    def validate(self, name: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False (got {value!r}).")
        return value

    def widget(self, name: str, value: Any) -> Any:
        import ipywidgets as W

        return W.Checkbox(value=bool(value), description=self.label or name, indent=False)


@dataclass(frozen=True)
class IntRange:
    """An integer between min and max (inclusive); typed into a box, so it can be wrong."""

    min: int
    max: int
    step: int = 1
    label: str = ""

    def __post_init__(self) -> None:
        for what, v in (("min", self.min), ("max", self.max), ("step", self.step)):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"IntRange {what} must be a whole number (got {v!r}).")
        if self.step < 1:
            raise ValueError(f"IntRange step must be 1 or more (got {self.step}).")
        if self.min > self.max:
            raise ValueError(f"IntRange min {self.min} is above max {self.max}.")

    def validate(self, name: str, value: Any) -> int:
        if isinstance(value, bool):
            raise ValueError(f"{name} must be a whole number (got {value!r}).")
        if not isinstance(value, int):
            try:
                as_float = float(value)
            except (TypeError, ValueError):
                raise ValueError(f"{name} must be a whole number (got {value!r}).") from None
            if not as_float.is_integer():
                raise ValueError(f"{name} must be a whole number (got {value!r}).")
            value = int(as_float)
        if not self.min <= value <= self.max:
            raise ValueError(f"{name} must be between {self.min} and {self.max} (got {value}).")
        if (value - self.min) % self.step:
            raise ValueError(f"{name} must be {self.min} plus a multiple of {self.step} "
                             f"(got {value}).")
        return value

    def widget(self, name: str, value: Any) -> Any:
        import ipywidgets as W

        # A free text box, not a slider: the learner can type any size, and a
        # wrong one gets a message instead of being silently clamped.
        return W.IntText(value=value, description=self.label or name, step=self.step)
