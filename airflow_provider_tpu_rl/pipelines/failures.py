"""How a pipeline tells a failure in one line: a task's own (``fail_in_one_line``), the first line
of each failed task's error left in XCom (``note_failure``), and the watcher that fails the run
naming them (``add_watcher``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final, NoReturn

from airflow.providers.common.compat.sdk import DAG, TriggerRule, get_current_context, task

from airflow_provider_tpu_rl.compat import task_error
from airflow_provider_tpu_rl.ledger.collect import ERROR_XCOM_KEY, task_states
from airflow_provider_tpu_rl.timeouts import task_timeout

log = logging.getLogger(__name__)

WATCHER_TASK_ID: Final = "watcher"
_MAX_ERROR_CHARS = 500


class OneLineFailure(SystemExit):
    """A task failure that is fully told by its message: a configuration error, the watcher's verdict.

    Airflow 3's task runner logs every ``Exception`` with its traceback
    (``airflow/sdk/execution_time/task_runner.py``, ``_run_task_and_map_outcome``:
    ``log.exception("Task failed with exception")``), 14 frames of which say nothing about a
    wrong zone. A ``SystemExit`` is logged as one line there (``log.error("Task exited",
    exit_code=...)``) and fails the try like any error (retries apply, so use it only on tasks
    with ``retries=0``). Airflow 2.11 fails it as ``Task failed due to SystemExit(<message>)``.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def fail_in_one_line(message: str) -> NoReturn:
    """Log ``message`` as the task's error and fail the task with it, without a traceback."""
    log.error("%s", message)
    raise OneLineFailure(message)


def first_line(error: BaseException | str | None) -> str:
    """The first non-empty line of an error's message (its class name when the message is empty).

    A first line ending in ``:`` gets the next line too (a command error's "last output:", the
    first item of a list such as preflight's problems, its ``- `` dropped).
    """
    if error is None:
        return ""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    line = lines[0]
    if line.endswith(":") and len(lines) > 1:  # "...; last output:" announces the line that says why
        line = f"{line} {lines[1].removeprefix('- ')}"
    return line if len(line) <= _MAX_ERROR_CHARS else line[: _MAX_ERROR_CHARS - 1] + "…"


def note_failure(context: Mapping[str, Any]) -> None:
    """``on_failure_callback``: leave the first line of the task's error in XCom for the watcher.

    Never raises: a callback must not hide the task's own failure.
    """
    try:
        line = first_line(task_error(context.get("exception")))
        if line:
            context["ti"].xcom_push(key=ERROR_XCOM_KEY, value=line)
    except Exception:
        log.exception("could not note this task's error for the watcher")


def failure_summary(
    states: Mapping[str, str | None],
    errors: Callable[[str], Any],
    *,
    order: Sequence[str] = (),
    ignored: Iterable[str] = (),
) -> str:
    """One line naming the failed tasks and the first line of each one's error.

    ``states`` are the run's task states; ``errors(task_id)`` gives what :func:`note_failure`
    left (None when the task left nothing, e.g. it never ran). Tasks are named in ``order``
    (the DAG's), then alphabetically. When no task failed itself, the upstream_failed ones are named.
    """
    skip = set(ignored)
    rank = {task_id: index for index, task_id in enumerate(order)}

    def named(state: str) -> list[str]:
        found = [t for t, s in states.items() if s == state and t not in skip]
        return sorted(found, key=lambda t: (rank.get(t, len(rank)), t))

    failed = named("failed")
    if not failed:
        upstream = named("upstream_failed")
        if not upstream:
            return "a task of this run failed; see the task logs"
        return f"upstream failed (no task failed itself): {', '.join(upstream)}"
    parts = []
    for task_id in failed:
        try:
            error = errors(task_id)
        except Exception:
            error = None
        # an error that starts with its task's id ("preflight: 2 problems ...") is not named twice
        said = first_line(error).removeprefix(f"{task_id}: ") if error else ""
        parts.append(f"{task_id}: {said}" if said else f"{task_id} (see its log)")
    noun = "task" if len(failed) == 1 else "tasks"
    return f"{len(failed)} {noun} failed: " + "; ".join(parts)


def add_watcher(dag: DAG) -> None:
    """Fail the run when any task failed, a teardown included (Airflow ignores those by default).

    Setups may not be directly upstream of a ONE_FAILED task; their failure reaches the watcher
    through their downstream tasks (upstream_failed).
    """

    @task(
        task_id=WATCHER_TASK_ID,
        trigger_rule=TriggerRule.ONE_FAILED,
        retries=0,
        execution_timeout=task_timeout("short"),
    )
    def watcher() -> None:
        """Fail with one line naming the failed task(s) and the first line of each one's error."""
        context = get_current_context()
        ti = context["ti"]
        dag_tasks = getattr(context.get("dag"), "task_ids", None) or ()
        fail_in_one_line(
            failure_summary(
                task_states(context),
                lambda task_id: ti.xcom_pull(task_ids=task_id, key=ERROR_XCOM_KEY),
                order=list(dag_tasks),
                ignored=(WATCHER_TASK_ID,),
            )
        )

    [t for t in dag.tasks if not t.is_setup] >> watcher()
