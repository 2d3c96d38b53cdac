"""What every task of the pipelines shares (pipelines/dag.py): the graph's stage groups (task ids kept),
and the failure callbacks (the watcher's note and the ledger's step)."""

from __future__ import annotations

from typing import Any

from tests.support.dags import GKE_DAG_ID, TPU_VM_DAG_ID
from tests.support.pipeline_shapes import WATCHER, Shape

# The graph's groups (pipelines.dag.stage_group), each holding consecutive stages; validate and the
# watcher stay outside.
STAGE_GROUPS = {
    GKE_DAG_ID: {
        "prepare": ["preflight", "ensure_bucket", "deploy_cluster", "sync_hf_token", "copy_workload_image"],
        "conversion": [
            "convert_to_maxtext",
            "wait_converted_checkpoint",
            "publish_converted_qwen3-30b-a3b",
            "publish_converted_gemma4-26b",
            "publish_converted_qwen3-0_6b",
        ],
        "training": ["deploy_tpu_pool", "train", "wait_actor_checkpoint", "destroy_tpu_pool"],
        "export": [
            "export_to_huggingface",
            "wait_hf_export",
            "promote_model",
            "publish_qwen3-30b-a3b",
            "publish_gemma4-26b",
            "publish_qwen3-0_6b",
        ],
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
        "conversion": [
            "convert_to_maxtext",
            "wait_converted_checkpoint",
            "publish_converted_llama3_1-8b-Instruct",
            "publish_converted_qwen3-0_6b",
        ],
        "training": ["create_vm", "install_maxtext", "train", "wait_actor_checkpoint", "delete_vm"],
        "export": [
            "export_to_huggingface",
            "wait_hf_export",
            "promote_model",
            "publish_llama3_1-8b-Instruct",
            "publish_qwen3-0_6b",
        ],
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
        assert set(graph.task_ids) == {*shape.order, *shape.side_tasks, WATCHER}
        for group_id in groups:
            assert root.children[group_id].tooltip
    grouped = [
        task_id
        for ids in STAGE_GROUPS[dag.dag_id].values()
        for task_id in ids
        if task_id not in shape.side_tasks
    ]
    assert ["validate", *grouped] == list(shape.order)  # each group holds consecutive stages


def test_the_pipelines_note_each_failure_for_the_watcher(pipeline: tuple[Any, Shape]) -> None:
    from airflow_provider_tpu_rl.pipelines.failures import note_failure

    dag, _ = pipeline
    for task in dag.tasks:
        callbacks = task.on_failure_callback
        callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
        assert note_failure in callbacks, task.task_id
        assert len(callbacks) == 2, task.task_id  # and the ledger's step callback
