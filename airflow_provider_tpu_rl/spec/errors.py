"""The one error type of the spec layer: it names the field and the rule it broke."""

from __future__ import annotations

from typing import Any


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters; a value whose repr cannot be made (an integer
    past Python's 4,300-digit conversion limit, a structure nested past the recursion limit) is
    named by its type."""
    try:
        text = repr(value)
    except (ValueError, RecursionError, MemoryError):
        return f"<a {type(value).__name__} too large or too deep to show>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def field_name(name: Any) -> str:
    """A field or key as a message names it: as is when it is one printable line, else quoted
    (``repr``: a newline, a tab or a line separator in a user's key shows as ``\\n``, ``\\t``,
    ``\\u2028``, so the message stays one line)."""
    text = str(name)
    return text if text.isprintable() else short_repr(text, 120)


class SpecError(ValueError):
    """A value broke a rule. ``str(err)`` is one line: ``field: rule (got 'value')``."""

    def __init__(self, field: str, rule: str, value: Any = None, *, show_value: bool = True) -> None:
        self.field = field
        self.rule = rule
        self.value = value
        got = f" (got {short_repr(value)})" if show_value else ""
        super().__init__(f"{field_name(field)}: {rule}{got}")
