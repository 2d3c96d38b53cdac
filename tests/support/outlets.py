"""A task context's ``outlet_events`` outside a task run, and reading back what was emitted (both lines)."""

from __future__ import annotations

from typing import Any

from airflow.providers.common.compat.sdk import AssetAlias

from airflow_provider_tpu_rl.compat import AIRFLOW_V_3_0_PLUS

if AIRFLOW_V_3_0_PLUS:
    from airflow.sdk.execution_time.context import OutletEventAccessors
else:  # Airflow 2.11
    from airflow.utils.context import OutletEventAccessors  # type: ignore[no-redef]


def outlet_events() -> Any:
    """What ``context["outlet_events"]`` is in a running task."""
    return OutletEventAccessors()


def alias_events(events: Any, alias: AssetAlias) -> list[tuple[str, dict[str, Any]]]:
    """(asset uri, extra) of each event added to ``alias``, on either line."""
    accessor = events[alias]
    if AIRFLOW_V_3_0_PLUS:
        return [(e.dest_asset_key.uri, e.extra) for e in accessor.asset_alias_events]
    return [(e["dest_dataset_uri"], e["extra"]) for e in accessor.dataset_alias_events]
