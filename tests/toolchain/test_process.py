"""run_sync's timeout stops the whole process tree: SIGTERM, then SIGKILL after the grace.

Real processes: a Python "tool" that starts children the way gcluster starts Terraform
(terraform-exec runs it in a process group of its own), or leaves a child holding its output.

The stop under test is the one run_sync's timer makes (``SyncProcess.stop(timed_out=True)``), fired
once the child says it is ready, so a loaded machine that starts the interpreters slowly cannot
stop the tree before it exists; ``test_the_timeout_stops_a_hung_command`` covers the timer itself.
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from airflow_provider_tpu_rl.toolchain.process import SyncProcess, descendants, prepare_process, run_sync

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc (Linux)")

# A child that ignores SIGTERM (or notes it and exits), writes its pid, then "child ready", and
# sleeps. Its process group is chosen by the tool that starts it.
CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path
    folder = Path(sys.argv[1])
    if sys.argv[3] == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        def note(signum, frame):
            (folder / "child-got-term").write_text("released the lock")
            sys.exit(1)
        signal.signal(signal.SIGTERM, note)
    (folder / "child.pid").write_text(str(os.getpid()))
    print("child ready", flush=True)
    for _ in range(int(sys.argv[4])):
        time.sleep(0.1)
    """
)
# The tool: starts CHILD, in a process group of its own for "own-group" (set between fork and exec,
# as terraform-exec's ``Setpgid: true`` does), then hangs (or exits at once with "exit").
TOOL = textwrap.dedent(
    """
    import signal, subprocess, sys
    child = sys.argv[1:]
    mode = child.pop()
    if mode == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    group = 0 if child[2] == "own-group" else None
    proc = subprocess.Popen([sys.executable, *child], stdout=sys.stdout, process_group=group)
    print("tool started", flush=True)
    if mode == "exit":
        sys.exit(0)
    proc.wait()
    """
)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    (tmp_path / "child.py").write_text(CHILD)
    (tmp_path / "tool.py").write_text(TOOL)
    return tmp_path


def _run(folder: Path, *, group: str, child_term: str, tool_mode: str, ticks: int = 600, grace: float = 0.5):
    """Run the tool under run_sync; time it out 0.2 s after its child is ready (a finished tool
    whose child exits on its own never times out)."""
    argv = [
        sys.executable,
        str(folder / "tool.py"),
        str(folder / "child.py"),
        str(folder),
        group,
        child_term,
        str(ticks),
        tool_mode,
    ]
    prepared = prepare_process(argv, command_env={}, stdin_payload=None, secrets=(), job_home=None, cwd=None)
    running: list[SyncProcess] = []

    def on_line(line: str) -> None:
        if line == "child ready" and ticks > 10:
            timer = threading.Timer(0.2, running[0].stop, kwargs={"timed_out": True})
            timer.daemon = True
            timer.start()

    def register(process: SyncProcess | None) -> None:
        if process is not None:
            running.append(process)

    result = run_sync(prepared, on_line=on_line, timeout=120.0, register=register, grace=grace)
    return result, int((folder / "child.pid").read_text())


def test_a_child_that_ignores_sigterm_gets_sigkill(scripts):
    result, child = _run(scripts, group="same-group", child_term="ignore", tool_mode="ignore-term")
    assert result.timed_out
    assert not _alive(child)


def test_a_child_in_its_own_process_group_is_stopped_too(scripts):
    """Terraform under gcluster: terraform-exec starts it with Setpgid, out of gcluster's group."""
    result, child = _run(scripts, group="own-group", child_term="ignore", tool_mode="hang")
    assert result.timed_out
    assert not _alive(child)


def test_the_child_in_its_own_group_gets_sigterm_before_its_parent(scripts):
    """Terraform is interrupted while gcluster still runs, so it can write state and unlock."""
    result, child = _run(scripts, group="own-group", child_term="note", tool_mode="hang", grace=5.0)
    assert result.timed_out
    assert (scripts / "child-got-term").read_text() == "released the lock"
    assert not _alive(child)


def test_a_child_left_holding_the_output_is_stopped_at_the_timeout(scripts):
    """The tool exits but its child keeps the pipe open: the timeout still ends the call.

    The child would run for 60 s: a run that returns without ``timed_out`` waited for it.
    """
    result, child = _run(scripts, group="same-group", child_term="ignore", tool_mode="exit")
    assert result.timed_out
    assert not _alive(child)


def test_a_finished_command_leaves_no_child_behind(scripts):
    result, child = _run(scripts, group="same-group", child_term="note", tool_mode="exit", ticks=5, grace=5.0)
    assert not result.timed_out
    assert result.exit_code == 0
    assert not _alive(child)


def test_the_timeout_stops_a_hung_command(tmp_path):
    """run_sync's own timer: a command that never ends is stopped and reported ``timed_out``."""
    prepared = prepare_process(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"],
        command_env={},
        stdin_payload=None,
        secrets=(),
        job_home=None,
        cwd=None,
    )
    lines: list[str] = []
    result = run_sync(prepared, on_line=lines.append, timeout=1.0, grace=0.5)
    assert result.timed_out
    assert result.exit_code != 0


def test_descendants_lists_grandchildren_deepest_first(scripts):
    import subprocess

    tool = subprocess.Popen(
        [
            sys.executable,
            str(scripts / "tool.py"),
            str(scripts / "child.py"),
            str(scripts),
            "own-group",
            "ignore",
            "600",
            "hang",
        ],
        stdout=subprocess.PIPE,
        start_new_session=True,
        text=True,
    )
    try:
        assert tool.stdout is not None
        assert tool.stdout.readline().strip() in {"tool started", "child ready"}
        tool.stdout.readline()
        child = int((scripts / "child.pid").read_text())
        assert descendants(tool.pid) == [child]
        mine = descendants(os.getpid())
        assert mine.index(child) < mine.index(tool.pid)  # a grandchild comes before its parent
    finally:
        os.killpg(tool.pid, signal.SIGKILL)
        os.kill(int((scripts / "child.pid").read_text()), signal.SIGKILL)
        tool.wait(timeout=30)
