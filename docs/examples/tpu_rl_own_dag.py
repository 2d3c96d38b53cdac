"""Your own DAG from the provider's operators: deploy a cluster, convert, train, wait, destroy.

The operator guide (``docs/operators.md``) explains it argument by argument;
``tests/docs/test_operator_guide.py`` runs it end to end in the sandbox. Every value that varies
between runs is a param, given to the operators as a Jinja template; nothing here depends on the
shipped pipeline DAGs.
"""

from __future__ import annotations

from typing import Any

from airflow.providers.common.compat.sdk import DAG, Param

from airflow_provider_tpu_rl.operators.gke import (
    EnsureBucketOperator,
    GclusterDeployOperator,
    GclusterDestroyOperator,
    HfTokenSecretOperator,
)
from airflow_provider_tpu_rl.operators.gke_jobs import MaxTextConvertOperator, PathwaysRLTrainOperator
from airflow_provider_tpu_rl.pipelines.arguments import transient_retries
from airflow_provider_tpu_rl.sensors.checkpoint import MaxTextCheckpointSensor
from airflow_provider_tpu_rl.timeouts import dagrun_timeout, job_timeout, task_timeout

MODEL = "qwen3-30b-a3b"  # a GKE model preset: MaxText model, image, slice shape, job names

# [guide:cluster]
with DAG(
    dag_id="tpu_rl_own_dag",
    description="Guide example: one cluster, one conversion, one GRPO run, always torn down.",
    schedule=None,
    catchup=False,
    tags=["tpu-rl", "example"],
    params={
        # Empty: the project of the GCP connection (google_cloud_default), as the google provider does.
        "project": Param("", type="string", description="Your GCP project; empty: the connection's."),
        # Empty: the connection's own identity; else the service account every call acts as.
        "impersonation_chain": Param("", type="string", description="Service account to impersonate."),
        "region": Param("us-east5", type="string"),
        "zone": Param("us-east5-b", type="string"),
        "bucket": Param("my-tpu-rl-bucket", type="string", description="Your bucket."),
        "cluster_name": Param("tpu-rl-own", type="string", maxLength=20),
        "reservation": Param("", type="string"),
        "run_name": Param("my-first-run", type="string"),
        "num_batches": Param(50, type="integer", minimum=1),
        "learning_rate": Param(3e-6, type="number", exclusiveMinimum=0),
    },
    # "{{ params.num_batches }}" renders as an int, the overrides as a dict.
    render_template_as_native_obj=True,
    # A backstop only: a timed-out DAG run skips its teardown, so this stays above the tasks' bounds.
    dagrun_timeout=dagrun_timeout("gke"),
    default_args={"owner": "tpu-rl", "retries": 0},
) as dag:
    google = {  # the google provider's conventions, given to every task
        "project_id": "{{ params.project }}",
        "impersonation_chain": "{{ params.impersonation_chain }}",
    }
    cluster = {
        **google,
        "location": "{{ params.region }}",
        "zone": "{{ params.zone }}",
        "cluster_name": "{{ params.cluster_name }}",
        "bucket": "{{ params.bucket }}",
        "reservation": "{{ params.reservation }}",
        "model": MODEL,
    }
    bucket = EnsureBucketOperator(
        task_id="ensure_bucket",
        location="{{ params.region }}",
        bucket="{{ params.bucket }}",
        execution_timeout=task_timeout("short"),
        **google,
    )
    deploy = GclusterDeployOperator(
        task_id="deploy_cluster",
        max_cluster_hours=6,  # the janitor destroys the cluster 6 h after the run started
        execution_timeout=task_timeout("deploy"),
        **cluster,
        **transient_retries(),
    )
    destroy = GclusterDestroyOperator(
        task_id="destroy_cluster",
        max_cluster_hours=6,
        execution_timeout=task_timeout("teardown"),
        **cluster,
        **transient_retries(),
    ).as_teardown(setups=[bucket, deploy])
    # [/guide:cluster]

    # [guide:token]
    # the project the deploy used (params.project, or the connection's)
    project = "{{ ti.xcom_pull('deploy_cluster')['project'] }}"
    token = HfTokenSecretOperator(
        task_id="sync_hf_token",
        reader_service_accounts=[
            "{{ params.cluster_name }}-gke-wl-sa@" + project + ".iam.gserviceaccount.com",
            "{{ params.cluster_name }}-gke-np-sa@" + project + ".iam.gserviceaccount.com",
        ],
        # the grants are recorded for the cluster: destroy_cluster takes back those it added
        bucket="{{ params.bucket }}",
        cluster_name="{{ params.cluster_name }}",
        execution_timeout=task_timeout("short"),
        **google,
    )
    # [/guide:token]

    # [guide:jobs]
    job: dict[str, Any] = {
        **google,
        "location": "{{ params.region }}",
        "cluster_name": "{{ params.cluster_name }}",
        "bucket": "{{ params.bucket }}",
        "model": MODEL,
        "deferrable": True,  # wait in the triggerer, not in a worker slot
    }
    convert = MaxTextConvertOperator(
        task_id="convert_to_maxtext",
        execution_timeout=task_timeout("convert"),
        **job,
        **transient_retries(),
    )
    train = PathwaysRLTrainOperator(
        task_id="train",
        run_name="{{ params.run_name }}",
        num_batches="{{ params.num_batches }}",
        train_overrides={"learning_rate": "{{ params.learning_rate }}"},
        execution_timeout=task_timeout("train"),
        **job,
        **transient_retries(),
    )
    # [/guide:jobs]

    # [guide:sensor]
    wait_checkpoint = MaxTextCheckpointSensor(
        task_id="wait_actor_checkpoint",
        checkpoint_root=(
            "gs://{{ params.bucket }}/" + MODEL + "/trained/{{ params.run_name }}/checkpoints/actor/"
        ),
        step="{{ params.num_batches }}",
        deferrable=True,
        poke_interval=30,
        timeout=job_timeout("checkpoint").total_seconds(),
        execution_timeout=task_timeout("checkpoint"),
        **google,
    )
    # [/guide:sensor]

    # [guide:order]
    bucket >> deploy >> token >> convert >> train >> wait_checkpoint >> destroy
    # [/guide:order]
