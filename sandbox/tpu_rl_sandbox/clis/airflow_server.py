"""The Airflow CLI server: Airflow and the libraries the pipelines use imported once, a fork per
``airflow`` command.

An ``airflow dags test`` run of a pipeline spends about half its CPU before its first task: importing
Airflow, its CLI and the libraries the provider imports, and (Airflow 3) building the in-process
execution API its tasks report to (the versioned routes alone take seconds). A test module runs
several in one AIRFLOW_HOME, so :func:`start_airflow_server` starts this server with that home's
environment; it imports all of that once, and :func:`airflow_command` is the argv of one command
through it: the call server's client (:mod:`tpu_rl_sandbox.clis.call_client`), whose fork runs
Airflow's own ``main`` with the command's arguments, environment, folder and stdio, as
``python -m airflow`` would. With no server the client runs ``python -m airflow`` itself.

What is never imported ahead: this project's provider and the DAG files (each run imports and parses
them itself, so an import-time fault shows as it would), and Airflow's plugins (loaded by the run,
with its environment: the OpenLineage listener reads its configuration then). A command whose
environment differs from the server's in a variable Airflow reads at import (``AIRFLOW_HOME``,
``AIRFLOW__CORE__...``: every ``AIRFLOW*`` variable but the sections read when used,
:data:`READ_WHEN_USED`) runs as a new ``python -m airflow`` interpreter instead.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from tpu_rl_sandbox.apis.daemons import start_module, stop_pid
from tpu_rl_sandbox.clis import call_server

INFO_FILE = "airflow_server.json"
LOG_FILE = "airflow_server.log"
COMMAND = "airflow"
# Configuration a run reads when it uses it (``conf.get`` looks at the environment on each call):
# the provider's own section, and OpenLineage's (its plugin loads in the run). Any other AIRFLOW*
# variable that differs from the server's makes the command a new interpreter.
READ_WHEN_USED = ("AIRFLOW__TPU_RL__", "AIRFLOW__OPENLINEAGE__")
# Airflow, its CLI and task runner (Airflow 3: the task SDK and the execution API; Airflow 2: the
# models its ``dags test`` runs tasks with), and the libraries the provider and the google and
# Kubernetes providers import. A module a line of Airflow lacks is skipped.
PRELOADS = (
    "airflow",
    "airflow.__main__",
    "airflow.cli.cli_parser",
    "airflow.cli.commands.dag_command",
    "airflow.models.dag",
    "airflow.models.dagrun",
    "airflow.models.taskinstance",
    "airflow.serialization.serialized_objects",
    "airflow.sdk.execution_time.supervisor",
    "airflow.sdk.execution_time.task_runner",
    "airflow.api_fastapi.execution_api.app",
    "google.cloud.storage",
    "google.auth.transport.requests",
    "google.api_core.exceptions",
    "kubernetes.client",
    "kubernetes_asyncio.client",
    "aiohttp",
    "numpy",
    "PIL.Image",
    "libcst",
    # what the provider's hooks and record_run import from other distributions (py-spy of a GKE
    # run through this server: ~1.4 CPU-s of these imports a run): the google provider's GCS, GKE
    # and Secret Manager hooks, the clients under them, the SQLite hook, matplotlib's Agg figures
    "airflow.providers.google.cloud.hooks.gcs",
    "airflow.providers.google.cloud.hooks.kubernetes_engine",
    "airflow.providers.google.cloud.hooks.secret_manager",
    "google.cloud.container_v1",
    "google.cloud.resourcemanager_v3",
    "airflow.providers.sqlite.hooks.sqlite",
    "matplotlib.figure",
    "matplotlib.backends.backend_agg",
)
# What a task's own processes import (its runner, the libraries its hooks use): the part of
# PRELOADS a long-lived service that forks the task processes (a LocalExecutor's scheduler) imports
# first, with :func:`run_preloaded`.
TASK_PRELOADS = tuple(
    module
    for module in PRELOADS
    if module not in {"airflow.cli.commands.dag_command", "airflow.api_fastapi.execution_api.app"}
)
_started_with: dict[str, str] = {}


def socket_name(home: Path) -> str:
    """The abstract socket's name for the AIRFLOW_HOME ``home``."""
    return call_server.folder_socket_name("airflow", home.resolve())


def read_at_import(name: str) -> bool:
    """Whether Airflow reads the environment variable ``name`` when it is imported."""
    return name.startswith("AIRFLOW") and not name.startswith(READ_WHEN_USED)


def preload(command: str = COMMAND) -> None:
    """Import :data:`PRELOADS` (once) and, on Airflow 3, build the in-process execution API app."""
    if _started_with:
        return
    _started_with.update(os.environ)
    _import_each(PRELOADS)
    supervisor = sys.modules.get("airflow.sdk.execution_time.supervisor")
    server = getattr(supervisor, "in_process_api_server", None)
    if server is not None:
        app = server().app  # no thread and no connection: the run's own transport starts those
        initialize = getattr(app, "_cadwyn_initialize", None)
        if initialize is not None and not getattr(app, "_cadwyn_initialized", True):
            initialize()
    from airflow import settings

    if settings.engine is not None:
        settings.engine.dispose()  # no connection crosses a fork
    freeze_for_forks()


def freeze_for_forks() -> None:
    """Move every object alive now out of the garbage collector's reach (``gc.freeze``), so the
    collections of each child forked from here never walk them: without it, a collection in a child
    visits (and writes, copying the page) every object the imports made."""
    gc.freeze()


def main(args: list[str]) -> int:
    """In the forked child: ``airflow ARGS`` (a new interpreter when the environment differs from the
    server's in a variable Airflow read at import)."""
    changed = sorted(
        name
        for name in set(os.environ) | set(_started_with)
        if read_at_import(name) and os.environ.get(name) != _started_with.get(name)
    )
    if changed or not _started_with:
        os.execv(sys.executable, [sys.executable, "-m", "airflow", *args])  # noqa: S606  (an argv, no shell)
    _airflow_main(args)
    return 0


def _import_each(modules: tuple[str, ...]) -> None:
    for module in modules:
        try:
            __import__(module)
        except ImportError:  # a module a line of Airflow lacks
            continue


def _airflow_main(args: list[str]) -> None:
    """Airflow's own ``main`` in this process, with ``airflow ARGS`` as its argv."""
    sys.argv = [str(Path(sys.executable).with_name("airflow")), *args]
    from airflow.__main__ import main as airflow_main

    airflow_main()


def run_preloaded(args: list[str]) -> None:
    """``airflow ARGS`` in this process once :data:`TASK_PRELOADS` are imported: a scheduler whose
    LocalExecutor forks every task's processes from it then imports them once, not once a task.
    (Never the provider nor the DAG files: each task imports and parses them itself.)"""
    _import_each(TASK_PRELOADS)
    freeze_for_forks()
    _airflow_main(args)


def preloaded_command(args: list[str]) -> list[str]:
    """The argv of ``airflow ARGS`` run by :func:`run_preloaded` (a service's own process)."""
    return [sys.executable, "-m", "tpu_rl_sandbox.clis.airflow_server", "--run", *args]


def airflow_command(home: Path, args: list[str]) -> list[str]:
    """The argv that runs ``airflow ARGS`` through the server of ``home`` (or alone, with none)."""
    return [
        sys.executable,
        "-S",
        str(call_server.CLIENT),
        socket_name(home),
        COMMAND,
        "airflow",
        *args,
    ]


def start_airflow_server(home: Path, environ: Mapping[str, str], wait_seconds: float = 300.0) -> int:
    """Start the server for the AIRFLOW_HOME ``home`` with ``environ``; its pid once it listens
    (it imports Airflow first: 7 CPU-s, under a minute on two loaded cores; ``wait_seconds`` is a
    bound against a hang). RuntimeError when it exits or does not listen in time."""
    info_file = home / INFO_FILE
    info_file.unlink(missing_ok=True)

    def listening(pid: int) -> int | None:
        try:
            return pid if json.loads(info_file.read_text()).get("pid") == pid else None
        except (OSError, ValueError):
            return None

    return start_module(
        "tpu_rl_sandbox.clis.airflow_server",
        ["--home", str(home)],
        home / LOG_FILE,
        listening,
        "the Airflow CLI server",
        RuntimeError,
        wait_seconds,
        environ,
    )


def stop_airflow_server(home: Path, wait_seconds: float = 5.0) -> bool:
    """Stop the server of ``home`` and any command it runs. True if one was running."""
    info_file = home / INFO_FILE
    try:
        pid = int(json.loads(info_file.read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return False
    was_alive = stop_pid(pid, wait_seconds, group=True)
    info_file.unlink(missing_ok=True)
    return was_alive


def serve(home: Path) -> None:
    """Import Airflow, then serve ``airflow`` commands until SIGTERM or until ``home`` is gone."""
    preload()

    def listening() -> None:
        (home / INFO_FILE).write_text(json.dumps({"pid": os.getpid()}))

    # this module's own name (``__main__`` under ``python -m``): its main() sees what preload() kept
    call_server.serve_calls(socket_name(home), {COMMAND: __name__}, preload, listening, home.is_dir)


def cli(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpu_rl_sandbox.clis.airflow_server")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--home", type=Path, help="serve airflow commands for this AIRFLOW_HOME")
    mode.add_argument(
        "--run",
        nargs=argparse.REMAINDER,
        metavar="ARGS",
        help="run `airflow ARGS` here, the task libraries imported first",
    )
    parsed = parser.parse_args(argv)
    if parsed.run is not None:
        run_preloaded(parsed.run)
    else:
        serve(parsed.home.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(cli())
