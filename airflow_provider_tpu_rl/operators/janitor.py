"""Find and destroy what this provider created and nobody will destroy any more.

A cluster or TPU VM is stale when its ``tpu-rl-expires`` label has passed, or when the DAG run that
created it is no longer running and did not ask to keep it (its record in the bucket says which
run that was). Buckets are never touched.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from airflow.providers.common.compat.sdk import AirflowException

from airflow_provider_tpu_rl.hooks.gcluster import GclusterHook
from airflow_provider_tpu_rl.operators.gke import cluster_spec, destroy_cluster
from airflow_provider_tpu_rl.render import gke, tpu_vm
from airflow_provider_tpu_rl.render.command import Command

RunState = Callable[[str, str], str]
ACTIVE_RUN_STATES = frozenset({"queued", "running"})


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
        if labels.get(gke.MANAGED_LABEL) == "true":
            zone = str(item.get("zone", "")).rsplit("/", 1)[-1]
            found.append(
                ManagedResource(
                    "vm", str(item["name"]), project, zone, _expiry(labels), labels.get(gke.BUCKET_LABEL)
                )
            )
    return found


def read_record(gcp_conn_id: str, bucket: str | None, name: str) -> dict[str, Any] | None:
    """The resource record the creating task wrote, or None."""
    if not bucket:
        return None
    from airflow.providers.google.cloud.hooks.gcs import GCSHook
    from google.api_core.exceptions import NotFound

    try:
        raw = GCSHook(gcp_conn_id=gcp_conn_id).download(
            bucket_name=bucket, object_name=gke.resource_record_object(name)
        )
    except NotFound:
        return None
    record = json.loads(raw)
    return record if isinstance(record, dict) else None


def find_expired_resources(
    hook: GclusterHook,
    project: str,
    now: float,
    *,
    run_state: RunState | None = None,
    gcp_conn_id: str = "google_cloud_default",
) -> list[ManagedResource]:
    """Managed resources of ``project`` that are past their expiry or orphaned by their run."""
    stale: list[ManagedResource] = []
    for resource in _candidates(hook, project):
        reason = ""
        if resource.expires_at is not None and resource.expires_at <= now:
            reason = f"expired at {datetime.fromtimestamp(resource.expires_at, UTC).isoformat()}"
        elif run_state is not None:
            record = read_record(gcp_conn_id, resource.bucket, resource.name)
            if record and not record.get("keep"):
                state = run_state(str(record["dag_id"]), str(record["run_id"]))
                if state not in ACTIVE_RUN_STATES:
                    reason = f"its DAG run {record['dag_id']}/{record['run_id']} is {state}"
        if reason:
            stale.append(ManagedResource(**{**resource.__dict__, "reason": reason}))
    return stale


def destroy_resource(
    hook: GclusterHook, resource: ManagedResource, *, gcp_conn_id: str = "google_cloud_default"
) -> None:
    """Delete a VM, or destroy a cluster from its Terraform state in GCS (found via its record)."""
    if resource.kind == "vm":
        command: Command = tpu_vm.delete_vm_named(resource.project, resource.location, resource.name)
        hook.run_checked(command)
        return
    record = read_record(gcp_conn_id, resource.bucket, resource.name)
    if record is None:
        raise AirflowException(
            f"cluster {resource.name}: no record gs://{resource.bucket}/{gke.resource_record_object(resource.name)}; "
            "destroy it by hand with `gcluster destroy`"
        )
    destroy_cluster(
        hook,
        cluster_spec(record["cluster"], record.get("model")),
        dag_id=str(record["dag_id"]),
        run_id=str(record["run_id"]),
        expires_at=int(record.get("expires_at") or 0),
    )
