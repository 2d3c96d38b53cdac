"""A run's own node pools on a cluster it does not own (operators/existing_cluster.py), against the
sandbox's cluster made outside the provider: two runs each create and delete only their own pools;
another team's pool, a pool the run cannot prove its own, and the cluster are left alone."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.exceptions import CommandError, FailureKind
from airflow_provider_tpu_rl.hooks.gcluster import GclusterHook
from airflow_provider_tpu_rl.operators.existing_cluster import (
    ClusterModeDeployOperator,
    ClusterModeDestroyOperator,
    ExistingClusterPoolCreateOperator,
    ExistingClusterPoolDeleteOperator,
    sweep_run_pools,
)
from airflow_provider_tpu_rl.operators.gke import EnsureBucketOperator
from airflow_provider_tpu_rl.operators.gke_jobs import (
    MaxTextConvertOperator,
    MaxTextExportOperator,
    PathwaysRLTrainOperator,
)
from airflow_provider_tpu_rl.records.resources import read_resource_record
from airflow_provider_tpu_rl.spec.pipeline import GKE_DAG_ID, run_suffix
from tests.support.sandbox_run import REGION, ZONE, RecordingTI, SandboxRun
from tpu_rl_sandbox.apis.kube_api import create_compute_class
from tpu_rl_sandbox.clis.gcloud.app import Gcloud
from tpu_rl_sandbox.world import compute_classes
from tpu_rl_sandbox.world.existing_clusters import make_existing_cluster
from tpu_rl_sandbox.world.gke_nodes import CLUSTER_LABEL, POOL_LABEL
from tpu_rl_sandbox.world.settings import DEFAULT_RESERVATIONS, update_settings
from tpu_rl_sandbox.world.store import StateStore

RUN_A, RUN_B = "manual__team-a", "manual__team-b-sweep"
TEAM_POOLS = ["default-pool", "cpu-np", "team-b-v6e"]


def _cluster(sb: SandboxRun) -> str:
    make_existing_cluster(StateStore(sb.layout), sb.project, REGION, ZONE, sb.cluster)
    conf = sb.gke_conf()
    bucket = sb.operator(EnsureBucketOperator, conf=conf, task_id="ensure_bucket")
    bucket.execute(sb.context(bucket, conf))
    return f"{sb.project}/{REGION}/{sb.cluster}"


def _run(sb: SandboxRun, factory: Any, run_id: str, where: str, **arguments: Any) -> dict[str, Any]:
    conf = sb.gke_conf()
    operator = sb.operator(
        factory,
        conf=conf,
        run_id=run_id,
        task_id=f"{factory.__name__}-{arguments.get('pools', 'tpu')}",
        existing_cluster=where,
        zone=ZONE,
        bucket=sb.bucket,
        topology="2x2",
        **arguments,
    )
    result: dict[str, Any] = operator.execute(sb.context(operator, conf, run_id=run_id))
    return result


def _pools(sb: SandboxRun) -> list[str]:
    record = sb.cluster_record()
    assert record is not None
    assert record.get("exists", True)
    return [p["name"] for p in record["node_pools"]]


def test_two_runs_each_create_and_delete_only_their_own_pools(sb: SandboxRun) -> None:
    where = _cluster(sb)
    a, b = run_suffix(GKE_DAG_ID, RUN_A), run_suffix(GKE_DAG_ID, RUN_B)
    for run_id in (RUN_A, RUN_B):
        _run(sb, ExistingClusterPoolCreateOperator, run_id, where, pools="cpu")
        _run(sb, ExistingClusterPoolCreateOperator, run_id, where)
    own = {f"tpu-rl-{s}-{kind}" for s in (a, b) for kind in ("tpu-0", "cpu")}
    assert set(_pools(sb)) == set(TEAM_POOLS) | own
    record = read_resource_record("google_cloud_default", sb.bucket, f"tpu-rl-{a}-tpu-0")
    assert record is not None
    assert (record["kind"], record["run_id"]) == ("node_pool", RUN_A)

    deleted = _run(sb, ExistingClusterPoolDeleteOperator, RUN_A, where)
    assert deleted["deleted"] == [f"tpu-rl-{a}-tpu-0"]
    _run(sb, ExistingClusterPoolDeleteOperator, RUN_A, where, pools="cpu")
    assert set(_pools(sb)) == set(TEAM_POOLS) | {f"tpu-rl-{b}-tpu-0", f"tpu-rl-{b}-cpu"}
    # a retry of the delete finds nothing of its own left
    assert _run(sb, ExistingClusterPoolDeleteOperator, RUN_A, where)["deleted"] == []

    _run(sb, ExistingClusterPoolDeleteOperator, RUN_B, where)
    _run(sb, ExistingClusterPoolDeleteOperator, RUN_B, where, pools="cpu")
    assert _pools(sb) == TEAM_POOLS
    assert not any(c["argv"][:3] == ["container", "clusters", "delete"] for c in sb.calls())


def test_a_create_retry_keeps_its_own_pool(sb: SandboxRun) -> None:
    where = _cluster(sb)
    account = f"team-a-nodes@{sb.project}.iam.gserviceaccount.com"
    _run(sb, ExistingClusterPoolCreateOperator, RUN_A, where, node_service_account=account)
    record = sb.cluster_record()
    assert record is not None
    pool = next(p for p in record["node_pools"] if p["name"].startswith("tpu-rl-"))
    assert pool["service_account"] == account  # who the TPU pods are to Google APIs
    again = _run(sb, ExistingClusterPoolCreateOperator, RUN_A, where)
    assert again["pools"] == [f"tpu-rl-{run_suffix(GKE_DAG_ID, RUN_A)}-tpu-0"]


def test_the_clusters_cpu_pool_named_means_no_cpu_pool_of_the_runs(sb: SandboxRun) -> None:
    where = _cluster(sb)
    assert (
        _run(sb, ExistingClusterPoolCreateOperator, RUN_A, where, pools="cpu", cpu_node_pool="cpu-np")[
            "pools"
        ]
        == []
    )
    assert (
        _run(sb, ExistingClusterPoolDeleteOperator, RUN_A, where, pools="cpu", cpu_node_pool="cpu-np")[
            "deleted"
        ]
        == []
    )
    assert _pools(sb) == TEAM_POOLS


def _squat(sb: SandboxRun, name: str, labels: str) -> None:
    """Someone else makes a pool with the run's name (gcloud directly, not the provider)."""
    out: list[str] = []
    code = Gcloud(sb.layout, dict(os.environ), lambda: b"", out.append, out.append).run(
        [
            "container",
            "node-pools",
            "create",
            name,
            f"--cluster={sb.cluster}",
            f"--location={REGION}",
            f"--project={sb.project}",
            "--machine-type=e2-standard-8",
            "--num-nodes=1",
            *labels.split(),
        ]
    )
    assert code == 0, out


ANOTHER_DEPLOYMENTS = "--labels=tpu-rl-managed=true,tpu-rl-run={s},tpu-rl-bucket=another-airflows-bucket --node-labels=tpu-rl-run={s}"


@pytest.mark.parametrize("labels", ["", "--labels=tpu-rl-managed=true,tpu-rl-run={s}", ANOTHER_DEPLOYMENTS])
def test_a_pool_with_the_runs_name_it_cannot_prove_its_own_is_left_alone(sb: SandboxRun, labels: str) -> None:
    """Unlabelled, labels copied without the node labels, or every label of the run's but the
    bucket's (another Airflow deployment's run with the same DAG and run ids, so the same names)."""
    where = _cluster(sb)
    suffix = run_suffix(GKE_DAG_ID, RUN_A)
    name = f"tpu-rl-{suffix}-tpu-0"
    _squat(sb, name, labels.format(s=suffix))
    if labels != "--labels=tpu-rl-managed=true,tpu-rl-run={s}":
        with pytest.raises(AirflowFailException, match=f"has a node pool {name} that is not this run's"):
            _run(sb, ExistingClusterPoolCreateOperator, RUN_A, where)
    # labels copied without the node labels, or no record of this run: never deleted
    result = _run(sb, ExistingClusterPoolDeleteOperator, RUN_A, where)
    assert (result["deleted"], result["left_alone"]) == ([], [name])
    assert name in _pools(sb)


def test_the_janitor_deletes_only_the_pools_of_ended_or_expired_runs(sb: SandboxRun) -> None:
    where = _cluster(sb)
    a, b = run_suffix(GKE_DAG_ID, RUN_A), run_suffix(GKE_DAG_ID, RUN_B)
    for run_id in (RUN_A, RUN_B):
        _run(sb, ExistingClusterPoolCreateOperator, run_id, where, pools="cpu")
        _run(sb, ExistingClusterPoolCreateOperator, run_id, where)
    states = {RUN_A: "success", RUN_B: "running"}
    hook = GclusterHook()
    now = time.time()

    dry = sweep_run_pools(
        hook, "google_cloud_default", [sb.bucket], now, lambda _d, r: states[r], dry_run=True
    )
    assert sorted(dry["deleted"]) == sorted(f"{where}/tpu-rl-{a}-{k}" for k in ("tpu-0", "cpu"))
    assert len(_pools(sb)) == len(TEAM_POOLS) + 4  # a dry run deletes nothing

    swept = sweep_run_pools(hook, "google_cloud_default", [sb.bucket], now, lambda _d, r: states[r])
    assert swept["failed"] == []
    assert set(_pools(sb)) == set(TEAM_POOLS) | {f"tpu-rl-{b}-tpu-0", f"tpu-rl-{b}-cpu"}
    # past their expiry label, the running run's pools go too; the cluster and the team's stay
    later = now + 73 * 3600
    sweep_run_pools(hook, "google_cloud_default", [sb.bucket], later, lambda _d, r: states[r])
    assert _pools(sb) == TEAM_POOLS
    assert not any(c["argv"][:3] == ["container", "clusters", "delete"] for c in sb.calls())


def test_the_janitor_leaves_a_recorded_pool_it_cannot_prove_the_runs(sb: SandboxRun) -> None:
    where = _cluster(sb)
    suffix = run_suffix(GKE_DAG_ID, RUN_A)
    _run(sb, ExistingClusterPoolCreateOperator, RUN_A, where)
    name = f"tpu-rl-{suffix}-tpu-0"
    _run(sb, ExistingClusterPoolDeleteOperator, RUN_A, where)
    _squat(sb, name, "")  # the record stays; someone else's pool now has the name
    swept = sweep_run_pools(
        GclusterHook(), "google_cloud_default", [sb.bucket], time.time(), lambda _d, _r: "failed"
    )
    assert swept["left_alone"] == [f"{where}/{name}"]
    assert name in _pools(sb)


def test_the_pipelines_cluster_tasks_in_existing_mode_add_and_delete_only_the_runs_pools(
    sb: SandboxRun,
) -> None:
    """deploy_cluster, deploy_tpu_pool, destroy_tpu_pool and destroy_cluster with the pipeline's own
    arguments (an existing-mode conf): the run's CPU and TPU pools, nothing of the cluster's."""
    where = _cluster(sb)
    conf = sb.gke_conf(cluster_mode="existing", existing_cluster=where)

    def task(factory: Any, task_id: str) -> dict[str, Any]:
        operator = sb.operator(factory, conf=conf, run_id=RUN_A, task_id=task_id)
        result: dict[str, Any] = operator.execute(sb.context(operator, conf, run_id=RUN_A))
        return result

    cpu = task(ClusterModeDeployOperator, "deploy_cluster")
    # named after this DAG's run, as the run's jobs are (not the ad hoc DAG of the pool operator
    # the task builds): the training's node selector and the conversion's pool find them
    suffix = run_suffix(GKE_DAG_ID, RUN_A)
    assert cpu["run"] == suffix
    train = sb.operator(PathwaysRLTrainOperator, conf=conf, run_id=RUN_A, task_id="train")
    target = train.plan(sb.context(train, conf, run_id=RUN_A)).target
    assert dict(target.node_constraints)["tpu-rl-run"] == suffix
    assert target.head_node_pool == f"tpu-rl-{suffix}-cpu"
    assert cpu["pools"] == [f"tpu-rl-{suffix}-cpu"]
    assert task(ClusterModeDeployOperator, "deploy_tpu_pool")["pools"] == [f"tpu-rl-{suffix}-tpu-0"]
    assert set(_pools(sb)) == {*TEAM_POOLS, f"tpu-rl-{suffix}-cpu", f"tpu-rl-{suffix}-tpu-0"}
    tpu = task(ClusterModeDestroyOperator, "destroy_tpu_pool")
    assert tpu["deleted"] == [f"tpu-rl-{suffix}-tpu-0"]
    # the ledger's billed TPU time: the run's own pool's node VMs, noted at its create, ended by
    # their delete operations (the v6e-32 slice: 8 VMs of 4 chips)
    spans = tpu["billed"]["spans"]
    assert len(spans) == 8
    assert all(span["chips"] == 4 and span["ended_at"] for span in spans)
    assert all(span["machine"].startswith(f"gke-{sb.cluster}-tpu-rl-{suffix}-tpu-0-") for span in spans)
    assert task(ClusterModeDestroyOperator, "destroy_cluster")["deleted"] == [f"tpu-rl-{suffix}-cpu"]
    assert _pools(sb) == TEAM_POOLS
    record = sb.cluster_record()
    assert record is not None
    assert record.get("status") == "RUNNING"


def test_the_pipelines_jobs_in_existing_mode_go_to_the_runs_pools_and_queue(sb: SandboxRun) -> None:
    where = f"{sb.project}/{REGION}/{sb.cluster}"
    conf = sb.gke_conf(cluster_mode="existing", existing_cluster=where, kueue_queue="team-q")
    plans = {}
    for factory, task_id in (
        (MaxTextConvertOperator, "convert_to_maxtext"),
        (PathwaysRLTrainOperator, "train"),
        (MaxTextExportOperator, "export_to_huggingface"),
    ):
        operator = sb.operator(factory, conf=conf, run_id=RUN_A, task_id=task_id)
        plans[task_id] = operator.plan(sb.context(operator, conf, run_id=RUN_A))
    train = plans["train"].target
    suffix = dict(train.node_constraints)["tpu-rl-run"]
    assert (train.cluster_name, train.queue, train.head_node_pool) == (
        sb.cluster,
        "team-q",
        f"tpu-rl-{suffix}-cpu",
    )
    for task_id in ("convert_to_maxtext", "export_to_huggingface"):
        target = plans[task_id].target
        assert (target.cluster_name, target.node_pool, target.queue) == (
            sb.cluster,
            f"tpu-rl-{suffix}-cpu",
            "team-q",
        )
    # create mode: as before (the toolkit cluster's cpu-np, no queue, no run label)
    operator = sb.operator(PathwaysRLTrainOperator, run_id=RUN_A, task_id="train")
    created = operator.plan(sb.context(operator, sb.gke_conf(), run_id=RUN_A)).target
    assert (created.node_constraints, created.queue, created.head_node_pool) == ((), "", "")


# --- the ComputeClass route (capacity_route compute-class) --------------------------------------
ORDER = ["reservation", "flex-start", "spot"]


def _class_conf(sb: SandboxRun, where: str) -> dict[str, Any]:
    return sb.gke_conf(
        cluster_mode="existing", existing_cluster=where, capacity=ORDER, capacity_route="compute-class"
    )


def _task(
    sb: SandboxRun, conf: dict[str, Any], factory: Any, task_id: str, ti: RecordingTI | None = None
) -> Any:
    operator = sb.operator(factory, conf=conf, run_id=RUN_A, task_id=task_id)
    return operator.execute(sb.context(operator, conf, run_id=RUN_A, ti=ti))


def _world(sb: SandboxRun, out: dict[str, str], reservation_count: int) -> None:
    reservations = {key: dict(value) for key, value in DEFAULT_RESERVATIONS.items()}
    reservations[f"{ZONE}/res-1"]["count"] = reservation_count
    update_settings(sb.layout, reservations=reservations, tpu_capacity_out=out)


def _classes(sb: SandboxRun) -> dict[str, dict[str, Any]]:
    """The ComputeClasses of this test's cluster (the sandbox's state is the session's)."""
    cluster = next(k for k in sb.state("clusters") if k.endswith(f"/{sb.cluster}"))
    return {
        key.rsplit("/", 1)[-1]: value
        for key, value in sb.state(compute_classes.DOC).items()
        if key.rsplit("/", 1)[0] == cluster
    }


def _auto_created(sb: SandboxRun) -> tuple[list[str], list[str]]:
    """The node pools GKE auto-created in this test's cluster, and their node VMs (what would bill)."""
    record = sb.cluster_record()
    assert record is not None
    pools = [p["name"] for p in record["node_pools"] if p.get("compute_class")]
    vms = [
        v["name"]
        for v in sb.state("vms").values()
        if str((v.get("labels") or {}).get(POOL_LABEL, "")).startswith("nap-")
        and (v.get("labels") or {}).get(CLUSTER_LABEL) == sb.cluster
    ]
    return pools, vms


def test_the_compute_class_serves_spot_when_the_reservation_is_full_and_flex_start_out(
    sb: SandboxRun,
) -> None:
    """The issue's order through GKE's choice: the class's reservation and flex-start priorities
    refused (FailedScaleUp each), spot's node pool auto-created; the capacity XCom (the ledger's)
    names spot; the teardown deletes the class and the autoscaler the pool: nothing left."""
    where = _cluster(sb)
    conf = _class_conf(sb, where)
    suffix = run_suffix(GKE_DAG_ID, RUN_A)
    _world(sb, {f"{ZONE}/flex-start": "stockout"}, reservation_count=0)
    ti = RecordingTI()
    try:
        result = _task(sb, conf, ClusterModeDeployOperator, "deploy_tpu_pool", ti)
        assert result["compute_class"] == f"tpu-rl-{suffix}"
        served = ti.pulled("capacity")
        assert served["served"] == "spot"
        assert [a["capacity"] for a in served["attempts"]] == ["reservation", "flex-start"]
        assert served["attempts"][1]["error"] == (
            "FailedScaleUp: Node scale up in zones us-east5-b associated with this pod failed: GCE out "
            "of resources. Pod is at risk of not being scheduled."
        )
        klass = _classes(sb)[f"tpu-rl-{suffix}"]
        assert klass["metadata"]["labels"]["tpu-rl-run"] == suffix
        assert [p.get("spot", False) for p in klass["spec"]["priorities"]] == [False, False, True]
        assert not any(
            p["name"].startswith(f"tpu-rl-{suffix}-tpu") for p in sb.cluster_record()["node_pools"]
        )  # type: ignore[index]
        # the training selects the class, not a pool of the run's
        train = sb.operator(PathwaysRLTrainOperator, conf=conf, run_id=RUN_A, task_id="train")
        target = train.plan(sb.context(train, conf, run_id=RUN_A)).target
        assert dict(target.node_constraints) == {"cloud.google.com/compute-class": f"tpu-rl-{suffix}"}

        deleted = _task(sb, conf, ClusterModeDestroyOperator, "destroy_tpu_pool")
    finally:
        _world(sb, {}, reservation_count=DEFAULT_RESERVATIONS[f"{ZONE}/res-1"]["count"])
    assert deleted["deleted"] == [f"tpu-rl-{suffix}"]
    # the billed TPU time (the ledger's): the auto-created pool's node VMs, noted at the deploy
    assert result["node_pool"].startswith("nap-")
    spans = deleted["billed"]["spans"]
    assert spans
    assert all(span["chips"] == 4 for span in spans)
    assert all(f"-{result['node_pool']}-" in span["machine"] for span in spans), spans
    assert _classes(sb) == {}
    assert _auto_created(sb) == ([], [])
    assert set(_pools(sb)) == set(TEAM_POOLS)


def test_every_kind_out_fails_the_deploy_in_one_bounded_line_and_leaves_nothing(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = _cluster(sb)
    conf = _class_conf(sb, where)
    monkeypatch.setenv("AIRFLOW__TPU_RL__FLEX_START_PROBE_TIMEOUT_MINUTES", "0.02")
    _world(sb, {f"{ZONE}/flex-start": "stockout", f"{ZONE}/spot": "stockout"}, reservation_count=0)
    try:
        with pytest.raises(CommandError) as failed:
            _task(sb, conf, ClusterModeDeployOperator, "deploy_tpu_pool")
    finally:
        _world(sb, {}, reservation_count=DEFAULT_RESERVATIONS[f"{ZONE}/res-1"]["count"])
    line = str(failed.value)
    assert "\n" not in line
    assert failed.value.kind is FailureKind.CAPACITY
    assert "GKE got no node for any of reservation, flex-start, spot in us-east5-b within 0.02 min" in line
    assert "GCE out of resources" in line
    assert line.endswith("the class is deleted")
    assert _classes(sb) == {}
    assert _auto_created(sb) == ([], [])


def test_the_class_of_another_run_or_team_is_never_deleted(sb: SandboxRun) -> None:
    where = _cluster(sb)
    conf = _class_conf(sb, where)
    suffix = run_suffix(GKE_DAG_ID, RUN_A)
    key = next(k for k in sb.state("clusters") if k.endswith(f"/{sb.cluster}"))
    store = StateStore(sb.layout)
    team = {
        "apiVersion": "cloud.google.com/v1",
        "kind": "ComputeClass",
        "spec": {"priorities": [{"spot": True}]},
    }
    # another team's class, and one with the run's name its labels do not prove the run's
    create_compute_class(store, key, {**team, "metadata": {"name": "team-b-tpus"}})
    create_compute_class(
        store, key, {**team, "metadata": {"name": f"tpu-rl-{suffix}", "labels": {"tpu-rl-run": suffix}}}
    )
    with pytest.raises(
        AirflowFailException, match=f"has a ComputeClass tpu-rl-{suffix} that is not this run's"
    ):
        _task(sb, conf, ClusterModeDeployOperator, "deploy_tpu_pool")
    assert _task(sb, conf, ClusterModeDestroyOperator, "destroy_tpu_pool")["deleted"] == []
    assert set(_classes(sb)) == {"team-b-tpus", f"tpu-rl-{suffix}"}


def test_the_janitor_deletes_the_class_of_an_ended_run_and_no_other(sb: SandboxRun) -> None:
    """A run that crashed before its teardown: its ComputeClass goes once the run has ended (its
    record condemns it and its labels prove it); another team's class stays."""
    where = _cluster(sb)
    conf = _class_conf(sb, where)
    suffix = run_suffix(GKE_DAG_ID, RUN_A)
    _task(sb, conf, ClusterModeDeployOperator, "deploy_tpu_pool", RecordingTI())
    key = next(k for k in sb.state("clusters") if k.endswith(f"/{sb.cluster}"))
    create_compute_class(
        StateStore(sb.layout),
        key,
        {
            "apiVersion": "cloud.google.com/v1",
            "kind": "ComputeClass",
            "metadata": {"name": "team-b-tpus"},
            "spec": {"priorities": [{"spot": True}]},
        },
    )
    hook, now = GclusterHook(), time.time()
    running = sweep_run_pools(hook, "google_cloud_default", [sb.bucket], now, lambda _d, _r: "running")
    assert f"{where}/tpu-rl-{suffix}" not in running["deleted"]
    dry = sweep_run_pools(
        hook, "google_cloud_default", [sb.bucket], now, lambda _d, _r: "failed", dry_run=True
    )
    assert dry["deleted"] == [f"{where}/tpu-rl-{suffix}"]
    assert set(_classes(sb)) == {"team-b-tpus", f"tpu-rl-{suffix}"}
    swept = sweep_run_pools(hook, "google_cloud_default", [sb.bucket], now, lambda _d, _r: "failed")
    assert (swept["deleted"], swept["failed"]) == ([f"{where}/tpu-rl-{suffix}"], [])
    assert set(_classes(sb)) == {"team-b-tpus"}
    # gone already: the next pass leaves it (nothing to delete)
    again = sweep_run_pools(hook, "google_cloud_default", [sb.bucket], now, lambda _d, _r: "failed")
    assert again["left_alone"] == [f"{where}/tpu-rl-{suffix}"]
