"""`make bench` reads a run's TPU billed and training time from the ledger the product wrote."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from airflow_provider_tpu_rl.ledger.billing import BilledSpan
from airflow_provider_tpu_rl.ledger.hook import RunLedger, default_sqlite_path
from airflow_provider_tpu_rl.ledger.records import RunRecord
from airflow_provider_tpu_rl.spec import GKE_DAG_ID
from tpu_rl_sandbox.commands.bench import ledger_tpu_time, tpu_time_lines

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)


def test_the_bench_reads_the_newest_runs_tpu_time_from_the_default_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.delenv("AIRFLOW_CONN_TPU_RL_LEDGER", raising=False)
    assert default_sqlite_path() == tmp_path / "tpu_rl_ledger.db"
    assert ledger_tpu_time(tmp_path, GKE_DAG_ID) is None  # no ledger yet
    minute = timedelta(minutes=1)
    run = RunRecord(
        GKE_DAG_ID, "r1", "qwen3-30b-a3b", "success", T0, T0 + 60 * minute, 32, T0, T0 + 40 * minute,
        train_started_at=T0 + 10 * minute, train_ended_at=T0 + 30 * minute,
        # 8 node VMs of 4 chips RUNNING from minute 2 to 38 of the pool tasks' 40
        billed_spans=tuple(BilledSpan(f"n{i}", str(i), 4, T0 + 2 * minute, T0 + 38 * minute) for i in range(8)),
    )  # fmt: skip
    RunLedger().record(run, [], [], [])
    tpu = ledger_tpu_time(tmp_path, GKE_DAG_ID)
    assert tpu == {
        "chips": 32,
        "billed_seconds": 2160.0,
        "trained_seconds": 1200.0,
        "held_seconds": 2400.0,
        "idle_share": pytest.approx(1 - 1200 / 2160),
    }
    # as if the sandbox had played one real minute in 60 s: sandbox seconds / 60 = real minutes
    lines = tpu_time_lines("   GKE", tpu, idle_goal=0.10, minute_seconds=60.0)
    assert lines[1].split()[-5:] == ["2160.0s", "=", "36.0", "real", "min"]
    assert lines[2].split()[-5:] == ["1200.0s", "=", "20.0", "real", "min"]
    assert lines[3].split()[-10:] == [
        "44%",
        "(goal",
        "≤",
        "10%;",
        "NOT",
        "met);",
        "idle",
        "16.0",
        "real",
        "min",
    ]
    assert lines[4].split()[-5:] == ["2400.0s", "=", "40.0", "real", "min"]
    assert ledger_tpu_time(tmp_path, "another_dag") is None
