"""Timestamps as the fakes write them: RFC 3339, UTC, second precision."""

from __future__ import annotations

import datetime as dt


def utc_now() -> dt.datetime:
    """Current time, UTC, second precision is applied by the formatters."""
    return dt.datetime.now(dt.UTC)


def rfc3339(moment: dt.datetime | None = None) -> str:
    """``2026-01-02T03:04:05Z`` like Go's ``time.RFC3339`` for a UTC time."""
    moment = moment or utc_now()
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> dt.datetime:
    """Inverse of :func:`rfc3339` (also accepts fractional seconds)."""
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
