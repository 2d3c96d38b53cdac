"""Deploy and destroy operators against the sandbox: idempotent deploy, safe destroy, bucket kept."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.exceptions import CommandError, FailureKind
from airflow_provider_tpu_rl.operators.gke import (
    EnsureBucketOperator,
    GclusterDeployOperator,
    GclusterDestroyOperator,
)
from airflow_provider_tpu_rl.records.lease import ClusterLeaseHook, Lease, lease_object
from airflow_provider_tpu_rl.render import gke
from tests.support.compat import capture_task_logs
from tests.support.sandbox_run import RecordingTI, SandboxRun, prepare_cluster
from tpu_rl_sandbox.world.iam import iam_bindings
from tpu_rl_sandbox.world.settings import DEFAULT_RESERVATIONS, update_settings

RUN_ID = "manual__2026-03-01T00:00:00+00:00"


def _tfstate(sb: SandboxRun) -> dict[str, Any]:
    """The Terraform state the deploy keeps in the bucket (GCS backend)."""
    (name,) = [n for n in sb.objects() if n.endswith("default.tfstate") and f"/{sb.cluster}/" in n]
    return dict(json.loads(sb.api.download(sb.bucket, name)))


def _deploy(sb: SandboxRun, conf: dict[str, Any], start: datetime) -> dict[str, Any]:
    deploy = sb.operator(GclusterDeployOperator, task_id="deploy_cluster")
    result: dict[str, Any] = deploy.execute(sb.context(deploy, conf, run_id=RUN_ID, start_date=start))
    return result


def _destroy(sb: SandboxRun, conf: dict[str, Any]) -> dict[str, Any]:
    destroy = sb.operator(GclusterDestroyOperator, task_id="destroy_cluster")
    result: dict[str, Any] = destroy.execute(sb.context(destroy, conf, run_id=RUN_ID))
    return result


def _lease(sb: SandboxRun) -> Lease | None:
    return ClusterLeaseHook().read(sb.bucket, sb.cluster)


def _ensure_bucket(sb: SandboxRun, conf: dict[str, Any]) -> None:
    bucket = sb.operator(EnsureBucketOperator, task_id="ensure_bucket")
    bucket.execute(sb.context(bucket, conf, run_id=RUN_ID))


def _deploy_calls(sb: SandboxRun) -> list[dict[str, Any]]:
    return [c for c in sb.calls() if c["tool"] == "gcluster" and c["argv"][:1] == ["deploy"]]


def test_a_second_deploy_with_the_same_conf_changes_nothing(sb: SandboxRun) -> None:
    conf = sb.gke_conf()
    start = datetime(2030, 1, 1, 8, 0, tzinfo=UTC)
    _ensure_bucket(sb, conf)
    first = _deploy(sb, conf, start)
    assert (first["cluster_origin"], first["kept_from"]) == ("created", None)  # for the ledger
    created = sb.cluster_record()
    assert created is not None
    state_after_first = _tfstate(sb)
    assert any(r["kind"] == "cluster" for r in state_after_first["resources"])

    with capture_task_logs() as logs:
        second = _deploy(sb, conf, start)

    output = "\n".join(str(entry.get("event")) for entry in logs)
    assert re.search(
        rf"Cloud infrastructure in deployment group \S*/{sb.cluster}/\S+ is already applied", output
    )
    assert "Running terraform apply" not in output
    # Terraform wrote no new state and the cluster is the one the first deploy created.
    assert _tfstate(sb)["serial"] == state_after_first["serial"]
    again = sb.cluster_record()
    assert again is not None
    assert again["created"] == created["created"]
    assert again["settings_digest"] == created["settings_digest"]
    deploys = _deploy_calls(sb)
    assert len(deploys) == 2
    assert all(call["exit_code"] == 0 for call in deploys)
    expires = int(start.timestamp()) + 72 * 3600  # max_cluster_hours defaults to 72
    assert first["expires_at"] == second["expires_at"] == expires
    assert second["cluster_origin"] == "created"  # the run's own re-deploy: not a kept cluster
    assert first["cluster_name"] == sb.cluster
    assert first["chips"] == 32


def test_deploy_writes_the_blueprint_labels_and_the_resource_record(sb: SandboxRun) -> None:
    conf = sb.gke_conf()
    start = datetime.now(UTC)
    _ensure_bucket(sb, conf)
    result = _deploy(sb, conf, start)
    expires = int(start.timestamp()) + 72 * 3600
    assert result["expires_at"] == expires

    # The blueprint's labels and roles, as the cluster the fake Terraform created from it carries
    # them (the work folder itself is gone with the task): its node pool may write to GCS.
    wanted = {"tpu-rl-managed": "true", "tpu-rl-expires": str(expires), "tpu-rl-bucket": sb.bucket}
    record = sb.cluster_record()
    assert record is not None
    assert wanted.items() <= record["labels"].items()
    assert "storage.admin" in record["node_pool_roles"]
    assert "storage.objectViewer" not in record["node_pool_roles"]
    # What the janitor needs to destroy it, written in the run's bucket.
    resource = json.loads(sb.api.download(sb.bucket, gke.resource_record_object(sb.cluster)))
    assert resource == {
        "kind": "cluster",
        "name": sb.cluster,
        "dag_id": "tpu_rl_gke_pipeline",
        "run_id": RUN_ID,
        "cluster": {
            "project": sb.project,
            "region": conf["region"],
            "zone": conf["zone"],
            "cluster_name": sb.cluster,
            "bucket": sb.bucket,
            "reservation": conf["reservation"],
            "capacity": "reservation",
            "compute_type": "ct6e-standard-4t",
            "topology": "4x8",
            "num_slices": 1,
            "authorized_cidr": "0.0.0.0/0",
        },
        "model": conf["model"],
        "expires_at": expires,
        "keep": False,
    }
    # No project-level grant is run (gcloud would refuse it non-interactively on a policy with a
    # conditional binding): the blueprint's service-account modules gave both accounts the role.
    assert not [c for c in sb.calls() if c["argv"][:2] == ["projects", "add-iam-policy-binding"]]
    admins = iam_bindings(sb.layout, f"projects/{sb.project}")["roles/storage.admin"]
    for account in ("np", "wl"):
        assert f"serviceAccount:{sb.cluster}-gke-{account}-sa@{sb.project}.iam.gserviceaccount.com" in admins


def test_destroy_leaves_alone_a_cluster_this_run_never_deployed(sb: SandboxRun) -> None:
    """No lease and no record of this run: nothing this run made, nothing to tear down."""
    conf = sb.gke_conf()
    _ensure_bucket(sb, conf)
    result = _destroy(sb, conf)
    assert result == {
        "cluster_name": sb.cluster,
        "destroyed": False,
        "revoked_accounts": [],
        "removed_grants": [],
        "bucket_deleted": False,
        "objects_deleted": [],
        "bucket_kept": None,
        "lease_holder": None,
    }
    assert not [c for c in sb.calls() if c["argv"][:1] == ["destroy"]]
    assert sb.cluster_record() is None
    assert sb.bucket_exists()


def test_a_destroy_without_its_gcs_connection_destroys_nothing_and_fails_in_one_line(sb: SandboxRun) -> None:
    """The cluster is this run's, but without GCS the destroy cannot read the lease that says so: it
    destroys nothing (a run never destroys a cluster it does not hold) and fails at once, no retry;
    the cluster stays for the janitor."""
    conf = sb.gke_conf()
    prepare_cluster(sb, conf, run_id=RUN_ID)
    destroy = sb.operator(
        GclusterDestroyOperator, task_id="destroy_cluster", gcp_conn_id="tpu_rl_no_such_connection"
    )
    with pytest.raises(AirflowFailException) as failed:
        destroy.execute(sb.context(destroy, conf, run_id=RUN_ID))
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith("connection tpu_rl_no_such_connection is not defined: the cluster lease "), (
        message
    )
    assert not [c for c in sb.calls() if c["argv"][:1] == ["destroy"]]
    assert sb.cluster_record() is not None


def test_a_retried_destroy_after_the_lease_was_released_destroys_again(sb: SandboxRun) -> None:
    """The record says this run created the cluster: with no lease left, the retry still runs
    (``gcluster destroy`` of an absent cluster succeeds)."""
    conf = sb.gke_conf()
    prepare_cluster(sb, conf, run_id=RUN_ID)
    assert _destroy(sb, conf)["destroyed"] is True
    assert _lease(sb) is None
    assert _destroy(sb, conf)["destroyed"] is True
    destroys = [c for c in sb.calls() if c["argv"][:1] == ["destroy"]]
    assert [c["exit_code"] for c in destroys] == [0, 0]


def test_destroy_removes_the_cluster_and_keeps_the_bucket(sb: SandboxRun) -> None:
    conf = sb.gke_conf()
    prepare_cluster(sb, conf, run_id=RUN_ID)
    assert sb.cluster_record() is not None
    sb.api.upload(sb.bucket, "gemma4-26b/hf-trained/config.json", b"{}")
    before = sb.objects()

    result = _destroy(sb, conf)

    assert result["destroyed"] is True
    assert result["bucket_deleted"] is False
    assert sb.cluster_record() is None
    assert sb.bucket_exists()
    # every object is kept but the lease, released at the end of the teardown, and the holder
    # objects of the grants the cluster was the last to hold (records/grants.py)
    grants = {name for name in before if name.startswith("tpu-rl/grants/")}
    assert len(grants) == 2
    assert set(before) - {lease_object(sb.cluster)} - grants <= set(sb.objects())
    assert not grants & set(sb.objects())
    assert lease_object(sb.cluster) in before
    assert _lease(sb) is None
    assert not any(c["argv"][:2] == ["storage", "rm"] for c in sb.calls())
    # The second destroy (a retry of the teardown) finds nothing left and succeeds too.
    assert _destroy(sb, conf)["destroyed"] is True


def test_delete_bucket_true_deletes_the_bucket_after_the_cluster(sb: SandboxRun) -> None:
    conf = sb.gke_conf(delete_bucket=True)
    prepare_cluster(sb, conf, run_id=RUN_ID)

    result = _destroy(sb, conf)

    # the token task's grants, from the cluster's record (the test passes no XCom)
    assert len(result.pop("removed_grants")) == len(result.pop("revoked_accounts")) == 2
    assert result == {
        "cluster_name": sb.cluster,
        "destroyed": True,
        "bucket_deleted": True,  # it created the bucket, nothing in it names another run
        "objects_deleted": [],
        "bucket_kept": None,
        "lease_holder": f"tpu_rl_gke_pipeline/{RUN_ID}",
    }
    assert sb.cluster_record() is None
    assert not sb.bucket_exists()
    verbs = [c["argv"][0] if c["tool"] == "gcluster" else " ".join(c["argv"][:2]) for c in sb.calls()]
    assert verbs.index("destroy") < verbs.index("storage rm")


def test_keep_cluster_leaves_the_cluster_running(sb: SandboxRun) -> None:
    conf = sb.gke_conf(keep_cluster=True)
    prepare_cluster(sb, conf, run_id=RUN_ID)

    result = _destroy(sb, conf)

    assert result["destroyed"] is False
    assert sb.cluster_record() is not None
    assert not [c for c in sb.calls() if c["argv"][:1] == ["destroy"]]


# ------------------------------------------------------------------------------ the lease
OTHER_RUN_ID = "manual__2026-03-02T00:00:00+00:00"


def test_deploy_takes_the_lease_and_a_second_run_is_refused_in_one_line(sb: SandboxRun) -> None:
    conf = sb.gke_conf()
    start = datetime.now(UTC)
    _ensure_bucket(sb, conf)
    first = _deploy(sb, conf, start)
    lease = _lease(sb)
    assert lease is not None
    assert lease.holder == f"tpu_rl_gke_pipeline/{RUN_ID}"
    # the lease runs to the cluster's expiry (start + max_cluster_hours): it covers the whole run
    assert int(lease.expires_at) == first["lease_expires_at"] == first["expires_at"]
    record_before = sb.api.download(sb.bucket, gke.resource_record_object(sb.cluster))
    deploys_before = len(_deploy_calls(sb))

    other = sb.operator(GclusterDeployOperator, task_id="deploy_cluster", run_id=OTHER_RUN_ID)
    with pytest.raises(AirflowFailException) as refused:
        other.execute(sb.context(other, conf, run_id=OTHER_RUN_ID))

    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"cluster {sb.cluster} is in use by run tpu_rl_gke_pipeline/{RUN_ID} until ")
    assert len(_deploy_calls(sb)) == deploys_before  # never deployed over the first run's cluster
    assert sb.api.download(sb.bucket, gke.resource_record_object(sb.cluster)) == record_before
    assert _lease(sb) == lease


def test_a_run_without_the_lease_never_destroys_the_cluster(sb: SandboxRun) -> None:
    conf = sb.gke_conf(delete_bucket=True)
    prepare_cluster(sb, conf, run_id=RUN_ID)

    other = sb.operator(GclusterDestroyOperator, task_id="destroy_cluster", run_id=OTHER_RUN_ID)
    result = other.execute(sb.context(other, conf, run_id=OTHER_RUN_ID))

    assert result["destroyed"] is False
    assert result["bucket_deleted"] is False  # the bucket holds the other run's lease and state
    assert result["lease_holder"] == f"tpu_rl_gke_pipeline/{RUN_ID}"
    assert sb.cluster_record() is not None
    assert sb.bucket_exists()
    assert not [c for c in sb.calls() if c["argv"][:1] == ["destroy"]]
    # the holder's own teardown still destroys it and releases the lease
    assert _destroy(sb, conf)["destroyed"] is True
    assert sb.cluster_record() is None
    assert not sb.bucket_exists()


def test_keep_cluster_hands_the_cluster_to_a_later_run(sb: SandboxRun) -> None:
    conf = sb.gke_conf(keep_cluster=True)
    prepare_cluster(sb, conf, run_id=RUN_ID)
    assert _destroy(sb, conf)["destroyed"] is False
    kept = _lease(sb)
    assert kept is not None
    assert kept.kept
    assert kept.holder == f"tpu_rl_gke_pipeline/{RUN_ID}"

    later_conf = sb.gke_conf()
    later = sb.operator(GclusterDeployOperator, task_id="deploy_cluster", run_id=OTHER_RUN_ID)
    deployed = later.execute(sb.context(later, later_conf, run_id=OTHER_RUN_ID))
    # for the ledger: the cluster was kept for this run, by the first (a retry still says so)
    assert (deployed["cluster_origin"], deployed["kept_from"]) == ("kept", f"tpu_rl_gke_pipeline/{RUN_ID}")
    retried = later.execute(sb.context(later, later_conf, run_id=OTHER_RUN_ID))
    assert (retried["cluster_origin"], retried["kept_from"]) == ("kept", f"tpu_rl_gke_pipeline/{RUN_ID}")
    taken = _lease(sb)
    assert taken is not None
    assert taken.holder == f"tpu_rl_gke_pipeline/{OTHER_RUN_ID}"
    assert not taken.kept
    record = json.loads(sb.api.download(sb.bucket, gke.resource_record_object(sb.cluster)))
    assert record["run_id"] == OTHER_RUN_ID

    # the first run's teardown, retried now, leaves the later run's cluster alone
    assert _destroy(sb, conf)["destroyed"] is False
    destroy = sb.operator(GclusterDestroyOperator, task_id="destroy_cluster", run_id=OTHER_RUN_ID)
    assert destroy.execute(sb.context(destroy, later_conf, run_id=OTHER_RUN_ID))["destroyed"] is True
    assert sb.cluster_record() is None
    assert _lease(sb) is None


# ------------------------------------------------------------------------ the deploy used alone
def test_a_deploy_without_its_bucket_fails_in_one_line_before_anything_is_created(sb: SandboxRun) -> None:
    """A DAG of the user's own with no EnsureBucketOperator: the lease cannot be written; the task
    fails at once with what to do, no retry, and gcluster never runs."""
    conf = sb.gke_conf()
    with pytest.raises(AirflowFailException) as failed:
        _deploy(sb, conf, datetime(2030, 1, 1, tzinfo=UTC))

    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith(f"bucket gs://{sb.bucket} does not exist: the lease of cluster {sb.cluster} ")
    assert "EnsureBucketOperator" in message
    assert _deploy_calls(sb) == []
    assert sb.cluster_record() is None


def test_the_deploy_says_how_long_it_holds_the_lease_and_what_releases_it(sb: SandboxRun) -> None:
    conf = sb.gke_conf()
    _ensure_bucket(sb, conf)
    with capture_task_logs() as logs:
        _deploy(sb, conf, datetime(2030, 1, 1, tzinfo=UTC))
    lease = _lease(sb)
    assert lease is not None
    lines = [str(entry.get("event")) for entry in logs]
    assert any(
        line.startswith(f"cluster {sb.cluster}: lease held by run {lease.holder} until ")
        and "until a GclusterDestroyOperator of this run releases it" in line
        for line in lines
    ), lines


def _tpu_pools(sb: SandboxRun) -> list[str]:
    record = sb.cluster_record()
    return [] if record is None else [p["name"] for p in record["node_pools"] if p.get("topology")]


def test_the_tpu_pool_tasks_act_only_on_a_cluster_this_run_holds(sb: SandboxRun) -> None:
    """deploy_tpu_pool/destroy_tpu_pool (``only_groups=["tpu"]``): this run's lease or nothing."""
    conf = sb.gke_conf()
    _ensure_bucket(sb, conf)
    _deploy(sb, conf, datetime.now(UTC))
    assert sb.cluster_record() is not None
    assert _tpu_pools(sb) == []  # deploy_cluster skipped the tpu group
    lease = _lease(sb)

    other = sb.operator(GclusterDeployOperator, task_id="deploy_tpu_pool", run_id=OTHER_RUN_ID)
    with pytest.raises(AirflowFailException) as refused:
        other.execute(sb.context(other, conf, run_id=OTHER_RUN_ID))
    assert str(refused.value).startswith(
        f"cluster {sb.cluster}: its lease is held by run tpu_rl_gke_pipeline/{RUN_ID}; this run deploys no node pool"
    )
    assert [c["argv"][-1] for c in _deploy_calls(sb)] == ["--skip=tpu"]
    assert _tpu_pools(sb) == []

    pool = sb.operator(GclusterDeployOperator, task_id="deploy_tpu_pool")
    result = pool.execute(sb.context(pool, conf, run_id=RUN_ID))
    assert (result["groups"], result["chips"]) == (["tpu"], 32)
    assert _tpu_pools(sb) == ["gke-tpu-v6e-pool"]
    assert [c["argv"][-1] for c in _deploy_calls(sb)] == ["--skip=tpu", "--only=tpu"]
    assert _lease(sb) == lease  # the pool's deploy neither takes nor renews the lease

    stranger = sb.operator(GclusterDestroyOperator, task_id="destroy_tpu_pool", run_id=OTHER_RUN_ID)
    assert stranger.execute(sb.context(stranger, conf, run_id=OTHER_RUN_ID))["destroyed"] is False
    assert _tpu_pools(sb) == ["gke-tpu-v6e-pool"]

    own = sb.operator(GclusterDestroyOperator, task_id="destroy_tpu_pool")
    destroyed = own.execute(sb.context(own, conf, run_id=RUN_ID))
    assert destroyed["destroyed"] is True
    spans = destroyed["billed"]["spans"]  # the TPU node VMs' own clocks, for the ledger
    assert (len(spans), {s["chips"] for s in spans}, {s["ended_by"] for s in spans}) == (8, {4}, {"delete"})
    assert _tpu_pools(sb) == []
    assert sb.cluster_record() is not None  # the cluster stays for the export
    assert _lease(sb) == lease  # and so does the lease
    # an already destroyed pool: success again
    assert own.execute(sb.context(own, conf, run_id=RUN_ID))["destroyed"] is True
    assert _destroy(sb, conf)["destroyed"] is True
    assert sb.cluster_record() is None
    assert _lease(sb) is None


@pytest.fixture
def on_demand_out(sb: SandboxRun) -> Iterator[None]:
    """The test's zone has no on-demand v6e (``tpu_capacity_out``), spot is there."""
    update_settings(sb.layout, tpu_capacity_out={"us-east5-b/on-demand": "stockout"})
    try:
        yield
    finally:
        update_settings(sb.layout, tpu_capacity_out={})


def test_the_tpu_pool_falls_through_an_ordered_capacity_in_one_try(
    sb: SandboxRun, on_demand_out: None, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """The on-demand pool's create is refused (GCE_STOCKOUT): its group is destroyed, and the spot
    pool is deployed in the same try; the capacity XCom names spot and the refusal."""
    conf = sb.gke_conf(capacity=["on-demand", "spot"], reservation="")
    _ensure_bucket(sb, conf)
    _deploy(sb, conf, datetime.now(UTC))
    pool = sb.operator(GclusterDeployOperator, task_id="deploy_tpu_pool", conf=conf)
    ti = RecordingTI()
    with caplog.at_level(logging.INFO):
        result = pool.execute(sb.context(pool, conf, run_id=RUN_ID, ti=ti))
    assert result["groups"] == ["tpu"]
    (tpu,) = [p for p in sb.cluster_record()["node_pools"] if p.get("topology")]
    assert tpu["consumption"]["spot"] is True
    served = ti.pulled("capacity")
    assert served["served"] == "spot"
    (refused,) = served["attempts"]
    assert refused["capacity"] == "on-demand"
    assert "GCE_STOCKOUT" in refused["error"]
    assert "\n" not in refused["error"]
    logged = caplog.text + capsys.readouterr().out
    assert "Capacity on-demand refused: " in logged
    # deploy, refused; the failed pool's group destroyed; deploy again with the next kind
    tpu_calls = [c["argv"][0] for c in sb.calls() if c["argv"][-1] == "--only=tpu"]
    assert tpu_calls == ["deploy", "destroy", "deploy"]
    # a retry of the task: the kind that served first, its pool as it is (no change), one deploy
    again = sb.operator(GclusterDeployOperator, task_id="deploy_tpu_pool", conf=conf)
    retry = RecordingTI(try_number=2)
    again.execute(sb.context(again, conf, run_id=RUN_ID, ti=retry))
    assert retry.pulled("capacity") == served
    tpu_calls = [c["argv"][0] for c in sb.calls() if c["argv"][-1] == "--only=tpu"]
    assert tpu_calls == ["deploy", "destroy", "deploy", "deploy"]


def test_every_kind_refused_fails_the_pool_in_one_line_with_no_pool_left(sb: SandboxRun) -> None:
    update_settings(
        sb.layout, tpu_capacity_out={"us-east5-b/on-demand": "stockout", "us-east5-b/spot": "stockout"}
    )
    try:
        conf = sb.gke_conf(capacity=["spot", "on-demand"], reservation="")
        _ensure_bucket(sb, conf)
        _deploy(sb, conf, datetime.now(UTC))
        pool = sb.operator(GclusterDeployOperator, task_id="deploy_tpu_pool", conf=conf)
        with pytest.raises(CommandError) as caught:
            pool.execute(sb.context(pool, conf, run_id=RUN_ID))
    finally:
        update_settings(sb.layout, tpu_capacity_out={})
    line = str(caught.value)
    assert "\n" not in line
    assert caught.value.kind is FailureKind.CAPACITY
    assert line.startswith(
        f"TPU node pool of cluster {sb.cluster}: no capacity kind could create it in us-east5-b: spot: "
    )
    assert "; on-demand: " in line
    assert _tpu_pools(sb) == []  # nothing of a failed attempt bills or lingers
    assert _destroy(sb, conf)["destroyed"] is True


def _running_tpu_nodes(sb: SandboxRun) -> list[str]:
    """The TPU node VMs of this test's cluster that exist and are not stopping (what bills)."""
    return [
        str(vm["name"])
        for vm in sb.state("vms").values()
        if vm.get("gke_node")
        and (vm.get("labels") or {}).get("goog-k8s-cluster-name") == sb.cluster
        and vm.get("status") not in ("STOPPING", "TERMINATED")
    ]


def _placeholder_pods(sb: SandboxRun) -> list[str]:
    return [key for key in sb.state("pods") if f"/{sb.cluster}/" in key]


def _pool_with(sb: SandboxRun, conf: dict[str, Any], ti: RecordingTI) -> dict[str, Any]:
    _ensure_bucket(sb, conf)
    _deploy(sb, conf, datetime.now(UTC))
    pool = sb.operator(GclusterDeployOperator, task_id="deploy_tpu_pool", conf=conf)
    result: dict[str, Any] = pool.execute(sb.context(pool, conf, run_id=RUN_ID, ti=ti))
    return result


def test_a_full_reservation_and_flex_start_out_of_stock_train_on_spot_in_one_try(
    sb: SandboxRun, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's order on GKE: the reservation pool's create is refused (the reservation is
    full); the flex-start pool is created empty, its placeholder pod gets the autoscaler's
    FailedScaleUp ("GCE out of resources"): refused too, its group destroyed; spot serves, in the
    same try. One log line per refusal; the capacity XCom (the ledger's) names spot."""
    reservations = {key: dict(value) for key, value in DEFAULT_RESERVATIONS.items()}
    reservations["us-east5-b/res-1"]["count"] = 0
    update_settings(
        sb.layout, reservations=reservations, tpu_capacity_out={"us-east5-b/flex-start": "stockout"}
    )
    ti = RecordingTI()
    try:
        conf = sb.gke_conf(capacity=["reservation", "flex-start", "spot"])
        with caplog.at_level(logging.INFO):
            _pool_with(sb, conf, ti)
    finally:
        update_settings(
            sb.layout,
            reservations={k: dict(v) for k, v in DEFAULT_RESERVATIONS.items()},
            tpu_capacity_out={},
        )
    served = ti.pulled("capacity")
    assert served["served"] == "spot"
    assert [a["capacity"] for a in served["attempts"]] == ["reservation", "flex-start"]
    assert served["attempts"][1]["error"] == (
        "FailedScaleUp: Node scale up in zones us-east5-b associated with this pod failed: GCE out of "
        "resources. Pod is at risk of not being scheduled."
    )
    logged = caplog.text + capsys.readouterr().out
    refusals = [line for line in logged.splitlines() if "Capacity " in line and " refused: " in line]
    assert len(refusals) == 2, refusals
    assert "Capacity reservation refused: Error: error creating NodePool" in refusals[0]
    assert "Capacity flex-start refused: FailedScaleUp: Node scale up in zones us-east5-b" in refusals[1]
    tpu_calls = [c["argv"][0] for c in sb.calls() if c["argv"][-1] == "--only=tpu"]
    assert tpu_calls == ["deploy", "destroy", "deploy", "destroy", "deploy"]
    (tpu,) = [p for p in sb.cluster_record()["node_pools"] if p.get("topology")]
    assert (tpu["consumption"]["spot"], tpu["consumption"]["enable_flex_start"]) == (True, False)
    assert len(_running_tpu_nodes(sb)) == 8  # the spot slice's nodes
    assert _placeholder_pods(sb) == []


def test_a_flex_start_pool_whose_nodes_come_serves_and_keeps_them(sb: SandboxRun) -> None:
    """Flex-start before spot, with flex-start capacity in the zone: the placeholder pod is placed
    on the pool's nodes, then deleted; the pool and its nodes stay for the training."""
    ti = RecordingTI()
    _pool_with(sb, sb.gke_conf(capacity=["flex-start", "spot"], reservation=""), ti)
    assert ti.pulled("capacity") == {"served": "flex-start", "attempts": []}
    (tpu,) = [p for p in sb.cluster_record()["node_pools"] if p.get("topology")]
    assert tpu["consumption"]["enable_flex_start"] is True
    assert len(_running_tpu_nodes(sb)) == 8
    assert _placeholder_pods(sb) == []
    events = [
        e for key, events in sb.state("pod_events").items() if key.endswith(f"/{sb.cluster}") for e in events
    ]
    assert events == []  # placed at once: no scheduler or autoscaler warning


def test_every_kind_out_with_flex_start_first_fails_in_one_line_leaving_nothing(sb: SandboxRun) -> None:
    """Flex-start out of stock, spot's quota short (a pool's create refused for PREEMPTIBLE_TPU_V6E):
    one line listing both attempts; no pool, node VM or placeholder pod left."""
    update_settings(
        sb.layout, tpu_capacity_out={"us-east5-b/flex-start": "stockout", "us-east5-b/spot": "quota"}
    )
    try:
        with pytest.raises(CommandError) as caught:
            _pool_with(sb, sb.gke_conf(capacity=["flex-start", "spot"], reservation=""), RecordingTI())
    finally:
        update_settings(sb.layout, tpu_capacity_out={})
    line = str(caught.value)
    assert "\n" not in line
    assert caught.value.kind is FailureKind.CAPACITY
    assert line.startswith(
        f"TPU node pool of cluster {sb.cluster}: no capacity kind could create it in us-east5-b: "
        "flex-start: FailedScaleUp: Node scale up in zones us-east5-b associated with this pod failed: "
        "GCE out of resources. "
    ), line
    assert (
        "; spot: Error: error creating NodePool: Insufficient quota to satisfy the request: Not all "
        "instances running in IGM after "
    ) in line
    assert "[GCE_QUOTA_EXCEEDED]: Instance " in line
    assert "Quota 'PREEMPTIBLE_TPU_V6E' exceeded." in line
    assert _tpu_pools(sb) == []
    assert _running_tpu_nodes(sb) == []
    assert _placeholder_pods(sb) == []


def test_a_full_reservation_falls_through_to_spot(sb: SandboxRun) -> None:
    """The reservation holds fewer VMs than the slice: the reservation pool's create is refused
    with Compute Engine's "does not have available resources" and the spot pool is deployed."""
    reservations = {key: dict(value) for key, value in DEFAULT_RESERVATIONS.items()}
    reservations["us-east5-b/res-1"]["count"] = 0
    update_settings(sb.layout, reservations=reservations)
    try:
        conf = sb.gke_conf(capacity=["reservation", "spot"])
        _ensure_bucket(sb, conf)
        _deploy(sb, conf, datetime.now(UTC))
        pool = sb.operator(GclusterDeployOperator, task_id="deploy_tpu_pool", conf=conf)
        ti = RecordingTI()
        pool.execute(sb.context(pool, conf, run_id=RUN_ID, ti=ti))
    finally:
        update_settings(sb.layout, reservations={k: dict(v) for k, v in DEFAULT_RESERVATIONS.items()})
    served = ti.pulled("capacity")
    assert served["served"] == "spot"
    (refused,) = served["attempts"]
    assert refused["capacity"] == "reservation"
    assert (
        "Specified reservation 'res-1' does not have available resources for the request" in refused["error"]
    )
    (tpu,) = [p for p in sb.cluster_record()["node_pools"] if p.get("topology")]
    assert (tpu["consumption"]["spot"], tpu["reservation"]) == (True, None)
