"""A GKE cluster made outside the provider (sandbox world/existing_clusters.py): what gcloud, the GKE
API and its Kubernetes API say of it, with and without each prerequisite, and the node pools
``gcloud container node-pools`` adds to and takes from it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.sandbox.conftest import Cli
from tpu_rl_sandbox.apis import kube_access
from tpu_rl_sandbox.world.existing_clusters import make_existing_cluster
from tpu_rl_sandbox.world.store import StateStore


def _made(cli: Cli, names: dict[str, str], *missing: str) -> dict[str, Any]:
    return make_existing_cluster(
        StateStore(cli.layout),
        names["project"],
        names["region"],
        names["zone"],
        names["cluster"],
        missing=missing,
    )


def _scope(names: dict[str, str]) -> tuple[str, ...]:
    return (f"--cluster={names['cluster']}", f"--location={names['region']}", f"--project={names['project']}")


def _describe(cli: Cli, names: dict[str, str]) -> dict[str, Any]:
    result = cli.gcloud(
        "container",
        "clusters",
        "describe",
        names["cluster"],
        f"--location={names['region']}",
        f"--project={names['project']}",
        "--format=json",
    )
    assert result.code == 0, result.text
    described: dict[str, Any] = json.loads(result.out)
    return described


def test_describe_shows_what_the_platform_team_made(cli: Cli, names: dict[str, str]) -> None:
    _made(cli, names)
    described = _describe(cli, names)
    assert described["status"] == "RUNNING"
    assert described["workloadIdentityConfig"] == {"workloadPool": f"{names['project']}.svc.id.goog"}
    assert described["currentMasterVersion"] == "1.35.1-gke.1000"
    assert "autopilot" not in described
    assert [p["name"] for p in described["nodePools"]] == ["default-pool", "cpu-np", "team-b-v6e"]


@pytest.mark.parametrize(
    ("missing", "field", "value"),
    [
        ("running", "status", "RECONCILING"),
        ("version", "currentMasterVersion", "1.30.5-gke.1014000"),
        ("workload_identity", "workloadIdentityConfig", None),
        ("standard", "autopilot", {"enabled": True}),
    ],
)
def test_describe_shows_each_missing_prerequisite(
    cli: Cli, names: dict[str, str], missing: str, field: str, value: Any
) -> None:
    _made(cli, names, missing)
    assert _describe(cli, names).get(field) == value


def test_discovery_and_local_queues_follow_what_is_installed(cli: Cli, names: dict[str, str]) -> None:
    _made(cli, names, "kueue")
    access = kube_access.cluster_access(cli.layout, names["project"], names["region"], names["cluster"])
    groups = kube_access.request(access, "GET", "/apis").json()
    served = {v["groupVersion"] for g in groups["groups"] for v in g["versions"]}
    assert "jobset.x-k8s.io/v1alpha2" in served
    assert "kueue.x-k8s.io/v1beta1" not in served
    queues = kube_access.request(access, "GET", "/apis/kueue.x-k8s.io/v1beta1/namespaces/default/localqueues")
    assert queues.status == 404  # no CRD, no path


def test_local_queues_and_a_missing_jobset_api(cli: Cli, names: dict[str, str]) -> None:
    _made(cli, names, "jobset")
    access = kube_access.cluster_access(cli.layout, names["project"], names["region"], names["cluster"])
    queues = kube_access.request(access, "GET", "/apis/kueue.x-k8s.io/v1beta1/namespaces/default/localqueues")
    assert [q["metadata"]["name"] for q in queues.json()["items"]] == ["team-queue"]
    assert kube_access.request(access, "GET", "/apis/jobset.x-k8s.io/v1alpha2/jobsets").status == 404


def test_a_node_pool_is_created_listed_and_deleted_with_its_labels(cli: Cli, names: dict[str, str]) -> None:
    _made(cli, names)
    create = cli.gcloud(
        "container",
        "node-pools",
        "create",
        "tpu-rl-1a2b3c-tpu-0",
        *_scope(names),
        f"--node-locations={names['zone']}",
        "--machine-type=ct6e-standard-4t",
        "--tpu-topology=4x8",
        "--num-nodes=8",
        "--reservation-affinity=none",
        "--workload-metadata=GKE_METADATA",
        "--node-labels=tpu-rl-pool=tpu,tpu-rl-run=1a2b3c",
        "--labels=tpu-rl-managed=true,tpu-rl-run=1a2b3c",
    )
    assert create.code == 0, create.text
    assert "Created [https://container.googleapis.com/v1/projects/" in create.err
    again = cli.gcloud(
        "container",
        "node-pools",
        "create",
        "tpu-rl-1a2b3c-tpu-0",
        *_scope(names),
        "--machine-type=e2-standard-8",
        "--num-nodes=1",
    )
    assert again.code == 1
    assert "code=409" in again.err
    listed = json.loads(cli.gcloud("container", "node-pools", "list", *_scope(names), "--format=json").out)
    pool = next(p for p in listed if p["name"] == "tpu-rl-1a2b3c-tpu-0")
    assert pool["config"]["labels"] == {"tpu-rl-pool": "tpu", "tpu-rl-run": "1a2b3c"}
    assert pool["config"]["resourceLabels"] == {"tpu-rl-managed": "true", "tpu-rl-run": "1a2b3c"}
    assert pool["initialNodeCount"] == 8
    # the slice's node VMs exist, labelled with the pool's resource labels (the billed TPU time)
    nodes = [
        vm
        for vm in cli.state("vms").values()
        if (vm.get("labels") or {}).get("goog-k8s-node-pool-name") == "tpu-rl-1a2b3c-tpu-0"
    ]
    assert len(nodes) == 8
    assert all(vm["labels"]["tpu-rl-run"] == "1a2b3c" for vm in nodes)
    delete = cli.gcloud("container", "node-pools", "delete", "tpu-rl-1a2b3c-tpu-0", *_scope(names), "--quiet")
    assert delete.code == 0, delete.text
    gone = cli.gcloud("container", "node-pools", "delete", "tpu-rl-1a2b3c-tpu-0", *_scope(names), "--quiet")
    assert gone.code == 1
    assert "code=404" in gone.err
    left = [p["name"] for p in _describe(cli, names)["nodePools"]]
    assert left == ["default-pool", "cpu-np", "team-b-v6e"]
    # the other team's pool kept its slice's node VMs through it all
    team_nodes = [
        vm
        for vm in cli.state("vms").values()
        if (vm.get("labels") or {}).get("goog-k8s-node-pool-name") == "team-b-v6e"
        and vm["labels"].get("goog-k8s-cluster-name") == names["cluster"]
    ]
    assert len(team_nodes) == 2


def test_a_pool_is_refused_on_a_cluster_that_takes_none(cli: Cli, names: dict[str, str]) -> None:
    _made(cli, names, "standard")
    refused = cli.gcloud(
        "container",
        "node-pools",
        "create",
        "p1",
        *_scope(names),
        "--machine-type=e2-standard-8",
        "--num-nodes=1",
    )
    assert refused.code == 1
    assert "Autopilot" in refused.err


def test_a_tpu_pool_has_its_slices_vms(cli: Cli, names: dict[str, str]) -> None:
    _made(cli, names)
    wrong = cli.gcloud(
        "container",
        "node-pools",
        "create",
        "p1",
        *_scope(names),
        "--machine-type=ct6e-standard-4t",
        "--tpu-topology=4x8",
        "--num-nodes=4",
    )
    assert wrong.code == 1
    assert "does not match TPU topology 4x8" in wrong.err


# --- jobs on a cluster made outside the provider: its queues, per-pool scheduling ------------------
def _submit(names: dict[str, str], *extra: str) -> list[str]:
    return [
        "job",
        "submit",
        "--name=team-a-cpu",
        "--image=us-docker.pkg.dev/cloud-tpu-images/maxtext-images/tpu_post_training:0.2.4",
        "--compute-type=n4-standard-64",
        "--node-constraint=cloud.google.com/gke-nodepool=cpu-np",
        *extra,
        "--command=true",
        f"--project={names['project']}",
        f"--cluster={names['cluster']}",
        f"--location={names['region']}",
    ]


@pytest.mark.parametrize(
    ("queues", "extra", "said", "code"),
    [
        (["team-queue"], (), "Auto-discovered Kueue LocalQueue: team-queue", 0),
        (
            ["team-queue", "sweep-queue"],
            ("--queue=sweep-queue",),
            "Using provided Kueue LocalQueue: sweep-queue",
            0,
        ),
        # several and none named: gcluster warns, falls back to default-queue, which is not there
        (["team-queue", "sweep-queue"], (), "multiple LocalQueues found ([team-queue sweep-queue])", 1),
        # a queue that is not there: gcluster prompts to create queues; no answer ends it, nothing made
        (["team-queue"], ("--queue=other",), "LocalQueue 'other' does not exist", 1),
    ],
)
def test_gcluster_resolves_an_existing_clusters_queue_as_gcluster_does(
    cli: Cli, names: dict[str, str], queues: list[str], extra: tuple[str, ...], said: str, code: int
) -> None:
    _made(cli, names)
    store = StateStore(cli.layout)
    with store.txn() as txn:
        clusters = txn.doc("clusters")
        next(c for c in clusters.values() if c.get("name") == names["cluster"])["local_queues"] = queues
        txn.save("clusters")
    # a submission that passes only writes its manifest (no job started); one that fails gets as far
    # as the queue's check, past the Docker credentials
    done = cli.gcloud("auth", "configure-docker", f"gcr.io,{names['region']}-docker.pkg.dev", "--quiet")
    assert done.code == 0, done.text
    result = cli.gcluster(*_submit(names, *extra, *(("--dry-run-out=/dev/null",) if code == 0 else ())))
    assert result.code == code, result.text
    assert said in result.text


def test_a_tpu_job_runs_on_the_pool_its_node_selector_names_one_job_per_pool() -> None:
    from tpu_rl_sandbox.machines.job_worker import existing_cluster_tpu_fits, matching_tpu_pool

    def pool(name: str, run: str) -> dict[str, Any]:
        return {"name": name, "topology": "2x2", "node_labels": {"tpu-rl-run": run} if run else {"team": "b"}}

    cluster = {
        "made_outside": True,
        "node_pools": [pool("team-b-v6e", ""), pool("tpu-rl-aaaaaa-tpu-0", "aaaaaa")],
    }

    def job(uid: str, run: str, status: str, created: float) -> dict[str, Any]:
        return {
            "uid": uid,
            "cluster_key": "k",
            "tpu": True,
            "topology": "2x2",
            "node_constraint": {"tpu-rl-run": run},
            "status": status,
            "created_ts": created,
        }

    a = job("a", "aaaaaa", "Suspended", 1.0)
    assert matching_tpu_pool(cluster, a)["name"] == "tpu-rl-aaaaaa-tpu-0"  # type: ignore[index]
    assert existing_cluster_tpu_fits(a, {"a": a}, cluster)
    # another run's job on the same cluster whose pool does not exist (yet): Pending, not on team b's
    b = job("b", "bbbbbb", "Suspended", 2.0)
    assert matching_tpu_pool(cluster, b) is None
    assert not existing_cluster_tpu_fits(b, {"a": a, "b": b}, cluster)
    # a second job of run a waits while the first runs on its pool
    again = job("a2", "aaaaaa", "Suspended", 3.0)
    running = {**a, "status": "Running"}
    assert not existing_cluster_tpu_fits(again, {"a": running, "a2": again}, cluster)


def test_the_other_teams_job_runs_on_its_pool_through_the_kubernetes_api(
    cli: Cli, names: dict[str, str]
) -> None:
    _made(cli, names)
    job = cli.job(names["project"], names["region"], names["cluster"], "team-b-train")
    assert job is not None
    assert job["status"] == "Running"
    assert not job["suspended"]
    assert {p["phase"] for p in job["pods"]} == {"Running"}
    assert len(job["pods"]) == 2
    access = kube_access.cluster_access(cli.layout, names["project"], names["region"], names["cluster"])
    listed = kube_access.request(
        access, "GET", "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets"
    ).json()
    (item,) = listed["items"]
    assert item["metadata"]["name"] == "team-b-train"
    (status,) = item["status"]["replicatedJobsStatus"]
    assert status["ready"] == 1
    assert status["active"] == 1
    # it is on team b's pool and holds it: a job of a run is never scheduled there
    from tpu_rl_sandbox.machines.job_worker import matching_tpu_pool

    cluster = next(c for c in cli.state("clusters").values() if c.get("name") == names["cluster"])
    assert matching_tpu_pool(cluster, job)["name"] == "team-b-v6e"  # type: ignore[index]


def test_no_other_teams_job_without_the_jobset_api(cli: Cli, names: dict[str, str]) -> None:
    _made(cli, names, "jobset")
    assert cli.job(names["project"], names["region"], names["cluster"], "team-b-train") is None


def test_a_tpu_pod_is_its_pools_node_account_and_writes_with_that_accounts_grants(
    cli: Cli, names: dict[str, str]
) -> None:
    from tpu_rl_sandbox.world import iam
    from tpu_rl_sandbox.world.inventory import project_number

    cluster = _made(cli, names)
    # the pool's account: here the Compute Engine default one (`node-pools create` without --service-account)
    own = f"{project_number(names['project'])}-compute@developer.gserviceaccount.com"
    job = {"tpu": True}
    # the pool's config.serviceAccount, not the cluster's (this one has none of a toolkit cluster's)
    assert iam.pod_identity(cluster, job, {"name": "p", "service_account": own}) == (own, None)
    toolkit = {**cluster, "service_accounts": {"node_pool": "np@p.iam.gserviceaccount.com"}}
    assert iam.pod_identity(toolkit, job, None) == ("np@p.iam.gserviceaccount.com", "node_pool")
    assert iam.pod_identity(toolkit, job, {"service_account": "np@p.iam.gserviceaccount.com"}) == (
        "np@p.iam.gserviceaccount.com",
        "node_pool",
    )
    store = StateStore(cli.layout)
    principal, account = iam.pod_identity(cluster, {"tpu": False})
    assert principal.startswith("principal://")
    assert principal.endswith("/subject/ns/default/sa/default")
    assert account is None
    assert not iam.identity_can_write(store, cluster, None, own, names["bucket"])
    assert not iam.identity_can_write(store, cluster, None, principal, names["bucket"])
    made = cli.gcloud(
        "storage", "buckets", "create", f"gs://{names['bucket']}", f"--project={names['project']}"
    )
    assert made.code == 0, made.text
    for member in (f"serviceAccount:{own}", principal):
        granted = cli.gcloud(
            "storage",
            "buckets",
            "add-iam-policy-binding",
            f"gs://{names['bucket']}",
            f"--member={member}",
            "--role=roles/storage.objectAdmin",
        )
        assert granted.code == 0, granted.text
    assert iam.identity_can_write(store, cluster, None, own, names["bucket"])
    assert iam.identity_can_write(store, cluster, None, principal, names["bucket"])
    assert not iam.identity_can_write(store, cluster, None, own, "another-bucket")


def test_a_cpu_job_on_an_existing_cluster_waits_for_a_pool_its_node_selector_names() -> None:
    from tpu_rl_sandbox.machines.job_worker import has_matching_nodes

    cluster = {"made_outside": True, "node_pools": [{"name": "cpu-np"}, {"name": "tpu-rl-aaaaaa-cpu"}]}
    pinned = {"node_constraint": {"cloud.google.com/gke-nodepool": "tpu-rl-aaaaaa-cpu"}}
    assert has_matching_nodes(cluster, pinned)
    # another run's CPU pool, not (or no longer) there: its pods stay Pending
    assert not has_matching_nodes(
        cluster, {"node_constraint": {"cloud.google.com/gke-nodepool": "tpu-rl-bbbbbb-cpu"}}
    )
    assert has_matching_nodes(cluster, {"node_constraint": {}})


def test_a_tpu_pools_nodes_run_after_provisioning_and_its_create_waits_for_them_ready(
    cli: Cli, names: dict[str, str]
) -> None:
    """On the time scale a run's TPU pool bills as a toolkit pool does: its node VMs RUNNING after
    GKE's work and their provisioning, the create done once they are Ready; the delete stops them."""
    from datetime import datetime

    from tpu_rl_sandbox.world.settings import update_settings

    scale = 0.4  # sandbox seconds per estimated minute
    minutes = {"tpu_pool_create": 1.0, "vm_provisioning": 1.0, "vm_staging": 0.0, "tpu_node_ready": 2.0}
    update_settings(cli.layout, minute_seconds=scale, capacity_minutes={**minutes, "vm_stopping": 1.0})
    try:
        _made(cli, names)
        began = datetime.now().astimezone()
        create = cli.gcloud(
            "container", "node-pools", "create", "tpu-rl-4d5e6f-tpu-0", *_scope(names),
            f"--node-locations={names['zone']}", "--machine-type=ct6e-standard-4t", "--tpu-topology=2x4",
            "--num-nodes=2",
        )  # fmt: skip
        done = datetime.now().astimezone()
        assert create.code == 0, create.text
        nodes = [
            vm
            for vm in cli.state("vms").values()
            if (vm.get("labels") or {}).get("goog-k8s-node-pool-name") == "tpu-rl-4d5e6f-tpu-0"
        ]
        assert len(nodes) == 2  # one record each, not one per look
        for node in nodes:
            started = datetime.fromisoformat(node["lastStartTimestamp"])
            assert (started - began).total_seconds() >= 2 * scale - 0.05  # GKE's minute, provisioning's
            assert (done - started).total_seconds() >= 2 * scale - 0.05  # the nodes' boot to Ready
        delete = cli.gcloud(
            "container", "node-pools", "delete", "tpu-rl-4d5e6f-tpu-0", *_scope(names), "--quiet"
        )
        assert delete.code == 0, delete.text
        assert not [v for v in cli.state("vms").values() if v["name"] in {n["name"] for n in nodes}]
    finally:
        update_settings(cli.layout, minute_seconds=0.0, capacity_minutes={})
