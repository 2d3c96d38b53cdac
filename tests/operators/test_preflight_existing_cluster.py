"""``preflight`` of a run on a GKE cluster it does not own, against the sandbox's cluster made
outside the provider: each prerequisite it lacks is refused in one line naming it and how to add
it, and no node pool (nothing at all) is created; a complete cluster passes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.operators.preflight import TpuRlPreflightOperator
from tests.support.sandbox_run import REGION, ZONE, SandboxRun, api_server
from tpu_rl_sandbox.world.existing_clusters import make_existing_cluster
from tpu_rl_sandbox.world.settings import reset_settings, update_settings
from tpu_rl_sandbox.world.store import StateStore

READS = (
    ("auth", "list"),
    ("services", "list"),
    ("compute", "regions", "describe"),
    ("container", "clusters", "describe"),
    ("version",),
)
POOLS = ["default-pool", "cpu-np", "team-b-v6e"]


@pytest.fixture
def pf(sb: SandboxRun, monkeypatch: pytest.MonkeyPatch) -> Iterator[SandboxRun]:
    reset_settings(sb.layout)
    try:
        with api_server(sb.layout) as url:
            monkeypatch.setenv("AIRFLOW__TPU_RL__RESOURCE_MANAGER_ENDPOINT", url)
            yield sb
    finally:
        reset_settings(sb.layout)


def _team_cluster(sb: SandboxRun, *missing: str) -> str:
    """A cluster the platform team made (named after the test's cluster), less ``missing``."""
    make_existing_cluster(StateStore(sb.layout), sb.project, REGION, ZONE, sb.cluster, missing=missing)
    return f"{sb.project}/{REGION}/{sb.cluster}"


def _run(sb: SandboxRun, where: str, **arguments: Any) -> dict[str, Any]:
    # the pipeline's own arguments: the run's conf in existing mode (validate's resolved values)
    existing = {
        key: arguments.pop(key)
        for key in ("kueue_queue", "cpu_node_pool", "capacity_route")
        if key in arguments
    }
    conf = sb.gke_conf(
        reservation="",
        capacity=arguments.pop("capacity", "on-demand"),
        cluster_mode="existing",
        existing_cluster=where,
        **existing,
    )
    operator = sb.operator(TpuRlPreflightOperator, conf=conf, task_id="preflight", **arguments)
    result: dict[str, Any] = operator.execute(sb.context(operator, conf))
    return result


def _refused(sb: SandboxRun, where: str, **arguments: Any) -> str:
    """The one line the preflight refuses with (it must be exactly one)."""
    with pytest.raises(AirflowFailException) as failed:
        _run(sb, where, **arguments)
    lines = str(failed.value).splitlines()
    assert lines[0] == "preflight: 1 problem before anything is created:", lines
    return lines[1][2:]


def _nothing_created(sb: SandboxRun) -> None:
    """Only reads ran; the cluster keeps exactly the pools it had, and no bucket exists."""
    for call in sb.calls():
        assert call["tool"] == "gcloud", call
        assert any(call["argv"][: len(read)] == list(read) for read in READS), call["argv"]
    record = sb.cluster_record()
    assert record is not None
    assert [p["name"] for p in record["node_pools"]] == [
        p for p in POOLS if p in {q["name"] for q in record["node_pools"]}
    ]
    assert not sb.bucket_exists()


def test_a_cluster_with_everything_passes_and_nothing_is_created(pf: SandboxRun) -> None:
    where = _team_cluster(pf)
    result = _run(pf, where, cpu_node_pool="cpu-np")
    assert result["existing_cluster"] == where
    _nothing_created(pf)
    assert [p["name"] for p in pf.cluster_record()["node_pools"]] == POOLS  # type: ignore[index]


@pytest.mark.parametrize(
    ("missing", "arguments", "says"),
    [
        ("running", {}, "is RECONCILING, not RUNNING"),
        ("version", {}, "older than 1.31.2-gke.1115000, the first with TPU v6e"),
        ("workload_identity", {}, "Workload Identity off"),
        ("standard", {}, "is an Autopilot cluster"),
        ("jobset", {}, "serves no jobset.x-k8s.io/v1alpha2 API: install the JobSet controller"),
        ("kueue", {}, "serves no kueue.x-k8s.io/v1beta1 API: install Kueue"),
        ("local_queue", {}, "has no Kueue LocalQueue in namespace default"),
        ("cpu_pool", {"cpu_node_pool": "cpu-np"}, "has no node pool cpu-np for the conversions"),
    ],
)
def test_each_missing_prerequisite_is_refused_in_one_line_before_any_pool(
    pf: SandboxRun, missing: str, arguments: dict[str, Any], says: str
) -> None:
    where = _team_cluster(pf, missing)
    line = _refused(pf, where, **arguments)
    assert says in line
    assert where in line
    _nothing_created(pf)


def test_a_gke_too_old_for_flex_start_is_refused_for_flex_start_only(pf: SandboxRun) -> None:
    where = _team_cluster(pf)
    with StateStore(pf.layout).txn() as txn:  # runs v6e, not flex-start TPU pools
        txn.doc("clusters")[f"{pf.project}/{REGION}/{pf.cluster}"]["gke_version"] = "1.32.4-gke.1106006"
        txn.save("clusters")
    _run(pf, where)
    assert "the first with flex-start" in _refused(pf, where, capacity="flex-start")


def test_a_named_queue_the_cluster_lacks_is_refused(pf: SandboxRun) -> None:
    where = _team_cluster(pf)
    assert "no LocalQueue mine in namespace default (it has: team-queue)" in _refused(
        pf, where, kueue_queue="mine"
    )


def test_a_cluster_that_does_not_exist_is_refused(pf: SandboxRun) -> None:
    line = _refused(pf, f"{pf.project}/{REGION}/{pf.cluster}")
    assert "does not exist" in line


def test_an_identity_that_cannot_manage_node_pools_is_refused(pf: SandboxRun) -> None:
    where = _team_cluster(pf)
    update_settings(pf.layout, denied_permissions=("container.clusters.update",))
    line = _refused(pf, where)
    assert "container.clusters.update" in line
    assert "roles/container.clusterAdmin" in line
    _nothing_created(pf)


def _set(pf: SandboxRun, **fields: Any) -> None:
    with StateStore(pf.layout).txn() as txn:
        txn.doc("clusters")[f"{pf.project}/{REGION}/{pf.cluster}"].update(fields)
        txn.save("clusters")


ORDER = ["spot", "flex-start", "on-demand"]


def test_the_compute_class_route_takes_the_ordered_capacity_and_checks_what_the_class_needs(
    pf: SandboxRun,
) -> None:
    where = _team_cluster(pf)
    # the compute-class route takes the order (the pools route one kind: the spec's refusal)
    assert _run(pf, where, capacity=ORDER, capacity_route="compute-class")["existing_cluster"] == where
    _nothing_created(pf)
    # a GKE whose ComputeClasses cannot create node pools (but runs v6e and flex-start TPUs)
    _set(pf, gke_version="1.33.2-gke.1240000")
    assert (
        "older than 1.33.3-gke.1136000, the first whose ComputeClass creates its own node pools"
        in _refused(pf, where, capacity=ORDER, capacity_route="compute-class")
    )
    _run(pf, where, capacity="spot")  # the pools route does not need it
    # node auto-provisioning whose limits leave TPU v6e out
    _set(
        pf,
        gke_version="1.35.1-gke.1000",
        autoscaling={
            "enableNodeAutoprovisioning": True,
            "resourceLimits": [{"resourceType": "cpu", "maximum": "100"}],
        },
    )
    assert "node auto-provisioning on with no tpu-v6e-slice resource limit" in _refused(
        pf, where, capacity=ORDER, capacity_route="compute-class"
    )
    _nothing_created(pf)
