"""GRPO RL post-training with MaxText on one TPU v6e-8 VM over SSH (McJAX), as in the Llama 3.1 8B tutorial.

The trigger form is built from ``TPU_VM_DEFAULTS`` (one Param per key, defaults imported, never
copied); every JSON-schema rule reuses the spec's own regexes. ``validate`` re-checks the whole
conf with the spec before anything is created. Nothing here calls a cloud API or renders a
command at parse time.
"""

from __future__ import annotations

import copy
import re
from datetime import timedelta
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

from airflow_provider_tpu_rl.ledger.collect import TPU_VM_CLUSTER_TASK_IDS
from airflow_provider_tpu_rl.ledger.hook import record_run_from_context, step_callbacks
from airflow_provider_tpu_rl.operators.gke import EnsureBucketOperator, HfTokenSecretOperator
from airflow_provider_tpu_rl.operators.pipeline import transient_retries, validate_pipeline_conf
from airflow_provider_tpu_rl.operators.tpu_vm import (
    TpuVmCreateOperator,
    TpuVmDeleteOperator,
    TpuVmStageOperator,
)
from airflow_provider_tpu_rl.sensors.checkpoint import HuggingFaceExportSensor, MaxTextCheckpointSensor
from airflow_provider_tpu_rl.spec import PRESETS, TPU_VM_DAG_ID, TPU_VM_DEFAULTS, Runner, rules
from airflow_provider_tpu_rl.spec.presets import presets_for

LEDGER_CONN_ID: Final = "tpu_rl_ledger"
WATCHER_TASK_ID: Final = "watcher"
CLOUD, VM, MODEL, SAFETY = "Cloud", "VM", "Model & training", "Safety"

# Only for tasks whose failure can be transient (capacity, API 5xx, network, apt/pip mirrors). The
# operators raise AirflowFailException for configuration errors, which skips the remaining retries.
# The multiplier is a float on Airflow 3.3 (True would mean 1.0: a constant delay).
TRANSIENT_RETRIES: Final[dict[str, Any]] = transient_retries()


def _optional(pattern: re.Pattern[str]) -> str:
    """The rule's regex, or the empty string (which, like null, means "the preset's value")."""
    return f"^$|(?:{pattern.pattern})"


def _xcom(key: str) -> str:
    """Template pulling one derived value from the ``validate`` task's XCom."""
    return "{{ ti.xcom_pull(task_ids='validate')['" + key + "'] }}"


TPU_VM_MODELS: Final = presets_for(Runner.TPU_VM)

# Form metadata per conf key; the defaults come from TPU_VM_DEFAULTS.
FORM: Final[dict[str, dict[str, Any]]] = {
    "model": {
        "title": "Model",
        "section": MODEL,
        "description": "MaxText model_name of a single-host preset; the preset fills every value left empty.",
        "type": "string",
        "enum": TPU_VM_MODELS,
        "values_display": {
            m: f"{m} ({PRESETS[m].compute_type}, {PRESETS[m].topology})" for m in TPU_VM_MODELS
        },
    },
    "project": {
        "title": "GCP project",
        "section": CLOUD,
        "description": "Project ID that owns the VM, the bucket and the reservation.",
        "type": "string",
        "pattern": rules.PROJECT_ID.pattern,
    },
    "zone": {
        "title": "Zone",
        "section": CLOUD,
        "description": "Zone of the TPU VM and its reservation, e.g. us-east5-b (the bucket goes to its region).",
        "type": "string",
        "pattern": rules.ZONE.pattern,
    },
    "bucket": {
        "title": "GCS bucket",
        "section": CLOUD,
        "description": (
            "Bucket name without gs://. Checkpoint and export are copied here from /dev/shm before the "
            "VM is deleted; kept afterwards (see delete_bucket)."
        ),
        "type": "string",
        "pattern": rules.BUCKET_CHARS.pattern,
        "minLength": 3,
        "maxLength": 222,
    },
    "reservation": {
        "title": "TPU reservation",
        "section": CLOUD,
        "description": "Name of the v6e-8 reservation the VM is bound to (RESERVATION_BOUND).",
        "type": "string",
        "pattern": rules.GCE_NAME.pattern,
    },
    "service_account": {
        "title": "VM service account",
        "section": CLOUD,
        "description": "E-mail of the VM's service account (reads the HF token secret); empty = the default one.",
        "type": ["null", "string"],
        "pattern": _optional(rules.SERVICE_ACCOUNT),
    },
    "vm_name": {
        "title": "VM name",
        "section": VM,
        "description": "Compute Engine instance name. Two runs at the same time must not share it.",
        "type": "string",
        "pattern": rules.GCE_NAME.pattern,
    },
    "hf_model_path": {
        "title": "Hugging Face checkpoint",
        "section": MODEL,
        "description": "HF repo id to convert (org/model); empty = MaxText's checkpoint for the model.",
        "type": ["null", "string"],
        "pattern": _optional(rules.HF_REPO_ID),
    },
    "run_name": {
        "title": "Training run name",
        "section": MODEL,
        "description": "MaxText run_name; empty = rl-<run suffix>, unique per DAG run.",
        "type": ["null", "string"],
        "pattern": _optional(rules.RUN_NAME),
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
        "pattern": _optional(rules.SECRET_ID),
    },
    "keep_vm": {
        "title": "Keep the VM",
        "section": SAFETY,
        "description": "Leave the TPU VM running after the run (it keeps billing until the janitor).",
        "type": "boolean",
    },
    "delete_bucket": {
        "title": "Delete the bucket",
        "section": SAFETY,
        "description": "Delete the bucket at teardown: this DELETES THE TRAINED MODEL. Off by default.",
        "type": "boolean",
    },
    "max_vm_hours": {
        "title": "VM lifetime (hours)",
        "section": SAFETY,
        "description": "Expiry label on the VM: the tpu_rl_janitor DAG deletes it after this.",
        "type": "integer",
        "minimum": 1,
        "maximum": 24 * 7,
    },
}

PARAMS: Final[dict[str, Param]] = {
    key: Param(copy.deepcopy(value), **FORM[key]) for key, value in TPU_VM_DEFAULTS.items()
}

DOC_MD = f"""
# {TPU_VM_DAG_ID}

GRPO post-training of {", ".join(TPU_VM_MODELS)} with MaxText on one reservation-bound TPU v6e-8 VM,
driven over SSH, as in the Llama 3.1 8B tutorial: bucket → HF token secret → VM → install MaxText →
HF→MaxText conversion → training → MaxText→HF export → VM deleted. The VM works in `/dev/shm`, which
is lost with the VM: the train and export stages copy their outputs to the bucket before returning,
and the sensors wait for those GCS copies.

**Trigger form.** *Cloud*: project, zone, bucket, reservation, service account. *VM*: its name.
*Model & training*: the preset, empty values = the preset's, `train_overrides` adds MaxText keys.
The form checks each field; `validate` then checks the whole conf (unknown keys included) and fails
the run before the VM is created.

**Safety switches.**
- `keep_vm` (off): on, the VM survives the run and keeps billing.
- `delete_bucket` (off): on, the teardown deletes the bucket, **including the trained model**.
- `max_vm_hours`: the VM carries `tpu-rl-expires`; `tpu_rl_janitor` deletes it after that, whatever
  happened to this run (also when `keep_vm` is on).

**Teardown.** `delete_vm` runs once the bucket step succeeded (an absent VM counts as deleted),
whether the work succeeded or failed; `record_run` writes the run to the ledger (`{LEDGER_CONN_ID}`)
after it. `{WATCHER_TASK_ID}` fails the run when any task failed, a teardown included.
"""

with DAG(
    dag_id=TPU_VM_DAG_ID,
    description="GRPO RL post-training with MaxText on one TPU v6e-8 VM (McJAX over SSH).",
    schedule=None,
    catchup=False,
    params=PARAMS,
    render_template_as_native_obj=True,
    tags=["tpu-rl", "maxtext", "grpo", "tpu-vm"],
    doc_md=DOC_MD,
    default_args={"owner": "tpu-rl", "retries": 0, **step_callbacks(LEDGER_CONN_ID)},
) as dag:

    @task(task_id="validate", retries=0)
    def validate() -> dict[str, Any]:
        """Refuse a bad conf (unknown keys included) before anything is spent; XCom the derived paths."""
        context = get_current_context()
        dag_run = context["dag_run"]
        return validate_pipeline_conf(
            dag_run.dag_id, dag_run.run_id, dag_run.conf or {}, dict(context["params"])
        )

    validated = validate()
    ensure_bucket = EnsureBucketOperator(task_id="ensure_bucket", pipeline="tpu_vm", **TRANSIENT_RETRIES)
    sync_hf_token = HfTokenSecretOperator(task_id="sync_hf_token", pipeline="tpu_vm", **TRANSIENT_RETRIES)
    create_vm = TpuVmCreateOperator(task_id="create_vm", **TRANSIENT_RETRIES)
    install_maxtext = TpuVmStageOperator(task_id="install_maxtext", stage="install", **TRANSIENT_RETRIES)
    convert_to_maxtext = TpuVmStageOperator(
        task_id="convert_to_maxtext", stage="convert", **TRANSIENT_RETRIES
    )
    train = TpuVmStageOperator(task_id="train", stage="train", **TRANSIENT_RETRIES)
    wait_actor_checkpoint = MaxTextCheckpointSensor(
        task_id="wait_actor_checkpoint",
        checkpoint_root=_xcom("actor_root"),
        step=_xcom("final_step"),
        deferrable=True,
        poke_interval=30,
        timeout=timedelta(hours=1).total_seconds(),
    )
    export_to_huggingface = TpuVmStageOperator(
        task_id="export_to_huggingface", stage="export", **TRANSIENT_RETRIES
    )
    wait_hf_export = HuggingFaceExportSensor(
        task_id="wait_hf_export",
        export_uri=_xcom("export_uri"),
        deferrable=True,
        poke_interval=30,
        timeout=timedelta(hours=1).total_seconds(),
    )
    # The bucket is a setup too: once it exists the delete runs, also after a create that failed
    # after a retry left a VM behind (deleting an absent VM succeeds). It also owns delete_bucket.
    delete_vm = TpuVmDeleteOperator(task_id="delete_vm", **TRANSIENT_RETRIES).as_teardown(
        setups=[ensure_bucket, create_vm]
    )

    @teardown
    @task(task_id="record_run")
    def record_run() -> dict[str, Any]:
        """Write the run, its steps, metrics and artifacts to the ledger (after the VM is deleted)."""
        context = get_current_context()
        derived = context["ti"].xcom_pull(task_ids="validate") or {}
        run = record_run_from_context(
            context,
            model=str(derived.get("model") or context["params"].get("model")),
            chips=derived.get("chips"),
            conn_id=LEDGER_CONN_ID,
            cluster_task_ids=TPU_VM_CLUSTER_TASK_IDS,
            job_task_ids=(),
            artifact_task_ids={"actor_checkpoint": "wait_actor_checkpoint", "hf_export": "wait_hf_export"},
            # A failed destroy fails the run here too (it leaked a billed resource), as the watcher does.
            teardown_task_ids=(),
            ignored_task_ids=(WATCHER_TASK_ID,),
        )
        return {"run_id": run.run_id, "state": run.state}

    chain(
        validated,
        ensure_bucket,
        sync_hf_token,
        create_vm,
        install_maxtext,
        convert_to_maxtext,
        train,
        wait_actor_checkpoint,
        export_to_huggingface,
        wait_hf_export,
        delete_vm,
        record_run(),
    )

    @task(task_id=WATCHER_TASK_ID, trigger_rule=TriggerRule.ONE_FAILED, retries=0)
    def watcher() -> None:
        """Fail the run when any task failed: teardown failures are otherwise ignored by the run state."""
        raise AirflowFailException("a task of this run failed (a teardown included); see its log")

    # Setups may not be directly upstream of a ONE_FAILED task; their failure reaches the watcher
    # through their downstream tasks (upstream_failed).
    [t for t in dag.tasks if not t.is_setup] >> watcher()
