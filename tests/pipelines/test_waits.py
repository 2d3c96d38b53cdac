"""The pipelines' waits on GCS (pipelines/waits.py): each sensor watches the path validate derives,
its step an int, and links the run's project."""

from __future__ import annotations

from typing import Any

from airflow_provider_tpu_rl.pipelines.validate import validate_pipeline_conf
from tests.support.pipeline_shapes import OWN_CLOUD, Shape, render


def test_sensors_watch_the_paths_validate_derives(pipeline: tuple[Any, Shape]) -> None:
    dag, shape = pipeline
    derived = validate_pipeline_conf(dag.dag_id, "manual__1", {}, {**shape.defaults, **OWN_CLOUD})
    actor_root = render(dag, "wait_actor_checkpoint", "checkpoint_root", derived)
    step = render(dag, "wait_actor_checkpoint", "step", derived)
    export_uri = render(dag, "wait_hf_export", "export_uri", derived)
    assert actor_root == derived["actor_root"]
    assert step == derived["final_step"] == 50
    assert isinstance(step, int)  # native rendering: the sensor gets an int, not "50"
    assert export_uri == derived["export_uri"]
    # Both pipelines watch GCS; the TPU VM's /dev/shm is gone with the VM.
    assert actor_root.startswith("gs://")
    assert export_uri.startswith("gs://")
    if True:  # both pipelines wait for the converted checkpoint
        converted = render(dag, "wait_converted_checkpoint", "checkpoint_root", derived)
        assert converted == derived["converted_root"]
        assert converted.startswith("gs://")
        sensor = dag.get_task("wait_converted_checkpoint")
        assert sensor.step == 0
        assert sensor.items == ("items",)


def test_sensor_links_name_the_project(pipeline: tuple[Any, Shape]) -> None:
    dag, shape = pipeline
    derived = validate_pipeline_conf(dag.dag_id, "manual__1", {}, {**shape.defaults, **OWN_CLOUD})
    for task in dag.tasks:
        if task.task_id.startswith("wait_"):
            assert "project_id" in task.template_fields, task.task_id
            assert render(dag, task.task_id, "project_id", derived) == derived["project"], task.task_id
