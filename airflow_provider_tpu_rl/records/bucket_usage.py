"""Who uses a bucket, and what in it is one run's: what ``delete_bucket`` may delete.

Runs share a bucket freely (each has its own cluster, run directories and records in it), so a
run asked to delete "its" bucket must not take another run's state with it. From the provider's
own objects in the bucket:

* ``tpu-rl/bucket.json``: the run whose ``ensure_bucket`` created the bucket (written only when
  the create succeeded, with ``ifGenerationMatch=0``);
* ``tpu-rl/leases/*.json``: the cluster leases (holder, expiry, kept);
* ``tpu-rl/resources/*.json``: the resource records of clusters and VMs (the run that made them);
* ``tpu-rl/run-dirs/*.json``: the run directories, the runs that wrote each and its writer claim.

:meth:`BucketUsage.survey` says which *other* runs still use the bucket (a live or kept lease, a
live writer claim, a record of a run not known to have ended), and what in it is this run's
alone: the run directories only this run wrote (with their records), its resource records, its
jobs' log cursors and janitor markers, the Terraform state of the cluster it destroyed. The whole
bucket is this run's only when this run created it and nothing in it names another run.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_tpu_rl.compat import AirflowNotFoundException
from airflow_provider_tpu_rl.exceptions import ConfigurationError
from airflow_provider_tpu_rl.maxtext.layout import RUN_DIR_PREFIX
from airflow_provider_tpu_rl.records.lease import LEASE_PREFIX, Lease, held_message, utc_text
from airflow_provider_tpu_rl.records.run_dirs import RunDirRecord

BUCKET_OWNER_OBJECT = "tpu-rl/bucket.json"
RESOURCE_PREFIX = "tpu-rl/resources/"
LOG_CURSOR_PREFIX = "tpu-rl/log-cursors/"
ORPHAN_PREFIX = "tpu-rl/janitor/orphans/"
WRITE_CHECK_PREFIX = "tpu-rl/write-checks/"
GCS_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class BucketUse:
    """What a survey of the bucket found, for one run."""

    bucket: str
    others: tuple[str, ...] = ()  # one line per other run still using the bucket
    own: tuple[str, ...] = ()  # object names and folder prefixes (``…/``) only this run wrote
    whole: bool = False  # the whole bucket is provably this run's

    @property
    def in_use(self) -> bool:
        return bool(self.others)

    def refusal(self) -> str:
        """The one line saying why nothing is deleted."""
        more = f" (and {len(self.others) - 1} more)" if len(self.others) > 1 else ""
        return f"delete_bucket: gs://{self.bucket} is still used: {self.others[0]}{more}; nothing was deleted"


@dataclass
class _Survey:
    others: list[str] = field(default_factory=list)
    own: list[str] = field(default_factory=list)
    foreign: bool = False  # something in the bucket names another run


class BucketUsage:
    """Reads the provider's objects in a bucket through the google provider's ``GCSHook``.

    :param gcp_conn_id: the GCP connection.
    :param impersonation_chain: service account(s) to impersonate.
    """

    def __init__(self, gcp_conn_id: str = "google_cloud_default", impersonation_chain: Any = None) -> None:
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = impersonation_chain
        self._client: Any = None

    def _bucket(self, bucket: str) -> Any:
        if self._client is None:
            from airflow_provider_tpu_rl.hooks.credentials import gcs_hook

            try:
                hook = gcs_hook(self.gcp_conn_id, self.impersonation_chain)
            except AirflowNotFoundException:
                raise ConfigurationError(
                    f"connection {self.gcp_conn_id} is not defined: gs://{bucket} cannot be read"
                ) from None
            self._client = hook.get_conn()
        return self._client.bucket(bucket)

    def record_creator(self, bucket: str, run: str) -> bool:
        """Record ``run`` as the bucket's creator, only if nobody is recorded yet."""
        from google.api_core.exceptions import PreconditionFailed

        body = json.dumps({"created_by": run, "created": utc_text(time.time())}, sort_keys=True)
        try:
            self._bucket(bucket).blob(BUCKET_OWNER_OBJECT).upload_from_string(
                body, content_type="application/json", if_generation_match=0, timeout=GCS_TIMEOUT_S
            )
        except PreconditionFailed:
            return False
        return True

    def check_writable(self, bucket: str) -> None:
        """Raise :class:`ConfigurationError` (one line naming the bucket) unless this connection
        can create and delete objects in ``bucket``: what a run does there (its leases, records and
        run directories are created, replaced and deleted).

        A real write, not a question: a new marker object under ``tpu-rl/write-checks/`` (a fresh
        random name, uploaded with ``ifGenerationMatch=0`` so it can never replace an object),
        deleted at once with ``ifGenerationMatch`` of the generation just written (so only that
        marker goes). Cloud Storage authorizes both as it will the run's own writes, with every
        cause of a refusal at once: IAM, the bucket's retention policy, VPC Service Controls.
        ``Bucket.test_iam_permissions`` would answer for IAM only, and the GCS emulator the sandbox
        runs (fake-gcs-server) has no ``iam/testPermissions`` route to test it against. A marker
        whose delete is refused stays (it is empty); the refusal says why.
        """
        from google.api_core.exceptions import Forbidden, NotFound, PreconditionFailed

        blob = self._bucket(bucket).blob(f"{WRITE_CHECK_PREFIX}{uuid.uuid4().hex}")
        try:
            blob.upload_from_string(b"", if_generation_match=0, timeout=GCS_TIMEOUT_S)
            blob.delete(if_generation_match=blob.generation, timeout=GCS_TIMEOUT_S)
        except (NotFound, PreconditionFailed):
            return  # authorized (GCS checks access first); someone else's doing since: not ours to judge
        except Forbidden as err:
            reason = " ".join(str(err.message or err).split())[:300]
            raise ConfigurationError(
                f"gs://{bucket}: the bucket is this project's, but connection {self.gcp_conn_id} cannot "
                f"write to it (Cloud Storage: {reason}): grant it roles/storage.objectAdmin on the "
                "bucket, or set bucket to one it can write to"
            ) from None

    def _json(self, blob: Any) -> Any:
        from google.api_core.exceptions import NotFound

        try:
            return json.loads(blob.download_as_bytes(timeout=GCS_TIMEOUT_S))
        except NotFound:
            return None
        except ValueError:
            return None

    def _names(self, bucket: str, prefix: str) -> list[str]:
        return [blob.name for blob in self._bucket(bucket).list_blobs(prefix=prefix, timeout=GCS_TIMEOUT_S)]

    def exists(self, bucket: str, prefix: str) -> bool:
        """Whether any object is named ``prefix`` or lies under it."""
        blobs = self._bucket(bucket).list_blobs(prefix=prefix, max_results=1, timeout=GCS_TIMEOUT_S)
        return any(True for _ in blobs)

    def survey(
        self,
        bucket: str,
        run: str,
        *,
        finished: Callable[[str], bool],
        run_suffix: str,
        state_prefixes: Sequence[str] = (),
    ) -> BucketUse:
        """Who else uses ``bucket``, and what in it is ``run``'s alone.

        ``finished(other_run)`` says whether a DAG run is known to have ended; ``run_suffix`` marks
        this run's job names (log cursors); ``state_prefixes`` are Terraform state folders of the
        cluster this run destroyed.
        """
        found = _Survey()
        self._leases(bucket, run, finished, found)
        self._resources(bucket, run, finished, found)
        self._run_dirs(bucket, run, finished, found)
        cursor = re.compile(
            rf"^{re.escape(LOG_CURSOR_PREFIX)}[a-z0-9-]*-{re.escape(run_suffix)}-[A-Za-z0-9-]+\.json$"
        )
        found.own += [name for name in self._names(bucket, LOG_CURSOR_PREFIX) if cursor.match(name)]
        found.own += [prefix for prefix in state_prefixes if self.exists(bucket, prefix)]
        owner = self._json(self._bucket(bucket).blob(BUCKET_OWNER_OBJECT))
        created_by = owner.get("created_by") if isinstance(owner, dict) else None
        whole = created_by == run and not found.foreign and not found.others
        if not whole and created_by == run:
            found.own.append(BUCKET_OWNER_OBJECT)
        return BucketUse(bucket, tuple(dict.fromkeys(found.others)), tuple(dict.fromkeys(found.own)), whole)

    def _leases(self, bucket: str, run: str, finished: Callable[[str], bool], found: _Survey) -> None:
        for blob in self._bucket(bucket).list_blobs(prefix=LEASE_PREFIX, timeout=GCS_TIMEOUT_S):
            cluster = blob.name[len(LEASE_PREFIX) :].removesuffix(".json")
            text = blob.download_as_bytes(timeout=GCS_TIMEOUT_S)
            lease = Lease.parse(text, int(blob.generation or 0), cluster)
            if lease.holder == run or not lease.dag_id:
                continue
            found.foreign = True
            if lease.kept:
                found.others.append(
                    f"{held_message(lease).split(' is in use')[0]} is kept by run {lease.holder}"
                )
            elif not lease.expired() and not finished(lease.holder):
                found.others.append(held_message(lease))

    def _resources(self, bucket: str, run: str, finished: Callable[[str], bool], found: _Survey) -> None:
        for blob in self._bucket(bucket).list_blobs(prefix=RESOURCE_PREFIX, timeout=GCS_TIMEOUT_S):
            record = self._json(blob)
            if not isinstance(record, dict):
                continue
            holder = f"{record.get('dag_id')}/{record.get('run_id')}"
            name = str(record.get("name") or blob.name)
            if holder == run:
                found.own.append(blob.name)
                found.own.append(f"{ORPHAN_PREFIX}{name}.json")
                continue
            found.foreign = True
            if not finished(holder):
                found.others.append(f"the {record.get('kind', 'resource')} {name} of run {holder}")

    def _run_dirs(self, bucket: str, run: str, finished: Callable[[str], bool], found: _Survey) -> None:
        for blob in self._bucket(bucket).list_blobs(prefix=RUN_DIR_PREFIX, timeout=GCS_TIMEOUT_S):
            text = blob.download_as_bytes(timeout=GCS_TIMEOUT_S)
            document = json.loads(text) if text else {}
            directory = str((document or {}).get("directory") or "")
            record = RunDirRecord.parse(directory, text, int(blob.generation or 0))
            writer = record.writer
            if writer is not None and writer.run != run and not writer.expired() and not finished(writer.run):
                found.others.append(f"job {writer.job} of run {writer.run} writes {record.directory}")
            if set(record.runs) - {run}:
                found.foreign = True
                continue
            if record.runs and record.directory.startswith(f"gs://{bucket}/"):
                found.own += [record.directory[len(f"gs://{bucket}/") :], blob.name]


def existing(names: Iterable[str], usage: BucketUsage, bucket: str) -> list[str]:
    """The names (objects or ``…/`` folders) that have at least one object."""
    return [name for name in names if usage.exists(bucket, name)]
