"""``ClusterLeaseHook`` against the real fake-gcs-server emulator (it honours ifGenerationMatch)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import timedelta

import pytest

from airflow_provider_tpu_rl.exceptions import ConfigurationError, LeaseHeldError, LeaseLostError, TpuRlError
from airflow_provider_tpu_rl.records.lease import (
    LEASE_PREFIX,
    ClusterLeaseHook,
    Lease,
    lease_object,
)
from tests.support.gcs_emulator import EMULATOR_BUCKET, GcsEmulator

pytestmark = pytest.mark.usefixtures("gcs_emulator")
BUCKET = EMULATOR_BUCKET

HOUR = timedelta(hours=1)


@pytest.fixture
def cluster() -> str:
    return f"c-{uuid.uuid4().hex[:10]}"


def stored(cluster: str) -> dict[str, object] | None:
    from google.api_core.exceptions import NotFound
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    blob = storage.Client(project="p", credentials=AnonymousCredentials()).bucket(BUCKET)
    try:
        return dict(json.loads(blob.blob(lease_object(cluster)).download_as_bytes()))
    except NotFound:
        return None


def test_object_name() -> None:
    assert lease_object("tpu-rl") == "tpu-rl/leases/tpu-rl.json"
    assert lease_object("x").startswith(LEASE_PREFIX)
    assert issubclass(LeaseHeldError, TpuRlError)


def test_holder_and_expiry() -> None:
    lease = Lease("c", "dag", "run1", expires_at=100.0, generation=5)
    assert lease.holder == "dag/run1"
    assert lease.expired(100.0)
    assert not lease.expired(99.0)
    assert not lease.kept


def test_acquire_read_renew_release(cluster: str) -> None:
    hook = ClusterLeaseHook()
    bucket = BUCKET
    assert hook.read(bucket, cluster) is None
    lease = hook.acquire(bucket, cluster, dag_id="d", run_id="r1", ttl=HOUR)
    assert lease.generation > 0
    assert lease.holder == "d/r1"
    assert hook.read(bucket, cluster) == lease
    assert stored(cluster)["run_id"] == "r1"  # type: ignore[index]

    again = hook.acquire(bucket, cluster, dag_id="d", run_id="r1", ttl=2 * HOUR)  # same run: renewed
    assert again.generation != lease.generation
    assert again.expires_at > lease.expires_at
    renewed = hook.renew(bucket, again, timedelta(minutes=1))  # never shortens the expiry
    assert renewed.expires_at == again.expires_at

    with pytest.raises(LeaseLostError):  # a stale read cannot renew
        hook.renew(bucket, Lease(cluster, "d", "r0", time.time() + 60, lease.generation), HOUR)

    hook.release(bucket, renewed)
    assert hook.read(bucket, cluster) is None
    hook.release(bucket, renewed)  # already gone: nothing to do


def test_live_lease_of_another_run_is_refused(cluster: str) -> None:
    hook = ClusterLeaseHook()
    bucket = BUCKET
    first = hook.acquire(bucket, cluster, dag_id="d", run_id="r1", ttl=HOUR)
    with pytest.raises(LeaseHeldError) as raised:
        hook.acquire(bucket, cluster, dag_id="d", run_id="r2", ttl=HOUR)
    assert str(raised.value).startswith(f"cluster {cluster} is in use by run d/r1 until ")
    assert str(raised.value).endswith(" UTC")
    # the loser never releases the winner's lease
    hook.release(bucket, Lease(cluster, "d", "r2", time.time() + 60, first.generation))
    assert hook.read(bucket, cluster) == first


def test_expired_and_kept_leases_are_taken_over(cluster: str) -> None:
    hook = ClusterLeaseHook()
    bucket = BUCKET
    expired = hook.acquire(bucket, cluster, dag_id="d", run_id="r1", ttl=timedelta(seconds=-1))
    taken = hook.acquire(bucket, cluster, dag_id="d", run_id="r2", ttl=HOUR)
    assert taken.holder == "d/r2"
    assert taken.generation != expired.generation

    hook.release(bucket, taken, keep=True)
    kept = hook.read(bucket, cluster)
    assert kept is not None
    assert kept.kept
    assert kept.holder == "d/r2"
    later = hook.acquire(bucket, cluster, dag_id="d", run_id="r3", ttl=HOUR)
    assert later.holder == "d/r3"
    assert not later.kept
    # the earlier holder's stale lease cannot release or renew the new one
    hook.release(bucket, taken)
    assert hook.read(bucket, cluster) == later


def test_two_racing_acquires_exactly_one_wins(cluster: str) -> None:
    bucket = BUCKET
    runs = [f"r{i}" for i in range(6)]
    start = threading.Barrier(len(runs))
    won: list[Lease] = []
    refused: list[str] = []

    def contend(run_id: str) -> None:
        hook = ClusterLeaseHook()
        hook.read(bucket, "warm-up")  # connect before the barrier
        start.wait(timeout=30)
        try:
            won.append(hook.acquire(bucket, cluster, dag_id="d", run_id=run_id, ttl=HOUR))
        except LeaseHeldError as err:
            refused.append(str(err))

    threads = [threading.Thread(target=contend, args=(r,)) for r in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(won) == 1, (won, refused)
    assert len(refused) == len(runs) - 1
    assert all(f"in use by run {won[0].holder} until" in m for m in refused)
    assert stored(cluster)["run_id"] == won[0].run_id  # type: ignore[index]


def test_damaged_object_reads_as_expired(cluster: str) -> None:
    GcsEmulator(url="", bucket_name=BUCKET).upload([lease_object(cluster)], b"not json")
    hook = ClusterLeaseHook()
    damaged = hook.read(BUCKET, cluster)
    assert damaged is not None
    assert damaged.expired()
    assert hook.acquire(BUCKET, cluster, dag_id="d", run_id="r", ttl=HOUR).holder == "d/r"


def test_extend_pushes_only_the_holders_live_lease(cluster: str) -> None:
    hook = ClusterLeaseHook()
    lease = hook.acquire(BUCKET, cluster, dag_id="d", run_id="r1", ttl=HOUR)
    later = time.time() + 5 * 3600
    assert hook.extend(BUCKET, cluster, holder="d/r1", until=later) is True
    extended = hook.read(BUCKET, cluster)
    assert extended is not None
    assert extended.expires_at == pytest.approx(later)
    assert hook.extend(BUCKET, cluster, holder="d/r1", until=lease.expires_at) is True  # never shortened
    assert hook.read(BUCKET, cluster) == extended
    assert hook.extend(BUCKET, cluster, holder="d/r2", until=later + 60) is False  # another run's
    hook.release(BUCKET, extended, keep=True)
    assert hook.extend(BUCKET, cluster, holder="d/r1", until=later + 60) is False  # handed over


def test_an_undefined_connection_is_a_configuration_error_naming_it(cluster: str) -> None:
    """Without its GCS connection a teardown cannot know whether it holds the cluster: one line, no
    retry (the destroy then destroys nothing: tests/operators/test_gke.py)."""
    with pytest.raises(ConfigurationError) as refused:
        ClusterLeaseHook(gcp_conn_id="tpu_rl_no_such_connection").read(BUCKET, cluster)
    assert str(refused.value) == (
        f"connection tpu_rl_no_such_connection is not defined: the cluster lease "
        f"(gs://{BUCKET}/{lease_object(cluster)}) cannot be read"
    )
