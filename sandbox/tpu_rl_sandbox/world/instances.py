"""Compute Engine instances as the fakes keep them: their states in time, the timestamps the API
returns, and the zone operations that change them.

An instance record (the ``vms`` document, keyed ``project/zone/name``) carries a ``timeline``:
``[status, epoch seconds]`` entries, the states it enters and when (Compute Engine's lifecycle,
docs.cloud.google.com/compute/docs/instances/instance-lifecycle: created → ``PENDING`` for "a
standalone TPU instance" and "a Flex-start VM or TPU instance that is part of a managed instance
group", else straight to ``PROVISIONING`` → ``STAGING`` → ``RUNNING``; a stop or a delete →
``STOPPING`` → ``TERMINATED`` or gone). A reader settles the record at its own moment
(:func:`settled`), so a ``describe`` during a create sees ``PROVISIONING`` while the create's
gcloud still waits. ``lastStartTimestamp`` is when the latest ``RUNNING`` began,
``lastStopTimestamp`` when the latest stop ended (``TERMINATED``; the API's description, "Last
stop timestamp", does not say which moment).

Timestamps are written as the API writes them: RFC 3339 in Pacific time with milliseconds
(``2026-03-04T05:06:07.123-08:00``, as in public instance dumps). Each create gives the instance a
new ``id`` ("the incarnation", the operations' ``targetId``).

Zone operations (the ``operations`` document, keyed ``project/zone``, oldest first) have the fields
of gcloud 528's compute v1 ``Operation``: ``operationType`` (``insert``, ``delete``, ``start``,
``stop``, ``compute.instances.preempted``), ``targetLink``, ``targetId``, ``status`` (``PENDING``,
``RUNNING``, ``DONE``), ``insertTime`` (requested), ``startTime`` (started by the server),
``endTime`` (completed).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from tpu_rl_sandbox.world.timescale import capacity_seconds

PACIFIC = ZoneInfo("America/Los_Angeles")
API = "https://www.googleapis.com/compute/v1"
BILLED = "RUNNING"
TPU_PREFIX = "ct"  # ct6e-standard-8t: a TPU machine type


def api_time(epoch: float) -> str:
    """``epoch`` as the Compute Engine API writes a timestamp."""
    return datetime.fromtimestamp(epoch, PACIFIC).isoformat(timespec="milliseconds")


def new_id() -> str:
    """A fresh instance or operation id (the API's are unsigned 64-bit decimal strings)."""
    import secrets  # here and below: a describe or list makes no id

    return str(10**18 + secrets.randbelow(9 * 10**18))


def instance_url(project: str, zone: str, name: str) -> str:
    return f"{API}/projects/{project}/zones/{zone}/instances/{name}"


def is_tpu(machine_type: str) -> bool:
    return str(machine_type).rsplit("/", 1)[-1].startswith(TPU_PREFIX)


def start_phases(
    minute_seconds: float,
    overrides: Mapping[str, float],
    *,
    machine_type: str,
    provisioning_model: str | None,
    created: bool,
) -> list[tuple[str, float]]:
    """The states a create (``created``) or a start goes through before RUNNING, with their
    seconds: a TPU instance's create waits in PENDING (a flex-start or Spot request queued for
    capacity longer: ``flex_start_wait``, ``spot_wait``), then PROVISIONING and STAGING."""
    phases: list[tuple[str, float]] = []
    if created and is_tpu(machine_type):
        wait = {"FLEX_START": "flex_start_wait", "SPOT": "spot_wait"}.get(str(provisioning_model or ""))
        pending = capacity_seconds(minute_seconds, "vm_pending", overrides)
        if wait is not None:
            pending += capacity_seconds(minute_seconds, wait, overrides)
        phases.append(("PENDING", pending))
    phases.append(("PROVISIONING", capacity_seconds(minute_seconds, "vm_provisioning", overrides)))
    phases.append(("STAGING", capacity_seconds(minute_seconds, "vm_staging", overrides)))
    phases.append((BILLED, 0.0))
    return phases


def schedule(record: dict[str, Any], phases: Iterable[tuple[str, float]], begin: float) -> float:
    """Append ``phases`` (state, seconds) to the record's timeline from ``begin``; the moment the
    last state begins. States scheduled before and not reached yet are dropped (a delete during a
    create's PROVISIONING): settle the record to ``begin`` first."""
    timeline = record.setdefault("timeline", [])
    del timeline[int(record.get("applied", 0)) :]
    moment = begin
    last = begin
    for status, seconds in phases:
        timeline.append([status, moment])
        last = moment
        moment += max(0.0, seconds)
    return last


def until_held(
    phases: Sequence[tuple[str, float]], held: Collection[str]
) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """``phases`` up to the first held state (sandbox setting ``held_vm_states``), that state
    included, and the phases after it: a VM is scheduled into a held state and no further until
    the hold ends."""
    for index, (status, _) in enumerate(phases):
        if status in held:
            return list(phases[: index + 1]), list(phases[index + 1 :])
    return list(phases), []


def settle(record: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """The record's ``status``, ``lastStartTimestamp`` and ``lastStopTimestamp`` as of ``now``
    (changed in place; returned): the timeline's entries not applied yet that are due."""
    moment = time.time() if now is None else now
    timeline = record.get("timeline", [])
    applied = int(record.get("applied", 0))  # entries applied already (a test may set status itself)
    while applied < len(timeline) and timeline[applied][1] <= moment:
        status, at = timeline[applied]
        applied += 1
        record["status"] = status
        if status == BILLED:
            record["lastStartTimestamp"] = api_time(at)
        elif status == "TERMINATED":
            record["lastStopTimestamp"] = api_time(at)
    record["applied"] = applied
    return record


def settled(record: Mapping[str, Any], now: float | None = None) -> dict[str, Any]:
    """A settled copy of an instance record."""
    copy = dict(record)
    copy["timeline"] = [list(entry) for entry in record.get("timeline", [])]
    return settle(copy, now)


def add_operation(
    txn: Any,
    project: str,
    zone: str,
    kind: str,
    name: str,
    target_id: str,
    *,
    started: float,
    ended: float | None = None,
    user: str = "",
) -> dict[str, Any]:
    """A zone operation on instance ``name`` (its incarnation ``target_id``), requested and started
    at ``started``; DONE at ``ended`` when given, else RUNNING until :func:`finish_operation`."""
    ops = txn.doc("operations").setdefault(f"{project}/{zone}", [])
    millis = int(started * 1000)
    import secrets

    op_name = f"operation-{millis}-{secrets.token_hex(6)}-{secrets.token_hex(4)}-{secrets.token_hex(4)}"
    op: dict[str, Any] = {
        "kind": "compute#operation",
        "id": new_id(),
        "name": op_name,
        "zone": f"{API}/projects/{project}/zones/{zone}",
        "operationType": kind,
        "targetLink": instance_url(project, zone, name),
        "targetId": target_id,
        "status": "RUNNING",
        "user": user,
        "progress": 0,
        "insertTime": api_time(started),
        "startTime": api_time(started),
        "selfLink": f"{API}/projects/{project}/zones/{zone}/operations/{op_name}",
    }
    if ended is not None:
        op.update(status="DONE", progress=100, endTime=api_time(ended))
    ops.append(op)
    txn.save("operations")
    return op


def finish_operation(txn: Any, project: str, zone: str, op_name: str, ended: float) -> None:
    """The operation ``op_name`` is DONE at ``ended``."""
    for op in txn.doc("operations").get(f"{project}/{zone}", []):
        if op["name"] == op_name:
            op.update(status="DONE", progress=100, endTime=api_time(ended))
    txn.save("operations")


def begin_transition(
    txn: Any,
    project: str,
    zone: str,
    name: str,
    kind: str,
    phases: Iterable[tuple[str, float]],
    started: float,
    *,
    user: str = "",
) -> tuple[str, float]:
    """A start or stop of the settled instance ``name``: its ``phases`` scheduled from ``started``,
    its zone operation ``kind`` begun, the moment noted in its latest life in ``vm_history``
    (``started`` or ``stopped``). Returns the operation's name and the moment its last phase begins
    (:func:`finish_transitions` then, once the caller has waited for it)."""
    key = f"{project}/{zone}/{name}"
    record = txn.doc("vms")[key]
    done_at = schedule(record, phases, started)
    settle(record, started)
    op_name = str(
        add_operation(txn, project, zone, kind, name, str(record.get("id", "")), started=started, user=user)[
            "name"
        ]
    )
    lives = txn.doc("vm_history").get(key) or []
    if lives:
        lives[-1].setdefault("started" if kind == "start" else "stopped", []).append(started)
        txn.save("vm_history")
    return op_name, done_at


def finish_transitions(txn: Any, project: str, zone: str, begun: Mapping[str, str], done_at: float) -> None:
    """The instances' transitions :func:`begin_transition` began (name -> operation) are over at
    ``done_at``: each settled to it, its operation DONE."""
    vms = txn.doc("vms")
    for name, op_name in begun.items():
        record = vms.get(f"{project}/{zone}/{name}")
        if record is not None:
            settle(record, done_at)
        finish_operation(txn, project, zone, op_name, done_at)
    txn.save("vms")


def operations(doc: Mapping[str, Any], project: str, zones: Iterable[str] | None) -> list[dict[str, Any]]:
    """The zone operations of ``project`` in ``zones`` (None: every zone), oldest first."""
    wanted = None if zones is None else set(zones)
    found: list[dict[str, Any]] = []
    for key, ops in doc.items():
        owner, _, zone = key.partition("/")
        if owner == project and (wanted is None or zone in wanted):
            found.extend(ops)
    return found
