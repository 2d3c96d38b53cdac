"""The janitor functions against the sandbox: find expired or orphaned resources, destroy them, keep buckets."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from airflow_provider_tpu_rl.compat import AirflowException
from airflow_provider_tpu_rl.hooks.gcluster import GclusterHook
from airflow_provider_tpu_rl.operators.gke import (
    LEASE_MIN_SECONDS,
    EnsureBucketOperator,
    GclusterDeployOperator,
)
from airflow_provider_tpu_rl.operators.janitor import (
    ManagedResource,
    destroy_resource,
    find_expired_resources,
)
from airflow_provider_tpu_rl.operators.tpu_vm import CpuVmCreateOperator, TpuVmCreateOperator
from airflow_provider_tpu_rl.render import gke
from airflow_provider_tpu_rl.spec import GKE_DAG_ID, TPU_VM_DAG_ID
from tests.support.sandbox_run import SandboxRun

LONG_AGO = datetime.now(UTC) - timedelta(hours=10)


def _deploy(sb: SandboxRun, name: str, run_id: str, start: datetime, **conf: Any) -> None:
    deploy = sb.operator(GclusterDeployOperator, task_id="deploy_cluster")
    config = sb.gke_conf(cluster_name=name, **conf)
    deploy.execute(sb.context(deploy, config, run_id=run_id, start_date=start))


def _create_vm(sb: SandboxRun, name: str, run_id: str, start: datetime, **conf: Any) -> None:
    # no token secret in these tests: nothing to grant the VM's service account
    create = sb.operator(
        TpuVmCreateOperator, dag_id=TPU_VM_DAG_ID, task_id="create_vm", grant_service_account=False
    )
    config = sb.tpu_vm_conf(vm_name=name, **conf)
    create.execute(sb.context(create, config, run_id=run_id, start_date=start))


def _create_cpu_vm(sb: SandboxRun, name: str, run_id: str, start: datetime, **conf: Any) -> None:
    create = sb.operator(
        CpuVmCreateOperator, dag_id=TPU_VM_DAG_ID, task_id="create_cpu_vm", grant_service_account=False
    )
    config = sb.tpu_vm_conf(vm_name=name, **conf)
    create.execute(sb.context(create, config, run_id=run_id, start_date=start))


def _names(resources: list[ManagedResource]) -> set[tuple[str, str]]:
    return {(r.kind, r.name) for r in resources}


def test_janitor_finds_and_destroys_expired_and_orphaned_resources_but_never_the_bucket(
    sb: SandboxRun,
) -> None:
    expired, orphan, kept = f"{sb.cluster}x", f"{sb.cluster}o", f"{sb.cluster}k"
    vm_expired, vm_orphan = f"{sb.vm}x", f"{sb.vm}o"
    bucket = sb.operator(EnsureBucketOperator, task_id="ensure_bucket")
    bucket.execute(sb.context(bucket, sb.gke_conf()))
    now_start = datetime.now(UTC)
    _deploy(sb, expired, "manual__expired", LONG_AGO, max_cluster_hours=1)
    _deploy(sb, orphan, "manual__orphan", now_start)
    _deploy(sb, kept, "manual__kept", now_start, keep_cluster=True)
    _create_vm(sb, vm_expired, "manual__vm_expired", LONG_AGO, max_vm_hours=1)
    # a v6e-8 reservation holds one VM: the second VM of this project takes another
    _create_vm(sb, vm_orphan, "manual__vm_orphan", now_start, reservation="my-v6e-8-reservation")
    hook = GclusterHook()
    # A deploy of a run that started long ago leases its cluster ten minutes more (a late retry's
    # deploy must finish); past that, the expired label decides.
    now = time.time() + LEASE_MIN_SECONDS + 1
    assert _names(find_expired_resources(hook, sb.project, time.time())) == {("vm", vm_expired)}

    by_expiry = find_expired_resources(hook, sb.project, now)

    assert _names(by_expiry) == {("cluster", expired), ("vm", vm_expired)}
    for resource in by_expiry:
        expires_at = int(LONG_AGO.timestamp()) + 3600
        assert resource.expires_at == expires_at
        assert resource.reason == f"expired at {datetime.fromtimestamp(expires_at, UTC).isoformat()}"
        assert resource.bucket == sb.bucket
        assert resource.project == sb.project
    assert {r.location for r in by_expiry} == {"us-east5", "us-east5-b"}  # cluster: region; VM: zone

    # Runs still going keep their resources; runs that ended orphan theirs unless they asked to keep them.
    assert _names(find_expired_resources(hook, sb.project, now, run_state=lambda d, r: "running")) == _names(
        by_expiry
    )
    asked: list[tuple[str, str]] = []

    def failed(dag_id: str, run_id: str) -> str:
        asked.append((dag_id, run_id))
        return "failed"

    stale = find_expired_resources(hook, sb.project, now, run_state=failed)

    assert _names(stale) == {("cluster", expired), ("cluster", orphan), ("vm", vm_expired), ("vm", vm_orphan)}
    assert sorted(asked) == sorted([(GKE_DAG_ID, "manual__orphan"), (TPU_VM_DAG_ID, "manual__vm_orphan")])
    reasons = {r.name: r.reason for r in stale}
    assert reasons[orphan] == f"its DAG run {GKE_DAG_ID}/manual__orphan is failed"
    assert reasons[vm_orphan] == f"its DAG run {TPU_VM_DAG_ID}/manual__vm_orphan is failed"

    # The janitor's own bookkeeping (leases it takes and releases, orphan markers) aside.
    def kept_objects() -> list[str]:
        return [name for name in sb.objects() if not name.startswith(("tpu-rl/leases/", "tpu-rl/janitor/"))]

    objects_before = kept_objects()
    leases_before = set(sb.objects(prefix="tpu-rl/leases/"))
    records_before = {
        name: sb.api.download(sb.bucket, gke.resource_record_object(name))
        for name in (expired, orphan, kept, vm_expired, vm_orphan)
    }
    for resource in stale:
        destroy_resource(hook, resource)

    clusters = sb.state("clusters")
    vms = sb.state("vms")
    for name in (expired, orphan):
        assert f"{sb.project}/us-east5/{name}" not in clusters
    assert f"{sb.project}/us-east5/{kept}" in clusters
    assert not [key for key in vms if key.startswith(f"{sb.project}/")]
    # The bucket, every object in it and the records are untouched.
    assert sb.bucket_exists()
    assert kept_objects() == objects_before
    # The destroyed clusters' leases are released; the kept cluster's stays.
    assert set(sb.objects(prefix="tpu-rl/leases/")) == leases_before - {
        f"tpu-rl/leases/{expired}.json",
        f"tpu-rl/leases/{orphan}.json",
    }
    assert f"tpu-rl/leases/{kept}.json" in leases_before
    for name, data in records_before.items():
        assert sb.api.download(sb.bucket, gke.resource_record_object(name)) == data
    assert not [c for c in sb.calls() if c["argv"][:2] == ["storage", "rm"]]
    assert not [c for c in sb.calls() if c["argv"][:3] == ["storage", "buckets", "delete"]]
    # Nothing stale is left; the kept cluster is still not a candidate.
    assert find_expired_resources(hook, sb.project, time.time(), run_state=failed) == []


def test_destroying_a_cluster_without_a_record_is_refused(sb: SandboxRun) -> None:
    """Without its record the janitor cannot rebuild the deployment: it says so instead of guessing."""
    resource = ManagedResource("cluster", f"{sb.cluster}n", sb.project, "us-east5", 1, sb.bucket)
    bucket = sb.operator(EnsureBucketOperator, task_id="ensure_bucket")
    bucket.execute(sb.context(bucket, sb.gke_conf()))

    with pytest.raises(AirflowException, match="no record") as refused:
        destroy_resource(GclusterHook(), resource)

    assert "gcluster destroy" in str(refused.value)
    assert not [c for c in sb.calls() if c["argv"][:1] == ["destroy"]]


def test_janitor_finds_and_deletes_an_expired_cpu_vm(sb: SandboxRun) -> None:
    """The TPU VM pipeline's CPU VM carries the TPU VM's labels: the janitor sees and deletes it."""
    bucket = sb.operator(EnsureBucketOperator, task_id="ensure_bucket")
    bucket.execute(sb.context(bucket, sb.gke_conf()))
    _create_cpu_vm(sb, f"{sb.vm}c", "manual__cpu_expired", LONG_AGO, max_vm_hours=1)
    cpu_vm = f"{sb.vm}c-cpu"
    assert sb.state("vms")[f"{sb.project}/us-east5-b/{cpu_vm}"]["machineType"] == "n2-highmem-32"
    hook = GclusterHook()

    (found,) = find_expired_resources(hook, sb.project, time.time() + LEASE_MIN_SECONDS + 1)

    assert (found.kind, found.name, found.location, found.bucket) == ("vm", cpu_vm, "us-east5-b", sb.bucket)
    destroy_resource(hook, found)
    assert f"{sb.project}/us-east5-b/{cpu_vm}" not in sb.state("vms")
