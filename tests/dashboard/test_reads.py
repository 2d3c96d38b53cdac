"""The runs dashboard: its pages, its reads (ledger on SQLite, GCS faked at the hook), its routes
and their auth on Airflow 3, and the plugin that registers it."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest

from airflow_provider_tpu_rl.compat import AIRFLOW_V_3_0_PLUS
from airflow_provider_tpu_rl.dashboard import reads
from airflow_provider_tpu_rl.dashboard.pages import Airflow3Ui, run_page, runs_page
from airflow_provider_tpu_rl.dashboard.plugin import TpuRlDashboardPlugin
from airflow_provider_tpu_rl.dashboard.reads import DashboardReader, NotFound
from airflow_provider_tpu_rl.ledger.cli import format_reward
from airflow_provider_tpu_rl.ledger.hook import RunLedger
from airflow_provider_tpu_rl.ledger.records import RunRecord
from tests.dashboard.conftest import CURVES, EVERY_STATE, GKE, VM
from tests.support.ledger_fakes import minutes
from tests.support.png import decoded_png


def test_the_runs_page_lists_runs_with_rewards_before_after_and_links_each_run(ledger: RunLedger) -> None:
    runs = DashboardReader().runs({GKE})

    page = runs_page("/tpu-rl", runs)

    assert [run.run_id for run in runs] == [f"{GKE}/<b>odd</b>", f"{GKE}/manual__a+1"]  # newest first
    assert format_reward(0.0884, 0.245) in page  # the `tpu-rl runs` cell: before→after
    assert "01:15:00" in page  # Airflow's own duration format
    assert "gs://bkt/qwen/hf-trained/rl/" in page
    assert f"href='/tpu-rl/runs/{GKE}/manual__a%2B1'" in page
    assert "<b>odd</b>" not in page  # escaped
    assert "&lt;b&gt;odd&lt;/b&gt;" in page
    assert "<img src='/tpu-rl/trend.png'" in page
    assert VM not in page  # a DAG the viewer may not read


def test_a_run_refused_at_validate_does_not_break_the_front_page(ledger: RunLedger) -> None:
    """One run left on the form's placeholder project, refused at validate, made the front page
    (and so every earlier run) a bare 500: its shortened row was zipped strictly with the columns."""
    refusal = "refused at validate: project: set project to your GCP project"
    ledger.record(
        RunRecord(GKE, "placeholder", "qwen3-30b-a3b", "failed", started_at=minutes(200), refusal=refusal)
    )

    page = runs_page("/tpu-rl", DashboardReader().runs({GKE}))

    assert refusal in page
    assert f"href='/tpu-rl/runs/{GKE}/manual__a%2B1'" in page  # the earlier runs are still reachable


def test_a_runs_page_shows_its_curves_only_when_they_were_recorded(ledger: RunLedger) -> None:
    reader = DashboardReader()
    with_curves = reader.run(GKE, "manual__a+1")
    without = reader.run(GKE, "<b>odd</b>")

    assert with_curves.curves_uri == CURVES
    page = run_page("/tpu-rl", with_curves.run, with_curves.artifacts, ui=Airflow3Ui())
    assert f"<img src='/tpu-rl/curves/{GKE}/manual__a%2B1' alt='run curves'>" in page
    assert CURVES in page
    assert without.curves_uri is None
    assert "alt='run curves'" not in run_page("/tpu-rl", without.run, without.artifacts, ui=Airflow3Ui())
    with pytest.raises(NotFound):
        reader.run(GKE, "never")


def test_the_curves_are_read_from_gcs_within_a_bound(
    ledger: RunLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []

    class FakeGcs:
        def download(self, **kwargs: Any) -> bytes:
            calls.append(kwargs)
            return b"\x89PNG..."

    import airflow_provider_tpu_rl.hooks.credentials as credentials

    monkeypatch.setattr(credentials, "gcs_hook", lambda conn_id: FakeGcs())

    assert DashboardReader().curves_png(GKE, "manual__a+1") == b"\x89PNG..."
    assert calls == [
        {"bucket_name": "bkt", "object_name": "qwen/trained/rl/tpu-rl-curves-ab.png", "timeout": 30}
    ]
    with pytest.raises(NotFound, match="no curves"):
        DashboardReader().curves_png(GKE, "<b>odd</b>")


def test_the_trend_holds_only_the_readable_dags_runs(
    ledger: RunLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn: list[list[str]] = []
    real = reads.reward_trend_series
    monkeypatch.setattr(
        reads, "reward_trend_series", lambda rows: drawn.append([r["run_id"] for r in rows]) or real(rows)
    )

    png = DashboardReader().trend_png({VM})

    assert drawn == [[f"{VM}/vm1"]]
    assert decoded_png(png).size == (1000, 450)


def test_the_plugin_is_registered_by_entry_point_and_serves_the_dashboard_on_this_airflow() -> None:
    points = importlib.metadata.entry_points(group="airflow.plugins")
    assert {p.value for p in points if p.name == "tpu_rl_dashboard"} == {
        "airflow_provider_tpu_rl.dashboard.plugin:TpuRlDashboardPlugin"
    }
    plugin = TpuRlDashboardPlugin()
    if AIRFLOW_V_3_0_PLUS:
        assert [app["url_prefix"] for app in plugin.fastapi_apps] == ["/tpu-rl"]
        assert [view["href"] for view in plugin.external_views] == ["/tpu-rl/"]
        assert plugin.appbuilder_views == []
    else:
        assert plugin.fastapi_apps == []
        (view,) = plugin.appbuilder_views
        assert view["view"].route_base == "/tpu-rl"


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
