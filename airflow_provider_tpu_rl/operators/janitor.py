"""Find and destroy what this provider created and nobody will destroy any more.

A managed cluster or TPU VM (label ``tpu-rl-managed=true``) is judged, in this order:

1. A cluster whose lease (``gs://BUCKET/tpu-rl/leases/CLUSTER.json``) is *kept* (a ``keep_cluster``
   hand-over) is left alone until the later of the lease's expiry and its ``tpu-rl-expires`` label.
2. Past its ``tpu-rl-expires`` label: destroyed (``max_cluster_hours``/``max_vm_hours``), unless a
   live lease holds it: a run's jobs renew its lease while they run, so a training longer than
   the label keeps its cluster until its run ends (rule 4) or stops renewing (rule 3).
3. A cluster whose lease has expired: destroyed (its holder stopped renewing it).
4. The run that holds it (the lease's holder; without a lease, the run in its resource record
   ``gs://BUCKET/tpu-rl/resources/NAME.json``), unless that run kept it:
   - its DAG run has ended (success, failed): destroyed;
   - its DAG run is ``running`` but none of its task instances is running, queued, scheduled,
     deferred, up for retry/reschedule or restarting, and its task states have not changed for
     ``[tpu_rl] orphan_minutes``: orphaned, destroyed. "For" is measured from the first janitor scan
     that saw it so, which writes a marker ``gs://BUCKET/tpu-rl/janitor/orphans/NAME.json``; a scan
     that sees a live task or changed task states removes or restarts it.
   - a run this Airflow does not know (deleted, or of another Airflow) protects nothing and
     condemns nothing: only rules 1-3 apply.

Before destroying a cluster the janitor takes its lease over (a conditional write naming the
generation it judged), so a run that took the cluster meanwhile keeps it; the lease is released
after the destroy. A destroyed cluster or VM then lets go of the IAM grants its record lists (each
removed when it held it last and it did not exist before; its holder object goes with it). Buckets,
records and everything else in them are never deleted.

A run whose resources the janitor ended, or whose DAG run ended, while its ledger row still says
``running`` gets its row closed (:func:`close_ledger_rows`): ``failed`` when its DAG run ended
failed, else ``abandoned``; its end, its billed TPU time so far and why, in one line. A row
already closed is never touched.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, Literal

from airflow_provider_tpu_rl.compat import AirflowException
from airflow_provider_tpu_rl.hooks.gcluster import GclusterHook
from airflow_provider_tpu_rl.ledger.billing import BilledSpan, machine_spans, spans_from_json
from airflow_provider_tpu_rl.ledger.records import RunClosing, closing_state
from airflow_provider_tpu_rl.operators import billing
from airflow_provider_tpu_rl.operators.gke import cluster_spec, destroy_cluster
from airflow_provider_tpu_rl.records.grants import RunGrants
from airflow_provider_tpu_rl.records.janitor_sources import (
    ALIVE_TASK_STATES,
    DagRunStateOnly,
    JanitorSources,
    RunProbe,
    discover_sources,
    ledger_exists,
    orphan_minutes,
    run_probe,
)
from airflow_provider_tpu_rl.records.lease import ClusterLeaseHook, Lease, lease_object
from airflow_provider_tpu_rl.render import gke, tpu_vm
from airflow_provider_tpu_rl.render.billing import CLUSTER_LABEL
from airflow_provider_tpu_rl.render.command import Command
from airflow_provider_tpu_rl.spec.cluster import ON_DEMAND, RESERVATION, default_capacity

log = logging.getLogger(__name__)

RunState = Callable[[str, str], str]
ACTIVE_RUN_STATES = frozenset({"queued", "running"})
ORPHAN_PREFIX = "tpu-rl/janitor/orphans/"
JANITOR_DAG_ID = "tpu_rl_janitor"
# How long the janitor holds a cluster's lease while it destroys it (a hung destroy is killed
# well before: the teardown timeout); released as soon as the destroy ends.
JANITOR_LEASE_SECONDS = 3 * 3600
GCS_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ManagedResource:
    """A cluster or VM carrying the ``tpu-rl-managed`` label."""

    kind: Literal["cluster", "vm"]
    name: str
    project: str
    location: str  # cluster: its location (region); VM: its zone
    expires_at: int | None
    bucket: str | None
    reason: str = ""
    holder: str = ""  # the run judged: ``dag_id/run_id`` of the lease or of the record
    lease_generation: int = 0  # generation of the lease the janitor judged (0: none)
    run_state: str = ""  # the holder's DAG-run state as the janitor read it ("": not read)


@dataclass(frozen=True)
class RunEnd:
    """What the janitor ended of one run (``holder``, ``dag_id/run_id``): for its ledger row."""

    holder: str
    run_state: str  # its DAG run's state as read ("": not read)
    reason: str  # why the resource was destroyed (ManagedResource.reason)
    what: str  # "deleted TPU VM x", "destroyed cluster y"
    ended_at: datetime  # when the destroy ended
    billed_spans: tuple[BilledSpan, ...] | None  # its TPU machines' spans (None: none noted)


def parse_json_listing(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The JSON array in a ``--format=json`` listing whose stream also carries log lines."""
    text = "\n".join(lines)
    start = text.find("[")
    end = text.rfind("]")
    if start < 0 or end < start:
        return []
    value = json.loads(text[start : end + 1])
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _expiry(labels: dict[str, str]) -> int | None:
    raw = labels.get(gke.EXPIRES_LABEL, "")
    return int(raw) if raw.isdigit() else None


def _candidates(hook: GclusterHook, project: str) -> list[ManagedResource]:
    found: list[ManagedResource] = []
    listing = hook.run_checked(gke.list_managed_clusters(project), log_output=False).output_lines
    for item in parse_json_listing(listing):
        labels = {str(k): str(v) for k, v in (item.get("resourceLabels") or {}).items()}
        if labels.get(gke.MANAGED_LABEL) == "true":
            found.append(
                ManagedResource(
                    "cluster",
                    str(item["name"]),
                    project,
                    str(item.get("location", "")),
                    _expiry(labels),
                    labels.get(gke.BUCKET_LABEL),
                )
            )
    listing = hook.run_checked(tpu_vm.list_managed_vms(project), log_output=False).output_lines
    for item in parse_json_listing(listing):
        labels = {str(k): str(v) for k, v in (item.get("labels") or {}).items()}
        # A GKE node VM carries its pool's resource labels (the blueprint's, ours among them) and
        # GKE's own: it is the cluster's, destroyed with it, never a VM of the TPU VM pipeline.
        if labels.get(gke.MANAGED_LABEL) == "true" and CLUSTER_LABEL not in labels:
            zone = str(item.get("zone", "")).rsplit("/", 1)[-1]
            found.append(
                ManagedResource(
                    "vm", str(item["name"]), project, zone, _expiry(labels), labels.get(gke.BUCKET_LABEL)
                )
            )
    return found


def _gcs(gcp_conn_id: str) -> Any:
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

    return GCSHook(gcp_conn_id=gcp_conn_id)


def _download_json(gcp_conn_id: str, bucket: str, name: str) -> dict[str, Any] | None:
    from google.api_core.exceptions import NotFound

    blob = _gcs(gcp_conn_id).get_conn().bucket(bucket).blob(name)
    try:
        raw = blob.download_as_bytes(timeout=GCS_TIMEOUT_S)
    except NotFound:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def read_record(gcp_conn_id: str, bucket: str | None, name: str) -> dict[str, Any] | None:
    """The resource record the creating task wrote, or None."""
    if not bucket:
        return None
    return _download_json(gcp_conn_id, bucket, gke.resource_record_object(name))


def orphan_marker_object(name: str) -> str:
    """Where the janitor notes when it first saw ``name``'s run without a live task."""
    return f"{ORPHAN_PREFIX}{name}.json"


def _delete_object(gcp_conn_id: str, bucket: str, name: str) -> None:
    from google.api_core.exceptions import NotFound

    blob = _gcs(gcp_conn_id).get_conn().bucket(bucket).blob(name)
    with contextlib.suppress(NotFound):
        blob.delete(timeout=GCS_TIMEOUT_S)


def clear_orphan_marker(gcp_conn_id: str, bucket: str, name: str) -> None:
    """Forget a first-seen-orphaned marker (its run is alive again, or the resource is gone)."""
    _delete_object(gcp_conn_id, bucket, orphan_marker_object(name))


def orphaned_since(
    gcp_conn_id: str, bucket: str, name: str, holder: str, states: Mapping[str, str | None], now: float
) -> float:
    """When the janitor first saw ``holder`` without a live task and with these task states.

    The marker is rewritten (the clock restarts) when the holder or the task states differ from
    the ones it noted: a run that made progress between two scans is not orphaned.
    """
    noted = {str(task): state for task, state in sorted(states.items())}
    marker = _download_json(gcp_conn_id, bucket, orphan_marker_object(name))
    if marker and marker.get("holder") == holder and marker.get("task_states") == noted:
        first_seen = marker.get("first_seen")
        if isinstance(first_seen, int | float):
            return float(first_seen)
    body = {
        "holder": holder,
        "first_seen": now,
        "first_seen_utc": _iso(now),
        "task_states": noted,
    }
    _gcs(gcp_conn_id).upload(
        bucket_name=bucket,
        object_name=orphan_marker_object(name),
        data=json.dumps(body, sort_keys=True),
        mime_type="application/json",
        timeout=int(GCS_TIMEOUT_S),
    )
    return now


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat()


def _read_lease(gcp_conn_id: str, resource: ManagedResource) -> Lease | None:
    if resource.kind != "cluster" or not resource.bucket:
        return None
    return ClusterLeaseHook(gcp_conn_id=gcp_conn_id).read(resource.bucket, resource.name)


def _judge(
    resource: ManagedResource,
    now: float,
    runs: RunProbe | None,
    orphan_seconds: float,
    gcp_conn_id: str,
) -> ManagedResource:
    """The resource with ``reason`` set when it must be destroyed (see the module's rules)."""
    lease = _read_lease(gcp_conn_id, resource)
    if lease is not None:
        resource = replace(resource, holder=lease.holder, lease_generation=lease.generation)
        if lease.kept:
            until = max(lease.expires_at, float(resource.expires_at or 0))
            if until <= now:
                return replace(resource, reason=f"kept by run {lease.holder}; expired at {_iso(until)}")
            return resource
    if (
        resource.expires_at is not None
        and resource.expires_at <= now
        and (lease is None or lease.expired(now))
    ):
        return replace(resource, reason=f"expired at {_iso(resource.expires_at)}")
    if lease is not None and lease.expired(now):
        return replace(
            resource, reason=f"the lease of run {lease.holder} expired at {_iso(lease.expires_at)}"
        )
    if runs is None:
        return resource
    record = read_record(gcp_conn_id, resource.bucket, resource.name)
    if lease is not None:
        dag_id, run_id = lease.dag_id, lease.run_id
        kept = bool(
            record and record.get("keep") and f"{record.get('dag_id')}/{record.get('run_id')}" == lease.holder
        )
    elif record is not None:
        dag_id, run_id = str(record["dag_id"]), str(record["run_id"])
        kept = bool(record.get("keep"))
        resource = replace(resource, holder=f"{dag_id}/{run_id}")
    else:
        return resource
    if kept:
        return resource  # kept: only its expiry ends it
    state = runs.dagrun_state(dag_id, run_id)
    if state is None:
        return resource  # a run this Airflow does not know: the expiry and the lease decide
    resource = replace(resource, run_state=state)
    if state not in ACTIVE_RUN_STATES:
        return replace(resource, reason=f"its DAG run {dag_id}/{run_id} is {state}")
    if state != "running" or not resource.bucket:
        return resource
    states = runs.task_states(dag_id, run_id)
    if states is None:
        return resource
    if any(task_state in ALIVE_TASK_STATES for task_state in states.values()):
        clear_orphan_marker(gcp_conn_id, resource.bucket, resource.name)
        return resource
    since = orphaned_since(gcp_conn_id, resource.bucket, resource.name, f"{dag_id}/{run_id}", states, now)
    if now - since >= orphan_seconds:
        return replace(
            resource,
            reason=(
                f"orphaned: its DAG run {dag_id}/{run_id} is running but none of its tasks has been "
                f"alive since {_iso(since)}"
            ),
        )
    return resource


def find_expired_resources(
    hook: GclusterHook,
    project: str,
    now: float,
    *,
    run_state: RunState | None = None,
    runs: RunProbe | None = None,
    sources: JanitorSources | None = None,
    orphan_seconds: float | None = None,
    gcp_conn_id: str = "google_cloud_default",
) -> list[ManagedResource]:
    """Managed resources of ``project`` that are past their expiry, their lease, or their run.

    ``runs`` reads DAG-run and task states (``janitor_sources.run_probe``); ``run_state`` alone
    (a ``(dag_id, run_id) -> state`` callable) judges ended runs but finds no orphans. Without
    either the expiry labels and leases decide. ``sources`` finds the record of a resource whose
    bucket is not in its labels. ``orphan_seconds`` defaults to ``[tpu_rl] orphan_minutes``.
    """
    probe = runs if runs is not None else (DagRunStateOnly(run_state) if run_state is not None else None)
    orphan_after = orphan_minutes() * 60.0 if orphan_seconds is None else orphan_seconds
    stale: list[ManagedResource] = []
    for resource in _candidates(hook, project):
        if resource.bucket is None and sources is not None:
            resource = replace(resource, bucket=sources.bucket_of(project, resource.name))
        judged = _judge(resource, now, probe, orphan_after, gcp_conn_id)
        if judged.reason:
            stale.append(judged)
    return stale


def take_lease(
    gcp_conn_id: str, resource: ManagedResource, *, dag_id: str, run_id: str, now: float | None = None
) -> Lease | None:
    """Take ``resource``'s lease for the janitor if it is still the one judged; None if it changed."""
    from google.api_core.exceptions import PreconditionFailed

    if not resource.bucket:
        return None
    start = time.time() if now is None else now
    mine = Lease(resource.name, dag_id, run_id, start + JANITOR_LEASE_SECONDS, 0)
    blob = _gcs(gcp_conn_id).get_conn().bucket(resource.bucket).blob(lease_object(resource.name))
    try:
        blob.upload_from_string(
            mine.payload(),
            content_type="application/json",
            if_generation_match=resource.lease_generation,
            timeout=GCS_TIMEOUT_S,
        )
    except PreconditionFailed:
        return None
    return replace(mine, generation=int(blob.generation or 0))


def recorded_cluster_arguments(cluster: Mapping[str, Any]) -> dict[str, Any]:
    """A resource record's cluster arguments, as the cluster was deployed. A record written before
    ``on-demand`` was a capacity holds ``reservation`` capacity (or none) with no reservation for
    what deployed on-demand (``NO_RESERVATION``): read as ``on-demand``."""
    values = dict(cluster)
    values["capacity"] = values.get("capacity") or default_capacity(values.get("reservation"))
    if values["capacity"] == RESERVATION and not values.get("reservation"):
        values["capacity"] = ON_DEMAND
    return values


def _billing_reader(hook: GclusterHook, gcp_conn_id: str) -> Any:
    """What ``operators/billing.py``'s readers take of an operator: the hook, the connection, a log."""
    return SimpleNamespace(hook=hook, gcp_conn_id=gcp_conn_id, chain=None, log=log)


def ended_spans(
    billed: Mapping[str, Any] | None, record: Mapping[str, Any] | None, ended_at: datetime
) -> tuple[BilledSpan, ...] | None:
    """The TPU machines' spans up to the janitor's destroy: those read from the machines' clocks
    (``billed``: the zone operations end them), else the starts noted in the resource record; a
    span still open ends at ``ended_at`` (``ended_by`` ``janitor``). None when no start was noted."""
    spans = spans_from_json((billed or {}).get("spans"))
    if not spans:
        observations, _ = billing.noted(dict(record) if record else None)
        spans = tuple(machine_spans(observations, []))
    if not spans:
        return None
    return tuple(
        span if span.ended_at else replace(span, ended_at=ended_at, ended_by="janitor") for span in spans
    )


def release_grants(hook: GclusterHook, gcp_conn_id: str, bucket: str, name: str) -> None:
    """The destroyed resource lets go of the grants its record lists (``records/grants.py``)."""
    removed = RunGrants(hook, gcp_conn_id).release(bucket, name)
    for binding in removed:
        log.info("%s: removed %s (it held it last)", name, binding.text())


def destroy_resource(
    hook: GclusterHook,
    resource: ManagedResource,
    *,
    gcp_conn_id: str = "google_cloud_default",
    janitor_run_id: str | None = None,
) -> RunEnd | None:
    """Delete a VM, or destroy a cluster from its Terraform state in GCS (found via its record).

    A cluster's lease is taken over first (only if it is still the one judged: a run that took
    the cluster since keeps it) and released after the destroy. Returns what it ended of the run
    that held it, with its TPU machines' billed spans, for :func:`close_ledger_rows` (None: no run
    is known).
    """
    reader = _billing_reader(hook, gcp_conn_id)
    record = read_record(gcp_conn_id, resource.bucket, resource.name)
    if resource.kind == "vm":
        vm = SimpleNamespace(
            project=resource.project, zone=resource.location, vm_name=resource.name, bucket=resource.bucket
        )
        # a TPU VM's record holds the starts its tasks noted; a CPU VM's none (it bills no TPU)
        tpu = bool(resource.bucket and record and record.get(billing.RECORD_KEY))
        if tpu:
            billing.note_vm(reader, vm)  # a start no task noted (never raises)
        command: Command = tpu_vm.delete_vm_named(resource.project, resource.location, resource.name)
        hook.run_checked(command)
        if resource.bucket:
            release_grants(hook, gcp_conn_id, resource.bucket, resource.name)
            clear_orphan_marker(gcp_conn_id, resource.bucket, resource.name)
        if not tpu:
            return _run_end(resource, record, f"deleted VM {resource.name}", None)
        record = read_record(gcp_conn_id, resource.bucket, resource.name) or record  # with its noted start
        return _run_end(resource, record, f"deleted VM {resource.name}", billing.vm_billed(reader, vm))
    if record is None or not resource.bucket:
        raise AirflowException(
            f"cluster {resource.name}: no record gs://{resource.bucket}/{gke.resource_record_object(resource.name)}; "
            "destroy it by hand with `gcluster destroy`"
        )
    lease = take_lease(
        gcp_conn_id, resource, dag_id=JANITOR_DAG_ID, run_id=janitor_run_id or f"janitor-{int(time.time())}"
    )
    if lease is None:
        raise AirflowException(
            f"cluster {resource.name}: its lease changed since the janitor judged it; left for the next scan"
        )
    cluster = cluster_spec(recorded_cluster_arguments(record["cluster"]), record.get("model"))
    try:
        billing.note_pool_nodes(reader, cluster)  # their latest starts, before they go (never raises)
        destroy_cluster(
            hook,
            cluster,
            dag_id=str(record["dag_id"]),
            run_id=str(record["run_id"]),
            expires_at=int(record.get("expires_at") or 0),
        )
        release_grants(hook, gcp_conn_id, resource.bucket, resource.name)
        clear_orphan_marker(gcp_conn_id, resource.bucket, resource.name)
    finally:
        ClusterLeaseHook(gcp_conn_id=gcp_conn_id).release(resource.bucket, lease)
    record = read_record(gcp_conn_id, resource.bucket, resource.name) or record  # with the noted starts
    billed = billing.pool_billed(reader, cluster)
    return _run_end(resource, record, f"destroyed cluster {resource.name}", billed)


def _run_end(
    resource: ManagedResource,
    record: Mapping[str, Any] | None,
    what: str,
    billed: Mapping[str, Any] | None,
) -> RunEnd | None:
    holder = resource.holder
    if not holder and record and record.get("dag_id") and record.get("run_id"):
        holder = f"{record['dag_id']}/{record['run_id']}"
    if not holder:
        return None
    ended_at = datetime.now(UTC)
    return RunEnd(
        holder, resource.run_state, resource.reason, what, ended_at, ended_spans(billed, record, ended_at)
    )


# How many of the ledger's newest rows still ``running`` one janitor run looks at.
LEDGER_SWEEP_LIMIT = 200


def _one_line(text: str) -> str:
    return " ".join(text.split())


def close_ledger_rows(
    ends: Sequence[RunEnd],
    runs: RunProbe | None,
    *,
    ledger_conn_id: str | None = None,
    usd_per_chip_hour: float | None = None,
    now: datetime | None = None,
) -> list[str]:
    """Close the ledger rows that still say ``running`` of the runs whose resources the janitor
    ended (``ends``), and of the runs whose DAG run has ended (``runs``); returns one line per
    row closed. ``failed`` when the DAG run ended failed, else ``abandoned``
    (:func:`~airflow_provider_tpu_rl.ledger.records.closing_state`). A row already closed, or of a
    run with a live task (its record_run will close it), is left alone. No ledger (the default
    SQLite file not created): nothing to close."""
    from airflow_provider_tpu_rl.ledger.hook import DEFAULT_CONN_ID, RunLedger
    from airflow_provider_tpu_rl.operators.ledger import default_usd_per_chip_hour

    conn_id = ledger_conn_id or DEFAULT_CONN_ID
    if not ledger_exists(conn_id):
        return []
    ledger = RunLedger(conn_id)
    price = default_usd_per_chip_hour() if usd_per_chip_hour is None else usd_per_chip_hour
    closings = _closings_of_ends(ends, runs, price)
    if runs is not None:
        closings += _closings_of_ended_runs(ledger, runs, {c.run_id for c in closings}, price, now)
    closed: list[str] = []
    for closing in closings:
        if ledger.close_run(closing):
            line = f"{closing.run_id}: {closing.state}; {closing.reason}"
            log.warning("ledger: closed %s", line)
            closed.append(line)
    return closed


def _closings_of_ends(ends: Sequence[RunEnd], runs: RunProbe | None, price: float) -> list[RunClosing]:
    """One closing per run the janitor ended resources of, naming each; none for a live run."""
    by_holder: dict[str, list[RunEnd]] = {}
    for end in ends:
        by_holder.setdefault(end.holder, []).append(end)
    closings: list[RunClosing] = []
    for holder, parts in by_holder.items():
        state = next((p.run_state for p in parts if p.run_state), "") or _dagrun_state(runs, holder)
        if state in ACTIVE_RUN_STATES and _has_live_task(runs, holder):
            log.info("ledger: %s has a live task; its record_run closes its row", holder)
            continue
        known = [span for p in parts if p.billed_spans is not None for span in p.billed_spans]
        what = "; ".join(f"{p.what} ({p.reason})" if p.reason else p.what for p in parts)
        closings.append(
            RunClosing(
                holder,
                closing_state(state),
                max(p.ended_at for p in parts),
                _one_line(f"janitor: {what}"),
                tuple(known) if any(p.billed_spans is not None for p in parts) else None,
                price,
            )
        )
    return closings


def _closings_of_ended_runs(
    ledger: Any, runs: RunProbe, skip: set[str], price: float, now: datetime | None
) -> list[RunClosing]:
    """A closing per newest row still ``running`` whose DAG run has ended (success or failed), at
    its last task's end in the ledger (else ``now``); its billed time unknown."""
    closings: list[RunClosing] = []
    for run_id in ledger.running_runs(LEDGER_SWEEP_LIMIT):
        if run_id in skip:
            continue
        state = _dagrun_state(runs, run_id)
        if state not in ("success", "failed"):
            continue  # still going (the janitor ends an orphan's resources), or unknown here
        steps = ledger.recorded_steps(run_id).values()
        ended = max((s.ended_at for s in steps if s.ended_at), default=None) or now or datetime.now(UTC)
        reason = f"janitor: its DAG run ended {state} and record_run never recorded it"
        closings.append(RunClosing(run_id, closing_state(state), ended, reason, None, price))
    return closings


def _has_live_task(runs: RunProbe | None, holder: str) -> bool:
    if runs is None or "/" not in holder:
        return False
    states = runs.task_states(*holder.split("/", 1))
    return any(state in ALIVE_TASK_STATES for state in (states or {}).values())


def _dagrun_state(runs: RunProbe | None, holder: str) -> str:
    if runs is None or "/" not in holder:
        return ""
    dag_id, run_id = holder.split("/", 1)
    return runs.dagrun_state(dag_id, run_id) or ""


__all__ = [
    "ManagedResource",
    "RunEnd",
    "close_ledger_rows",
    "destroy_resource",
    "discover_sources",
    "find_expired_resources",
    "orphan_marker_object",
    "read_record",
    "run_probe",
    "take_lease",
]
