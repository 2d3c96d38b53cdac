"""The services stack's Airflow options, read back through Airflow's own configuration (no stack
started): an option Airflow does not know, or spells otherwise, reads as its default here."""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow.configuration import conf

from tests.services.airflow_stack import DAG_FILE_PARSE_INTERVAL, EXECUTION_API_TIMEOUT, FLAVOR, stack_env
from tests.support.waiting import HANG_BOUND


@pytest.fixture
def stack_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stack's ``AIRFLOW__`` variables in this process's environment, where ``conf`` reads them."""
    env = stack_env(tmp_path, {}, "postgresql://metadata", "postgresql://ledger", "marker", 8080)
    for name, value in env.items():
        if name.startswith("AIRFLOW__"):
            monkeypatch.setenv(name, value)


@pytest.mark.usefixtures("stack_options")
def test_the_dags_parsed_once_outlive_the_stack() -> None:
    """Each DAG file is parsed once; on Airflow 2 the scheduler deletes the serialized DAG of every
    DAG not parsed for ``dag_stale_not_seen_duration`` (600 s by default), so that window must be
    longer than the parse interval, or a stack alive ten minutes loses its DAGs."""
    section = "dag_processor" if FLAVOR.v3 else "scheduler"
    assert conf.getint(section, "min_file_process_interval") == DAG_FILE_PARSE_INTERVAL
    if not FLAVOR.v3:
        assert conf.getint("scheduler", "dag_stale_not_seen_duration") > DAG_FILE_PARSE_INTERVAL


@pytest.mark.usefixtures("stack_options")
def test_a_loaded_parse_is_not_cut_short() -> None:
    """A file is parsed once: Airflow's bounds on importing it (30 s by default) and on the whole
    parse (50 s) are bounds against a hang, not deadlines that load can reach."""
    section = "dag_processor" if FLAVOR.v3 else "core"
    import_bound = conf.getfloat("core", "dagbag_import_timeout")
    assert import_bound >= HANG_BOUND
    assert conf.getint(section, "dag_file_processor_timeout") > import_bound


@pytest.mark.skipif(not FLAVOR.v3, reason="Airflow 2's task runners use the database, not an API")
@pytest.mark.usefixtures("stack_options")
def test_a_loaded_api_server_does_not_fail_a_task() -> None:
    """A task process's call to the execution API times out after 5 s by default and is retried: a
    call that went through is retried into a conflict and the task dies before it runs."""
    assert conf.getfloat("workers", "execution_api_timeout") == EXECUTION_API_TIMEOUT >= 60
