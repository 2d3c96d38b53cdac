"""The suite's one way to wait: a bound against a hang, never a timing assertion.

Every wait polls its predicate with a growing pause (from 20 ms to half a second: a quick
condition is seen at once, a slow one costs little CPU while it is awaited, so a loaded machine
is not loaded further), and fails after its bound with one line naming what it waited for. The
bounds are at least five times what the wait takes on a quiet machine: :data:`HANG_BOUND`
unless a caller names a longer one.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

# Five times and more what any of the suite's waits on a sandbox condition takes on a quiet
# two-core machine (the longest, a takeover of a held job, about 40 s).
HANG_BOUND = 300.0
FIRST_PAUSE = 0.02
LONGEST_PAUSE = 0.5


class WaitTimedOut(AssertionError):
    """A wait ran past its bound (its message names what was awaited)."""


def wait_until(
    predicate: Callable[[], T | None],
    what: str,
    timeout: float = HANG_BOUND,
    longest_pause: float = LONGEST_PAUSE,
    on_timeout: Callable[[], str] | str = "",
) -> T:
    """Call ``predicate`` until it returns something truthy, and return that; :class:`WaitTimedOut`
    after ``timeout`` seconds, whose first line is ``timed out after N s waiting for <what>``."""
    deadline = time.monotonic() + timeout
    pause = FIRST_PAUSE
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = on_timeout() if callable(on_timeout) else on_timeout
            raise WaitTimedOut(f"timed out after {timeout:.0f} s waiting for {what}\n{detail}".rstrip())
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(pause * 2, longest_pause)


def joined(thread: threading.Thread, what: str, timeout: float = HANG_BOUND) -> None:
    """Wait for ``thread`` to end; :class:`WaitTimedOut`, naming ``what``, if it runs past ``timeout``."""
    thread.join(timeout)
    if thread.is_alive():
        raise WaitTimedOut(f"timed out after {timeout:.0f} s waiting for {what}")


def run_bounded(
    argv: Sequence[str],
    what: str,
    timeout: float,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` to its end (its output captured as text); :class:`WaitTimedOut` naming ``what``,
    with the end of what it printed, if it runs past ``timeout`` seconds (it is killed)."""
    try:
        return subprocess.run(
            list(argv), env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as expired:
        printed = "".join(_text(part) for part in (expired.stdout, expired.stderr))
        raise WaitTimedOut(
            f"timed out after {timeout:.0f} s waiting for {what}\n... its output's end:\n{printed[-4000:]}"
        ) from None


def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""
