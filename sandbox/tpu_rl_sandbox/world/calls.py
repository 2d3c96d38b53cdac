"""The call log: every fake ``gcloud``/``gcluster`` call appended to ``<root>/calls.jsonl``."""

from __future__ import annotations

import fcntl
import json
from collections.abc import Mapping, Sequence
from typing import Any

from tpu_rl_sandbox.world.layout import SandboxLayout

CALL_START_ENV = "TPU_RL_SANDBOX_CALL_START"
_CALL_START_SLACK = 60.0


def call_start(env: Mapping[str, str], now: float) -> float:
    """When the shim started this call (``$TPU_RL_SANDBOX_CALL_START``), else ``now``.

    A value inherited from an older call (a fake run by a fake) is not this call's: only a stamp
    from the last minute, not in the future, counts.
    """
    try:
        stamp = float(env.get(CALL_START_ENV, ""))
    except ValueError:
        return now
    return stamp if now - _CALL_START_SLACK <= stamp <= now else now


def record_call(
    layout: SandboxLayout,
    tool: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    exit_code: int,
    start: float,
    end: float,
) -> None:
    """Append one line to ``<root>/calls.jsonl`` (environment NAMES only, never values)."""
    entry = {
        "tool": tool,
        "argv": list(argv),
        "env_names": sorted(env),
        "cwd": cwd,
        "exit_code": exit_code,
        "start": start,
        "end": end,
    }
    layout.root.mkdir(parents=True, exist_ok=True)
    line = json.dumps(entry, sort_keys=True) + "\n"
    with layout.calls_file.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            handle.write(line)
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def read_calls(layout: SandboxLayout) -> list[dict[str, Any]]:
    """All recorded calls, oldest first."""
    try:
        text = layout.calls_file.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]
