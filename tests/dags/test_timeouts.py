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
