"""The dashboard on Airflow 3's API server: a FastAPI app the plugin mounts at ``/tpu-rl``.

Every route needs a logged-in Airflow user (the UI's ``_token`` cookie or a bearer token, through
``airflow.api_fastapi.core_api.security.get_user``): a run's page and its curves need read access to
the run's DAG (``requires_access_dag("GET")``, the DAG id taken from the path); the front page and
the trend show only the runs of the DAGs the user may read. Read-only: GET routes only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Annotated, Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_dag
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, Response

from airflow_provider_tpu_rl.dashboard.pages import TITLE, Airflow3Ui, message_page, run_page, runs_page
from airflow_provider_tpu_rl.dashboard.reads import DashboardReader, NotFound
from airflow_provider_tpu_rl.links import DASHBOARD_PREFIX

log = logging.getLogger(__name__)

read_dag = requires_access_dag("GET")  # the DAG id from the path


def readable_dag_ids(user: GetUserDep) -> set[str]:
    """The DAG ids the logged-in user may read; 403 when there is none."""
    dag_ids = set(get_auth_manager().get_authorized_dag_ids(user=user, method="GET"))
    if not dag_ids:
        raise HTTPException(status_code=403, detail="you may read no DAG")
    return dag_ids


def dashboard_reader() -> DashboardReader:
    """The reader the routes use (a dependency, so tests can replace it)."""
    return DashboardReader()


ReadableDags = Annotated[set[str], Depends(readable_dag_ids)]
Reader = Annotated[DashboardReader, Depends(dashboard_reader)]


def _root(request: Request) -> str:
    """The path the app is mounted at (``/tpu-rl``, behind any base path)."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def _guarded(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except NotFound as error:
        raise HTTPException(status_code=404, detail=str(error)) from None
    except Exception as error:
        log.exception("tpu-rl dashboard: read failed")
        raise HTTPException(status_code=502, detail=f"could not read: {type(error).__name__}") from None


def create_app() -> FastAPI:
    """The dashboard's FastAPI app (no API docs: it serves pages)."""
    app = FastAPI(title=TITLE, docs_url=None, redoc_url=None, openapi_url=None)

    @app.get("/", response_class=HTMLResponse)
    def index(request: Request, dag_ids: ReadableDags, reader: Reader) -> HTMLResponse:
        runs = _guarded(lambda: reader.runs(dag_ids))
        return HTMLResponse(runs_page(_root(request), runs))

    @app.get("/trend.png")
    def trend(dag_ids: ReadableDags, reader: Reader) -> Response:
        return Response(_guarded(lambda: reader.trend_png(dag_ids)), media_type="image/png")

    @app.get("/runs/{dag_id}/{run_id:path}", response_class=HTMLResponse, dependencies=[Depends(read_dag)])
    def run(request: Request, dag_id: str, run_id: str, reader: Reader) -> HTMLResponse:
        try:
            view = reader.run(dag_id, run_id)
        except NotFound as error:
            return HTMLResponse(message_page(str(error)), status_code=404)
        root = _root(request)
        ui = Airflow3Ui(root.removesuffix(DASHBOARD_PREFIX))  # the UI at the API server's root
        return HTMLResponse(run_page(root, view.run, view.artifacts, view.steps, ui=ui))

    @app.get("/curves/{dag_id}/{run_id:path}", dependencies=[Depends(read_dag)])
    def curves(dag_id: str, run_id: str, reader: Reader) -> Response:
        png = _guarded(lambda: reader.curves_png(dag_id, run_id))
        return Response(png, media_type="image/png", headers={"Cache-Control": "private, max-age=60"})

    return app
