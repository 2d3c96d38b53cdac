"""What stops a first real run, tried against the sandbox's fakes, which are as strict as the real
tools: a missing tool, the deployment folder, IAM without a prompt, the TPU VM's own account, SSH keys."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.operators.gke import (
    EnsureBucketOperator,
    GclusterDeployOperator,
    GclusterDestroyOperator,
    HfTokenSecretOperator,
)
from airflow_provider_tpu_rl.operators.gke_jobs import MaxTextConvertOperator
from airflow_provider_tpu_rl.operators.preflight import TpuRlPreflightOperator
from airflow_provider_tpu_rl.operators.tpu_vm import (
    CpuVmCreateOperator,
    TpuVmCreateOperator,
    TpuVmStageOperator,
)
from airflow_provider_tpu_rl.render.blueprint import BLUEPRINT_RELPATH
from airflow_provider_tpu_rl.spec import TPU_VM_DAG_ID, gke_pipeline_from_conf, tpu_vm_pipeline_from_conf
from tests.support.sandbox_run import DEFAULT_RUN_ID, SandboxRun, prepare_cluster
from tests.support.toolpath import path_without
from tpu_rl_sandbox.clis.gcloud.compute_ssh import project_ssh_keys
from tpu_rl_sandbox.world.iam import iam_bindings

START = datetime(2030, 1, 1, tzinfo=UTC)


def _execute(sb: SandboxRun, factory: Any, conf: dict[str, Any], dag_id: str, **kwargs: Any) -> Any:
    op = sb.operator(factory, dag_id=dag_id, **kwargs)
    return op.execute(sb.context(op, conf, start_date=START))


def _members(bindings: dict[str, list[str]], role: str) -> set[str]:
    return set(bindings.get(role, []))


# ---------------------------------------------------------------------------------- toolchain
@pytest.mark.parametrize("tool", ["terraform", "packer"])
def test_deploy_refuses_in_one_line_before_anything_when_a_deploy_tool_is_missing(
    sb: SandboxRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tool: str
) -> None:
    conf = sb.gke_conf()
    bucket = sb.operator(EnsureBucketOperator, task_id="ensure_bucket")
    bucket.execute(sb.context(bucket, conf))
    monkeypatch.setenv("PATH", path_without([tool], tmp_path / "path"))
    deploy = sb.operator(GclusterDeployOperator, task_id="deploy_cluster")

    with pytest.raises(AirflowFailException) as failed:
        deploy.execute(sb.context(deploy, conf))

    message = str(failed.value)
    assert "\n" not in message
    assert tool in message
    assert not [c for c in sb.calls() if c["tool"] == "gcluster"], "gcluster must not be started"
    assert sb.objects(prefix="tpu-rl/resources/") == [], "no record of a cluster that never started"


@pytest.mark.parametrize("tool", ["kubectl", "gke-gcloud-auth-plugin"])
def test_a_job_refuses_in_one_line_before_submitting_when_a_job_tool_is_missing(
    sb: SandboxRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tool: str
) -> None:
    conf = sb.gke_conf()
    prepare_cluster(sb, conf)
    monkeypatch.setenv("PATH", path_without([tool], tmp_path / "path"))
    convert = sb.operator(MaxTextConvertOperator, task_id="convert_to_maxtext")

    with pytest.raises(AirflowFailException) as failed:
        convert.execute(sb.context(convert, conf))

    assert "\n" not in str(failed.value)
    assert tool in str(failed.value)
    assert not [c for c in sb.calls() if c["tool"] == "gcluster" and c["argv"][:2] == ["job", "submit"]]


# ----------------------------------------------------------------------- deployment folder, IAM
def test_deploy_copies_the_whole_example_folder_and_grants_nothing_project_wide(sb: SandboxRun) -> None:
    conf = sb.gke_conf()
    prepare_cluster(sb, conf)

    pipeline = gke_pipeline_from_conf(conf, run_id=DEFAULT_RUN_ID)
    example = (sb.info.bundle_dir / BLUEPRINT_RELPATH).parent
    shipped = {p.name for p in example.iterdir() if p.is_file()}
    assert "kueue-configuration.yaml.tftpl" in shipped
    # the deploy succeeded: the fake gcluster refuses a blueprint whose ghpc_stage() file is missing
    # (stage_files in the sandbox's clis/gcluster/deploy.py), and the work folder is gone at task end (test_hygiene.py)
    assert sb.cluster_record() is not None
    assert not [c for c in sb.calls() if c["argv"][:2] == ["projects", "add-iam-policy-binding"]]
    # the project's policy holds a conditional binding (the sandbox's default, as on many real
    # projects): the secret grants still went through, non-interactively
    secret = iam_bindings(sb.layout, f"projects/{sb.project}/secrets/{pipeline.hf_token.secret_id}")
    cluster = pipeline.cluster
    assert _members(bindings=secret, role="roles/secretmanager.secretAccessor") == {
        f"serviceAccount:{cluster.workload_service_account}",
        f"serviceAccount:{cluster.node_pool_service_account}",
    }

    destroy = sb.operator(GclusterDestroyOperator, task_id="destroy_cluster")
    assert destroy.execute(sb.context(destroy, conf))["destroyed"] is True


# ------------------------------------------------------------------------------------ TPU VM
def _vm_up(sb: SandboxRun, conf: dict[str, Any], **create: Any) -> None:
    _execute(sb, EnsureBucketOperator, conf, TPU_VM_DAG_ID, task_id="ensure_bucket")
    _execute(sb, HfTokenSecretOperator, conf, TPU_VM_DAG_ID, task_id="sync_hf_token")
    _execute(sb, TpuVmCreateOperator, conf, TPU_VM_DAG_ID, task_id="create_vm", **create)


def _cpu_vm_up(sb: SandboxRun, conf: dict[str, Any], **create: Any) -> None:
    """Bucket, token and the CPU VM, where the conversion runs."""
    _execute(sb, EnsureBucketOperator, conf, TPU_VM_DAG_ID, task_id="ensure_bucket")
    _execute(sb, HfTokenSecretOperator, conf, TPU_VM_DAG_ID, task_id="sync_hf_token")
    _execute(sb, CpuVmCreateOperator, conf, TPU_VM_DAG_ID, task_id="create_cpu_vm", **create)


def test_the_vms_default_service_account_gets_the_secret_and_the_bucket(sb: SandboxRun) -> None:
    conf = sb.tpu_vm_conf()  # no service_account: the VM runs as the default compute account
    _cpu_vm_up(sb, conf)

    pipeline = tpu_vm_pipeline_from_conf(conf)
    secret = iam_bindings(sb.layout, f"projects/{sb.project}/secrets/{pipeline.hf_token.secret_id}")
    bucket = iam_bindings(sb.layout, f"b/{sb.bucket}")
    (reader,) = _members(secret, "roles/secretmanager.secretAccessor")
    assert reader.endswith("-compute@developer.gserviceaccount.com")
    assert reader in _members(bucket, "roles/storage.objectAdmin")
    # and with them the stages work: convert reads the token in the VM
    for task_id in ("install_cpu_vm", "convert_to_maxtext"):
        _execute(sb, TpuVmStageOperator, conf, TPU_VM_DAG_ID, task_id=task_id)


def test_without_the_grants_the_vm_cannot_read_the_token(sb: SandboxRun) -> None:
    conf = sb.tpu_vm_conf()
    _cpu_vm_up(sb, conf, grant_service_account=False)
    _execute(sb, TpuVmStageOperator, conf, TPU_VM_DAG_ID, task_id="install_cpu_vm")

    with pytest.raises(Exception, match="PERMISSION_DENIED"):
        _execute(sb, TpuVmStageOperator, conf, TPU_VM_DAG_ID, task_id="convert_to_maxtext")


def test_every_ssh_stage_uses_the_same_kept_key(sb: SandboxRun) -> None:
    conf = sb.tpu_vm_conf()
    _cpu_vm_up(sb, conf)

    for task_id in ("install_cpu_vm", "convert_to_maxtext"):
        _execute(sb, TpuVmStageOperator, conf, TPU_VM_DAG_ID, task_id=task_id)

    keys = project_ssh_keys(sb.layout, sb.project)
    assert len(keys) == 1
    ssh = [c["argv"] for c in sb.calls() if c["argv"][:2] == ["compute", "ssh"]]
    key_files = {a for argv in ssh for a in argv if a.startswith("--ssh-key-file=")}
    assert len(ssh) == 2
    assert len(key_files) == 1
    key_file = Path(key_files.pop().removeprefix("--ssh-key-file="))
    assert key_file.is_relative_to(sb.info.root), "the sandbox's cache, not the real ~/.cache"
    assert key_file.is_file()


def test_a_retry_whose_vm_holds_the_reservation_passes_preflight(sb: SandboxRun) -> None:
    """The reservation holds one VM and this run's VM from an earlier try holds it: not refused."""
    conf = sb.tpu_vm_conf()
    _vm_up(sb, conf)

    result = _execute(sb, TpuRlPreflightOperator, conf, TPU_VM_DAG_ID, task_id="preflight")

    assert result["reservation"] == "res-8"
