"""The one error type of the spec layer: it names the field and the rule it broke."""

from __future__ import annotations

from typing import Any


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class SpecError(ValueError):
    """A value broke a rule. ``str(err)`` is one line: ``field: rule (got 'value')``."""

    def __init__(self, field: str, rule: str, value: Any = None, *, show_value: bool = True) -> None:
        self.field = field
        self.rule = rule
        self.value = value
        got = f" (got {_short(value)})" if show_value else ""
        super().__init__(f"{field}: {rule}{got}")
