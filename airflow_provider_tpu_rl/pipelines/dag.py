"""What every task of the shipped pipelines shares: the DAG's settings, the ledger's callbacks,
the bounds of a task and of a sensor, the ``record_run`` teardown, the graph's stage groups and the
task order."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from airflow.providers.common.compat.sdk import DAG, TaskGroup, chain

from airflow_provider_tpu_rl.assets import converted_checkpoint_asset, model_asset
from airflow_provider_tpu_rl.ledger.hook import step_callbacks
from airflow_provider_tpu_rl.operators.gke import EnsureBucketOperator, HfTokenSecretOperator
from airflow_provider_tpu_rl.operators.ledger import RecordRunOperator
from airflow_provider_tpu_rl.operators.preflight import TpuRlPreflightOperator
from airflow_provider_tpu_rl.operators.promotion import (
    PromoteModelOperator,
    PublishConvertedCheckpointOperator,
    PublishModelAssetOperator,
    publish_converted_task_id,
    publish_task_id,
)
from airflow_provider_tpu_rl.pipelines.arguments import PIPELINE_MACROS, transient_retries
from airflow_provider_tpu_rl.pipelines.failures import WATCHER_TASK_ID, note_failure
from airflow_provider_tpu_rl.pipelines.form import pipeline_params
from airflow_provider_tpu_rl.timeouts import dagrun_timeout, job_timeout, task_timeout

LEDGER_CONN_ID: Final = "tpu_rl_ledger"


def pipeline_callbacks(conn_id: str = LEDGER_CONN_ID) -> dict[str, Any]:
    """Task callbacks of the pipelines' ``default_args``: the ledger's step rows, and on failure
    the first line of the error in XCom (what the watcher names)."""
    callbacks: dict[str, Any] = dict(step_callbacks(conn_id))
    callbacks["on_failure_callback"] = [callbacks["on_failure_callback"], note_failure]
    return callbacks


def bounded(stage: str) -> dict[str, Any]:
    """``execution_timeout`` of a task of ``stage`` (:func:`~airflow_provider_tpu_rl.timeouts.task_timeout`).

    Given to every task of the shipped DAGs. A job operator's own ``job_timeout`` defaults to a
    little less (:func:`~airflow_provider_tpu_rl.timeouts.job_timeout`), so it cancels its job first.
    """
    return {"execution_timeout": task_timeout(stage)}


def sensor_bounds() -> dict[str, Any]:
    """A checkpoint sensor's ``timeout`` (how long it waits, deferred or not) and its task's bound.

    In Airflow 3 a deferred task's wait is bounded by the trigger's timeout (the sensor's
    ``timeout``), not by ``execution_timeout``: the worker's deferral request leaves it out
    (airflow-core ``execution_api/routes/task_instances.py``, "TODO: HANDLE execution timeout
    later"); Airflow 2.11 bounds it by both (``TaskInstance._defer_task``). Both are set, the
    sensor's a little shorter so it fails with its own message.
    """
    return {
        "timeout": job_timeout("checkpoint").total_seconds(),
        "execution_timeout": task_timeout("checkpoint"),
    }


def record_run_task(cluster_task_ids: Sequence[str], **collect_options: Any) -> RecordRunOperator:
    """``record_run``: a teardown writing the run, its steps, metrics and artifacts to the ledger,
    and the run's curves to a PNG in its output folder (linked from the task)."""
    return RecordRunOperator(
        task_id="record_run",
        conn_id=LEDGER_CONN_ID,
        cluster_task_ids=tuple(cluster_task_ids),
        # A failed destroy fails the run here too (it leaked a billed resource), as the watcher does.
        teardown_task_ids=(),
        ignored_task_ids=(WATCHER_TASK_ID,),
        collect_options=collect_options,
        **bounded("short"),
    ).as_teardown()


def promote_model_task(
    args: Mapping[str, Any], cluster_task_ids: Sequence[str], models: Sequence[str], **collect_options: Any
) -> PromoteModelOperator:
    """``promote_model``: the model card, the export checked with it, and the promotion gate (skipped
    when the model's reward gain is below ``min_reward_gain``); then one ``publish_<preset>`` per
    preset of the pipeline, whose outlet is that model's asset (only the run's model emits)."""
    promote = PromoteModelOperator(
        task_id="promote_model",
        conn_id=LEDGER_CONN_ID,
        cluster_task_ids=tuple(cluster_task_ids),
        collect_options=collect_options,
        **args,
        **bounded("short"),
    )
    for preset in models:
        promote >> PublishModelAssetOperator(
            task_id=publish_task_id(preset),
            model=args["model"],
            preset=preset,
            outlets=[model_asset(preset)],
            **bounded("short"),
        )
    return promote


def publish_converted_tasks(model: str, models: Sequence[str], after: Any) -> None:
    """One ``publish_converted_<preset>`` per preset of the pipeline, after ``after`` (the converted
    checkpoint's commit sensor), whose outlet is that preset's converted-checkpoint asset: the run's
    model emits the event ``convert_to_maxtext`` left in XCom, the others skip."""
    for preset in models:
        after >> PublishConvertedCheckpointOperator(
            task_id=publish_converted_task_id(preset),
            model=model,
            preset=preset,
            outlets=[converted_checkpoint_asset(preset)],
            **bounded("short"),
        )


# The graph's groups of a pipeline's stages: what each holds, in words (the group's tooltip).
STAGE_GROUP_TOOLTIPS: Final[Mapping[str, str]] = {
    "prepare": (
        "Checks, the bucket, the HF token secret, the machines the conversion runs on and the TPU "
        "VM's boot image (on GKE: the training image's copy the TPU node pool streams)"
    ),
    "conversion": "Hugging Face checkpoint to MaxText, and its commit in the bucket",
    "training": "The billed TPUs: created, trained on until the actor checkpoint is committed, deleted",
    "export": "MaxText checkpoint to Hugging Face, and its commit in the bucket",
    "teardown": "What is left deleted, and the run recorded in the ledger",
}


def stage_group(group_id: str) -> TaskGroup:
    """A group of one of a pipeline's stages in the graph (``with stage_group("training"): ...``).

    Its tasks keep their own ids (``prefix_group_id=False``): the task orders, the ledger's rows,
    the watcher's and preflight's lines, ``tpu-rl plan`` and the docs name tasks by id.
    """
    return TaskGroup(group_id=group_id, prefix_group_id=False, tooltip=STAGE_GROUP_TOOLTIPS[group_id])


def chain_in_order(order: Sequence[str], dag: DAG, beside: Mapping[str, str] | None = None) -> None:
    """Chain the DAG's tasks in the pipeline's task order (``GKE_TASK_ORDER`` / ``TPU_VM_TASK_ORDER``);
    a task of ``beside`` (``TPU_VM_SIDE_TASKS``: task → the one it follows) runs after that one
    instead, beside the main line (the DAG file joins it back)."""
    by_id = dag.task_dict
    side = dict(beside or {})
    missing = [task_id for task_id in [*order, *side.values()] if task_id not in by_id]
    if missing:
        raise ValueError(f"the DAG lacks tasks of its order: {missing}")
    chain(*(by_id[task_id] for task_id in order if task_id not in side))
    for task_id, after in side.items():
        by_id[after] >> by_id[task_id]


def pipeline_dag(pipeline: str, *, dag_id: str, description: str, tags: Sequence[str], doc_md: str) -> DAG:
    """A pipeline DAG with the settings both share: its trigger form from the run parameters'
    table, ``validate``'s macro, native templates, the ledger's callbacks, no retry unless a task
    asks, and a ``dagrun_timeout`` backstop above the tasks' own bounds (a timed-out run skips its
    teardown: see ``timeouts``)."""
    return DAG(
        dag_id=dag_id,
        description=description,
        schedule=None,
        catchup=False,
        params=pipeline_params(pipeline),
        render_template_as_native_obj=True,
        user_defined_macros=PIPELINE_MACROS,
        tags=["tpu-rl", "maxtext", "grpo", *tags],
        doc_md=doc_md,
        dagrun_timeout=dagrun_timeout(pipeline),
        default_args={"owner": "tpu-rl", "retries": 0, **pipeline_callbacks(LEDGER_CONN_ID)},
    )


def transient(stage: str) -> dict[str, Any]:
    """A task's retries for transient failures (capacity, API 5xx, network) and its stage's bound."""
    return {**transient_retries(), **bounded(stage)}


def first_steps(
    args: Mapping[str, Mapping[str, Any]],
) -> tuple[TpuRlPreflightOperator, EnsureBucketOperator, HfTokenSecretOperator]:
    """The tasks both pipelines start with, after ``validate``: ``preflight`` (toolchain, APIs,
    permissions, capacity: one line per problem, before anything exists), ``ensure_bucket`` and
    ``sync_hf_token``."""
    preflight = TpuRlPreflightOperator(task_id="preflight", **args["preflight"], **transient("preflight"))
    ensure_bucket = EnsureBucketOperator(
        task_id="ensure_bucket", **args["ensure_bucket"], **transient("short")
    )
    sync_hf_token = HfTokenSecretOperator(
        task_id="sync_hf_token", **args["sync_hf_token"], **transient("short")
    )
    return preflight, ensure_bucket, sync_hf_token
