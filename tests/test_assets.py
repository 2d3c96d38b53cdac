"""The provider's assets: a model's stable asset, the aliases, and events from a task's context (both Airflow lines)."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.providers.common.compat.sdk import Asset, AssetAlias

from airflow_provider_tpu_rl.assets import (
    CONVERTED_EVENT_KEY,
    converted_checkpoint_asset,
    converted_checkpoint_asset_uri,
    emit_asset_events,
    flat_extra,
    model_asset,
    model_asset_uri,
    models_alias,
)
from airflow_provider_tpu_rl.operators.gke_jobs import MaxTextConvertOperator
from airflow_provider_tpu_rl.operators.tpu_vm import TpuVmStageOperator
from airflow_provider_tpu_rl.spec import tpu_vm_pipeline_from_conf
from tests.support.finished_jobs import RUN_ID, finish, job_operator
from tests.support.outlets import alias_events, outlet_events


def test_a_models_asset_is_stable_across_buckets_and_runs() -> None:
    assert model_asset_uri("qwen3-30b-a3b") == "tpu-rl://models/qwen3-30b-a3b"
    assert model_asset("qwen3-30b-a3b") == Asset("tpu-rl://models/qwen3-30b-a3b")


def test_an_alias_outlet_gets_the_models_asset_with_the_extra() -> None:
    events = outlet_events()
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
    events = outlet_events()
    mine = Asset("gs://my-bucket/qwen/hf-trained")
    emit_asset_events({"outlet_events": events}, [mine], model_asset_uri("m"), {"run_id": "d/r"})
    assert events[mine].extra == {"run_id": "d/r"}


def test_no_outlet_no_event_and_no_context_says_so() -> None:
    events = outlet_events()
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


# -- the converted checkpoint ---------------------------------------------------------------------------
def test_a_converted_checkpoints_asset_is_stable_per_preset() -> None:
    uri = converted_checkpoint_asset_uri("qwen3-30b-a3b")
    assert uri == "tpu-rl://converted-checkpoints/qwen3-30b-a3b"
    assert converted_checkpoint_asset("qwen3-30b-a3b") == Asset(uri)
    assert uri != model_asset_uri("qwen3-30b-a3b")


CONVERTED_EXTRA = {
    "run_id": f"adhoc_airflow/{RUN_ID}",
    "airflow_run_id": RUN_ID,
    "model": "qwen3-30b-a3b",
    "base_model": "Qwen/Qwen3-30B-A3B-Instruct-2507",
    "checkpoint_uri": "gs://b-1/qwen3-30b-a3b/max-text-format/",
    "parameters_uri": "gs://b-1/x/0/items/",
    "job_name": "tpu-rl-job-1",
    "reused": False,
}


def test_a_verified_conversion_gives_its_asset_outlet_the_checkpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    asset = converted_checkpoint_asset("qwen3-30b-a3b")
    op = job_operator(MaxTextConvertOperator, outlets=[asset])
    events = outlet_events()
    finish(op, monkeypatch, {"outlet_events": events})
    extra = events[asset].extra
    assert CONVERTED_EXTRA.items() <= {k: v for k, v in extra.items() if k != "dag_id"}.items()
    assert extra["run_id"] == f"{extra['dag_id']}/{RUN_ID}"
    assert extra["maxtext_release"]


def test_a_conversion_adds_the_presets_checkpoint_asset_to_an_alias_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    alias = AssetAlias("my-checkpoints")
    op = job_operator(MaxTextConvertOperator, outlets=[alias])
    events = outlet_events()
    context = {"run_id": RUN_ID, "outlet_events": events}
    result = finish(op, monkeypatch, context)
    # execute finishing a job that had already ended calls execute_complete: still one event
    op.emit_converted(context, result)
    ((uri, extra),) = alias_events(events, alias)
    assert uri == "tpu-rl://converted-checkpoints/qwen3-30b-a3b"
    assert extra["checkpoint_uri"] == "gs://b-1/qwen3-30b-a3b/max-text-format/"


def test_a_conversion_without_outlets_emits_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    events = outlet_events()
    finish(job_operator(MaxTextConvertOperator), monkeypatch, {"outlet_events": events})
    assert not list(events)


def test_the_tpu_vm_convert_stage_gives_its_outlets_the_checkpoint() -> None:
    asset = converted_checkpoint_asset("llama3.1-8b-Instruct")
    op = TpuVmStageOperator(
        task_id="convert_to_maxtext", stage="convert", bucket="b-1", vm_name="vm-1", zone="us-east5-b",
        model="llama3.1-8b-Instruct", outlets=[asset],
    )  # fmt: skip
    p = tpu_vm_pipeline_from_conf(
        {"project": "p-123456", "bucket": "b-1", "zone": "us-east5-b"}, run_id=RUN_ID
    )
    events = outlet_events()
    op.emit_converted({"run_id": RUN_ID, "outlet_events": events}, p, reused=True)
    extra = events[asset].extra
    assert extra["model"] == "llama3.1-8b-Instruct"
    assert extra["base_model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert extra["checkpoint_uri"] == "gs://b-1/llama3.1-8b-Instruct/mt-format/"
    assert extra["parameters_uri"] == "gs://b-1/llama3.1-8b-Instruct/mt-format/0/items"
    assert (extra["reused"], extra["job_name"]) == (True, None)


class PushingTI:
    """A task instance that keeps what the task pushed to XCom."""

    def __init__(self) -> None:
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any, **_: Any) -> None:
        self.pushed[key] = value


def test_a_conversion_leaves_its_event_for_the_pipelines_publishers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without outlets of its own (the shipped pipelines), the conversion still leaves the event's
    ``extra`` in XCom: publish_converted_<preset> emits it."""
    ti = PushingTI()
    finish(job_operator(MaxTextConvertOperator), monkeypatch, {"ti": ti, "outlet_events": outlet_events()})
    left = ti.pushed[CONVERTED_EVENT_KEY]
    assert CONVERTED_EXTRA.items() <= left.items()

    vm_ti = PushingTI()
    op = TpuVmStageOperator(
        task_id="convert_to_maxtext", stage="convert", bucket="b-1", vm_name="vm-1", zone="us-east5-b",
        model="llama3.1-8b-Instruct",
    )  # fmt: skip
    p = tpu_vm_pipeline_from_conf(
        {"project": "p-123456", "bucket": "b-1", "zone": "us-east5-b"}, run_id=RUN_ID
    )
    op.emit_converted({"run_id": RUN_ID, "ti": vm_ti}, p, reused=False)
    assert vm_ti.pushed[CONVERTED_EVENT_KEY]["checkpoint_uri"] == "gs://b-1/llama3.1-8b-Instruct/mt-format/"
    assert vm_ti.pushed[CONVERTED_EVENT_KEY]["reused"] is False
