"""The TPU machines' own clocks, read by the tasks that create and delete them (``ledger/billing.py``).

Compute Engine keeps only an instance's latest start (``lastStartTimestamp``) and forgets a deleted
instance, so the capacity tasks note every start they see in the capacity's resource record in the
run's bucket (``tpu-rl/resources/<name>.json``, key ``billing``: it survives a failed try, whose
XCom is lost), and the task that deletes the capacity reads the zone operations that ended each
span and returns the spans under ``billed`` for ``record_run``:

* the TPU VM: noted after its create, after a train retry starts or re-creates it, and before its
  delete; the delete task returns its spans;
* a GKE TPU node pool: its node VMs (labelled by GKE with the cluster and the pool) noted after
  the pool's deploy and before its destroy; the destroy task returns their spans, with the nodes an
  autoscaling pool added and removed between the two looks read from the operations on the pool's
  managed instance groups.

Reading the clocks never fails a task: a failed read is one warning, and the ledger then shows the
billed time as unknown (or, for a machine still running, up to the moment it records the run).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from airflow_provider_tpu_rl.ledger.billing import (
    Observation,
    Operation,
    base_instance_names,
    machine_spans,
    observe_instance,
    parse_operation,
)
from airflow_provider_tpu_rl.ledger.records import as_utc
from airflow_provider_tpu_rl.records.resources import read_resource_record, write_resource_record
from airflow_provider_tpu_rl.render import billing
from airflow_provider_tpu_rl.render.blueprint import BLUEPRINT_RELPATH, tpu_pool_names

log = logging.getLogger(__name__)

RECORD_KEY = "billing"  # in the resource record: {"since": ISO time, "observations": [...]}
XCOM_KEY = "billed"  # in the deleting task's return value: {"spans": [...], "read_at": ISO time}


def json_value(lines: Iterable[str]) -> Any:
    """The first JSON array or object a ``--format=json`` command printed (warnings share the
    stream); None when there is none."""
    items = list(lines)
    decoder = json.JSONDecoder()
    for index, line in enumerate(items):
        if not line.lstrip().startswith(("[", "{")):
            continue
        try:
            value, _ = decoder.raw_decode("\n".join(items[index:]).lstrip())
        except ValueError:
            continue
        return value
    return None


def noted(record: dict[str, Any] | None) -> tuple[list[Observation], datetime | None]:
    """The observations a resource record holds, and since when its capacity was watched."""
    billing_record = (record or {}).get(RECORD_KEY) or {}
    seen = [o for item in billing_record.get("observations") or [] if (o := Observation.from_dict(item))]
    since = billing_record.get("since")
    try:
        return seen, as_utc(since) if isinstance(since, str) else None
    except ValueError:
        return seen, None


def _note(
    operator: Any,
    bucket: str,
    name: str,
    observations: Sequence[Observation],
    since: datetime | None = None,
) -> None:
    """Add ``observations`` (those with a start) to the resource record of ``name``."""
    record = read_resource_record(operator.gcp_conn_id, bucket, name, operator.chain)
    if record is None:
        operator.log.warning("No resource record of %s: its billed time is not noted", name)
        return
    kept, _ = noted(record)
    known = {(o.name, o.instance_id, o.started_at) for o in kept}
    new = [o for o in observations if o.started_at and (o.name, o.instance_id, o.started_at) not in known]
    billing_record = dict(record.get(RECORD_KEY) or {})
    if since is not None and not billing_record.get("since"):
        billing_record["since"] = as_utc(since).isoformat()  # type: ignore[union-attr]
    if not new and billing_record == (record.get(RECORD_KEY) or {}):
        return
    billing_record["observations"] = [o.as_dict() for o in (*kept, *new)]
    write_resource_record(
        operator.gcp_conn_id, bucket, name, {**record, RECORD_KEY: billing_record}, operator.chain
    )


def note_vm(operator: Any, vm: Any) -> None:
    """Note the TPU VM's current start (its ``lastStartTimestamp`` and incarnation) in its record."""
    try:
        result = operator.hook.run(
            billing.describe_instance(vm.project, vm.zone, vm.vm_name), log_output=False
        )
        resource = json_value(result.output_lines) if result.ok else None
        seen = observe_instance(resource) if isinstance(resource, dict) else None
        if seen is not None:
            _note(operator, vm.bucket, vm.vm_name, [seen])
    except Exception as err:
        operator.log.warning("Could not note when VM %s started (its billed time): %s", vm.vm_name, err)


def _operations(operator: Any, command: Any) -> list[Operation]:
    result = operator.hook.run_checked(command, log_output=False)
    listed = json_value(result.output_lines)
    return [op for item in listed or [] if isinstance(item, dict) and (op := parse_operation(item))]


def _billed(spans: Sequence[Any]) -> dict[str, Any]:
    return {"spans": [span.as_dict() for span in spans], "read_at": datetime.now(UTC).isoformat()}


def vm_billed(operator: Any, vm: Any) -> dict[str, Any] | None:
    """The TPU VM's RUNNING spans: each noted start, ended by the zone operation that stopped or
    deleted that incarnation (open while none did); None when they cannot be read."""
    try:
        record = read_resource_record(operator.gcp_conn_id, vm.bucket, vm.vm_name, operator.chain)
        observations, _ = noted(record)
        if not observations:
            operator.log.warning("No start of VM %s was noted: its billed time is unknown", vm.vm_name)
            return None
        ops = _operations(operator, billing.list_instance_operations(vm.project, vm.zone, [vm.vm_name]))
        return _billed(machine_spans(observations, ops))
    except Exception as err:
        operator.log.warning("Could not read the billed time of VM %s: %s", vm.vm_name, err)
        return None


def pool_names(operator: Any, cluster: Any) -> list[str]:
    """The GKE names of the bundle blueprint's TPU node pools (empty: any pool of the cluster)."""
    try:
        text = (operator.hook.bundle_dir() / BLUEPRINT_RELPATH).read_text()
        return tpu_pool_names(text, cluster.num_slices)
    except Exception as err:
        operator.log.warning("Could not read the TPU node pool's name from the blueprint: %s", err)
        return []


def note_pool_nodes(operator: Any, cluster: Any, since: datetime | None = None) -> None:
    """Note the starts of the cluster's TPU node VMs (GKE's labels: the cluster and the TPU pool),
    and ``since`` when the pool was watched (its deploy's start)."""
    note_nodes(
        operator,
        cluster.project,
        cluster.zone,
        cluster.cluster_name,
        pool_names(operator, cluster),
        cluster.bucket,
        cluster.cluster_name,
        since,
    )


def note_nodes(
    operator: Any,
    project: str,
    zone: str,
    cluster: str,
    pools: Sequence[str],
    bucket: str,
    record: str,
    since: datetime | None = None,
) -> None:
    """Note the starts of the TPU node VMs of ``pools`` of GKE cluster ``cluster`` in the resource
    record ``record`` (a cluster's, or a run's own pool's on a cluster it does not own)."""
    try:
        command = billing.list_pool_nodes(project, zone, cluster, pools)
        listed = json_value(operator.hook.run_checked(command, log_output=False).output_lines)
        seen = [o for item in listed or [] if isinstance(item, dict) and (o := observe_instance(item))]
        _note(operator, bucket, record, [o for o in seen if o.chips > 0], since)
    except Exception as err:
        operator.log.warning(
            "Could not note when the TPU nodes of cluster %s started (their billed time): %s", cluster, err
        )


def pool_billed(operator: Any, cluster: Any) -> dict[str, Any] | None:
    """The TPU node VMs' RUNNING spans, each to the start of its delete; with the nodes the pool's
    managed instance groups created and deleted since the pool was watched (from their
    operations). None when they cannot be read."""
    try:
        record = read_resource_record(
            operator.gcp_conn_id, cluster.bucket, cluster.cluster_name, operator.chain
        )
        observations, since = noted(record)
        bases = base_instance_names(o.name for o in observations)
        if not bases:
            operator.log.warning(
                "No TPU node of cluster %s was noted: its billed time is unknown", cluster.cluster_name
            )
            return None
        ops = _operations(
            operator,
            billing.list_instance_operations(cluster.project, cluster.zone, bases, group_bases=True),
        )
        chips = {o.name: o.chips for o in observations}
        return _billed(machine_spans(observations, ops, adopt_since=since, chips_by_name=chips))
    except Exception as err:
        operator.log.warning(
            "Could not read the billed time of cluster %s's TPU nodes: %s", cluster.cluster_name, err
        )
        return None
