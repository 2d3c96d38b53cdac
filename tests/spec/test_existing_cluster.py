"""A cluster the run does not own (spec/existing_cluster.py): its name, the run's own pools, and
each prerequisite refused in one line naming what is missing and how to add it."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_tpu_rl.spec.cluster import FLEX_START, ON_DEMAND, GkeJobTarget, SliceShape
from airflow_provider_tpu_rl.spec.errors import SpecError
from airflow_provider_tpu_rl.spec.existing_cluster import (
    EXISTING_CLUSTER_PERMISSIONS,
    JOBSET_GROUP_VERSION,
    KUEUE_GROUP_VERSION,
    ClusterNeeds,
    ExistingCluster,
    RunPools,
    cluster_mode,
    cluster_problems,
    compute_class_is_runs,
    compute_class_name,
    gke_version,
    job_target_on,
    kubernetes_problems,
    parse_existing_cluster,
    pool_is_runs,
    runs_pools,
    served_group_versions,
    served_kind,
)

CLUSTER = parse_existing_cluster("my-proj-123/us-east5/team-tpu-cluster-with-a-long-name")
NEEDS = ClusterNeeds(CLUSTER, ON_DEMAND)
SERVED = {JOBSET_GROUP_VERSION, KUEUE_GROUP_VERSION}


def _cluster(**changes: Any) -> dict[str, Any]:
    described: dict[str, Any] = {
        "name": CLUSTER.name,
        "status": "RUNNING",
        "currentMasterVersion": "1.33.2-gke.1240000",
        "workloadIdentityConfig": {"workloadPool": "my-proj-123.svc.id.goog"},
        "nodePools": [
            {"name": "default-pool", "config": {"machineType": "e2-standard-8"}},
            {"name": "cpu-np", "config": {"machineType": "n4-standard-64"}},
            {"name": "team-b-v6e", "config": {"machineType": "ct6e-standard-4t"}},
        ],
    }
    described.update(changes)
    return described


def test_an_existing_cluster_is_project_location_name() -> None:
    assert CLUSTER.where == "my-proj-123/us-east5/team-tpu-cluster-with-a-long-name"
    zonal = parse_existing_cluster("my-proj-123/us-east5-b/c1")
    assert (zonal.location, zonal.region) == ("us-east5-b", "us-east5")
    assert cluster_mode("existing") == "existing"


@pytest.mark.parametrize(
    "text",
    [
        "team-tpu",
        "my-proj-123/us-east5",
        "my-proj-123/Mars/c1",
        "my-proj-123/us-east5/Team",
        "p/us-east5/c1",
        "my-proj-123/us-east5/" + "c" * 41,
    ],
)
def test_a_bad_existing_cluster_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_existing_cluster(text)
    assert "\n" not in str(err.value)
    assert "existing_cluster" in str(err.value)


def test_cluster_mode_is_create_or_existing() -> None:
    with pytest.raises(SpecError, match="cluster_mode"):
        cluster_mode("borrow")


def test_a_runs_pools_are_named_after_the_run_and_only_those_are_its_own() -> None:
    pools = RunPools(CLUSTER, "1a2b3c", "us-east5-b", SliceShape("ct6e-standard-4t", "4x8"), num_slices=2)
    assert pools.tpu_pools == ("tpu-rl-1a2b3c-tpu-0", "tpu-rl-1a2b3c-tpu-1")
    assert pools.owned == ("tpu-rl-1a2b3c-tpu-0", "tpu-rl-1a2b3c-tpu-1", "tpu-rl-1a2b3c-cpu")
    shared = RunPools(
        CLUSTER, "1a2b3c", "us-east5-b", SliceShape("ct6e-standard-4t", "4x8"), cpu_pool="cpu-np"
    )
    assert (shared.owned, shared.conversion_pool) == (("tpu-rl-1a2b3c-tpu-0",), "cpu-np")
    with pytest.raises(SpecError, match="zone"):
        RunPools(CLUSTER, "1a2b3c", "us-central1-a", SliceShape("ct6e-standard-4t", "4x8"))


def _pool(name: str, run: str, node_run: str | None = None, managed: str = "true") -> dict[str, Any]:
    return {
        "name": name,
        "config": {
            "resourceLabels": {"tpu-rl-run": run, "tpu-rl-managed": managed},
            "labels": {"tpu-rl-run": run if node_run is None else node_run},
        },
    }


def test_a_pool_is_the_runs_only_by_its_name_and_both_its_labels() -> None:
    pools = [
        _pool("tpu-rl-1a2b3c-tpu-0", "1a2b3c"),
        _pool("tpu-rl-1a2b3c-cpu", "1a2b3c"),
        _pool("tpu-rl-9f9f9f-tpu-0", "9f9f9f"),  # another run's
        _pool("team-b-v6e", "1a2b3c"),  # another team's pool, labels copied: not a name of the run's
        _pool("tpu-rl-1a2b3c-tpu-1", "1a2b3c", node_run="9f9f9f"),  # node labels disagree
        _pool("tpu-rl-1a2b3c-tpu-2", "1a2b3c", managed="false"),
        {"name": "tpu-rl-1a2b3c-tpu-3", "config": {}},  # no labels at all
    ]
    assert runs_pools(pools, "1a2b3c") == ["tpu-rl-1a2b3c-tpu-0", "tpu-rl-1a2b3c-cpu"]
    assert not pool_is_runs(pools[0], "9f9f9f")


def test_with_the_runs_bucket_a_pool_is_the_runs_only_if_its_bucket_label_names_it() -> None:
    pool = _pool("tpu-rl-1a2b3c-tpu-0", "1a2b3c")
    pool["config"]["resourceLabels"]["tpu-rl-bucket"] = "team-a-runs"
    assert pool_is_runs(pool, "1a2b3c", "team-a-runs")
    # another Airflow deployment's run: same DAG and run ids (so the same suffix), another bucket
    assert not pool_is_runs(pool, "1a2b3c", "team-b-runs")
    # a dotted bucket cannot be a label value: its runs' pools carry no bucket label
    assert not pool_is_runs(pool, "1a2b3c", "runs.example.com")
    del pool["config"]["resourceLabels"]["tpu-rl-bucket"]
    assert pool_is_runs(pool, "1a2b3c", "runs.example.com")
    assert not pool_is_runs(pool, "1a2b3c", "team-a-runs")


def test_gke_versions_compare_by_their_numbers() -> None:
    assert gke_version("1.31.2-gke.1115000") == (1, 31, 2, 1115000)
    assert gke_version("1.33.10-gke.200") > gke_version("1.33.2-gke.1240000")  # type: ignore[operator]
    assert gke_version("latest") is None


def test_a_cluster_with_everything_is_accepted() -> None:
    assert cluster_problems(NEEDS, _cluster()) == []
    assert cluster_problems(ClusterNeeds(CLUSTER, FLEX_START, cpu_pool="cpu-np"), _cluster()) == []


@pytest.mark.parametrize(
    ("needs", "described", "says"),
    [
        (NEEDS, None, "does not exist"),
        (NEEDS, _cluster(status="RECONCILING"), "is RECONCILING, not RUNNING"),
        (NEEDS, _cluster(autopilot={"enabled": True}), "Autopilot"),
        (
            NEEDS,
            _cluster(currentMasterVersion="1.30.5-gke.100"),
            "older than 1.31.2-gke.1115000, the first with TPU v6e",
        ),
        (
            ClusterNeeds(CLUSTER, FLEX_START),
            _cluster(currentMasterVersion="1.32.4-gke.1000"),
            "older than 1.33.0-gke.1712000, the first with flex-start",
        ),
        (NEEDS, _cluster(workloadIdentityConfig=None), "Workload Identity off"),
        (
            NEEDS,
            _cluster(workloadIdentityConfig={"workloadPool": "other-proj.svc.id.goog"}),
            "--workload-pool=my-proj-123.svc.id.goog",
        ),
        (ClusterNeeds(CLUSTER, ON_DEMAND, cpu_pool="big-cpu"), _cluster(), "has no node pool big-cpu"),
        (ClusterNeeds(CLUSTER, ON_DEMAND, cpu_pool="team-b-v6e"), _cluster(), "is a TPU pool"),
    ],
)
def test_each_missing_cluster_prerequisite_is_one_line_naming_it(
    needs: ClusterNeeds, described: dict[str, Any] | None, says: str
) -> None:
    problems = cluster_problems(needs, described)
    assert len(problems) == 1
    assert says in problems[0]
    assert "\n" not in problems[0]
    assert CLUSTER.where in problems[0]


def test_the_api_groups_come_from_discovery() -> None:
    discovery = {
        "kind": "APIGroupList",
        "groups": [
            {
                "name": "jobset.x-k8s.io",
                "versions": [{"groupVersion": "jobset.x-k8s.io/v1alpha2", "version": "v1alpha2"}],
            },
            {"name": "apps", "versions": [{"groupVersion": "apps/v1", "version": "v1"}]},
        ],
    }
    assert served_group_versions(discovery) == {"jobset.x-k8s.io/v1alpha2", "apps/v1"}


def test_the_jobs_go_to_the_named_or_the_only_local_queue() -> None:
    assert kubernetes_problems(NEEDS, SERVED, ["team-a"]) == ([], "team-a")
    named = ClusterNeeds(CLUSTER, ON_DEMAND, queue="team-a")
    assert kubernetes_problems(named, SERVED, ["team-a", "team-b"]) == ([], "team-a")


@pytest.mark.parametrize(
    ("needs", "served", "queues", "says"),
    [
        (NEEDS, {KUEUE_GROUP_VERSION}, ["q"], "install the JobSet controller"),
        (NEEDS, {JOBSET_GROUP_VERSION}, None, "install Kueue"),
        (NEEDS, SERVED, [], "no Kueue LocalQueue in namespace default"),
        (NEEDS, SERVED, ["team-a", "team-b"], "name the one the run may use in kueue_queue"),
        (ClusterNeeds(CLUSTER, ON_DEMAND, queue="mine"), SERVED, ["team-a"], "no LocalQueue mine"),
    ],
)
def test_each_missing_controller_or_queue_is_one_line_naming_it(
    needs: ClusterNeeds, served: set[str], queues: list[str] | None, says: str
) -> None:
    problems, queue = kubernetes_problems(needs, served, queues)
    assert queue is None
    assert len(problems) == 1
    assert says in problems[0]
    assert "\n" not in problems[0]


def test_a_run_never_needs_to_create_or_delete_a_cluster() -> None:
    assert "container.clusters.update" in EXISTING_CLUSTER_PERMISSIONS  # its own pools'
    assert not {"container.clusters.create", "container.clusters.delete"} & set(EXISTING_CLUSTER_PERMISSIONS)


# --- the run parameters (cluster_mode, existing_cluster, kueue_queue, cpu_node_pool) ---------------
_BASE = {"project": "team-project", "region": "us-east5", "zone": "us-east5-b", "bucket": "team-bucket"}
_WHERE = "team-project/us-east5/shared-tpu"


def test_existing_mode_names_the_cluster_and_the_runs_pools() -> None:
    from airflow_provider_tpu_rl.spec.pipeline import gke_pipeline_from_conf

    spec = gke_pipeline_from_conf(
        {**_BASE, "cluster_mode": "existing", "existing_cluster": _WHERE, "cpu_node_pool": "cpu-np"}
    )
    assert spec.cluster_mode == "existing"
    assert spec.run_pools is not None
    assert spec.run_pools.created_cpu_pool == ""
    resolved = spec.resolved()
    assert (resolved["cluster_mode"], resolved["existing_cluster"], resolved["cpu_node_pool"]) == (
        "existing",
        _WHERE,
        "cpu-np",
    )
    create = gke_pipeline_from_conf(_BASE)
    assert (create.cluster_mode, create.run_pools, create.resolved()["existing_cluster"]) == (
        "create",
        None,
        "",
    )


@pytest.mark.parametrize(
    ("conf", "line"),
    [
        ({"existing_cluster": _WHERE}, "existing_cluster: is for cluster_mode existing"),
        ({"kueue_queue": "q"}, "kueue_queue: is for cluster_mode existing"),
        ({"cpu_node_pool": "cpu-np"}, "cpu_node_pool: is for cluster_mode existing"),
        ({"cluster_mode": "shared"}, "cluster_mode: must be one of"),
        ({"capacity_route": "compute-class"}, "capacity_route: compute-class is for cluster_mode existing"),
        ({"capacity_route": "nap"}, "capacity_route: must be one of"),
        ({"cluster_mode": "existing"}, "existing_cluster: cluster_mode existing needs the cluster"),
        (
            {"cluster_mode": "existing", "existing_cluster": "a/b"},
            "existing_cluster: PROJECT/LOCATION/NAME",
        ),
        (
            {"cluster_mode": "existing", "existing_cluster": "other-project/us-east5/x"},
            "existing_cluster: is in project other-project",
        ),
        (
            {"cluster_mode": "existing", "existing_cluster": "team-project/us-central1/x"},
            "existing_cluster: is in us-central1, not in the run's region",
        ),
        (
            {"cluster_mode": "existing", "existing_cluster": "team-project/us-east5-a/x"},
            "existing_cluster: is a zonal cluster in us-east5-a",
        ),
        (
            {"cluster_mode": "existing", "existing_cluster": _WHERE, "keep_cluster": True},
            "keep_cluster: is for cluster_mode create",
        ),
        (
            {"cluster_mode": "existing", "existing_cluster": _WHERE, "kueue_queue": "Team_Q"},
            "kueue_queue: ",
        ),
        (
            {"cluster_mode": "existing", "existing_cluster": _WHERE, "capacity": ["spot", "on-demand"]},
            "capacity: cluster_mode existing takes one capacity kind",
        ),
        (
            {"cluster_mode": "existing", "existing_cluster": _WHERE, "capacity_fallback": ["spot"]},
            "capacity_fallback: cluster_mode existing takes one capacity kind with capacity_route "
            "pools: its node pool's create does not fall through an ordered list; give the one kind, "
            "or set capacity_route to compute-class (GKE chooses among the kinds): clear "
            "capacity_fallback",
        ),
    ],
)
def test_wrong_cluster_mode_values_are_refused_in_one_line(conf: dict[str, object], line: str) -> None:
    from airflow_provider_tpu_rl.spec.pipeline import gke_pipeline_from_conf

    with pytest.raises(SpecError) as refused:
        gke_pipeline_from_conf({**_BASE, **conf})
    assert str(refused.value).startswith(line)
    assert "\n" not in str(refused.value)


def test_the_existing_mode_plan_reads_the_cluster_and_touches_only_the_runs_pools() -> None:
    from airflow_provider_tpu_rl.render.plan import api_calls, gke_plan
    from airflow_provider_tpu_rl.spec.pipeline import gke_pipeline_from_conf
    from airflow_provider_tpu_rl.spec.presets import Runner

    spec = gke_pipeline_from_conf({**_BASE, "cluster_mode": "existing", "existing_cluster": _WHERE})
    steps = [(s.task_id, s.command.argv) for s in gke_plan(spec, now=0)]
    argvs = [" ".join(argv) for _, argv in steps]
    assert not any(argv[0] == "gcluster" and argv[1] in ("deploy", "destroy", "create") for _, argv in steps)
    assert not any("clusters delete" in a or "clusters create" in a for a in argvs)
    by_task = {task: [" ".join(a[:4]) for t, a in steps if t == task] for task, _ in steps}
    assert "gcloud container clusters describe" in by_task["preflight"]
    run = spec.suffix
    assert next(a for t, a in steps if t == "deploy_cluster")[4] == f"tpu-rl-{run}-cpu"
    assert next(a for t, a in steps if t == "deploy_tpu_pool")[4] == f"tpu-rl-{run}-tpu-0"
    deletes = [a[4] for _, a in steps if a[:4] == ("gcloud", "container", "node-pools", "delete")]
    assert deletes == [f"tpu-rl-{run}-tpu-0", f"tpu-rl-{run}-cpu"]
    tested = api_calls(Runner.GKE, spec.cluster.project, existing_cluster=True)[0].to_dict()
    assert "container.clusters.update" in str(tested)


# --- the jobs on an existing cluster ----------------------------------------------------------------
def _target(**changes: object) -> GkeJobTarget:
    values: dict[str, object] = {
        "project": "team-project",
        "location": "us-east5",
        "cluster_name": "tpu-rl",
        "image": "us-docker.pkg.dev/p/r/i:1",
    }
    return GkeJobTarget(**{**values, **changes})  # type: ignore[arg-type]


def test_a_training_job_on_an_existing_cluster_runs_on_the_runs_own_pools_and_queue() -> None:
    cluster = ExistingCluster("team-project", "us-east5", "shared-tpu")
    moved = job_target_on(_target(), cluster, "1a2b3c", queue="team-q")
    assert (moved.cluster_name, moved.location, moved.queue) == ("shared-tpu", "us-east5", "team-q")
    assert moved.node_constraints == (("tpu-rl-run", "1a2b3c"),)
    assert moved.head_node_pool == "tpu-rl-1a2b3c-cpu"  # gcluster would look for cpu-np


def test_a_cpu_job_on_an_existing_cluster_runs_on_the_named_or_the_runs_cpu_pool() -> None:
    cluster = ExistingCluster("team-project", "us-east5-b", "shared-tpu")
    cpu = _target().on_cpu()
    own = job_target_on(cpu, cluster, "1a2b3c")
    assert (own.node_pool, own.service_account, own.location, own.queue) == (
        "tpu-rl-1a2b3c-cpu",
        "",
        "us-east5-b",
        "",
    )
    assert job_target_on(cpu, cluster, "1a2b3c", cpu_pool="cpu-np").node_pool == "cpu-np"
    with pytest.raises(SpecError, match="kueue_queue"):
        job_target_on(cpu, cluster, "1a2b3c", queue="Team_Q")


def test_a_job_targets_a_gke_cluster_name_of_up_to_40_characters() -> None:
    # the 20 is Cluster Toolkit's deployment name's (ClusterSpec keeps it); Cluster.name is ≤ 40
    assert _target(cluster_name="a" * 40).cluster_name == "a" * 40
    with pytest.raises(SpecError, match="at most 40"):
        _target(cluster_name="a" * 41)


_ORDER = ["reservation", "flex-start", "spot"]


def test_the_compute_class_route_takes_the_ordered_capacity_and_selects_the_runs_class() -> None:
    from airflow_provider_tpu_rl.spec.pipeline import gke_pipeline_from_conf

    spec = gke_pipeline_from_conf(
        {
            **_BASE,
            "cluster_mode": "existing",
            "existing_cluster": _WHERE,
            "capacity": _ORDER,
            "reservation": "team-v6e",
            "capacity_route": "compute-class",
        }
    )
    assert spec.compute_class
    assert spec.cluster.capacities == tuple(_ORDER)
    assert spec.resolved()["capacity_route"] == "compute-class"
    assert spec.job_target.node_constraints == (
        ("cloud.google.com/compute-class", compute_class_name(spec.suffix)),
    )
    assert spec.cpu_job_target.node_constraints == ()
    # the pools route (the default) keeps the run's pool label and one kind
    pools = gke_pipeline_from_conf({**_BASE, "cluster_mode": "existing", "existing_cluster": _WHERE})
    assert not pools.compute_class
    assert pools.resolved()["capacity_route"] == "pools"
    assert pools.job_target.node_constraints == (("tpu-rl-run", pools.suffix),)


def _class(suffix: str = "1a2b3c", **labels: str) -> dict[str, Any]:
    base = {"tpu-rl-run": suffix, "tpu-rl-managed": "true", "tpu-rl-bucket": "team-bkt"}
    return {"metadata": {"name": f"tpu-rl-{suffix}", "labels": {**base, **labels}}}


def test_a_compute_class_is_the_runs_only_when_its_name_and_labels_say_so() -> None:
    assert compute_class_is_runs(_class(), "1a2b3c", "team-bkt")
    assert not compute_class_is_runs(_class(), "1a2b3c", "other-bkt")  # another deployment's
    assert not compute_class_is_runs(_class(**{"tpu-rl-run": "ffffff"}), "1a2b3c")
    assert not compute_class_is_runs(_class(**{"tpu-rl-managed": "false"}), "1a2b3c")
    other = _class()
    other["metadata"]["name"] = "team-b-tpus"  # another team's class, the run's labels copied
    assert not compute_class_is_runs(other, "1a2b3c")
    assert not compute_class_is_runs(None, "1a2b3c")


@pytest.mark.parametrize(
    ("labels", "kind"),
    [
        ({"cloud.google.com/gke-spot": "true"}, "spot"),
        ({"cloud.google.com/gke-flex-start": "true"}, "flex-start"),
        ({"cloud.google.com/reservation-name": "team-v6e"}, "reservation"),
        ({"cloud.google.com/gke-spot": "false"}, "on-demand"),
        ({}, "on-demand"),
    ],
)
def test_the_kind_that_served_is_read_from_the_nodes_labels(labels: dict[str, str], kind: str) -> None:
    assert served_kind(labels) == kind


def test_the_compute_class_plan_creates_and_deletes_the_class_and_no_tpu_pool() -> None:
    from airflow_provider_tpu_rl.cli import build_plan

    conf = {
        **_BASE,
        "cluster_mode": "existing",
        "existing_cluster": _WHERE,
        "capacity": _ORDER,
        "reservation": "team-v6e",
        "capacity_route": "compute-class",
    }
    plan = build_plan("tpu_rl_gke_pipeline", conf)
    by_task = {s["task_id"]: s for s in plan["steps"]}
    assert "deploy_tpu_pool" not in by_task
    assert "destroy_tpu_pool" not in by_task
    assert not any(
        "node-pools create" in " ".join(s["argv"]) and "-tpu-" in " ".join(s["argv"]) for s in plan["steps"]
    )
    train = " ".join(
        next(s for s in plan["steps"] if s["task_id"] == "train" and s["argv"][0] == "gcluster")["argv"]
    )
    name = plan["capacity"]["compute_class"]["metadata"]["name"]
    assert f"--node-constraint=cloud.google.com/compute-class={name}" in train
    assert "--node-constraint=tpu-rl-run" not in train
    calls = {c["task_id"]: c for c in plan["api_calls"] if c["task_id"] != "preflight"}
    assert calls["deploy_tpu_pool"]["api"] == "POST /apis/cloud.google.com/v1/computeclasses"
    assert calls["deploy_tpu_pool"]["body"] == plan["capacity"]["compute_class"]
    assert calls["destroy_tpu_pool"]["api"] == f"DELETE /apis/cloud.google.com/v1/computeclasses/{name}"
    assert plan["capacity"]["value"] == _ORDER
    assert plan["capacity"]["route"] == "compute-class"


def test_the_compute_class_route_needs_auto_creation_and_flex_start_when_a_priority_is_flex() -> None:
    needs = ClusterNeeds(CLUSTER, "spot", capacities=("spot", "flex-start"))
    assert cluster_problems(needs, _cluster(currentMasterVersion="1.35.1-gke.1000")) == []
    old = cluster_problems(needs, _cluster(currentMasterVersion="1.32.4-gke.1106006"))
    assert len(old) == 2
    assert "the first with flex-start TPU node pools" in old[0]
    assert "older than 1.33.3-gke.1136000, the first whose ComputeClass creates its own node pools" in old[1]
    limited = {
        "enableNodeAutoprovisioning": True,
        "resourceLimits": [{"resourceType": "cpu", "maximum": "8"}],
    }
    new = "1.35.1-gke.1000"
    assert cluster_problems(needs, _cluster(currentMasterVersion=new, autoscaling=limited)) == [
        f"cluster {CLUSTER.where} has node auto-provisioning on with no tpu-v6e-slice resource limit: its "
        "limits apply to the node pools GKE creates for a ComputeClass, so none of TPU v6e can be made; add "
        "a tpu-v6e-slice limit to its auto-provisioning, or set capacity_route to pools"
    ]
    allowed = {**limited, "resourceLimits": [{"resourceType": "tpu-v6e-slice", "maximum": "64"}]}
    assert cluster_problems(needs, _cluster(currentMasterVersion=new, autoscaling=allowed)) == []
    # the pools route (no capacities) needs neither
    assert cluster_problems(ClusterNeeds(CLUSTER, "spot"), _cluster(autoscaling=limited)) == []
