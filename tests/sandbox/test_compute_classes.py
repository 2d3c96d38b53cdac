"""GKE's ComputeClass in the sandbox (world/compute_classes.py, apis/kube_api.py): the CRD's
schema refusals, its create/get/delete through the fake Kubernetes API as the real server answers
them, and the kind each priority asks for."""

from __future__ import annotations

from typing import Any

import pytest

from tests.sandbox.conftest import Cli, Cluster
from tpu_rl_sandbox.apis import kube_access
from tpu_rl_sandbox.world import compute_classes
from tpu_rl_sandbox.world.store import StateStore

CLASSES = "/apis/cloud.google.com/v1/computeclasses"
TPU = {"type": "tpu-v6e-slice", "count": 4, "topology": "2x2"}


def _class(name: str = "tpu-rl-1a2b3c", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "cloud.google.com/v1",
        "kind": "ComputeClass",
        "metadata": {"name": name},
        "spec": {"priorities": [{"tpu": TPU, "spot": True}], **spec},
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (_class(priorities=[]), "spec.priorities"),
        (_class(whenUnsatisfiable="Never"), "spec.whenUnsatisfiable"),
        (_class(priorities=[{"tpu": {"type": "tpu-v6e-slice"}}]), "spec.priorities[0].tpu"),
        (
            _class(priorities=[{"tpu": TPU, "reservations": {"affinity": "Specific"}}]),
            "spec.priorities[0].reservations.specific",
        ),
        (
            _class(priorities=[{"tpu": TPU, "reservations": {"affinity": "Some"}}]),
            "spec.priorities[0].reservations.affinity",
        ),
        (_class(name="Not_A_Name"), "metadata.name"),
        ({**_class(), "kind": "Pod"}, "apiVersion"),
    ],
)
def test_the_crd_schema_refuses_a_wrong_class(body: dict[str, Any], field: str) -> None:
    assert [f for f, _ in compute_classes.problems(body)] == [field]
    assert compute_classes.problems(_class()) == []


@pytest.mark.parametrize(
    ("priority", "kind"),
    [
        ({"tpu": TPU, "spot": True}, "spot"),
        ({"tpu": TPU, "flexStart": {"enabled": True}}, "flex-start"),
        ({"tpu": TPU, "reservations": {"affinity": "Specific", "specific": [{"name": "r"}]}}, "reservation"),
        ({"tpu": TPU, "reservations": {"affinity": "None"}}, "on-demand"),
        ({"tpu": TPU}, "on-demand"),
    ],
)
def test_each_priority_asks_for_its_kind(priority: dict[str, Any], kind: str) -> None:
    assert compute_classes.priority_kind(priority) == kind


def test_a_class_is_created_read_and_deleted_through_the_api(cli: Cli, cluster: Cluster) -> None:
    access = kube_access.cluster_access(cli.layout, cluster.project, cluster.region, cluster.name)
    created = kube_access.request(access, "POST", CLASSES, _class())
    assert created.status == 201
    assert created.json()["metadata"]["uid"]
    again = kube_access.request(access, "POST", CLASSES, _class())
    assert (again.status, again.json()["reason"]) == (409, "AlreadyExists")
    assert again.json()["message"] == 'computeclasses.cloud.google.com "tpu-rl-1a2b3c" already exists'
    invalid = kube_access.request(access, "POST", CLASSES, _class(name="other", priorities=[]))
    assert (invalid.status, invalid.json()["reason"]) == (422, "Invalid")
    assert kube_access.request(access, "GET", f"{CLASSES}/tpu-rl-1a2b3c").json()["spec"] == _class()["spec"]
    deleted = kube_access.request(access, "DELETE", f"{CLASSES}/tpu-rl-1a2b3c")
    assert (deleted.status, deleted.json()["status"]) == (200, "Success")
    gone = kube_access.request(access, "GET", f"{CLASSES}/tpu-rl-1a2b3c")
    assert (gone.status, gone.json()["message"]) == (
        404,
        'computeclasses.cloud.google.com "tpu-rl-1a2b3c" not found',
    )
    assert kube_access.request(access, "DELETE", f"{CLASSES}/tpu-rl-1a2b3c").status == 404

    # a cluster older than 1.30.3-gke.1451000 serves no ComputeClass: no such path
    store = StateStore(cli.layout)
    with store.txn() as txn:
        key = next(k for k, v in txn.doc("clusters").items() if v.get("name") == cluster.name)
        txn.doc("clusters")[key]["gke_version"] = "1.30.2-gke.1000"
        txn.save("clusters")
    old = kube_access.request(access, "POST", CLASSES, _class())
    assert old.status == 404


def test_gke_auto_creates_a_pool_for_the_first_priority_it_can_get_and_removes_it_unused(cli: Cli) -> None:
    """Spot out of stock, the reservation missing: on-demand's pool is made, its nodes labelled with
    the class; each refused priority one FailedScaleUp; unused, the autoscaler removes the pool and
    its node VMs (the time scale off: at once)."""
    from tpu_rl_sandbox.world.existing_clusters import make_existing_cluster
    from tpu_rl_sandbox.world.gke_nodes import POOL_LABEL
    from tpu_rl_sandbox.world.settings import load_settings, update_settings

    store = StateStore(cli.layout)
    make_existing_cluster(store, "cc-project", "us-east5", "us-east5-b", "cc-shared")
    key = next(k for k, v in store.read("clusters").items() if v.get("name") == "cc-shared")
    update_settings(cli.layout, tpu_capacity_out={"us-east5-b/spot": "stockout"})
    try:
        klass = _class(
            nodePoolAutoCreation={"enabled": True},
            priorityDefaults={"location": {"zones": ["us-east5-b"]}},
            priorities=[
                {"tpu": TPU, "spot": True},
                {"tpu": TPU, "reservations": {"affinity": "Specific", "specific": [{"name": "absent"}]}},
                {"tpu": TPU, "reservations": {"affinity": "None"}},
            ],
        )
        with store.txn() as txn:
            cluster = txn.doc("clusters")[key]
            pool, events = compute_classes.scale_up(txn, key, cluster, klass, load_settings(cli.layout), 0.0)
        assert pool is not None
        assert pool["name"].startswith("nap-ct6e-standard-4t-")
        assert pool["node_labels"] == {"cloud.google.com/compute-class": "tpu-rl-1a2b3c"}  # on-demand
        assert [reason for reason, _ in events] == ["FailedScaleUp", "FailedScaleUp", "TriggeredScaleUp"]
        assert "GCE out of resources" in events[0][1]
        nodes = [
            v for v in store.read("vms").values() if (v.get("labels") or {}).get(POOL_LABEL) == pool["name"]
        ]
        assert len(nodes) == 1  # a 2x2 slice of 4-chip nodes
        # without nodePoolAutoCreation GKE makes nothing
        with store.txn() as txn:
            cluster = txn.doc("clusters")[key]
            none, _ = compute_classes.scale_up(txn, key, cluster, _class(), load_settings(cli.layout), 0.0)
        assert none is None

        assert compute_classes.scale_down(store, key, load_settings(cli.layout)) == [pool["name"]]
        assert not any(p.get("compute_class") for p in store.read("clusters")[key]["node_pools"])
        assert not any(
            (v.get("labels") or {}).get(POOL_LABEL) == pool["name"] for v in store.read("vms").values()
        )
    finally:
        update_settings(cli.layout, tpu_capacity_out={})
        with store.txn() as txn:  # the sandbox is the session's: the cluster goes
            txn.doc("clusters").pop(key, None)
            txn.save("clusters")


def test_a_tpu_job_selecting_the_class_gets_its_pool_and_then_fits(cli: Cli) -> None:
    from tpu_rl_sandbox.machines.job_worker import (
        existing_cluster_tpu_fits,
        matching_tpu_pool,
        scale_up_for_compute_class,
    )
    from tpu_rl_sandbox.world.existing_clusters import make_existing_cluster
    from tpu_rl_sandbox.world.settings import load_settings

    store = StateStore(cli.layout)
    make_existing_cluster(store, "cc-project", "us-east5", "us-east5-b", "cc-jobs")
    key = next(k for k, v in store.read("clusters").items() if v.get("name") == "cc-jobs")
    job = {
        "uid": "j",
        "cluster_key": key,
        "tpu": True,
        "topology": "2x2",
        "node_constraint": {"cloud.google.com/compute-class": "tpu-rl-1a2b3c"},
        "status": "Suspended",
        "created_ts": 1.0,
    }
    try:
        with store.txn() as txn:
            cluster = txn.doc("clusters")[key]
            # no class of that name: nothing is made, the job stays pending
            assert scale_up_for_compute_class(txn, job, cluster, load_settings(cli.layout)) is None
            txn.doc(compute_classes.DOC)[f"{key}/tpu-rl-1a2b3c"] = _class(
                nodePoolAutoCreation={"enabled": True}
            )
            pool = scale_up_for_compute_class(txn, job, cluster, load_settings(cli.layout))
            assert pool is not None
            assert pool["node_labels"]["cloud.google.com/gke-spot"] == "true"
            assert matching_tpu_pool(cluster, job) == pool
            assert existing_cluster_tpu_fits(job, {"j": job}, cluster)
            # a pool there already: nothing more
            assert scale_up_for_compute_class(txn, job, cluster, load_settings(cli.layout)) is None
    finally:
        with store.txn() as txn:
            txn.doc("clusters").pop(key, None)
            txn.doc(compute_classes.DOC).pop(f"{key}/tpu-rl-1a2b3c", None)
            txn.save("clusters")
            txn.save(compute_classes.DOC)
