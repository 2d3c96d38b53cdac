"""Per-driver SQL: parameter styles, statement splitting, ON CONFLICT upserts and BigQuery MERGE."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
import sqlfluff

from airflow_provider_tpu_rl.ledger.dialects import (
    RUN_STEPS,
    RUNS,
    Dialect,
    adapt_value,
    convert_params,
    dedupe_rows,
    dialect_from_conn_type,
    merge_parameters,
    merge_sql,
    parameter_names,
    split_statements,
    upsert_sql,
)
from airflow_provider_tpu_rl.ledger.hook import bigquery_record_script
from tests.ledger.rows import LEDGER_TABLES

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("conn_type", "dialect"),
    [
        ("sqlite", Dialect.SQLITE),
        ("postgres", Dialect.POSTGRES),
        ("postgresql", Dialect.POSTGRES),
        ("google_cloud_platform", Dialect.BIGQUERY),
        ("gcpbigquery", Dialect.BIGQUERY),
    ],
)
def test_dialect_from_conn_type(conn_type: str, dialect: Dialect) -> None:
    assert dialect_from_conn_type(conn_type) is dialect


def test_unsupported_conn_type_names_the_supported_ones() -> None:
    with pytest.raises(ValueError, match=r"mysql.*gcpbigquery.*sqlite"):
        dialect_from_conn_type("mysql")


SQL = "SELECT ':not_a_param', x::text FROM t -- :nor_this\nWHERE a = :model AND b LIKE '5%' AND c = :model"


def test_convert_params_per_driver() -> None:
    assert convert_params(SQL, Dialect.SQLITE) == SQL
    assert convert_params(SQL, Dialect.POSTGRES) == (
        "SELECT ':not_a_param', x::text FROM t -- :nor_this\n"
        "WHERE a = %(model)s AND b LIKE '5%%' AND c = %(model)s"
    )
    assert convert_params(SQL, Dialect.BIGQUERY) == (
        "SELECT ':not_a_param', x::text FROM t -- :nor_this\nWHERE a = @model AND b LIKE '5%' AND c = @model"
    )
    assert parameter_names(SQL) == ["model"]


def test_split_statements_ignores_semicolons_in_strings_and_comments() -> None:
    script = (
        "-- header; not a split\nCREATE TABLE a (x TEXT DEFAULT ';');\n\n/* ; */\nSELECT 1;\n-- trailing\n"
    )
    assert split_statements(script) == ["CREATE TABLE a (x TEXT DEFAULT ';')", "SELECT 1"]


def test_upsert_sql_updates_on_the_key_and_guards_older_tries() -> None:
    sql = upsert_sql(RUN_STEPS, Dialect.POSTGRES)
    assert sql.startswith("INSERT INTO run_steps (run_id, task_id, state, try_number,")
    assert "ON CONFLICT (run_id, task_id) DO UPDATE SET" in sql
    assert "%(try_number)s" in sql
    assert "try_number = COALESCE(excluded.try_number, run_steps.try_number)" in sql
    assert sql.rstrip().endswith(
        "WHERE (excluded.try_number IS NULL OR run_steps.try_number IS NULL "
        "OR excluded.try_number >= run_steps.try_number)"
    )
    assert "run_id =" not in sql.split("DO UPDATE SET")[1]  # key columns are never updated
    assert ":run_id" in upsert_sql(RUN_STEPS, Dialect.SQLITE)
    with pytest.raises(ValueError, match="merge_sql"):
        upsert_sql(RUNS, Dialect.BIGQUERY)


@pytest.mark.parametrize("table", LEDGER_TABLES, ids=lambda table: table.name)
def test_upserts_parse_as_postgres(table: object) -> None:
    sqlfluff.parse(upsert_sql(table, Dialect.SQLITE), dialect="postgres")  # type: ignore[arg-type]


@pytest.mark.parametrize("table", LEDGER_TABLES, ids=lambda table: table.name)
def test_bigquery_merge_parses(table: object) -> None:
    sql = merge_sql(table, 2)  # type: ignore[arg-type]
    assert "@r1_run_id AS run_id" in sql
    sqlfluff.parse(sql, dialect="bigquery")


def test_bigquery_merge_guards_older_tries() -> None:
    sql = merge_sql(RUN_STEPS, 1)
    assert "WHEN MATCHED AND (source.try_number IS NULL OR target.try_number IS NULL" in sql
    assert "ON target.run_id = source.run_id AND target.task_id = source.task_id" in sql
    with pytest.raises(ValueError, match="at least one row"):
        merge_sql(RUN_STEPS, 0)


def test_bigquery_record_script_is_one_transaction_with_typed_parameters() -> None:
    step = {
        "run_id": "d/r",
        "task_id": "train",
        "state": "success",
        "try_number": 2,
        "started_at": T0,
        "ended_at": None,
        "duration_seconds": None,
        "job_name": "rl-1",
        "recorded_at": T0,
    }
    script, parameters = bigquery_record_script([(RUN_STEPS, [step, {**step, "try_number": 3}]), (RUNS, [])])
    assert script.startswith("BEGIN TRANSACTION;\nMERGE run_steps AS target")
    assert script.rstrip().endswith("COMMIT TRANSACTION;")
    assert script.count("MERGE ") == 1  # the duplicate key became one row; no rows, no MERGE
    sqlfluff.parse(script, dialect="bigquery")
    assert ("run_steps_r0_try_number", "INT64", 3) in parameters
    assert ("run_steps_r0_ended_at", "TIMESTAMP", None) in parameters
    assert ("run_steps_r0_started_at", "TIMESTAMP", T0) in parameters
    assert bigquery_record_script([(RUNS, [])]) == ("", [])


def test_merge_parameters_cover_every_placeholder() -> None:
    rows = [{name: None for name in RUNS.column_names} | {"run_id": f"d/{index}"} for index in range(3)]
    sql = merge_sql(RUNS, 3, prefix="runs_r")
    names = {name for name, _, _ in merge_parameters(RUNS, rows, prefix="runs_r")}
    assert names == {token[1:] for token in sql.replace(",", " ").split() if token.startswith("@")}


def test_dedupe_rows_keeps_the_last_row_per_key() -> None:
    rows = [
        {"run_id": "a", "task_id": "t", "state": "failed"},
        {"run_id": "a", "task_id": "t", "state": "success"},
    ]
    assert dedupe_rows(RUN_STEPS, rows) == [{"run_id": "a", "task_id": "t", "state": "success"}]


def test_adapt_value_stores_utc_text_in_sqlite_and_datetimes_elsewhere() -> None:
    local = T0.astimezone(timezone(timedelta(hours=-5)))
    assert adapt_value(local, Dialect.SQLITE) == "2026-03-01T08:00:00.000000+00:00"
    assert adapt_value(local, Dialect.POSTGRES) == T0
    assert adapt_value(local, Dialect.POSTGRES).tzinfo is UTC
    assert adapt_value(3, Dialect.SQLITE) == 3
