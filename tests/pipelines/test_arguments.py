"""Every task of the pipelines takes its arguments from validate's one XCom (pipelines/arguments.py):
each operator argument is its template, renders to validate's value (native types) and reads the
XCom once per try; the job operators defer."""

from __future__ import annotations

from typing import Any

from airflow_provider_tpu_rl.pipelines.arguments import (
    bake_result,
    copied_image_template,
    gke_task_arguments,
    tpu_vm_task_arguments,
    xcom,
)
from airflow_provider_tpu_rl.pipelines.validate import validate_pipeline_conf
from tests.support.dags import GKE_DAG_ID
from tests.support.pipeline_shapes import OWN_CLOUD, Shape, ValidateXCom, render


def test_operators_take_every_value_from_validate_and_jobs_defer(pipeline: tuple[Any, Shape]) -> None:
    dag, shape = pipeline
    arguments = (
        gke_task_arguments(xcom, copied_image_template())
        if dag.dag_id == GKE_DAG_ID
        else tpu_vm_task_arguments(xcom, bake_result)
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
            # train's image: the copy's (none without image_repository: validate's image)
            assert render(dag, task_id, name, derived) == value, (task_id, name)


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
