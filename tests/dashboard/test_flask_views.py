"""The dashboard's Flask-AppBuilder view on Airflow 2 (``dashboard/flask_views.py``), in a bare Flask
app through Flask's test client: its routes, what each shows, and the FAB auth manager's checks it
goes through (``airflow.www.auth``), with the auth manager faked at its interface. The real 2.11
webserver serves it end to end in tests/services."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote, unquote

import pytest

from airflow_provider_tpu_rl.compat import AIRFLOW_V_3_0_PLUS
from airflow_provider_tpu_rl.dashboard.reads import DashboardReader
from airflow_provider_tpu_rl.ledger.cli import format_reward
from airflow_provider_tpu_rl.ledger.hook import RunLedger
from tests.dashboard.conftest import EVERY_STATE, GKE, VM

pytestmark = pytest.mark.skipif(
    AIRFLOW_V_3_0_PLUS,
    reason="Airflow 2's webserver view; Airflow 3 serves the FastAPI app (test_fastapi_app.py)",
)


class FakeAuthManager:
    """The FAB auth manager's methods the view and ``airflow.www.auth`` call, answering for one
    user: logged in (with access to the website) or not, allowed to read ``readable`` DAGs."""

    def __init__(self, *, logged_in: bool, readable: set[str]) -> None:
        self.user = object() if logged_in else None
        self.readable = readable
        self.dag_checks: list[tuple[str, str | None]] = []

    def is_logged_in(self) -> bool:
        return self.user is not None

    def is_authorized_view(self, *, access_view: Any) -> bool:
        return self.is_logged_in()

    def is_authorized_dag(self, *, method: str, access_entity: Any = None, details: Any = None) -> bool:
        dag_id = None if details is None else details.id
        self.dag_checks.append((method, dag_id))
        return self.is_logged_in() and (dag_id is None or dag_id in self.readable)

    def get_permitted_dag_ids(self, *, methods: list[str], user: Any) -> set[str]:
        assert methods == ["GET"]
        assert user is self.user  # the request's user (g.user)
        return set(self.readable) if self.is_logged_in() else set()

    def get_url_login(self, **kwargs: Any) -> str:
        return "/login/?next=" + quote(kwargs.get("next_url", ""), safe="")

    def get_url_logout(self) -> str:
        return "/logout/"


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Any:
    """``serve(auth)``: a test client of a Flask app serving the dashboard's blueprint for ``auth``."""
    from airflow.www import auth as www_auth
    from flask import Flask, g

    from airflow_provider_tpu_rl.dashboard import flask_views

    def serve(manager: FakeAuthManager) -> Any:
        monkeypatch.setattr(www_auth, "get_auth_manager", lambda: manager)
        monkeypatch.setattr(flask_views, "get_auth_manager", lambda: manager)
        app = Flask(__name__)
        app.secret_key = "test-only"
        app.before_request(lambda: setattr(g, "user", manager.user))
        app.add_url_rule("/home", endpoint="Airflow.index", view_func=lambda: "home")
        entry = flask_views.appbuilder_view()
        assert (entry["category"], entry["view"].route_base) == ("Browse", "/tpu-rl")
        app.register_blueprint(entry["view"].create_blueprint(None))
        return app.test_client()

    return serve


def test_a_reader_sees_the_runs_of_the_dags_it_may_read_a_runs_page_and_its_curves(
    ledger: RunLedger, monkeypatch: pytest.MonkeyPatch, serve: Any
) -> None:
    monkeypatch.setattr(
        DashboardReader, "curves_png", lambda self, dag_id, run_id: b"png of " + run_id.encode()
    )
    manager = FakeAuthManager(logged_in=True, readable={GKE})
    client = serve(manager)

    index = client.get("/tpu-rl/")
    run = client.get(f"/tpu-rl/runs/{GKE}/manual__a%2B1")
    curves = client.get(f"/tpu-rl/curves/{GKE}/manual__a%2B1")
    missing = client.get(f"/tpu-rl/runs/{GKE}/never")

    assert (index.status_code, index.mimetype) == (200, "text/html")
    page = index.get_data(as_text=True)
    assert format_reward(0.0884, 0.245) in page
    assert f"href='/tpu-rl/runs/{GKE}/manual__a%2B1'" in page
    assert VM not in page  # a DAG the user may not read
    assert run.status_code == 200
    assert f"/tpu-rl/curves/{GKE}/manual__a%2B1" in run.get_data(as_text=True)
    assert (curves.status_code, curves.mimetype, curves.data) == (200, "image/png", b"png of manual__a+1")
    assert missing.status_code == 404
    assert f"the run ledger holds no run {GKE}/never" in missing.get_data(as_text=True)
    # each run route asked for read access to the run's DAG, the DAG id taken from the URL
    assert manager.dag_checks == [("GET", GKE)] * 3


def test_a_run_of_a_dag_the_user_may_not_read_is_not_shown(ledger: RunLedger, serve: Any) -> None:
    manager = FakeAuthManager(logged_in=True, readable={GKE})
    client = serve(manager)

    for path in (f"/tpu-rl/runs/{VM}/vm1", f"/tpu-rl/curves/{VM}/vm1"):
        response = client.get(path)
        assert response.status_code == 302, path
        assert response.headers["Location"].endswith("/home")
        assert "vm1" not in response.get_data(as_text=True)
    assert manager.dag_checks == [("GET", VM)] * 2


@pytest.mark.parametrize(
    "path",
    [
        "/tpu-rl/",
        "/tpu-rl/trend.png",
        f"/tpu-rl/runs/{GKE}/manual__a%2B1",
        f"/tpu-rl/curves/{GKE}/manual__a%2B1",
    ],
)
def test_an_anonymous_request_goes_to_the_login_page(ledger: RunLedger, serve: Any, path: str) -> None:
    response = serve(FakeAuthManager(logged_in=False, readable={GKE, VM})).get(path)

    assert response.status_code == 302
    login, back = response.headers["Location"].split("?next=")
    assert (login, unquote(back)) == ("/login/", f"http://localhost{unquote(path)}")  # back after login
    body = response.get_data(as_text=True)
    assert format_reward(0.0884, 0.245) not in body  # nothing of the ledger
    assert "gs://bkt" not in body


def test_the_view_is_read_only(ledger: RunLedger, serve: Any) -> None:
    client = serve(FakeAuthManager(logged_in=True, readable={GKE}))
    assert client.post("/tpu-rl/").status_code == 405
    assert client.delete(f"/tpu-rl/runs/{GKE}/manual__a%2B1").status_code == 405


def test_every_kind_of_run_renders_on_the_webserver(every_state: RunLedger, serve: Any) -> None:
    """The front page and each run's page, for a refused, failed, running, picture-less and
    successful run; the run page links back to Airflow 2's grid (the run, each task's log)."""
    client = serve(FakeAuthManager(logged_in=True, readable={GKE}))

    index = client.get("/tpu-rl/")
    assert index.status_code == 200
    for name in EVERY_STATE:
        assert f"href='/tpu-rl/runs/{GKE}/{name}'" in index.get_data(as_text=True)
        page = client.get(f"/tpu-rl/runs/{GKE}/{name}")
        assert page.status_code == 200, name
        assert f"data-airflow href='/dags/{GKE}/grid?dag_run_id={name}'" in page.get_data(as_text=True)
    failed = client.get(f"/tpu-rl/runs/{GKE}/failed").get_data(as_text=True)
    assert f"/dags/{GKE}/grid?dag_run_id=failed&amp;task_id=train&amp;tab=logs" in failed
