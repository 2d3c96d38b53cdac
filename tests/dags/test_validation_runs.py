"""Each bad setting is refused at ``validate``, in one line, before anything is deployed.

Real ``airflow dags test`` runs of the GKE pipeline (the machinery of test_dag_runs.py: fake
``gcluster``/``gcloud`` that record every call and fail). The cloud steps would be marked
successful, so a bad setting that got past ``validate`` would show as a deploy that "ran".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from airflow_provider_tpu_rl.compat import AIRFLOW_V_3_0_PLUS
from tests.dags.test_dag_runs import OK_CONF, WORK_TASKS, RunResult, dags_test

__all__ = ["dags_test"]  # the module-scoped fixture, used here with its own AIRFLOW_HOME

BAD_SETTINGS: list[tuple[str, dict[str, Any], str]] = [
    (
        "unknown-maxtext-key",
        {"train_overrides": {"lerning_rate": 1e-5}},
        "train_overrides.lerning_rate: not a MaxText config key (did you mean learning_rate?)",
    ),
    (
        "num-batches-in-overrides",
        {"num_batches": 50, "train_overrides": {"num_batches": 5}},
        "train_overrides.num_batches: cannot be overridden: set it with the `num_batches` param",
    ),
    ("num-batches-too-large", {"num_batches": 10**30}, "num_batches: must be <= 10000000"),
    (
        "placeholder-project",
        {"project": "my-tpu-project"},
        "project: set project to your GCP project (my-tpu-project is the form's example)",
    ),
    (
        "placeholder-bucket",
        {"bucket": "my-tpu-rl-bucket"},
        "bucket: set bucket to a Cloud Storage bucket name of yours (my-tpu-rl-bucket is the form's example)",
    ),
    (
        "nan-in-overrides",
        {"train_overrides": {"learning_rate": float("nan")}},
        # Airflow 3 serializes the conf to the task as JSON, where a NaN becomes null; Airflow 2
        # hands the task the float itself.
        "train_overrides.learning_rate: must not be null (NaN and Infinity arrive as null)"
        if AIRFLOW_V_3_0_PLUS
        else "train_overrides.learning_rate: must be a finite number (got nan)",
    ),
]


@pytest.mark.parametrize(
    ("conf", "line"),
    [
        # A NaN of the conf reaches the task as null on Airflow 3: the form's schema lets null
        # through for an override's value (pipeline_dags.py), so validate names it in one line
        pytest.param(*case[1:], id=case[0])
        for case in BAD_SETTINGS
    ],
)
def test_a_bad_setting_is_refused_at_validate_in_one_line(
    dags_test: Callable[..., RunResult], conf: dict[str, Any], line: str
) -> None:
    result = dags_test(conf={**OK_CONF, **conf}, mark_success=f"^({WORK_TASKS}|destroy_cluster)$")
    assert result.task_states["validate"] == "failed", result.output[-3000:]
    assert result.task_states["deploy_cluster"] == "upstream_failed"
    assert result.task_states["train"] == "upstream_failed"
    assert result.cloud_calls == []
    assert result.state == "failed"
    validate_log = result.task_log("validate")
    assert f"invalid pipeline conf: {line}" in validate_log
    assert "Traceback" not in validate_log
    assert 'File "' not in validate_log
    # The one line is the task's error: the watcher repeats it as is.
    assert f"1 task failed: validate: invalid pipeline conf: {line}" in result.task_log("watcher")


# Wrong JSON types and NaN for a top-level number: the form's JSON schema (the DAG params) refuses
# them when the run is created (Airflow's own check, the same in the UI and the REST API).
SCHEMA_REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("list-for-compute-type", {"compute_type": ["ct6e-standard-4t"]}, "compute_type"),
    ("nan-for-num-batches", {"num_batches": float("nan")}, "num_batches"),
    ("infinity-for-max-cluster-hours", {"max_cluster_hours": float("inf")}, "max_cluster_hours"),
]


@pytest.mark.parametrize(
    ("conf", "field"), [c[1:] for c in SCHEMA_REFUSED], ids=[c[0] for c in SCHEMA_REFUSED]
)
def test_a_wrong_json_type_is_refused_before_the_run_exists(
    dags_test: Callable[..., RunResult], conf: dict[str, Any], field: str
) -> None:
    result = dags_test(conf={**OK_CONF, **conf}, mark_success=f"^({WORK_TASKS}|destroy_cluster)$")
    assert result.state is None  # no DAG run: nothing ran, nothing to tear down
    assert result.cloud_calls == []
    assert result.exit_code != 0
    assert f"Invalid input for param {field}: " in result.output
