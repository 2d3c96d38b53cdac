"""The janitor against the sandbox: orphaned runs, live runs, leases, and projects named by records.

Clusters are deployed by the real deploy operator (record, lease, labels); the janitor's scans
run at explicit times (``now``), so "for ``orphan_minutes``" is checked without waiting. What the
metadata database says about the runs comes from a stand-in here; the Task SDK reader runs end
to end in ``tests/e2e/test_janitor.py``.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from airflow_provider_tpu_rl.compat import AirflowException
from airflow_provider_tpu_rl.hooks.gcluster import GclusterHook
from airflow_provider_tpu_rl.ledger.hook import RunLedger, sqlite_connection_uri
from airflow_provider_tpu_rl.ledger.records import RunRecord
from airflow_provider_tpu_rl.operators.gke import (
    LEASE_MIN_SECONDS,
    EnsureBucketOperator,
    GclusterDeployOperator,
    cluster_spec,
    write_resource_record,
)
from airflow_provider_tpu_rl.operators.janitor import (
    ManagedResource,
    destroy_resource,
    find_expired_resources,
    orphan_marker_object,
    recorded_cluster_arguments,
)
from airflow_provider_tpu_rl.records.janitor_sources import discover_sources
from airflow_provider_tpu_rl.records.lease import ClusterLeaseHook, lease_object
from airflow_provider_tpu_rl.render import gke
from airflow_provider_tpu_rl.spec import GKE_DAG_ID
from tests.support.sandbox_run import REGION, SandboxRun

ORPHAN_SECONDS = 1800.0
LONG_AGO = datetime.now(UTC) - timedelta(hours=10)
# As a killed worker leaves a run once the scheduler has failed its task (no heartbeat): the DAG
# run still "running", nothing queued, scheduled, running or deferred.
CRASHED_TASKS: dict[str, str | None] = {
    "validate": "success",
    "ensure_bucket": "success",
    "deploy_cluster": "success",
    "convert_to_maxtext": "success",
    "train_rl": "failed",
    "export_hf": None,
    "destroy_cluster": None,
}


@dataclass
class MetadataStandIn:
    """What the metadata database says about DAG runs and their task instances."""

    dag_runs: dict[str, str] = field(default_factory=dict)
    tasks: dict[str, dict[str, str | None]] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)

    def dagrun_state(self, dag_id: str, run_id: str) -> str | None:
        self.asked.append(f"{dag_id}/{run_id}")
        return self.dag_runs.get(f"{dag_id}/{run_id}")

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None] | None:
        return dict(self.tasks.get(f"{dag_id}/{run_id}", {}))


def _bucket(sb: SandboxRun, **conf: Any) -> None:
    ensure = sb.operator(EnsureBucketOperator, task_id="ensure_bucket", conf=sb.gke_conf(**conf))
    ensure.execute(sb.context(ensure, sb.gke_conf(**conf)))


def _deploy(sb: SandboxRun, run_id: str, start: datetime | None = None, **conf: Any) -> None:
    config = sb.gke_conf(**conf)
    deploy = sb.operator(GclusterDeployOperator, task_id="deploy_cluster", conf=config, run_id=run_id)
    deploy.execute(sb.context(deploy, config, run_id=run_id, start_date=start))


def _exists(sb: SandboxRun, name: str, project: str | None = None) -> bool:
    record = sb.state("clusters").get(f"{project or sb.project}/{REGION}/{name}")
    return record is not None and record.get("exists", True) is not False


def _scan(sb: SandboxRun, now: float, runs: MetadataStandIn, **kwargs: Any) -> list[ManagedResource]:
    return find_expired_resources(
        GclusterHook(), sb.project, now, runs=runs, orphan_seconds=ORPHAN_SECONDS, **kwargs
    )


def _marker(sb: SandboxRun, name: str) -> dict[str, Any] | None:
    if orphan_marker_object(name) not in sb.objects(prefix="tpu-rl/janitor/"):
        return None
    value: dict[str, Any] = json.loads(sb.api.download(sb.bucket, orphan_marker_object(name)))
    return value


def test_a_crashed_runs_cluster_is_destroyed_once_it_has_been_orphaned_for_orphan_minutes(
    sb: SandboxRun,
) -> None:
    crashed = "manual__crashed"
    _bucket(sb)
    _deploy(sb, crashed)
    holder = f"{GKE_DAG_ID}/{crashed}"
    runs = MetadataStandIn({holder: "running"}, {holder: dict(CRASHED_TASKS)})
    t0 = time.time()

    # First sight: noted, not destroyed (the DAG run is "running": today's janitor stops here).
    assert _scan(sb, t0, runs) == []
    marker = _marker(sb, sb.cluster)
    assert marker is not None
    assert marker["holder"] == holder
    assert marker["first_seen"] == t0
    assert _scan(sb, t0 + ORPHAN_SECONDS - 1, runs) == []

    stale = _scan(sb, t0 + ORPHAN_SECONDS, runs)

    assert [(r.kind, r.name, r.holder) for r in stale] == [("cluster", sb.cluster, holder)]
    assert stale[0].reason.startswith(f"orphaned: its DAG run {holder} is running but none of its tasks")
    assert stale[0].lease_generation > 0  # judged by the lease the deploy took
    destroy_resource(GclusterHook(), stale[0], janitor_run_id="scheduled__test")
    assert not _exists(sb, sb.cluster)
    # The lease is released, the marker gone; the record and the bucket stay.
    assert ClusterLeaseHook().read(sb.bucket, sb.cluster) is None
    assert _marker(sb, sb.cluster) is None
    assert gke.resource_record_object(sb.cluster) in sb.objects()
    assert sb.bucket_exists()


def test_a_live_run_keeps_its_cluster_and_progress_restarts_the_orphan_clock(sb: SandboxRun) -> None:
    alive, slow = "manual__alive", "manual__slow"
    other = f"{sb.cluster}s"
    _bucket(sb)
    _deploy(sb, alive)
    _deploy(sb, slow, cluster_name=other)
    alive_holder, slow_holder = f"{GKE_DAG_ID}/{alive}", f"{GKE_DAG_ID}/{slow}"
    deferred = {**CRASHED_TASKS, "train_rl": "deferred"}
    between = {**CRASHED_TASKS, "train_rl": None}  # between two tasks: the next not scheduled yet
    runs = MetadataStandIn(
        {alive_holder: "running", slow_holder: "running"}, {alive_holder: deferred, slow_holder: between}
    )
    t0 = time.time()

    assert _scan(sb, t0, runs) == []
    assert _marker(sb, sb.cluster) is None  # a deferred task is alive: nothing noted
    assert _marker(sb, other) is not None
    # The slow run moved on between two scans that both fell between its tasks: not orphaned.
    runs.tasks[slow_holder] = {**between, "train_rl": "success"}  # export not scheduled yet
    assert _scan(sb, t0 + 10 * ORPHAN_SECONDS, runs) == []
    assert (_marker(sb, other) or {}).get("first_seen") == t0 + 10 * ORPHAN_SECONDS

    # The live run's task came back alive after a gap: its marker is dropped.
    runs.tasks[alive_holder] = between
    runs.tasks[slow_holder] = {**between, "train_rl": "success", "export_hf": "running"}
    assert _scan(sb, t0 + 11 * ORPHAN_SECONDS, runs) == []
    assert _marker(sb, sb.cluster) is not None
    runs.tasks[alive_holder] = deferred
    assert _scan(sb, t0 + 12 * ORPHAN_SECONDS, runs) == []
    assert _marker(sb, sb.cluster) is None
    assert _marker(sb, other) is None
    assert _exists(sb, sb.cluster)
    assert _exists(sb, other)


def test_an_orphaned_run_that_kept_its_cluster_leaves_it_to_its_expiry(sb: SandboxRun) -> None:
    crashed = "manual__kept"
    _bucket(sb)
    _deploy(sb, crashed, keep_cluster=True, max_cluster_hours=2)
    holder = f"{GKE_DAG_ID}/{crashed}"
    runs = MetadataStandIn({holder: "running"}, {holder: dict(CRASHED_TASKS)})
    t0 = time.time()

    assert _scan(sb, t0, runs) == []
    assert _scan(sb, t0 + ORPHAN_SECONDS + 1, runs) == []

    expires_at = json.loads(sb.api.download(sb.bucket, gke.resource_record_object(sb.cluster)))["expires_at"]
    stale = _scan(sb, expires_at + 1, runs)
    assert [(r.name, r.reason) for r in stale] == [
        (sb.cluster, f"expired at {datetime.fromtimestamp(expires_at, UTC).isoformat()}")
    ]


def test_the_janitor_destroys_only_the_lease_it_judged(sb: SandboxRun) -> None:
    """A lease written after the judgement (here: its holder renewed it) stops the destroy."""
    crashed = "manual__renewed"
    _bucket(sb)
    _deploy(sb, crashed)
    holder = f"{GKE_DAG_ID}/{crashed}"
    runs = MetadataStandIn({holder: "running"}, {holder: dict(CRASHED_TASKS)})
    t0 = time.time()
    _scan(sb, t0, runs)
    (stale,) = _scan(sb, t0 + ORPHAN_SECONDS, runs)
    leases = ClusterLeaseHook()
    lease = leases.read(sb.bucket, sb.cluster)
    assert lease is not None
    assert lease.generation == stale.lease_generation
    leases.renew(sb.bucket, lease, timedelta(hours=1))

    with pytest.raises(AirflowException, match="lease changed"):
        destroy_resource(GclusterHook(), stale)

    assert _exists(sb, sb.cluster)
    renewed = leases.read(sb.bucket, sb.cluster)
    assert renewed is not None
    assert renewed.holder == holder


def test_projects_named_only_in_a_bucket_record_or_the_ledger_are_scanned(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    other_project, other_bucket = f"{sb.project}-b", f"{sb.bucket}-b"
    ledger_project, ledger_bucket = f"{sb.project}-l", f"{sb.bucket}-l"
    _bucket(sb, project=other_project, bucket=other_bucket)
    _deploy(sb, "manual__far", LONG_AGO, project=other_project, bucket=other_bucket, max_cluster_hours=1)
    # A bucket the ledger names (a past run's conf), holding the record of a VM in a third project.
    _bucket(sb, project=ledger_project, bucket=ledger_bucket)
    write_resource_record(
        "google_cloud_default",
        ledger_bucket,
        f"{sb.vm}-l",
        {
            "kind": "vm",
            "name": f"{sb.vm}-l",
            "dag_id": "d",
            "run_id": "r",
            "conf": {"project": ledger_project},
        },
    )
    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", sqlite_connection_uri(tmp_path / "ledger.db"))
    RunLedger().record(
        RunRecord(
            dag_id=GKE_DAG_ID,
            airflow_run_id="manual__old",
            model="m",
            state="success",
            conf={"bucket": ledger_bucket, "project": ledger_project},
        )
    )
    monkeypatch.setenv("AIRFLOW__TPU_RL__JANITOR_BUCKETS", f"gs://{other_bucket}, ")

    sources = discover_sources([], gcp_conn_id="google_cloud_default")

    assert sources.buckets == [other_bucket, ledger_bucket]
    assert other_project in sources.projects
    assert ledger_project in sources.projects
    assert sources.projects[0] == "sandbox-project"  # the connection's project comes first
    assert sources.bucket_of(other_project, sb.cluster) == other_bucket
    # past the ten minutes a late deploy's lease holds the cluster beyond its label
    later = time.time() + LEASE_MIN_SECONDS + 1
    stale = find_expired_resources(GclusterHook(), other_project, later, sources=sources)
    assert [(r.name, r.project, r.bucket) for r in stale] == [(sb.cluster, other_project, other_bucket)]
    destroy_resource(GclusterHook(), stale[0])
    assert not _exists(sb, sb.cluster, other_project)
    assert lease_object(sb.cluster) not in sb.objects(other_bucket, prefix="tpu-rl/leases/")
    # Given projects: exactly those.
    assert discover_sources([sb.project], gcp_conn_id="google_cloud_default").projects == [sb.project]


def test_a_training_longer_than_its_label_keeps_the_cluster_while_its_lease_is_renewed(
    sb: SandboxRun,
) -> None:
    """The label says the cluster expired hours ago, but the run's train job is still running and
    its wait renews the lease: the janitor leaves the cluster; once the renewals stop, it goes."""
    long_run = "manual__long_training"
    _bucket(sb)
    _deploy(sb, long_run, LONG_AGO, max_cluster_hours=1)
    holder = f"{GKE_DAG_ID}/{long_run}"
    runs = MetadataStandIn({holder: "running"}, {holder: {"train": "deferred"}})
    renewed_until = time.time() + 3 * 3600  # what JobSetTrigger's keepalive does while the job runs
    assert ClusterLeaseHook().extend(sb.bucket, sb.cluster, holder=holder, until=renewed_until)

    assert _scan(sb, renewed_until - 60, runs) == []
    assert _exists(sb, sb.cluster)
    (stale,) = _scan(sb, renewed_until + 1, runs)
    expires_at = int(LONG_AGO.timestamp()) + 3600
    assert stale.reason == f"expired at {datetime.fromtimestamp(expires_at, UTC).isoformat()}"


def test_a_cluster_whose_bucket_and_records_were_deleted_is_still_found_by_its_labels(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """A run's bucket was deleted (records, lease and all) while its cluster lives on: the ledger
    still names the run's project, the janitor scans it and finds the cluster by its labels."""
    project, bucket = f"{sb.project}-g", f"{sb.bucket}-g"
    _bucket(sb, project=project, bucket=bucket)
    _deploy(sb, "manual__gone", LONG_AGO, project=project, bucket=bucket, max_cluster_hours=1)
    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", sqlite_connection_uri(tmp_path / "ledger.db"))
    RunLedger().record(
        RunRecord(
            dag_id=GKE_DAG_ID,
            airflow_run_id="manual__gone",
            model="m",
            state="failed",
            conf={"bucket": bucket, "project": project},
        )
    )
    for name in sb.objects(bucket):
        sb.api.delete(bucket, name)
    sb.api.delete_bucket(bucket)
    assert not sb.bucket_exists(bucket)

    sources = discover_sources([], gcp_conn_id="google_cloud_default")

    assert project in sources.projects
    stale = find_expired_resources(GclusterHook(), project, time.time(), sources=sources)
    expires_at = int(LONG_AGO.timestamp()) + 3600
    assert [(r.name, r.reason) for r in stale] == [
        (sb.cluster, f"expired at {datetime.fromtimestamp(expires_at, UTC).isoformat()}")
    ]


@pytest.mark.parametrize(
    ("recorded", "capacity"),
    [
        # before on-demand was a capacity: reservation capacity with none named deployed NO_RESERVATION
        ({"capacity": "reservation", "reservation": ""}, "on-demand"),
        # before capacity was recorded at all
        ({"reservation": ""}, "on-demand"),
        ({"reservation": "res-1"}, "reservation"),
        ({"capacity": "spot", "reservation": ""}, "spot"),
    ],
)
def test_the_janitor_reads_an_older_record_as_its_cluster_was_deployed(
    recorded: dict[str, Any], capacity: str
) -> None:
    """Records written by an earlier version must still destroy their cluster: none is refused."""
    cluster = {
        "project": "proj-123456",
        "region": REGION,
        "zone": f"{REGION}-b",
        "cluster_name": "old-run",
        "bucket": "bkt-123",
        **recorded,
    }
    spec = cluster_spec(recorded_cluster_arguments(cluster), "qwen3-30b-a3b")
    assert (spec.capacity, spec.reservation) == (capacity, recorded["reservation"])
