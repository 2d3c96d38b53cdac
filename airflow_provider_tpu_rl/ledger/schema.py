"""The ledger's SQL files: versioned migrations and named queries (no Airflow import).

The files live in the top-level ``sql/`` folder of the source tree. The package reaches them as
package data through ``airflow_provider_tpu_rl/ledger/sql``, a symlink to ``../../sql`` that
setuptools follows when it builds a wheel; in a checkout where the symlink is missing (git with
``core.symlinks=false``) the ``sql/`` folder next to the package is used instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from airflow_provider_tpu_rl.ledger.dialects import Dialect, split_statements

SQL_PACKAGE = "airflow_provider_tpu_rl.ledger"
QUERY_NAMES = ("latest_runs", "reward_trend", "failed_steps")
DEFAULT_SQLITE_FILE = "tpu_rl_ledger.db"  # in $AIRFLOW_HOME, when connection tpu_rl_ledger is not defined
BOOTSTRAP_VERSION = 1  # the migration that creates schema_migrations; it runs before every check

_MIGRATION_FILE = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")


def sql_root() -> Traversable:
    """The folder holding ``migrations/``, ``bigquery/`` and ``queries/``."""
    packaged = resources.files(SQL_PACKAGE) / "sql"
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parents[2] / "sql"
    if checkout.is_dir():
        return checkout
    raise FileNotFoundError(f"the ledger SQL files are missing: neither {packaged} nor {checkout} exists")


@dataclass(frozen=True)
class Migration:
    """One versioned migration file."""

    version: int
    name: str
    sql: str

    @cached_property
    def statements(self) -> list[str]:
        """The file's statements, in order."""
        return split_statements(self.sql)


def migrations_folder(dialect: Dialect) -> str:
    """``bigquery`` for BigQuery, ``migrations`` (portable SQL) for SQLite and PostgreSQL."""
    return "bigquery" if dialect is Dialect.BIGQUERY else "migrations"


def load_migrations(dialect: Dialect, root: Traversable | None = None) -> list[Migration]:
    """The dialect's migrations sorted by version; versions must run 1, 2, 3, ... without gaps."""
    folder = (root or sql_root()) / migrations_folder(dialect)
    found: list[Migration] = []
    for entry in folder.iterdir():
        match = _MIGRATION_FILE.match(entry.name)
        if match is None:
            if entry.name.endswith(".sql"):
                raise ValueError(f"migration file name must look like 0001_name.sql: {entry.name}")
            continue
        found.append(Migration(int(match["version"]), match["name"], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda migration: migration.version)
    versions = [migration.version for migration in found]
    if versions != list(range(1, len(found) + 1)):
        raise ValueError(
            f"migration versions in {folder} must be 1..N without gaps or repeats, got {versions}"
        )
    return found


def load_query(name: str, root: Traversable | None = None) -> str:
    """The text of ``sql/queries/<name>.sql`` (portable ``:name`` parameters)."""
    if name not in QUERY_NAMES:
        raise ValueError(f"unknown ledger query {name!r}; known: {', '.join(QUERY_NAMES)}")
    text = ((root or sql_root()) / "queries" / f"{name}.sql").read_text(encoding="utf-8")
    statements = split_statements(text)
    if len(statements) != 1:
        raise ValueError(f"query {name} must hold exactly one statement, found {len(statements)}")
    return statements[0]
