"""MaxTextCheckpointSensor and HuggingFaceExportSensor against the GCS emulator."""

from __future__ import annotations

import importlib
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast
from unittest import mock

import pytest
from airflow.providers.common.compat.sdk import PokeReturnValue

from airflow_provider_tpu_rl.compat import AirflowException, AirflowFailException, TaskDeferred
from airflow_provider_tpu_rl.exceptions import ConfigurationError
from airflow_provider_tpu_rl.links import GCSBrowserLink
from airflow_provider_tpu_rl.sensors.checkpoint import HuggingFaceExportSensor, MaxTextCheckpointSensor
from airflow_provider_tpu_rl.triggers.gcs_checkpoint import HuggingFaceExportTrigger, MaxTextCheckpointTrigger

if TYPE_CHECKING:
    from airflow.providers.common.compat.sdk import Context


def make_context() -> Context:
    """Just what the sensors touch: the task instance (for the GCS browser link's XCom)."""
    return cast("Context", {"ti": mock.MagicMock(name="ti")})


def done_value(result: bool | PokeReturnValue) -> dict[str, Any]:
    """The XCom of a poke that found what it waited for."""
    assert isinstance(result, PokeReturnValue)
    assert result.is_done
    return cast("dict[str, Any]", result.xcom_value)


@pytest.fixture
def actor_root(gcs_emulator, gcs_prefix) -> str:
    return f"{gcs_prefix}rl/checkpoints/actor/"


def checkpoint_sensor(gcs_emulator, root: str, **kwargs: Any) -> MaxTextCheckpointSensor:
    return MaxTextCheckpointSensor(
        task_id="wait_for_checkpoint",
        checkpoint_root=f"gs://{gcs_emulator.bucket_name}/{root}",
        poke_interval=0,
        **kwargs,
    )


def test_poke_is_false_while_the_step_has_no_commit_marker(gcs_emulator, actor_root) -> None:
    gcs_emulator.write_checkpoint_step(actor_root, 50, committed=False)
    gcs_emulator.upload([f"{actor_root}60.orbax-checkpoint-tmp-1724330000/model_params/_METADATA"])

    assert checkpoint_sensor(gcs_emulator, actor_root, step=50).poke(make_context()) is False
    assert checkpoint_sensor(gcs_emulator, actor_root, step=60).poke(make_context()) is False
    assert checkpoint_sensor(gcs_emulator, actor_root).poke(make_context()) is False


def test_poke_returns_the_uris_once_committed(gcs_emulator, actor_root) -> None:
    gcs_emulator.write_checkpoint_step(actor_root, 50, committed=True)
    sensor = checkpoint_sensor(gcs_emulator, actor_root, step=50, items=("model_params", "optimizer_state"))

    value = done_value(sensor.poke(make_context()))

    base = f"gs://{gcs_emulator.bucket_name}/{actor_root}50/"
    assert value == {
        "status": "success",
        "uris": [base + "model_params/", base + "optimizer_state/"],
        "step": 50,
        "checkpoint_uri": base + "model_params/",
    }


def test_poke_picks_the_latest_complete_step(gcs_emulator, actor_root) -> None:
    for step, committed in ((10, True), (20, True), (30, False)):
        gcs_emulator.write_checkpoint_step(actor_root, step, committed=committed)

    value = done_value(checkpoint_sensor(gcs_emulator, actor_root).poke(make_context()))

    assert value["step"] == 20


def test_rendered_string_step_is_an_int(gcs_emulator, actor_root) -> None:
    gcs_emulator.write_checkpoint_step(actor_root, 10, committed=True)
    gcs_emulator.write_checkpoint_step(actor_root, 20, committed=True)

    value = done_value(checkpoint_sensor(gcs_emulator, actor_root, step="10").poke(make_context()))

    assert value["step"] == 10


def test_converted_checkpoint(gcs_emulator, gcs_prefix) -> None:
    root = f"{gcs_prefix}max-text-format/"
    gcs_emulator.write_checkpoint_step(root, 0, committed=True, items=("items",))

    value = done_value(checkpoint_sensor(gcs_emulator, root, step=0, items=("items",)).poke(make_context()))

    assert value["checkpoint_uri"] == f"gs://{gcs_emulator.bucket_name}/{root}0/items/"


def test_poke_fails_for_good_when_a_committed_step_lacks_an_item(gcs_emulator, actor_root) -> None:
    gcs_emulator.write_checkpoint_step(actor_root, 50, committed=True, items=("model_params",))
    sensor = checkpoint_sensor(gcs_emulator, actor_root, step=50, items=("model_params", "optimizer_state"))

    with pytest.raises(AirflowFailException, match="optimizer_state"):
        sensor.poke(make_context())


def test_poke_fails_for_good_when_an_item_of_a_committed_step_lost_its_marker(
    gcs_emulator, actor_root
) -> None:
    """MaxText's reader (Orbax's restore) refuses an item without its own commit_success.txt."""
    gcs_emulator.write_checkpoint_step(actor_root, 50, committed=True, uncommitted_items=("model_params",))
    sensor = checkpoint_sensor(gcs_emulator, actor_root, step=50, items=("model_params",))

    with pytest.raises(AirflowFailException, match=r"model_params/commit_success\.txt"):
        sensor.poke(make_context())


def test_poke_mode_execute_returns_the_payload_and_persists_the_link(gcs_emulator, actor_root) -> None:
    gcs_emulator.write_checkpoint_step(actor_root, 50, committed=True)
    sensor = checkpoint_sensor(gcs_emulator, actor_root, step=50, deferrable=False)
    ti = mock.MagicMock(name="ti")

    result = sensor.execute(cast("Context", {"ti": ti}))

    assert result["step"] == 50
    ti.xcom_push.assert_called_once_with(
        key=GCSBrowserLink.key, value={"uri": f"gs://{gcs_emulator.bucket_name}/{actor_root}"}
    )


def test_deferrable_execute_defers_to_the_trigger(gcs_emulator, actor_root) -> None:
    gcs_emulator.write_checkpoint_step(actor_root, 50, committed=False)
    sensor = checkpoint_sensor(gcs_emulator, actor_root, step=50, timeout=3600, deferrable=True)

    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(make_context())

    trigger = deferred.value.trigger
    assert isinstance(trigger, MaxTextCheckpointTrigger)
    assert deferred.value.method_name == "execute_complete"
    assert deferred.value.timeout == timedelta(seconds=3600)
    classpath, kwargs = trigger.serialize()
    assert kwargs == {
        "checkpoint_root": f"gs://{gcs_emulator.bucket_name}/{actor_root}",
        "step": 50,
        "items": ["model_params"],
        "poke_interval": 0.0,
        "gcp_conn_id": "google_cloud_default",
        "impersonation_chain": None,
    }
    module_name, class_name = classpath.rsplit(".", 1)
    rebuilt = getattr(importlib.import_module(module_name), class_name)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)


def test_deferrable_execute_returns_at_once_when_already_complete(gcs_emulator, actor_root) -> None:
    gcs_emulator.write_checkpoint_step(actor_root, 50, committed=True)

    result = checkpoint_sensor(gcs_emulator, actor_root, step=50, deferrable=True).execute(make_context())

    assert result["checkpoint_uri"].endswith("/50/model_params/")


def test_execute_complete() -> None:
    sensor = MaxTextCheckpointSensor(task_id="s", checkpoint_root="gs://b/r/")
    success = {"status": "success", "uris": ["gs://b/r/5/model_params/"], "step": 5, "checkpoint_uri": "x"}

    assert sensor.execute_complete(make_context(), success) == success
    with pytest.raises(AirflowException, match="404 Not Found") as raised:
        sensor.execute_complete(
            make_context(), {"status": "error", "message": "ClientResponseError: 404 Not Found"}
        )
    assert not isinstance(raised.value, AirflowFailException)
    with pytest.raises(AirflowFailException, match="never appear"):
        sensor.execute_complete(make_context(), {"status": "error", "message": "never appear", "fatal": True})
    with pytest.raises(AirflowException):
        sensor.execute_complete(make_context(), None)


def test_template_fields() -> None:
    assert {"checkpoint_root", "bucket", "prefix", "step", "items"} <= set(
        MaxTextCheckpointSensor.template_fields
    )
    assert {"export_uri", "bucket", "prefix"} <= set(HuggingFaceExportSensor.template_fields)


def test_a_bad_step_is_a_configuration_error_that_execute_makes_fatal() -> None:
    """The helper raises the provider's ConfigurationError; the sensor (an operator) fails for good."""
    sensor = MaxTextCheckpointSensor(task_id="s", checkpoint_root="gs://b/r/", step="fifty")

    with pytest.raises(ConfigurationError, match="step must be an integer") as raised:
        sensor.poke(make_context())
    assert not isinstance(raised.value, AirflowFailException)
    for deferrable in (True, False):
        sensor.deferrable = deferrable
        with pytest.raises(AirflowFailException, match="step must be an integer"):
            sensor.execute(make_context())


@pytest.mark.parametrize("items", [(), "model_params"])
def test_sensor_refuses_bad_items_in_execute_for_good(items: Any) -> None:
    sensor = MaxTextCheckpointSensor(task_id="s", checkpoint_root="gs://b/r/", items=items)  # built fine
    with pytest.raises(AirflowFailException, match="items must be a non-empty list"):
        sensor.execute(make_context())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "checkpoint_root or bucket is required"),
        ({"checkpoint_root": "gs://b/r/", "bucket": "b"}, "not both"),
    ],
)
def test_sensor_needs_one_location(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(AirflowFailException, match=message):
        MaxTextCheckpointSensor(task_id="s", **kwargs).execute(make_context())


def test_bucket_and_prefix_name_the_same_folder_as_a_uri(gcs_emulator, actor_root) -> None:
    gcs_emulator.write_checkpoint_step(actor_root, 50, committed=True)
    by_uri = checkpoint_sensor(gcs_emulator, actor_root, step=50).poke(make_context())
    by_parts = MaxTextCheckpointSensor(
        task_id="s", bucket=gcs_emulator.bucket_name, prefix=actor_root, step=50, poke_interval=0
    ).poke(make_context())
    assert isinstance(by_uri, PokeReturnValue)
    assert isinstance(by_parts, PokeReturnValue)
    assert by_parts.is_done is True
    assert by_parts.xcom_value == by_uri.xcom_value


# --- Hugging Face export ------------------------------------------------------------------------


def export_sensor(gcs_emulator, folder: str, **kwargs: Any) -> HuggingFaceExportSensor:
    return HuggingFaceExportSensor(
        task_id="wait_for_export",
        export_uri=f"gs://{gcs_emulator.bucket_name}/{folder}",
        poke_interval=0,
        **kwargs,
    )


def test_export_poke_waits_for_a_missing_shard_then_succeeds(gcs_emulator, gcs_prefix) -> None:
    folder = f"{gcs_prefix}hf-trained/"
    gcs_emulator.write_hf_export(folder, shard_count=3, skip_shards=[2])
    sensor = export_sensor(gcs_emulator, folder)

    assert sensor.poke(make_context()) is False

    gcs_emulator.upload([f"{folder}model-00002-of-00003.safetensors"])
    value = done_value(sensor.poke(make_context()))

    assert value["export_uri"] == f"gs://{gcs_emulator.bucket_name}/{folder}"
    assert value["weight_files"] == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]


def test_export_sensor_defers_with_the_export_trigger(gcs_emulator, gcs_prefix) -> None:
    folder = f"{gcs_prefix}hf-trained/"
    gcs_emulator.upload([f"{folder}config.json"])

    with pytest.raises(TaskDeferred) as deferred:
        export_sensor(gcs_emulator, folder, deferrable=True).execute(make_context())

    trigger = deferred.value.trigger
    assert isinstance(trigger, HuggingFaceExportTrigger)
    classpath, kwargs = trigger.serialize()
    assert kwargs["export_uri"] == f"gs://{gcs_emulator.bucket_name}/{folder}"
    module_name, class_name = classpath.rsplit(".", 1)
    assert getattr(importlib.import_module(module_name), class_name)(**kwargs).serialize() == (
        classpath,
        kwargs,
    )


# --- what the sensors log, and their console link -----------------------------------------------


def test_checkpoint_sensor_logs_what_it_found(gcs_emulator, actor_root, caplog, capsys) -> None:
    gcs_emulator.write_checkpoint_step(actor_root, 50, committed=True)
    sensor = checkpoint_sensor(gcs_emulator, actor_root, step=50, items=("model_params", "optimizer_state"))

    with caplog.at_level("INFO"):
        done_value(sensor.poke(make_context()))

    logged = caplog.text + capsys.readouterr().out
    step_folder = f"gs://{gcs_emulator.bucket_name}/{actor_root}50/"
    assert (
        f"Found checkpoint step 50 at {step_folder}: commit marker commit_success.txt present; "
        "items model_params/, optimizer_state/ (2 item folder(s))"
    ) in logged


def test_checkpoint_sensor_logs_the_triggers_find_too(caplog, capsys) -> None:
    sensor = MaxTextCheckpointSensor(task_id="s", checkpoint_root="gs://b/r/")
    event = {
        "status": "success",
        "uris": ["gs://b/r/7/model_params/"],
        "step": 7,
        "checkpoint_uri": "gs://b/r/7/model_params/",
    }

    with caplog.at_level("INFO"):
        sensor.execute_complete(make_context(), event)

    logged = caplog.text + capsys.readouterr().out
    assert (
        "Found checkpoint step 7 at gs://b/r/7/: commit marker commit_success.txt present; items model_params/"
        in logged
    )


def test_export_sensor_logs_the_object_count_and_files(gcs_emulator, gcs_prefix, caplog, capsys) -> None:
    folder = f"{gcs_prefix}hf-trained/"
    gcs_emulator.write_hf_export(folder, shard_count=3)
    sensor = export_sensor(gcs_emulator, folder)

    with caplog.at_level("INFO"):
        value = done_value(sensor.poke(make_context()))

    logged = caplog.text + capsys.readouterr().out
    others = sorted(uri.rsplit("/", 1)[-1] for uri in value["uris"])
    others = [name for name in others if name not in value["weight_files"]]
    assert "model.safetensors.index.json" in others
    assert (
        f"Found a complete Hugging Face export at gs://{gcs_emulator.bucket_name}/{folder}: "
        f"{len(value['uris'])} objects, 3 weight file(s), and {', '.join(others)}"
    ) in logged


def test_the_gcs_link_names_the_project_when_given(gcs_emulator, actor_root) -> None:
    gcs_emulator.write_checkpoint_step(actor_root, 50, committed=True)
    sensor = checkpoint_sensor(gcs_emulator, actor_root, step=50, project_id="my-proj")
    ti = mock.MagicMock(name="ti")

    sensor.execute(cast("Context", {"ti": ti}))

    uri = f"gs://{gcs_emulator.bucket_name}/{actor_root}"
    ti.xcom_push.assert_called_once_with(key=GCSBrowserLink.key, value={"uri": uri, "project_id": "my-proj"})
    assert GCSBrowserLink.format_url(uri=uri, project_id="my-proj").endswith("?project=my-proj")
    assert "project_id" in MaxTextCheckpointSensor.template_fields
    assert "project_id" in HuggingFaceExportSensor.template_fields
