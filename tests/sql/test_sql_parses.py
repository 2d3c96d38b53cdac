"""sql/ parses in the dialects it is written for: BigQuery DDL as BigQuery, the portable SQL as ANSI.

``make lint`` runs ``sqlfluff lint sql/`` itself (its rules, the dialect per folder); these tests
check what linting does not: that each file parses, in the dialect each target database speaks.
They import no Airflow, so they run in the Airflow 3.3 leg only (``AIRFLOW_FREE_TESTS``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import sqlfluff

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"


@pytest.mark.parametrize("path", sorted((SQL_DIR / "bigquery").glob("*.sql")), ids=lambda path: path.name)
def test_bigquery_ddl_parses_as_bigquery(path: Path) -> None:
    parsed = str(sqlfluff.parse(path.read_text(), dialect="bigquery"))
    assert "unparsable" not in parsed
    assert "create_table_statement" in parsed or "alter_table_statement" in parsed


@pytest.mark.parametrize(
    "path",
    sorted([*(SQL_DIR / "migrations").glob("*.sql"), *(SQL_DIR / "queries").glob("*.sql")]),
    ids=lambda path: path.name,
)
def test_portable_sql_parses_as_ansi_where_possible(path: Path) -> None:
    # ANSI has no CREATE INDEX IF NOT EXISTS (PostgreSQL and SQLite have it); everything else must
    # be plain ANSI-parsable SQL.
    dialect = "postgres" if "CREATE INDEX" in path.read_text() else "ansi"
    # Parameters become literals: ANSI has no :name placeholders.
    sql = re.sub(r"(?<![:\w]):[a-z_]+", "1", path.read_text())
    sqlfluff.parse(sql, dialect=dialect)
