"""Task order, setup/teardown and watcher wiring, retries and templates of the two pipeline DAGs."""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from airflow.models.dagrun import DagRun
from airflow.providers.common.compat.sdk import TriggerRule

from airflow_provider_tpu_rl.cli import build_plan
from airflow_provider_tpu_rl.compat import AIRFLOW_V_3_2_PLUS, exponential_backoff
from airflow_provider_tpu_rl.pipelines.arguments import (
    bake_result,
    gke_task_arguments,
    tpu_vm_task_arguments,
    xcom,
)
from airflow_provider_tpu_rl.pipelines.validate import validate_pipeline_conf
from airflow_provider_tpu_rl.render import tpu_vm
from airflow_provider_tpu_rl.spec import GKE_DEFAULTS, TPU_VM_DEFAULTS
from airflow_provider_tpu_rl.spec.pipeline import GKE_TASK_ORDER, TPU_VM_SIDE_TASKS, TPU_VM_TASK_ORDER
from tests.dags.conftest import GKE_DAG_ID, PIPELINE_DAG_IDS, TPU_VM_DAG_ID

# validate refuses the form's example project and bucket: a run names its own (here with a
# reservation, which every operator that creates TPUs gets).
OWN_CLOUD = {
    "project": "tpu-rl-structure",
    "bucket": "tpu-rl-structure-bucket",
    "reservation": "tpu-rl-structure-reservation",
    "capacity": "reservation",
}


@dataclass(frozen=True)
class Shape:
    order: tuple[str, ...]
    resource_setup: str  # creates the billed resource
    teardown: str  # destroys it: the last teardown before record_run
    transient: frozenset[str]  # tasks allowed to retry
    defaults: Any
    # Other billed resources: their teardown → their setup (each also hangs off ensure_bucket).
    other_resources: tuple[tuple[str, str], ...] = ()
    # Edges besides the order's chain: task → the extra upstream tasks.
    extra_upstream: tuple[tuple[str, frozenset[str]], ...] = ()

    # Setups besides the bucket and the resources' (of teardowns with setups of their own).
    extra_setups: frozenset[str] = frozenset()
    # Tasks beside the main line: task → the one it follows (TPU_VM_SIDE_TASKS).
    side: tuple[tuple[str, str], ...] = ()
    # Teardowns of a resource that is not the bucket's: teardown → its one setup.
    own_resources: tuple[tuple[str, str], ...] = ()

    @property
    def resources(self) -> dict[str, str]:
        """Every teardown → the setup of its resource."""
        return {self.teardown: self.resource_setup, **dict(self.other_resources)}


SHAPES = {
    GKE_DAG_ID: Shape(
        order=GKE_TASK_ORDER,
        resource_setup="deploy_cluster",
        teardown="destroy_cluster",
        transient=frozenset(
            {
                "preflight",
                "ensure_bucket",
                "deploy_cluster",
                "sync_hf_token",
                "convert_to_maxtext",
                "deploy_tpu_pool",
                "train",
                "destroy_tpu_pool",
                "export_to_huggingface",
                "destroy_cluster",
            }
        ),
        defaults=GKE_DEFAULTS,
        extra_upstream=(
            # the TPU pool's teardown hangs off its setups; the export needs the actor checkpoint
            ("destroy_tpu_pool", frozenset({"deploy_cluster", "deploy_tpu_pool"})),
            ("export_to_huggingface", frozenset({"wait_actor_checkpoint"})),
        ),
        extra_setups=frozenset({"deploy_tpu_pool"}),
    ),
    TPU_VM_DAG_ID: Shape(
        order=TPU_VM_TASK_ORDER,
        resource_setup="create_cpu_vm",
        teardown="delete_cpu_vm",
        transient=frozenset(
            {
                "preflight",
                "ensure_bucket",
                "sync_hf_token",
                "bake_image",
                "delete_bake_vm",
                "create_cpu_vm",
                "install_cpu_vm",
                "convert_to_maxtext",
                "create_vm",
                "install_maxtext",
                "train",
                "delete_vm",
                "export_to_huggingface",
                "delete_cpu_vm",
            }
        ),
        defaults=TPU_VM_DEFAULTS,
        other_resources=(("delete_vm", "create_vm"),),
        extra_upstream=(
            ("export_to_huggingface", frozenset({"wait_actor_checkpoint"})),
            # the TPU VM boots from the baked image; the run is recorded once the bake VM is gone
            ("create_vm", frozenset({"bake_image"})),
            ("record_run", frozenset({"delete_bake_vm"})),
        ),
        side=tuple(TPU_VM_SIDE_TASKS.items()),
        own_resources=(("delete_bake_vm", "bake_image"),),
    ),
}
WATCHER = "watcher"


@pytest.fixture(params=PIPELINE_DAG_IDS)
def pipeline(request: pytest.FixtureRequest, dag_bag: Any) -> tuple[Any, Shape]:
    return dag_bag.dags[request.param], SHAPES[request.param]


def test_tasks_run_in_the_tutorial_order(pipeline: tuple[Any, Shape]) -> None:
    dag, shape = pipeline
    assert set(dag.task_ids) == {*shape.order, WATCHER}
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


# The graph's groups (pipelines.dag.stage_group), each holding consecutive stages; validate and the
# watcher stay outside.
STAGE_GROUPS = {
    GKE_DAG_ID: {
        "prepare": ["preflight", "ensure_bucket", "deploy_cluster", "sync_hf_token"],
        "conversion": ["convert_to_maxtext", "wait_converted_checkpoint"],
        "training": ["deploy_tpu_pool", "train", "wait_actor_checkpoint", "destroy_tpu_pool"],
        "export": ["export_to_huggingface", "wait_hf_export"],
        "teardown": ["destroy_cluster", "record_run"],
    },
    TPU_VM_DAG_ID: {
        "prepare": [
            "preflight",
            "ensure_bucket",
            "sync_hf_token",
            "bake_image",
            "delete_bake_vm",
            "create_cpu_vm",
            "install_cpu_vm",
        ],
        "conversion": ["convert_to_maxtext", "wait_converted_checkpoint"],
        "training": ["create_vm", "install_maxtext", "train", "wait_actor_checkpoint", "delete_vm"],
        "export": ["export_to_huggingface", "wait_hf_export"],
        "teardown": ["delete_cpu_vm", "record_run"],
    },
}


def test_the_graph_groups_the_stages_and_every_task_keeps_its_id(
    serialized_dags: dict[str, Any], pipeline: tuple[Any, Shape]
) -> None:
    """Five groups instead of 16 tasks in a row: the graph reads at fit. Task ids stay unprefixed
    (prefix_group_id=False): the task orders, the ledger, the watcher, tpu-rl plan and the docs
    name tasks by id."""
    dag, shape = pipeline
    for graph in (dag, serialized_dags[dag.dag_id]):
        root = graph.task_group
        groups = {
            group_id: sorted(child.children)
            for group_id, child in root.children.items()
            if hasattr(child, "children")
        }
        assert groups == {group: sorted(ids) for group, ids in STAGE_GROUPS[dag.dag_id].items()}
        top = sorted(task_id for task_id, child in root.children.items() if not hasattr(child, "children"))
        assert top == ["validate", WATCHER]
        assert set(graph.task_ids) == {*shape.order, WATCHER}
        for group_id in groups:
            assert root.children[group_id].tooltip
    grouped = [task_id for ids in STAGE_GROUPS[dag.dag_id].values() for task_id in ids]
    assert ["validate", *grouped] == list(shape.order)  # each group holds consecutive stages


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
    assert deploy.upstream_task_ids == {"wait_converted_checkpoint"}
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
    plan_tasks = [step["task_id"] for step in build_plan(dag.dag_id, None)["steps"]]
    assert plan_tasks == sorted(plan_tasks, key=shape.order.index)
    assert set(plan_tasks) == shape.transient  # the tasks that run a command are the retried ones


def test_operators_take_every_value_from_validate_and_jobs_defer(pipeline: tuple[Any, Shape]) -> None:
    dag, shape = pipeline
    arguments = (
        gke_task_arguments(xcom) if dag.dag_id == GKE_DAG_ID else tpu_vm_task_arguments(xcom, bake_result)
    )
    assert set(arguments) == set(shape.order) - {"validate", "record_run"} - {
        t for t in shape.order if t.startswith("wait_")
    }
    for task_id, expected in arguments.items():
        task = dag.get_task(task_id)
        for name, template in expected.items():
            assert getattr(task, name) == template, (task_id, name)
            if isinstance(template, str) and "{{" in template:
                assert name in task.template_fields, (task_id, name)
    for task in dag.tasks:
        if task.task_id.startswith("wait_") or (
            dag.dag_id == GKE_DAG_ID
            and task.task_id in {"train", "convert_to_maxtext", "export_to_huggingface"}
        ):
            assert task.deferrable is True, task.task_id
    if dag.dag_id == GKE_DAG_ID:
        assert type(dag.get_task("convert_to_maxtext")).__name__ == "MaxTextConvertOperator"
        assert type(dag.get_task("export_to_huggingface")).__name__ == "MaxTextExportOperator"


def test_every_operator_argument_renders_to_validates_value(pipeline: tuple[Any, Shape]) -> None:
    """Rendered against validate's real output, each argument is the resolved value (native types)."""
    dag, shape = pipeline
    derived = validate_pipeline_conf(dag.dag_id, "manual__1", {}, {**shape.defaults, **OWN_CLOUD})
    arguments = (gke_task_arguments if dag.dag_id == GKE_DAG_ID else tpu_vm_task_arguments)(
        derived.__getitem__
    )
    for task_id, values in arguments.items():
        for name, value in values.items():
            assert render(dag, task_id, name, derived) == value, (task_id, name)


class ValidateXCom:
    """Stands in for ``ti`` in a template context: returns the validate task's real output.

    It has a task instance's identity too, a run of its own: ``validated`` keeps what it pulled
    per task try.
    """

    def __init__(self, derived: dict[str, Any], task_id: str) -> None:
        self.derived = derived
        self.dag_id, self.run_id, self.task_id = "tpu_rl_test", f"manual__{uuid.uuid4().hex}", task_id
        self.map_index, self.try_number = -1, 1

    def xcom_pull(self, task_ids: str, **_: Any) -> dict[str, Any] | None:
        if task_ids == "bake_image":  # not run: no baked image
            return None
        assert task_ids == "validate"
        return self.derived


def render(dag: Any, task_id: str, field: str, derived: dict[str, Any]) -> Any:
    task = dag.get_task(task_id)
    return task.render_template(
        getattr(task, field), {"ti": ValidateXCom(derived, task_id)}, dag.get_template_env()
    )


def test_sensors_watch_the_paths_validate_derives(pipeline: tuple[Any, Shape]) -> None:
    dag, shape = pipeline
    derived = validate_pipeline_conf(dag.dag_id, "manual__1", {}, {**shape.defaults, **OWN_CLOUD})
    actor_root = render(dag, "wait_actor_checkpoint", "checkpoint_root", derived)
    step = render(dag, "wait_actor_checkpoint", "step", derived)
    export_uri = render(dag, "wait_hf_export", "export_uri", derived)
    assert actor_root == derived["actor_root"]
    assert step == derived["final_step"] == 50
    assert isinstance(step, int)  # native rendering: the sensor gets an int, not "50"
    assert export_uri == derived["export_uri"]
    # Both pipelines watch GCS; the TPU VM's /dev/shm is gone with the VM.
    assert actor_root.startswith("gs://")
    assert export_uri.startswith("gs://")
    if True:  # both pipelines wait for the converted checkpoint
        converted = render(dag, "wait_converted_checkpoint", "checkpoint_root", derived)
        assert converted == derived["converted_root"]
        assert converted.startswith("gs://")
        sensor = dag.get_task("wait_converted_checkpoint")
        assert sensor.step == 0
        assert sensor.items == ("items",)


def test_sensor_links_name_the_project(pipeline: tuple[Any, Shape]) -> None:
    dag, shape = pipeline
    derived = validate_pipeline_conf(dag.dag_id, "manual__1", {}, {**shape.defaults, **OWN_CLOUD})
    for task in dag.tasks:
        if task.task_id.startswith("wait_"):
            assert "project_id" in task.template_fields, task.task_id
            assert render(dag, task.task_id, "project_id", derived) == derived["project"], task.task_id


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
        # both deploys save the link (test_deploy_cluster_link.py): no empty "Extra Links" heading
        assert dag.get_task("deploy_cluster").extra_links == ["GKE Cluster"]
        assert dag.get_task("deploy_tpu_pool").extra_links == ["GKE Cluster"]
    for task in dag.tasks:
        if task.task_id.startswith("wait_"):
            assert task.extra_links == ["GCS Folder"], task.task_id


def test_the_pipelines_note_each_failure_for_the_watcher(pipeline: tuple[Any, Shape]) -> None:
    from airflow_provider_tpu_rl.pipelines.failures import note_failure

    dag, _ = pipeline
    for task in dag.tasks:
        callbacks = task.on_failure_callback
        callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
        assert note_failure in callbacks, task.task_id
        assert len(callbacks) == 2, task.task_id  # and the ledger's step callback


def test_a_task_pulls_validates_values_once_per_try(pipeline: tuple[Any, Shape]) -> None:
    """Every templated field reads validate's XCom; the task asks for it once per try."""
    dag, shape = pipeline
    derived = validate_pipeline_conf(dag.dag_id, "manual__1", {}, {**shape.defaults, **OWN_CLOUD})
    task = dag.get_task("wait_actor_checkpoint")
    ti = ValidateXCom(derived, task.task_id)
    pulls: list[str] = []
    pull = ti.xcom_pull
    ti.xcom_pull = lambda task_ids, **kw: pulls.append(task_ids) or pull(task_ids, **kw)  # type: ignore[method-assign]
    fields = ("project_id", "checkpoint_root", "step")
    for field in fields:
        task.render_template(getattr(task, field), {"ti": ti}, dag.get_template_env())
    assert pulls == ["validate"]
    ti.try_number = 2  # a retry reads it again
    rendered = [task.render_template(getattr(task, f), {"ti": ti}, dag.get_template_env()) for f in fields]
    assert pulls == ["validate", "validate"]
    assert rendered == [derived["project"], derived["actor_root"], derived["final_step"]]


def test_validate_pushes_its_values_as_one_xcom(pipeline: tuple[Any, Shape]) -> None:
    """Not one XCom per key besides (TaskFlow's multiple_outputs for a dict return): read whole."""
    dag, _ = pipeline
    assert dag.get_task("validate").multiple_outputs is False
