"""What the janitor knows: the buckets, the projects their resource records name, the state of runs.

- Buckets: ``[tpu_rl] janitor_buckets`` (comma-separated) plus every ``bucket`` named in the run
  ledger's run confs (read only).
- Projects: every project named in the resource records ``gs://BUCKET/tpu-rl/resources/*.json``
  of those buckets, plus the Google Cloud connection's project (or exactly the ``projects`` given).
- Runs: the state of a DAG run and of its task instances, through the Task SDK on Airflow 3
  (``RuntimeTaskInstance.get_dagrun_state`` / ``get_task_states``: a worker has no database) and
  through the metadata database on Airflow 2.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from airflow.providers.common.compat.sdk import BaseHook

from airflow_provider_tpu_rl.compat import (
    AIRFLOW_V_3_0_PLUS,
    AirflowException,
    AirflowNotFoundException,
    conf,
)
from airflow_provider_tpu_rl.render import gke

log = logging.getLogger(__name__)

# Task states of a run that is still being worked on (a worker, the scheduler or the triggerer
# has it, or will pick it up again). Airflow's TaskInstanceState values.
ALIVE_TASK_STATES = frozenset(
    {"running", "queued", "scheduled", "deferred", "up_for_retry", "up_for_reschedule", "restarting"}
)
# Newest ledger runs whose confs name buckets (a ledger holds one row per DAG run).
LEDGER_RUN_LIMIT = 5000
GCS_TIMEOUT_S = 60.0


def janitor_buckets() -> list[str]:
    """``[tpu_rl] janitor_buckets``: comma-separated bucket names (``gs://`` prefixes allowed)."""
    raw = conf.get("tpu_rl", "janitor_buckets", fallback="") or ""
    return _unique(part.strip().removeprefix("gs://").strip("/") for part in raw.split(","))


def orphan_minutes() -> float:
    """``[tpu_rl] orphan_minutes``: how long a running DAG run may have no live task (default 30)."""
    return conf.getfloat("tpu_rl", "orphan_minutes", fallback=30.0)


def _unique(names: Iterable[str | None]) -> list[str]:
    return list(dict.fromkeys(name for name in names if name))


def ledger_buckets(conn_id: str | None = None) -> list[str]:
    """Buckets named by the run confs in the run ledger, newest runs first (read only).

    A ledger that does not exist yet (the default SQLite file not created) or cannot be read
    names none: the janitor then goes by ``[tpu_rl] janitor_buckets`` alone.
    """
    return ledger_conf_values("bucket", conn_id)


def ledger_projects(conn_id: str | None = None) -> list[str]:
    """Projects named by the run confs in the run ledger: scanned even when their bucket (and the
    resource records in it) was deleted — a cluster is found by its labels there."""
    return ledger_conf_values("project", conn_id)


def ledger_exists(conn_id: str | None = None) -> bool:
    """Whether there is a run ledger to read: its connection is defined, or (the default one
    undefined) the default SQLite file exists."""
    from airflow_provider_tpu_rl.ledger.hook import DEFAULT_CONN_ID, default_sqlite_path

    conn_id = conn_id or DEFAULT_CONN_ID
    try:
        BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return conn_id == DEFAULT_CONN_ID and default_sqlite_path().is_file()
    return True


def ledger_conf_values(key: str, conn_id: str | None = None) -> list[str]:
    """The values of one conf key over the ledger's runs, newest first (read only)."""
    from airflow_provider_tpu_rl.ledger.dialects import Dialect
    from airflow_provider_tpu_rl.ledger.hook import DEFAULT_CONN_ID, RunLedger

    conn_id = conn_id or DEFAULT_CONN_ID
    if not ledger_exists(conn_id):
        return []
    try:
        ledger = RunLedger(conn_id, auto_migrate=False)
        table = f"`{ledger.bigquery_dataset}.runs`" if ledger.dialect is Dialect.BIGQUERY else "runs"
        rows = ledger.hook.get_records(
            f"SELECT conf_json FROM {table} ORDER BY recorded_at DESC LIMIT {LEDGER_RUN_LIMIT}"  # noqa: S608
        )
    except Exception as error:  # the janitor must not stop at an unreadable ledger
        log.warning("janitor: the run ledger names no bucket (%s)", error)
        return []
    return _unique(_conf_value(row[0], key) for row in rows or [])


def _conf_value(conf_json: Any, key: str) -> str | None:
    try:
        value = json.loads(conf_json) if isinstance(conf_json, str) else None
    except ValueError:
        return None
    found = value.get(key) if isinstance(value, dict) else None
    return found.strip() if isinstance(found, str) and found.strip() else None


def record_project(record: Mapping[str, Any]) -> str | None:
    """The project of a resource record (a cluster's ``cluster.project``, a VM's ``conf.project``)."""
    for section in ("cluster", "conf"):
        values = record.get(section)
        if isinstance(values, Mapping) and isinstance(values.get("project"), str) and values["project"]:
            return str(values["project"])
    project = record.get("project")
    return project if isinstance(project, str) and project else None


def read_bucket_records(gcp_conn_id: str, bucket: str) -> dict[str, dict[str, Any]]:
    """The resource records in ``gs://bucket/tpu-rl/resources/``, by resource name."""
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

    client = GCSHook(gcp_conn_id=gcp_conn_id).get_conn()
    records: dict[str, dict[str, Any]] = {}
    for blob in client.list_blobs(bucket, prefix=gke.RECORD_PREFIX, timeout=GCS_TIMEOUT_S):
        name = str(blob.name)[len(gke.RECORD_PREFIX) :]
        if "/" in name or not name.endswith(".json"):
            continue
        try:
            record = json.loads(blob.download_as_bytes(timeout=GCS_TIMEOUT_S))
        except ValueError:
            log.warning("janitor: gs://%s/%s is not JSON; skipped", bucket, blob.name)
            continue
        if isinstance(record, dict):
            records[name.removesuffix(".json")] = record
    return records


@dataclass(frozen=True)
class JanitorSources:
    """The projects to scan and where each resource's record is (by project and resource name)."""

    projects: list[str]
    buckets: list[str] = field(default_factory=list)
    record_buckets: dict[tuple[str, str], str] = field(default_factory=dict)

    def bucket_of(self, project: str, name: str) -> str | None:
        """The bucket whose record names resource ``name`` of ``project`` (None: no record seen)."""
        return self.record_buckets.get((project, name))


def discover_sources(
    projects: Sequence[str] | None,
    *,
    gcp_conn_id: str = "google_cloud_default",
    ledger_conn_id: str | None = None,
    buckets: Sequence[str] | None = None,
) -> JanitorSources:
    """Buckets from ``[tpu_rl] janitor_buckets`` and the ledger (or ``buckets``), and the projects to scan.

    ``projects`` given: exactly those. Empty: the connection's project plus every project the
    buckets' resource records and the ledger's run confs name. An unreadable bucket is logged and
    skipped; its runs' projects are still scanned (managed clusters and VMs are found by their
    labels, their records or not).
    """
    known = _unique(
        [*(buckets if buckets is not None else janitor_buckets()), *ledger_buckets(ledger_conn_id)]
    )
    record_buckets: dict[tuple[str, str], str] = {}
    for bucket in known:
        try:
            records = read_bucket_records(gcp_conn_id, bucket)
        except Exception as error:
            log.warning("janitor: cannot read the resource records of gs://%s (%s); skipped", bucket, error)
            continue
        for name, record in records.items():
            project = record_project(record)
            if project:
                record_buckets.setdefault((project, name), bucket)
    if projects:
        scan = _unique(projects)
    else:
        scan = _unique(
            [
                _connection_project(gcp_conn_id),
                *(project for project, _ in record_buckets),
                *ledger_projects(ledger_conn_id),  # also when a run's bucket (and records) is gone
            ]
        )
    if not scan:
        raise AirflowException(
            f"no projects given and connection {gcp_conn_id!r} names no project; no resource record in "
            f"the known buckets ({', '.join(known) or 'none: set [tpu_rl] janitor_buckets'}) names one"
        )
    return JanitorSources(scan, known, record_buckets)


def _connection_project(gcp_conn_id: str) -> str | None:
    from airflow.providers.google.common.hooks.base_google import GoogleBaseHook

    try:
        return GoogleBaseHook(gcp_conn_id=gcp_conn_id).project_id or None
    except AirflowNotFoundException:
        return None


class RunProbe(Protocol):
    """The state of a DAG run and of its task instances, as the metadata database has them."""

    def dagrun_state(self, dag_id: str, run_id: str) -> str | None:
        """The DAG run's state, or None when the run is unknown here."""

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None] | None:
        """Task instance (``task_id`` or ``task_id_mapindex``) → state; None when not readable."""


def _state_text(state: Any) -> str | None:
    if state is None:
        return None
    return str(getattr(state, "value", state))


class TaskSdkRuns:
    """Airflow 3: the Task SDK's ``get_dagrun_state`` / ``get_task_states`` of the running task."""

    def __init__(self, ti: Any) -> None:
        self._ti = ti

    def dagrun_state(self, dag_id: str, run_id: str) -> str | None:
        try:
            return _state_text(self._ti.get_dagrun_state(dag_id=dag_id, run_id=run_id))
        except Exception as error:  # a run deleted from the database, or of another Airflow
            log.warning("janitor: no state for DAG run %s/%s (%s)", dag_id, run_id, error)
            return None

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None] | None:
        try:
            by_run = self._ti.get_task_states(dag_id=dag_id, run_ids=[run_id])
        except Exception as error:
            log.warning("janitor: no task states for DAG run %s/%s (%s)", dag_id, run_id, error)
            return None
        return {str(task): _state_text(state) for task, state in (by_run.get(run_id) or {}).items()}


class MetadataDbRuns:
    """Airflow 2: the metadata database, as every Airflow 2 task may read it."""

    def dagrun_state(self, dag_id: str, run_id: str) -> str | None:
        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session

        with create_session() as session:
            row = session.query(DagRun.state).filter_by(dag_id=dag_id, run_id=run_id).one_or_none()
            return None if row is None else _state_text(row[0])

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None] | None:
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session

        with create_session() as session:
            rows = (
                session.query(TaskInstance.task_id, TaskInstance.map_index, TaskInstance.state)
                .filter_by(dag_id=dag_id, run_id=run_id)
                .all()
            )
            return {
                (task_id if map_index < 0 else f"{task_id}_{map_index}"): _state_text(state)
                for task_id, map_index, state in rows
            }


class DagRunStateOnly:
    """A ``run_state(dag_id, run_id)`` callable as a probe that cannot read task states."""

    def __init__(self, run_state: Any) -> None:
        self._run_state = run_state

    def dagrun_state(self, dag_id: str, run_id: str) -> str | None:
        return _state_text(self._run_state(dag_id, run_id))

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None] | None:
        return None


def run_probe(context: Mapping[str, Any]) -> RunProbe | None:
    """How this task reads other runs' states: the Task SDK (Airflow 3.1+) or the database (Airflow 2)."""
    ti = context.get("ti")
    if callable(getattr(ti, "get_dagrun_state", None)) and callable(getattr(ti, "get_task_states", None)):
        return TaskSdkRuns(ti)
    if not AIRFLOW_V_3_0_PLUS:
        return MetadataDbRuns()
    return None  # Airflow 3.0: no way to read another run's state; the janitor goes by expiry


def run_finished(probe: RunProbe | None, holder: str) -> bool:
    """Whether the DAG run ``<dag_id>/<run_id>`` has ended (success or failed), as this Airflow
    knows it; an unknown run (another Airflow, or Airflow 3.0) is not known to have ended."""
    if probe is None or "/" not in holder:
        return False
    dag_id, run_id = holder.split("/", 1)
    try:
        return probe.dagrun_state(dag_id, run_id) in ("success", "failed")
    except Exception:  # a state this task cannot read: the claim's expiry decides
        return False


__all__ = [
    "ALIVE_TASK_STATES",
    "DagRunStateOnly",
    "JanitorSources",
    "MetadataDbRuns",
    "RunProbe",
    "TaskSdkRuns",
    "discover_sources",
    "janitor_buckets",
    "ledger_buckets",
    "ledger_conf_values",
    "ledger_exists",
    "ledger_projects",
    "orphan_minutes",
    "read_bucket_records",
    "record_project",
    "run_finished",
    "run_probe",
]
