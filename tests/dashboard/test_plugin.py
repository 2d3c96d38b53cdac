"""The dashboard's Airflow plugin (dashboard/plugin.py): registered by its entry point, serving the
FastAPI app on Airflow 3 and the Flask-AppBuilder view on Airflow 2."""

from __future__ import annotations

import importlib.metadata

from airflow_provider_tpu_rl.compat import AIRFLOW_V_3_0_PLUS
from airflow_provider_tpu_rl.dashboard.plugin import TpuRlDashboardPlugin


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
