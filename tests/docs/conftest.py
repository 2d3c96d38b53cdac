"""The docs' tests: the ``e2e`` marker, and a sandbox world whose DAG folder is ``docs/examples/``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.harness import E2EWorld, start_world, stop_world

REPO = Path(__file__).resolve().parents[2]
EXAMPLES_DIR = REPO / "docs" / "examples"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "e2e: end-to-end `airflow dags test` runs of the pipelines in the local sandbox (minutes, not seconds)",
    )


@pytest.fixture(scope="module")
def examples_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2EWorld]:
    """The e2e harness's world (sandbox, AIRFLOW_HOME, fast settings) reading ``docs/examples/``.

    ``start_world`` points ``AIRFLOW__CORE__DAGS_FOLDER`` at ``dags/``; every ``airflow dags test``
    of this world runs with the examples folder instead (the env is the world's own dict).
    """
    started = start_world(tmp_path_factory.mktemp("docs-e2e"))
    started.env["AIRFLOW__CORE__DAGS_FOLDER"] = str(EXAMPLES_DIR)
    try:
        yield started
    finally:
        stop_world(started)
