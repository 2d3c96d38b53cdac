"""Parse ``gcluster job list`` / ``gcluster job logs`` output. Shared by the sync and async paths."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Sequence
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
# gcluster's own info lines: logging.Info prints "<RFC3339 UTC>: message" on stdout.
_GCLUSTER_INFO_RE = re.compile(rf"^{_TIME}: ")
_NO_LIVE_LOGS = "Job exists but has no live logs available"


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


def workload_log_lines(lines: Iterable[str]) -> list[str]:
    """The workload's own lines in ``gcluster job logs`` output, without gcluster's info lines."""
    out: list[str] = []
    for raw in lines:
        line = strip_ansi(raw).rstrip("\r\n")
        if _GCLUSTER_INFO_RE.match(line) or line.startswith(_NO_LIVE_LOGS):
            continue
        out.append(line)
    # cmd.Println(output) adds a newline after kubectl's own trailing newline.
    while out and not out[-1].strip():
        out.pop()
    return out


def new_log_lines(seen: Sequence[str], current: Sequence[str]) -> list[str]:
    """The lines of snapshot ``current`` that follow snapshot ``seen``.

    ``gcluster job logs`` returns either the whole log (which grows) or, with a label selector, only
    the last lines of each pod (a window that slides); both are handled: a prefix match first, then
    the longest tail of ``seen`` that is a head of ``current``. No overlap means a gap: all of
    ``current`` is new.
    """
    n = len(seen)
    if n == 0:
        return list(current)
    if len(current) >= n and list(current[:n]) == list(seen):
        return list(current[n:])
    for k in range(min(n, len(current)), 0, -1):
        if list(seen[n - k :]) == list(current[:k]):
            return list(current[k:])
    return list(current)
