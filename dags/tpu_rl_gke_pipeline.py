"""GRPO RL post-training with MaxText on a multi-host TPU v6e slice (GKE + Pathways, Cluster Toolkit).

The trigger form is built from ``GKE_DEFAULTS`` (one Param per key, defaults imported, never
copied); every JSON-schema rule reuses the spec's own regexes. ``validate`` re-checks the whole
conf with the spec (cross-field rules, unknown keys) before anything is created. Nothing here
calls a cloud API or renders a command at parse time.
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

from airflow_provider_tpu_rl.ledger.collect import GKE_CLUSTER_TASK_IDS
from airflow_provider_tpu_rl.ledger.hook import record_run_from_context, step_callbacks
from airflow_provider_tpu_rl.operators.gke import (
    EnsureBucketOperator,
    GclusterDeployOperator,
    GclusterDestroyOperator,
    HfTokenSecretOperator,
)
from airflow_provider_tpu_rl.operators.maxtext import MaxTextConvertOperator, PathwaysRLTrainOperator
from airflow_provider_tpu_rl.operators.pipeline import transient_retries, validate_pipeline_conf
from airflow_provider_tpu_rl.sensors.checkpoint import HuggingFaceExportSensor, MaxTextCheckpointSensor
from airflow_provider_tpu_rl.spec import GKE_DAG_ID, GKE_DEFAULTS, PRESETS, Runner, rules
from airflow_provider_tpu_rl.spec.cluster import CHIPS_PER_VM, V6E_TOPOLOGIES
from airflow_provider_tpu_rl.spec.presets import presets_for

LEDGER_CONN_ID: Final = "tpu_rl_ledger"
WATCHER_TASK_ID: Final = "watcher"
CLOUD, CLUSTER, MODEL, SAFETY = "Cloud", "Cluster", "Model & training", "Safety"

# Only for tasks whose failure can be transient (capacity, API 5xx, network). The operators raise
# AirflowFailException for configuration errors, which skips the remaining retries. The multiplier
# is a float on Airflow 3.3 (True would mean 1.0: a constant delay).
TRANSIENT_RETRIES: Final[dict[str, Any]] = transient_retries()


def _optional(pattern: re.Pattern[str]) -> str:
    """The rule's regex, or the empty string (which, like null, means "the preset's value")."""
    return f"^$|(?:{pattern.pattern})"


def _xcom(key: str) -> str:
    """Template pulling one derived value from the ``validate`` task's XCom."""
    return "{{ ti.xcom_pull(task_ids='validate')['" + key + "'] }}"


GKE_MODELS: Final = presets_for(Runner.GKE)


def _chips(topology: str) -> int:
    rows, columns = topology.split("x")
    return int(rows) * int(columns)


_TOPOLOGIES: Final = sorted(V6E_TOPOLOGIES, key=lambda t: (_chips(t), t))

# Form metadata per conf key; the defaults come from GKE_DEFAULTS.
FORM: Final[dict[str, dict[str, Any]]] = {
    "model": {
        "title": "Model",
        "section": MODEL,
        "description": "MaxText model_name of a multi-host preset; the preset fills every value left empty.",
        "type": "string",
        "enum": GKE_MODELS,
        "values_display": {m: f"{m} ({PRESETS[m].hf_model_path})" for m in GKE_MODELS},
    },
    "project": {
        "title": "GCP project",
        "section": CLOUD,
        "description": "Project ID that owns the cluster, the bucket and the reservation.",
        "type": "string",
        "pattern": rules.PROJECT_ID.pattern,
    },
    "region": {
        "title": "Region",
        "section": CLOUD,
        "description": "Region of the GKE cluster and the bucket, e.g. us-east5.",
        "type": "string",
        "pattern": rules.REGION.pattern,
    },
    "zone": {
        "title": "Zone",
        "section": CLOUD,
        "description": "Zone of the TPU node pool; must be inside the region (checked by validate).",
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
    "reservation": {
        "title": "TPU reservation",
        "section": CLOUD,
        "description": "Name of the v6e reservation the node pool consumes; empty for none.",
        "type": ["null", "string"],
        "pattern": _optional(rules.GCE_NAME),
    },
    "cluster_name": {
        "title": "Cluster name",
        "section": CLUSTER,
        "description": (
            "GKE cluster / Cluster Toolkit deployment: lowercase letter first, [a-z0-9-], at most 20 "
            "characters. Two runs at the same time must not share a cluster name."
        ),
        "type": "string",
        "pattern": rules.GKE_CLUSTER_NAME.pattern,
        "maxLength": 20,
    },
    "compute_type": {
        "title": "TPU machine type",
        "section": CLUSTER,
        "description": "Node machine type; empty = the preset's (ct6e-standard-4t for multi-host).",
        "type": ["null", "string"],
        "enum": [None, *sorted(CHIPS_PER_VM)],
        "values_display": {
            None: "(preset value)",
            **{m: f"{m} ({n} chips per VM)" for m, n in CHIPS_PER_VM.items()},
        },
    },
    "topology": {
        "title": "Slice topology",
        "section": CLUSTER,
        "description": "v6e slice shape (4x8 = v6e-32); empty = the preset's.",
        "type": ["null", "string"],
        "enum": [None, *_TOPOLOGIES],
        "values_display": {None: "(preset value)", **{t: f"{t} (v6e-{_chips(t)})" for t in _TOPOLOGIES}},
    },
    "num_slices": {
        "title": "Number of slices",
        "section": CLUSTER,
        "description": "TPU node pools (slices); empty = the preset's (1).",
        "type": ["null", "integer"],
        "minimum": 1,
        "maximum": 64,
    },
    "authorized_cidr": {
        "title": "Control-plane authorized network",
        "section": CLUSTER,
        "description": "CIDR allowed to reach the GKE control plane. 0.0.0.0/0 (the tutorials') is open.",
        "type": "string",
        "minLength": 9,
    },
    "image": {
        "title": "Workload image",
        "section": MODEL,
        "description": "Container image of the jobs; empty = the preset's tpu_post_training image.",
        "type": ["null", "string"],
        "pattern": _optional(rules.IMAGE),
    },
    "hf_model_path": {
        "title": "Hugging Face checkpoint",
        "section": MODEL,
        "description": "HF repo id to convert (org/model); empty = the preset's.",
        "type": ["null", "string"],
        "pattern": _optional(rules.HF_REPO_ID),
    },
    "run_name": {
        "title": "Training run name",
        "section": MODEL,
        "description": "MaxText run_name (folder under trained/); empty = the preset's ('rl').",
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
            'Extra train_rl key=value overrides as a JSON object, e.g. {"batch_size": 4}. Paths, '
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
    "keep_cluster": {
        "title": "Keep the cluster",
        "section": SAFETY,
        "description": "Leave the cluster running after the run (it keeps billing until the janitor).",
        "type": "boolean",
    },
    "delete_bucket": {
        "title": "Delete the bucket",
        "section": SAFETY,
        "description": "Delete the bucket at teardown: this DELETES THE TRAINED MODEL. Off by default.",
        "type": "boolean",
    },
    "max_cluster_hours": {
        "title": "Cluster lifetime (hours)",
        "section": SAFETY,
        "description": "Expiry label on the cluster: the tpu_rl_janitor DAG destroys it after this.",
        "type": "integer",
        "minimum": 1,
        "maximum": 24 * 14,
    },
}

PARAMS: Final[dict[str, Param]] = {
    key: Param(copy.deepcopy(value), **FORM[key]) for key, value in GKE_DEFAULTS.items()
}

DOC_MD = f"""
# {GKE_DAG_ID}

GRPO post-training of an LLM with MaxText on a TPU v6e slice on GKE (Pathways), as in the
Qwen3-30B-A3B and Gemma 4 tutorials: bucket → cluster → HF→MaxText conversion → training →
MaxText→HF export → cluster destroyed.

**Trigger form.** *Cloud*: project, region, zone, bucket, reservation. *Cluster*: name, shape,
control-plane network. *Model & training*: the model preset ({", ".join(GKE_MODELS)}); every value
left empty comes from the preset, `train_overrides` adds MaxText keys. The form checks each field;
`validate` then checks the whole conf (zone in region, slice shape, override ranges, unknown keys)
and fails the run before anything is created or billed.

**Safety switches.**
- `keep_cluster` (off): on, the cluster survives the run and keeps billing.
- `delete_bucket` (off): on, the teardown deletes the bucket, **including the trained model**.
- `max_cluster_hours`: the cluster carries `tpu-rl-expires`; `tpu_rl_janitor` destroys it after
  that, whatever happened to this run (also when `keep_cluster` is on).

**Teardown.** `destroy_cluster` runs once the bucket step succeeded, whether the work succeeded,
failed or the deploy itself failed half-way; `record_run` writes the run to the ledger
(`{LEDGER_CONN_ID}`) after it. `{WATCHER_TASK_ID}` fails the run when any task failed, a teardown
included, so a cluster that could not be destroyed never shows as a green run.
"""

with DAG(
    dag_id=GKE_DAG_ID,
    description="GRPO RL post-training with MaxText on a TPU v6e slice on GKE (Pathways).",
    schedule=None,
    catchup=False,
    params=PARAMS,
    render_template_as_native_obj=True,
    tags=["tpu-rl", "maxtext", "grpo", "gke", "pathways"],
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
    ensure_bucket = EnsureBucketOperator(task_id="ensure_bucket", pipeline="gke", **TRANSIENT_RETRIES)
    deploy_cluster = GclusterDeployOperator(task_id="deploy_cluster", **TRANSIENT_RETRIES)
    sync_hf_token = HfTokenSecretOperator(task_id="sync_hf_token", pipeline="gke", **TRANSIENT_RETRIES)
    convert_to_maxtext = MaxTextConvertOperator(
        task_id="convert_to_maxtext", direction="to_maxtext", deferrable=True, **TRANSIENT_RETRIES
    )
    wait_converted_checkpoint = MaxTextCheckpointSensor(
        task_id="wait_converted_checkpoint",
        checkpoint_root=_xcom("converted_root"),
        step=0,
        items=("items",),
        deferrable=True,
        poke_interval=30,
        timeout=timedelta(hours=1).total_seconds(),
    )
    train = PathwaysRLTrainOperator(task_id="train", deferrable=True, **TRANSIENT_RETRIES)
    wait_actor_checkpoint = MaxTextCheckpointSensor(
        task_id="wait_actor_checkpoint",
        checkpoint_root=_xcom("actor_root"),
        step=_xcom("final_step"),
        deferrable=True,
        poke_interval=60,
        timeout=timedelta(hours=2).total_seconds(),
    )
    export_to_huggingface = MaxTextConvertOperator(
        task_id="export_to_huggingface", direction="to_huggingface", deferrable=True, **TRANSIENT_RETRIES
    )
    wait_hf_export = HuggingFaceExportSensor(
        task_id="wait_hf_export",
        export_uri=_xcom("export_uri"),
        deferrable=True,
        poke_interval=30,
        timeout=timedelta(hours=1).total_seconds(),
    )
    # The bucket is a setup too: once it exists the destroy runs, also after a deploy that failed
    # half-way (a stockout leaves a cluster without TPU nodes). It also owns delete_bucket.
    destroy_cluster = GclusterDestroyOperator(task_id="destroy_cluster", **TRANSIENT_RETRIES).as_teardown(
        setups=[ensure_bucket, deploy_cluster]
    )

    @teardown
    @task(task_id="record_run")
    def record_run() -> dict[str, Any]:
        """Write the run, its steps, metrics and artifacts to the ledger (after the destroy)."""
        context = get_current_context()
        derived = context["ti"].xcom_pull(task_ids="validate") or {}
        run = record_run_from_context(
            context,
            model=str(derived.get("model") or context["params"].get("model")),
            chips=derived.get("chips"),
            conn_id=LEDGER_CONN_ID,
            cluster_task_ids=GKE_CLUSTER_TASK_IDS,
            # A failed destroy fails the run here too (it leaked a billed resource), as the watcher does.
            teardown_task_ids=(),
            ignored_task_ids=(WATCHER_TASK_ID,),
        )
        return {"run_id": run.run_id, "state": run.state}

    chain(
        validated,
        ensure_bucket,
        deploy_cluster,
        sync_hf_token,
        convert_to_maxtext,
        wait_converted_checkpoint,
        train,
        wait_actor_checkpoint,
        export_to_huggingface,
        wait_hf_export,
        destroy_cluster,
        record_run(),
    )

    @task(task_id=WATCHER_TASK_ID, trigger_rule=TriggerRule.ONE_FAILED, retries=0)
    def watcher() -> None:
        """Fail the run when any task failed: teardown failures are otherwise ignored by the run state."""
        raise AirflowFailException("a task of this run failed (a teardown included); see its log")

    # Setups may not be directly upstream of a ONE_FAILED task; their failure reaches the watcher
    # through their downstream tasks (upstream_failed).
    [t for t in dag.tasks if not t.is_setup] >> watcher()
