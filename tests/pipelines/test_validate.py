"""``validate`` refuses, before anything is spent, what a later task could never do (issue 43).

A train override that contradicts what the tasks after training need (``TRAINING_NEEDS``) is
refused by ``validate``'s own function, and every task that creates a VM or a cluster runs only
after ``validate`` succeeded: so such a run creates nothing. Its values reach the tasks as one XCom.
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.pipelines.validate import validate_pipeline_conf
from airflow_provider_tpu_rl.spec.pipeline import GKE_DEFAULTS, TPU_VM_DEFAULTS
from tests.support.dags import GKE_DAG_ID, TPU_VM_DAG_ID
from tests.support.pipeline_shapes import Shape

TPU_VM_CONF = {
    "project": "proj-123456",
    "bucket": "bkt-123",
    "reservation": "res-8",
    "capacity": "reservation",
}
GKE_CONF = {"project": "proj-123456", "bucket": "bkt-123"}
# The tasks that create what bills: each must wait for validate's success.
SPENDING_TASKS = {
    TPU_VM_DAG_ID: ("create_cpu_vm", "create_vm", "ensure_bucket", "sync_hf_token"),
    GKE_DAG_ID: ("deploy_cluster", "deploy_tpu_pool", "ensure_bucket", "sync_hf_token"),
}


def _params(dag_id: str, conf: dict[str, Any]) -> dict[str, Any]:
    defaults = TPU_VM_DEFAULTS if dag_id == TPU_VM_DAG_ID else GKE_DEFAULTS
    base = TPU_VM_CONF if dag_id == TPU_VM_DAG_ID else GKE_CONF
    return {**defaults, **base, **conf}


def test_the_tpu_vm_pipeline_without_checkpointing_is_refused_at_validate_and_creates_no_vm(
    dag_bag: Any,
) -> None:
    """``enable_checkpointing: false`` used to pass validate: training "succeeded" and
    wait_actor_checkpoint then waited 120 minutes with the TPU VM alive (delete_vm comes after it)."""
    conf = {"train_overrides": {"enable_checkpointing": False}}
    with pytest.raises(AirflowFailException) as refused:
        validate_pipeline_conf(TPU_VM_DAG_ID, "manual__1", conf, _params(TPU_VM_DAG_ID, conf))
    message = str(refused.value)
    assert len(message.splitlines()) == 1
    assert "train_overrides.enable_checkpointing: must be true: wait_actor_checkpoint" in message
    dag = dag_bag.dags[TPU_VM_DAG_ID]
    for task_id in ("create_cpu_vm", "create_vm"):
        assert "validate" in {t.task_id for t in dag.get_task(task_id).get_flat_relatives(upstream=True)}
    _assert_nothing_spends_before_validate_succeeds(dag, TPU_VM_DAG_ID)


@pytest.mark.parametrize("dag_id", [GKE_DAG_ID, TPU_VM_DAG_ID])
def test_nothing_that_spends_runs_unless_validate_succeeded(dag_bag: Any, dag_id: str) -> None:
    _assert_nothing_spends_before_validate_succeeds(dag_bag.dags[dag_id], dag_id)


def _assert_nothing_spends_before_validate_succeeds(dag: Any, dag_id: str) -> None:
    """Every task between validate and a spending task (itself included) runs only when all its
    upstream tasks succeeded: a failed validate leaves them upstream_failed."""
    for task_id in SPENDING_TASKS[dag_id]:
        task = dag.get_task(task_id)
        upstream = {t.task_id: t for t in task.get_flat_relatives(upstream=True)}
        assert "validate" in upstream, task_id
        after_validate = [
            t
            for t in [task, *upstream.values()]
            if "validate" in {u.task_id for u in t.get_flat_relatives(upstream=True)}
        ]
        rules = {t.task_id: str(getattr(t.trigger_rule, "value", t.trigger_rule)) for t in after_validate}
        assert set(rules.values()) == {"all_success"}, rules


def test_a_conf_key_with_a_newline_is_refused_on_one_line() -> None:
    with pytest.raises(AirflowFailException) as refused:
        validate_pipeline_conf(GKE_DAG_ID, "manual__1", {"a\nb": 1}, _params(GKE_DAG_ID, {}))
    message = str(refused.value)
    assert len(message.splitlines()) == 1
    assert "'a\\nb': unknown conf key" in message


def test_validate_pushes_its_values_as_one_xcom(pipeline: tuple[Any, Shape]) -> None:
    """Not one XCom per key besides (TaskFlow's multiple_outputs for a dict return): read whole."""
    dag, _ = pipeline
    assert dag.get_task("validate").multiple_outputs is False
