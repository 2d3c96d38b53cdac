"""Fixtures for the run ledger: a ledger on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_provider_tpu_rl.ledger.hook import RunLedger, sqlite_connection_uri
from tests.support.pg_server import INSTALL_HINT, PostgresServer, find_postgres_bin


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL server for the whole session (Debian's postgresql package)."""
    bin_dir = find_postgres_bin()
    if bin_dir is None:
        pytest.fail(f"PostgreSQL server binaries not found in /usr/lib/postgresql/*/bin: {INSTALL_HINT}")
    with PostgresServer(bin_dir) as server:
        yield server


@pytest.fixture(scope="session")
def _postgres_database(postgres_server: PostgresServer) -> str:
    return postgres_server.create_database(f"ledger_{os.getpid()}")


@pytest.fixture
def postgres_uri(_postgres_database: str) -> str:
    """An empty database: its public schema dropped and re-created (faster than CREATE DATABASE)."""
    import psycopg

    with psycopg.connect(_postgres_database, autocommit=True) as connection:
        connection.execute("DROP SCHEMA IF EXISTS public CASCADE")
        connection.execute("CREATE SCHEMA public")
    return _postgres_database


@pytest.fixture
def sqlite_uri(tmp_path: Path) -> str:
    """An Airflow connection URI for a fresh SQLite file."""
    return sqlite_connection_uri(tmp_path / "ledger.db")


@pytest.fixture(params=["sqlite", "postgres"])
def ledger_uri(request: pytest.FixtureRequest) -> str:
    """The connection URI of an empty ledger database, once per backend."""
    return str(request.getfixturevalue(f"{request.param}_uri"))


@pytest.fixture
def ledger(ledger_uri: str, monkeypatch: pytest.MonkeyPatch) -> RunLedger:
    """A RunLedger reaching its database through AIRFLOW_CONN_TPU_RL_LEDGER (common.sql hooks)."""
    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", ledger_uri)
    return RunLedger()
