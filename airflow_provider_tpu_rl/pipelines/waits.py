"""The pipelines' three waits on GCS, the same on both: the converted checkpoint, the actor
checkpoint of the last step, the Hugging Face export (each deferred, bounded by ``sensor_bounds``)."""

from __future__ import annotations

from airflow_provider_tpu_rl.maxtext.layout import CONVERTED_CHECKPOINT_ITEMS, CONVERTED_CHECKPOINT_STEP
from airflow_provider_tpu_rl.pipelines.arguments import xcom
from airflow_provider_tpu_rl.pipelines.dag import sensor_bounds
from airflow_provider_tpu_rl.sensors.checkpoint import HuggingFaceExportSensor, MaxTextCheckpointSensor


def wait_converted_checkpoint() -> MaxTextCheckpointSensor:
    """``wait_converted_checkpoint``: ``to_maxtext``'s step, committed."""
    return MaxTextCheckpointSensor(
        task_id="wait_converted_checkpoint",
        project_id=xcom("project"),
        checkpoint_root=xcom("converted_root"),
        step=CONVERTED_CHECKPOINT_STEP,
        items=CONVERTED_CHECKPOINT_ITEMS,
        deferrable=True,
        poke_interval=30,
        **sensor_bounds(),
    )


def wait_actor_checkpoint(poke_interval: float) -> MaxTextCheckpointSensor:
    """``wait_actor_checkpoint``: the actor checkpoint of the run's last step, committed."""
    return MaxTextCheckpointSensor(
        task_id="wait_actor_checkpoint",
        project_id=xcom("project"),
        checkpoint_root=xcom("actor_root"),
        step=xcom("final_step"),
        deferrable=True,
        poke_interval=poke_interval,
        **sensor_bounds(),
    )


def wait_hf_export() -> HuggingFaceExportSensor:
    """``wait_hf_export``: the run's Hugging Face export, whole."""
    return HuggingFaceExportSensor(
        task_id="wait_hf_export",
        project_id=xcom("project"),
        export_uri=xcom("export_uri"),
        deferrable=True,
        poke_interval=30,
        **sensor_bounds(),
    )
