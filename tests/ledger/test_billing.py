"""Billed time from the machines' clocks: instance and operation parsing, spans, the arithmetic."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from airflow_provider_tpu_rl.ledger.billing import (
    MINIMUM_SECONDS,
    VM_SPANS_KEY,
    BilledSpan,
    Observation,
    VmSpan,
    base_instance_names,
    billed_chip_seconds,
    chips_of_machine_type,
    closed_at,
    machine_spans,
    merged,
    observe_instance,
    parse_operation,
    spans_from_json,
    vm_spans_from_result,
)

T0 = datetime(2026, 3, 4, 13, 0, tzinfo=UTC)
ZONE_URL = "https://www.googleapis.com/compute/v1/projects/p1/zones/us-east5-b"


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def pacific(minutes: float) -> str:
    """A timestamp as the Compute Engine API writes it: RFC 3339 in Pacific time, milliseconds."""
    moment = at(minutes).astimezone(ZoneInfo("America/Los_Angeles"))
    return moment.isoformat(timespec="milliseconds")


def operation(kind: str, name: str, target_id: str, start: float | None, **more: object) -> dict[str, object]:
    resource: dict[str, object] = {
        "kind": "compute#operation",
        "operationType": kind,
        "targetLink": f"{ZONE_URL}/instances/{name}",
        "targetId": target_id,
        "status": "DONE",
        "insertTime": pacific(start if start is not None else 0),
    }
    if start is not None:
        resource["startTime"] = pacific(start)
        resource["endTime"] = pacific(start + 0.5)
    resource.update(more)
    return resource


def span(machine: str, start: float, end: float | None, chips: int = 8) -> BilledSpan:
    return BilledSpan(machine, "1", chips, at(start), None if end is None else at(end))


def test_an_instance_resource_is_observed_as_the_api_writes_it() -> None:
    seen = observe_instance(
        {
            "name": "vm1",
            "id": "4567",
            "status": "RUNNING",
            "machineType": f"{ZONE_URL}/machineTypes/ct6e-standard-8t",
            "creationTimestamp": pacific(-5),
            "lastStartTimestamp": pacific(-1),
            "lastStopTimestamp": pacific(-3),
        }
    )
    assert seen == Observation("vm1", "4567", 8, "RUNNING", at(-1), at(-3))
    assert Observation.from_dict(seen.as_dict()) == seen
    # PENDING / PROVISIONING: no start yet
    pending = observe_instance({"name": "vm1", "id": "4567", "status": "PENDING"})
    assert pending is not None
    assert pending.started_at is None
    assert observe_instance({"status": "RUNNING"}) is None


@pytest.mark.parametrize(
    ("machine_type", "chips"),
    [
        ("ct6e-standard-8t", 8),
        (f"{ZONE_URL}/machineTypes/ct6e-standard-4t", 4),
        ("n2-highmem-32", 0),
        (None, 0),
    ],
)
def test_tpu_chips_come_from_the_machine_type(machine_type: str | None, chips: int) -> None:
    assert chips_of_machine_type(machine_type) == chips


def test_an_operation_is_parsed_and_other_targets_are_not() -> None:
    op = parse_operation(operation("delete", "vm1", "4567", 10))
    assert op is not None
    assert (op.operation_type, op.target, op.target_id, op.started_at) == ("delete", "vm1", "4567", at(10))
    assert parse_operation({"operationType": "insert", "targetLink": f"{ZONE_URL}/disks/d1"}) is None


def test_a_span_runs_from_the_start_to_the_start_of_its_delete_not_its_request_nor_end() -> None:
    observed = [Observation("vm1", "1", 8, "RUNNING", at(2))]
    ops = [
        parse_operation(operation("insert", "vm1", "1", 0)),
        # requested at 9, started by the server at 10 (STOPPING), done at 10.5
        parse_operation(operation("delete", "vm1", "1", 10, insertTime=pacific(9))),
    ]
    (billed,) = machine_spans(observed, [op for op in ops if op])
    assert (billed.started_at, billed.ended_at, billed.ended_by) == (at(2), at(10), "delete")
    assert billed_chip_seconds([billed]) == pytest.approx(8 * 8 * 60)


def test_each_start_of_a_spot_vm_is_its_own_span_ended_by_the_preemption_then_the_delete() -> None:
    observed = [
        Observation("vm1", "1", 8, "RUNNING", at(2)),
        Observation("vm1", "1", 8, "TERMINATED", at(2), at(20)),
        Observation("vm1", "1", 8, "RUNNING", at(31)),
    ]
    ops = [
        parse_operation(operation("compute.instances.preempted", "vm1", "1", 20)),
        parse_operation(operation("start", "vm1", "1", 30)),
        parse_operation(operation("delete", "vm1", "1", 50)),
    ]
    first, second = machine_spans(observed, [op for op in ops if op])
    assert (first.started_at, first.ended_at, first.ended_by) == (
        at(2),
        at(20),
        "compute.instances.preempted",
    )
    assert (second.started_at, second.ended_at, second.ended_by) == (at(31), at(50), "delete")
    assert billed_chip_seconds([first, second]) == pytest.approx(8 * (18 + 19) * 60)


def test_a_re_created_vm_is_another_incarnation_and_an_older_ones_operations_do_not_end_it() -> None:
    observed = [Observation("vm1", "1", 8, "RUNNING", at(2)), Observation("vm1", "2", 8, "RUNNING", at(30))]
    ops = [
        operation("delete", "vm1", "0", -60),  # an earlier run's VM of the same name
        operation("compute.instances.preempted", "vm1", "1", 20),
        operation("delete", "vm1", "2", 40),
    ]
    spans = machine_spans(observed, [p for op in ops if (p := parse_operation(op))])
    assert [(s.instance_id, s.started_at, s.ended_at) for s in spans] == [
        ("1", at(2), at(20)),
        ("2", at(30), at(40)),
    ]


def test_a_span_no_operation_ended_is_open_and_runs_to_now() -> None:
    (open_span,) = machine_spans([Observation("vm1", "1", 8, "RUNNING", at(2))], [])
    assert open_span.ended_at is None
    assert billed_chip_seconds([open_span]) is None  # no "now": unknown
    assert billed_chip_seconds([open_span], now=at(12)) == pytest.approx(8 * 600)
    (closed,) = closed_at([open_span], at(12))
    assert (closed.ended_at, closed.ended_by) == (at(12), "still running")


def test_an_operation_not_started_yet_ends_nothing() -> None:
    pending_delete = parse_operation(operation("delete", "vm1", "1", None, status="PENDING"))
    assert pending_delete is not None
    (still,) = machine_spans([Observation("vm1", "1", 8, "RUNNING", at(2))], [pending_delete])
    assert still.ended_at is None


def test_every_span_bills_at_least_a_minute() -> None:
    short = [span("vm1", 0, 0.25), span("vm1", 5, 5.5)]
    assert billed_chip_seconds(short) == pytest.approx(2 * MINIMUM_SECONDS * 8)
    assert billed_chip_seconds(short, minimum=0) == pytest.approx((15 + 30) * 8)
    assert billed_chip_seconds([]) == 0.0


def test_overlapping_spans_of_one_machine_bill_once_in_any_order() -> None:
    spans = [span("vm1", 10, 30), span("vm1", 0, 15), span("node-b", 0, 10, chips=4)]
    folded = merged(spans)
    assert [(s.machine, s.started_at, s.ended_at) for s in folded] == [
        ("node-b", at(0), at(10)),
        ("vm1", at(0), at(30)),
    ]
    assert billed_chip_seconds(spans) == pytest.approx(8 * 30 * 60 + 4 * 10 * 60)
    # an open span swallows what starts after it
    assert merged([span("vm1", 0, None), span("vm1", 5, 8)])[0].ended_at is None


def test_two_observed_starts_with_no_ending_read_between_them_do_not_overlap() -> None:
    observed = [Observation("vm1", "1", 8, "RUNNING", at(0)), Observation("vm1", "1", 8, "RUNNING", at(20))]
    first, second = machine_spans(observed, [])
    assert (first.ended_at, second.ended_at) == (at(20), None)


def test_a_node_an_autoscaled_pool_added_and_removed_between_looks_comes_from_its_operations() -> None:
    observed = [Observation("gke-c1-tpu-pool-1a2b3c4d-abcd", "1", 4, "RUNNING", at(5))]
    ops = [
        operation("insert", "gke-c1-tpu-pool-1a2b3c4d-abcd", "1", 3),
        operation("insert", "gke-c1-tpu-pool-1a2b3c4d-wxyz", "2", 12),  # endTime 12.5
        operation("delete", "gke-c1-tpu-pool-1a2b3c4d-wxyz", "2", 40),
        operation("insert", "gke-c1-tpu-pool-1a2b3c4d-old1", "9", -100),  # before this run
        operation("delete", "gke-c1-tpu-pool-1a2b3c4d-abcd", "1", 60),
    ]
    parsed = [p for op in ops if (p := parse_operation(op))]
    spans = machine_spans(observed, parsed, adopt_since=at(0))
    assert [(s.machine[-4:], s.started_at, s.ended_at, s.chips, s.start_from) for s in spans] == [
        ("abcd", at(5), at(60), 4, "lastStartTimestamp"),
        ("wxyz", at(12.5), at(40), 4, "operation"),
    ]
    assert len(machine_spans(observed, parsed)) == 1  # without adopt_since only what was seen
    assert base_instance_names(["gke-c1-tpu-pool-1a2b3c4d-abcd", "gke-c1-tpu-pool-1a2b3c4d-wxyz"]) == [
        "gke-c1-tpu-pool-1a2b3c4d"
    ]


def test_spans_round_trip_through_json() -> None:
    spans = (span("vm1", 0, 10), BilledSpan("vm1", "2", 8, at(20), None, None, "operation"))
    assert spans_from_json([s.as_dict() for s in spans]) == spans
    assert spans_from_json("not a list") is None
    assert spans_from_json([{"machine": "x"}, "junk"]) == ()


def bake_span(start: float, end: float | None) -> dict[str, object]:
    """A bake VM's span as ``bake_image`` returns it (operators/boot_image.py, ``vm_span``)."""
    return {
        "name": "tpu-rl-bake-0301",
        "zone": "us-east5-b",
        "machine_type": "n2-standard-8",
        "started": pacific(start),
        "ended": None if end is None else at(end).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z",
    }


def test_a_bake_vm_span_bills_a_minute_at_least_then_per_second() -> None:
    result = {VM_SPANS_KEY: [bake_span(0, 0.5), bake_span(10, 17.25)]}
    short, long = vm_spans_from_result("bake", result, at(60))
    assert (short.purpose, short.name, short.zone, short.machine_type) == (
        "bake",
        "tpu-rl-bake-0301",
        "us-east5-b",
        "n2-standard-8",
    )
    assert (short.started_at, short.ended_at) == (at(0), at(0.5))
    assert (short.seconds, short.billed_seconds) == (30.0, MINIMUM_SECONDS)
    assert (long.seconds, long.billed_seconds) == (435.0, 435.0)


def test_a_bake_span_without_its_end_is_billed_up_to_the_recording() -> None:
    (span_,) = vm_spans_from_result("bake", {VM_SPANS_KEY: [bake_span(0, None)]}, at(3))
    assert (span_.ended_at, span_.billed_seconds) == (at(3), 180.0)


@pytest.mark.parametrize(
    "result",
    [None, {}, {VM_SPANS_KEY: []}, {VM_SPANS_KEY: "junk"}, {VM_SPANS_KEY: [{"name": "x"}, "junk"]}],
)
def test_a_result_without_vm_spans_gives_none(result: object) -> None:
    assert vm_spans_from_result("bake", result, at(3)) == ()
    assert VmSpan.from_result("bake", {"started": pacific(0)}) is None  # no name
