"""The Airflow CLI server the end-to-end runs go through (``tpu_rl_sandbox.clis.airflow_server``):
a command it serves prints and exits as ``python -m airflow`` does, without importing Airflow again;
the provider's section is read when used, while a changed variable Airflow reads at import makes the
command a new interpreter; with no server the client runs ``python -m airflow`` itself; stopping it
leaves no process. (Each ``python -m airflow`` here costs seconds: the end-to-end runs, on both
Airflow lines, go through the server all the time; this module runs on Airflow 3.3.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.airflow_home import migrate_into
from tests.support.harness import FAST_SETTINGS
from tpu_rl_sandbox.clis import airflow_server
from tpu_rl_sandbox.clis.airflow_server import (
    INFO_FILE,
    airflow_command,
    start_airflow_server,
    stop_airflow_server,
)

# Bounds against a hang: each command takes seconds on a quiet machine (a new interpreter's took over
# 120 s with a second `make test` beside the suite).
COMMAND_TIMEOUT = 600.0
# Log lines' timestamps and the times they log (`dags test` logs each DAG's next run, as text and as
# a DateTime repr: the janitor's moves at each :00 and :30, so two runs either side of one differ),
# and the warnings Airflow prints while it is imported (a served command's
# Airflow was imported by the server, which logged them once): its CLI's graphviz warning (3.3), and
# on 2.11 each warning Python prints as "FILE.py:LINE CATEGORY: MESSAGE".
_STAMP = re.compile(
    r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
    r"|DateTime\(\d+(?:, \d+)*, tzinfo=Timezone\('[^']*'\)\)"
)
_IMPORT_WARNING = re.compile(
    r"^(?:.*Could not import graphviz.*\n(?:(?:You might|Run `pip).*\n)*|\S+\.py:\d+ \w*Warning: .*\n)",
    re.MULTILINE,
)
# A traceback's frames: a served command's start in the server's modules, a new interpreter's in runpy.
_FRAME = re.compile(r"^  File .*\n(?:    .*\n)*", re.MULTILINE)
# A command that prints, and one that fails in Airflow's own code (its database read, a SystemExit).
COMMANDS = (("version",), ("dags", "test", "no_such_dag"))


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """A migrated AIRFLOW_HOME with its server running: the home and its environment."""
    root = tmp_path_factory.mktemp("airflow-server")
    airflow_home = root / "airflow"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update(FAST_SETTINGS)
    env.update({"AIRFLOW_HOME": str(airflow_home), "AIRFLOW__TPU_RL__POLL_INTERVAL": "0.5"})
    migrate_into(airflow_home, env)
    start_airflow_server(airflow_home, env)
    try:
        yield airflow_home, env
    finally:
        stop_airflow_server(airflow_home)


def _through_server(home: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        airflow_command(home, list(args)), env=env, capture_output=True, text=True, timeout=COMMAND_TIMEOUT
    )


def _alone(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "airflow", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
    )


def _printed(done: subprocess.CompletedProcess[str]) -> tuple[int, str, str]:
    return (
        done.returncode,
        _IMPORT_WARNING.sub("", _STAMP.sub("<stamp>", done.stdout)),
        _FRAME.sub("", _IMPORT_WARNING.sub("", _STAMP.sub("<stamp>", done.stderr))),
    )


def _imported_airflow(home: Path, env: dict[str, str], *args: str) -> bool:
    """Whether the command's own processes imported Airflow (a served one's fork has it already)."""
    traced = _through_server(home, {**env, "PYTHONPROFILEIMPORTTIME": "1"}, *args)
    assert traced.returncode in (0, 1), traced.stderr[-2000:]
    return re.search(r"^import time:.*\| airflow$", traced.stderr, re.MULTILINE) is not None


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_a_served_command_prints_and_exits_as_python_m_airflow(
    home: tuple[Path, dict[str, str]], args: tuple[str, ...]
) -> None:
    airflow_home, env = home
    # first: a command's first run in a home may write to its database (a DAG bundle's row)
    assert not _imported_airflow(airflow_home, env, *args)
    alone = _alone(env, *args)
    served = _through_server(airflow_home, env, *args)
    assert _printed(served) == _printed(alone)


def test_the_provider_s_own_section_is_read_when_used(home: tuple[Path, dict[str, str]]) -> None:
    airflow_home, env = home
    changed = {**env, "AIRFLOW__TPU_RL__POLL_INTERVAL": "7"}
    served = _through_server(airflow_home, changed, "config", "get-value", "tpu_rl", "poll_interval")
    assert (served.returncode, served.stdout.strip()) == (0, "7")
    assert not _imported_airflow(airflow_home, changed, "version")


def test_a_variable_airflow_reads_at_import_makes_a_new_interpreter(
    home: tuple[Path, dict[str, str]],
) -> None:
    airflow_home, env = home
    assert _imported_airflow(
        airflow_home, {**env, "AIRFLOW__CORE__DEFAULT_TIMEZONE": "Europe/Paris"}, "version"
    )


def test_once_stopped_it_leaves_no_process_and_the_client_runs_airflow_itself(
    home: tuple[Path, dict[str, str]],
) -> None:
    """(This module's last test: it stops the module's server.)"""
    airflow_home, env = home
    server = json.loads((airflow_home / INFO_FILE).read_text())["pid"]
    assert stop_airflow_server(airflow_home)
    assert not Path(f"/proc/{server}").exists()
    assert not (airflow_home / INFO_FILE).exists()
    assert _imported_airflow(airflow_home, env, "version")


def test_a_preloaded_service_freezes_its_imports_before_airflow_forks_its_tasks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--run``: the task libraries imported, then frozen (``gc.freeze``: the collections of the task
    processes its LocalExecutor forks never walk them), then Airflow's ``main``."""
    events: list[str] = []
    monkeypatch.setattr(
        airflow_server, "_import_each", lambda modules: events.append(f"import {len(modules)}")
    )
    monkeypatch.setattr(airflow_server.gc, "freeze", lambda: events.append("freeze"))
    monkeypatch.setattr(
        airflow_server, "_airflow_main", lambda args: events.append(f"airflow {' '.join(args)}")
    )
    airflow_server.run_preloaded(["scheduler"])
    assert events == [f"import {len(airflow_server.TASK_PRELOADS)}", "freeze", "airflow scheduler"]
