"""Building blocks shared by the two pipeline DAGs: the trigger form, ``validate``, the ledger
record, the watcher. The DAG files in ``dags/`` only list their tasks.

Nothing here runs at import time beyond building Params; no cloud call, no rendering.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from airflow.providers.common.compat.sdk import (
    DAG,
    AirflowFailException,
    Param,
    TriggerRule,
    chain,
    get_current_context,
    task,
    teardown,
)

from airflow_provider_tpu_rl.ledger.hook import record_run_from_context
from airflow_provider_tpu_rl.operators.pipeline import validate_pipeline_conf
from airflow_provider_tpu_rl.spec import PRESETS, Runner, rules
from airflow_provider_tpu_rl.spec.presets import presets_for

LEDGER_CONN_ID: Final = "tpu_rl_ledger"
WATCHER_TASK_ID: Final = "watcher"
CLOUD, CLUSTER, VM, MODEL, SAFETY = "Cloud", "Cluster", "VM", "Model & training", "Safety"


def optional(pattern: re.Pattern[str]) -> str:
    """The rule's regex, or the empty string (which, like null, means "the preset's value")."""
    return f"^$|(?:{pattern.pattern})"


def xcom(key: str) -> str:
    """Template pulling one derived value from the ``validate`` task's XCom."""
    return "{{ ti.xcom_pull(task_ids='validate')['" + key + "'] }}"


def model_field(runner: Runner, description: str) -> dict[str, Any]:
    models = presets_for(runner)
    return {
        "title": "Model",
        "section": MODEL,
        "description": description,
        "type": "string",
        "enum": models,
        "values_display": {
            m: f"{m} ({PRESETS[m].hf_model_path or PRESETS[m].compute_type + ', ' + PRESETS[m].topology})"
            for m in models
        },
    }


# Form metadata of the keys both pipelines have; each DAG adds or overrides its own.
COMMON_FORM: Final[dict[str, dict[str, Any]]] = {
    "project": {
        "title": "GCP project",
        "section": CLOUD,
        "description": "Project ID that owns the TPUs, the bucket and the reservation.",
        "type": "string",
        "pattern": rules.PROJECT_ID.pattern,
    },
    "zone": {
        "title": "Zone",
        "section": CLOUD,
        "description": "Zone of the TPUs and their reservation, e.g. us-east5-b.",
        "type": "string",
        "pattern": rules.ZONE.pattern,
    },
    "bucket": {
        "title": "GCS bucket",
        "section": CLOUD,
        "description": "Bucket name without gs://. Created if missing, kept afterwards (see delete_bucket).",
        "type": "string",
        "pattern": rules.BUCKET_CHARS.pattern,
        "minLength": 3,
        "maxLength": 222,
    },
    "hf_model_path": {
        "title": "Hugging Face checkpoint",
        "section": MODEL,
        "description": "HF repo id to convert (org/model); empty = the preset's.",
        "type": ["null", "string"],
        "pattern": optional(rules.HF_REPO_ID),
    },
    "run_name": {
        "title": "Training run name",
        "section": MODEL,
        "description": "MaxText run_name; empty = the preset's.",
        "type": ["null", "string"],
        "pattern": optional(rules.RUN_NAME),
    },
    "num_batches": {
        "title": "Training batches (steps)",
        "section": MODEL,
        "description": "GRPO steps; the exported checkpoint is the one of the last step. Empty = 50.",
        "type": ["null", "integer"],
        "minimum": 1,
    },
    "train_overrides": {
        "title": "MaxText overrides",
        "section": MODEL,
        "description": (
            'Extra train_rl key=value overrides as a JSON object, e.g. {"num_test_batches": 5}. Paths, '
            "model_name, run_name and the HF token cannot be overridden."
        ),
        "type": "object",
        "propertyNames": {"pattern": rules.MAXTEXT_KEY.pattern},
        "additionalProperties": {"type": ["string", "number", "boolean", "object", "array"]},
    },
    "hf_token_conn_id": {
        "title": "HF token connection",
        "section": MODEL,
        "description": "Airflow connection holding the Hugging Face token (synced to Secret Manager).",
        "type": "string",
        "pattern": rules.CONN_ID.pattern,
    },
    "hf_token_secret": {
        "title": "HF token secret",
        "section": MODEL,
        "description": "Existing Secret Manager secret with the token; empty = sync from the connection.",
        "type": ["null", "string"],
        "pattern": optional(rules.SECRET_ID),
    },
    "delete_bucket": {
        "title": "Delete the bucket",
        "section": SAFETY,
        "description": "Delete the bucket at teardown: this DELETES THE TRAINED MODEL. Off by default.",
        "type": "boolean",
    },
}


def pipeline_params(defaults: Mapping[str, Any], form: Mapping[str, dict[str, Any]]) -> dict[str, Param]:
    """One Param per conf key: the spec's default and the form metadata (common, then own)."""
    merged = {**COMMON_FORM, **form}
    return {key: Param(copy.deepcopy(value), **merged[key]) for key, value in defaults.items()}


def validate_task() -> Any:
    """``validate``: refuse a bad conf (unknown keys included) before anything is spent."""

    @task(task_id="validate", retries=0)
    def validate() -> dict[str, Any]:
        """Check the whole conf with the spec; XCom the derived paths the sensors watch."""
        context = get_current_context()
        dag_run = context["dag_run"]
        return validate_pipeline_conf(
            dag_run.dag_id, dag_run.run_id, dag_run.conf or {}, dict(context["params"])
        )

    return validate()


def record_run_task(cluster_task_ids: Sequence[str], **collect_options: Any) -> Any:
    """``record_run``: a teardown writing the run, its steps, metrics and artifacts to the ledger."""

    @teardown
    @task(task_id="record_run")
    def record_run() -> dict[str, Any]:
        context = get_current_context()
        derived = context["ti"].xcom_pull(task_ids="validate") or {}
        run = record_run_from_context(
            context,
            model=str(derived.get("model") or context["params"].get("model")),
            chips=derived.get("chips"),
            conn_id=LEDGER_CONN_ID,
            cluster_task_ids=tuple(cluster_task_ids),
            # A failed destroy fails the run here too (it leaked a billed resource), as the watcher does.
            teardown_task_ids=(),
            ignored_task_ids=(WATCHER_TASK_ID,),
            **collect_options,
        )
        return {"run_id": run.run_id, "state": run.state}

    return record_run()


def chain_in_order(order: Sequence[str], dag: DAG) -> None:
    """Chain the DAG's tasks in the pipeline's task order (``GKE_TASK_ORDER`` / ``TPU_VM_TASK_ORDER``)."""
    by_id = dag.task_dict
    missing = [task_id for task_id in order if task_id not in by_id]
    if missing:
        raise ValueError(f"the DAG lacks tasks of its order: {missing}")
    chain(*(by_id[task_id] for task_id in order))


def add_watcher(dag: DAG) -> None:
    """Fail the run when any task failed, a teardown included (Airflow ignores those by default).

    Setups may not be directly upstream of a ONE_FAILED task; their failure reaches the watcher
    through their downstream tasks (upstream_failed).
    """

    @task(task_id=WATCHER_TASK_ID, trigger_rule=TriggerRule.ONE_FAILED, retries=0)
    def watcher() -> None:
        raise AirflowFailException("a task of this run failed (a teardown included); see its log")

    [t for t in dag.tasks if not t.is_setup] >> watcher()
