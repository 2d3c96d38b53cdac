"""Per-database SQL for the ledger: parameter styles, statement splitting, upserts (no Airflow import).

The SQL files use portable ``:name`` parameters. Each driver gets its own form:
SQLite keeps ``:name``, psycopg (PostgreSQL) gets ``%(name)s``, BigQuery gets ``@name``.
Upserts are ``INSERT ... ON CONFLICT (...) DO UPDATE`` on SQLite and PostgreSQL and ``MERGE`` on BigQuery.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from airflow_provider_tpu_rl.ledger.billing import VmSpan
from airflow_provider_tpu_rl.ledger.records import (
    ArtifactRecord,
    MetricRecord,
    RunRecord,
    StepRecord,
    as_utc,
)


class Dialect(StrEnum):
    """A database the ledger can write to."""

    SQLITE = "sqlite"
    POSTGRES = "postgres"
    BIGQUERY = "bigquery"


_CONN_TYPE_DIALECTS = {
    "sqlite": Dialect.SQLITE,
    "postgres": Dialect.POSTGRES,
    "postgresql": Dialect.POSTGRES,
    "google_cloud_platform": Dialect.BIGQUERY,
    "gcpbigquery": Dialect.BIGQUERY,
    "bigquery": Dialect.BIGQUERY,
}


def dialect_from_conn_type(conn_type: str | None) -> Dialect:
    """The ledger dialect of an Airflow connection type (sqlite, postgres, google_cloud_platform)."""
    dialect = _CONN_TYPE_DIALECTS.get((conn_type or "").lower())
    if dialect is None:
        supported = ", ".join(sorted(_CONN_TYPE_DIALECTS))
        raise ValueError(f"the run ledger does not support conn_type {conn_type!r}; use one of: {supported}")
    return dialect


# Quoted strings and comments are copied as they are; '::' is a PostgreSQL cast, not a parameter.
_SQL_TOKEN = re.compile(r"'(?:[^']|'')*'|--[^\n]*|/\*.*?\*/|::|:(?P<name>[A-Za-z_][A-Za-z0-9_]*)", re.DOTALL)


def convert_params(sql: str, dialect: Dialect) -> str:
    """Rewrite portable ``:name`` parameters into the driver's style.

    For PostgreSQL every literal ``%`` is doubled, as psycopg requires when parameters are passed.
    """
    pieces: list[str] = []
    position = 0
    for match in _SQL_TOKEN.finditer(sql):
        pieces.append(_escape_percent(sql[position : match.start()], dialect))
        name = match.group("name")
        if name is None:
            pieces.append(_escape_percent(match.group(0), dialect))
        elif dialect is Dialect.POSTGRES:
            pieces.append(f"%({name})s")
        elif dialect is Dialect.BIGQUERY:
            pieces.append(f"@{name}")
        else:
            pieces.append(f":{name}")
        position = match.end()
    pieces.append(_escape_percent(sql[position:], dialect))
    return "".join(pieces)


def _escape_percent(text: str, dialect: Dialect) -> str:
    return text.replace("%", "%%") if dialect is Dialect.POSTGRES else text


def parameter_names(sql: str) -> list[str]:
    """The distinct ``:name`` parameters of a portable statement, in order of appearance."""
    names: list[str] = []
    for match in _SQL_TOKEN.finditer(sql):
        name = match.group("name")
        if name is not None and name not in names:
            names.append(name)
    return names


_STATEMENT_TOKEN = re.compile(r"'(?:[^']|'')*'|--[^\n]*|/\*.*?\*/|;", re.DOTALL)
_COMMENT = re.compile(r"--[^\n]*|/\*.*?\*/", re.DOTALL)


_LEADING_COMMENTS = re.compile(r"\A(?:\s*--[^\n]*\n|\s*/\*.*?\*/)*\s*", re.DOTALL)


def split_statements(sql: str) -> list[str]:
    """Split a SQL script on ``;`` outside strings and comments.

    Leading comments of each statement are dropped, and so are empty and comment-only parts.
    """
    statements: list[str] = []
    start = 0
    for match in _STATEMENT_TOKEN.finditer(sql):
        if match.group(0) == ";":
            statements.append(sql[start : match.start()])
            start = match.end()
    statements.append(sql[start:])
    return [_LEADING_COMMENTS.sub("", text).strip() for text in statements if _COMMENT.sub("", text).strip()]


class Merge(StrEnum):
    """How an upsert combines a column's new value with the stored one."""

    REPLACE = "replace"  # the new value, even NULL
    COALESCE = "coalesce"  # the new value unless it is NULL
    NEWER_TRY = "newer_try"  # a newer try replaces; the same try coalesces
    FIRST_OF_TRY = "first_of_try"  # a newer try replaces; the same try keeps the stored value


@dataclass(frozen=True)
class Column:
    """A ledger column: its name, its BigQuery type (for query parameters) and its merge rule."""

    name: str
    bigquery_type: str
    merge: Merge = Merge.COALESCE


@dataclass(frozen=True)
class TableSpec:
    """A ledger table as the upsert generator sees it."""

    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    try_column: str | None = None  # rows with an older try than the stored one are ignored

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(column.name for column in self.columns)

    def column(self, name: str) -> Column:
        for column in self.columns:
            if column.name == name:
                return column
        raise KeyError(name)


RUNS = TableSpec(
    name="runs",
    key=("run_id",),
    columns=(
        Column("run_id", "STRING"),
        Column("dag_id", "STRING"),
        Column("airflow_run_id", "STRING"),
        Column("model", "STRING"),
        Column("state", "STRING", Merge.REPLACE),
        Column("started_at", "TIMESTAMP"),
        Column("ended_at", "TIMESTAMP"),
        Column("duration_seconds", "FLOAT64"),
        Column("chips", "INT64"),
        Column("cluster_started_at", "TIMESTAMP"),
        Column("cluster_ended_at", "TIMESTAMP"),
        Column("chip_hours", "FLOAT64"),
        Column("conf_json", "STRING"),
        Column("recorded_at", "TIMESTAMP", Merge.REPLACE),
        Column("train_started_at", "TIMESTAMP"),
        Column("train_ended_at", "TIMESTAMP"),
        Column("busy_chip_hours", "FLOAT64"),
        Column("usd_per_chip_hour", "FLOAT64"),
        Column("estimated_cost_usd", "FLOAT64"),
        Column("refusal", "STRING", Merge.REPLACE),
        Column("resumes", "INT64"),
        Column("steps_lost", "INT64"),
        Column("seconds_lost", "FLOAT64"),
        Column("settings_json", "STRING"),
        # written by promote_model; record_run's NULL keeps it
        Column("promotion", "STRING"),
        Column("billed_chip_seconds", "FLOAT64"),
        Column("billed_spans_json", "STRING"),
        Column("held_chip_hours", "FLOAT64"),
        # written by the janitor's close (RunLedger.close_run); record_run's NULL keeps it
        Column("end_reason", "STRING"),
        Column("gke_cluster", "STRING"),
        Column("gke_cluster_origin", "STRING"),
    ),
)

RUN_STEPS = TableSpec(
    name="run_steps",
    key=("run_id", "task_id"),
    try_column="try_number",
    columns=(
        Column("run_id", "STRING"),
        Column("task_id", "STRING"),
        Column("state", "STRING", Merge.NEWER_TRY),
        Column("try_number", "INT64"),
        # A deferred task starts again in the same try when its trigger fires: keep the first start.
        Column("started_at", "TIMESTAMP", Merge.FIRST_OF_TRY),
        Column("ended_at", "TIMESTAMP", Merge.NEWER_TRY),
        Column("duration_seconds", "FLOAT64", Merge.NEWER_TRY),
        Column("job_name", "STRING", Merge.NEWER_TRY),
        Column("recorded_at", "TIMESTAMP", Merge.REPLACE),
    ),
)

RUN_METRICS = TableSpec(
    name="run_metrics",
    key=("run_id", "phase", "step", "metric_name"),
    columns=(
        Column("run_id", "STRING"),
        Column("phase", "STRING"),
        Column("step", "INT64"),
        Column("metric_name", "STRING"),
        Column("metric_value", "FLOAT64", Merge.REPLACE),
        Column("recorded_at", "TIMESTAMP", Merge.REPLACE),
    ),
)

RUN_ARTIFACTS = TableSpec(
    name="run_artifacts",
    key=("run_id", "kind", "uri"),
    columns=(
        Column("run_id", "STRING"),
        Column("kind", "STRING"),
        Column("uri", "STRING"),
        Column("step", "INT64"),
        Column("recorded_at", "TIMESTAMP", Merge.REPLACE),
    ),
)

# One row per RUNNING span of a CPU VM the run used (the bake VM), keyed by the VM and its start:
# a retried record_run updates the row.
RUN_VM_SPANS = TableSpec(
    name="run_vm_spans",
    key=("run_id", "vm_name", "started_at"),
    columns=(
        Column("run_id", "STRING"),
        Column("vm_name", "STRING"),
        Column("started_at", "TIMESTAMP"),
        Column("purpose", "STRING"),
        Column("vm_zone", "STRING"),
        Column("machine_type", "STRING"),
        Column("ended_at", "TIMESTAMP"),
        Column("seconds", "FLOAT64"),
        Column("billed_seconds", "FLOAT64"),
        Column("recorded_at", "TIMESTAMP", Merge.REPLACE),
    ),
)


def _merged_value(table: TableSpec, column: Column, new: str, old: str) -> str:
    new_value, old_value = f"{new}.{column.name}", f"{old}.{column.name}"
    if column.merge is Merge.REPLACE:
        return new_value
    coalesced = f"COALESCE({new_value}, {old_value})"
    if column.merge is Merge.COALESCE or table.try_column is None:
        return coalesced
    newer = f"{new}.{table.try_column} > {old}.{table.try_column}"
    same_try = coalesced if column.merge is Merge.NEWER_TRY else f"COALESCE({old_value}, {new_value})"
    return f"CASE WHEN {newer} THEN {new_value} ELSE {same_try} END"


def _try_guard(table: TableSpec, new: str, old: str) -> str | None:
    if table.try_column is None:
        return None
    new_try, old_try = f"{new}.{table.try_column}", f"{old}.{table.try_column}"
    return f"({new_try} IS NULL OR {old_try} IS NULL OR {new_try} >= {old_try})"


def upsert_sql(table: TableSpec, dialect: Dialect) -> str:
    """A one-row upsert for SQLite or PostgreSQL, parameters named after the columns (driver style)."""
    if dialect is Dialect.BIGQUERY:
        raise ValueError("BigQuery has no ON CONFLICT: use merge_sql()")
    columns = table.column_names
    updates = [
        f"{column.name} = {_merged_value(table, column, 'excluded', table.name)}"
        for column in table.columns
        if column.name not in table.key
    ]
    sql = (
        f"INSERT INTO {table.name} ({', '.join(columns)})\n"
        f"VALUES ({', '.join(':' + name for name in columns)})\n"
        f"ON CONFLICT ({', '.join(table.key)}) DO UPDATE SET\n    " + ",\n    ".join(updates)
    )
    guard = _try_guard(table, "excluded", table.name)
    if guard:
        sql += f"\nWHERE {guard}"
    return convert_params(sql, dialect)


def merge_sql(table: TableSpec, row_count: int, *, prefix: str = "r") -> str:
    """A BigQuery ``MERGE`` of ``row_count`` rows; parameters are ``@<prefix><i>_<column>``."""
    if row_count < 1:
        raise ValueError("merge_sql needs at least one row")
    selects = [
        "SELECT "
        + ", ".join(f":{row_parameter(index, name, prefix)} AS {name}" for name in table.column_names)
        for index in range(row_count)
    ]
    on = " AND ".join(f"target.{name} = source.{name}" for name in table.key)
    updates = [
        f"{column.name} = {_merged_value(table, column, 'source', 'target')}"
        for column in table.columns
        if column.name not in table.key
    ]
    guard = _try_guard(table, "source", "target")
    matched = f"WHEN MATCHED AND {guard} THEN" if guard else "WHEN MATCHED THEN"
    columns = ", ".join(table.column_names)
    sql = (
        f"MERGE {table.name} AS target\n"
        "USING (\n    " + "\n    UNION ALL\n    ".join(selects) + "\n) AS source\n"
        f"ON {on}\n"
        f"{matched} UPDATE SET\n    " + ",\n    ".join(updates) + "\n"
        f"WHEN NOT MATCHED THEN INSERT ({columns})\n"
        f"VALUES ({', '.join('source.' + name for name in table.column_names)})"
    )
    return convert_params(sql, Dialect.BIGQUERY)


def row_parameter(index: int, column: str, prefix: str = "r") -> str:
    """The BigQuery parameter name of a column of row ``index`` in :func:`merge_sql`."""
    return f"{prefix}{index}_{column}"


def adapt_value(value: Any, dialect: Dialect) -> Any:
    """A Python value as the driver wants it: SQLite stores timestamps as ISO-8601 UTC text."""
    if isinstance(value, datetime):
        utc = as_utc(value)
        if dialect is Dialect.SQLITE and utc is not None:
            return utc.isoformat(timespec="microseconds")
        return utc
    return value


def adapt_row(row: Mapping[str, Any], dialect: Dialect) -> dict[str, Any]:
    """:func:`adapt_value` on every value of a row."""
    return {name: adapt_value(value, dialect) for name, value in row.items()}


def run_row(run: RunRecord, recorded_at: datetime) -> dict[str, Any]:
    """The ``runs`` row of a run."""
    return {
        "run_id": run.run_id,
        "dag_id": run.dag_id,
        "airflow_run_id": run.airflow_run_id,
        "model": run.model,
        "state": run.state,
        "started_at": as_utc(run.started_at),
        "ended_at": as_utc(run.ended_at),
        "duration_seconds": run.duration_seconds,
        "chips": run.chips,
        "cluster_started_at": as_utc(run.cluster_started_at),
        "cluster_ended_at": as_utc(run.cluster_ended_at),
        "chip_hours": run.chip_hours,
        "conf_json": run.conf_json,
        "recorded_at": as_utc(recorded_at),
        "train_started_at": as_utc(run.train_started_at),
        "train_ended_at": as_utc(run.train_ended_at),
        "busy_chip_hours": run.busy_chip_hours,
        "usd_per_chip_hour": run.usd_per_chip_hour,
        "estimated_cost_usd": run.estimated_cost_usd,
        "refusal": run.refusal,
        "resumes": run.resume_loss.resumes if run.resume_loss else None,
        "steps_lost": run.resume_loss.steps_lost if run.resume_loss else None,
        "seconds_lost": run.resume_loss.seconds_lost if run.resume_loss else None,
        "settings_json": run.settings_json,
        "promotion": run.promotion,
        "billed_chip_seconds": run.billed_chip_seconds,
        "billed_spans_json": run.billed_spans_json,
        "held_chip_hours": run.held_chip_hours,
        "end_reason": run.end_reason,
        "gke_cluster": run.gke_cluster,
        "gke_cluster_origin": run.gke_cluster_origin,
    }


def step_row(run_id: str, step: StepRecord, recorded_at: datetime) -> dict[str, Any]:
    """The ``run_steps`` row of a task's latest try."""
    return {
        "run_id": run_id,
        "task_id": step.task_id,
        "state": step.state,
        "try_number": step.try_number,
        "started_at": as_utc(step.started_at),
        "ended_at": as_utc(step.ended_at),
        "duration_seconds": step.duration_seconds,
        "job_name": step.job_name,
        "recorded_at": as_utc(recorded_at),
    }


def metric_row(run_id: str, metric: MetricRecord, recorded_at: datetime) -> dict[str, Any]:
    """The ``run_metrics`` row of a metric."""
    return {
        "run_id": run_id,
        "phase": metric.phase,
        "step": metric.step,
        "metric_name": metric.name,
        "metric_value": metric.value,
        "recorded_at": as_utc(recorded_at),
    }


def artifact_row(run_id: str, artifact: ArtifactRecord, recorded_at: datetime) -> dict[str, Any]:
    """The ``run_artifacts`` row of an artifact."""
    return {
        "run_id": run_id,
        "kind": artifact.kind,
        "uri": artifact.uri,
        "step": artifact.step,
        "recorded_at": as_utc(recorded_at),
    }


def vm_span_row(run_id: str, span: VmSpan, recorded_at: datetime) -> dict[str, Any]:
    """The ``run_vm_spans`` row of a CPU VM's span."""
    return {
        "run_id": run_id,
        "vm_name": span.name,
        "started_at": as_utc(span.started_at),
        "purpose": span.purpose,
        "vm_zone": span.zone or None,
        "machine_type": span.machine_type or None,
        "ended_at": as_utc(span.ended_at),
        "seconds": span.seconds,
        "billed_seconds": span.billed_seconds,
        "recorded_at": as_utc(recorded_at),
    }


def dedupe_rows(table: TableSpec, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows with distinct keys, the last one winning (a MERGE must not match a target row twice)."""
    by_key: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        by_key[tuple(row[name] for name in table.key)] = dict(row)
    return list(by_key.values())


def merge_parameters(
    table: TableSpec, rows: Sequence[Mapping[str, Any]], *, prefix: str = "r"
) -> list[tuple[str, str, Any]]:
    """``(name, BigQuery type, value)`` of every parameter of :func:`merge_sql` for these rows."""
    return [
        (
            row_parameter(index, column.name, prefix),
            column.bigquery_type,
            adapt_value(row[column.name], Dialect.BIGQUERY),
        )
        for index, row in enumerate(rows)
        for column in table.columns
    ]
