"""The commands of a run on a cluster it does not own (render/existing_cluster.py). The real gcloud
parses each of them in test_real_gcloud.py (existing_cluster_commands)."""

from __future__ import annotations

import pytest

from airflow_provider_tpu_rl.render import existing_cluster as render
from airflow_provider_tpu_rl.spec.cluster import SliceShape
from airflow_provider_tpu_rl.spec.existing_cluster import RunPools, parse_existing_cluster

CLUSTER = parse_existing_cluster("my-proj-123/us-east5/team-tpu")
POOLS = RunPools(CLUSTER, "1a2b3c", "us-east5-b", SliceShape("ct6e-standard-4t", "4x8"), num_slices=2)
LABELS = {"tpu-rl-managed": "true", "tpu-rl-run": "1a2b3c"}


def test_the_tpu_pool_is_named_and_labelled_after_the_run() -> None:
    argv = render.create_tpu_pool(POOLS, 1, capacity="on-demand", reservation="", labels=LABELS).argv
    assert argv[:5] == ("gcloud", "container", "node-pools", "create", "tpu-rl-1a2b3c-tpu-1")
    assert {"--cluster=team-tpu", "--location=us-east5", "--project=my-proj-123"} <= set(argv)
    assert {"--node-locations=us-east5-b", "--machine-type=ct6e-standard-4t", "--tpu-topology=4x8"} <= set(
        argv
    )
    assert "--num-nodes=8" in argv  # the slice's VMs: 32 chips, 4 a VM
    assert "--node-labels=tpu-rl-pool=tpu,tpu-rl-run=1a2b3c" in argv
    assert "--labels=tpu-rl-managed=true,tpu-rl-run=1a2b3c" in argv
    assert not any(a.startswith("--service-account") for a in argv)  # Compute Engine's default
    account = "nodes@my-proj-123.iam.gserviceaccount.com"
    named = render.create_tpu_pool(
        POOLS, 0, capacity="spot", reservation="", labels=LABELS, service_account=account
    )
    assert f"--service-account={account}" in named.argv


@pytest.mark.parametrize(
    ("capacity", "reservation", "flags"),
    [
        ("on-demand", "", {"--reservation-affinity=none", "--num-nodes=8"}),
        ("reservation", "res-1", {"--reservation-affinity=specific", "--reservation=res-1", "--num-nodes=8"}),
        ("spot", "", {"--spot", "--reservation-affinity=none"}),
        (
            "flex-start",
            "",
            {
                "--flex-start",
                "--no-enable-autorepair",
                "--num-nodes=0",
                "--max-nodes=8",
                "--reservation-affinity=none",
            },
        ),
    ],
)
def test_each_capacity_provisions_the_pool_as_the_toolkit_pool_would(
    capacity: str, reservation: str, flags: set[str]
) -> None:
    argv = render.create_tpu_pool(POOLS, 0, capacity=capacity, reservation=reservation, labels=LABELS).argv
    assert flags <= set(argv)
    assert ("--spot" in argv) == (capacity == "spot")


def test_the_cpu_pool_is_created_only_when_the_run_names_none() -> None:
    argv = render.create_cpu_pool(POOLS, "n4-standard-64", LABELS).argv
    assert argv[4] == "tpu-rl-1a2b3c-cpu"
    assert "--node-labels=tpu-rl-pool=cpu,tpu-rl-run=1a2b3c" in argv
    shared = RunPools(
        CLUSTER, "1a2b3c", "us-east5-b", SliceShape("ct6e-standard-4t", "4x8"), cpu_pool="cpu-np"
    )
    with pytest.raises(ValueError, match="creates none"):
        render.create_cpu_pool(shared, "n4-standard-64", LABELS)


def test_a_pool_delete_names_one_pool_and_a_gone_pool_is_success() -> None:
    delete = render.delete_pool(CLUSTER, "tpu-rl-1a2b3c-tpu-0")
    assert delete.argv[:5] == ("gcloud", "container", "node-pools", "delete", "tpu-rl-1a2b3c-tpu-0")
    assert "--quiet" in delete.argv
    assert delete.ok_if_output_contains == ("code=404",)
    assert not any(a == "clusters" for a in delete.argv)  # a node pool's delete, never the cluster's


def test_the_jobs_on_an_existing_cluster_name_the_runs_pools_and_queue() -> None:
    from airflow_provider_tpu_rl.render.plan import gke_plan
    from airflow_provider_tpu_rl.spec.pipeline import gke_pipeline_from_conf

    spec = gke_pipeline_from_conf(
        {
            "project": "my-proj-123",
            "region": "us-east5",
            "zone": "us-east5-b",
            "bucket": "team-bucket",
            "cluster_mode": "existing",
            "existing_cluster": "my-proj-123/us-east5/team-tpu",
            "kueue_queue": "team-q",
        }
    )
    steps = gke_plan(spec, now=0)
    # no grant to the create mode's cluster accounts, which an existing cluster does not have
    assert not any("add-iam-policy-binding" in s.command.argv for s in steps if s.task_id == "sync_hf_token")
    assert spec.resolved()["secret_readers"] == []
    jobs = {
        s.task_id: s.command.argv for s in gke_plan(spec, now=0) if s.command.argv[1:3] == ("job", "submit")
    }
    run = spec.suffix
    train = jobs["train"]
    assert {
        "--node-constraint=tpu-rl-run=" + run,
        "--queue=team-q",
        f"--pathways-head-np=tpu-rl-{run}-cpu",
    } <= set(train)
    assert {"--cluster=team-tpu", "--location=us-east5", "--project=my-proj-123"} <= set(train)
    for task in ("convert_to_maxtext", "export_to_huggingface"):
        assert f"--node-constraint=cloud.google.com/gke-nodepool=tpu-rl-{run}-cpu" in jobs[task]
        assert "--queue=team-q" in jobs[task]
        assert not any(a.startswith("--service-account") for a in jobs[task])  # no toolkit KSA there


def test_the_compute_class_has_the_ordered_kinds_as_priorities_and_the_runs_name_and_labels() -> None:
    manifest = render.compute_class(
        POOLS, ["reservation", "flex-start", "spot", "on-demand"], "team-v6e", LABELS
    )
    assert (manifest["apiVersion"], manifest["kind"]) == ("cloud.google.com/v1", "ComputeClass")
    assert manifest["metadata"] == {"name": "tpu-rl-1a2b3c", "labels": LABELS}
    spec = manifest["spec"]
    tpu = {"type": "tpu-v6e-slice", "count": 4, "topology": "4x8"}
    assert spec["priorities"] == [
        {"tpu": tpu, "reservations": {"affinity": "Specific", "specific": [{"name": "team-v6e"}]}},
        {"tpu": tpu, "flexStart": {"enabled": True}},
        {"tpu": tpu, "spot": True},
        {"tpu": tpu, "reservations": {"affinity": "None"}},
    ]
    assert spec["whenUnsatisfiable"] == "DoNotScaleUp"
    assert spec["nodePoolAutoCreation"] == {"enabled": True}
    assert spec["priorityDefaults"] == {"location": {"zones": ["us-east5-b"]}}
    with pytest.raises(ValueError):
        render.compute_class(POOLS, [], "", LABELS)


def test_the_compute_class_is_created_and_deleted_through_the_kubernetes_api() -> None:
    manifest = render.compute_class(POOLS, ["spot"], "", LABELS)
    create = render.apply_compute_class(manifest)
    assert (create.method, create.url, dict(create.body)) == (
        "POST",
        "/apis/cloud.google.com/v1/computeclasses",
        manifest,
    )
    delete = render.delete_compute_class(POOLS)
    assert (delete.method, delete.url) == ("DELETE", "/apis/cloud.google.com/v1/computeclasses/tpu-rl-1a2b3c")


def test_the_compute_class_probe_pod_selects_the_class_and_asks_one_nodes_chips() -> None:
    pod = render.compute_class_probe_pod(POOLS)
    assert pod["metadata"]["name"] == "tpu-rl-1a2b3c-capacity-probe"
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"cloud.google.com/compute-class": "tpu-rl-1a2b3c"}
    assert spec["containers"][0]["resources"]["requests"] == {"google.com/tpu": "4"}
