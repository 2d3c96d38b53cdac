"""What the tests need that differs between Airflow 2.11 and Airflow 3.x, in one place.

The tests import these names from here instead of from
Airflow directly:

    from tests.support.compat import (
        AIRFLOW_V_3_0_PLUS, DagBag, serialize_roundtrip, trigger_time_validate,
        dag_schedule, capture_task_logs, task_log_debug, dags_test_task_log,
    )

Checked against the installed sources: Airflow 2.11.2 (airflow.models.dagbag.DagBag,
airflow.serialization.serialized_objects.SerializedDAG, DAG.create_dagrun's
``copy.deepcopy(self.params); update(conf); validate()``, stdlib task logging, no structlog) and
Airflow 3.3 (airflow.dag_processing.dagbag.DagBag, DagSerialization, ParamsDict.deep_merge,
structlog + airflow._shared.logging.structlog.PER_LOGGER_LEVELS).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_tpu_rl.compat import AIRFLOW_V_3_0_PLUS, airflow_version

# --- DagBag --------------------------------------------------------------------------------------
try:  # Airflow 3.x (3.1+ moved it; the models path is a deprecated alias or gone)
    from airflow.dag_processing.dagbag import DagBag
except ImportError:  # Airflow 2.x
    from airflow.models.dagbag import DagBag  # type: ignore[no-redef]


def make_dag_bag(dag_folder: str) -> Any:
    """The DAG folder parsed as the DAG processor would, without Airflow's example DAGs.

    Airflow 2's ``[core] load_examples`` defaults to True and some of its examples fail to import
    there (example_subdag_operator, example_dataset_alias*), which fills ``import_errors``.
    Airflow 3's DagBag reads only the folder (examples are a bundle of their own).
    """
    if AIRFLOW_V_3_0_PLUS:
        return DagBag(dag_folder=dag_folder)
    return DagBag(dag_folder=dag_folder, include_examples=False)


# --- Serialization -------------------------------------------------------------------------------
def serialize_roundtrip(dag: Any) -> Any:
    """The DAG as the scheduler / API server / webserver sees it: serialized and read back."""
    try:
        from airflow.serialization.serialized_objects import DagSerialization  # Airflow 3.x
    except ImportError:
        from airflow.serialization.serialized_objects import SerializedDAG as DagSerialization  # 2.x
    return DagSerialization.from_dict(DagSerialization.to_dict(dag))


# --- Params merged with a run's conf, validated (trigger form, REST API, `airflow dags trigger`) ---
def trigger_time_validate(dag: Any, conf: dict[str, Any]) -> dict[str, Any]:
    """What creating a run with ``conf`` does to the params, on either Airflow line."""
    params = dag.params
    if hasattr(params, "deep_merge"):  # Airflow 3.x
        return params.deep_merge(conf).validate()
    # Airflow 2.x: DAG.create_dagrun does exactly this (models/dag.py, "copied_params").
    merged = copy.deepcopy(params)
    merged.update(conf or {})
    return merged.validate()


# --- DAG attributes ------------------------------------------------------------------------------
def dag_schedule(dag: Any) -> Any:
    """``dag.schedule`` on Airflow 3; 2.x keeps the argument as ``schedule_interval``.

    For ``schedule=None`` both give None; for a cron string both give the string.
    """
    if hasattr(dag, "schedule"):
        return dag.schedule
    return dag.schedule_interval


# --- Task-log capture ----------------------------------------------------------------------------
class _ListHandler(logging.Handler):
    def __init__(self, sink: list[dict[str, Any]]) -> None:
        super().__init__(level=logging.DEBUG)
        self.sink = sink
        self._seen: set[int] = set()

    def emit(self, record: logging.LogRecord) -> None:
        # attached at several levels of the hierarchy: a propagating record reaches it more than once
        if id(record) in self._seen:
            return
        self._seen.add(id(record))
        self.sink.append(
            {
                "event": record.getMessage(),
                "log_level": record.levelname.lower(),
                "logger": record.name,
            }
        )


@contextlib.contextmanager
def capture_task_logs() -> Iterator[list[dict[str, Any]]]:
    """The hooks'/operators'/triggers' task-log lines as dicts with ``event`` and ``log_level``.

    Airflow 3: structlog's ``capture_logs`` (task SDK loggers are structlog). Airflow 2: their
    ``self.log`` is a stdlib logger under ``airflow.task`` (which does not propagate to the root),
    so a handler on the root and on ``airflow.task`` collects the same lines in the same shape.
    """
    if AIRFLOW_V_3_0_PLUS:
        from structlog.testing import capture_logs

        with capture_logs() as logs:
            yield logs
        return
    logs: list[dict[str, Any]] = []
    handler = _ListHandler(logs)
    targets = [logging.getLogger(), logging.getLogger("airflow.task"), logging.getLogger("airflow")]
    saved = [(lg, lg.level) for lg in targets]
    for lg in targets:
        lg.addHandler(handler)
        if lg.level == logging.NOTSET or lg.level > logging.INFO:
            lg.setLevel(logging.INFO)
    try:
        yield logs
    finally:
        for lg, level in saved:
            lg.removeHandler(handler)
            lg.setLevel(level)


def task_log_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let DEBUG task-log lines through for the duration of a test (the secret-leak test)."""
    if AIRFLOW_V_3_0_PLUS:
        from airflow._shared.logging.structlog import PER_LOGGER_LEVELS

        monkeypatch.setitem(PER_LOGGER_LEVELS, "", logging.DEBUG)
        return
    for name in ("", "airflow", "airflow.task"):
        lg = logging.getLogger(name)
        monkeypatch.setattr(lg, "level", logging.DEBUG)


# --- What each CLI offers (tests/services) --------------------------------------------------------
# Airflow 3 runs `airflow api-server` (+ scheduler, dag-processor, triggerer); Airflow 2 runs
# `airflow webserver` (+ scheduler with its own DAG processing, triggerer), REST API under
# /api/v1 with basic auth instead of /api/v2 with a JWT.
WEB_COMMAND = "api-server" if AIRFLOW_V_3_0_PLUS else "webserver"
STANDALONE_DAG_PROCESSOR = AIRFLOW_V_3_0_PLUS

__all__ = [
    "AIRFLOW_V_3_0_PLUS",
    "STANDALONE_DAG_PROCESSOR",
    "WEB_COMMAND",
    "DagBag",
    "airflow_version",
    "capture_task_logs",
    "dag_schedule",
    "make_dag_bag",
    "serialize_roundtrip",
    "task_log_debug",
    "trigger_time_validate",
]


# --- `airflow dags test` output ------------------------------------------------------------------
def dags_test_task_log(output: str, task_id: str) -> str:
    """What ``airflow dags test`` printed while ``task_id`` ran.

    Airflow 3 ends a task's part with ``[DAG TEST] end task task_id=...``; Airflow 2.11 marks no end
    of a task that raised: ``dags test`` then logs "Task failed; ti=<TaskInstance: ...>" with the
    traceback (models/dag.py, DAG.test).
    """
    start = output.index(f"[DAG TEST] starting task_id={task_id} ")
    end = output.find(f"[DAG TEST] end task task_id={task_id} ", start)
    if end == -1:
        failed = re.compile(rf"Task failed; ti=<TaskInstance: \w+\.{re.escape(task_id)} ")
        found = failed.search(output, start)
        assert found is not None, f"no end of {task_id}'s log in the output"
        end = output.rfind("\n", start, found.start()) + 1
    return output[start:end]
