"""The dashboard's routes on Airflow 3 (dashboard/fastapi_app.py), through FastAPI's test client: an
anonymous request is refused, a logged-in reader sees the runs of the DAGs it may read, and every
kind of run renders."""

from __future__ import annotations

import pytest

from airflow_provider_tpu_rl.compat import AIRFLOW_V_3_0_PLUS
from airflow_provider_tpu_rl.dashboard.reads import DashboardReader
from airflow_provider_tpu_rl.ledger.cli import format_reward
from airflow_provider_tpu_rl.ledger.hook import RunLedger
from tests.dashboard.conftest import EVERY_STATE, GKE, VM

# ------------------------------------------------------------------------------- Airflow 3 routes
airflow3 = pytest.mark.skipif(not AIRFLOW_V_3_0_PLUS, reason="the FastAPI app is Airflow 3's")


@airflow3
@pytest.mark.parametrize(
    "path", ["/", "/trend.png", f"/runs/{GKE}/manual__a%2B1", f"/curves/{GKE}/manual__a%2B1"]
)
def test_an_anonymous_request_is_refused(ledger: RunLedger, path: str) -> None:
    from fastapi.testclient import TestClient

    from airflow_provider_tpu_rl.dashboard.fastapi_app import create_app

    with TestClient(create_app()) as client:
        response = client.get(path)

    assert response.status_code == 401
    assert "manual__a" not in response.text


@airflow3
def test_a_logged_in_reader_sees_the_runs_of_the_dags_it_may_read(
    ledger: RunLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient

    from airflow_provider_tpu_rl.dashboard import fastapi_app

    monkeypatch.setattr(
        DashboardReader, "curves_png", lambda self, dag_id, run_id: b"png of " + run_id.encode()
    )
    app = fastapi_app.create_app()
    app.dependency_overrides[fastapi_app.readable_dag_ids] = lambda: {GKE}
    app.dependency_overrides[fastapi_app.read_dag] = lambda: None

    with TestClient(app, root_path="/tpu-rl") as client:
        index = client.get("/")
        run = client.get(f"/runs/{GKE}/manual__a%2B1")
        curves = client.get(f"/curves/{GKE}/manual__a%2B1")
        missing = client.get(f"/runs/{GKE}/never")

    assert index.status_code == 200
    assert format_reward(0.0884, 0.245) in index.text
    assert f"href='/tpu-rl/runs/{GKE}/manual__a%2B1'" in index.text
    assert VM not in index.text
    assert run.status_code == 200
    assert f"/tpu-rl/curves/{GKE}/manual__a%2B1" in run.text
    assert (curves.status_code, curves.headers["content-type"], curves.content) == (
        200,
        "image/png",
        b"png of manual__a+1",
    )
    assert missing.status_code == 404


@airflow3
def test_every_kind_of_run_renders_on_the_api_server(every_state: RunLedger) -> None:
    """The front page and each run's page, for a refused, failed, running, picture-less and
    successful run; the run page links back to Airflow 3's own pages."""
    from fastapi.testclient import TestClient

    from airflow_provider_tpu_rl.dashboard import fastapi_app

    app = fastapi_app.create_app()
    app.dependency_overrides[fastapi_app.readable_dag_ids] = lambda: {GKE}
    app.dependency_overrides[fastapi_app.read_dag] = lambda: None
    with TestClient(app, root_path="/tpu-rl") as client:
        index = client.get("/")
        pages = {name: client.get(f"/runs/{GKE}/{name}") for name in EVERY_STATE}

    assert index.status_code == 200, index.text
    for name, page in pages.items():
        assert page.status_code == 200, (name, page.text[:500])
        assert f"href='/tpu-rl/runs/{GKE}/{name}'" in index.text
        assert f"data-airflow href='/dags/{GKE}/runs/{name}'" in page.text
