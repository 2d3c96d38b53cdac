"""``project_id`` left empty: the GCP connection's project, read as the google provider's hooks read
it (``GoogleBaseHook.project_id``), on every provider version the package allows."""

from __future__ import annotations

import json

import pytest

from airflow_provider_tpu_rl.exceptions import ConfigurationError
from airflow_provider_tpu_rl.hooks import credentials
from airflow_provider_tpu_rl.operators.base import chain_of, connection_project


@pytest.fixture(autouse=True)
def fresh_credentials() -> None:
    credentials.clear()  # each test's connection read anew


def define(monkeypatch: pytest.MonkeyPatch, conn_id: str, extra: dict[str, object]) -> None:
    conn = {"conn_type": "google_cloud_platform", "extra": extra}
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(conn))


def test_the_connections_project_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    define(monkeypatch, "tpu_rl_with_project", {"project": "my-proj", "is_anonymous": True})
    assert connection_project("tpu_rl_with_project", None) == "my-proj"


def test_a_connection_without_a_project_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    define(monkeypatch, "tpu_rl_no_project", {"is_anonymous": True})
    with pytest.raises(ConfigurationError) as refused:
        connection_project("tpu_rl_no_project", None)
    assert str(refused.value) == (
        "project_id is empty and connection 'tpu_rl_no_project' names no project: "
        "pass project_id or set the connection's project"
    )


def test_an_undefined_connection_is_one_line() -> None:
    with pytest.raises(ConfigurationError) as refused:
        connection_project("tpu_rl_no_such_connection", None)
    message = str(refused.value)
    assert message.startswith(
        "project_id is empty and the project of connection 'tpu_rl_no_such_connection' cannot be read: "
    )
    assert "\n" not in message


@pytest.mark.parametrize(
    ("given", "chain"),
    [
        (None, None),
        ("", None),
        ("  ", None),
        ([], None),
        (["", " "], None),
        ("sa@p.iam.gserviceaccount.com", "sa@p.iam.gserviceaccount.com"),
        (
            ["a@p.iam.gserviceaccount.com", " b@p.iam.gserviceaccount.com "],
            ["a@p.iam.gserviceaccount.com", "b@p.iam.gserviceaccount.com"],
        ),
    ],
)
def test_an_empty_impersonation_chain_is_none(given: object, chain: object) -> None:
    assert chain_of(given) == chain  # type: ignore[arg-type]
