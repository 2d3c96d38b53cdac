"""The IAM bindings a run's resources add go with the last of them (``records/grants.py``), read
back from the sandbox's IAM policies: a TPU VM run's, a GKE run's (also when its XCom is gone), a
binding that existed before, one another live run still holds, and the janitor's destroy."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from airflow_provider_tpu_rl.hooks.gcluster import GclusterHook
from airflow_provider_tpu_rl.operators.gke import (
    GRANTED_XCOM_KEY,
    EnsureBucketOperator,
    GclusterDeployOperator,
    GclusterDestroyOperator,
    HfTokenSecretOperator,
)
from airflow_provider_tpu_rl.operators.janitor import destroy_resource, find_expired_resources
from airflow_provider_tpu_rl.operators.tpu_vm import (
    CpuVmCreateOperator,
    CpuVmDeleteOperator,
    TpuVmCreateOperator,
    TpuVmDeleteOperator,
)
from airflow_provider_tpu_rl.records.grants import Binding
from airflow_provider_tpu_rl.render import gke
from airflow_provider_tpu_rl.spec import TPU_VM_DAG_ID, gke_pipeline_from_conf, tpu_vm_pipeline_from_conf
from tests.support.sandbox_run import DEFAULT_RUN_ID, RecordingTI, SandboxRun, prepare_cluster
from tpu_rl_sandbox.world.iam import iam_bindings
from tpu_rl_sandbox.world.inventory import project_number

ACCESSOR = gke.SECRET_ACCESSOR
OBJECT_ADMIN = gke.STORAGE_OBJECT_ADMIN
RUN_B = "manual__2026-03-02T00:00:00+00:00"
START = datetime(2030, 1, 1, tzinfo=UTC)


def _vm_task(
    sb: SandboxRun,
    factory: Any,
    conf: dict[str, Any],
    task_id: str,
    *,
    run_id: str = DEFAULT_RUN_ID,
    start: datetime = START,
    **kwargs: Any,
) -> Any:
    operator = sb.operator(factory, TPU_VM_DAG_ID, task_id=task_id, conf=conf, run_id=run_id, **kwargs)
    return operator.execute(sb.context(operator, conf, run_id=run_id, start_date=start))


def _account(sb: SandboxRun) -> str:
    """The service account a sandbox VM runs as when none is named: the default compute one."""
    return f"serviceAccount:{project_number(sb.project)}-compute@developer.gserviceaccount.com"


def _holds(sb: SandboxRun, conf: dict[str, Any]) -> dict[str, bool]:
    """Whether the VM account holds the token secret (``secret``) and the bucket (``bucket``)."""
    secret = tpu_vm_pipeline_from_conf(conf, dag_id=TPU_VM_DAG_ID, run_id=DEFAULT_RUN_ID).hf_token.secret_id
    member = _account(sb)
    return {
        "secret": member
        in iam_bindings(sb.layout, f"projects/{sb.project}/secrets/{secret}").get(ACCESSOR, []),
        "bucket": member in iam_bindings(sb.layout, f"b/{sb.bucket}").get(OBJECT_ADMIN, []),
    }


def _record(sb: SandboxRun, name: str) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(sb.api.download(sb.bucket, gke.resource_record_object(name)))
    return record


def _removals(sb: SandboxRun) -> list[dict[str, Any]]:
    return [c for c in sb.calls() if any(a == "remove-iam-policy-binding" for a in c["argv"])]


def _vm_run_setup(sb: SandboxRun, conf: dict[str, Any]) -> None:
    _vm_task(sb, EnsureBucketOperator, conf, "ensure_bucket")
    _vm_task(sb, HfTokenSecretOperator, conf, "sync_hf_token")


# ------------------------------------------------------------------------------ the TPU VM pipeline
def test_a_vm_runs_grants_are_recorded_and_go_with_its_last_vm(sb: SandboxRun) -> None:
    conf = sb.tpu_vm_conf()
    _vm_run_setup(sb, conf)
    assert _holds(sb, conf) == {"secret": False, "bucket": False}
    _vm_task(sb, CpuVmCreateOperator, conf, "create_cpu_vm")
    _vm_task(sb, TpuVmCreateOperator, conf, "create_vm")
    assert _holds(sb, conf) == {"secret": True, "bucket": True}
    for name in (sb.vm, f"{sb.vm}-cpu"):  # each VM's record lists what it holds
        grants = _record(sb, name)["grants"]
        assert {(g["kind"], g["role"], g["member"]) for g in grants} == {
            ("secret", ACCESSOR, _account(sb)),
            ("bucket", OBJECT_ADMIN, _account(sb)),
        }

    # the TPU VM goes first: the CPU VM (the export's) still needs both
    deleted = _vm_task(sb, TpuVmDeleteOperator, conf, "delete_vm")
    assert (deleted["deleted"], deleted["removed_grants"]) == (True, [])
    assert _holds(sb, conf) == {"secret": True, "bucket": True}
    assert _record(sb, sb.vm)["grants"] == []

    last = _vm_task(sb, CpuVmDeleteOperator, conf, "delete_cpu_vm")
    assert len(last["removed_grants"]) == 2
    assert _holds(sb, conf) == {"secret": False, "bucket": False}
    assert sb.objects(prefix="tpu-rl/grants/") == []  # nobody holds them: their objects go too


def test_a_binding_that_existed_before_the_run_is_never_removed(sb: SandboxRun) -> None:
    """The project's compute account had objectAdmin on the bucket before the run: it keeps it."""
    conf = sb.tpu_vm_conf()
    _vm_run_setup(sb, conf)
    GclusterHook().run_checked(Binding("bucket", sb.project, sb.bucket, OBJECT_ADMIN, _account(sb)).add())
    _vm_task(sb, CpuVmCreateOperator, conf, "create_cpu_vm")
    assert _holds(sb, conf) == {"secret": True, "bucket": True}

    done = _vm_task(sb, CpuVmDeleteOperator, conf, "delete_cpu_vm")

    assert done["removed_grants"] == [f"{ACCESSOR} for {_account(sb)} on secret {sb.project}/{_secret(conf)}"]
    assert _holds(sb, conf) == {"secret": False, "bucket": True}


def _secret(conf: dict[str, Any]) -> str:
    return tpu_vm_pipeline_from_conf(conf, dag_id=TPU_VM_DAG_ID, run_id=DEFAULT_RUN_ID).hf_token.secret_id


def test_a_binding_another_live_run_holds_is_kept_until_it_lets_go(sb: SandboxRun) -> None:
    """Two runs in one bucket, one service account: the first to end keeps the bindings."""
    conf_a, conf_b = sb.tpu_vm_conf(), sb.tpu_vm_conf(vm_name=f"{sb.vm}b")
    _vm_run_setup(sb, conf_a)
    _vm_task(sb, CpuVmCreateOperator, conf_a, "create_cpu_vm")
    _vm_task(sb, CpuVmCreateOperator, conf_b, "create_cpu_vm", run_id=RUN_B)

    first = _vm_task(sb, CpuVmDeleteOperator, conf_a, "delete_cpu_vm")
    assert (first["deleted"], first["removed_grants"]) == (True, [])
    assert _holds(sb, conf_a) == {"secret": True, "bucket": True}
    assert _removals(sb) == []  # not even for a moment

    second = _vm_task(sb, CpuVmDeleteOperator, conf_b, "delete_cpu_vm", run_id=RUN_B)
    assert len(second["removed_grants"]) == 2
    assert _holds(sb, conf_a) == {"secret": False, "bucket": False}


def test_a_secret_binding_a_run_of_another_bucket_holds_is_kept_until_it_lets_go(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The token secret is the project's: run B, in another bucket this Airflow knows ([tpu_rl]
    janitor_buckets), holds the binding run A added. A's teardown keeps it (and removes its own
    bucket's); B's, the last holder, removes it: B did not take it for the user's."""
    other = f"{sb.bucket}-b"
    sb.api.create_bucket(other)
    monkeypatch.setenv("AIRFLOW__TPU_RL__JANITOR_BUCKETS", f"{sb.bucket},{other}")
    conf_a, conf_b = sb.tpu_vm_conf(), sb.tpu_vm_conf(vm_name=f"{sb.vm}b", bucket=other)
    _vm_run_setup(sb, conf_a)
    _vm_task(sb, CpuVmCreateOperator, conf_a, "create_cpu_vm")
    _vm_task(sb, CpuVmCreateOperator, conf_b, "create_cpu_vm", run_id=RUN_B)
    secret = f"projects/{sb.project}/secrets/{_secret(conf_a)}"

    first = _vm_task(sb, CpuVmDeleteOperator, conf_a, "delete_cpu_vm")
    assert first["removed_grants"] == [f"{OBJECT_ADMIN} for {_account(sb)} on gs://{sb.bucket}"]
    assert _account(sb) in iam_bindings(sb.layout, secret).get(ACCESSOR, [])  # B still needs it

    second = _vm_task(sb, CpuVmDeleteOperator, conf_b, "delete_cpu_vm", run_id=RUN_B)
    assert (
        f"{ACCESSOR} for {_account(sb)} on secret {sb.project}/{_secret(conf_a)}" in second["removed_grants"]
    )
    assert _account(sb) not in iam_bindings(sb.layout, secret).get(ACCESSOR, [])


def test_a_retried_create_keeps_the_grants_its_record_lists(sb: SandboxRun) -> None:
    """A create's later try rewrites the VM's record: the grants stay in it for the delete."""
    conf = sb.tpu_vm_conf()
    _vm_run_setup(sb, conf)
    _vm_task(sb, CpuVmCreateOperator, conf, "create_cpu_vm")
    _vm_task(sb, CpuVmCreateOperator, conf, "create_cpu_vm", grant_service_account=False)
    assert len(_record(sb, f"{sb.vm}-cpu")["grants"]) == 2

    _vm_task(sb, CpuVmDeleteOperator, conf, "delete_cpu_vm")

    assert _holds(sb, conf) == {"secret": False, "bucket": False}


def test_the_janitor_takes_back_a_crashed_runs_grants(sb: SandboxRun) -> None:
    """The run died after its create (no teardown ran); the janitor deletes its expired VM and
    the bindings the VM held with it."""
    conf = sb.tpu_vm_conf(max_vm_hours=1)
    long_ago = datetime.now(UTC) - timedelta(hours=10)
    _vm_run_setup(sb, conf)
    _vm_task(sb, CpuVmCreateOperator, conf, "create_cpu_vm", start=long_ago)
    assert _holds(sb, conf) == {"secret": True, "bucket": True}
    hook = GclusterHook()

    (found,) = find_expired_resources(hook, sb.project, time.time() + 3600)
    destroy_resource(hook, found)

    assert f"{sb.project}/{conf['zone']}/{sb.vm}-cpu" not in sb.state("vms")
    assert _holds(sb, conf) == {"secret": False, "bucket": False}


# ---------------------------------------------------------------------------------- the GKE pipeline
def _gke_readers(sb: SandboxRun, conf: dict[str, Any]) -> tuple[str, list[str]]:
    pipeline = gke_pipeline_from_conf(conf, run_id=DEFAULT_RUN_ID)
    resource = f"projects/{sb.project}/secrets/{pipeline.hf_token.secret_id}"
    return resource, [pipeline.cluster.workload_service_account, pipeline.cluster.node_pool_service_account]


def test_a_cleared_runs_destroy_takes_back_the_grants_from_the_record(sb: SandboxRun) -> None:
    """The DAG run was cleared: the token task's XCom is gone, the cluster's record is not."""
    conf = sb.gke_conf()
    resource, accounts = _gke_readers(sb, conf)
    prepare_cluster(sb, conf, tpu_pool=False)
    assert {f"serviceAccount:{a}" for a in accounts} <= set(iam_bindings(sb.layout, resource)[ACCESSOR])
    assert len(_record(sb, sb.cluster)["grants"]) == 2

    destroy = sb.operator(GclusterDestroyOperator, task_id="destroy_cluster", revoke_service_accounts=None)
    done = destroy.execute(sb.context(destroy, conf))

    assert done["destroyed"] is True
    assert sorted(done["revoked_accounts"]) == sorted(accounts)
    assert ACCESSOR not in iam_bindings(sb.layout, resource)
    assert _record(sb, sb.cluster)["grants"] == []


def test_a_gke_runs_destroy_keeps_a_reader_granted_before_it(sb: SandboxRun) -> None:
    conf = sb.gke_conf()
    resource, (workload, node_pool) = _gke_readers(sb, conf)
    bucket = sb.operator(EnsureBucketOperator, task_id="ensure_bucket")
    bucket.execute(sb.context(bucket, conf))
    deploy = sb.operator(GclusterDeployOperator, task_id="deploy_cluster")
    deploy.execute(sb.context(deploy, conf))
    secret = gke_pipeline_from_conf(conf, run_id=DEFAULT_RUN_ID).hf_token.secret_id
    hook = GclusterHook()
    hook.run_checked(gke.create_secret(sb.project, secret))
    hook.run_checked(gke.grant_secret_accessor(sb.project, secret, workload))  # the user's own
    token = sb.operator(HfTokenSecretOperator, task_id="sync_hf_token")
    ti = RecordingTI()
    token.execute(sb.context(token, conf, ti=ti))
    assert ti.pulled(GRANTED_XCOM_KEY) == [node_pool]

    destroy = sb.operator(
        GclusterDestroyOperator, task_id="destroy_cluster", revoke_service_accounts=[node_pool]
    )
    done = destroy.execute(sb.context(destroy, conf))

    assert done["revoked_accounts"] == [node_pool]
    assert iam_bindings(sb.layout, resource)[ACCESSOR] == [f"serviceAccount:{workload}"]
