"""The run ledger behind an Airflow connection (common.sql hooks: SQLite, PostgreSQL; or BigQuery).

Connection ``tpu_rl_ledger`` picks the database:

- ``sqlite``: ``AIRFLOW_CONN_TPU_RL_LEDGER='sqlite://%2Fpath%2Fto%2Fledger.db'`` (the path is the
  URI's host, percent-encoded; :func:`sqlite_connection_uri` builds it);
- ``postgres``: ``AIRFLOW_CONN_TPU_RL_LEDGER='postgresql://user:password@host:5432/database'``;
- ``gcpbigquery`` or ``google_cloud_platform``: BigQuery; tables go to the dataset named by the
  connection's extra ``dataset`` (default ``tpu_rl_ledger``) in the connection's project.

When ``tpu_rl_ledger`` is not defined, the ledger is the SQLite file
``$AIRFLOW_HOME/tpu_rl_ledger.db`` (``~/airflow/tpu_rl_ledger.db`` without ``AIRFLOW_HOME``).
Every write is an upsert, so a retried or re-run ledger task never adds duplicate rows.

A DAG file imports this module for :func:`step_callbacks`, so it imports no database hook or client:
the SQL hooks and BigQuery are imported when the ledger is first used. A connection that is missing
(other than the default) or of a type the ledger does not support is a :class:`ConfigurationError`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import cache, cached_property
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

from airflow.providers.common.compat.sdk import BaseHook

from airflow_provider_tpu_rl.compat import AirflowNotFoundException
from airflow_provider_tpu_rl.exceptions import ConfigurationError
from airflow_provider_tpu_rl.ledger.collect import collect_run_from_context, state_name
from airflow_provider_tpu_rl.ledger.dialects import (
    RUN_ARTIFACTS,
    RUN_METRICS,
    RUN_STEPS,
    RUN_VM_SPANS,
    RUNS,
    Dialect,
    TableSpec,
    adapt_row,
    artifact_row,
    convert_params,
    dedupe_rows,
    dialect_from_conn_type,
    merge_parameters,
    merge_sql,
    metric_row,
    parameter_names,
    run_row,
    step_row,
    upsert_sql,
    vm_span_row,
)
from airflow_provider_tpu_rl.ledger.records import (
    ArtifactRecord,
    MetricRecord,
    RunClosing,
    RunRecord,
    RunSummary,
    StepRecord,
    as_utc,
    make_run_id,
    task_instance_start,
)
from airflow_provider_tpu_rl.ledger.schema import (
    BOOTSTRAP_VERSION,
    DEFAULT_SQLITE_FILE,
    load_migrations,
    load_query,
)

log = logging.getLogger(__name__)

DEFAULT_CONN_ID = "tpu_rl_ledger"
DEFAULT_BIGQUERY_DATASET = "tpu_rl_ledger"
SQLITE_BUSY_TIMEOUT_MS = 30_000
_POSTGRES_MIGRATION_LOCK = 7_301_946_215  # pg_advisory_xact_lock key: one migrator at a time

Row = dict[str, Any]


def default_sqlite_path() -> Path:
    """``$AIRFLOW_HOME/tpu_rl_ledger.db``: the ledger when connection ``tpu_rl_ledger`` is not defined."""
    return Path(os.environ.get("AIRFLOW_HOME") or "~/airflow").expanduser() / DEFAULT_SQLITE_FILE


def sqlite_connection_uri(path: str | os.PathLike[str]) -> str:
    """An Airflow connection URI for a SQLite file (``AIRFLOW_CONN_TPU_RL_LEDGER``)."""
    return "sqlite://" + quote(str(Path(path).resolve()), safe="")


@cache
def _sqlite_file_hook_class() -> type[Any]:
    """``SqliteHook`` on a file (imported on first use, not when a DAG file imports this module)."""
    from airflow.providers.sqlite.hooks.sqlite import SqliteHook

    class _SqliteFileHook(SqliteHook):
        """A SqliteHook on a file, for the default ledger that has no Airflow connection."""

        def __init__(self, path: Path) -> None:
            super().__init__()
            self._path = path

        def get_uri(self) -> str:
            return f"sqlite:///{self._path}"

    return _SqliteFileHook


class _Session(Protocol):
    """One unit of work on the ledger database."""

    def execute(self, sql: str, params: Mapping[str, Any]) -> None: ...

    def upsert(self, table: TableSpec, rows: Sequence[Row]) -> None: ...

    def fetch(self, sql: str, params: Mapping[str, Any]) -> list[Row]: ...


class _DbApiSession:
    """A transaction on a DB-API connection from a common.sql hook (SQLite or PostgreSQL)."""

    def __init__(self, connection: Any, dialect: Dialect) -> None:
        self._connection = connection
        self._dialect = dialect

    def execute(self, sql: str, params: Mapping[str, Any]) -> None:
        self.changed(sql, params)

    def changed(self, sql: str, params: Mapping[str, Any]) -> int:
        """Run one statement; the rows it changed (the driver's ``rowcount``)."""
        cursor = self._connection.cursor()
        try:
            cursor.execute(convert_params(sql, self._dialect), adapt_row(params, self._dialect))
            return int(cursor.rowcount or 0)
        finally:
            cursor.close()

    def upsert(self, table: TableSpec, rows: Sequence[Row]) -> None:
        if not rows:
            return
        cursor = self._connection.cursor()
        try:
            cursor.executemany(
                upsert_sql(table, self._dialect), [adapt_row(row, self._dialect) for row in rows]
            )
        finally:
            cursor.close()

    def fetch(self, sql: str, params: Mapping[str, Any]) -> list[Row]:
        cursor = self._connection.cursor()
        try:
            cursor.execute(convert_params(sql, self._dialect), adapt_row(params, self._dialect))
            names = [column[0] for column in cursor.description]
            return [dict(zip(names, values, strict=True)) for values in cursor.fetchall()]
        finally:
            cursor.close()


def _bigquery_type(value: Any) -> str:
    if isinstance(value, bool):
        return "BOOL"
    if isinstance(value, int):
        return "INT64"
    if isinstance(value, float):
        return "FLOAT64"
    if isinstance(value, datetime):
        return "TIMESTAMP"
    return "STRING"


class _BigQuerySession:
    """Query jobs in the ledger's dataset (each call is one job; BigQuery has no DB-API transaction)."""

    def __init__(self, client: Any, dataset: str) -> None:
        self._client = client
        self._dataset = dataset

    def _run(self, sql: str, parameters: Iterable[tuple[str, str, Any]]) -> Any:
        from google.cloud import bigquery

        job_config = bigquery.QueryJobConfig(
            default_dataset=self._dataset,
            query_parameters=[bigquery.ScalarQueryParameter(*parameter) for parameter in parameters],
        )
        return self._client.query(sql, job_config=job_config).result()

    @staticmethod
    def _parameters(sql: str, params: Mapping[str, Any]) -> list[tuple[str, str, Any]]:
        return [
            (name, _bigquery_type(params[name]), adapt_row(params, Dialect.BIGQUERY)[name])
            for name in parameter_names(sql)
        ]

    def execute(self, sql: str, params: Mapping[str, Any]) -> None:
        self._run(convert_params(sql, Dialect.BIGQUERY), self._parameters(sql, params))

    def upsert(self, table: TableSpec, rows: Sequence[Row]) -> None:
        self.record_script([(table, rows)])

    def record_script(self, tables: Sequence[tuple[TableSpec, Sequence[Row]]]) -> None:
        """One multi-statement transaction with a MERGE per table."""
        script, parameters = bigquery_record_script(tables)
        if script:
            self._run(script, parameters)

    def fetch(self, sql: str, params: Mapping[str, Any]) -> list[Row]:
        result = self._run(convert_params(sql, Dialect.BIGQUERY), self._parameters(sql, params))
        return [dict(row.items()) for row in result]


def bigquery_record_script(
    tables: Sequence[tuple[TableSpec, Sequence[Row]]],
) -> tuple[str, list[tuple[str, str, Any]]]:
    """A BigQuery script ``BEGIN TRANSACTION; MERGE ...; COMMIT TRANSACTION;`` and its parameters."""
    statements: list[str] = []
    parameters: list[tuple[str, str, Any]] = []
    for table, rows in tables:
        unique = dedupe_rows(table, rows)
        if not unique:
            continue
        prefix = f"{table.name}_r"
        statements.append(merge_sql(table, len(unique), prefix=prefix))
        parameters.extend(merge_parameters(table, unique, prefix=prefix))
    if not statements:
        return "", []
    script = "BEGIN TRANSACTION;\n" + ";\n".join(statements) + ";\nCOMMIT TRANSACTION;\n"
    return script, parameters


class RunLedger:
    """Record pipeline runs and read them back, through Airflow connection ``conn_id``."""

    def __init__(
        self,
        conn_id: str = DEFAULT_CONN_ID,
        *,
        bigquery_dataset: str | None = None,
        auto_migrate: bool = True,
    ) -> None:
        self.conn_id = conn_id
        self._bigquery_dataset = bigquery_dataset
        self._auto_migrate = auto_migrate
        self._migrated = False

    @cached_property
    def _connection(self) -> Any | None:
        """The Airflow connection, or None when the default connection is not defined."""
        try:
            return BaseHook.get_connection(self.conn_id)
        except AirflowNotFoundException as err:
            if self.conn_id != DEFAULT_CONN_ID:
                raise ConfigurationError(
                    f"run ledger: connection {self.conn_id!r} is not defined (only the default "
                    f"{DEFAULT_CONN_ID!r} falls back to {default_sqlite_path()})"
                ) from err
            return None

    @cached_property
    def dialect(self) -> Dialect:
        """sqlite, postgres or bigquery, from the connection type."""
        if self._connection is None:
            return Dialect.SQLITE
        try:
            return dialect_from_conn_type(self._connection.conn_type)
        except ValueError as err:
            raise ConfigurationError(f"run ledger: connection {self.conn_id!r}: {err}") from err

    @cached_property
    def hook(self) -> Any:
        """The hook behind the ledger: a common.sql DbApiHook (SqliteHook, PostgresHook, BigQueryHook)."""
        if self._connection is None:
            path = default_sqlite_path()
            path.parent.mkdir(parents=True, exist_ok=True)
            log.debug("connection %s is not defined; the run ledger is %s", self.conn_id, path)
            return _sqlite_file_hook_class()(path)
        if self.dialect is Dialect.BIGQUERY:
            from airflow.providers.google.cloud.hooks.bigquery import BigQueryHook

            return BigQueryHook(gcp_conn_id=self.conn_id, use_legacy_sql=False)
        return self._connection.get_hook()

    @property
    def location(self) -> str:
        """Where the ledger is, for messages (no password)."""
        if self._connection is None:
            return str(default_sqlite_path())
        if self.dialect is Dialect.BIGQUERY:
            return f"bigquery dataset {self.bigquery_dataset}"
        if self.dialect is Dialect.SQLITE:
            return self._connection.host or "(in-memory sqlite)"
        port = f":{self._connection.port}" if self._connection.port else ""
        return f"postgres {self._connection.host}{port}/{self._connection.schema}"

    @property
    def bigquery_dataset(self) -> str:
        """``project.dataset`` of the BigQuery ledger."""
        dataset = self._bigquery_dataset
        if dataset is None and self._connection is not None:
            dataset = (self._connection.extra_dejson or {}).get("dataset")
        dataset = dataset or DEFAULT_BIGQUERY_DATASET
        if "." in dataset:
            return dataset
        return f"{self.hook.project_id}.{dataset}"

    @contextmanager
    def _session(self, *, write: bool, migrating: bool = False) -> Iterator[_Session]:
        if self.dialect is Dialect.BIGQUERY:
            yield _BigQuerySession(
                self.hook.get_client(project_id=self.hook.project_id), self.bigquery_dataset
            )
            return
        connection = self.hook.get_conn()
        try:
            if self.dialect is Dialect.SQLITE:
                connection.isolation_level = None  # explicit transactions below
                connection.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
                connection.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            session = _DbApiSession(connection, self.dialect)
            if migrating and self.dialect is Dialect.POSTGRES:
                session.fetch(
                    "SELECT pg_advisory_xact_lock(:lock_key) AS locked",
                    {"lock_key": _POSTGRES_MIGRATION_LOCK},
                )
            yield session
        except BaseException:
            connection.rollback()
            raise
        else:
            connection.commit()
        finally:
            connection.close()

    def apply_migrations(self) -> list[int]:
        """Apply the migrations not applied yet; returns their versions (empty when up to date)."""
        migrations = load_migrations(self.dialect)
        bootstrap = migrations[BOOTSTRAP_VERSION - 1]
        applied_now: list[int] = []
        if self.dialect is Dialect.BIGQUERY:
            self._create_bigquery_dataset()
        with self._session(write=True, migrating=True) as session:
            for statement in bootstrap.statements:
                session.execute(statement, {})
            rows = session.fetch("SELECT version FROM schema_migrations", {})
            applied = {int(row["version"]) for row in rows}
            for migration in migrations:
                if migration.version in applied:
                    continue
                log.info("ledger: applying migration %04d_%s", migration.version, migration.name)
                if self.dialect is Dialect.BIGQUERY:
                    session.execute(migration.sql, {})  # one script job per file
                else:
                    for statement in migration.statements:
                        session.execute(statement, {})
                session.execute(
                    "INSERT INTO schema_migrations (version, applied_at) VALUES (:version, :applied_at)",
                    {"version": migration.version, "applied_at": datetime.now(UTC)},
                )
                applied_now.append(migration.version)
        self._migrated = True
        return applied_now

    def _create_bigquery_dataset(self) -> None:
        client = self.hook.get_client(project_id=self.hook.project_id)
        client.create_dataset(self.bigquery_dataset, exists_ok=True)

    def _ensure_schema(self) -> None:
        if self._auto_migrate and not self._migrated:
            self.apply_migrations()

    def record(
        self,
        run: RunRecord,
        steps: Iterable[StepRecord] = (),
        metrics: Iterable[MetricRecord] = (),
        artifacts: Iterable[ArtifactRecord] = (),
        *,
        recorded_at: datetime | None = None,
    ) -> None:
        """Upsert a run with its steps, metrics, artifacts and CPU VM spans (``run.vm_spans``) in
        one transaction."""
        self._ensure_schema()
        when = recorded_at or datetime.now(UTC)
        run_id = run.run_id
        tables: list[tuple[TableSpec, Sequence[Row]]] = [
            (RUNS, [run_row(run, when)]),
            (RUN_STEPS, dedupe_rows(RUN_STEPS, [step_row(run_id, step, when) for step in steps])),
            (RUN_METRICS, dedupe_rows(RUN_METRICS, [metric_row(run_id, metric, when) for metric in metrics])),
            (
                RUN_ARTIFACTS,
                dedupe_rows(RUN_ARTIFACTS, [artifact_row(run_id, artifact, when) for artifact in artifacts]),
            ),
            (
                RUN_VM_SPANS,
                dedupe_rows(RUN_VM_SPANS, [vm_span_row(run_id, span, when) for span in run.vm_spans]),
            ),
        ]
        self._write(tables)

    def record_steps(
        self, run_id: str, steps: Iterable[StepRecord], *, recorded_at: datetime | None = None
    ) -> None:
        """Upsert task steps of a run (a step keeps its latest try)."""
        self._ensure_schema()
        when = recorded_at or datetime.now(UTC)
        self._write([(RUN_STEPS, dedupe_rows(RUN_STEPS, [step_row(run_id, step, when) for step in steps]))])

    def _write(self, tables: Sequence[tuple[TableSpec, Sequence[Row]]]) -> None:
        with self._session(write=True) as session:
            if isinstance(session, _BigQuerySession):
                session.record_script(tables)
                return
            for table, rows in tables:
                session.upsert(table, rows)

    def recorded_steps(self, run_id: str) -> dict[str, StepRecord]:
        """The steps of a run already in the ledger, by task id."""
        self._ensure_schema()
        sql = (
            "SELECT task_id, state, try_number, started_at, ended_at, job_name "
            "FROM run_steps WHERE run_id = :run_id"
        )
        with self._session(write=False) as session:
            rows = session.fetch(sql, {"run_id": run_id})
        return {
            row["task_id"]: StepRecord(
                task_id=row["task_id"],
                state=row["state"],
                try_number=row["try_number"],
                started_at=as_utc(row["started_at"]),
                ended_at=as_utc(row["ended_at"]),
                job_name=row["job_name"],
            )
            for row in rows
        }

    def run_metrics(self, run_id: str) -> list[MetricRecord]:
        """The metrics of one run as the ledger holds them, by phase, step and name."""
        self._ensure_schema()
        sql = (
            "SELECT phase, step, metric_name, metric_value FROM run_metrics "
            "WHERE run_id = :run_id ORDER BY phase, step, metric_name"
        )
        with self._session(write=False) as session:
            rows = session.fetch(sql, {"run_id": run_id})
        return [
            MetricRecord(
                str(row["phase"]),
                int(row["step"]),
                str(row["metric_name"]),
                None if row["metric_value"] is None else float(row["metric_value"]),
            )
            for row in rows
        ]

    def _query(self, name: str, params: Mapping[str, Any]) -> list[Row]:
        self._ensure_schema()
        with self._session(write=False) as session:
            rows = session.fetch(load_query(name), params)
        return [_normalize(row) for row in rows]

    @staticmethod
    def _model_params(model: str | None) -> dict[str, Any]:
        return {"any_model": 1 if model is None else 0, "model": model}

    @staticmethod
    def _check_limit(limit: int) -> int:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        return limit

    def latest_runs(self, model: str | None = None, limit: int = 20) -> list[RunSummary]:
        """Newest runs first, optionally of one model."""
        return self._summaries(model=model, run_id=None, limit=self._check_limit(limit))

    def run_summary(self, run_id: str) -> RunSummary | None:
        """One run's ``latest_runs`` row, or None when the ledger does not hold it."""
        found = self._summaries(model=None, run_id=run_id, limit=1)
        return found[0] if found else None

    def _summaries(self, *, model: str | None, run_id: str | None, limit: int) -> list[RunSummary]:
        params = {
            **self._model_params(model),
            "any_run": 1 if run_id is None else 0,
            "run_id": run_id,
            "row_limit": limit,
        }
        return [RunSummary(**row) for row in self._query("latest_runs", params)]

    def run_artifacts(self, run_id: str) -> list[ArtifactRecord]:
        """Where one run's outputs are (checkpoints, export, curves), by kind and URI."""
        self._ensure_schema()
        sql = "SELECT kind, uri, step FROM run_artifacts WHERE run_id = :run_id ORDER BY kind, uri"
        with self._session(write=False) as session:
            rows = session.fetch(sql, {"run_id": run_id})
        return [
            ArtifactRecord(
                str(row["kind"]), str(row["uri"]), None if row["step"] is None else int(row["step"])
            )
            for row in rows
        ]

    def record_artifacts(
        self, run_id: str, artifacts: Iterable[ArtifactRecord], *, recorded_at: datetime | None = None
    ) -> None:
        """Upsert artifacts of a run already recorded (the curves, once uploaded)."""
        self._ensure_schema()
        when = recorded_at or datetime.now(UTC)
        rows = [artifact_row(run_id, artifact, when) for artifact in artifacts]
        self._write([(RUN_ARTIFACTS, dedupe_rows(RUN_ARTIFACTS, rows))])

    def running_runs(self, limit: int = 200) -> list[str]:
        """The run ids of the newest rows that still say ``running``."""
        self._ensure_schema()
        sql = (
            "SELECT run_id FROM runs WHERE state = 'running' "
            "ORDER BY recorded_at DESC, run_id DESC LIMIT :row_limit"
        )
        with self._session(write=False) as session:
            rows = session.fetch(sql, {"row_limit": self._check_limit(limit)})
        return [str(row["run_id"]) for row in rows]

    def close_run(self, closing: RunClosing, *, recorded_at: datetime | None = None) -> bool:
        """Close a row that still says ``running``: its end, duration, state, reason and billed TPU
        time so far. A row already closed (or not in the ledger) is left as it is: False."""
        self._ensure_schema()
        when = recorded_at or datetime.now(UTC)
        select = "SELECT started_at, usd_per_chip_hour FROM runs WHERE run_id = :run_id AND state = 'running'"
        with self._session(write=True) as session:
            found = session.fetch(select, {"run_id": closing.run_id})
            if not found:
                return False
            started = as_utc(found[0]["started_at"])
            price = found[0]["usd_per_chip_hour"]
            price = closing.usd_per_chip_hour if price is None else float(price)
            billed = closing.billed_chip_seconds
            values: dict[str, Any] = {
                "state": closing.state,
                "ended_at": as_utc(closing.ended_at),
                "end_reason": closing.reason,
                "recorded_at": as_utc(when),
                "duration_seconds": (
                    None if started is None else max(0.0, (closing.ended_at - started).total_seconds())
                ),
                "billed_spans_json": closing.billed_spans_json,
                "billed_chip_seconds": billed,
                "chip_hours": None if billed is None else billed / 3600.0,
                "usd_per_chip_hour": price,
                "estimated_cost_usd": None if billed is None or price is None else billed / 3600.0 * price,
            }
            known = {name: value for name, value in values.items() if value is not None}
            # typed parameters only (BigQuery types a NULL as STRING); still running, or untouched.
            # The column names are the literal keys above, never input.
            sql = (
                "UPDATE runs SET "  # noqa: S608
                + ", ".join(f"{name} = :{name}" for name in known)
                + " WHERE run_id = :run_id AND state = 'running'"
            )
            params = {**known, "run_id": closing.run_id}
            if isinstance(session, _DbApiSession):
                return session.changed(sql, params) > 0
            session.execute(sql, params)
            return True

    def reward_trend(self, model: str | None = None) -> list[Row]:
        """Pre and post mean reward of every run that has one, per model, oldest first."""
        return self._query("reward_trend", self._model_params(model))

    def failed_steps(self, model: str | None = None, limit: int = 50) -> list[Row]:
        """Failed and upstream_failed tasks of the newest runs (``tpu-rl runs --failed``)."""
        return self._query(
            "failed_steps", {**self._model_params(model), "row_limit": self._check_limit(limit)}
        )


_TIMESTAMP_COLUMNS = frozenset(
    {
        "started_at",
        "ended_at",
        "cluster_started_at",
        "cluster_ended_at",
        "train_started_at",
        "train_ended_at",
        "recorded_at",
    }
)


def _normalize(row: Row) -> Row:
    """Timestamps as aware UTC datetimes whatever the driver returned (SQLite gives text)."""
    return {name: as_utc(value) if name in _TIMESTAMP_COLUMNS else value for name, value in row.items()}


def record_run_from_context(
    context: Mapping[str, Any],
    *,
    model: str,
    chips: int | None,
    conn_id: str = DEFAULT_CONN_ID,
    refusal: str | None = None,
    settings: Mapping[str, Any] | None = None,
    gke_cluster: tuple[str | None, str | None] = (None, None),
    **collect_options: Any,
) -> RunRecord:
    """The ledger task's body: collect the run from the context and upsert it; returns the run.

    ``refusal`` is why the run was refused before anything was spent (``refused at validate: ...``);
    ``settings`` what it was asked to do (:attr:`RunRecord.settings`); ``gke_cluster`` its GKE
    cluster and where it came from (:func:`~airflow_provider_tpu_rl.ledger.records.gke_cluster`).
    ``collect_options`` go to :func:`~airflow_provider_tpu_rl.ledger.collect.collect_run_from_context`
    (cluster_task_ids, train_task_id, ...). Steps that :func:`step_callbacks` recorded fill in what
    the context does not know.
    """
    ledger = RunLedger(conn_id)
    dag_run = context["dag_run"]
    recorded = ledger.recorded_steps(make_run_id(dag_run.dag_id, dag_run.run_id))
    run, steps, metrics, artifacts = collect_run_from_context(
        context, model=model, chips=chips, recorded_steps=recorded, **collect_options
    )
    if refusal:
        run = dataclasses.replace(run, refusal=refusal)
    if settings is not None:
        run = dataclasses.replace(run, settings=dict(settings))
    run = dataclasses.replace(run, gke_cluster=gke_cluster[0], gke_cluster_origin=gke_cluster[1])
    ledger.record(run, steps, metrics, artifacts)
    # the run's stages (its tasks), not its training steps
    log.info(
        "ledger: recorded run %s (%s): %d stages, %d metrics, %d artifacts in %s",
        run.run_id,
        run.state,
        len(steps),
        len(metrics),
        len(artifacts),
        ledger.location,
    )
    return run


def record_run_started(
    context: Mapping[str, Any],
    *,
    model: str,
    chips: int | None,
    settings: Mapping[str, Any],
    conn_id: str = DEFAULT_CONN_ID,
    gke_cluster: tuple[str | None, str | None] = (None, None),
) -> RunRecord:
    """Upsert the DAG run as ``running`` with what it was asked to do (and its GKE cluster, as far
    as it is known before the deploy), once it is validated: the runs dashboard lists it while it
    runs. ``record_run``, its last teardown, replaces the state."""
    dag_run = context["dag_run"]
    run = RunRecord(
        dag_id=dag_run.dag_id,
        airflow_run_id=dag_run.run_id,
        model=model,
        state="running",
        started_at=as_utc(getattr(dag_run, "start_date", None)) or datetime.now(UTC),
        chips=chips,
        conf=dict(getattr(dag_run, "conf", None) or {}),
        settings=dict(settings),
        gke_cluster=gke_cluster[0],
        gke_cluster_origin=gke_cluster[1],
    )
    RunLedger(conn_id).record(run)
    return run


_CALLBACK_STATES = {
    "on_execute_callback": "running",
    "on_success_callback": "success",
    "on_failure_callback": "failed",
    "on_retry_callback": "up_for_retry",
}


# How long the step callbacks of one DAG reuse one ledger, its connection looked up once: a task's
# execute and end callbacks run in one process (``airflow dags test`` runs every task in one), and
# each lookup is an API call on Airflow 3 (a missing connection, the default's SQLite fallback, the
# slowest). Past it the next callback looks the connection up again: it may have changed since.
STEP_LEDGER_REUSE_SECONDS = 300.0


class _ReusedLedger:
    """A :class:`RunLedger` for ``conn_id``, made again when older than :data:`STEP_LEDGER_REUSE_SECONDS`."""

    def __init__(self, conn_id: str) -> None:
        self.conn_id = conn_id
        self._ledger: RunLedger | None = None
        self._made_at = 0.0

    def get(self) -> RunLedger:
        now = time.monotonic()
        if self._ledger is None or now - self._made_at > STEP_LEDGER_REUSE_SECONDS:
            self._ledger, self._made_at = RunLedger(self.conn_id), now
        return self._ledger


def step_callbacks(conn_id: str = DEFAULT_CONN_ID) -> dict[str, Callable[[Mapping[str, Any]], None]]:
    """Task callbacks that upsert each task's step (start, end, try number) into the ledger.

    Spread them into a DAG's ``default_args``. On Airflow 3 a task cannot read other task
    instances' times, so these rows are where the ledger task finds them; on Airflow 2.11's
    ``airflow dags test``, which sets no ``start_date`` (nor, at these callbacks, an ``end_date``),
    the callbacks' own times are the step's start and end. A ledger error is logged, never raised:
    the ledger must not fail a training task.
    """

    ledgers = _ReusedLedger(conn_id)

    def make(callback_state: str) -> Callable[[Mapping[str, Any]], None]:
        def record_step(context: Mapping[str, Any]) -> None:
            try:
                ti = context["ti"]
                state = (
                    callback_state if callback_state == "running" else state_name(ti.state) or callback_state
                )
                ledger = ledgers.get()
                run_id = make_run_id(ti.dag_id, ti.run_id)
                try_number = getattr(ti, "try_number", None)
                started_at = task_instance_start(ti)
                ended_at = None
                if callback_state == "running":
                    # Airflow 2.11's `dags test` sets no start_date; the execute callback runs at the start.
                    started_at = started_at or datetime.now(UTC)
                else:
                    # Nor an end_date at the task's own end callbacks there: they run at its end, and
                    # the start is the one the execute callback recorded for this try.
                    ended_at = as_utc(getattr(ti, "end_date", None)) or datetime.now(UTC)
                    if started_at is None:
                        recorded = ledger.recorded_steps(run_id).get(ti.task_id)
                        if recorded is not None and recorded.try_number == try_number:
                            started_at = recorded.started_at
                step = StepRecord(
                    task_id=ti.task_id,
                    state=state,
                    try_number=try_number,
                    started_at=started_at,
                    ended_at=ended_at,
                )
                ledger.record_steps(run_id, [step])
            except Exception:
                log.exception("ledger: could not record the step of this task; the task goes on")

        return record_step

    return {name: make(state) for name, state in _CALLBACK_STATES.items()}
