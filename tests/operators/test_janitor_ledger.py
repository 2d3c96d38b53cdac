"""The janitor closes the ledger rows of the runs it ends, against the sandbox: a crashed run's row
(still ``running``) gets its end, ``abandoned`` or ``failed``, its billed TPU time so far and why;
a row already closed is left alone.

Resources are created by the real operators (record, lease, the TPU VM's noted start); the ledger
is a SQLite file behind ``tpu_rl_ledger``; what the metadata database says about the runs comes
from the stand-in of ``test_janitor_orphans.py``.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from airflow_provider_tpu_rl.hooks.gcluster import GclusterHook
from airflow_provider_tpu_rl.ledger.billing import BilledSpan, Observation
from airflow_provider_tpu_rl.ledger.hook import RunLedger, sqlite_connection_uri
from airflow_provider_tpu_rl.ledger.records import RunRecord, RunSummary, StepRecord
from airflow_provider_tpu_rl.operators.gke import GclusterDeployOperator
from airflow_provider_tpu_rl.operators.janitor import (
    RunEnd,
    close_ledger_rows,
    destroy_resource,
    ended_spans,
    find_expired_resources,
)
from airflow_provider_tpu_rl.operators.tpu_vm import TpuVmCreateOperator
from airflow_provider_tpu_rl.spec import GKE_DAG_ID, TPU_VM_DAG_ID
from tests.operators.test_janitor_orphans import CRASHED_TASKS, MetadataStandIn, _bucket, _deploy, _exists
from tests.support.sandbox_run import SandboxRun

ORPHAN_SECONDS = 1800.0
PRICE = 2.0  # USD per chip-hour, given to close_ledger_rows


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunLedger:
    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", sqlite_connection_uri(tmp_path / "ledger.db"))
    return RunLedger()


def _open_row(ledger: RunLedger, dag_id: str, run_id: str, start: datetime, state: str = "running") -> None:
    """The row validate opens (record_run_started), or one record_run closed (``state``)."""
    ended = None if state == "running" else start + timedelta(minutes=5)
    ledger.record(RunRecord(dag_id, run_id, "m", state, started_at=start, ended_at=ended, chips=8))


def _row(ledger: RunLedger, dag_id: str, run_id: str) -> RunSummary:
    summary = ledger.run_summary(f"{dag_id}/{run_id}")
    assert summary is not None
    return summary


def _create_vm(sb: SandboxRun, run_id: str, start: datetime) -> None:
    create = sb.operator(
        TpuVmCreateOperator, dag_id=TPU_VM_DAG_ID, task_id="create_vm", grant_service_account=False
    )
    create.execute(sb.context(create, sb.tpu_vm_conf(), run_id=run_id, start_date=start))


def test_a_crashed_runs_row_is_closed_abandoned_with_its_billed_time_once_its_vm_is_deleted(
    sb: SandboxRun, ledger: RunLedger
) -> None:
    crashed, start = "manual__crashed", datetime.now(UTC) - timedelta(minutes=5)
    holder = f"{TPU_VM_DAG_ID}/{crashed}"
    _bucket(sb)
    _create_vm(sb, crashed, start)
    _open_row(ledger, TPU_VM_DAG_ID, crashed, start)
    runs = MetadataStandIn({holder: "running"}, {holder: dict(CRASHED_TASKS)})
    hook, t0 = GclusterHook(), time.time()
    assert find_expired_resources(hook, sb.project, t0, runs=runs, orphan_seconds=ORPHAN_SECONDS) == []
    (stale,) = find_expired_resources(
        hook, sb.project, t0 + ORPHAN_SECONDS, runs=runs, orphan_seconds=ORPHAN_SECONDS
    )
    before = datetime.now(UTC)

    end = destroy_resource(hook, stale)
    closed = close_ledger_rows([end] if end else [], runs, usd_per_chip_hour=PRICE)

    assert end is not None
    assert (end.holder, end.run_state, end.what) == (holder, "running", f"deleted VM {sb.vm}")
    row = _row(ledger, TPU_VM_DAG_ID, crashed)
    assert row.state == "abandoned"
    assert row.end_reason == f"janitor: deleted VM {sb.vm} ({stale.reason})"
    assert row.end_reason.startswith(
        f"janitor: deleted VM {sb.vm} (orphaned: its DAG run {holder} is running"
    )
    assert closed == [f"{holder}: abandoned; {row.end_reason}"]
    assert row.ended_at is not None
    assert before <= row.ended_at <= datetime.now(UTC)
    # Billed from the start create_vm noted to the delete the zone operations show: 8 chips, at
    # least a minute, and never past the janitor's close.
    [span] = row.billed_spans or ()
    assert (span.machine, span.chips, span.ended_by) == (sb.vm, 8, "delete")
    assert span.ended_at is not None
    assert span.ended_at <= row.ended_at
    assert row.billed_chip_seconds == pytest.approx(
        8 * max(60.0, (span.ended_at - span.started_at).total_seconds())
    )
    assert row.estimated_cost_usd == pytest.approx(row.billed_chip_seconds / 3600 * PRICE)
    assert row.duration_seconds == pytest.approx((row.ended_at - start).total_seconds(), abs=1e-3)


def test_a_run_whose_dag_run_failed_gets_failed_when_its_cluster_is_destroyed(
    sb: SandboxRun, ledger: RunLedger
) -> None:
    failed, start = "manual__failed", datetime.now(UTC) - timedelta(minutes=5)
    holder = f"{GKE_DAG_ID}/{failed}"
    _bucket(sb)
    _deploy(sb, failed, start)
    pool = sb.operator(GclusterDeployOperator, task_id="deploy_tpu_pool", run_id=failed)
    pool.execute(sb.context(pool, sb.gke_conf(), run_id=failed, start_date=start))  # notes its nodes' starts
    _open_row(ledger, GKE_DAG_ID, failed, start)
    runs = MetadataStandIn({holder: "failed"})

    (stale,) = find_expired_resources(GclusterHook(), sb.project, time.time(), runs=runs)
    end = destroy_resource(GclusterHook(), stale, janitor_run_id="scheduled__test")
    closed = close_ledger_rows([end] if end else [], runs, usd_per_chip_hour=PRICE)

    assert not _exists(sb, sb.cluster)
    row = _row(ledger, GKE_DAG_ID, failed)
    assert row.state == "failed"
    assert row.end_reason == f"janitor: destroyed cluster {sb.cluster} (its DAG run {holder} is failed)"
    assert closed == [f"{holder}: failed; {row.end_reason}"]
    assert row.ended_at is not None
    # The TPU pool's node VMs, noted by deploy_tpu_pool, billed to the deletes the cluster's destroy made.
    spans = row.billed_spans or ()
    assert len(spans) == 8
    assert {(span.chips, span.ended_by) for span in spans} == {(4, "delete")}
    seconds = [max(60.0, (s.ended_at - s.started_at).total_seconds()) for s in spans if s.ended_at]
    assert row.billed_chip_seconds == pytest.approx(4 * sum(seconds))
    assert row.estimated_cost_usd == pytest.approx(4 * sum(seconds) / 3600 * PRICE)


def test_a_row_record_run_closed_is_left_alone_when_the_janitor_destroys_its_run_s_vm(
    sb: SandboxRun, ledger: RunLedger
) -> None:
    """record_run closed the row (kept VM, say); the janitor's destroy on expiry changes nothing."""
    done, start = "manual__done", datetime.now(UTC) - timedelta(minutes=5)
    holder = f"{TPU_VM_DAG_ID}/{done}"
    _bucket(sb)
    _create_vm(sb, done, start)
    _open_row(ledger, TPU_VM_DAG_ID, done, start, state="success")
    before = _row(ledger, TPU_VM_DAG_ID, done)
    runs = MetadataStandIn({holder: "success"})

    (stale,) = find_expired_resources(GclusterHook(), sb.project, time.time(), runs=runs)
    end = destroy_resource(GclusterHook(), stale)

    assert end is not None
    assert close_ledger_rows([end], runs) == []
    assert _row(ledger, TPU_VM_DAG_ID, done) == before  # state, end, reason and billed time as they were
    assert before.end_reason is None


def _end(holder: str, state: str = "running") -> RunEnd:
    return RunEnd(holder, state, "expired at x", "deleted VM v", datetime(2026, 3, 1, 9, tzinfo=UTC), None)


def test_the_janitor_closes_the_rows_of_dag_runs_that_ended_without_recording(ledger: RunLedger) -> None:
    """No resource left to destroy: a DAG run that ended (failed by hand, dagrun_timeout) with its
    row still running is closed at its last task's end; live and unknown runs are left running."""
    t0 = datetime(2026, 3, 1, 8, tzinfo=UTC)
    names = ("timed_out", "marked_success", "live", "unknown")
    for name in names:
        _open_row(ledger, GKE_DAG_ID, name, t0)
    ledger.record_steps(
        f"{GKE_DAG_ID}/timed_out",
        [
            StepRecord("validate", "success", 1, t0, t0 + timedelta(minutes=1)),
            StepRecord("train", "failed", 1, t0 + timedelta(minutes=2), t0 + timedelta(minutes=40)),
        ],
    )
    runs = MetadataStandIn(
        {
            f"{GKE_DAG_ID}/timed_out": "failed",
            f"{GKE_DAG_ID}/marked_success": "success",
            f"{GKE_DAG_ID}/live": "running",
        }
    )
    now = t0 + timedelta(hours=3)

    closed = close_ledger_rows([], runs, now=now)

    assert len(closed) == 2
    timed_out = _row(ledger, GKE_DAG_ID, "timed_out")
    assert (timed_out.state, timed_out.ended_at) == ("failed", t0 + timedelta(minutes=40))
    assert timed_out.end_reason == "janitor: its DAG run ended failed and record_run never recorded it"
    assert timed_out.chip_hours is None  # the janitor ended nothing: its billed time is not known
    marked = _row(ledger, GKE_DAG_ID, "marked_success")
    assert (marked.state, marked.ended_at) == ("abandoned", now)
    assert [_row(ledger, GKE_DAG_ID, name).state for name in ("live", "unknown")] == ["running", "running"]
    assert close_ledger_rows([], runs, now=now) == []  # a second janitor run finds nothing more


def test_the_ends_of_one_run_close_its_row_once_with_every_destroy_named(ledger: RunLedger) -> None:
    t0 = datetime(2026, 3, 1, 8, tzinfo=UTC)
    _open_row(ledger, TPU_VM_DAG_ID, "two", t0)
    holder = f"{TPU_VM_DAG_ID}/two"
    cpu = RunEnd(holder, "", "expired at x", "deleted VM v-cpu", t0 + timedelta(hours=1), None)

    closed = close_ledger_rows([cpu, _end(holder)], MetadataStandIn({holder: "failed"}))

    row = _row(ledger, TPU_VM_DAG_ID, "two")
    # the DAG-run state read by the judge wins; without one the probe is asked
    assert row.state == "abandoned"
    assert row.end_reason == "janitor: deleted VM v-cpu (expired at x); deleted VM v (expired at x)"
    assert row.ended_at == t0 + timedelta(hours=1)
    assert len(closed) == 1


def test_a_run_with_a_live_task_keeps_its_row_for_its_record_run(ledger: RunLedger) -> None:
    """Its VM went past its expiry label while it trains: the janitor deletes the VM, but the run
    is alive and its record_run will close the row (with what the run saw)."""
    t0 = datetime(2026, 3, 1, 8, tzinfo=UTC)
    holder = f"{TPU_VM_DAG_ID}/alive"
    _open_row(ledger, TPU_VM_DAG_ID, "alive", t0)
    runs = MetadataStandIn({holder: "running"}, {holder: {"validate": "success", "train": "running"}})

    assert close_ledger_rows([_end(holder, "")], runs) == []
    assert _row(ledger, TPU_VM_DAG_ID, "alive").state == "running"
    runs.tasks[holder] = dict(CRASHED_TASKS)  # then it crashed: the next end closes it
    assert len(close_ledger_rows([_end(holder, "")], runs)) == 1
    assert _row(ledger, TPU_VM_DAG_ID, "alive").state == "abandoned"


def test_without_a_ledger_there_is_nothing_to_close(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_TPU_RL_LEDGER", raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    assert close_ledger_rows([_end("d/r")], MetadataStandIn({"d/r": "failed"})) == []
    assert not (tmp_path / "tpu_rl_ledger.db").exists()  # and none is created


def test_spans_not_read_from_the_zone_operations_end_at_the_janitors_destroy() -> None:
    """The clocks' read failed (or found no delete): the starts noted in the record are billed up to
    the destroy's end, marked ``janitor``; no start noted: the billed time is unknown."""
    t0 = datetime(2026, 3, 1, 8, tzinfo=UTC)
    ended = t0 + timedelta(hours=1)
    seen = Observation("vm", "7", 8, "RUNNING", t0)
    record = {"billing": {"observations": [seen.as_dict()]}}

    [span] = ended_spans(None, record, ended) or ()
    assert (span.machine, span.started_at, span.ended_at, span.ended_by) == ("vm", t0, ended, "janitor")
    read = {"spans": [BilledSpan("vm", "7", 8, t0, t0 + timedelta(minutes=5), "delete").as_dict()]}
    [span] = ended_spans(read, record, ended) or ()
    assert (span.ended_at, span.ended_by) == (t0 + timedelta(minutes=5), "delete")
    assert ended_spans(None, {"kind": "vm"}, ended) is None
    assert ended_spans(None, None, ended) is None
