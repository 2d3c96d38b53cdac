"""The ledger bills the TPU VM by its own clocks, as Compute Engine does: from each start
(``lastStartTimestamp``) to the moment its stop, preemption or delete began (STOPPING), never the
create task's wait through PENDING/PROVISIONING/STAGING nor the delete's shutdown; and every
RUNNING span of a spot VM, its restart's included."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from airflow_provider_tpu_rl.compat import AirflowException
from airflow_provider_tpu_rl.ledger.billing import billed_chip_seconds, spans_from_json
from airflow_provider_tpu_rl.ledger.collect import (
    TPU_VM_CHIPS,
    TPU_VM_CLUSTER_TASK_IDS,
    collect_run_from_context,
)
from airflow_provider_tpu_rl.ledger.records import RunRecord
from airflow_provider_tpu_rl.operators.tpu_vm import (
    TpuVmCreateOperator,
    TpuVmDeleteOperator,
    TpuVmStageOperator,
)
from airflow_provider_tpu_rl.spec import TPU_VM_DAG_ID
from tests.support.ledger_fakes import FakeDagRun, FakeLedgerTaskInstance, FakeTaskInstance
from tests.support.sandbox_run import TPU_VM_CONVERSION_TASKS, RecordingTI, SandboxRun
from tpu_rl_sandbox.world.settings import update_settings

RUN_ID = "manual__2026-03-06T00:00:00+00:00"
START = datetime(2030, 1, 1, tzinfo=UTC)
SCALE = 0.5  # sandbox seconds per real minute
PROVISIONING_MINUTES, STOPPING_MINUTES = 4.0, 2.0


def _execute(sb: SandboxRun, factory: Any, conf: dict[str, Any], task_id: str, try_number: int = 1) -> Any:
    op = sb.operator(factory, dag_id=TPU_VM_DAG_ID, conf=conf, run_id=RUN_ID, task_id=task_id)
    return op.execute(sb.context(op, conf, run_id=RUN_ID, start_date=START, ti=RecordingTI(try_number)))


def _timed(sb: SandboxRun, factory: Any, conf: dict[str, Any], task_id: str) -> tuple[Any, FakeTaskInstance]:
    """Run a task; its result and its task instance as Airflow records it (start, end)."""
    started = datetime.now(UTC)
    result = _execute(sb, factory, conf, task_id)
    return result, FakeTaskInstance(task_id, "success", 1, started, datetime.now(UTC))


def _recorded(instances: list[FakeTaskInstance], xcoms: dict[str, Any]) -> RunRecord:
    """The run as record_run collects it from the pipeline's tasks."""
    context = {
        "dag_run": FakeDagRun(instances, dag_id=TPU_VM_DAG_ID, run_id=RUN_ID),
        "ti": FakeLedgerTaskInstance(xcoms),
    }
    run, *_ = collect_run_from_context(
        context, model="llama3.1-8b-Instruct", chips=TPU_VM_CHIPS, cluster_task_ids=TPU_VM_CLUSTER_TASK_IDS
    )
    return run


def _vm(sb: SandboxRun, conf: dict[str, Any]) -> dict[str, Any]:
    return dict(sb.state("vms")[f"{sb.project}/{conf['zone']}/{sb.vm}"])


@pytest.fixture
def slow_capacity(sb: SandboxRun) -> Iterator[None]:
    """A create that spends 4 (scaled) minutes PROVISIONING and a delete 2 STOPPING."""
    update_settings(
        sb.layout,
        minute_seconds=SCALE,
        capacity_minutes={
            "vm_provisioning": PROVISIONING_MINUTES,
            "vm_staging": 0.0,
            "vm_stopping": STOPPING_MINUTES,
        },
    )
    try:
        yield
    finally:
        update_settings(sb.layout, minute_seconds=0.0, capacity_minutes={})


@pytest.mark.usefixtures("slow_capacity")
def test_the_creates_provisioning_and_the_deletes_shutdown_bill_nothing(sb: SandboxRun) -> None:
    conf = sb.tpu_vm_conf()
    for task_id, factory in TPU_VM_CONVERSION_TASKS[:2]:  # the bucket, the HF token secret
        _execute(sb, factory, conf, task_id)
    _, create = _timed(sb, TpuVmCreateOperator, conf, "create_vm")
    started = datetime.fromisoformat(_vm(sb, conf)["lastStartTimestamp"])
    deleted, delete = _timed(sb, TpuVmDeleteOperator, conf, "delete_vm")

    run = _recorded([create, delete], {"delete_vm": deleted})
    assert run.billed_spans is not None
    (span,) = run.billed_spans
    assert create.start_date is not None
    assert delete.end_date is not None
    # the create task's 4 minutes of PROVISIONING come before the span, the delete's 2 minutes
    # of STOPPING after it: neither is billed
    assert (span.started_at - create.start_date).total_seconds() >= PROVISIONING_MINUTES * SCALE - 0.05
    assert span.ended_at is not None
    assert (delete.end_date - span.ended_at).total_seconds() >= STOPPING_MINUTES * SCALE - 0.05
    assert span.started_at == started  # its clock: when it entered RUNNING
    # it ends when the delete set it STOPPING (the operation's startTime), not when the delete was
    # done (endTime, after the 2 minutes of shutdown); the task's own end comes later still
    (delete_op,) = (
        op
        for op in sb.state("operations")[f"{sb.project}/{conf['zone']}"]
        if op["operationType"] == "delete" and op["targetLink"].endswith(f"/instances/{sb.vm}")
    )
    assert span.ended_at == datetime.fromisoformat(delete_op["startTime"])
    ended = datetime.fromisoformat(delete_op["endTime"])
    assert (ended - span.ended_at).total_seconds() >= STOPPING_MINUTES * SCALE - 0.05
    assert (span.machine, span.chips, span.ended_by) == (sb.vm, 8, "delete")
    held = (delete.end_date - create.start_date).total_seconds()
    billed = billed_chip_seconds(run.billed_spans, minimum=0.0)
    assert billed is not None
    assert billed / TPU_VM_CHIPS <= held - (PROVISIONING_MINUTES + STOPPING_MINUTES) * SCALE + 0.1
    # the ledger's own figures: billed by the clock (a real machine's minute at least), and the
    # capacity held, the tasks' span, apart
    assert run.billed_chip_seconds == pytest.approx(TPU_VM_CHIPS * 60.0)
    assert run.held_chip_hours == pytest.approx(TPU_VM_CHIPS * held / 3600)


@pytest.mark.usefixtures("preempt_after_two", "spot_tpu_restarts")
def test_a_spot_vms_second_running_span_is_billed_and_its_time_stopped_is_not(sb: SandboxRun) -> None:
    conf = sb.tpu_vm_conf(
        num_batches=5,
        train_overrides={"checkpoint_period": 1, "num_test_batches": 0},
        capacity="spot",
        reservation="",
    )
    for task_id, factory in TPU_VM_CONVERSION_TASKS:
        _execute(sb, factory, conf, task_id)
    _, create = _timed(sb, TpuVmCreateOperator, conf, "create_vm")
    first_start = datetime.fromisoformat(_vm(sb, conf)["lastStartTimestamp"])
    _execute(sb, TpuVmStageOperator, conf, "install_maxtext")
    with pytest.raises(AirflowException, match="was lost under training"):
        _execute(sb, TpuVmStageOperator, conf, "train", try_number=1)
    stopped = _vm(sb, conf)
    assert stopped["status"] == "TERMINATED"
    _execute(sb, TpuVmStageOperator, conf, "train", try_number=2)  # started again, resumed
    second_start = datetime.fromisoformat(_vm(sb, conf)["lastStartTimestamp"])
    assert second_start > first_start  # the API now shows the second start only
    deleted, delete = _timed(sb, TpuVmDeleteOperator, conf, "delete_vm")

    spans = spans_from_json(deleted["billed"]["spans"])
    assert spans is not None
    first, second = spans
    assert (first.started_at, first.ended_by) == (first_start, "compute.instances.preempted")
    assert (second.started_at, second.ended_by) == (second_start, "delete")
    assert first.ended_at is not None
    assert first.ended_at <= datetime.fromisoformat(stopped["lastStopTimestamp"])
    assert first.instance_id == second.instance_id  # one incarnation, started twice

    run = _recorded([create, delete], {"delete_vm": deleted})
    assert run.billed_spans == spans
    both = billed_chip_seconds(spans, minimum=0.0)
    assert both == pytest.approx(
        TPU_VM_CHIPS * sum(((s.ended_at or s.started_at) - s.started_at).total_seconds() for s in spans)
    )
    # billed: both spans, a minute at least each; not the time it lay stopped between them
    assert run.billed_chip_seconds == pytest.approx(
        TPU_VM_CHIPS
        * sum(max(60.0, ((s.ended_at or s.started_at) - s.started_at).total_seconds()) for s in spans)
    )
    gap = (second.started_at - first.ended_at) / timedelta(seconds=1)
    assert gap > 0
    assert create.start_date is not None
    assert delete.end_date is not None
    held = (delete.end_date - create.start_date).total_seconds()
    assert both is not None
    assert both / TPU_VM_CHIPS <= held - gap
