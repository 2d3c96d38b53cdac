"""GRPO RL post-training with MaxText on one TPU v6e-8 VM over SSH (McJAX), as in the Llama 3.1 8B tutorial.

The trigger form is built from the run parameters' table (``spec/params.py``); ``validate``
re-checks the whole conf with the spec before anything is created. Nothing here calls a cloud API
or renders a command at parse time: this file only lists the tasks and their order.
"""

from __future__ import annotations

from typing import Final

from airflow_provider_tpu_rl.ledger.collect import TPU_VM_CLUSTER_TASK_IDS
from airflow_provider_tpu_rl.operators.boot_image import BakeVmDeleteOperator, TpuVmBootImageOperator
from airflow_provider_tpu_rl.operators.tpu_vm import (
    CpuVmCreateOperator,
    CpuVmDeleteOperator,
    TpuVmCreateOperator,
    TpuVmDeleteOperator,
    TpuVmStageOperator,
)
from airflow_provider_tpu_rl.pipelines import dag as pipeline
from airflow_provider_tpu_rl.pipelines import waits
from airflow_provider_tpu_rl.pipelines.arguments import bake_result, tpu_vm_task_arguments, xcom
from airflow_provider_tpu_rl.pipelines.failures import WATCHER_TASK_ID, add_watcher
from airflow_provider_tpu_rl.pipelines.validate import validate_task
from airflow_provider_tpu_rl.spec import TPU_VM_DAG_ID, Runner
from airflow_provider_tpu_rl.spec.params import TPU_VM
from airflow_provider_tpu_rl.spec.pipeline import TPU_VM_SIDE_TASKS, TPU_VM_TASK_ORDER
from airflow_provider_tpu_rl.spec.presets import presets_for

TPU_VM_MODELS: Final = presets_for(Runner.TPU_VM)

DOC_MD = f"""
# {TPU_VM_DAG_ID}

GRPO post-training of {", ".join(TPU_VM_MODELS)} with MaxText on one TPU v6e-8 VM (on-demand, reservation-bound, Spot or flex-start: `capacity`),
driven over SSH, as in the Llama 3.1 8B tutorial, except that the TPU VM exists only while it trains:
bucket → HF token secret → **CPU VM** (`<vm_name>-cpu`, `cpu_machine_type`) → Docker and the workload image
there (`runtime` container, the default; `install`: MaxText from sources) →
HF→MaxText conversion on the CPU VM in that image, written to the bucket → `wait_converted_checkpoint` (its commit
marker) → **TPU VM**, booted from the **baked boot image** (beside the CPU VM's tasks, `bake_image` finds
the image family named after the workload image's digest, or bakes it once on a CPU VM of its own:
Docker and the image pulled, the disk imaged; `delete_bake_vm` is its teardown) → `install_maxtext`
(with a baked image it only checks Docker and the image are there: nothing installed or pulled on
the billed TPU VM; without one it installs Docker and pulls; `install`: MaxText from sources, the tutorial's way) → training, loading the converted checkpoint from the bucket
and writing its checkpoints there → `wait_actor_checkpoint` → TPU VM deleted → MaxText→HF export on
the CPU VM (bucket to bucket) → `wait_hf_export` → CPU VM deleted. MaxText's converters force JAX
onto the CPU (`jax_platforms=cpu`), so they never needed the TPU: the billed TPU VM now lives only
around training.

**Assets.** Once the converted checkpoint is committed, `publish_converted_<preset>` emits
`tpu-rl://converted-checkpoints/<preset>`; after the export, `promote_model` writes the model card and
applies `min_reward_gain`, and `publish_<preset>` emits `tpu-rl://models/<preset>` for a promoted
model. The other presets' tasks skip (docs/assets.md).

**Trigger form.** *Run Parameters* (open): project, zone, bucket, reservation, capacity (on-demand, the
default; reservation, which names one; spot; flex-start), service account;
the prefilled `my-tpu-project` and `my-tpu-rl-bucket` are examples, marked in their titles,
or set once for this Airflow in `[tpu_rl] default_project`, `default_bucket`, ... (the fields' defaults). *VM*: the
TPU VM's name, the CPU VM's machine type, and the `runtime` (`container`, the default: both VMs run
the prebuilt post-training image, `workload_image`, one MaxText release for conversion, training and
export; `install`: MaxText built from sources on both VMs, on the billed TPU VM first, as in the tutorial).
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
(an absent VM counts as deleted); `delete_bake_vm` deletes the bake VM if `bake_image` left one.
`record_run` writes the run to the ledger (`{pipeline.LEDGER_CONN_ID}`)
after it, with the TPU VM's billed time by its own clock (the RUNNING spans `delete_vm` reads; `create_vm` → `delete_vm` is the capacity held), and draws its curves into a PNG next to the checkpoints (link *Run Curves*: the run's page on the
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

with pipeline.pipeline_dag(
    TPU_VM,
    dag_id=TPU_VM_DAG_ID,
    description="GRPO RL post-training with MaxText on one TPU v6e-8 VM (McJAX over SSH).",
    tags=["tpu-vm"],
    doc_md=DOC_MD,
) as dag:
    validate_task()
    args = tpu_vm_task_arguments(xcom, bake_result)

    def stage(task_id: str) -> TpuVmStageOperator:
        """One stage's SSH session on its VM, bounded by its stage's timeout (the session by a bit less)."""
        return TpuVmStageOperator(
            task_id=task_id, **args[task_id], **pipeline.transient(STAGE_OF_TASK[task_id])
        )

    # The graph groups the stages; every task keeps its own id (stage_group).
    with pipeline.stage_group("prepare"):
        ensure_bucket = pipeline.first_steps(args)[1]
        # The TPU VM's boot image, beside the CPU VM's tasks: found in its family, or baked on a
        # CPU VM of its own (deleted by the task, and by its teardown if the task is cut short).
        bake_image = TpuVmBootImageOperator(
            task_id="bake_image", **args["bake_image"], **pipeline.transient("bake")
        )
        delete_bake_vm = BakeVmDeleteOperator(
            task_id="delete_bake_vm", **args["delete_bake_vm"], **pipeline.transient("teardown")
        ).as_teardown(setups=[bake_image])
        create_cpu_vm = CpuVmCreateOperator(
            task_id="create_cpu_vm", **args["create_cpu_vm"], **pipeline.transient("vm_create")
        )
        stage("install_cpu_vm")
    with pipeline.stage_group("conversion"):
        stage("convert_to_maxtext")
        pipeline.publish_converted_tasks(
            args["promote_model"]["model"], TPU_VM_MODELS, waits.wait_converted_checkpoint()
        )
    with pipeline.stage_group("training"):
        # The TPU VM is created only once the converted checkpoint is committed in GCS.
        create_vm = TpuVmCreateOperator(
            task_id="create_vm", **args["create_vm"], **pipeline.transient("vm_create")
        )
        stage("install_maxtext")
        stage("train")
        actor_checkpoint = waits.wait_actor_checkpoint(poke_interval=30)
        # The bucket is a setup too: once it exists the deletes run, also after a create that
        # failed after a retry left a VM behind (deleting an absent VM succeeds). The TPU VM's delete
        # comes right after wait_actor_checkpoint (also when training failed), before the export.
        TpuVmDeleteOperator(
            task_id="delete_vm", **args["delete_vm"], **pipeline.transient("teardown")
        ).as_teardown(setups=[ensure_bucket, create_vm])
    with pipeline.stage_group("export"):
        export_to_huggingface = stage("export_to_huggingface")
        waits.wait_hf_export()
        pipeline.promote_model_task(
            args["promote_model"],
            TPU_VM_CLUSTER_TASK_IDS,
            TPU_VM_MODELS,
            job_task_ids=(),
            artifact_task_ids={"actor_checkpoint": "wait_actor_checkpoint", "hf_export": "wait_hf_export"},
        )
    with pipeline.stage_group("teardown"):
        # The CPU VM's delete is the last teardown and owns delete_bucket.
        CpuVmDeleteOperator(
            task_id="delete_cpu_vm", **args["delete_cpu_vm"], **pipeline.transient("teardown")
        ).as_teardown(setups=[ensure_bucket, create_cpu_vm])
        record_run = pipeline.record_run_task(
            TPU_VM_CLUSTER_TASK_IDS,
            job_task_ids=(),
            artifact_task_ids={"actor_checkpoint": "wait_actor_checkpoint", "hf_export": "wait_hf_export"},
        )
    pipeline.chain_in_order(TPU_VM_TASK_ORDER, dag, beside=TPU_VM_SIDE_TASKS)
    # The TPU VM boots from the boot image; the run is recorded once the bake VM is gone.
    bake_image >> create_vm
    delete_bake_vm >> record_run
    # A teardown succeeds also after training failed: the export needs the checkpoint itself.
    actor_checkpoint >> export_to_huggingface
    add_watcher(dag)
