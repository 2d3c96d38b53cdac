"""MaxTextCheckpointTrigger and HuggingFaceExportTrigger polling the GCS emulator.

The emulator is the session's (tests/conftest.py), shared with the sensor tests; the trigger's pure
tests are in tests/triggers/test_gcs_checkpoint.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from airflow.triggers.base import BaseTrigger, TriggerEvent

import airflow_provider_tpu_rl.triggers.gcs_checkpoint as trigger_module
from airflow_provider_tpu_rl.triggers.gcs_checkpoint import HuggingFaceExportTrigger, MaxTextCheckpointTrigger

# Generous bounds: they only stop a broken test from hanging, no test asserts on how long anything takes.
EVENT_DEADLINE_SECONDS = 30.0


@pytest.fixture
def poll_counter(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Counts the trigger's polls (each runs one probe) and signals once a few have happened."""
    state: dict[str, Any] = {"polls": 0, "enough": asyncio.Event(), "wanted": 3}
    real_run_probe = trigger_module.run_probe_async

    async def counting_run_probe(*args: Any, **kwargs: Any) -> Any:
        result = await real_run_probe(*args, **kwargs)
        state["polls"] += 1
        if state["polls"] >= state["wanted"]:
            state["enough"].set()
        return result

    monkeypatch.setattr(trigger_module, "run_probe_async", counting_run_probe)
    return state


async def assert_still_waiting_after_polls(trigger: BaseTrigger, poll_counter: dict[str, Any]) -> None:
    """Run the trigger until it has polled a few times and check it has not yielded an event."""
    events: AsyncIterator[TriggerEvent] = trigger.run()
    first_event = asyncio.ensure_future(anext(events))
    enough_polls = asyncio.ensure_future(poll_counter["enough"].wait())
    try:
        await asyncio.wait(
            {first_event, enough_polls}, timeout=EVENT_DEADLINE_SECONDS, return_when=asyncio.FIRST_COMPLETED
        )
        if first_event.done():
            pytest.fail(f"trigger yielded while incomplete: {first_event.result().payload}")
        assert poll_counter["polls"] >= poll_counter["wanted"]
    finally:
        for pending in (first_event, enough_polls):
            pending.cancel()
        await asyncio.gather(first_event, enough_polls, return_exceptions=True)
        await events.aclose()  # type: ignore[attr-defined]


async def first_event_of(trigger: BaseTrigger) -> dict[str, Any]:
    event = await asyncio.wait_for(anext(trigger.run()), timeout=EVENT_DEADLINE_SECONDS)
    return event.payload


def checkpoint_trigger(gcs_emulator, root: str, step: int | None, items=("model_params",)):
    return MaxTextCheckpointTrigger(
        checkpoint_root=f"gs://{gcs_emulator.bucket_name}/{root}",
        step=step,
        items=items,
        poke_interval=0.01,
        gcp_conn_id="google_cloud_default",
    )


async def test_trigger_keeps_waiting_on_an_uncommitted_step(gcs_emulator, gcs_prefix, poll_counter) -> None:
    root = f"{gcs_prefix}actor/"
    gcs_emulator.write_checkpoint_step(root, 50, committed=False)
    gcs_emulator.upload([f"{root}60.orbax-checkpoint-tmp-1724330000/model_params/_METADATA"])

    await assert_still_waiting_after_polls(checkpoint_trigger(gcs_emulator, root, 50), poll_counter)


async def test_latest_mode_keeps_waiting_while_only_tmp_folders_exist(
    gcs_emulator, gcs_prefix, poll_counter
) -> None:
    root = f"{gcs_prefix}actor/"
    gcs_emulator.upload([f"{root}10.orbax-checkpoint-tmp-1724330000/model_params/_METADATA"])

    await assert_still_waiting_after_polls(checkpoint_trigger(gcs_emulator, root, None), poll_counter)


async def test_trigger_fires_with_the_uris_when_committed(gcs_emulator, gcs_prefix) -> None:
    root = f"{gcs_prefix}actor/"
    gcs_emulator.write_checkpoint_step(root, 50, committed=True)
    trigger = checkpoint_trigger(gcs_emulator, root, 50, items=("model_params", "optimizer_state"))

    payload = await first_event_of(trigger)

    base = f"gs://{gcs_emulator.bucket_name}/{root}50/"
    assert payload == {
        "status": "success",
        "uris": [base + "model_params/", base + "optimizer_state/"],
        "step": 50,
        "checkpoint_uri": base + "model_params/",
    }


async def test_trigger_fires_once_the_marker_lands(gcs_emulator, gcs_prefix, poll_counter) -> None:
    """Start while the step is being written; commit it after a few polls; the same run then fires."""
    root = f"{gcs_prefix}actor/"
    gcs_emulator.write_checkpoint_step(root, 50, committed=False)
    events = checkpoint_trigger(gcs_emulator, root, 50).run()
    first_event = asyncio.ensure_future(anext(events))

    enough_polls = asyncio.ensure_future(poll_counter["enough"].wait())
    await asyncio.wait(
        {first_event, enough_polls}, timeout=EVENT_DEADLINE_SECONDS, return_when=asyncio.FIRST_COMPLETED
    )
    assert not first_event.done(), "fired before the commit marker was written"
    assert enough_polls.done()
    markers = [f"{root}50/{item}/commit_success.txt" for item in ("model_params", "optimizer_state")]
    await asyncio.to_thread(gcs_emulator.upload, [*markers, f"{root}50/commit_success.txt"])
    event = await asyncio.wait_for(first_event, timeout=EVENT_DEADLINE_SECONDS)

    assert event.payload["status"] == "success"
    assert event.payload["step"] == 50


async def test_latest_mode_selects_the_newest_complete_step(gcs_emulator, gcs_prefix) -> None:
    root = f"{gcs_prefix}actor/"
    for step, committed in ((10, True), (20, True), (30, False)):
        gcs_emulator.write_checkpoint_step(root, step, committed=committed)

    payload = await first_event_of(checkpoint_trigger(gcs_emulator, root, None))

    assert payload["step"] == 20
    assert payload["checkpoint_uri"] == f"gs://{gcs_emulator.bucket_name}/{root}20/model_params/"


async def test_committed_step_without_the_item_is_a_fatal_error(gcs_emulator, gcs_prefix) -> None:
    root = f"{gcs_prefix}actor/"
    gcs_emulator.write_checkpoint_step(root, 50, committed=True, items=("model_params",))
    trigger = checkpoint_trigger(gcs_emulator, root, 50, items=("model_params", "optimizer_state"))

    payload = await first_event_of(trigger)

    assert payload["status"] == "error"
    assert payload["fatal"] is True
    assert "optimizer_state" in payload["message"]


async def test_missing_bucket_is_an_error_event(gcs_emulator) -> None:
    trigger = MaxTextCheckpointTrigger(
        checkpoint_root="gs://no-such-bucket-here/actor/",
        step=None,
        items=("model_params",),
        poke_interval=0.01,
        gcp_conn_id="google_cloud_default",
    )

    payload = await first_event_of(trigger)

    assert payload["status"] == "error"
    assert "404" in payload["message"]


def export_trigger(gcs_emulator, folder: str) -> HuggingFaceExportTrigger:
    return HuggingFaceExportTrigger(
        export_uri=f"gs://{gcs_emulator.bucket_name}/{folder}",
        poke_interval=0.01,
        gcp_conn_id="google_cloud_default",
    )


async def test_export_trigger_waits_while_a_shard_is_missing(gcs_emulator, gcs_prefix, poll_counter) -> None:
    folder = f"{gcs_prefix}hf-trained/"
    gcs_emulator.write_hf_export(folder, shard_count=4, skip_shards=[3])

    await assert_still_waiting_after_polls(export_trigger(gcs_emulator, folder), poll_counter)


async def test_export_trigger_fires_when_complete(gcs_emulator, gcs_prefix) -> None:
    folder = f"{gcs_prefix}hf-trained/"
    gcs_emulator.write_hf_export(folder, shard_count=2)

    payload = await first_event_of(export_trigger(gcs_emulator, folder))

    base = f"gs://{gcs_emulator.bucket_name}/{folder}"
    assert payload["status"] == "success"
    assert payload["export_uri"] == base
    assert payload["weight_files"] == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    assert set(payload["uris"]) == {
        base + name
        for name in (
            "config.json",
            "tokenizer_config.json",
            "tokenizer.json",
            "model.safetensors.index.json",
            "model-00001-of-00002.safetensors",
            "model-00002-of-00002.safetensors",
        )
    }
