"""Cluster lease: one run at a time uses a named GKE cluster.

The lease is the object ``gs://BUCKET/tpu-rl/leases/CLUSTER.json``. It is created with the
``ifGenerationMatch=0`` precondition (GCS's atomic create), so of two runs racing for a free
cluster exactly one wins; every later write or delete names the generation it read, so a run
never overwrites a lease it did not read. A precondition failure (HTTP 412) means another writer
got there first: the hook re-reads the lease and decides again.

The lease holds the run (``dag_id``/``run_id``), an expiry (epoch seconds) and ``kept``: a run that
ends with ``keep_cluster`` hands the cluster over (``kept=True``); a later run naming the cluster
takes it over, as it does an expired lease.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow_provider_tpu_rl.compat import AirflowNotFoundException
from airflow_provider_tpu_rl.exceptions import ConfigurationError, LeaseHeldError, LeaseLostError, TpuRlError

if TYPE_CHECKING:
    from google.cloud.storage import Blob

__all__ = ["LEASE_PREFIX", "ClusterLeaseHook", "Lease", "LeaseHeldError", "LeaseLostError", "lease_object"]

LEASE_PREFIX = "tpu-rl/leases/"
# Seconds for one GCS request (each call passes it as ``timeout``).
GCS_TIMEOUT_S = 60.0
# Re-read-and-decide rounds after a precondition failure before giving up.
MAX_ROUNDS = 8


# A TPU VM's lease is named ``vms/<vm>``: a GKE cluster name has no "/", so the two never collide.
VM_LEASE_PREFIX = "vms/"


def lease_object(cluster_name: str) -> str:
    """The lease object's name in the run's bucket (``vms/<name>`` for a TPU VM)."""
    return f"{LEASE_PREFIX}{cluster_name}.json"


def vm_lease_name(vm_name: str) -> str:
    """The lease name of a TPU VM."""
    return f"{VM_LEASE_PREFIX}{vm_name}"


def _what(name: str) -> str:
    return f"TPU VM {name[len(VM_LEASE_PREFIX) :]}" if name.startswith(VM_LEASE_PREFIX) else f"cluster {name}"


def utc_text(epoch: float) -> str:
    """``2026-12-01 17:00 UTC`` for an epoch time."""
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%d %H:%M UTC")


def read_generation(blob_of: Callable[[], Any], changing: TpuRlError) -> tuple[bytes, int] | None:
    """An object's content and the generation it was read at, both of one write (the download
    names the generation ``reload`` saw; an object rewritten between the two is read again, at most
    ``MAX_ROUNDS`` times, then ``changing`` is raised); None when there is no object. ``blob_of``
    gives a fresh blob handle each round. The lease, the run directories' records and the grants'
    holders are read this way."""
    from google.api_core.exceptions import NotFound, PreconditionFailed

    for _ in range(MAX_ROUNDS):
        blob = blob_of()
        try:
            blob.reload(timeout=GCS_TIMEOUT_S)
            generation = int(blob.generation or 0)
            return blob.download_as_bytes(if_generation_match=generation, timeout=GCS_TIMEOUT_S), generation
        except NotFound:
            return None
        except PreconditionFailed:
            continue  # rewritten between the two calls: read again
    raise changing


@dataclass(frozen=True)
class Lease:
    """One read of a cluster's lease object."""

    cluster: str
    dag_id: str
    run_id: str
    expires_at: float  # epoch seconds
    generation: int  # GCS object generation of the read
    kept: bool = False  # keep_cluster: handed to a later run

    @property
    def holder(self) -> str:
        """``<dag_id>/<run_id>``."""
        return f"{self.dag_id}/{self.run_id}"

    def expired(self, now: float | None = None) -> bool:
        """Whether the expiry has passed."""
        return (time.time() if now is None else now) >= self.expires_at

    def payload(self) -> str:
        """The object's JSON text (the generation is the object's, not in the text)."""
        body = {
            "cluster": self.cluster,
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "expires_at": self.expires_at,
            "expires": utc_text(self.expires_at),
            "kept": self.kept,
        }
        return json.dumps(body, sort_keys=True)

    @classmethod
    def parse(cls, text: str | bytes, generation: int, cluster: str) -> Lease:
        """Parse the object's text; a damaged object reads as an expired lease of nobody."""
        try:
            body: Any = json.loads(text)
            return cls(
                cluster=str(body.get("cluster") or cluster),
                dag_id=str(body["dag_id"]),
                run_id=str(body["run_id"]),
                expires_at=float(body["expires_at"]),
                generation=generation,
                kept=bool(body.get("kept", False)),
            )
        except (ValueError, TypeError, KeyError, AttributeError):
            return cls(cluster=cluster, dag_id="", run_id="", expires_at=0.0, generation=generation)


def held_message(lease: Lease) -> str:
    """``cluster X is in use by run Y until <UTC time>``."""
    return f"{_what(lease.cluster)} is in use by run {lease.holder} until {utc_text(lease.expires_at)}"


def _not_found(exc: BaseException) -> bool:
    from google.api_core.exceptions import NotFound

    response = getattr(exc, "response", None)
    return isinstance(exc, NotFound) or getattr(response, "status_code", None) == 404


def _precondition_failed(exc: BaseException) -> bool:
    from google.api_core.exceptions import PreconditionFailed

    return isinstance(exc, PreconditionFailed)


class ClusterLeaseHook:
    """Reads, takes, renews and releases cluster leases through the google provider's ``GCSHook``."""

    def __init__(self, gcp_conn_id: str = "google_cloud_default", impersonation_chain: Any = None) -> None:
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = impersonation_chain
        self._client: Any = None

    def _blob(self, bucket: str, cluster: str) -> Blob:
        if self._client is None:
            from airflow_provider_tpu_rl.hooks.credentials import gcs_hook

            try:
                hook = gcs_hook(self.gcp_conn_id, self.impersonation_chain)
            except AirflowNotFoundException:
                raise ConfigurationError(
                    f"connection {self.gcp_conn_id} is not defined: the cluster lease "
                    f"(gs://{bucket}/{lease_object(cluster)}) cannot be read"
                ) from None
            self._client = hook.get_conn()
        return self._client.bucket(bucket).blob(lease_object(cluster))

    def read(self, bucket: str, cluster: str) -> Lease | None:
        """The cluster's lease, or ``None`` when nobody holds one."""
        changing = LeaseLostError(f"cluster {cluster}: the lease keeps changing while it is read")
        found = read_generation(lambda: self._blob(bucket, cluster), changing)
        return None if found is None else Lease.parse(found[0], found[1], cluster)

    def _write(self, bucket: str, lease: Lease, if_generation_match: int) -> Lease:
        """Write ``lease`` if the object's generation is ``if_generation_match``; the new read.

        A bucket that does not exist is a :class:`ConfigurationError` in one line: an upload to it
        answers 404 (``NotFound``, or google-resumable-media's ``InvalidResponse`` where the
        storage client lets it through), which reads like a missing object.
        """
        blob = self._blob(bucket, lease.cluster)
        try:
            blob.upload_from_string(
                lease.payload(),
                content_type="application/json",
                if_generation_match=if_generation_match,
                timeout=GCS_TIMEOUT_S,
            )
        except Exception as exc:
            if _not_found(exc):
                raise ConfigurationError(
                    f"bucket gs://{bucket} does not exist: the lease of {_what(lease.cluster)} cannot be "
                    "written (create the bucket first, e.g. with EnsureBucketOperator)"
                ) from None
            raise
        return replace(lease, generation=int(blob.generation or 0))

    def acquire(self, bucket: str, cluster: str, *, dag_id: str, run_id: str, ttl: timedelta) -> Lease:
        """Take the cluster's lease for this run (or renew it when this run holds it).

        A free cluster is taken with ``ifGenerationMatch=0``; an expired or kept lease of another
        run is taken over with ``ifGenerationMatch=<its generation>``; a live lease of another run
        raises :class:`LeaseHeldError`.
        """
        for _ in range(MAX_ROUNDS):
            current = self.read(bucket, cluster)
            now = time.time()
            wanted = Lease(cluster, dag_id, run_id, now + ttl.total_seconds(), 0)
            try:
                if current is None:
                    return self._write(bucket, wanted, 0)
                if current.holder == wanted.holder:
                    return self.renew(bucket, current, ttl)
                if current.kept or current.expired(now):
                    return self._write(bucket, wanted, current.generation)
            except Exception as exc:
                if _precondition_failed(exc):
                    continue  # another run wrote first: read again and decide
                raise
            raise LeaseHeldError(held_message(current))
        raise LeaseLostError(f"cluster {cluster}: the lease keeps changing while it is taken")

    def renew(self, bucket: str, lease: Lease, ttl: timedelta) -> Lease:
        """Push the expiry to at least ``now + ttl`` (never earlier); ``kept`` is cleared."""
        current = lease
        for _ in range(MAX_ROUNDS):
            expires = max(current.expires_at, time.time() + ttl.total_seconds())
            try:
                return self._write(
                    bucket, replace(current, expires_at=expires, kept=False), current.generation
                )
            except Exception as exc:
                if not _precondition_failed(exc):
                    raise
            latest = self.read(bucket, lease.cluster)
            if latest is None or latest.holder != lease.holder:
                raise LeaseLostError(lost_message(lease, latest))
            current = latest
        raise LeaseLostError(f"cluster {lease.cluster}: the lease keeps changing while it is renewed")

    def extend(self, bucket: str, cluster: str, *, holder: str, until: float) -> bool:
        """Push the lease of ``holder`` (``<dag_id>/<run_id>``) to at least ``until`` while one of
        its jobs runs; False (nothing written) when ``holder`` does not hold it."""
        for _ in range(MAX_ROUNDS):
            current = self.read(bucket, cluster)
            if current is None or current.holder != holder or current.kept:
                return False
            if current.expires_at >= until:
                return True
            try:
                self._write(bucket, replace(current, expires_at=until), current.generation)
                return True
            except Exception as exc:
                if not _precondition_failed(exc):
                    raise
        raise LeaseLostError(f"cluster {cluster}: the lease keeps changing while it is extended")

    def release(self, bucket: str, lease: Lease, *, keep: bool = False) -> None:
        """Delete the lease (``keep=True``: mark it kept, for a later run to take over).

        The object is read first: a lease that another run holds by now (taken over after it
        expired) is left alone; the delete names the generation read.
        """
        from google.api_core.exceptions import NotFound

        for _ in range(MAX_ROUNDS):
            current = self.read(bucket, lease.cluster)
            if current is None or current.holder != lease.holder:
                return
            try:
                if keep:
                    self._write(
                        bucket, replace(current, kept=True, expires_at=time.time()), current.generation
                    )
                else:
                    self._blob(bucket, lease.cluster).delete(
                        if_generation_match=current.generation, timeout=GCS_TIMEOUT_S
                    )
                return
            except NotFound:
                return
            except Exception as exc:
                if not _precondition_failed(exc):
                    raise
        raise LeaseLostError(f"cluster {lease.cluster}: the lease keeps changing while it is released")


def lost_message(lease: Lease, latest: Lease | None) -> str:
    """Why a renewal failed: the lease is gone or another run holds it."""
    if latest is None:
        return f"cluster {lease.cluster}: the lease of run {lease.holder} was released or removed"
    return f"cluster {lease.cluster}: run {lease.holder} lost its lease; {held_message(latest)}"
