"""Serialisation and failure paths of the GCS checkpoint/export triggers (no GCS needed).

Polling behaviour against the emulator is in tests/triggers/test_gcs_checkpoint_on_emulator.py.
"""

from __future__ import annotations

import asyncio
import importlib
from typing import Any

import pytest
from airflow.triggers.base import BaseTrigger

from airflow_provider_tpu_rl.triggers.gcs_checkpoint import HuggingFaceExportTrigger, MaxTextCheckpointTrigger


def rebuild(trigger: BaseTrigger) -> BaseTrigger:
    """What the triggerer does: import the classpath and call it with the serialised kwargs."""
    classpath, kwargs = trigger.serialize()
    module_name, class_name = classpath.rsplit(".", 1)
    return getattr(importlib.import_module(module_name), class_name)(**kwargs)


async def first_payload(trigger: BaseTrigger) -> dict[str, Any]:
    event = await asyncio.wait_for(anext(trigger.run()), timeout=30)
    return event.payload


def test_checkpoint_trigger_serialisation_round_trips() -> None:
    trigger = MaxTextCheckpointTrigger(
        checkpoint_root="gs://b/m/trained/rl/checkpoints/actor/",
        step=None,
        items=("model_params", "optimizer_state"),
        poke_interval=30.0,
        gcp_conn_id="gcp",
        impersonation_chain=["sa@p.iam.gserviceaccount.com"],
    )

    classpath, kwargs = trigger.serialize()

    assert classpath == "airflow_provider_tpu_rl.triggers.gcs_checkpoint.MaxTextCheckpointTrigger"
    assert kwargs == {
        "checkpoint_root": "gs://b/m/trained/rl/checkpoints/actor/",
        "step": None,
        "items": ["model_params", "optimizer_state"],
        "poke_interval": 30.0,
        "gcp_conn_id": "gcp",
        "impersonation_chain": ["sa@p.iam.gserviceaccount.com"],
    }
    rebuilt = rebuild(trigger)
    assert isinstance(rebuilt, MaxTextCheckpointTrigger)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert rebuilt.items == ("model_params", "optimizer_state")


def test_export_trigger_serialisation_round_trips() -> None:
    trigger = HuggingFaceExportTrigger(export_uri="gs://b/m/hf-trained/", poke_interval=5, gcp_conn_id="gcp")

    rebuilt = rebuild(trigger)

    assert isinstance(rebuilt, HuggingFaceExportTrigger)
    assert rebuilt.serialize() == trigger.serialize()
    assert trigger.serialize()[1]["export_uri"] == "gs://b/m/hf-trained/"


def test_hooks_get_the_connection_and_impersonation_chain() -> None:
    trigger = MaxTextCheckpointTrigger(
        "gs://b/r/", 5, ("model_params",), 1, "gcp", "sa@p.iam.gserviceaccount.com"
    )

    hook_kwargs = trigger._get_async_hook()._hook_kwargs

    assert hook_kwargs == {"gcp_conn_id": "gcp", "impersonation_chain": "sa@p.iam.gserviceaccount.com"}


def test_checkpoint_trigger_needs_an_item() -> None:
    with pytest.raises(ValueError):
        MaxTextCheckpointTrigger("gs://b/r/", 5, (), 1, "gcp")


@pytest.mark.parametrize(
    "trigger",
    [
        MaxTextCheckpointTrigger("s3://b/r/", 5, ("model_params",), 0.01, "gcp"),
        HuggingFaceExportTrigger("/local/hf-trained/", 0.01, "gcp"),
    ],
)
async def test_a_non_gcs_uri_ends_in_an_error_event(trigger: BaseTrigger) -> None:
    payload = await first_payload(trigger)

    assert payload["status"] == "error"
    assert "gs://" in payload["message"]


class _BrokenHook:
    async def get_storage_client(self, session: Any) -> Any:
        raise PermissionError("403 caller does not have storage.objects.list access")


@pytest.mark.parametrize(
    "trigger",
    [
        MaxTextCheckpointTrigger("gs://b/r/", 5, ("model_params",), 0.01, "gcp"),
        HuggingFaceExportTrigger("gs://b/hf/", 0.01, "gcp"),
    ],
)
async def test_a_gcs_failure_ends_in_an_error_event(trigger: BaseTrigger, monkeypatch) -> None:
    monkeypatch.setattr(trigger, "_get_async_hook", _BrokenHook)

    payload = await first_payload(trigger)

    assert payload == {
        "status": "error",
        "message": "PermissionError: 403 caller does not have storage.objects.list access",
    }
