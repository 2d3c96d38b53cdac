"""The dashboard on Airflow 2's webserver: a Flask-AppBuilder view at ``/tpu-rl``, in the Browse menu.

Behind the FAB auth manager's own checks (``airflow.www.auth``): the front page and the trend need a
logged-in user with access to the website and show only the runs of the DAGs the user may read; a
run's page and its curves need read access to the run's DAG (``has_access_dag("GET")``, the DAG id
taken from the URL). An anonymous request is redirected to the login page. Read-only: GET only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from airflow.www import auth
from airflow.www.extensions.init_auth_manager import get_auth_manager
from flask import Response, g, request
from flask_appbuilder import BaseView, expose

from airflow_provider_tpu_rl.dashboard.pages import TITLE, Airflow2Ui, message_page, run_page, runs_page
from airflow_provider_tpu_rl.dashboard.reads import DashboardReader, NotFound
from airflow_provider_tpu_rl.links import DASHBOARD_PREFIX

log = logging.getLogger(__name__)


def _readable_dag_ids() -> set[str]:
    return set(get_auth_manager().get_permitted_dag_ids(methods=["GET"], user=g.user))


def _guarded(read: Callable[[], Any]) -> Any:
    """The read's result, or a one-line page: 404 for what is not there, 502 for a failed read."""
    try:
        return read()
    except NotFound as error:
        return Response(message_page(str(error)), status=404, mimetype="text/html")
    except Exception as error:
        log.exception("tpu-rl dashboard: read failed")
        return Response(
            message_page(f"could not read: {type(error).__name__}"), status=502, mimetype="text/html"
        )


class RunsDashboardView(BaseView):
    """The runs dashboard (Airflow 2)."""

    route_base = DASHBOARD_PREFIX
    default_view = "index"
    reader = DashboardReader()

    def _root(self) -> str:
        return request.script_root.rstrip("/") + DASHBOARD_PREFIX

    @expose("/")
    @auth.has_access_view()
    def index(self) -> Any:
        dag_ids = _readable_dag_ids()
        runs = _guarded(lambda: self.reader.runs(dag_ids))
        return (
            runs
            if isinstance(runs, Response)
            else Response(runs_page(self._root(), runs), mimetype="text/html")
        )

    @expose("/trend.png")
    @auth.has_access_view()
    def trend(self) -> Any:
        dag_ids = _readable_dag_ids()
        png = _guarded(lambda: self.reader.trend_png(dag_ids))
        return png if isinstance(png, Response) else Response(png, mimetype="image/png")

    @expose("/runs/<string:dag_id>/<path:run_id>")
    @auth.has_access_dag("GET")
    def run(self, dag_id: str, run_id: str) -> Any:
        view = _guarded(lambda: self.reader.run(dag_id, run_id))
        if isinstance(view, Response):
            return view
        ui = Airflow2Ui(request.script_root.rstrip("/"))  # the webserver's own pages
        page = run_page(self._root(), view.run, view.artifacts, view.steps, ui=ui)
        return Response(page, mimetype="text/html")

    @expose("/curves/<string:dag_id>/<path:run_id>")
    @auth.has_access_dag("GET")
    def curves(self, dag_id: str, run_id: str) -> Any:
        png = _guarded(lambda: self.reader.curves_png(dag_id, run_id))
        return png if isinstance(png, Response) else Response(png, mimetype="image/png")


def appbuilder_view() -> dict[str, Any]:
    """The plugin's ``appbuilder_views`` entry: the view, under Browse."""
    return {"name": TITLE, "category": "Browse", "view": RunsDashboardView()}
