"""The sandbox's background processes (the API server, the fakes' call server, the Airflow CLI
server): started in a session of their own with this package importable, their output appended
to a log in the sandbox folder; stopped with SIGTERM, then SIGKILL, and reaped."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import tpu_rl_sandbox
from tpu_rl_sandbox.apis.gcs_emulator import pid_alive

Ready = TypeVar("Ready")


def spawn_module(
    module: str, args: list[str], log_file: Path, environ: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``python -m MODULE ARGS`` in a new session with ``environ`` (this process's by default),
    stdout and stderr appended to ``log_file``."""
    package_parent = str(Path(tpu_rl_sandbox.__file__).resolve().parents[1])
    env = dict(os.environ if environ is None else environ)
    env["PYTHONPATH"] = package_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    with log_file.open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            start_new_session=True,
            close_fds=True,
        )


def start_module(
    module: str,
    args: list[str],
    log_file: Path,
    ready: Callable[[int], Ready | None],
    what: str,
    error: type[Exception],
    wait_seconds: float,
    environ: Mapping[str, str] | None = None,
) -> Ready:
    """:func:`spawn_module`, then wait until ``ready(pid)`` gives something (returned); ``error``
    ("<what> exited with N" or "did not answer within ...", naming the log) otherwise."""
    process = spawn_module(module, args, log_file, environ)
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise error(f"{what} exited with {process.returncode}; see {log_file}")
        found = ready(process.pid)
        if found is not None:
            return found
        time.sleep(0.02)
    process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)
    raise error(f"{what} did not answer within {wait_seconds}s; see {log_file}")


def stop_pid(pid: int, wait_seconds: float, group: bool = False) -> bool:
    """SIGTERM ``pid``, then SIGKILL (its whole process group with ``group``) after ``wait_seconds``;
    reaped when it is this process's child. True if it was running."""
    was_alive = pid_alive(pid)
    if was_alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline and pid_alive(pid):
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.02)
        if pid_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL) if group else os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, 0 if was_alive else os.WNOHANG)
    return was_alive
