"""Every operator argument is a template field: a DAG can feed each one from params or XCom."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from airflow.providers.common.compat.sdk import DAG

from airflow_provider_tpu_rl.operators.existing_cluster import (
    ClusterModeDeployOperator,
    ClusterModeDestroyOperator,
)
from airflow_provider_tpu_rl.operators.gke import (
    EnsureBucketOperator,
    HfTokenSecretOperator,
)
from airflow_provider_tpu_rl.operators.gke_jobs import (
    MaxTextConvertOperator,
    MaxTextExportOperator,
    PathwaysRLTrainOperator,
)
from airflow_provider_tpu_rl.operators.preflight import TpuRlPreflightOperator
from airflow_provider_tpu_rl.operators.tpu_vm import (
    TpuVmCreateOperator,
    TpuVmDeleteOperator,
    TpuVmStageOperator,
)
from airflow_provider_tpu_rl.pipelines.arguments import gke_task_arguments, tpu_vm_task_arguments
from airflow_provider_tpu_rl.spec import (
    GKE_DAG_ID,
    TPU_VM_DAG_ID,
    gke_pipeline_from_conf,
    tpu_vm_pipeline_from_conf,
)

RUN_ID = "manual__2026-05-01T00:00:00+00:00"
GKE_CONF = {
    "model": "gemma4-26b",
    "project": "tmpl-proj",
    "region": "europe-west4",
    "zone": "europe-west4-a",
    "cluster_name": "tmpl-c",
    "bucket": "tmpl-bucket",
    "reservation": "tmpl-res",
    "num_batches": 7,
    "train_overrides": {"learning_rate": 2e-6},
    "hf_token_secret": "my-secret",
    "keep_cluster": True,
}
TPU_VM_CONF = {
    "project": "tmpl-proj",
    "zone": "europe-west4-a",
    "vm_name": "tmpl-vm",
    "bucket": "tmpl-bucket",
}
GKE_CLASSES: dict[str, Any] = {
    "preflight": TpuRlPreflightOperator,
    "ensure_bucket": EnsureBucketOperator,
    "deploy_cluster": ClusterModeDeployOperator,
    "sync_hf_token": HfTokenSecretOperator,
    "convert_to_maxtext": MaxTextConvertOperator,
    "train": PathwaysRLTrainOperator,
    "export_to_huggingface": MaxTextExportOperator,
    "destroy_cluster": ClusterModeDestroyOperator,
}
TPU_VM_CLASSES: dict[str, Any] = {
    "preflight": TpuRlPreflightOperator,
    "ensure_bucket": EnsureBucketOperator,
    "sync_hf_token": HfTokenSecretOperator,
    "create_vm": TpuVmCreateOperator,
    "install_maxtext": TpuVmStageOperator,
    "convert_to_maxtext": TpuVmStageOperator,
    "train": TpuVmStageOperator,
    "export_to_huggingface": TpuVmStageOperator,
    "delete_vm": TpuVmDeleteOperator,
}


def _cases() -> list[tuple[str, str, Any, dict[str, Any], Callable[..., dict[str, dict[str, Any]]]]]:
    gke = gke_pipeline_from_conf(GKE_CONF, run_id=RUN_ID).resolved()
    vm = tpu_vm_pipeline_from_conf(TPU_VM_CONF, run_id=RUN_ID).resolved()
    return [
        *[(GKE_DAG_ID, task_id, cls, gke, gke_task_arguments) for task_id, cls in GKE_CLASSES.items()],
        *[
            (TPU_VM_DAG_ID, task_id, cls, vm, tpu_vm_task_arguments)
            for task_id, cls in TPU_VM_CLASSES.items()
        ],
    ]


@pytest.mark.parametrize(
    ("dag_id", "task_id", "cls", "resolved", "arguments"),
    _cases(),
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_every_argument_renders_from_a_template(
    dag_id: str, task_id: str, cls: Any, resolved: dict[str, Any], arguments: Callable[..., Any]
) -> None:
    templates = arguments(lambda key: "{{ params." + key + " }}")[task_id]
    values = arguments(resolved.__getitem__)[task_id]
    dag = DAG(dag_id, schedule=None, render_template_as_native_obj=True)
    op = cls(task_id=task_id, dag=dag, **templates)
    templated = {name for name, value in templates.items() if isinstance(value, str) and "{{" in value}
    assert templated, "every pipeline argument comes from validate's values"
    assert templated <= set(op.template_fields), (
        f"not templated: {sorted(templated - set(op.template_fields))}"
    )
    op.render_template_fields({"params": resolved, "run_id": RUN_ID})  # type: ignore[arg-type]
    for name in templated:
        assert getattr(op, name) == values[name], name
    for field in ("gcluster_conn_id",):
        assert field in op.template_fields


def test_the_identifiers_reach_the_rendered_command_not_a_default() -> None:
    """A rendered job command carries the templated project, cluster, bucket and run name."""
    resolved = gke_pipeline_from_conf(GKE_CONF, run_id=RUN_ID).resolved()
    templates = gke_task_arguments(lambda key: "{{ params." + key + " }}")["train"]
    op = PathwaysRLTrainOperator(
        task_id="train", dag=DAG(GKE_DAG_ID, schedule=None, render_template_as_native_obj=True), **templates
    )
    context: Any = {"params": resolved, "run_id": RUN_ID}
    op.render_template_fields(context)
    plan = op.plan(context)
    argv = " ".join(plan.command.argv)
    for expected in (
        "--project=tmpl-proj",
        "--cluster=tmpl-c",
        "--location=europe-west4",
        "gs://tmpl-bucket/pathways/",
        "run_name=" + resolved["run_name"],
        "num_batches=7",
        "learning_rate=2e-6",
        "projects/tmpl-proj/secrets/my-secret/versions/latest",
    ):
        assert expected in argv, expected
    assert plan.name == resolved["jobs"]["train"]  # the default name is the one validate announced


@pytest.mark.parametrize(
    "cls",
    sorted({*GKE_CLASSES.values(), *TPU_VM_CLASSES.values()}, key=lambda cls: cls.__name__),
    ids=lambda cls: cls.__name__,
)
def test_the_google_conventions_render_from_templates(cls: Any) -> None:
    """``impersonation_chain`` and ``gcp_conn_id`` are templated on every operator, as in the
    google provider; a list renders item by item."""
    fields = set(cls.template_fields)
    assert {"impersonation_chain", "gcp_conn_id", "project_id"} <= fields, sorted(
        {"impersonation_chain", "gcp_conn_id", "project_id"} - fields
    )
    dag = DAG("tmpl_google", schedule=None, render_template_as_native_obj=True)
    # only the arguments each class requires; project_id may be left out (the connection's)
    required = {
        "location": "us-east5",
        "zone": "us-east5-b",
        "bucket": "tmpl-bucket",
        "cluster_name": "tmpl-c",
        "model": "qwen3-30b-a3b",
        "run_name": "r1",
        "vm_name": "tmpl-vm",
        "runner": "gke",
        "stage": "train",
        "reservation": "tmpl-res",
    }
    import inspect

    accepted = set()
    for klass in cls.__mro__:
        if "__init__" in vars(klass):
            accepted |= set(inspect.signature(klass.__init__).parameters)
    op = cls(
        task_id="t",
        dag=dag,
        gcp_conn_id="{{ params.conn }}",
        impersonation_chain=["{{ params.hop }}", "{{ params.target }}"],
        **{name: value for name, value in required.items() if name in accepted},
    )
    op.render_template_fields(
        {
            "params": {
                "conn": "gcp_tmpl",
                "hop": "hop@p.iam.gserviceaccount.com",
                "target": "t@p.iam.gserviceaccount.com",
            }
        }  # type: ignore[arg-type]
    )
    assert op.gcp_conn_id == "gcp_tmpl"
    assert op.impersonation_chain == ["hop@p.iam.gserviceaccount.com", "t@p.iam.gserviceaccount.com"]


def test_preflight_reads_the_claims_of_the_directories_train_and_export_write() -> None:
    """``validate``'s ``run_dirs`` (what preflight reads the claims of, issue 54 item 1) are the
    directories the GKE train and export jobs and the TPU VM's stages claim, in one spelling."""
    gke = gke_pipeline_from_conf(GKE_CONF, run_id=RUN_ID).resolved()
    arguments = gke_task_arguments(lambda key: "{{ params." + key + " }}")
    dag = DAG(GKE_DAG_ID, schedule=None, render_template_as_native_obj=True)
    context: Any = {"params": gke, "run_id": RUN_ID}
    for stage, task_id, factory in (
        ("train", "train", PathwaysRLTrainOperator),
        ("export", "export_to_huggingface", MaxTextExportOperator),
    ):
        op = factory(task_id=task_id, dag=dag, **arguments[task_id])
        op.render_template_fields(context)
        assert op.plan(context).run_dir == gke["run_dirs"][stage], stage
    tpu_vm = tpu_vm_pipeline_from_conf(TPU_VM_CONF, run_id=RUN_ID)
    vm_arguments = tpu_vm_task_arguments(lambda key: "{{ params." + key + " }}")
    vm_dag = DAG(TPU_VM_DAG_ID, schedule=None, render_template_as_native_obj=True)
    vm_context: Any = {"params": tpu_vm.resolved(), "run_id": RUN_ID}
    for stage, task_id in (("train", "train"), ("export", "export_to_huggingface")):
        op = TpuVmStageOperator(task_id=task_id, dag=vm_dag, **vm_arguments[task_id])
        op.render_template_fields(vm_context)
        assert op.output_directory(tpu_vm) == tpu_vm.resolved()["run_dirs"][stage], stage
    for dag_id, resolved, task_arguments in (
        (GKE_DAG_ID, gke, arguments),
        (TPU_VM_DAG_ID, tpu_vm.resolved(), vm_arguments),
    ):
        assert task_arguments["preflight"]["run_dirs"] == "{{ params.run_dirs }}", dag_id
        assert set(resolved["run_dirs"]) == {"train", "export"}, dag_id
