"""Cluster lifecycle operators: bucket, HF token secret, deploy, destroy."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from airflow.providers.common.compat.sdk import Context
from airflow.providers.google.cloud.hooks.gcs import GCSHook

from airflow_provider_tpu_rl.hooks.gcluster import GclusterHook
from airflow_provider_tpu_rl.hooks.hf_token import get_hf_token
from airflow_provider_tpu_rl.operators.pipeline import PipelineKind, PipelineOperator, run_expiry
from airflow_provider_tpu_rl.render import gke
from airflow_provider_tpu_rl.render.blueprint import BLUEPRINT_RELPATH, customize_blueprint
from airflow_provider_tpu_rl.spec import GkePipelineSpec


class EnsureBucketOperator(PipelineOperator):
    """Create the run's bucket; an existing bucket (and everything in it) is kept as is."""

    def __init__(self, *, pipeline: PipelineKind = "gke", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline_kind = pipeline

    def execute(self, context: Context) -> str:
        p = self.pipeline(context)
        if isinstance(p, GkePipelineSpec):
            project, region, bucket = p.cluster.project, p.cluster.region, p.cluster.bucket
        else:
            project, region, bucket = p.vm.project, p.region, p.vm.bucket
        self.hook.run_checked(gke.create_bucket(project, region, bucket))
        return f"gs://{bucket}"


class HfTokenSecretOperator(PipelineOperator):
    """Put the HF token where the workloads read it: a Secret Manager secret, value over stdin."""

    def __init__(self, *, pipeline: PipelineKind = "gke", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pipeline_kind = pipeline

    def execute(self, context: Context) -> str:
        p = self.pipeline(context)
        if isinstance(p, GkePipelineSpec):
            project = p.cluster.project
            readers: tuple[str, ...] = (
                p.cluster.workload_service_account,
                p.cluster.node_pool_service_account,
            )
        else:
            project = p.vm.project
            readers = (p.service_account,) if p.service_account else ()
        secrets: dict[str, str] = {}
        if p.hf_token.sync_from_connection:
            secrets["hf_token"] = get_hf_token(p.hf_token.conn_id)
        for command in gke.hf_token_secret(
            project, p.hf_token.secret_id, readers, sync=p.hf_token.sync_from_connection
        ):
            self.hook.run_checked(command, secrets=secrets)
        return p.hf_token.secret_id


def write_blueprint(hook: GclusterHook, pipeline: GkePipelineSpec, expires_at: int) -> str:
    """Customise the bundle's blueprint (structured YAML edits) into the run's work dir."""
    workdir = gke.default_workdir(pipeline.cluster.cluster_name, pipeline.suffix)
    os.makedirs(workdir, exist_ok=True)
    base = (hook.bundle_dir() / BLUEPRINT_RELPATH).read_text()
    labels = gke.cluster_labels(pipeline, expires_at)
    Path(gke.blueprint_path(workdir)).write_text(
        customize_blueprint(base, pipeline.cluster.blueprint, labels)
    )
    return workdir


def destroy_cluster(hook: GclusterHook, pipeline: GkePipelineSpec, expires_at: int) -> None:
    """Recreate the deployment folder on this worker (state is in GCS) and destroy from it."""
    workdir = write_blueprint(hook, pipeline, expires_at)
    hook.run_checked(gke.recreate_deployment_folder(pipeline.cluster, workdir), cwd=workdir)
    hook.run_checked(gke.destroy(pipeline.cluster, workdir), cwd=workdir)


def write_resource_record(
    gcp_conn_id: str,
    bucket: str,
    name: str,
    *,
    kind: str,
    context: Context,
    conf: dict[str, Any],
    expires_at: int,
    keep: bool,
) -> None:
    """What the janitor needs to destroy a resource this run creates, written before it exists."""
    record = {
        "kind": kind,
        "name": name,
        "dag_id": context["dag"].dag_id,
        "run_id": context["run_id"],
        "conf": conf,
        "expires_at": expires_at,
        "keep": keep,
    }
    GCSHook(gcp_conn_id=gcp_conn_id).upload(
        bucket_name=bucket,
        object_name=gke.resource_record_object(name),
        data=json.dumps(record, sort_keys=True),
        mime_type="application/json",
    )


class GclusterDeployOperator(PipelineOperator):
    """Deploy the Cluster Toolkit GKE cluster (state in GCS) and grant the tutorial's IAM roles.

    Idempotent: ``gcluster deploy -w`` on a healthy deployment with the same inputs changes nothing.
    """

    ui_color = "#d4e8ff"

    def execute(self, context: Context) -> dict[str, Any]:
        p: GkePipelineSpec = self.pipeline(context)
        expires_at = run_expiry(context, p.max_cluster_hours)
        write_resource_record(
            self.gcp_conn_id,
            p.cluster.bucket,
            p.cluster.cluster_name,
            kind="cluster",
            context=context,
            conf=self.pipeline_conf_for(context),
            expires_at=expires_at,
            keep=p.keep_cluster,
        )
        workdir = write_blueprint(self.hook, p, expires_at)
        started = time.time()
        self.hook.run_checked(gke.deploy(p.cluster, workdir), cwd=workdir)
        for command in gke.iam_grants(p.cluster):
            self.hook.run_checked(command)
        return {
            "cluster_name": p.cluster.cluster_name,
            "chips": p.cluster.total_chips,
            "deploy_seconds": round(time.time() - started, 3),
            "expires_at": expires_at,
        }


class GclusterDestroyOperator(PipelineOperator):
    """Destroy the cluster from its GCS state on any worker; an absent cluster is success.

    The bucket (checkpoints, exports) is deleted only with ``delete_bucket=true``.
    """

    ui_color = "#ffd9d4"

    def execute(self, context: Context) -> dict[str, Any]:
        p: GkePipelineSpec = self.pipeline(context)
        destroyed = False
        if p.keep_cluster:
            self.log.warning(
                "keep_cluster=true: cluster %s is left running (it bills)", p.cluster.cluster_name
            )
        else:
            destroy_cluster(self.hook, p, run_expiry(context, p.max_cluster_hours))
            destroyed = True
        if p.delete_bucket:
            self.log.warning(
                "delete_bucket=true: deleting gs://%s and every checkpoint in it", p.cluster.bucket
            )
            self.hook.run_checked(gke.delete_bucket(p.cluster.bucket))
        return {
            "cluster_name": p.cluster.cluster_name,
            "destroyed": destroyed,
            "bucket_deleted": p.delete_bucket,
        }
