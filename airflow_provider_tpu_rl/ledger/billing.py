"""Billed TPU time from the machines' own clocks (no Airflow import).

Compute Engine bills a VM from its start until its delete or stop is accepted, per second with a
one-minute minimum (docs/ledger.md, "What the TPU bills", cites the pages and how directly they
say it). What a machine's clocks give:

* an instance's ``lastStartTimestamp`` ("Last start timestamp in RFC3339 text format", gcloud 528's
  compute v1 client, class ``Instance``): when its **latest** RUNNING span began. Only the latest is
  kept, so the provider notes each one while the instance exists (:func:`observe_instance`);
* a zone operation (class ``Operation``: ``operationType``, ``targetLink``, ``targetId`` "the
  incarnation of the target resource", ``insertTime`` "requested", ``startTime`` "started by the
  server", ``endTime`` "completed") of the delete, stop, suspend or preemption that ended a span:
  its ``startTime`` is when Compute Engine began to stop the instance (STOPPING), the moment billing
  ends. ``insertTime`` can be earlier (a request waiting behind another operation on the instance,
  the VM still running); ``endTime`` is later (the guest's shutdown, already unbilled).

A span whose start no observation saw (a node an autoscaling pool added and removed between two
looks) starts at the ``endTime`` of its insert or start operation: an inference (nothing states
when an insert operation completes relative to RUNNING), marked ``start_from="operation"``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

# "All vCPUs, GPUs, and GB of memory are charged a minimum of 1 minute ... After 1 minute, instances
# are charged in 1-second increments" (cloud.google.com/compute/vm-instance-pricing, "Billing model").
MINIMUM_SECONDS = 60.0
# The operations that end a RUNNING span (Compute Engine sets the instance STOPPING) and those that
# begin one; compute.instances.preempted is the system operation of a preemption (Google's sample
# "List preemption history": operationType="compute.instances.preempted").
ENDING_OPERATIONS = frozenset({"delete", "stop", "suspend", "compute.instances.preempted"})
STARTING_OPERATIONS = frozenset({"insert", "start", "resume"})
# ct6e-standard-4t: 4 chips (cluster-toolkit pkg/config/hardware.go: v6e-1/4/8 are ct6e-standard-1t/4t/8t).
_TPU_MACHINE_TYPE = re.compile(r"^ct[0-9a-z]+-[a-z]+-(?P<chips>[0-9]+)t$")
_NEVER = datetime.max.replace(tzinfo=UTC)


def as_utc(value: datetime | str | None) -> datetime | None:
    """A timezone-aware UTC datetime from a datetime or an ISO-8601 string (naive means UTC)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def chips_of_machine_type(machine_type: str | None) -> int:
    """TPU chips of a Compute Engine machine type (a URL or a name); 0 for a machine without TPUs."""
    name = str(machine_type or "").rsplit("/", 1)[-1]
    match = _TPU_MACHINE_TYPE.match(name)
    return int(match["chips"]) if match else 0


def _timestamp(value: Any) -> datetime | None:
    """An RFC 3339 timestamp of the API (``2026-03-04T05:06:07.123-08:00``), else None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return as_utc(datetime.fromisoformat(value.replace("Z", "+00:00")))
    except ValueError:
        return None


def _name_of(link: Any) -> str:
    return str(link or "").rstrip("/").rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Observation:
    """One look at an instance: its incarnation (``id``) and when its latest RUNNING span began."""

    name: str
    instance_id: str
    chips: int
    status: str
    started_at: datetime | None  # lastStartTimestamp: None before its first start
    stopped_at: datetime | None = None  # lastStopTimestamp

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "id": self.instance_id,
            "chips": self.chips,
            "status": self.status,
            "lastStartTimestamp": self.started_at.isoformat() if self.started_at else None,
            "lastStopTimestamp": self.stopped_at.isoformat() if self.stopped_at else None,
        }

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> Observation | None:
        """An observation noted with :meth:`as_dict`, or None for anything else."""
        if not isinstance(value, Mapping) or not value.get("name") or not value.get("id"):
            return None
        return cls(
            name=str(value["name"]),
            instance_id=str(value["id"]),
            chips=int(value.get("chips") or 0),
            status=str(value.get("status") or ""),
            started_at=_timestamp(value.get("lastStartTimestamp")),
            stopped_at=_timestamp(value.get("lastStopTimestamp")),
        )


def observe_instance(resource: Mapping[str, Any]) -> Observation | None:
    """An instance resource (``gcloud compute instances describe|list --format=json``) as an
    :class:`Observation`; None when it is not one (no name or id)."""
    if not isinstance(resource, Mapping) or not resource.get("name") or not resource.get("id"):
        return None
    return Observation(
        name=str(resource["name"]),
        instance_id=str(resource["id"]),
        chips=chips_of_machine_type(resource.get("machineType")),
        status=str(resource.get("status") or ""),
        started_at=_timestamp(resource.get("lastStartTimestamp")),
        stopped_at=_timestamp(resource.get("lastStopTimestamp")),
    )


@dataclass(frozen=True)
class Operation:
    """A zone operation on an instance (``gcloud compute operations list --format=json``)."""

    operation_type: str
    target: str  # the instance's name
    target_id: str
    status: str
    inserted_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None


def parse_operation(resource: Mapping[str, Any]) -> Operation | None:
    """A zone operation on an instance, or None (another kind of target, or not an operation)."""
    if not isinstance(resource, Mapping) or "/instances/" not in str(resource.get("targetLink") or ""):
        return None
    return Operation(
        operation_type=str(resource.get("operationType") or ""),
        target=_name_of(resource.get("targetLink")),
        target_id=str(resource.get("targetId") or ""),
        status=str(resource.get("status") or ""),
        inserted_at=_timestamp(resource.get("insertTime")),
        started_at=_timestamp(resource.get("startTime")),
        ended_at=_timestamp(resource.get("endTime")),
    )


def span_seconds(started_at: datetime, ended_at: datetime | None) -> float | None:
    """Seconds from ``started_at`` to ``ended_at`` (0 at least); None when it has no end."""
    return None if ended_at is None else max(0.0, (ended_at - started_at).total_seconds())


def billed_seconds_of(seconds: float | None, minimum: float = MINIMUM_SECONDS) -> float | None:
    """What a machine that ran ``seconds`` in one span is billed: at least ``minimum``, per second
    after it (None when the seconds are unknown)."""
    return None if seconds is None else max(minimum, seconds)


@dataclass(frozen=True)
class BilledSpan:
    """One RUNNING span of one machine: billed from ``started_at`` to ``ended_at`` (None: it had
    not ended when last read) for ``chips`` TPU chips."""

    machine: str
    instance_id: str
    chips: int
    started_at: datetime
    ended_at: datetime | None
    ended_by: str | None = None  # the operation that ended it (delete, stop, ...)
    start_from: str = "lastStartTimestamp"  # or "operation": the insert/start operation's endTime

    def seconds(self, now: datetime | None = None) -> float | None:
        """Seconds it ran (to ``now`` when it has not ended); None when unknown."""
        return span_seconds(self.started_at, self.ended_at or as_utc(now))

    def billed_seconds(self, now: datetime | None = None, minimum: float = MINIMUM_SECONDS) -> float | None:
        """:meth:`seconds` with the minimum a started machine is billed."""
        return billed_seconds_of(self.seconds(now), minimum)

    def as_dict(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "id": self.instance_id,
            "chips": self.chips,
            "started_at": self.started_at.isoformat(),
            "ended_at": self.ended_at.isoformat() if self.ended_at else None,
            "ended_by": self.ended_by,
            "start_from": self.start_from,
        }

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> BilledSpan | None:
        """A span written with :meth:`as_dict`, or None for anything else."""
        if not isinstance(value, Mapping):
            return None
        started = _timestamp(value.get("started_at"))
        if started is None or not value.get("machine"):
            return None
        return cls(
            machine=str(value["machine"]),
            instance_id=str(value.get("id") or ""),
            chips=int(value.get("chips") or 0),
            started_at=started,
            ended_at=_timestamp(value.get("ended_at")),
            ended_by=str(value["ended_by"]) if value.get("ended_by") else None,
            start_from=str(value.get("start_from") or "lastStartTimestamp"),
        )


def _ending(operation: Operation) -> datetime | None:
    """When an ending operation set the instance STOPPING: its ``startTime`` (None: not started yet)."""
    return operation.started_at if operation.operation_type in ENDING_OPERATIONS else None


def machine_spans(
    observations: Iterable[Observation],
    operations: Iterable[Operation],
    *,
    adopt_since: datetime | None = None,
    chips_by_name: Mapping[str, int] | None = None,
) -> list[BilledSpan]:
    """The RUNNING spans of the observed machines, each ended by the first ending operation on the
    same incarnation (``targetId``) after its start; a span no operation ended yet is open.

    ``adopt_since``: also count the incarnations no observation saw whose insert or start operation
    was requested at or after it (a node an autoscaling pool added and removed between two looks):
    each starts at that operation's ``endTime``. Their chips come from ``chips_by_name`` (by the
    machine's name), else from the observed machines of the same name prefix, else 0.
    """
    ops = sorted(operations, key=lambda op: op.started_at or op.inserted_at or _NEVER)
    starts: dict[tuple[str, str], tuple[str, int, set[datetime], str]] = {}
    for seen in observations:
        if seen.started_at is None:
            continue
        key = (seen.name, seen.instance_id)
        name, chips, times, source = starts.get(key, (seen.name, seen.chips, set(), "lastStartTimestamp"))
        times.add(seen.started_at)
        starts[key] = (name, max(chips, seen.chips), times, source)
    observed_ids = {instance_id for _, instance_id in starts}
    if adopt_since is not None:
        since = as_utc(adopt_since)
        for op in ops:
            if op.operation_type not in STARTING_OPERATIONS or op.target_id in observed_ids:
                continue
            if op.ended_at is None or op.inserted_at is None or since is None or op.inserted_at < since:
                continue
            given = (chips_by_name or {}).get(op.target)
            adopted = (
                given
                if given is not None
                else max(
                    (c for (n, _), (_, c, _, _) in starts.items() if _same_group(n, op.target)), default=0
                )
            )
            key = (op.target, op.target_id)
            name, known, times, _ = starts.get(key, (op.target, adopted, set(), "operation"))
            times.add(op.ended_at)
            starts[key] = (name, known, times, "operation")
    spans: list[BilledSpan] = []
    for (name, instance_id), (_, chips, times, source) in starts.items():
        ordered = sorted(times)
        for index, started in enumerate(ordered):
            following = ordered[index + 1] if index + 1 < len(ordered) else None
            end_op = next(
                (
                    op
                    for op in ops
                    if op.target_id == instance_id
                    and (when := _ending(op)) is not None
                    and when >= started
                    and (following is None or when <= following)
                ),
                None,
            )
            ended = _ending(end_op) if end_op else None
            if ended is None and following is not None:
                ended = following  # restarted without an ending operation read: it cannot run twice
            spans.append(
                BilledSpan(
                    machine=name,
                    instance_id=instance_id,
                    chips=chips,
                    started_at=started,
                    ended_at=ended,
                    ended_by=end_op.operation_type if end_op else None,
                    start_from=source,
                )
            )
    return sorted(spans, key=lambda span: (span.started_at, span.machine))


def _same_group(observed: str, target: str) -> bool:
    """Two names of the same managed instance group: the same base name before the MIG's
    ``-xxxx`` suffix (``baseInstanceName``: "the MIG appends a hyphen and a random four-character
    string to the base instance name", gcloud 528's compute v1 client)."""
    return observed.rsplit("-", 1)[0] == target.rsplit("-", 1)[0]


def base_instance_names(names: Iterable[str]) -> list[str]:
    """The managed instance groups' base names of node VM names (their last ``-xxxx`` dropped)."""
    return sorted({name.rsplit("-", 1)[0] for name in names if "-" in name})


def merged(spans: Sequence[BilledSpan], now: datetime | None = None) -> list[BilledSpan]:
    """``spans`` with each machine's overlapping spans folded into one (a machine is not billed
    twice for the same second); an open span overlaps everything after its start."""
    by_machine: dict[str, list[BilledSpan]] = {}
    for span in sorted(spans, key=lambda s: (s.machine, s.started_at)):
        folded = by_machine.setdefault(span.machine, [])
        last = folded[-1] if folded else None
        if last is None or (last.ended_at is not None and span.started_at > last.ended_at):
            folded.append(span)
            continue
        later = (
            span
            if span.ended_at is None or (last.ended_at is not None and span.ended_at > last.ended_at)
            else last
        )
        folded[-1] = replace(
            last,
            ended_at=None if last.ended_at is None or span.ended_at is None else later.ended_at,
            ended_by=None if last.ended_at is None else later.ended_by,
            chips=max(last.chips, span.chips),
        )
    return sorted(
        (s for group in by_machine.values() for s in group), key=lambda s: (s.started_at, s.machine)
    )


def billed_chip_seconds(
    spans: Sequence[BilledSpan], now: datetime | None = None, minimum: float = MINIMUM_SECONDS
) -> float | None:
    """TPU chip-seconds billed for ``spans``: each machine's spans (overlaps folded), each at least
    ``minimum`` seconds, times its chips. Open spans run to ``now`` (None when one is open and
    ``now`` is None)."""
    total = 0.0
    for span in merged(spans, now):
        seconds = span.billed_seconds(now, minimum)
        if seconds is None:
            return None
        total += seconds * span.chips
    return total


def spans_from_json(value: Any) -> tuple[BilledSpan, ...] | None:
    """Spans from their JSON list (:meth:`BilledSpan.as_dict`); None when ``value`` is not a list."""
    if not isinstance(value, list):
        return None
    return tuple(span for item in value if (span := BilledSpan.from_dict(item)) is not None)


def closed_at(spans: Iterable[BilledSpan], now: datetime) -> tuple[BilledSpan, ...]:
    """Open spans ended at ``now`` (``ended_by`` ``still running``): what the ledger stores when
    a machine still runs (or its end could not be read) as the run is recorded."""
    return tuple(
        span if span.ended_at is not None else replace(span, ended_at=as_utc(now), ended_by="still running")
        for span in spans
    )


# The XCom key of a CPU VM's billed spans in its task's result: the bake VM's, under the
# ``bake_image`` task's ``return_value`` (operators/boot_image.py): a list of {"name", "zone",
# "machine_type", "started", "ended"}, RFC 3339 times.
VM_SPANS_KEY = "vm_spans"


@dataclass(frozen=True)
class VmSpan:
    """One RUNNING span of a CPU VM a run used (``purpose``: ``bake``, the TPU VM's boot image):
    billed from ``started_at`` to ``ended_at`` by Compute Engine's rule (:func:`billed_seconds`),
    priced by its ``machine_type``'s vCPUs and memory."""

    purpose: str
    name: str
    zone: str
    machine_type: str
    started_at: datetime
    ended_at: datetime | None

    @property
    def seconds(self) -> float | None:
        """Seconds it ran; None when its end is unknown."""
        return span_seconds(self.started_at, self.ended_at)

    @property
    def billed_seconds(self) -> float | None:
        """:attr:`seconds` with the minute a started VM is billed at least."""
        return billed_seconds_of(self.seconds)

    @classmethod
    def from_result(cls, purpose: str, value: Any) -> VmSpan | None:
        """A span as a task returned it under :data:`VM_SPANS_KEY`, or None (no name or start)."""
        if not isinstance(value, Mapping):
            return None
        started = _timestamp(value.get("started"))
        if started is None or not value.get("name"):
            return None
        return cls(
            purpose=purpose,
            name=str(value["name"]),
            zone=str(value.get("zone") or ""),
            machine_type=_name_of(value.get("machine_type")),
            started_at=started,
            ended_at=_timestamp(value.get("ended")),
        )


def vm_spans_from_result(purpose: str, result: Any, now: datetime) -> tuple[VmSpan, ...]:
    """The CPU VM spans a task's result holds under :data:`VM_SPANS_KEY` (none when it holds
    none); a span without an end is billed up to ``now``, when the run is recorded."""
    found = result.get(VM_SPANS_KEY) if isinstance(result, Mapping) else None
    if not isinstance(found, list):
        return ()
    spans = (span for item in found if (span := VmSpan.from_result(purpose, item)) is not None)
    return tuple(span if span.ended_at else replace(span, ended_at=as_utc(now)) for span in spans)
