"""Parse ``gcluster job list`` / ``gcluster job logs`` output. Shared by the sync and async paths."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime


class JobState(enum.Enum):
    """A JobSet status as ``gcluster job list`` prints it (cmd/job/list.go, parseJobStatus)."""

    PENDING = "Pending"
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"

    @classmethod
    def from_text(cls, text: str) -> JobState:
        """The state for a STATUS cell; anything unfamiliar is ``UNKNOWN``."""
        for state in cls:
            if state.value.lower() == text.strip().lower():
                return state
        return cls.UNKNOWN

    @property
    def finished(self) -> bool:
        return self in (JobState.SUCCEEDED, JobState.FAILED)


@dataclass(frozen=True)
class GclusterJob:
    """One row of ``gcluster job list``."""

    name: str
    state: JobState
    creation_time: str
    completion_time: str | None = None

    @property
    def created_at(self) -> datetime | None:
        return _parse_time(self.creation_time)

    @property
    def completed_at(self) -> datetime | None:
        return _parse_time(self.completion_time)


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


_ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_HEADER_RE = re.compile(r"^NAME\s+STATUS\s+CREATION_TIME\s+COMPLETION_TIME\s*$")
_TIME = r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})"
# list.go writes "%s\t%s\t%s\t%s\n" through text/tabwriter (padding 3, spaces): cells never contain
# blanks, the last cell (COMPLETION_TIME) is empty for a job that has not finished.
_ROW_RE = re.compile(
    rf"^(?P<name>[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?)\s+(?P<status>[A-Z][A-Za-z]*)\s+"
    rf"(?P<created>{_TIME})(?:\s+(?P<completed>{_TIME}))?\s*$"
)


def strip_ansi(line: str) -> str:
    """``line`` without terminal colour codes (gcluster colours its timestamps on a TTY)."""
    return _ANSI_RE.sub("", line)


def parse_job_list(lines: Iterable[str]) -> list[GclusterJob]:
    """The jobs in ``gcluster job list`` output.

    Log lines (gcluster's timestamped info lines, klog ``I1130 …`` lines, ``[INFO]`` …) may come
    before, after or between the rows: only rows after the header that look like a row are taken.
    Raises ``ValueError`` when the header never appears (the output is not a job list).
    """
    jobs: list[GclusterJob] = []
    header_seen = False
    for raw in lines:
        line = strip_ansi(raw).rstrip("\r\n")
        if not header_seen:
            header_seen = bool(_HEADER_RE.match(line.strip()))
            continue
        match = _ROW_RE.match(line.strip())
        if match is None:
            continue
        jobs.append(
            GclusterJob(
                name=match["name"],
                state=JobState.from_text(match["status"]),
                creation_time=match["created"],
                completion_time=match["completed"] or None,
            )
        )
    if not header_seen:
        raise ValueError("no 'NAME STATUS CREATION_TIME COMPLETION_TIME' header in gcluster job list output")
    return jobs
