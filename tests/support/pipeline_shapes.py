"""The two pipeline DAGs' shapes (task order, billed resources and their teardowns, retried tasks), a
run's own cloud settings, and validate's XCom rendered into a task's templates: for the tests of the
shipped DAGs (tests/dags) and of what builds them (tests/pipelines). The ``pipeline`` fixture
(each pipeline DAG with its shape) is given by their conftest.py."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_provider_tpu_rl.spec import GKE_DEFAULTS, TPU_VM_DEFAULTS
from airflow_provider_tpu_rl.spec.pipeline import (
    GKE_SIDE_TASKS,
    GKE_TASK_ORDER,
    TPU_VM_SIDE_TASKS,
    TPU_VM_TASK_ORDER,
)
from tests.support.dags import GKE_DAG_ID, PIPELINE_DAG_IDS, TPU_VM_DAG_ID

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
    # publish_<preset>: each model asset's task, after promote_model only (outside the order)
    publishers: tuple[str, ...] = ()
    # publish_converted_<preset>: each converted checkpoint's task, after wait_converted_checkpoint only
    checkpoint_publishers: tuple[str, ...] = ()

    @property
    def side_tasks(self) -> tuple[str, ...]:
        """Every asset task (outside the order)."""
        return (*self.publishers, *self.checkpoint_publishers)

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
                "copy_workload_image",
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
            # the TPU pool streams the copied image: it is deployed once the copy is done
            ("deploy_tpu_pool", frozenset({"copy_workload_image"})),
        ),
        extra_setups=frozenset({"deploy_tpu_pool"}),
        side=tuple(GKE_SIDE_TASKS.items()),
        publishers=("publish_qwen3-30b-a3b", "publish_gemma4-26b", "publish_qwen3-0_6b"),
        checkpoint_publishers=(
            "publish_converted_qwen3-30b-a3b",
            "publish_converted_gemma4-26b",
            "publish_converted_qwen3-0_6b",
        ),
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
        publishers=("publish_llama3_1-8b-Instruct", "publish_qwen3-0_6b"),
        checkpoint_publishers=("publish_converted_llama3_1-8b-Instruct", "publish_converted_qwen3-0_6b"),
    ),
}


WATCHER = "watcher"


@pytest.fixture(params=PIPELINE_DAG_IDS)
def pipeline(request: pytest.FixtureRequest, dag_bag: Any) -> tuple[Any, Shape]:
    return dag_bag.dags[request.param], SHAPES[request.param]


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
        if task_ids in ("bake_image", "copy_workload_image"):  # not run: no baked image, no copy
            return None
        assert task_ids == "validate"
        return self.derived


def render(dag: Any, task_id: str, field: str, derived: dict[str, Any]) -> Any:
    task = dag.get_task(task_id)
    return task.render_template(
        getattr(task, field), {"ti": ValidateXCom(derived, task_id)}, dag.get_template_env()
    )
