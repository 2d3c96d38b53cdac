"""sqlfluff passes on sql/ (portable SQL as postgres, sql/bigquery/ as bigquery)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import sqlfluff

SQL_DIR = Path(__file__).resolve().parents[2] / "sql"
SQLFLUFF = Path(sys.executable).parent / "sqlfluff"


def test_sqlfluff_lint_passes_on_sql_folder() -> None:
    assert SQLFLUFF.exists(), f"sqlfluff not installed next to {sys.executable}"
    result = subprocess.run(
        [str(SQLFLUFF), "lint", str(SQL_DIR)], capture_output=True, text=True, check=False, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr


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
