"""GRPO RL post-training with MaxText on a multi-host TPU v6e slice (GKE + Pathways, Cluster Toolkit).

The trigger form is built from the run parameters' table (``spec/params.py``); ``validate``
re-checks the whole conf with the spec (cross-field rules, unknown keys) before anything is
created. Nothing here calls a cloud API or renders a command at parse time: this file only lists
the tasks and their order.
"""

from __future__ import annotations

from typing import Final

from airflow_provider_tpu_rl.ledger.collect import GKE_CLUSTER_TASK_IDS
from airflow_provider_tpu_rl.operators.existing_cluster import (
    ClusterModeDeployOperator,
    ClusterModeDestroyOperator,
)
from airflow_provider_tpu_rl.operators.gke_jobs import (
    MaxTextConvertOperator,
    MaxTextExportOperator,
    PathwaysRLTrainOperator,
)
from airflow_provider_tpu_rl.operators.image_stream import CopyWorkloadImageOperator
from airflow_provider_tpu_rl.pipelines import dag as pipeline
from airflow_provider_tpu_rl.pipelines import waits
from airflow_provider_tpu_rl.pipelines.arguments import copied_image_template, gke_task_arguments, xcom
from airflow_provider_tpu_rl.pipelines.failures import WATCHER_TASK_ID, add_watcher
from airflow_provider_tpu_rl.pipelines.validate import validate_task
from airflow_provider_tpu_rl.spec import GKE_DAG_ID, Runner
from airflow_provider_tpu_rl.spec.params import GKE
from airflow_provider_tpu_rl.spec.pipeline import GKE_SIDE_TASKS, GKE_TASK_ORDER
from airflow_provider_tpu_rl.spec.presets import presets_for

GKE_MODELS: Final = presets_for(Runner.GKE)

DOC_MD = f"""
# {GKE_DAG_ID}

GRPO post-training of an LLM with MaxText on a TPU v6e slice on GKE (Pathways), as in the
Qwen3-30B-A3B and Gemma 4 tutorials: bucket → cluster (no TPU yet) → HF→MaxText conversion
(CPU node pool; beside it, `copy_workload_image` copies the training image into the project's
own Artifact Registry repository `image_repository`, once per digest, so the TPU node pool
streams it) → TPU node pool → training → TPU node pool destroyed → MaxText→HF export (CPU
node pool) → cluster destroyed.

**TPU billed only while it trains.** The blueprint's TPU node pool is moved to a deployment group
`tpu` of its own: `deploy_cluster` deploys everything else (`gcluster deploy --skip=tpu`: network,
cluster, `cpu-np`, Kueue), `deploy_tpu_pool` deploys the pool (`--only=tpu`) once the converted
checkpoint is committed, and `destroy_tpu_pool` destroys it (`gcluster destroy --only=tpu`) once
the actor checkpoint is committed, whatever the training did. `destroy_cluster` still destroys
everything left, the pool included when its own destroy failed. `keep_cluster` keeps the cluster,
not the TPU pool.

**Assets.** Once the converted checkpoint is committed, `publish_converted_<preset>` emits
`tpu-rl://converted-checkpoints/<preset>`; after the export, `promote_model` writes the model card and
applies `min_reward_gain`, and `publish_<preset>` emits `tpu-rl://models/<preset>` for a promoted
model. The other presets' tasks skip (docs/assets.md).

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

**Cluster mode.** `cluster_mode` `create` (the default) is the flow above. `existing` names a GKE
cluster a platform team runs (`existing_cluster`): the same tasks create and delete only the run's
own node pools in it (`deploy_cluster` its CPU pool unless `cpu_node_pool` names the cluster's,
`deploy_tpu_pool` its TPU pool, `destroy_tpu_pool` and `destroy_cluster` delete them), with no
cluster lease; the cluster is never deleted (docs/platform-teams.md).

**Safety switches.**
- `keep_cluster` (off): on, the cluster survives the run and keeps billing.
- `delete_bucket` (off): on, the teardown deletes the bucket, **including the trained model**.
- `max_cluster_hours`: the cluster carries `tpu-rl-expires`; `tpu_rl_janitor` destroys it after
  that, whatever happened to this run (also when `keep_cluster` is on).

**Teardown.** `destroy_tpu_pool` runs once the cluster deploy succeeded; `destroy_cluster` runs once the bucket step succeeded, whether the work succeeded,
failed or the deploy itself failed half-way; `record_run` writes the run to the ledger
(`{pipeline.LEDGER_CONN_ID}`) after it and draws its curves (mean reward, train loss) into a PNG next to the
checkpoints: its *Run Curves* link opens the run's page on the runs dashboard (`/tpu-rl`). `{WATCHER_TASK_ID}` fails the run when any task failed,
a teardown included, naming the failed tasks and the first line of each one's error, so a cluster
that could not be destroyed never shows as a green run.
"""

with pipeline.pipeline_dag(
    GKE,
    dag_id=GKE_DAG_ID,
    description="GRPO RL post-training with MaxText on a TPU v6e slice on GKE (Pathways).",
    tags=["gke", "pathways"],
    doc_md=DOC_MD,
) as dag:
    validate_task()
    args = gke_task_arguments(xcom, training_image=copied_image_template())
    # The graph groups the stages; every task keeps its own id (stage_group).
    with pipeline.stage_group("prepare"):
        ensure_bucket = pipeline.first_steps(args)[1]
        deploy_cluster = ClusterModeDeployOperator(
            task_id="deploy_cluster", **args["deploy_cluster"], **pipeline.transient("deploy")
        )
        # Beside the cluster and the conversion: the training image copied into the run's own
        # repository (once per digest), so the TPU node pool streams it; deploy_tpu_pool waits for it.
        copy_workload_image = CopyWorkloadImageOperator(
            task_id="copy_workload_image", **args["copy_workload_image"], **pipeline.transient("copy")
        )
    with pipeline.stage_group("conversion"):
        MaxTextConvertOperator(
            task_id="convert_to_maxtext",
            deferrable=True,
            **args["convert_to_maxtext"],
            **pipeline.transient("convert"),
        )
        pipeline.publish_converted_tasks(
            args["promote_model"]["model"], GKE_MODELS, waits.wait_converted_checkpoint()
        )
    with pipeline.stage_group("training"):
        # The TPU node pool (its own deployment group) exists only while training needs it: deployed
        # once the converted checkpoint is committed, destroyed once the actor checkpoint is.
        deploy_tpu_pool = ClusterModeDeployOperator(
            task_id="deploy_tpu_pool", **args["deploy_tpu_pool"], **pipeline.transient("deploy")
        )
        PathwaysRLTrainOperator(
            task_id="train", deferrable=True, **args["train"], **pipeline.transient("train")
        )
        actor_checkpoint = waits.wait_actor_checkpoint(poke_interval=60)
        # A teardown of the pool: runs whatever training did once the cluster deploy succeeded (a
        # pool that failed half-way or was never deployed is an already-absent group: a no-op destroy).
        ClusterModeDestroyOperator(
            task_id="destroy_tpu_pool", **args["destroy_tpu_pool"], **pipeline.transient("teardown")
        ).as_teardown(setups=[deploy_cluster, deploy_tpu_pool])
    with pipeline.stage_group("export"):
        export_to_huggingface = MaxTextExportOperator(
            task_id="export_to_huggingface",
            deferrable=True,
            **args["export_to_huggingface"],
            **pipeline.transient("export"),
        )
        waits.wait_hf_export()
        pipeline.promote_model_task(args["promote_model"], GKE_CLUSTER_TASK_IDS, GKE_MODELS)
    with pipeline.stage_group("teardown"):
        # The bucket is a setup too: once it exists the destroy runs, also after a deploy that
        # failed half-way (a stockout leaves a cluster without TPU nodes). It also owns delete_bucket.
        ClusterModeDestroyOperator(
            task_id="destroy_cluster",
            **args["destroy_cluster"],
            # only the secretAccessor grants this run added (none when the token task never ran)
            revoke_service_accounts="{{ ti.xcom_pull(task_ids='sync_hf_token', key='granted_accounts') }}",
            **pipeline.transient("teardown"),
        ).as_teardown(setups=[ensure_bucket, deploy_cluster])
        pipeline.record_run_task(GKE_CLUSTER_TASK_IDS)
    pipeline.chain_in_order(GKE_TASK_ORDER, dag, beside=GKE_SIDE_TASKS)
    copy_workload_image >> deploy_tpu_pool
    # The export follows the TPU pool's destroy, and needs the actor checkpoint itself (a teardown
    # succeeds after a failed training too).
    actor_checkpoint >> export_to_huggingface
    add_watcher(dag)
