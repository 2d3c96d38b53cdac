"""Task order, setup/teardown and watcher wiring, retries and console links of the two pipeline DAGs.

What the pipelines' shared parts give their tasks (arguments, waits, stage groups, callbacks, validate)
is tested in tests/pipelines."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from airflow.models.dagrun import DagRun
from airflow.providers.common.compat.sdk import TriggerRule

from airflow_provider_tpu_rl.cli import build_plan
from airflow_provider_tpu_rl.compat import AIRFLOW_V_3_2_PLUS, exponential_backoff
from airflow_provider_tpu_rl.render import tpu_vm
from tests.support.dags import GKE_DAG_ID, TPU_VM_DAG_ID
from tests.support.pipeline_shapes import WATCHER, Shape


def test_tasks_run_in_the_tutorial_order(pipeline: tuple[Any, Shape]) -> None:
    dag, shape = pipeline
    assert set(dag.task_ids) == {*shape.order, *shape.side_tasks, WATCHER}
    # each model asset's task hangs off the gate alone, and emits its own model's asset
    for publisher in shape.publishers:
        task = dag.get_task(publisher)
        assert set(task.upstream_task_ids) == {"promote_model"}
        assert [outlet.uri for outlet in task.outlets] == ["tpu-rl://models/" + task.preset]
    # each converted checkpoint's task hangs off the commit's sensor alone
    for publisher in shape.checkpoint_publishers:
        task = dag.get_task(publisher)
        assert set(task.upstream_task_ids) == {"wait_converted_checkpoint"}
        assert [outlet.uri for outlet in task.outlets] == ["tpu-rl://converted-checkpoints/" + task.preset]
    assert {dag.get_task(t).preset for t in shape.checkpoint_publishers} == {
        dag.get_task(t).preset for t in shape.publishers
    }
    side = dict(shape.side)
    main = [task_id for task_id in shape.order if task_id not in side]
    expected_upstream = {task_id: {before} for before, task_id in itertools.pairwise(main)}
    expected_upstream |= {task_id: {after} for task_id, after in side.items()}
    expected_upstream["validate"] = set()
    # Each teardown also hangs off its setups.
    for teardown, setup in shape.resources.items():
        expected_upstream[teardown] |= {"ensure_bucket", setup}
    for task_id, extra in shape.extra_upstream:
        expected_upstream[task_id] |= extra
    actual = {task_id: set(dag.get_task(task_id).upstream_task_ids) for task_id in shape.order}
    assert actual == expected_upstream


def test_the_resource_teardown_is_a_teardown_of_its_setups(pipeline: tuple[Any, Shape]) -> None:
    dag, shape = pipeline
    all_setups: set[str] = set()
    for teardown_id, setup in shape.resources.items():
        teardown = dag.get_task(teardown_id)
        assert teardown.is_teardown
        assert teardown.trigger_rule == TriggerRule.ALL_DONE_SETUP_SUCCESS
        # on_failure_fail_dagrun=True would let a green teardown hide a failed run (Airflow 3.3).
        assert not teardown.on_failure_fail_dagrun
        setups = {t.task_id for t in teardown.upstream_list if t.is_setup}
        assert setups == {"ensure_bucket", setup}
        all_setups |= setups
    for teardown_id, setup in shape.own_resources:
        teardown = dag.get_task(teardown_id)
        assert teardown.is_teardown
        assert teardown.trigger_rule == TriggerRule.ALL_DONE_SETUP_SUCCESS
        assert {t.task_id for t in teardown.upstream_list if t.is_setup} == {setup}
        all_setups.add(setup)
    assert {t.task_id for t in dag.tasks if t.is_setup} == all_setups | shape.extra_setups


def test_the_tpu_vm_exists_only_around_training(dag_bag: Any) -> None:
    """The TPU VM is created after the converted checkpoint is committed and deleted right after the
    actor checkpoint is, before the export; conversion and export run on the CPU VM."""
    dag = dag_bag.dags[TPU_VM_DAG_ID]
    create_vm = dag.get_task("create_vm")
    assert "wait_converted_checkpoint" in create_vm.upstream_task_ids
    assert "wait_converted_checkpoint" in {t.task_id for t in create_vm.get_flat_relatives(upstream=True)}
    delete_vm = dag.get_task("delete_vm")
    assert delete_vm.upstream_task_ids == {"wait_actor_checkpoint", "ensure_bucket", "create_vm"}
    export = dag.get_task("export_to_huggingface")
    assert {"delete_vm", "wait_actor_checkpoint"} == export.upstream_task_ids
    upstream_of_create = {t.task_id for t in create_vm.get_flat_relatives(upstream=True)}
    assert {"convert_to_maxtext", "create_cpu_vm"} <= upstream_of_create
    downstream_of_delete = {t.task_id for t in delete_vm.get_flat_relatives(upstream=False)}
    assert {"export_to_huggingface", "wait_hf_export", "delete_cpu_vm"} <= downstream_of_delete
    machines = {
        task_id: dag.get_task(task_id).on_machine or tpu_vm.stage_machine(dag.get_task(task_id).stage)
        for task_id in (
            "install_cpu_vm",
            "convert_to_maxtext",
            "install_maxtext",
            "train",
            "export_to_huggingface",
        )
    }
    assert machines == {
        "install_cpu_vm": "cpu",
        "convert_to_maxtext": "cpu",
        "install_maxtext": "tpu",
        "train": "tpu",
        "export_to_huggingface": "cpu",
    }


def test_the_gke_tpu_pool_exists_only_around_training(dag_bag: Any) -> None:
    """Deployed after the converted checkpoint is committed, before training; destroyed by a
    teardown right after the actor checkpoint (it runs also when training failed), before the
    export; the cluster's own deploy and destroy leave the pool to those two."""
    dag = dag_bag.dags[GKE_DAG_ID]
    deploy, destroy = dag.get_task("deploy_tpu_pool"), dag.get_task("destroy_tpu_pool")
    # and after the training image's copy (its image streaming; issue 53 item 5)
    assert deploy.upstream_task_ids == {"wait_converted_checkpoint", "copy_workload_image"}
    assert dag.get_task("train").upstream_task_ids == {"deploy_tpu_pool"}
    assert destroy.is_teardown
    assert destroy.trigger_rule == TriggerRule.ALL_DONE_SETUP_SUCCESS
    assert not destroy.on_failure_fail_dagrun
    assert {t.task_id for t in destroy.upstream_list if t.is_setup} == {"deploy_cluster", "deploy_tpu_pool"}
    assert "wait_actor_checkpoint" in destroy.upstream_task_ids
    assert dag.get_task("export_to_huggingface").upstream_task_ids == {
        "destroy_tpu_pool",
        "wait_actor_checkpoint",
    }
    assert deploy.only_groups == destroy.only_groups == ["tpu"]
    assert dag.get_task("deploy_cluster").skip_groups == ["tpu"]
    assert dag.get_task("deploy_cluster").only_groups is None
    assert dag.get_task("destroy_cluster").only_groups is None
    # keep_cluster keeps the cluster, never the TPU pool
    assert destroy.keep_cluster is False


def test_record_run_is_a_teardown_after_the_resource_teardown(pipeline: tuple[Any, Shape]) -> None:
    dag, shape = pipeline
    record = dag.get_task("record_run")
    assert record.is_teardown
    assert not record.on_failure_fail_dagrun
    assert set(record.upstream_task_ids) == {shape.teardown, *dict(shape.own_resources)}
    # No setup upstream: it runs whatever state the destroy ends in, also when validate failed.
    assert not any(t.is_setup for t in record.upstream_list)


def test_watcher_fails_the_run_when_any_non_setup_task_fails(pipeline: tuple[Any, Shape]) -> None:
    dag, _ = pipeline
    watcher = dag.get_task(WATCHER)
    assert watcher.trigger_rule == TriggerRule.ONE_FAILED
    assert watcher.retries == 0
    assert watcher.downstream_task_ids == set()
    assert set(watcher.upstream_task_ids) == {t.task_id for t in dag.tasks if not t.is_setup} - {WATCHER}
    assert not any(t.is_setup for t in watcher.upstream_list)


def test_watcher_is_the_only_task_that_decides_the_run_state(
    serialized_dags: dict[str, Any], pipeline: tuple[Any, Shape]
) -> None:
    """Airflow ignores teardown leaves for the run state; the watcher must be the leaf that counts."""
    dag = serialized_dags[pipeline[0].dag_id]

    @dataclass(frozen=True)
    class FakeTaskInstance:
        task_id: str
        state: str

    tis = [FakeTaskInstance(task_id, "failed") for task_id in dag.task_ids]
    deciding = DagRun._tis_for_dagrun_state(None, dag=dag, tis=tis)  # type: ignore[arg-type]
    assert {ti.task_id for ti in deciding} == {WATCHER}


def test_retries_only_where_a_failure_can_be_transient(pipeline: tuple[Any, Shape]) -> None:
    dag, shape = pipeline
    assert {t.task_id for t in dag.tasks if t.retries} == shape.transient
    assert dag.get_task("validate").retries == 0
    for task_id in shape.transient:
        task = dag.get_task(task_id)
        # Doubling: 2.0 from Airflow 3.2 on (there True, read as 1.0, would be a constant delay),
        # True before (where a float fails the DAG's import).
        assert task.retry_exponential_backoff == exponential_backoff(2.0), task_id
        assert task.retry_exponential_backoff == (2.0 if AIRFLOW_V_3_2_PLUS else True), task_id
        assert timedelta(0) < task.retry_delay < task.max_retry_delay, task_id


def test_the_plan_lists_commands_in_the_dags_task_order(pipeline: tuple[Any, Shape]) -> None:
    """DAG, plan and this test read one order (GKE_TASK_ORDER / TPU_VM_TASK_ORDER)."""
    dag, shape = pipeline
    # every switch that adds a task's commands on (GKE: the image's copy for streaming)
    conf = {"image_repository": "tpu-rl-images"} if dag.dag_id == GKE_DAG_ID else None
    plan_tasks = [step["task_id"] for step in build_plan(dag.dag_id, conf)["steps"]]
    assert plan_tasks == sorted(plan_tasks, key=shape.order.index)
    assert set(plan_tasks) == shape.transient  # the tasks that run a command are the retried ones


def test_the_ui_names_each_job_by_its_own_operator(serialized_dags: dict[str, Any]) -> None:
    """What the UI shows (the serialized operator name): the export is not the convert operator."""
    for dag_id in (GKE_DAG_ID, "tpu_rl_sweep_example"):
        dag = serialized_dags[dag_id]
        for task in dag.tasks:
            if "export" in task.task_id and not task.task_id.startswith("wait_"):
                assert task.operator_name == "MaxTextExportOperator", (dag_id, task.task_id)
            if task.task_id.startswith("convert"):
                assert task.operator_name == "MaxTextConvertOperator", (dag_id, task.task_id)


def test_deploy_and_record_run_carry_their_console_links(
    serialized_dags: dict[str, Any], pipeline: tuple[Any, Shape]
) -> None:
    dag = serialized_dags[pipeline[0].dag_id]
    assert dag.get_task("record_run").extra_links == ["Run Curves"]
    assert dag.get_task("record_run").operator_name == "RecordRunOperator"
    if dag.dag_id == GKE_DAG_ID:
        # both deploys save the link (tests/operators/test_deploy_cluster_link.py): no empty "Extra
        # Links" heading
        assert dag.get_task("deploy_cluster").extra_links == ["GKE Cluster"]
        assert dag.get_task("deploy_tpu_pool").extra_links == ["GKE Cluster"]
    for task in dag.tasks:
        if task.task_id.startswith("wait_"):
            assert task.extra_links == ["GCS Folder"], task.task_id
