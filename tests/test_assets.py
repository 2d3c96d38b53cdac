"""The provider's assets: a model's stable asset, the aliases, and events from a task's context (both Airflow lines)."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.providers.common.compat.sdk import Asset, AssetAlias

from airflow_provider_tpu_rl.assets import (
    emit_asset_events,
    flat_extra,
    model_asset,
    model_asset_uri,
    models_alias,
)
from airflow_provider_tpu_rl.compat import AIRFLOW_V_3_0_PLUS

if AIRFLOW_V_3_0_PLUS:
    from airflow.sdk.execution_time.context import OutletEventAccessors
else:  # Airflow 2.11
    from airflow.utils.context import OutletEventAccessors  # type: ignore[no-redef]


def alias_events(events: Any, alias: AssetAlias) -> list[tuple[str, dict[str, Any]]]:
    """(asset uri, extra) of each event added to ``alias``, on either line."""
    accessor = events[alias]
    if AIRFLOW_V_3_0_PLUS:
        return [(e.dest_asset_key.uri, e.extra) for e in accessor.asset_alias_events]
    return [(e["dest_dataset_uri"], e["extra"]) for e in accessor.dataset_alias_events]


def test_a_models_asset_is_stable_across_buckets_and_runs() -> None:
    assert model_asset_uri("qwen3-30b-a3b") == "tpu-rl://models/qwen3-30b-a3b"
    assert model_asset("qwen3-30b-a3b") == Asset("tpu-rl://models/qwen3-30b-a3b")


def test_an_alias_outlet_gets_the_models_asset_with_the_extra() -> None:
    events = OutletEventAccessors()
    extra = {
        "run_id": "d/r",
        "export_uri": "gs://b/x/",
        "pre_mean_reward": 0.1,
        "steps": 3,
        "image_digest": None,
    }
    emitted = emit_asset_events({"outlet_events": events}, [models_alias()], model_asset_uri("m"), extra)
    assert emitted == ["tpu-rl://models/m (through alias tpu-rl-models)"]
    assert alias_events(events, models_alias()) == [("tpu-rl://models/m", extra)]


def test_a_plain_asset_outlet_gets_the_extra_on_its_own_event() -> None:
    events = OutletEventAccessors()
    mine = Asset("gs://my-bucket/qwen/hf-trained")
    emit_asset_events({"outlet_events": events}, [mine], model_asset_uri("m"), {"run_id": "d/r"})
    assert events[mine].extra == {"run_id": "d/r"}


def test_no_outlet_no_event_and_no_context_says_so() -> None:
    events = OutletEventAccessors()
    assert emit_asset_events({"outlet_events": events}, [], "tpu-rl://models/m", {"a": 1}) == []
    assert emit_asset_events({}, [models_alias()], "tpu-rl://models/m", {"a": 1}) == []


def test_an_alias_events_extra_must_be_flat() -> None:
    """Airflow 2.11 groups alias events by frozenset(extra.items()): a nested value crashes it."""
    with pytest.raises(TypeError, match="rewards"):
        flat_extra({"rewards": {"pre": 0.1}})


class _Event:
    def __init__(self, extra: dict[str, Any], timestamp: str) -> None:
        self.extra, self.timestamp = extra, timestamp


def test_the_triggering_events_extras_are_read_on_either_line_oldest_first() -> None:
    from airflow_provider_tpu_rl.assets import triggering_extras

    qwen, gemma = model_asset("qwen3-30b-a3b"), model_asset("gemma4-26b")
    newer, older = _Event({"run_id": "b"}, "2026-01-02"), _Event({"run_id": "a"}, "2026-01-01")
    # Airflow 3: keyed by the asset (a missing key raises KeyError)
    airflow3 = {"triggering_asset_events": {qwen: [newer], gemma: [older]}}
    assert triggering_extras(airflow3, [qwen, gemma]) == [{"run_id": "a"}, {"run_id": "b"}]
    # Airflow 2.11: keyed by the dataset's URI
    airflow2 = {"triggering_dataset_events": {qwen.uri: [newer, older]}}
    assert triggering_extras(airflow2, [qwen, gemma]) == [{"run_id": "a"}, {"run_id": "b"}]
    assert triggering_extras({"triggering_dataset_events": {}}, [qwen]) == []
