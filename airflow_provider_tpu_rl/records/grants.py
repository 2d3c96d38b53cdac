"""The IAM bindings a run's resources add, and who still holds each one.

A cluster or VM (its resource record's name: the *holder*) needs bindings while it exists: its
service accounts' ``secretAccessor`` on the HF token secret, ``storage.objectAdmin`` on the bucket.
Two places in the run's bucket keep them, both written before the binding is added, so a crash or
a cleared DAG run (its XCom gone) loses nothing:

* the holder's resource record (``tpu-rl/resources/<name>.json``, key ``grants``): what its
  teardown (the run's, or the janitor's) lets go of;
* one object per binding (``tpu-rl/grants/<key>.json``): its holders, and whether the binding
  existed before the first of them read the policy (``preexisting``: then it is nobody's and never
  removed). Every write names the generation it read (as the lease does), so two holders never
  lose each other.

A binding is removed when its last holder lets go and it was not pre-existing; a holder that came
meanwhile gets it back. A bucket's binding has its holders in that bucket. A secret is the
project's: runs of other buckets may hold the same binding, so the holders recorded in every bucket
this Airflow knows (``[tpu_rl] janitor_buckets`` and the ledger's, as the janitor reads them) count
too, and a binding one of them holds is neither pre-existing nor removed. A run of another Airflow
whose bucket this one does not know is not seen (docs/run-safety.md says how to keep them apart).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from airflow_provider_tpu_rl.exceptions import LeaseLostError
from airflow_provider_tpu_rl.records.lease import read_generation
from airflow_provider_tpu_rl.records.resources import read_resource_record, write_resource_record
from airflow_provider_tpu_rl.render import gke
from airflow_provider_tpu_rl.render.command import Command
from airflow_provider_tpu_rl.spec.preflight import parse_json_document

if TYPE_CHECKING:
    from airflow_provider_tpu_rl.hooks.gcluster import GclusterHook

GRANTS_PREFIX = "tpu-rl/grants/"
GCS_TIMEOUT_S = 60.0
MAX_ROUNDS = 8

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Binding:
    """One unconditional IAM binding on a secret (``kind`` ``secret``) or a bucket (``bucket``)."""

    kind: str
    project: str  # the secret's project (a bucket's: not needed to name it)
    name: str  # secret id or bucket name
    role: str
    member: str  # e.g. ``serviceAccount:sa@p.iam.gserviceaccount.com``

    @property
    def key(self) -> str:
        """The binding's registry object name (stable, free of ``/``)."""
        text = "\x00".join((self.kind, self.project if self.kind == "secret" else "", self.name))
        return hashlib.sha256(f"{text}\x00{self.role}\x00{self.member}".encode()).hexdigest()[:24]

    def text(self) -> str:
        where = f"secret {self.project}/{self.name}" if self.kind == "secret" else f"gs://{self.name}"
        return f"{self.role} for {self.member} on {where}"

    def add(self) -> Command:
        return Command(
            gke.iam_binding_argv("add", self.kind, self.project, self.name, self.member, self.role),
            description=f"grant {self.text()}",
        )

    def remove(self) -> Command:
        return gke.remove_iam_binding(self.kind, self.project, self.name, self.member, self.role)

    @classmethod
    def parse(cls, value: Any) -> Binding | None:
        """A binding from a record's JSON; ``None`` when it is not one."""
        if not isinstance(value, dict):
            return None
        fields = {k: value.get(k) for k in ("kind", "project", "name", "role", "member")}
        if not all(isinstance(v, str) for v in fields.values()) or fields["kind"] not in ("secret", "bucket"):
            return None
        return cls(**{k: str(v) for k, v in fields.items()})


def grant_object(binding: Binding) -> str:
    """Where a binding's holders are kept in the bucket."""
    return f"{GRANTS_PREFIX}{binding.key}.json"


def policy_members(lines: Sequence[str], role: str) -> set[str]:
    """The members bound to ``role`` unconditionally in a ``get-iam-policy --format=json`` output."""
    policy = parse_json_document(lines) or {}
    return {
        str(member)
        for entry in policy.get("bindings") or []
        if isinstance(entry, dict) and entry.get("role") == role and not entry.get("condition")
        for member in entry.get("members") or []
    }


@dataclass(frozen=True)
class Holds:
    """One read of a binding's registry object (``generation`` 0: there is none)."""

    holders: tuple[str, ...]
    preexisting: bool
    generation: int


class GrantRegistry:
    """The per-binding holder objects, through the google provider's GCS client."""

    def __init__(self, gcp_conn_id: str, impersonation_chain: Any = None) -> None:
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = impersonation_chain
        self._client: Any = None

    def _blob(self, bucket: str, binding: Binding) -> Any:
        if self._client is None:
            from airflow_provider_tpu_rl.hooks.credentials import gcs_hook

            self._client = gcs_hook(self.gcp_conn_id, self.impersonation_chain).get_conn()
        return self._client.bucket(bucket).blob(grant_object(binding))

    def read(self, bucket: str, binding: Binding) -> Holds:
        changing = LeaseLostError(f"{binding.text()}: its holders keep changing while they are read")
        found = read_generation(lambda: self._blob(bucket, binding), changing)
        if found is None:
            return Holds((), False, 0)
        raw, generation = found
        try:
            body = json.loads(raw)
        except ValueError:
            body = {}
        body = body if isinstance(body, dict) else {}
        holders = tuple(str(h) for h in body.get("holders") or [] if isinstance(h, str))
        return Holds(holders, bool(body.get("preexisting")), generation)

    def _write(self, bucket: str, binding: Binding, holds: Holds, holders: Sequence[str], pre: bool) -> None:
        blob = self._blob(bucket, binding)
        if not holders:
            blob.delete(if_generation_match=holds.generation, timeout=GCS_TIMEOUT_S)
            return
        body = {"binding": asdict(binding), "holders": sorted(holders), "preexisting": pre}
        blob.upload_from_string(
            json.dumps(body, sort_keys=True),
            content_type="application/json",
            if_generation_match=holds.generation,
            timeout=GCS_TIMEOUT_S,
        )

    def hold(self, bucket: str, binding: Binding, holder: str, present: Callable[[], bool]) -> bool:
        """Add ``holder``; whether the binding is pre-existing (the first holder reads the policy
        through ``present``, before anything of this run adds it)."""
        from google.api_core.exceptions import PreconditionFailed

        for _ in range(MAX_ROUNDS):
            holds = self.read(bucket, binding)
            if holder in holds.holders:
                return holds.preexisting
            pre = holds.preexisting if holds.holders else present()
            try:
                self._write(bucket, binding, holds, [*holds.holders, holder], pre)
                return pre
            except PreconditionFailed:
                continue
        raise LeaseLostError(f"{binding.text()}: its holders keep changing while {holder} is added")

    def release(self, bucket: str, binding: Binding, holder: str) -> Holds | None:
        """Drop ``holder``; the holds left (``None``: it held nothing)."""
        from google.api_core.exceptions import NotFound, PreconditionFailed

        for _ in range(MAX_ROUNDS):
            holds = self.read(bucket, binding)
            if holder not in holds.holders:
                return None
            left = tuple(h for h in holds.holders if h != holder)
            try:
                self._write(bucket, binding, holds, left, holds.preexisting)
                return Holds(left, holds.preexisting, 0)
            except NotFound:
                return None
            except PreconditionFailed:
                continue
        raise LeaseLostError(f"{binding.text()}: its holders keep changing while {holder} is removed")


def recorded_grants(record: dict[str, Any] | None) -> list[Binding]:
    """The bindings a resource record says its resource holds."""
    found = [Binding.parse(item) for item in (record or {}).get("grants") or []]
    return [b for b in found if b is not None]


def _with_grants(record: dict[str, Any], bindings: Sequence[Binding]) -> dict[str, Any]:
    unique = {b.key: b for b in bindings}
    return {**record, "grants": [asdict(b) for _, b in sorted(unique.items())]}


class RunGrants:
    """Add and take back the bindings a resource (its record's name) needs."""

    def __init__(self, hook: GclusterHook, gcp_conn_id: str, impersonation_chain: Any = None) -> None:
        self.hook = hook
        self.gcp_conn_id = gcp_conn_id
        self.chain = impersonation_chain
        self.registry = GrantRegistry(gcp_conn_id, impersonation_chain)

    def _present(self, binding: Binding) -> bool:
        command = gke.iam_policy_command(binding.kind, binding.project, binding.name)
        result = self.hook.run_checked(command, log_output=False)
        return binding.member in policy_members(result.output_lines, binding.role)

    def _preexisting(self, bucket: str, binding: Binding) -> bool:
        """The binding is there and no run holds it (a run of another bucket holding a secret's
        binding added it: not a binding of the user's, so its last holder removes it)."""
        if not self._present(binding):
            return False
        return binding.kind != "secret" or not self.holders_elsewhere(bucket, binding)

    def grant(self, bucket: str, holder: str, bindings: Sequence[Binding]) -> list[Binding] | None:
        """Record, hold and add ``bindings`` for ``holder``; the ones it added (not pre-existing).

        ``None`` (nothing recorded, held nor added) when ``holder`` has no resource record in
        ``bucket``: nothing would find the hold again.
        """
        record = read_resource_record(self.gcp_conn_id, bucket, holder, self.chain)
        if record is None:
            return None
        # the record first: a crash after it leaves a hold its teardown finds (and drops)
        merged = _with_grants(record, [*recorded_grants(record), *bindings])
        if merged != record:
            write_resource_record(self.gcp_conn_id, bucket, holder, merged, self.chain)
        added = []
        for binding in bindings:
            if not self.registry.hold(bucket, binding, holder, partial(self._preexisting, bucket, binding)):
                added.append(binding)
            self.hook.run_checked(binding.add())
        return added

    def holders_elsewhere(self, bucket: str, binding: Binding) -> list[str]:
        """The holders of ``binding`` that other buckets this Airflow knows record: a secret is
        the project's, so runs of other buckets may hold the same binding (``[tpu_rl]
        janitor_buckets`` and the ledger's buckets, as the janitor knows them). ``bucket/holder``;
        a bucket that cannot be read counts as holding it (nothing is removed on a guess)."""
        from airflow_provider_tpu_rl.records.janitor_sources import janitor_buckets, ledger_buckets

        found = []
        for other in dict.fromkeys([*janitor_buckets(), *ledger_buckets()]):
            if other == bucket:
                continue
            try:
                holds = self.registry.read(other, binding)
            except Exception as err:  # unreadable: assume it holds
                log.warning("%s: the holders in gs://%s cannot be read (%s)", binding.text(), other, err)
                found.append(f"{other}/(unreadable)")
                continue
            found += [f"{other}/{holder}" for holder in holds.holders]
        return found

    def release(self, bucket: str, holder: str) -> list[Binding]:
        """``holder`` is gone: drop its holds; remove each binding it was the last to hold (never
        a pre-existing one). The bindings removed."""
        record = read_resource_record(self.gcp_conn_id, bucket, holder, self.chain)
        removed = []
        for binding in recorded_grants(record):
            holds = self.registry.read(bucket, binding)
            if holder not in holds.holders:
                continue  # let go of already (a retried teardown)
            # removed before the hold is dropped: a failed removal is retried with the task
            last = holds.holders == (holder,) and not holds.preexisting
            if last and binding.kind == "secret":
                elsewhere = self.holders_elsewhere(bucket, binding)
                if elsewhere:
                    last = False
                    log.info(
                        "%s: kept for %s (a run of another bucket holds it)", binding.text(), elsewhere[0]
                    )
            if last:
                self.hook.run_checked(binding.remove())
            left = self.registry.release(bucket, binding, holder)
            again = last and left is not None and bool(left.holders)
            if last and binding.kind == "secret" and not again:
                again = bool(self.holders_elsewhere(bucket, binding))
            if again:  # held again meanwhile (here or in another bucket): give it back
                self.hook.run_checked(binding.add())
            elif last:
                removed.append(binding)
        if record is not None and record.get("grants"):
            write_resource_record(self.gcp_conn_id, bucket, holder, _with_grants(record, []), self.chain)
        return removed


def carried_grants(
    gcp_conn_id: str, bucket: str, name: str, impersonation_chain: Any = None
) -> dict[str, Any]:
    """``{"grants": [...]}`` of the resource's current record (what a rewrite of it keeps)."""
    record = read_resource_record(gcp_conn_id, bucket, name, impersonation_chain)
    grants = (record or {}).get("grants")
    return {"grants": grants} if grants else {}
