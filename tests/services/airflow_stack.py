"""Real Airflow services as processes, for the ``services`` tests: start, restart, stop, REST client.

:class:`AirflowStack` runs the API server, ``scheduler``, ``dag-processor`` and ``triggerer``
(LocalExecutor) on a PostgreSQL metadata database, each in its own process group with its own log
file under ``root/logs``. Every port is chosen at run time; ``AIRFLOW_HOME``, ``TMPDIR`` and
``HOME`` are private folders under ``root``. Every process it starts carries the variable
:data:`STACK_MARKER_ENV` (inherited by task runners, the LocalExecutor's workers and the sandbox's
job workers), which is how :func:`leftover_processes` finds what is still running.

What differs between Airflow 3 and Airflow 2 is decided in one place, :data:`FLAVOR` (and the
option sets of :func:`_flavor_env`):

- Airflow 3: ``airflow api-server``; :class:`AirflowApi` calls ``/api/v2`` with a JWT that it gets
  the way a user of the simple auth manager does: ``POST /auth/token`` with a user of
  ``[core] simple_auth_manager_users`` and the password in ``simple_auth_manager_passwords_file``
  (airflow/api_fastapi/auth/managers/simple/routes/login.py).
- Airflow 2 (2.10+): ``airflow webserver`` (FAB auth manager); ``/api/v1`` with HTTP basic auth
  (``[api] auth_backends``, the FAB provider's ``basic_auth``) for an Admin user made with
  ``airflow users create``; the DAG processor runs standalone
  (``[scheduler] standalone_dag_processor``) so that the same four services run and report health.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

from airflow_provider_tpu_rl.compat import AIRFLOW_V_3_0_PLUS
from tests.support.pg_server import PostgresServer, free_port
from tests.support.waiting import HANG_BOUND, WaitTimedOut, wait_until
from tpu_rl_sandbox.clis.airflow_server import preloaded_command

AIRFLOW = str(Path(sys.executable).with_name("airflow"))
REPO = Path(__file__).resolve().parents[2]
DAGS_DIR = REPO / "dags"
# TPU_RL_SANDBOX_*: the gcluster connection passes these on to the fakes, and so to job workers.
STACK_MARKER_ENV = "TPU_RL_SANDBOX_SERVICES_STACK"
ADMIN_USER = "admin"
FINISHED_RUN_STATES = frozenset({"success", "failed"})
_INHERITED_PREFIXES = ("AIRFLOW", "TPU_RL_SANDBOX", "STORAGE_EMULATOR_HOST")

# bounds against a hang: on two cores shared by both legs a start took ~3x a quiet one
MIGRATE_TIMEOUT = 2 * HANG_BOUND  # also for ``airflow users create`` (it loads the FAB app)
STARTUP_TIMEOUT = 2 * HANG_BOUND
STOP_TIMEOUT = 30.0
# Airflow's triggerer gives its triggers 10 s to clean up, then escalates SIGINT, SIGTERM, SIGKILL
# to the trigger runner 10 s apart (airflow/jobs/triggerer_job_runner.py, sdk supervisor).
TRIGGERER_STOP_TIMEOUT = 60.0
# A bound against a hung API server, not a latency goal: an API server that shares two cores with
# the scheduler, the triggerer, task runners and the other leg answered a request in over 30 s.
HTTP_TIMEOUT = 180.0

T = TypeVar("T")


@dataclass(frozen=True)
class AirflowFlavor:
    """What the stack and its REST client do differently on Airflow 3 and on Airflow 2."""

    v3: bool
    api_server: str  # the service that serves the UI and the REST API
    api_prefix: str  # the public REST API's root
    health_path: str
    ui_login_path: str  # the UI's login page (a form with Username, Password and "Sign in")

    def api_server_args(self, port: str) -> list[str]:
        """The API server's arguments: one worker on 127.0.0.1:port."""
        host_flag = "--host" if self.v3 else "--hostname"  # `airflow webserver` has -H/--hostname
        return [host_flag, "127.0.0.1", "--port", port, "--workers", "1"]


FLAVOR = (
    AirflowFlavor(
        v3=True,
        api_server="api-server",
        api_prefix="/api/v2",
        health_path="/api/v2/monitor/health",
        ui_login_path="/auth/login",  # the simple auth manager's page
    )
    if AIRFLOW_V_3_0_PLUS
    else AirflowFlavor(
        v3=False,
        api_server="webserver",
        api_prefix="/api/v1",
        health_path="/api/v1/health",
        ui_login_path="/login/",  # FAB's page
    )
)
SERVICES = ("dag-processor", "scheduler", "triggerer", FLAVOR.api_server)


class StackError(RuntimeError):
    """A service did not start, died, or a wait ran out of time (the message has the logs' tails)."""


def wait_for(
    what: str, probe: Callable[[], T | None], timeout: float, interval: float = 2.0, on_timeout: str = ""
) -> T:
    """Call ``probe`` until it returns something truthy, and return that; :class:`StackError` after
    ``timeout`` (a bound against a hang). Its pause grows to ``interval``: every probe of a stack
    is a REST call the API server pays for, on the cores the services share."""
    try:
        return wait_until(probe, what, timeout, longest_pause=interval, on_timeout=on_timeout)
    except WaitTimedOut as error:
        raise StackError(str(error)) from None


def _mentions(path: Path, needles: list[str], most: int = 40) -> str:
    """The last ``most`` lines of ``path`` that hold one of ``needles``, each with the indented
    lines after it (a traceback)."""
    if not needles or not path.is_file():
        return ""
    kept: list[str] = []
    following = False
    for line in path.read_text(errors="replace").splitlines():
        if any(needle in line for needle in needles):
            kept.append(line)
            following = True
        elif following and (line[:1].isspace() or line.startswith("Traceback")):
            kept.append(line)
        else:
            following = False
    return "\n".join(kept[-most:])


def _tail(path: Path, lines: int = 40) -> str:
    if not path.is_file():
        return f"({path} does not exist)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _ps_lines() -> list[str]:
    done = subprocess.run(
        ["ps", "-eo", "pid,pgid,stat,args"], capture_output=True, text=True, timeout=30, check=False
    )
    return done.stdout.splitlines()[1:]


def leftover_processes(marker: str) -> list[str]:
    """``ps`` lines of live processes whose environment has ``TPU_RL_SANDBOX_SERVICES_STACK=marker``."""
    needle = f"{STACK_MARKER_ENV}={marker}".encode()
    found: list[str] = []
    for line in _ps_lines():
        fields = line.split(None, 3)
        if len(fields) < 3 or fields[2].startswith("Z"):  # zombies hold no resources
            continue
        try:
            environ = Path(f"/proc/{fields[0]}/environ").read_bytes()
        except OSError:  # gone meanwhile, or not ours
            continue
        if needle in environ.split(b"\0"):
            found.append(line.strip())
    return found


def new_marker() -> str:
    """A value for :data:`STACK_MARKER_ENV` that no other stack uses."""
    return f"{os.getpid()}-{secrets.token_hex(4)}"


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def kill_leftovers(marker: str) -> None:
    """SIGKILL every process still carrying the marker (the last resort of a teardown)."""
    for line in leftover_processes(marker):
        with suppress(ProcessLookupError, PermissionError, ValueError):
            os.kill(int(line.split()[0]), signal.SIGKILL)


def _stat_fields(pid: int) -> list[str]:
    """/proc/<pid>/stat after the command (the state, field 3, first); [] once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def cpu_seconds_of(pid: int) -> float:
    """User + system CPU of a live process and its live descendants, and of the children each has
    waited for (a LocalExecutor worker runs every task it is given before the scheduler waits for it)."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(int(entry.name))):
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    ticks, todo = 0, [pid]
    while todo:
        current = todo.pop()
        fields = _stat_fields(current)
        if fields:  # utime, stime, cutime, cstime: fields 14-17
            ticks += sum(int(value) for value in fields[11:15])
            todo.extend(parents.get(current, []))
    return ticks / os.sysconf("SC_CLK_TCK")


@dataclass
class Service:
    """One ``airflow <name>`` process, leader of its own process group."""

    name: str
    process: subprocess.Popen[bytes]
    log_file: Path

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def signal_group(self, signum: int) -> None:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)

    def terminate(self) -> None:
        """SIGTERM the service's own process: it stops its children itself, as on a real host."""
        with suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM the service, wait for it, then SIGKILL whatever is left of its group; the exit code."""
        if self.alive:
            self.terminate()
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                with suppress(subprocess.TimeoutExpired):
                    self.process.wait(timeout=10)
        # Children that outlived their leader (the group id stays theirs).
        self.signal_group(signal.SIGKILL)
        return self.process.returncode


@dataclass
class AirflowStack:
    """The four Airflow services of one test module, their environment and their databases."""

    root: Path
    env: dict[str, str]
    api_url: str
    metadata_dsn: str
    ledger_dsn: str
    admin_password: str
    marker: str
    services: dict[str, Service] = field(default_factory=dict)
    _generations: dict[str, int] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return Path(self.env["AIRFLOW_HOME"])

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    # -- processes ------------------------------------------------------------------------
    def start_service(self, name: str) -> Service:
        """Start ``airflow NAME`` (in a new session, so its whole group can be signalled)."""
        generation = self._generations.get(name, 0) + 1
        self._generations[name] = generation
        log_file = self.log_dir / f"{name}-{generation}.log"
        # The scheduler's LocalExecutor forks each task's processes from it: with the task libraries
        # imported first, no task imports them again (tpu_rl_sandbox.clis.airflow_server.run_preloaded).
        argv = preloaded_command([name]) if name == "scheduler" else [AIRFLOW, name]
        if name == FLAVOR.api_server:
            argv += FLAVOR.api_server_args(self.api_url.rsplit(":", 1)[1])
        with log_file.open("ab") as out:
            process = subprocess.Popen(
                argv,
                env=self.env,
                cwd=self.root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        service = Service(name, process, log_file)
        self.services[name] = service
        return service

    def check_alive(self) -> None:
        """:class:`StackError` with the log's tail if a service has exited."""
        for service in self.services.values():
            if not service.alive:
                raise StackError(
                    f"airflow {service.name} exited with {service.process.returncode}:\n{_tail(service.log_file)}"
                )

    def task_log_dir(self, dag_id: str, run_id: str, task_id: str) -> Path:
        """Where Airflow's default log template puts a task instance's attempt logs."""
        return self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"

    def failed_task_logs(self, watch: RunWatch, lines: int = 15) -> str:
        """The last lines of the log of each task of ``watch``'s run that failed (why it failed),
        and what the services logged about it (a task killed before it logged its error: the
        executor's or the scheduler's word)."""
        failed = {
            task_id: ti for task_id, ti in sorted(watch.task_instances.items()) if ti.get("state") == "failed"
        }
        own_logs = [
            f"--- {log}\n{_tail(log, lines)}"
            for task_id in failed
            for log in sorted(self.task_log_dir(watch.dag_id, watch.run_id, task_id).glob("attempt=*.log"))
        ]
        # the scheduler names a task instance "<dag_id>.<task_id> <run_id>" (or by its id, Airflow 3)
        needles = [f"{watch.dag_id}.{task_id} {watch.run_id}" for task_id in failed]
        needles += [str(ti["id"]) for ti in failed.values() if ti.get("id")]
        said = [
            f"--- airflow {service.name} on {', '.join(failed)}: {service.log_file}\n{mentions}"
            for service in self.services.values()
            if (mentions := _mentions(service.log_file, needles))
        ]
        return "\n".join(own_logs + said)

    def diagnostics(self, lines: int = 30) -> str:
        """The last lines of every service's log (for assertion and timeout messages)."""
        return "\n".join(
            f"--- airflow {s.name} ({'alive' if s.alive else f'exit {s.process.returncode}'}): {s.log_file}\n"
            f"{_tail(s.log_file, lines)}"
            for s in self.services.values()
        )

    def restart_triggerer(self, timeout: float = TRIGGERER_STOP_TIMEOUT) -> tuple[int | None, float]:
        """SIGTERM the triggerer, wait for it to exit, start a new one; the old one's exit code and
        how many seconds it took to exit."""
        old = self.services["triggerer"]
        started = time.monotonic()
        old.terminate()
        try:
            code: int | None = old.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired as error:
            old.signal_group(signal.SIGKILL)
            raise StackError(f"the triggerer did not exit {timeout:.0f} s after SIGTERM") from error
        seconds = time.monotonic() - started
        old.signal_group(signal.SIGKILL)  # its trigger-runner and log-server children, if any remain
        self.start_service("triggerer")
        return code, seconds

    def stop(self) -> None:
        """Stop every service (API server last, so nothing is left calling it); what each spent,
        with the task processes it ran, goes to ``logs/cpu-seconds.txt`` (where a stack's CPU goes)."""
        spent: list[str] = []
        for name in ("scheduler", "triggerer", "dag-processor", FLAVOR.api_server):
            service = self.services.get(name)
            if service is not None:
                spent.append(f"airflow {name}: {cpu_seconds_of(service.process.pid):.1f} CPU-s")
                service.stop()
        with suppress(OSError):
            (self.root / "logs" / "cpu-seconds.txt").write_text("\n".join(spent) + "\n")

    # -- REST -------------------------------------------------------------------------------
    def api(self) -> AirflowApi:
        return AirflowApi(self.api_url, ADMIN_USER, self.admin_password)

    def wait_ready(self, dag_ids: Sequence[str], timeout: float = STARTUP_TIMEOUT) -> AirflowApi:
        """Wait for the API, for every component to report healthy, and for each of ``dag_ids`` to be parsed."""
        deadline = time.monotonic() + timeout

        def left() -> float:
            return max(1.0, deadline - time.monotonic())

        def probe_api() -> AirflowApi | None:
            self.check_alive()
            try:
                api = self.api()
                api.login()
            except httpx.HTTPError:
                return None
            return api

        api = wait_for("the API server", probe_api, left(), on_timeout=self.diagnostics())

        def healthy() -> bool:
            self.check_alive()
            health = api.health()
            return all(
                (health.get(part) or {}).get("status") == "healthy"
                for part in ("metadatabase", "scheduler", "triggerer", "dag_processor")
            )

        wait_for(
            "healthy scheduler, triggerer and dag processor", healthy, left(), on_timeout=self.diagnostics()
        )

        def parsed() -> bool:
            self.check_alive()
            return all(
                api.get_optional(f"{FLAVOR.api_prefix}/dags/{dag_id}") is not None for dag_id in dag_ids
            )

        wait_for(f"DAGs {', '.join(dag_ids)} to be parsed", parsed, left(), on_timeout=self.diagnostics())
        return api


# The DAG files do not change during a test: each is parsed once, not every 30 s (an hour: longer
# than a stack lives, even loaded).
DAG_FILE_PARSE_INTERVAL = 3600
# The DAG processor kills a file's parse after this many seconds (50 by default; a parse took 18 s
# with both legs on two cores): longer than the import bound, which it includes.
DAG_FILE_PROCESSOR_TIMEOUT = int(HANG_BOUND) + 60
# Airflow 3's task processes wait this long for one answer of the API server (a bound against a
# hang: the server answered in 1-4 s with both legs on two cores).
EXECUTION_API_TIMEOUT = 60


def stack_env(
    root: Path, sandbox_env: Mapping[str, str], metadata_dsn: str, ledger_dsn: str, marker: str, api_port: int
) -> dict[str, str]:
    """The environment of every service: Airflow options as variables, the sandbox, private dirs."""
    home, tmp, user = root / "airflow", root / "tmp", root / "user"
    api_url = f"http://127.0.0.1:{api_port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(_INHERITED_PREFIXES)}
    env.update(sandbox_env)
    env.update(
        {
            STACK_MARKER_ENV: marker,
            "AIRFLOW_HOME": str(home),
            "TMPDIR": str(tmp),
            "HOME": str(user),
            "PYTHONUNBUFFERED": "1",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_dsn,
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_DIR),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.5",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "2",
            "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True",
            # Airflow's bound on importing one DAG file (30 s by default), a bound against a hang: the
            # files are parsed once (DAG_FILE_PARSE_INTERVAL), so a parse cut short by load would
            # leave the stack without that DAG until the wait for it gives up
            "AIRFLOW__CORE__DAGBAG_IMPORT_TIMEOUT": str(int(HANG_BOUND)),
            # the provider's knobs: fast polls, one quick retry (a spurious retry shows as try 2)
            "AIRFLOW__TPU_RL__POLL_INTERVAL": "0.5",
            "AIRFLOW__TPU_RL__RETRY_DELAY": "1",
            "AIRFLOW__TPU_RL__RETRIES": "1",
            "AIRFLOW_CONN_TPU_RL_LEDGER": ledger_dsn,
        }
    )
    env.update(_flavor_env(home, api_url))
    return env


def _flavor_env(home: Path, api_url: str) -> dict[str, str]:
    """The options that only one major version has (or names differently)."""
    if FLAVOR.v3:
        return {
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{api_url}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN_USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
            "AIRFLOW__API__BASE_URL": api_url,
            "AIRFLOW__API__SECRET_KEY": secrets.token_hex(16),
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": str(DAG_FILE_PARSE_INTERVAL),
            "AIRFLOW__DAG_PROCESSOR__DAG_FILE_PROCESSOR_TIMEOUT": str(DAG_FILE_PROCESSOR_TIMEOUT),
            # a task process's bound on one call to the execution API (5 s by default, then retried):
            # a call that timed out under load but went through is retried into a conflict (the task
            # is already running) and the task dies queued, as one did with both legs on two cores
            "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": str(EXECUTION_API_TIMEOUT),
        }
    # Airflow 2: no execution API (task runners use the database), the FAB auth manager (its
    # users live in the metadata database), the webserver's key signs log-server requests.
    return {
        "AIRFLOW__WEBSERVER__BASE_URL": api_url,
        "AIRFLOW__WEBSERVER__SECRET_KEY": secrets.token_hex(16),
        # basic auth for this client; `session` for the UI, which Airflow 2 would otherwise append
        # itself with a FutureWarning in every process (configuration.py, _upgrade_auth_backends)
        "AIRFLOW__API__AUTH_BACKENDS": (
            "airflow.providers.fab.auth_manager.api.auth.backend.basic_auth,airflow.api.auth.backend.session"
        ),
        # gunicorn's workers are not recycled during a test (0 turns the refresh off)
        "AIRFLOW__WEBSERVER__WORKER_REFRESH_BATCH_SIZE": "0",
        # the webserver's monitor gives gunicorn's master 120 s by default to have its workers up,
        # counted from before the app's permission sync (cli/commands/webserver_command.py,
        # _wait_until_true); with both legs on two cores that sync alone took ~80 s and the
        # webserver shut itself down. A bound against a hang, like every wait in the suite.
        "AIRFLOW__WEBSERVER__WEB_SERVER_MASTER_TIMEOUT": str(int(HANG_BOUND * 3)),
        # gunicorn kills a worker silent this long (a loaded worker answering a slow request)
        "AIRFLOW__WEBSERVER__WEB_SERVER_WORKER_TIMEOUT": str(int(HANG_BOUND * 2)),
        "AIRFLOW__SCHEDULER__STANDALONE_DAG_PROCESSOR": "True",
        "AIRFLOW__SCHEDULER__DAG_DIR_LIST_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__MIN_FILE_PROCESS_INTERVAL": str(DAG_FILE_PARSE_INTERVAL),
        "AIRFLOW__CORE__DAG_FILE_PROCESSOR_TIMEOUT": str(DAG_FILE_PROCESSOR_TIMEOUT),
        # With a standalone DAG processor, Airflow 2's scheduler deactivates every DAG whose
        # last_parsed_time is older than this and deletes its serialized DAG
        # (jobs/scheduler_job_runner.py, _cleanup_stale_dags; default 600 s): a stack alive ten
        # minutes after its one parse lost all its DAGs (the webserver's 404 "DAG ... not found").
        # Airflow 3 removed the option (cli/commands/config_command.py, CONFIGS_CHANGES).
        "AIRFLOW__SCHEDULER__DAG_STALE_NOT_SEEN_DURATION": str(2 * DAG_FILE_PARSE_INTERVAL),
    }


def _run_cli(stack: AirflowStack, args: list[str], log_name: str, what: str) -> None:
    """Run ``airflow ARGS`` to its end (output to ``logs/LOG_NAME``); :class:`StackError` if it fails."""
    log_file = stack.log_dir / log_name
    with log_file.open("wb") as out:
        done = subprocess.run(
            [AIRFLOW, *args],
            env=stack.env,
            cwd=stack.root,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=MIGRATE_TIMEOUT,
            check=False,
        )
    if done.returncode != 0:
        raise StackError(f"{what} failed ({done.returncode}):\n{_tail(log_file)}")


def _create_admin(stack: AirflowStack) -> None:
    """The user :class:`AirflowApi` logs in as, with ``stack.admin_password``."""
    if FLAVOR.v3:  # the simple auth manager reads the password from its file
        (stack.home / "passwords.json").write_text(json.dumps({ADMIN_USER: stack.admin_password}) + "\n")
        return
    _run_cli(
        stack,
        # `--password=...`: a password starting with "-" must not read as an option
        [
            "users",
            "create",
            "--role",
            "Admin",
            "--username",
            ADMIN_USER,
            f"--password={stack.admin_password}",
            "--email",
            "admin@example.com",
            "--firstname",
            "Admin",
            "--lastname",
            "User",
        ],
        "users-create.log",
        "airflow users create",
    )


def start_stack(
    root: Path,
    postgres: PostgresServer,
    sandbox_env: Mapping[str, str],
    dag_ids: Sequence[str],
    marker: str,
    extra_env: Mapping[str, str] | None = None,
) -> tuple[AirflowStack, AirflowApi]:
    """Create the databases, ``airflow db migrate``, the admin user, start the four services, wait
    until they are ready and ``dag_ids`` are parsed.

    On any failure the services started so far are stopped before the error propagates.
    """
    for folder in ("airflow", "tmp", "user", "logs"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    suffix = secrets.token_hex(4)
    metadata = postgres.create_database(f"airflow_{suffix}")
    ledger = postgres.create_database(f"ledger_{suffix}")
    api_port = free_port()
    env = stack_env(
        root,
        sandbox_env,
        metadata.replace("postgresql://", "postgresql+psycopg2://", 1),
        ledger,
        marker,
        api_port,
    )
    env.update(extra_env or {})
    password = secrets.token_urlsafe(12)
    stack = AirflowStack(
        root=root,
        env=env,
        api_url=f"http://127.0.0.1:{api_port}",
        metadata_dsn=metadata,
        ledger_dsn=ledger,
        admin_password=password,
        marker=marker,
    )
    _run_cli(stack, ["db", "migrate"], "db-migrate.log", "airflow db migrate")
    _create_admin(stack)
    try:
        for name in SERVICES:
            stack.start_service(name)
        api = stack.wait_ready(dag_ids)
    except BaseException:
        stack.stop()
        raise
    return stack, api


# ========================================================================================= REST
@dataclass
class AirflowApi:
    """The public REST API (:data:`FLAVOR`'s ``api_prefix``) as the admin user.

    Airflow 3: a JWT from the simple auth manager's ``POST /auth/token``, renewed once on a 401.
    Airflow 2: HTTP basic auth on every request (the FAB provider's ``basic_auth`` backend).
    """

    base_url: str
    username: str
    password: str
    token: str | None = None

    def _client(self) -> httpx.Client:
        if not FLAVOR.v3:
            return httpx.Client(
                base_url=self.base_url,
                timeout=HTTP_TIMEOUT,
                auth=httpx.BasicAuth(self.username, self.password),
            )
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return httpx.Client(base_url=self.base_url, timeout=HTTP_TIMEOUT, headers=headers)

    def login(self) -> None:
        """Check the credentials (Airflow 3: ``POST /auth/token``, the token is kept for later calls)."""
        if not FLAVOR.v3:  # basic auth has no session: one authenticated call proves the password
            with self._client() as client:
                client.get(f"{FLAVOR.api_prefix}/dags", params={"limit": 1}).raise_for_status()
            return
        with httpx.Client(base_url=self.base_url, timeout=HTTP_TIMEOUT) as client:
            response = client.post("/auth/token", json={"username": self.username, "password": self.password})
        response.raise_for_status()
        self.token = str(response.json()["access_token"])

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        if FLAVOR.v3 and self.token is None:
            self.login()
        with self._client() as client:
            response = client.request(method, path, **kwargs)
        if FLAVOR.v3 and response.status_code == 401:  # expired: log in again once
            self.login()
            with self._client() as client:
                response = client.request(method, path, **kwargs)
        return response

    @contextmanager
    def ui_client(self) -> Iterator[httpx.Client]:
        """A client logged in to the UI as a browser is.

        Airflow 3: the simple auth manager's JWT in the UI's ``_token`` cookie
        (``COOKIE_NAME_JWT_TOKEN``). Airflow 2: FAB's login form (``/login/``, with its CSRF token),
        which leaves a session cookie.
        """
        with httpx.Client(base_url=self.base_url, timeout=HTTP_TIMEOUT) as client:
            if FLAVOR.v3:
                self.login()
                client.cookies.set("_token", str(self.token))
            else:
                form = client.get(FLAVOR.ui_login_path)
                form.raise_for_status()
                found = re.search(r'name="csrf_token"[^>]*value="([^"]+)"', form.text)
                if found is None:
                    raise StackError(f"no csrf_token in the login form: {form.text[:500]}")
                done = client.post(
                    FLAVOR.ui_login_path,
                    data={"username": self.username, "password": self.password, "csrf_token": found.group(1)},
                )
                if done.status_code not in (200, 302) or "session" not in client.cookies:
                    raise StackError(f"UI login failed: {done.status_code} {done.text[:500]}")
            yield client

    def task_links(self, dag_id: str, run_id: str, task_id: str) -> dict[str, Any]:
        """The task's extra links by name (``/links``), as the UI shows them."""
        path = f"{FLAVOR.api_prefix}/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/links"
        return dict(self.get(path))

    def get(self, path: str, **params: Any) -> Any:
        response = self.request("GET", path, params=params)
        if response.is_error:  # with the body: it says which of an endpoint's 404s it was
            raise httpx.HTTPStatusError(
                f"GET {response.url}: {response.status_code} {response.text[:1000]}",
                request=response.request,
                response=response,
            )
        return response.json()

    def get_optional(self, path: str) -> Any | None:
        """The JSON body, or None on 404."""
        response = self.request("GET", path)
        if response.status_code == 404:
            return None
        response.raise_for_status()
        return response.json()

    def health(self) -> dict[str, Any]:
        return dict(self.get(FLAVOR.health_path))

    def unpause(self, dag_id: str) -> None:
        response = self.request("PATCH", f"{FLAVOR.api_prefix}/dags/{dag_id}", json={"is_paused": False})
        response.raise_for_status()

    def trigger(self, dag_id: str, run_id: str, conf: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /dags/{dag_id}/dagRuns``: a manual run with ``conf``.

        Airflow 3: no logical date, as the UI's form (``logical_date`` is required and nullable in
        ``TriggerDAGRunPostBody``). Airflow 2: the field is left out, and ``DAGRunSchema`` makes
        the logical date now (api_connexion/schemas/dag_run_schema.py, ``autogenerate``).
        """
        body: dict[str, Any] = {"dag_run_id": run_id, "conf": dict(conf)}
        if FLAVOR.v3:
            body["logical_date"] = None
        response = self.request("POST", f"{FLAVOR.api_prefix}/dags/{dag_id}/dagRuns", json=body)
        if response.status_code >= 400:
            raise StackError(f"triggering {dag_id} failed: {response.status_code} {response.text}")
        return dict(response.json())

    def dag_run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return dict(self.get(f"{FLAVOR.api_prefix}/dags/{dag_id}/dagRuns/{run_id}"))

    def task_instances(self, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
        """The run's task instances by task id (unmapped tasks)."""
        body = self.get(f"{FLAVOR.api_prefix}/dags/{dag_id}/dagRuns/{run_id}/taskInstances", limit=100)
        return {ti["task_id"]: ti for ti in body["task_instances"]}

    def xcom_value(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value") -> Any:
        """A task's XCom as JSON (``stringify=false``: Airflow 2.11's default is the value's
        ``str()``, api_connexion/endpoints/xcom_endpoint.py; Airflow 3's is the stored value)."""
        path = f"{FLAVOR.api_prefix}/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}"
        return self.get(path, stringify="false")["value"]

    def tries(self, dag_id: str, run_id: str, task_id: str) -> list[dict[str, Any]]:
        """Every try of a task instance (``/tries``: the history plus the current one; Airflow 2.10+)."""
        body = self.get(f"{FLAVOR.api_prefix}/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/tries")
        return list(body["task_instances"])

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int) -> list[dict[str, Any]]:
        """The whole log of one try as entries with an ``event`` (worker and trigger sections).

        Airflow 3 returns structured entries. Airflow 2's JSON ``content`` is the ``str()`` of a
        list of (host, text) tuples (api_connexion/endpoints/log_endpoint.py, ``fields.Str``), so
        the log is read as ``text/plain`` instead, and each line becomes one entry.
        """
        path = f"{FLAVOR.api_prefix}/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}"
        headers = {} if FLAVOR.v3 else {"Accept": "text/plain"}
        response = self.request("GET", path, params={"full_content": "true"}, headers=headers)
        if response.status_code == 404:  # kept in the result: a missing log is worth seeing
            return [{"event": f"(no log for try {try_number}: 404 {response.text})"}]
        response.raise_for_status()
        if not FLAVOR.v3:
            return [{"event": line} for line in response.text.splitlines()]
        content = response.json().get("content") or []
        return [entry if isinstance(entry, dict) else {"event": str(entry)} for entry in content]


@dataclass
class RunWatch:
    """What was seen while waiting for a DAG run: its end state and every task state observed."""

    dag_id: str
    run_id: str
    state: str = "queued"
    seen_states: dict[str, list[str]] = field(default_factory=dict)
    task_instances: dict[str, dict[str, Any]] = field(default_factory=dict)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def observe(self, task_instances: dict[str, dict[str, Any]]) -> None:
        self.task_instances = task_instances
        for task_id, ti in task_instances.items():
            history = self.seen_states.setdefault(task_id, [])
            state = str(ti.get("state"))
            if not history or history[-1] != state:
                history.append(state)

    def describe(self) -> str:
        tasks = ", ".join(
            f"{task_id}={ti.get('state')}#{ti.get('try_number')}"
            for task_id, ti in sorted(self.task_instances.items())
        )
        seen = "\n  ".join(
            f"{task_id}: {' > '.join(states)}" for task_id, states in sorted(self.seen_states.items())
        )
        notes = "".join(f"\nnote: {note}" for note in self.notes)
        return f"{self.dag_id} {self.run_id}: {self.state} after {self.seconds:.0f} s\ntasks: {tasks}\nseen:\n  {seen}{notes}"


def watch_run(
    stack: AirflowStack,
    api: AirflowApi,
    dag_id: str,
    run_id: str,
    timeout: float,
    until: Callable[[RunWatch], bool] | None = None,
    watch: RunWatch | None = None,
    interval: float = 2.0,
) -> RunWatch:
    """Poll the run and its task instances until it ends (or ``until(watch)`` holds); bounded."""
    watch = watch or RunWatch(dag_id, run_id)
    started = time.monotonic()

    def probe() -> bool:
        stack.check_alive()
        watch.state = str(api.dag_run(dag_id, run_id)["state"])
        watch.observe(api.task_instances(dag_id, run_id))
        if until is not None:
            return until(watch)
        return watch.state in FINISHED_RUN_STATES

    try:
        wait_for(f"run {run_id}", probe, timeout, interval=interval)
    except StackError as error:
        raise StackError(
            f"{error}\n{watch.describe()}\n{stack.failed_task_logs(watch)}\n{stack.diagnostics()}"
        ) from None
    finally:
        watch.seconds += time.monotonic() - started
    return watch
