"""The fake Compute Engine instances go through the states a real one does, with the timestamps
and zone operations the API returns: PENDING (a TPU) → PROVISIONING → STAGING → RUNNING on a
create or start, STOPPING → gone on a delete, STOPPING → TERMINATED on a preemption."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest

from tests.sandbox.conftest import Cli, wait_for
from tests.support.waiting import HANG_BOUND
from tpu_rl_sandbox.clis.gcloud.app import Gcloud
from tpu_rl_sandbox.world.settings import update_settings

# RFC 3339 in Pacific time with milliseconds, as the Compute Engine API writes its timestamps
API_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}-0[78]:00$")
SCALE = 1.0  # sandbox seconds per real minute (each state lasts long enough for a describe under load)


@pytest.fixture
def slow_capacity(cli: Cli) -> Iterator[None]:
    """Provisioning and staging of 2 and 1 real minutes, stopping of 1, at SCALE."""
    update_settings(
        cli.layout,
        minute_seconds=SCALE,
        capacity_minutes={
            "vm_provisioning": 2.0,
            "vm_staging": 1.0,
            "vm_stopping": 1.0,
            "flex_start_wait": 2.0,
        },
    )
    try:
        yield
    finally:
        update_settings(cli.layout, minute_seconds=0.0, capacity_minutes={})


def _create(cli: Cli, names: dict[str, str], vm: str, *capacity: str, track: tuple[str, ...] = ()) -> Any:
    return cli.gcloud(
        *track,
        "compute",
        "instances",
        "create",
        vm,
        f"--zone={names['zone']}",
        f"--project={names['project']}",
        "--machine-type=ct6e-standard-8t",
        "--image-project=ubuntu-os-accelerator-images",
        "--image-family=ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e",
        "--maintenance-policy=TERMINATE",
        *capacity,
    )


def _describe(cli: Cli, names: dict[str, str], vm: str) -> dict[str, Any]:
    result = cli.gcloud(
        "compute", "instances", "describe", vm, f"--zone={names['zone']}", f"--project={names['project']}",
        "--format=json",
    )  # fmt: skip
    assert result.code == 0, result.text
    return dict(json.loads(result.out))


def _operations(cli: Cli, names: dict[str, str], vm: str) -> list[dict[str, Any]]:
    result = cli.gcloud(
        "compute", "operations", "list", f"--zones={names['zone']}", f"--project={names['project']}",
        f'--filter=targetLink~"/instances/({vm})$"', "--format=json",
    )  # fmt: skip
    assert result.code == 0, result.text
    return list(json.loads(result.out))


def _seconds(earlier: str, later: str) -> float:
    return (datetime.fromisoformat(later) - datetime.fromisoformat(earlier)).total_seconds()


@pytest.fixture
def held_states(cli: Cli) -> Iterator[Callable[..., None]]:
    """Hold VMs in some states (sandbox setting ``held_vm_states``); every hold ends after the test."""

    def hold(*states: str) -> None:
        update_settings(cli.layout, held_vm_states=states)

    try:
        yield hold
    finally:
        hold()


def _status(cli: Cli, names: dict[str, str], vm: str) -> str:
    """The VM's status as ``describe`` gives it ("" while it does not exist)."""
    result = cli.gcloud(
        "compute", "instances", "describe", vm, f"--zone={names['zone']}", f"--project={names['project']}",
        "--format=value(status)",
    )  # fmt: skip
    return result.out.strip() if result.code == 0 else ""


def _in_thread(action: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """``action`` running in another thread (the gcloud that waits on the VM) and where its result goes."""
    results: list[Any] = []
    worker = threading.Thread(target=lambda: results.append(action()), daemon=True)
    worker.start()
    return worker, results


def _finish(worker: threading.Thread, results: list[Any]) -> Any:
    worker.join(HANG_BOUND)
    assert not worker.is_alive(), f"the gcloud waiting on the VM was still running after {HANG_BOUND:.0f} s"
    return results[0]


def test_a_tpu_vm_is_pending_provisioning_and_staging_before_it_runs_and_bills(
    cli: Cli, names: dict[str, str], held_states: Callable[..., None]
) -> None:
    vm = "life-tpu"
    held_states("PENDING", "PROVISIONING", "STAGING")
    creating, created = _in_thread(lambda: _create(cli, names, vm, "--provisioning-model=STANDARD"))
    # each state holds until the test lets it go, so a describe sees it however loaded the machine is
    for state, remaining in (
        ("PENDING", ("PROVISIONING", "STAGING")),
        ("PROVISIONING", ("STAGING",)),
        ("STAGING", ()),
    ):
        wait_for(lambda state=state: _status(cli, names, vm) == state, what=f"the VM's {state}")
        assert creating.is_alive()  # the create's gcloud waits through it
        (insert,) = _operations(cli, names, vm)
        assert insert["status"] == "RUNNING"
        assert "endTime" not in insert
        released = time.time()
        held_states(*remaining)
    result = _finish(creating, created)
    assert result.code == 0, result.text

    instance = _describe(cli, names, vm)
    assert instance["status"] == "RUNNING"
    for field in ("creationTimestamp", "lastStartTimestamp"):
        assert API_TIME.match(instance[field]), instance[field]
    assert "lastStopTimestamp" not in instance
    # billed only from RUNNING: after the test let STAGING go
    assert datetime.fromisoformat(instance["lastStartTimestamp"]).timestamp() >= released - 0.001

    (insert,) = _operations(cli, names, vm)
    assert (insert["operationType"], insert["status"], insert["targetId"]) == (
        "insert",
        "DONE",
        instance["id"],
    )
    assert insert["targetLink"].endswith(f"/projects/{names['project']}/zones/{names['zone']}/instances/{vm}")
    assert insert["insertTime"] == insert["startTime"] == instance["creationTimestamp"]
    assert insert["endTime"] == instance["lastStartTimestamp"]  # done once it runs

    held_states("STOPPING")
    where = (f"--zone={names['zone']}", f"--project={names['project']}")
    deleting, deleted = _in_thread(
        lambda: cli.gcloud("compute", "instances", "delete", vm, *where, "--quiet")
    )
    wait_for(lambda: _status(cli, names, vm) == "STOPPING", what="the VM's STOPPING")
    assert deleting.is_alive()  # billing ended at once; the VM goes after its shutdown
    held_states()
    result = _finish(deleting, deleted)
    assert result.code == 0, result.text
    _, delete = _operations(cli, names, vm)
    assert (delete["operationType"], delete["status"], delete["targetId"]) == (
        "delete",
        "DONE",
        instance["id"],
    )
    assert delete["startTime"] <= delete["endTime"]
    gone = cli.gcloud(
        "compute", "instances", "describe", vm, f"--zone={names['zone']}", f"--project={names['project']}"
    )
    assert gone.code == 1
    assert "was not found" in gone.err


@pytest.mark.usefixtures("slow_capacity")
def test_a_flex_start_request_waits_pending_unbilled(cli: Cli, names: dict[str, str]) -> None:
    vm = "life-flex"
    result = _create(
        cli, names, vm, "--provisioning-model=FLEX_START", "--max-run-duration=2h",
        "--instance-termination-action=DELETE", "--reservation-affinity=none", track=("alpha",),
    )  # fmt: skip
    assert result.code == 0, result.text
    instance = _describe(cli, names, vm)
    # its 2 real minutes queued, then provisioning and staging
    assert _seconds(instance["creationTimestamp"], instance["lastStartTimestamp"]) >= 5 * SCALE - 0.01


@pytest.fixture
def spot_tpu_restarts(cli: Cli) -> Iterator[None]:
    """Compute Engine's spot page: a Spot VM stopped by its termination action starts again."""
    update_settings(cli.layout, spot_tpu_restart=True)
    try:
        yield
    finally:
        update_settings(cli.layout, spot_tpu_restart=False)


@pytest.mark.usefixtures("spot_tpu_restarts")
def test_a_preempted_spot_vm_stops_and_a_start_begins_its_second_running_span(
    cli: Cli, names: dict[str, str]
) -> None:
    vm = "life-spot"
    result = _create(cli, names, vm, "--provisioning-model=SPOT", "--instance-termination-action=STOP")
    assert result.code == 0, result.text
    first = _describe(cli, names, vm)
    Gcloud(cli.layout, cli._env(None), lambda: b"", lambda _: None, lambda _: None)._preempt_vm(
        names["project"], names["zone"], vm
    )
    stopped = _describe(cli, names, vm)
    assert stopped["status"] == "TERMINATED"
    assert API_TIME.match(stopped["lastStopTimestamp"])
    assert stopped["lastStartTimestamp"] == first["lastStartTimestamp"]  # the API keeps the last start only

    time.sleep(0.01)
    started = cli.gcloud(
        "compute", "instances", "start", vm, f"--zone={names['zone']}", f"--project={names['project']}"
    )
    assert started.code == 0, started.text
    again = _describe(cli, names, vm)
    assert (again["status"], again["id"]) == ("RUNNING", first["id"])  # the same incarnation
    assert again["lastStartTimestamp"] > first["lastStartTimestamp"]

    kinds = [(op["operationType"], op["targetId"]) for op in _operations(cli, names, vm)]
    assert kinds == [
        ("insert", first["id"]),
        ("compute.instances.preempted", first["id"]),
        ("start", first["id"]),
    ]
    preempted = _operations(cli, names, vm)[1]
    assert preempted["startTime"] >= first["lastStartTimestamp"]


def test_a_preempted_spot_tpu_vm_cannot_start_again_by_default(cli: Cli, names: dict[str, str]) -> None:
    """Cloud TPU's spot page: "You can't restart TPU Spot VMs, and you must recreate them after
    preemption" (the setting's default); a start before any preemption, or of a Spot VM that is
    not a TPU, is not refused."""
    vm = "life-spot-tpu"
    assert (
        _create(cli, names, vm, "--provisioning-model=SPOT", "--instance-termination-action=STOP").code == 0
    )
    where = (f"--zone={names['zone']}", f"--project={names['project']}")
    assert cli.gcloud("compute", "instances", "stop", vm, *where).code == 0
    assert cli.gcloud("compute", "instances", "start", vm, *where).code == 0  # stopped by its owner
    Gcloud(cli.layout, cli._env(None), lambda: b"", lambda _: None, lambda _: None)._preempt_vm(
        names["project"], names["zone"], vm
    )
    refused = cli.gcloud("compute", "instances", "start", vm, *where)
    assert refused.code == 1
    assert refused.err.startswith("ERROR: (gcloud.compute.instances.start) Could not fetch resource:\n - ")
    assert "cannot be restarted" in refused.err
    assert _describe(cli, names, vm)["status"] == "TERMINATED"


def test_operations_list_takes_one_scope_and_a_quoted_regex(cli: Cli, names: dict[str, str]) -> None:
    both = cli.gcloud(
        "compute", "operations", "list", "--zones=us-east5-b", "--global", f"--project={names['project']}"
    )
    assert both.code == 2  # gcloud 528's own words, with an empty CLOUDSDK_CONFIG
    assert "argument --global: At most one of --global | --regions | --zones can be specified." in both.err
    unquoted = cli.gcloud(
        "compute", "operations", "list", "--zones=us-east5-b", f"--project={names['project']}",
        "--filter=targetLink~/instances/(a|b)$",
    )  # fmt: skip
    assert unquoted.code == 1
    assert "Unexpected tokens" in unquoted.err
    none = cli.gcloud("compute", "operations", "list", "--zones=us-east5-b", f"--project={names['project']}")
    assert (none.code, none.err) == (0, "Listed 0 items.\n")
