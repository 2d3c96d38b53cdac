"""Every task of the shipped DAGs is bounded in time, and every DAG run has a backstop above them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from airflow_provider_tpu_rl import timeouts
from tests.support.dags import GKE_DAG_ID, JANITOR_DAG_ID, SWEEP_DAG_ID, TPU_VM_DAG_ID

ALL_DAG_IDS = (GKE_DAG_ID, TPU_VM_DAG_ID, SWEEP_DAG_ID, JANITOR_DAG_ID)
JOB_TASKS = {
    GKE_DAG_ID: ("convert_to_maxtext", "train", "export_to_huggingface"),
    SWEEP_DAG_ID: ("convert_to_maxtext", "train_a", "train_b", "export_a", "export_b"),
}
TEARDOWNS = {
    GKE_DAG_ID: "destroy_cluster",
    TPU_VM_DAG_ID: "delete_vm",
    SWEEP_DAG_ID: "destroy_cluster",
}


@pytest.mark.parametrize("dag_id", ALL_DAG_IDS)
def test_every_task_has_an_execution_timeout(dag_bag: Any, dag_id: str) -> None:
    dag = dag_bag.dags[dag_id]
    unbounded = [t.task_id for t in dag.tasks if not t.execution_timeout]
    assert unbounded == []


@pytest.mark.parametrize("dag_id", ALL_DAG_IDS)
def test_the_dagrun_timeout_is_above_every_task_using_all_its_tries(dag_bag: Any, dag_id: str) -> None:
    """A timed-out run skips its teardown: the tasks' own bounds must end the run first."""
    dag = dag_bag.dags[dag_id]
    worst = timedelta()
    for t in dag.tasks:
        worst += t.execution_timeout * (t.retries + 1)
        worst += (t.max_retry_delay or t.retry_delay) * t.retries
    assert dag.dagrun_timeout is not None
    assert dag.dagrun_timeout > worst


@pytest.mark.parametrize("dag_id", list(JOB_TASKS))
def test_a_job_is_cancelled_before_its_task_times_out(dag_bag: Any, dag_id: str) -> None:
    dag = dag_bag.dags[dag_id]
    for task_id in JOB_TASKS[dag_id]:
        task = dag.get_task(task_id)
        assert task.job_timeout is not None, task_id
        assert timedelta(0) < task.job_timeout < task.execution_timeout, task_id


@pytest.mark.parametrize("dag_id", [GKE_DAG_ID, TPU_VM_DAG_ID, SWEEP_DAG_ID])
def test_sensors_give_up_before_their_task_times_out(dag_bag: Any, dag_id: str) -> None:
    dag = dag_bag.dags[dag_id]
    sensors = [t for t in dag.tasks if t.task_id.startswith("wait_")]
    assert sensors
    for sensor in sensors:
        assert 0 < sensor.timeout < sensor.execution_timeout.total_seconds(), sensor.task_id


@pytest.mark.parametrize("dag_id", list(TEARDOWNS))
def test_the_teardown_has_the_teardown_bound(dag_bag: Any, dag_id: str) -> None:
    teardown = dag_bag.dags[dag_id].get_task(TEARDOWNS[dag_id])
    assert teardown.is_teardown
    assert teardown.execution_timeout == timeouts.task_timeout("teardown")


def test_defaults_match_the_issue() -> None:
    minutes = {s: timeouts.task_timeout(s) / timedelta(minutes=1) for s in timeouts.DEFAULT_TASK_MINUTES}
    assert minutes["deploy"] == 90
    assert minutes["convert"] == 180
    assert minutes["train"] == 48 * 60
    assert minutes["export"] == 180
    assert minutes["teardown"] == 90
    assert timeouts.command_timeout() == 20 * 60


def test_options_are_read_from_the_config_and_may_be_fractional(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__TPU_RL__TRAIN_TIMEOUT_MINUTES", "90")
    monkeypatch.setenv("AIRFLOW__TPU_RL__DEPLOY_TIMEOUT_MINUTES", "0.5")
    monkeypatch.setenv("AIRFLOW__TPU_RL__COMMAND_TIMEOUT_MINUTES", "2.5")
    assert timeouts.task_timeout("train") == timedelta(minutes=90)
    assert timeouts.task_timeout("deploy") == timedelta(seconds=30)
    assert timedelta(0) < timeouts.job_timeout("train") < timedelta(minutes=90)
    assert timeouts.stage_command_timeout("deploy") < 30
    assert timeouts.command_timeout() == 150


def test_dagrun_timeout_hours_overrides_the_sum(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__TPU_RL__DAGRUN_TIMEOUT_HOURS", "72")
    assert timeouts.dagrun_timeout("gke") == timedelta(hours=72)


@pytest.mark.parametrize("value", ["0", "-5", "inf", "nan"])
def test_a_bound_that_is_not_positive_and_finite_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("AIRFLOW__TPU_RL__DEPLOY_TIMEOUT_MINUTES", value)
    with pytest.raises(
        ValueError, match="deploy_timeout_minutes must be a positive, finite number"
    ) as refused:
        timeouts.task_timeout("deploy")
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("inf", "must be a positive, finite number of minutes, not inf"),
        ("1e-9", "must be at least 5 minutes, not 1e-09"),
        ("4.9", "must be at least 5 minutes, not 4.9"),
    ],
)
def test_the_admission_bound_is_finite_and_at_least_five_minutes(
    monkeypatch: pytest.MonkeyPatch, value: str, rule: str
) -> None:
    """`inf` overflowed a timedelta while the DAG was parsed; `1e-9` made a 0 s bound that cancels
    every job before its first pod could start (issue 43, item 3)."""
    monkeypatch.setenv("AIRFLOW__TPU_RL__ADMISSION_TIMEOUT_MINUTES", value)
    with pytest.raises(ValueError) as refused:
        timeouts.admission_timeout()
    assert str(refused.value) == f"[tpu_rl] admission_timeout_minutes {rule}"
    monkeypatch.setenv("AIRFLOW__TPU_RL__ADMISSION_TIMEOUT_MINUTES", "5")
    assert timeouts.admission_timeout() == timedelta(minutes=5)


@pytest.mark.parametrize(
    ("option", "value"), [("DAGRUN_TIMEOUT_HOURS", "inf"), ("KILL_GRACE_SECONDS", "inf")]
)
def test_other_unbounded_options_are_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, option: str, value: str
) -> None:
    monkeypatch.setenv(f"AIRFLOW__TPU_RL__{option}", value)
    with pytest.raises(ValueError, match=f"{option.lower()} must be a finite number"):
        timeouts.dagrun_timeout("gke") if option.startswith("DAGRUN") else timeouts.kill_grace_seconds()


def test_unknown_stage_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown stage"):
        timeouts.task_timeout("nap")
