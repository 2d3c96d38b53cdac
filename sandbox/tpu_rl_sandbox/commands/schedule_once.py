"""``python -m tpu_rl_sandbox.commands.schedule_once DAG_ID``: the scheduler's "create DAG runs"
step, once, in-process (what its loop does first), with no scheduler running: it turns queued asset
events into asset-triggered runs. Prints each run of ``DAG_ID``: ``RUN <run id> <run type>``. The
demo and the end-to-end tests run the model asset's downstream example DAG with it after
``airflow dags test`` (which never runs a scheduler), through :func:`run_queued_task`. A private
API (``_create_dagruns_for_dags``) on both Airflow lines: fine in the sandbox, never in the provider."""

from __future__ import annotations

import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

# A bound against a hang on each of the two commands (a new interpreter that imports Airflow's
# scheduler: seconds on a quiet machine, more than 300 with two loaded test suites on two cores).
STEP_TIMEOUT_SECONDS = 900


@dataclass(frozen=True)
class QueuedRun:
    """What :func:`run_queued_task` saw: the DAG's runs after the scheduler's step (run id, run
    type), that step's exit code and output, and the task's (None: no run to test)."""

    runs: list[tuple[str, str]]
    step_code: int
    step_output: str
    task_code: int | None = None
    task_output: str = ""


def airflow_alone(args: list[str]) -> list[str]:
    """The argv of ``airflow ARGS``: this interpreter's ``airflow`` script, a new process."""
    return [str(Path(sys.executable).with_name("airflow")), *args]


def run_queued_task(
    env: Mapping[str, str],
    dag_id: str,
    task_id: str,
    cwd: Path | None = None,
    airflow: Callable[[list[str]], list[str]] = airflow_alone,
    timeout: float = STEP_TIMEOUT_SECONDS,
) -> QueuedRun:
    """The scheduler's step (this module, in a subprocess with ``env``), then ``airflow tasks
    test`` of ``task_id`` in ``dag_id``'s newest run, if it has one; ``airflow`` gives that
    command's argv (the end-to-end tests' runs it through their Airflow CLI server). A command
    that runs past ``timeout`` seconds is killed: its code is -9, its output what it printed and
    a last line saying so."""

    def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                argv, env=dict(env), cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as expired:
            printed = "".join(_text(part) for part in (expired.stdout, expired.stderr))
            return subprocess.CompletedProcess(
                argv, -9, f"{printed}\n{shlex.join(argv)}: killed after {timeout:g} s\n", ""
            )

    step = run([sys.executable, "-m", "tpu_rl_sandbox.commands.schedule_once", dag_id])
    runs = [
        (fields[1], fields[2])
        for fields in (line.split() for line in step.stdout.splitlines())
        if len(fields) >= 3 and fields[0] == "RUN"
    ]
    found = QueuedRun(runs, step.returncode, step.stdout + step.stderr)
    if step.returncode != 0 or not runs:
        return found
    done = run(airflow(["tasks", "test", dag_id, task_id, runs[-1][0]]))
    return QueuedRun(runs, step.returncode, found.step_output, done.returncode, done.stdout + done.stderr)


def _text(output: str | bytes | None) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else output or ""


def main(dag_id: str) -> None:
    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.sqlalchemy import prohibit_commit

    runner = SchedulerJobRunner(job=Job())
    with create_session() as session, prohibit_commit(session) as guard:
        runner._create_dagruns_for_dags(guard, session)
    with create_session() as session:
        for run in session.query(DagRun).filter(DagRun.dag_id == dag_id).order_by(DagRun.id):
            print("RUN", run.run_id, getattr(run.run_type, "value", run.run_type))


if __name__ == "__main__":
    main(sys.argv[1])
