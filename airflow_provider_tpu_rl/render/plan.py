"""The ordered list of commands a DAG run executes, for ``tpu-rl plan`` and the DAG docs."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from airflow_provider_tpu_rl.render import gke, tpu_vm
from airflow_provider_tpu_rl.render.command import Command
from airflow_provider_tpu_rl.spec.pipeline import GkePipelineSpec, TpuVmPipelineSpec


@dataclass(frozen=True)
class PlanStep:
    task_id: str
    command: Command

    def to_dict(self) -> dict[str, Any]:
        out = {"task_id": self.task_id, **self.command.to_plan_dict()}
        if self.command.description:
            out["description"] = self.command.description
        return out


def _steps(task_id: str, commands: list[Command]) -> list[PlanStep]:
    return [PlanStep(task_id, c) for c in commands]


def gke_plan(pipeline: GkePipelineSpec) -> list[PlanStep]:
    """Every command of ``tpu_rl_gke_pipeline`` in execution order (skips are decided at run time)."""
    cluster = pipeline.cluster
    workdir = gke.default_workdir(cluster.cluster_name, pipeline.suffix)
    readers = (cluster.workload_service_account, cluster.node_pool_service_account)
    steps = _steps("ensure_bucket", [gke.create_bucket(cluster.project, cluster.region, cluster.bucket)])
    steps += _steps("deploy_cluster", [gke.deploy(cluster, workdir), *gke.iam_grants(cluster)])
    steps += _steps(
        "sync_hf_token",
        gke.hf_token_secret(
            cluster.project, pipeline.hf_token.secret_id, readers, sync=pipeline.hf_token.sync_from_connection
        ),
    )
    auth = gke.docker_auth(cluster.region)
    steps += _steps("convert_to_maxtext", [*auth, gke.conversion_job(pipeline)])
    steps += _steps("train", [*auth, gke.training_job(pipeline)])
    steps += _steps("export_to_huggingface", [*auth, gke.export_job(pipeline)])
    if not pipeline.keep_cluster:
        steps += _steps(
            "destroy_cluster",
            [gke.recreate_deployment_folder(cluster, workdir), gke.destroy(cluster, workdir)],
        )
    if pipeline.delete_bucket:
        steps += _steps("destroy_cluster", [gke.delete_bucket(cluster.bucket)])
    return steps


def tpu_vm_plan(pipeline: TpuVmPipelineSpec, *, now: float | None = None) -> list[PlanStep]:
    """Every command of ``tpu_rl_tpu_vm_pipeline`` in execution order."""
    vm = pipeline.vm
    expires = int((now if now is not None else time.time()) + pipeline.max_vm_hours * 3600)
    labelled = type(vm)(**{**vm.__dict__, "labels": tpu_vm.vm_labels(pipeline, expires)})
    readers = (pipeline.service_account,) if pipeline.service_account else ()
    steps = _steps("ensure_bucket", [gke.create_bucket(vm.project, pipeline.region, vm.bucket)])
    steps += _steps(
        "sync_hf_token",
        gke.hf_token_secret(
            vm.project, pipeline.hf_token.secret_id, readers, sync=pipeline.hf_token.sync_from_connection
        ),
    )
    steps += _steps("create_vm", [tpu_vm.create_vm(labelled, pipeline.service_account)])
    steps += _steps("install_maxtext", [tpu_vm.stage_command(pipeline, "install")])
    steps += _steps("convert_to_maxtext", [tpu_vm.stage_command(pipeline, "convert")])
    steps += _steps("train", [tpu_vm.stage_command(pipeline, "train")])
    steps += _steps("export_to_huggingface", [tpu_vm.stage_command(pipeline, "export")])
    if not pipeline.keep_vm:
        steps += _steps("delete_vm", [tpu_vm.delete_vm(vm)])
    if pipeline.delete_bucket:
        steps += _steps("delete_vm", [gke.delete_bucket(vm.bucket)])
    return steps


def plan_document(dag_id: str, steps: list[PlanStep]) -> dict[str, Any]:
    return {"dag_id": dag_id, "steps": [s.to_dict() for s in steps]}
