"""Finding the SQL files: migrations in order, named queries, package data."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from airflow_provider_tpu_rl.ledger.dialects import Dialect
from airflow_provider_tpu_rl.ledger.schema import (
    BOOTSTRAP_VERSION,
    QUERY_NAMES,
    load_migrations,
    load_query,
    sql_root,
)

REPO_SQL = Path(__file__).resolve().parents[2] / "sql"


def test_sql_files_are_package_resources_backed_by_the_top_level_folder() -> None:
    packaged = resources.files("airflow_provider_tpu_rl.ledger") / "sql"
    assert packaged.is_dir()
    assert Path(str(sql_root())).resolve() == REPO_SQL.resolve()
    assert (packaged / "migrations" / "0002_ledger_tables.sql").read_text() == (
        REPO_SQL / "migrations" / "0002_ledger_tables.sql"
    ).read_text()


@pytest.mark.parametrize("dialect", list(Dialect))
def test_migrations_are_numbered_from_one_and_bootstrap_schema_migrations(dialect: Dialect) -> None:
    migrations = load_migrations(dialect)
    assert [migration.version for migration in migrations] == list(range(1, len(migrations) + 1))
    bootstrap = migrations[BOOTSTRAP_VERSION - 1]
    assert len(bootstrap.statements) == 1
    assert "CREATE TABLE IF NOT EXISTS schema_migrations" in bootstrap.statements[0]
    for migration in migrations:
        for statement in migration.statements:
            if statement.startswith("ALTER TABLE") and dialect is not Dialect.BIGQUERY:
                # SQLite has no ADD COLUMN IF NOT EXISTS: the file runs once, in the transaction
                # that records its version (test_hook.py: a failed migration leaves no trace)
                assert " ADD COLUMN " in statement, f"{migration.name}: only columns are added"
                continue
            if statement.startswith("UPDATE"):  # a data move, guarded: a second run changes nothing
                assert "IS NULL" in statement, f"{migration.name}: an UPDATE must be guarded"
                continue
            assert "IF NOT EXISTS" in statement, f"{migration.name}: every statement must be re-runnable"


def test_portable_and_bigquery_migrations_create_the_same_tables() -> None:
    def tables(dialect: Dialect) -> set[str]:
        return {
            statement.split("IF NOT EXISTS")[1].split()[0]
            for migration in load_migrations(dialect)
            for statement in migration.statements
            if statement.startswith("CREATE TABLE")
        }

    assert (
        tables(Dialect.SQLITE)
        == tables(Dialect.BIGQUERY)
        == {
            "schema_migrations",
            "runs",
            "run_steps",
            "run_metrics",
            "run_artifacts",
            "run_vm_spans",
        }
    )


def test_a_gap_in_versions_is_refused(tmp_path: Path) -> None:
    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "0001_a.sql").write_text("CREATE TABLE IF NOT EXISTS a (x INTEGER);")
    (tmp_path / "migrations" / "0003_c.sql").write_text("CREATE TABLE IF NOT EXISTS c (x INTEGER);")
    with pytest.raises(ValueError, match="without gaps"):
        load_migrations(Dialect.SQLITE, root=tmp_path)


def test_a_badly_named_migration_is_refused(tmp_path: Path) -> None:
    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "1_a.sql").write_text("SELECT 1;")
    with pytest.raises(ValueError, match=r"0001_name\.sql"):
        load_migrations(Dialect.POSTGRES, root=tmp_path)


@pytest.mark.parametrize("name", QUERY_NAMES)
def test_queries_load_as_one_statement(name: str) -> None:
    assert load_query(name).lstrip().upper().startswith(("SELECT", "WITH"))


def test_every_query_file_is_a_named_query_the_ledger_reads() -> None:
    """No orphan query file: each one in sql/queries/ is in QUERY_NAMES (and so has a RunLedger method)."""
    from airflow_provider_tpu_rl.ledger.hook import RunLedger

    assert sorted(path.stem for path in (REPO_SQL / "queries").glob("*.sql")) == sorted(QUERY_NAMES)
    assert all(callable(getattr(RunLedger, name, None)) for name in QUERY_NAMES)


def test_unknown_query_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown ledger query"):
        load_query("drop_everything")
