"""GRPO RL post-training with MaxText on one TPU v6e-8 VM over SSH (McJAX), as in the Llama 3.1 8B tutorial.

The trigger form is built from ``TPU_VM_DEFAULTS`` (one Param per key, defaults imported, never
copied); every JSON-schema rule reuses the spec's own regexes. ``validate`` re-checks the whole
conf with the spec before anything is created. Nothing here calls a cloud API or renders a
command at parse time.
"""

from __future__ import annotations

from typing import Any, Final

from airflow.providers.common.compat.sdk import DAG

from airflow_provider_tpu_rl.ledger.collect import TPU_VM_CLUSTER_TASK_IDS
from airflow_provider_tpu_rl.operators.gke import EnsureBucketOperator, HfTokenSecretOperator
from airflow_provider_tpu_rl.operators.pipeline import tpu_vm_task_arguments, transient_retries
from airflow_provider_tpu_rl.operators.preflight import TpuRlPreflightOperator
from airflow_provider_tpu_rl.operators.tpu_vm import (
    CpuVmCreateOperator,
    CpuVmDeleteOperator,
    TpuVmCreateOperator,
    TpuVmDeleteOperator,
    TpuVmStageOperator,
)
from airflow_provider_tpu_rl.pipeline_dags import (
    CLOUD,
    LEDGER_CONN_ID,
    MODEL,
    PIPELINE_MACROS,
    SAFETY,
    VM,
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
from airflow_provider_tpu_rl.spec import TPU_VM_DAG_ID, TPU_VM_DEFAULTS, Runner, rules
from airflow_provider_tpu_rl.spec.cluster import SYSTEM_MACHINE_TYPE
from airflow_provider_tpu_rl.spec.pipeline import ENVIRONMENT_OPTIONS, TPU_VM_RUNTIMES, TPU_VM_TASK_ORDER
from airflow_provider_tpu_rl.spec.presets import presets_for
from airflow_provider_tpu_rl.timeouts import dagrun_timeout

# Only for tasks whose failure can be transient (capacity, API 5xx, network, apt/pip mirrors).
TRANSIENT_RETRIES: Final[dict[str, Any]] = transient_retries()
TPU_VM_MODELS: Final = presets_for(Runner.TPU_VM)

# Form metadata of this DAG's own keys (the shared ones are in pipeline_dags.COMMON_FORM).
FORM: Final[dict[str, dict[str, Any]]] = {
    "model": model_field(
        Runner.TPU_VM, "MaxText model_name of a single-host preset; the preset fills every value left empty."
    ),
    "zone": {
        "title": "Zone",
        "section": CLOUD,
        "description": "Zone of the TPU VM and its reservation, e.g. us-east5-b (the bucket goes to its region).",
        "type": "string",
        "pattern": rules.ZONE.pattern,
        "rule": rules.ZONE_RULE,
    },
    "bucket": {
        "title": "GCS bucket",
        "section": CLOUD,
        "description": (
            "Bucket name without gs://. The converted checkpoint, the training checkpoints and the "
            "export are written here; kept afterwards (see delete_bucket); bucket names are global."
        ),
        "type": "string",
        "pattern": rules.BUCKET_CHARS.pattern,
        "rule": rules.BUCKET_CHARS_RULE,
        "minLength": 3,
        "maxLength": 222,
    },
    "reservation": {
        "title": "TPU reservation",
        "section": CLOUD,
        "description": "Name of the v6e-8 reservation the VM is bound to (RESERVATION_BOUND) with "
        "reservation capacity; empty with on-demand, spot or flex-start capacity.",
        "type": ["null", "string"],
        "pattern": optional(rules.GCE_NAME),
        "rule": rules.gce_name_rule("reservation name"),
    },
    "service_account": {
        "title": "VM service account",
        "section": CLOUD,
        "description": "E-mail of the VM's service account (reads the HF token secret); empty = the default one.",
        "type": ["null", "string"],
        "pattern": optional(rules.SERVICE_ACCOUNT),
        "rule": rules.SERVICE_ACCOUNT_RULE,
    },
    "vm_name": {
        "title": "VM name",
        "section": VM,
        "description": (
            "Compute Engine instance name of the TPU VM; the CPU VM is named <vm_name>-cpu. "
            "Two runs at the same time must not share it."
        ),
        "type": "string",
        "pattern": rules.GCE_NAME.pattern,
        "rule": rules.gce_name_rule("VM name"),
    },
    "cpu_machine_type": {
        "title": "CPU VM machine type",
        "section": VM,
        "description": (
            "Machine type of the CPU VM the checkpoint conversions run on (MaxText's converters run "
            "on the CPU only); 256 GB of RAM by default. Not a TPU (ct*) type."
        ),
        "type": "string",
        "pattern": SYSTEM_MACHINE_TYPE.pattern,
        "rule": "a CPU machine type like n2-highmem-32",
    },
    "hf_model_path": {
        "title": "Hugging Face checkpoint",
        "section": MODEL,
        "description": "HF repo id to convert (org/model); empty = MaxText's checkpoint for the model.",
        "type": ["null", "string"],
        "pattern": optional(rules.HF_REPO_ID),
        "rule": rules.HF_REPO_ID_RULE,
    },
    "runtime": {
        "title": "TPU VM runtime",
        "section": VM,
        "description": (
            "How the TPU VM runs MaxText. container: install_maxtext only pulls the prebuilt "
            "post-training image (the GKE jobs' image) and train runs in it (docker run --privileged), "
            "so the billed TPU VM installs nothing. install: MaxText and its post-training extras are "
            "installed from sources on the TPU VM first, as in the tutorial (15-30 billed minutes). "
            "The CPU VM always installs (it is not TPU time)."
        ),
        "type": "string",
        "enum": list(TPU_VM_RUNTIMES),
    },
    "workload_image": {
        "title": "Workload image",
        "section": VM,
        "description": (
            "Container image training runs in with runtime container; empty = the "
            "tpu_post_training image the GKE pipeline uses. Ignored with runtime install."
        ),
        "type": ["null", "string"],
        "pattern": optional(rules.IMAGE),
        "rule": rules.IMAGE_RULE,
    },
    # run_name: pipeline_dags.COMMON_FORM (empty = unique to the DAG run; a reused name resumes).
    "keep_vm": {
        "title": "Keep the VM",
        "section": SAFETY,
        "description": "Leave both VMs running after the run (they keep billing until the janitor).",
        "type": "boolean",
    },
    "max_vm_hours": {
        "title": "VM lifetime (hours)",
        "section": SAFETY,
        "description": "Expiry label on both VMs: the tpu_rl_janitor DAG deletes them after this.",
        "type": "integer",
        "minimum": 1,
        "maximum": 24 * 7,
    },
}

PARAMS: Final = pipeline_params(TPU_VM_DEFAULTS, FORM, ENVIRONMENT_OPTIONS["tpu_vm"])

DOC_MD = f"""
# {TPU_VM_DAG_ID}

GRPO post-training of {", ".join(TPU_VM_MODELS)} with MaxText on one TPU v6e-8 VM (on-demand, reservation-bound, Spot or flex-start: `capacity`),
driven over SSH, as in the Llama 3.1 8B tutorial, except that the TPU VM exists only while it trains:
bucket → HF token secret → **CPU VM** (`<vm_name>-cpu`, `cpu_machine_type`) → install MaxText there →
HF→MaxText conversion on the CPU VM, written to the bucket → `wait_converted_checkpoint` (its commit
marker) → **TPU VM** → `install_maxtext` (`runtime` container, the default: Docker and the prebuilt
post-training image pulled, nothing built; `install`: MaxText from sources, the tutorial's way) → training, loading the converted checkpoint from the bucket
and writing its checkpoints there → `wait_actor_checkpoint` → TPU VM deleted → MaxText→HF export on
the CPU VM (bucket to bucket) → `wait_hf_export` → CPU VM deleted. MaxText's converters force JAX
onto the CPU (`jax_platforms=cpu`), so they never needed the TPU: the billed TPU VM now lives only
around training.

**Trigger form.** *Run Parameters* (open): project, zone, bucket, reservation, capacity (on-demand, the
default; reservation, which names one; spot; flex-start), service account;
the prefilled `my-tpu-project` and `my-tpu-rl-bucket` are examples, marked in their titles,
or set once for this Airflow in `[tpu_rl] default_project`, `default_bucket`, ... (the fields' defaults). *VM*: the
TPU VM's name, the CPU VM's machine type, and the TPU VM's `runtime` (`container`, the default: it
trains in the prebuilt post-training image, `workload_image`; `install`: MaxText built from sources
on the billed TPU VM first, as in the tutorial).
*Model & training*: the preset, empty values = the preset's, `train_overrides` adds MaxText keys.
The form checks each field; `validate` then checks the whole conf (unknown keys included) and fails
the run before a VM is created; `preflight` checks the project's APIs, the caller's IAM
permissions and the reservation, one line per problem. `create_cpu_vm` and `create_vm` grant the VMs'
service account (the one named, else the project's default compute account) the token secret and the bucket.

**Safety switches.**
- `keep_vm` (off): on, both VMs survive the run and keep billing.
- `delete_bucket` (off): on, the last teardown (`delete_cpu_vm`) deletes the bucket, **including the trained model**.
- `max_vm_hours`: both VMs carry `tpu-rl-expires`; `tpu_rl_janitor` deletes them after that, whatever
  happened to this run (also when `keep_vm` is on).

**Teardown.** `delete_vm` (the TPU VM) runs right after `wait_actor_checkpoint`, before the export,
whether training succeeded or failed; `delete_cpu_vm` runs last, once the bucket step succeeded
(an absent VM counts as deleted). `record_run` writes the run to the ledger (`{LEDGER_CONN_ID}`)
after it, with the TPU VM's billed span (`create_vm` → `delete_vm`), and draws its curves into a PNG next to the checkpoints (link *Run Curves*: the run's page on the
runs dashboard, `/tpu-rl`).
`{WATCHER_TASK_ID}` fails the run when any task failed, a teardown included, naming the failed
tasks and the first line of each one's error.
"""

STAGE_OF_TASK: Final = {
    "install_cpu_vm": "install",
    "install_maxtext": "install",
    "convert_to_maxtext": "convert",
    "train": "train",
    "export_to_huggingface": "export",
}

with DAG(
    dag_id=TPU_VM_DAG_ID,
    description="GRPO RL post-training with MaxText on one TPU v6e-8 VM (McJAX over SSH).",
    schedule=None,
    catchup=False,
    params=PARAMS,
    render_template_as_native_obj=True,
    user_defined_macros=PIPELINE_MACROS,
    tags=["tpu-rl", "maxtext", "grpo", "tpu-vm"],
    doc_md=DOC_MD,
    # A backstop above the tasks' own bounds: a timed-out run skips its teardown (see timeouts).
    dagrun_timeout=dagrun_timeout("tpu_vm"),
    default_args={"owner": "tpu-rl", "retries": 0, **pipeline_callbacks(LEDGER_CONN_ID)},
) as dag:
    validated = validate_task()
    args = tpu_vm_task_arguments(xcom)

    def stage(task_id: str) -> TpuVmStageOperator:
        """One stage's SSH session on its VM, bounded by its stage's timeout (the session by a bit less)."""
        bound = STAGE_OF_TASK[task_id]
        return TpuVmStageOperator(task_id=task_id, **args[task_id], **TRANSIENT_RETRIES, **bounded(bound))

    # The graph groups the stages; every task keeps its own id (stage_group).
    with stage_group("prepare"):
        # Toolchain, APIs, permissions, reservation: one line per problem, before anything exists.
        TpuRlPreflightOperator(
            task_id="preflight", **args["preflight"], **TRANSIENT_RETRIES, **bounded("preflight")
        )
        ensure_bucket = EnsureBucketOperator(
            task_id="ensure_bucket", **args["ensure_bucket"], **TRANSIENT_RETRIES, **bounded("short")
        )
        sync_hf_token = HfTokenSecretOperator(
            task_id="sync_hf_token", **args["sync_hf_token"], **TRANSIENT_RETRIES, **bounded("short")
        )
        create_cpu_vm = CpuVmCreateOperator(
            task_id="create_cpu_vm", **args["create_cpu_vm"], **TRANSIENT_RETRIES, **bounded("vm_create")
        )
        stage("install_cpu_vm")
    with stage_group("conversion"):
        stage("convert_to_maxtext")
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
        # The TPU VM is created only once the converted checkpoint is committed in GCS.
        create_vm = TpuVmCreateOperator(
            task_id="create_vm", **args["create_vm"], **TRANSIENT_RETRIES, **bounded("vm_create")
        )
        stage("install_maxtext")
        stage("train")
        wait_actor_checkpoint = MaxTextCheckpointSensor(
            task_id="wait_actor_checkpoint",
            project_id=xcom("project"),
            checkpoint_root=xcom("actor_root"),
            step=xcom("final_step"),
            deferrable=True,
            poke_interval=30,
            **sensor_bounds(),
        )
        # The bucket is a setup too: once it exists the deletes run, also after a create that
        # failed after a retry left a VM behind (deleting an absent VM succeeds). The TPU VM's delete
        # comes right after wait_actor_checkpoint (also when training failed), before the export.
        delete_vm = TpuVmDeleteOperator(
            task_id="delete_vm", **args["delete_vm"], **TRANSIENT_RETRIES, **bounded("teardown")
        ).as_teardown(setups=[ensure_bucket, create_vm])
    with stage_group("export"):
        stage("export_to_huggingface")
        wait_hf_export = HuggingFaceExportSensor(
            task_id="wait_hf_export",
            project_id=xcom("project"),
            export_uri=xcom("export_uri"),
            deferrable=True,
            poke_interval=30,
            **sensor_bounds(),
        )
    with stage_group("teardown"):
        # The CPU VM's delete is the last teardown and owns delete_bucket.
        delete_cpu_vm = CpuVmDeleteOperator(
            task_id="delete_cpu_vm", **args["delete_cpu_vm"], **TRANSIENT_RETRIES, **bounded("teardown")
        ).as_teardown(setups=[ensure_bucket, create_cpu_vm])
        record_run = record_run_task(
            TPU_VM_CLUSTER_TASK_IDS,
            job_task_ids=(),
            artifact_task_ids={"actor_checkpoint": "wait_actor_checkpoint", "hf_export": "wait_hf_export"},
        )
    chain_in_order(TPU_VM_TASK_ORDER, dag)
    # A teardown succeeds also after training failed: the export needs the checkpoint itself.
    wait_actor_checkpoint >> dag.task_dict["export_to_huggingface"]
    add_watcher(dag)
