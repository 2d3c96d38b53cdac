"""End-to-end runs of the pipeline DAGs in the sandbox: the ``e2e`` marker and a per-module world.

Each test module gets its own sandbox (fake-gcs-server, fake gcluster/gcloud), its own
AIRFLOW_HOME (metadata DB and run ledger), TMPDIR and HOME, so state, calls and ledger rows of one
module never leak into another. Select or skip the suite with ``-m e2e`` / ``-m "not e2e"``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.harness import E2EWorld, start_world, stop_world


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "e2e: end-to-end `airflow dags test` runs of the pipelines in the local sandbox (minutes, not seconds)",
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2EWorld]:
    """A running sandbox plus a migrated AIRFLOW_HOME, shared by the tests of one module."""
    started = start_world(tmp_path_factory.mktemp("e2e"))
    try:
        yield started
    finally:
        stop_world(started)
