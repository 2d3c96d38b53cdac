"""Reading a ledger back in tests: row counts and applied migrations, in plain SQL.

The product reads the ledger through its named queries (``sql/queries/``); these checks look at
the tables themselves, through the ledger's own session so that SQLite and PostgreSQL both work.
"""

from __future__ import annotations

from airflow_provider_tpu_rl.ledger.dialects import RUN_ARTIFACTS, RUN_METRICS, RUN_STEPS, RUN_VM_SPANS, RUNS
from airflow_provider_tpu_rl.ledger.hook import RunLedger

LEDGER_TABLES = (RUNS, RUN_STEPS, RUN_METRICS, RUN_ARTIFACTS, RUN_VM_SPANS)
_TABLE_NAMES = frozenset(table.name for table in LEDGER_TABLES)


def count_rows(ledger: RunLedger, table: str, run_id: str | None = None) -> int:
    """Rows in a ledger table (of one run when ``run_id`` is given)."""
    if table not in _TABLE_NAMES:
        raise ValueError(f"not a ledger table: {table}")
    where = " WHERE run_id = :run_id" if run_id is not None else ""
    with ledger._session(write=False) as session:
        rows = session.fetch(f"SELECT COUNT(*) AS row_count FROM {table}{where}", {"run_id": run_id})  # noqa: S608
    return int(rows[0]["row_count"])


def applied_versions(ledger: RunLedger) -> list[int]:
    """The versions recorded in ``schema_migrations``, ascending."""
    with ledger._session(write=False) as session:
        rows = session.fetch("SELECT version FROM schema_migrations ORDER BY version", {})
    return [int(row["version"]) for row in rows]
