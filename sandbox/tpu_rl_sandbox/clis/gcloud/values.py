"""gcloud's argument value types (googlecloudsdk/calliope/arg_parsers): labels, ``KEY=VALUE``
dicts, durations."""

from __future__ import annotations

import re

from tpu_rl_sandbox.clis.gcloud.output import GcloudError
from tpu_rl_sandbox.clis.gcloud.parser import GcloudUsageError

# gcloud topic datetimes: a duration is ISO 8601 (P1D, PT2H) or digits with s/m/h/d units (1h30m)
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> int:
    """Seconds in a gcloud duration (``1d``, ``2h30m``, ``PT1H``, ``90`` = seconds)."""
    raw = text.strip()
    if re.fullmatch(r"\d+", raw):
        return int(raw)
    iso = re.fullmatch(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)S)?)?", raw.upper())
    if iso and any(iso.groups()):
        days, hours, minutes, seconds = (int(g or 0) for g in iso.groups())
        return days * 86400 + hours * 3600 + minutes * 60 + seconds
    pieces = re.findall(r"(\d*)([A-Za-z]+)", raw)
    if not pieces or "".join(n + u for n, u in pieces) != raw:
        raise ValueError(f"Duration unit '{raw}' must be preceded by a number")
    total = 0
    for number, unit in pieces:
        if not number:
            raise ValueError(f"Duration unit '{unit}' must be preceded by a number")
        if unit.lower() not in _DURATION_UNITS:
            raise ValueError(f"Unknown character '{unit[0]}' in duration")
        total += int(number) * _DURATION_UNITS[unit.lower()]
    return total


def parse_labels(raw: str | None) -> dict[str, str]:
    """``--labels KEY=VALUE,...``: lowercase letters, digits, ``_`` and ``-``."""
    labels: dict[str, str] = {}
    for item in (raw or "").split(","):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if (
            not sep
            or not re.fullmatch(r"[a-z][a-z0-9_-]{0,62}", key)
            or not re.fullmatch(r"[a-z0-9_-]{0,63}", value)
        ):
            raise GcloudError(
                f"Invalid value for [--labels]: [{item}] -- keys and values must be lowercase letters, digits, '_' or '-'.",
                code=2,
            )
        labels[key] = value
    return labels


def parse_map(command: str, flag: str, raw: str | None) -> dict[str, str]:
    """map_util's ``KEY=VALUE[,...]`` (arg_parsers.ArgDict): every item needs ``=``."""
    pairs: dict[str, str] = {}
    for item in (raw or "").split(","):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep:
            raise GcloudUsageError(command, f"argument --{flag}: Bad syntax for dict arg: [{item}].")
        pairs[key] = value
    return pairs
