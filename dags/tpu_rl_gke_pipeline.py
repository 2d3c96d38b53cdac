"""GRPO RL post-training with MaxText on a multi-host TPU v6e slice (GKE + Pathways, Cluster Toolkit).

The trigger form is built from ``GKE_DEFAULTS`` (one Param per key, defaults imported, never
copied); every JSON-schema rule reuses the spec's own regexes. ``validate`` re-checks the whole
conf with the spec (cross-field rules, unknown keys) before anything is created. Nothing here
calls a cloud API or renders a command at parse time.
"""

from __future__ import annotations

from typing import Any, Final

from airflow.providers.common.compat.sdk import DAG

from airflow_provider_tpu_rl.ledger.collect import GKE_CLUSTER_TASK_IDS
from airflow_provider_tpu_rl.operators.gke import (
    EnsureBucketOperator,
    GclusterDeployOperator,
    GclusterDestroyOperator,
    HfTokenSecretOperator,
)
from airflow_provider_tpu_rl.operators.maxtext import (
    MaxTextConvertOperator,
    MaxTextExportOperator,
    PathwaysRLTrainOperator,
)
from airflow_provider_tpu_rl.operators.pipeline import gke_task_arguments, transient_retries
from airflow_provider_tpu_rl.operators.preflight import TpuRlPreflightOperator
from airflow_provider_tpu_rl.pipeline_dags import (
    CLOUD,
    CLUSTER,
    LEDGER_CONN_ID,
    MODEL,
    PIPELINE_MACROS,
    SAFETY,
    WATCHER_TASK_ID,
    add_watcher,
    bounded,
    chain_in_order,
    model_field,
    optional,
    pipeline_callbacks,
    pipeline_params,
    record_run_task,
    sensor_bounds,
    stage_group,
    validate_task,
    xcom,
)
from airflow_provider_tpu_rl.sensors.checkpoint import HuggingFaceExportSensor, MaxTextCheckpointSensor
from airflow_provider_tpu_rl.spec import GKE_DAG_ID, GKE_DEFAULTS, Runner, rules
from airflow_provider_tpu_rl.spec.cluster import CHIPS_PER_VM, V6E_TOPOLOGIES
from airflow_provider_tpu_rl.spec.pipeline import ENVIRONMENT_OPTIONS, GKE_TASK_ORDER
from airflow_provider_tpu_rl.spec.presets import presets_for
from airflow_provider_tpu_rl.timeouts import dagrun_timeout

# Only for tasks whose failure can be transient (capacity, API 5xx, network).
TRANSIENT_RETRIES: Final[dict[str, Any]] = transient_retries()
GKE_MODELS: Final = presets_for(Runner.GKE)


def chips_per_vm(count: int) -> str:
    """``1 chip per VM``, ``4 chips per VM``."""
    return f"{count} chip per VM" if count == 1 else f"{count} chips per VM"


def _chips(topology: str) -> int:
    rows, columns = topology.split("x")
    return int(rows) * int(columns)


_TOPOLOGIES: Final = sorted(V6E_TOPOLOGIES, key=lambda t: (_chips(t), t))

# Form metadata of this DAG's own keys (the shared ones are in pipeline_dags.COMMON_FORM).
FORM: Final[dict[str, dict[str, Any]]] = {
    "model": model_field(
        Runner.GKE, "MaxText model_name of a multi-host preset; the preset fills every value left empty."
    ),
    "region": {
        "title": "Region",
        "section": CLOUD,
        "description": "Region of the GKE cluster and the bucket, e.g. us-east5.",
        "type": "string",
        "pattern": rules.REGION.pattern,
        "rule": rules.REGION_RULE,
    },
    "zone": {
        "title": "Zone",
        "section": CLOUD,
        "description": "Zone of the TPU node pool; must be inside the region (checked by validate).",
        "type": "string",
        "pattern": rules.ZONE.pattern,
        "rule": rules.ZONE_RULE,
    },
    "reservation": {
        "title": "TPU reservation",
        "section": CLOUD,
        "description": "Name of the v6e reservation the TPU node pool consumes, with reservation "
        "capacity; empty with on-demand, spot or flex-start capacity.",
        "type": ["null", "string"],
        "pattern": optional(rules.GCE_NAME),
        "rule": rules.gce_name_rule("reservation name"),
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
        "rule": rules.GKE_CLUSTER_NAME_RULE,
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
            **{m: f"{m} ({chips_per_vm(n)})" for m, n in CHIPS_PER_VM.items()},
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
        "description": (
            "CIDR of the GKE control plane's authorized networks: the addresses allowed to reach the "
            "cluster's Kubernetes API (kubectl, gcluster job). The default 0.0.0.0/0, as in the "
            "tutorials, opens it to the whole internet (still behind Google sign-in and IAM). "
            "Narrow it to the address range Airflow calls from: on Cloud Composer, the environment's "
            "egress range (its Cloud NAT addresses, or the workers' subnet range for a private IP "
            "environment), e.g. 203.0.113.0/24."
        ),
        "type": "string",
        "minLength": 9,
    },
    "image": {
        "title": "Workload image",
        "section": MODEL,
        "description": "Container image of the jobs; empty = the preset's tpu_post_training image.",
        "type": ["null", "string"],
        "pattern": optional(rules.IMAGE),
        "rule": rules.IMAGE_RULE,
    },
    "workload_image_patched": {
        "title": "Image is patched",
        "section": MODEL,
        "description": (
            "The workload image already holds the tutorials' two start-up patches (built from "
            "docker/workload.Dockerfile): the train command no longer rewrites installed files. "
            "Leave off with the stock tpu_post_training image."
        ),
        "type": "boolean",
    },
    # run_name: pipeline_dags.COMMON_FORM (empty = unique to the DAG run; a reused name resumes).
    "keep_cluster": {
        "title": "Keep the cluster",
        "section": SAFETY,
        "description": "Leave the cluster running after the run (it keeps billing until the janitor).",
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

PARAMS: Final = pipeline_params(GKE_DEFAULTS, FORM, ENVIRONMENT_OPTIONS["gke"])

DOC_MD = f"""
# {GKE_DAG_ID}

GRPO post-training of an LLM with MaxText on a TPU v6e slice on GKE (Pathways), as in the
Qwen3-30B-A3B and Gemma 4 tutorials: bucket → cluster (no TPU yet) → HF→MaxText conversion
(CPU node pool) → TPU node pool → training → TPU node pool destroyed → MaxText→HF export (CPU
node pool) → cluster destroyed.

**TPU billed only while it trains.** The blueprint's TPU node pool is moved to a deployment group
`tpu` of its own: `deploy_cluster` deploys everything else (`gcluster deploy --skip=tpu`: network,
cluster, `cpu-np`, Kueue), `deploy_tpu_pool` deploys the pool (`--only=tpu`) once the converted
checkpoint is committed, and `destroy_tpu_pool` destroys it (`gcluster destroy --only=tpu`) once
the actor checkpoint is committed, whatever the training did. `destroy_cluster` still destroys
everything left, the pool included when its own destroy failed. `keep_cluster` keeps the cluster,
not the TPU pool.

**Trigger form.** *Run Parameters* (open): project, region, zone, bucket, reservation, capacity (the TPU node
pool's: on-demand, the default; reservation, which names one; spot; flex-start); the
prefilled `my-tpu-project` and `my-tpu-rl-bucket` are examples, marked in their titles,
or set once for this Airflow in `[tpu_rl] default_project`, `default_bucket`, ... (the fields' defaults). *Cluster*: name, shape,
control-plane network. *Model & training*: the model preset ({", ".join(GKE_MODELS)}); every value
left empty comes from the preset, `train_overrides` adds MaxText keys. The form checks each field;
`validate` then checks the whole conf (zone in region, slice shape, override ranges, unknown keys)
and fails the run before anything is created or billed. `preflight` then checks the worker's
toolchain (Terraform, Packer, git, kubectl, gke-gcloud-auth-plugin), the project's APIs, the
caller's IAM permissions and the reservation's free capacity, one line per problem.

**Safety switches.**
- `keep_cluster` (off): on, the cluster survives the run and keeps billing.
- `delete_bucket` (off): on, the teardown deletes the bucket, **including the trained model**.
- `max_cluster_hours`: the cluster carries `tpu-rl-expires`; `tpu_rl_janitor` destroys it after
  that, whatever happened to this run (also when `keep_cluster` is on).

**Teardown.** `destroy_tpu_pool` runs once the cluster deploy succeeded; `destroy_cluster` runs once the bucket step succeeded, whether the work succeeded,
failed or the deploy itself failed half-way; `record_run` writes the run to the ledger
(`{LEDGER_CONN_ID}`) after it and draws its curves (mean reward, train loss) into a PNG next to the
checkpoints: its *Run Curves* link opens the run's page on the runs dashboard (`/tpu-rl`). `{WATCHER_TASK_ID}` fails the run when any task failed,
a teardown included, naming the failed tasks and the first line of each one's error, so a cluster
that could not be destroyed never shows as a green run.
"""

with DAG(
    dag_id=GKE_DAG_ID,
    description="GRPO RL post-training with MaxText on a TPU v6e slice on GKE (Pathways).",
    schedule=None,
    catchup=False,
    params=PARAMS,
    render_template_as_native_obj=True,
    user_defined_macros=PIPELINE_MACROS,
    tags=["tpu-rl", "maxtext", "grpo", "gke", "pathways"],
    doc_md=DOC_MD,
    # A backstop above the tasks' own bounds: a timed-out run skips its teardown (see timeouts).
    dagrun_timeout=dagrun_timeout("gke"),
    default_args={"owner": "tpu-rl", "retries": 0, **pipeline_callbacks(LEDGER_CONN_ID)},
) as dag:
    validated = validate_task()
    args = gke_task_arguments(xcom)
    # The graph groups the stages; every task keeps its own id (stage_group).
    with stage_group("prepare"):
        # Toolchain, APIs, permissions, reservation: one line per problem, before anything exists.
        TpuRlPreflightOperator(
            task_id="preflight", **args["preflight"], **TRANSIENT_RETRIES, **bounded("preflight")
        )
        ensure_bucket = EnsureBucketOperator(
            task_id="ensure_bucket", **args["ensure_bucket"], **TRANSIENT_RETRIES, **bounded("short")
        )
        deploy_cluster = GclusterDeployOperator(
            task_id="deploy_cluster", **args["deploy_cluster"], **TRANSIENT_RETRIES, **bounded("deploy")
        )
        sync_hf_token = HfTokenSecretOperator(
            task_id="sync_hf_token", **args["sync_hf_token"], **TRANSIENT_RETRIES, **bounded("short")
        )
    with stage_group("conversion"):
        convert_to_maxtext = MaxTextConvertOperator(
            task_id="convert_to_maxtext",
            deferrable=True,
            **args["convert_to_maxtext"],
            **TRANSIENT_RETRIES,
            **bounded("convert"),
        )
        wait_converted_checkpoint = MaxTextCheckpointSensor(
            task_id="wait_converted_checkpoint",
            project_id=xcom("project"),
            checkpoint_root=xcom("converted_root"),
            step=0,
            items=("items",),
            deferrable=True,
            poke_interval=30,
            **sensor_bounds(),
        )
    with stage_group("training"):
        # The TPU node pool (its own deployment group) exists only while training needs it: deployed
        # once the converted checkpoint is committed, destroyed once the actor checkpoint is.
        deploy_tpu_pool = GclusterDeployOperator(
            task_id="deploy_tpu_pool", **args["deploy_tpu_pool"], **TRANSIENT_RETRIES, **bounded("deploy")
        )
        train = PathwaysRLTrainOperator(
            task_id="train", deferrable=True, **args["train"], **TRANSIENT_RETRIES, **bounded("train")
        )
        wait_actor_checkpoint = MaxTextCheckpointSensor(
            task_id="wait_actor_checkpoint",
            project_id=xcom("project"),
            checkpoint_root=xcom("actor_root"),
            step=xcom("final_step"),
            deferrable=True,
            poke_interval=60,
            **sensor_bounds(),
        )
        # A teardown of the pool: runs whatever training did once the cluster deploy succeeded (a
        # pool that failed half-way or was never deployed is an already-absent group: a no-op destroy).
        destroy_tpu_pool = GclusterDestroyOperator(
            task_id="destroy_tpu_pool",
            **args["destroy_tpu_pool"],
            **TRANSIENT_RETRIES,
            **bounded("teardown"),
        ).as_teardown(setups=[deploy_cluster, deploy_tpu_pool])
    with stage_group("export"):
        export_to_huggingface = MaxTextExportOperator(
            task_id="export_to_huggingface",
            deferrable=True,
            **args["export_to_huggingface"],
            **TRANSIENT_RETRIES,
            **bounded("export"),
        )
        wait_hf_export = HuggingFaceExportSensor(
            task_id="wait_hf_export",
            project_id=xcom("project"),
            export_uri=xcom("export_uri"),
            deferrable=True,
            poke_interval=30,
            **sensor_bounds(),
        )
    with stage_group("teardown"):
        # The bucket is a setup too: once it exists the destroy runs, also after a deploy that
        # failed half-way (a stockout leaves a cluster without TPU nodes). It also owns delete_bucket.
        destroy_cluster = GclusterDestroyOperator(
            task_id="destroy_cluster",
            **args["destroy_cluster"],
            # only the secretAccessor grants this run added (none when the token task never ran)
            revoke_service_accounts="{{ ti.xcom_pull(task_ids='sync_hf_token', key='granted_accounts') }}",
            **TRANSIENT_RETRIES,
            **bounded("teardown"),
        ).as_teardown(setups=[ensure_bucket, deploy_cluster])
        record_run = record_run_task(GKE_CLUSTER_TASK_IDS)
    chain_in_order(GKE_TASK_ORDER, dag)
    # The export follows the TPU pool's destroy, and needs the actor checkpoint itself (a teardown
    # succeeds after a failed training too).
    wait_actor_checkpoint >> export_to_huggingface
    add_watcher(dag)
