"""Example: a DAG written by hand from the provider's operators — a learning-rate sweep.

Deploy one cluster, convert the model once, train two runs with different ``learning_rate`` on
that cluster, wait for both final checkpoints, export both, and tear the cluster down. Every
argument is a plain, templated operator argument; nothing here depends on the pipeline DAGs.
"""

from __future__ import annotations

from airflow.providers.common.compat.sdk import DAG, Param

from airflow_provider_tpu_rl.operators.gke import (
    EnsureBucketOperator,
    GclusterDeployOperator,
    GclusterDestroyOperator,
    HfTokenSecretOperator,
)
from airflow_provider_tpu_rl.operators.gke_jobs import (
    MaxTextConvertOperator,
    MaxTextExportOperator,
    PathwaysRLTrainOperator,
)
from airflow_provider_tpu_rl.operators.preflight import TpuRlPreflightOperator
from airflow_provider_tpu_rl.pipelines.dag import bounded, sensor_bounds
from airflow_provider_tpu_rl.pipelines.form import pipeline_params
from airflow_provider_tpu_rl.sensors.checkpoint import HuggingFaceExportSensor, MaxTextCheckpointSensor
from airflow_provider_tpu_rl.spec.params import GKE
from airflow_provider_tpu_rl.timeouts import dagrun_timeout

MODEL = "qwen3-30b-a3b"
LEARNING_RATES = {"a": 3e-6, "b": 1e-6}

with DAG(
    dag_id="tpu_rl_sweep_example",
    description="Example: one cluster, two GRPO runs with different learning rates, both exported.",
    schedule=None,
    catchup=False,
    tags=["tpu-rl", "example"],
    # The pipelines' own fields (the run parameters' table): the same defaults, rules and [tpu_rl]
    # default_* prefills (docs/settings.md) as the GKE pipeline's form.
    params={
        **pipeline_params(
            GKE,
            keys=("project", "region", "zone", "bucket", "cluster_name", "reservation", "num_batches"),
            cluster_name="tpu-rl-sweep",
            num_batches=50,
        ),
        "sweep": Param("sweep", type="string", description="Prefix of the two runs' run_name."),
    },
    render_template_as_native_obj=True,
    # A backstop above the tasks' own bounds: a timed-out run skips its teardown (see timeouts).
    dagrun_timeout=dagrun_timeout("sweep"),
    default_args={"owner": "tpu-rl", "retries": 0},
) as dag:
    where = {"project_id": "{{ params.project }}", "location": "{{ params.region }}"}
    cluster = {
        **where,
        "zone": "{{ params.zone }}",
        "cluster_name": "{{ params.cluster_name }}",
        "bucket": "{{ params.bucket }}",
        "reservation": "{{ params.reservation }}",
        "model": MODEL,
    }
    job = {
        **where,
        "cluster_name": "{{ params.cluster_name }}",
        "bucket": "{{ params.bucket }}",
        "model": MODEL,
    }

    preflight = TpuRlPreflightOperator(
        task_id="preflight",
        runner="gke",
        project_id="{{ params.project }}",
        zone="{{ params.zone }}",
        reservation="{{ params.reservation }}",
        **bounded("preflight"),
    )
    bucket = EnsureBucketOperator(
        task_id="ensure_bucket", **where, bucket="{{ params.bucket }}", **bounded("short")
    )
    deploy = GclusterDeployOperator(task_id="deploy_cluster", **cluster, **bounded("deploy"))
    token = HfTokenSecretOperator(
        task_id="sync_hf_token",
        project_id="{{ params.project }}",
        reader_service_accounts=[
            "{{ params.cluster_name }}-gke-wl-sa@{{ params.project }}.iam.gserviceaccount.com",
            "{{ params.cluster_name }}-gke-np-sa@{{ params.project }}.iam.gserviceaccount.com",
        ],
        # recorded for the cluster: destroy_cluster takes back the grants it added
        bucket="{{ params.bucket }}",
        cluster_name="{{ params.cluster_name }}",
        **bounded("short"),
    )
    convert = MaxTextConvertOperator(
        task_id="convert_to_maxtext", deferrable=True, **job, **bounded("convert")
    )
    destroy = GclusterDestroyOperator(
        task_id="destroy_cluster", **cluster, **bounded("teardown")
    ).as_teardown(setups=[bucket, deploy])
    preflight >> bucket >> deploy >> token >> convert
    for key, learning_rate in LEARNING_RATES.items():
        run_name = "{{ params.sweep }}-lr-" + key
        train = PathwaysRLTrainOperator(
            task_id=f"train_{key}",
            deferrable=True,
            run_name=run_name,
            num_batches="{{ params.num_batches }}",
            train_overrides={"learning_rate": learning_rate},
            **job,
            **bounded("train"),
        )
        wait_checkpoint = MaxTextCheckpointSensor(
            task_id=f"wait_checkpoint_{key}",
            checkpoint_root="gs://{{ params.bucket }}/"
            + MODEL
            + "/trained/"
            + run_name
            + "/checkpoints/actor/",
            step="{{ params.num_batches }}",
            deferrable=True,
            poke_interval=30,
            **sensor_bounds(),
        )
        export = MaxTextExportOperator(
            task_id=f"export_{key}",
            deferrable=True,
            run_name=run_name,
            checkpoint_step="{{ params.num_batches }}",
            **job,
            **bounded("export"),
        )
        wait_export = HuggingFaceExportSensor(
            task_id=f"wait_export_{key}",
            bucket="{{ params.bucket }}",
            prefix=f"{MODEL}/hf-trained/{run_name}/",
            deferrable=True,
            poke_interval=30,
            **sensor_bounds(),
        )
        convert >> train >> wait_checkpoint >> export >> wait_export >> destroy
