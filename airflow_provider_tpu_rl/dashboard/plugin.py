"""The Airflow plugin that serves the runs dashboard (entry point ``airflow.plugins``).

Airflow 3: a FastAPI app mounted on the API server at ``/tpu-rl`` and an external view in the UI's
navigation. Airflow 2: a Flask-AppBuilder view at ``/tpu-rl`` in the Browse menu. Airflow imports
plugins in every process, task runs included, so this module imports neither FastAPI nor Flask:
the app is built on its first request, the view when the webserver asks for it.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from airflow_provider_tpu_rl.compat import AIRFLOW_V_3_0_PLUS, AirflowPlugin
from airflow_provider_tpu_rl.dashboard.pages import TITLE
from airflow_provider_tpu_rl.links import DASHBOARD_PREFIX

PLUGIN_NAME = "tpu_rl_dashboard"


class LazyAsgiApp:
    """An ASGI app that builds the dashboard's FastAPI app on its first call."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await _fastapi_app()(scope, receive, send)


@cache
def _fastapi_app() -> Any:
    from airflow_provider_tpu_rl.dashboard.fastapi_app import create_app

    return create_app()


@cache
def _appbuilder_views() -> list[dict[str, Any]]:
    from airflow_provider_tpu_rl.dashboard.flask_views import appbuilder_view

    return [appbuilder_view()]


class TpuRlDashboardPlugin(AirflowPlugin):
    """The runs dashboard: the ledger's runs, each run's curves, the reward trend across runs."""

    name = PLUGIN_NAME

    @property
    def fastapi_apps(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """Airflow 3: the dashboard's app, mounted at ``/tpu-rl``."""
        if not AIRFLOW_V_3_0_PLUS:
            return []
        return [{"app": LazyAsgiApp(), "url_prefix": DASHBOARD_PREFIX, "name": TITLE}]

    @property
    def external_views(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """Airflow 3: the dashboard in the UI's navigation (shown in the UI's frame)."""
        if not AIRFLOW_V_3_0_PLUS:
            return []
        return [
            {
                "name": TITLE,
                "href": f"{DASHBOARD_PREFIX}/",
                "destination": "nav",
                "category": "browse",
                "url_route": "tpu-rl-runs",
            }
        ]

    @property
    def appbuilder_views(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """Airflow 2: the Flask-AppBuilder view at ``/tpu-rl``."""
        return [] if AIRFLOW_V_3_0_PLUS else _appbuilder_views()
