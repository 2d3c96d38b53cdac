"""A bad setting whose value changes on its way to the task is still refused at ``validate``, in one line.

A real ``airflow dags test`` run of the GKE pipeline (the machinery of test_dag_runs.py: fake
``gcluster``/``gcloud`` that record every call and fail). Only what happens between the conf and
the task needs a run: Airflow 3 serializes the conf to the task as JSON, where a NaN becomes null,
while Airflow 2 hands the task the float itself. Every other bad setting is sent through the same
``validate`` call in-process by ``tests/dags/test_trigger_form.py`` (and through the form's JSON
schema there too); the one-line error and the watcher's summary of a refused run are pinned by
``test_a_bad_conf_fails_before_anything_is_created_or_destroyed`` in ``test_dag_runs.py``.
"""

from __future__ import annotations

from collections.abc import Callable

from airflow_provider_tpu_rl.compat import AIRFLOW_V_3_0_PLUS
from tests.dags.test_dag_runs import OK_CONF, WORK_TASKS, RunResult, dags_test

__all__ = ["dags_test"]  # the module-scoped fixture, used here with its own AIRFLOW_HOME

NAN_REFUSAL = (
    "train_overrides.learning_rate: must not be null (NaN and Infinity arrive as null)"
    if AIRFLOW_V_3_0_PLUS
    else "train_overrides.learning_rate: must be a finite number (got nan)"
)


def test_a_nan_override_is_refused_at_validate_in_one_line(dags_test: Callable[..., RunResult]) -> None:
    # The form's schema lets null through for an override's value (pipeline_dags.py), so it is
    # validate that names it.
    conf = {**OK_CONF, "train_overrides": {"learning_rate": float("nan")}}
    result = dags_test(conf=conf, mark_success=f"^({WORK_TASKS}|destroy_cluster)$")
    assert result.task_states["validate"] == "failed", result.output[-3000:]
    assert result.task_states["deploy_cluster"] == "upstream_failed"
    assert result.task_states["train"] == "upstream_failed"
    assert result.cloud_calls == []
    assert result.state == "failed"
    validate_log = result.task_log("validate")
    assert f"invalid pipeline conf: {NAN_REFUSAL}" in validate_log
    assert "Traceback" not in validate_log
    assert f"1 task failed: validate: invalid pipeline conf: {NAN_REFUSAL}" in result.task_log("watcher")
