"""The ledger task and the step callbacks writing to SQLite and PostgreSQL: one row per run, always."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest

from airflow_provider_tpu_rl.ledger.hook import RunLedger, record_run_from_context, step_callbacks
from airflow_provider_tpu_rl.ledger.records import StepRecord
from tests.ledger.fakes import (
    BUCKET,
    LEDGER_TASK,
    SUCCESS_XCOMS,
    FakeAirflow3DagRun,
    FakeDagRun,
    FakeLedgerTaskInstance,
    context_for,
    gke_task_instances,
    minutes,
)


@dataclass
class CallbackTaskInstance:
    """What a task callback finds in ``context["ti"]``."""

    task_id: str
    try_number: int
    start_date: datetime
    end_date: datetime | None = None
    state: str | None = None
    dag_id: str = "tpu_rl_gke_pipeline"
    run_id: str = "manual__a3"


def fire(callback: str, ti: CallbackTaskInstance) -> None:
    step_callbacks()[callback]({"ti": ti})


def test_success_failure_and_rerun_give_one_row_per_run(ledger: RunLedger) -> None:
    good = context_for(FakeDagRun(gke_task_instances(), run_id="good"), SUCCESS_XCOMS)
    bad = context_for(
        FakeDagRun(gke_task_instances(train="failed", export_to_huggingface="upstream_failed"), run_id="bad"),
        {"convert_to_maxtext": {"job_name": "rl-convert"}},
    )
    for context in (good, bad, good, bad):  # the ledger task retried or the run cleared and re-run
        record_run_from_context(context, model="qwen3-30b-a3b", chips=32)

    runs = {run.airflow_run_id: run for run in ledger.latest_runs()}
    assert ledger.count_rows("runs") == 2
    assert (runs["good"].state, runs["bad"].state) == ("success", "failed")
    assert (runs["good"].pre_mean_reward, runs["good"].post_mean_reward) == (0.12, 0.34)
    assert runs["good"].export_uri == f"{BUCKET}/hf-trained/"
    assert (runs["bad"].post_mean_reward, runs["bad"].export_uri) == (None, None)
    assert runs["good"].chip_hours == pytest.approx(32 * 170 / 60)
    assert ledger.count_rows("run_steps", runs["good"].run_id) == 8
    assert ledger.count_rows("run_artifacts", runs["good"].run_id) == 3
    assert ledger.count_rows("run_metrics", runs["good"].run_id) == 9


def test_airflow3_run_gets_step_times_from_the_callbacks(ledger: RunLedger) -> None:
    fire("on_execute_callback", CallbackTaskInstance("deploy_cluster", 1, minutes(0)))
    fire("on_success_callback", CallbackTaskInstance("deploy_cluster", 1, minutes(0), minutes(20), "success"))
    # train: a transient fault in try 1, success in try 2
    fire("on_execute_callback", CallbackTaskInstance("train", 1, minutes(20)))
    fire("on_retry_callback", CallbackTaskInstance("train", 1, minutes(20), minutes(25), "up_for_retry"))
    fire("on_execute_callback", CallbackTaskInstance("train", 2, minutes(30)))
    fire("on_success_callback", CallbackTaskInstance("train", 2, minutes(30), minutes(90), "success"))
    fire(
        "on_success_callback",
        CallbackTaskInstance("destroy_cluster", 1, minutes(95), minutes(100), "success"),
    )

    states = {
        "deploy_cluster": "success",
        "train": "success",
        "destroy_cluster": "success",
        LEDGER_TASK: "running",
    }
    context: dict[str, Any] = {
        "dag_run": FakeAirflow3DagRun(),
        "ti": FakeLedgerTaskInstance(
            {"train": {"job_name": "rl-train-a3", "metrics": None}}, task_states=states
        ),
    }
    run = record_run_from_context(context, model="qwen3-30b-a3b", chips=32)

    assert run.state == "success"
    assert run.chip_hours == pytest.approx(32 * 100 / 60)
    steps = ledger.recorded_steps(run.run_id)
    assert steps["train"] == StepRecord("train", "success", 2, minutes(30), minutes(90), "rl-train-a3")
    assert set(steps) == {"deploy_cluster", "train", "destroy_cluster"}
    assert ledger.count_rows("runs") == 1


def test_a_failing_ledger_never_fails_the_task(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", "mysql://user@localhost/db")
    fire("on_failure_callback", CallbackTaskInstance("train", 1, minutes(0), minutes(1), "failed"))


def test_failure_callback_without_a_state_records_failed(ledger: RunLedger) -> None:
    fire(
        "on_failure_callback", CallbackTaskInstance("train", 1, minutes(0), minutes(1) + timedelta(seconds=5))
    )
    step = ledger.recorded_steps("tpu_rl_gke_pipeline/manual__a3")["train"]
    assert (step.state, step.try_number, step.ended_at) == ("failed", 1, minutes(1) + timedelta(seconds=5))
