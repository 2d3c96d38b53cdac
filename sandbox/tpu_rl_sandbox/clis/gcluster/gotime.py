"""Go's ``time.ParseDuration`` and friends, for flags that the real tools parse with Go."""

from __future__ import annotations

import re

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PIECE = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)?")


class GoDurationError(ValueError):
    """Text of Go's error, e.g. ``time: missing unit in duration "3600"``."""


def parse_duration(text: str) -> float:
    """Seconds for a Go duration string (``1h30m``, ``-1s``, ``0``)."""
    original = text
    quoted = '"' + original.replace("\\", "\\\\").replace('"', '\\"') + '"'
    sign = 1.0
    if text[:1] in "+-" and text:
        sign = -1.0 if text[0] == "-" else 1.0
        text = text[1:]
    if text == "0":
        return 0.0
    if not text:
        raise GoDurationError(f"time: invalid duration {quoted}")
    total = 0.0
    position = 0
    while position < len(text):
        match = _PIECE.match(text, position)
        if not match:
            raise GoDurationError(f"time: invalid duration {quoted}")
        number, unit = match.group(1), match.group(2)
        if unit is None:
            raise GoDurationError(f"time: missing unit in duration {quoted}")
        total += float(number) * _UNITS[unit]
        position = match.end()
    return sign * total


def duration_to_seconds_or_int(text: str, flag_name: str) -> int:
    """gcluster's ``parseDurationToSeconds``: a Go duration, else a leading integer (seconds)."""
    try:
        return int(parse_duration(text))
    except GoDurationError:
        pass
    match = re.match(r"\s*([+-]?\d+)", text)
    if match:
        return int(match.group(1))
    raise ValueError(f"invalid duration format for {flag_name}: {text}. Expected formats: 1h, 30m, 3600")


def format_duration(seconds: float) -> str:
    """Go's ``Duration.String()`` rounded to seconds (``1m2s``, ``3h0m0s``)."""
    whole = round(seconds)
    if whole == 0:
        return "0s"
    hours, rest = divmod(abs(whole), 3600)
    minutes, secs = divmod(rest, 60)
    sign = "-" if whole < 0 else ""
    if hours:
        return f"{sign}{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{sign}{minutes}m{secs}s"
    return f"{sign}{secs}s"


def go_quote(text: str) -> str:
    """Go's ``%q`` for plain strings."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
