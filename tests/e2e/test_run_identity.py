"""Run identity end to end (issue 11, item 1): ``airflow dags test`` runs of the GKE pipeline.

* two runs with the default settings each train and export their own model;
* a run reusing another run's ``run_name`` on purpose resumes it: with the same settings it adopts
  the complete model and says so; with another ``learning_rate`` it is refused at ``train`` in
  one line, before any TPU job, and the cluster is still torn down.

A re-created run while the first run's job is live is covered at the operator level
(tests/operators/test_run_identity.py): two ``airflow dags test`` processes cannot share this
module's SQLite metadata database at once.
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_tpu_rl.spec import GkePipelineSpec, gke_pipeline_from_conf
from tests.e2e.harness import GKE_DAG_ID, DagRunResult, E2EWorld

pytestmark = pytest.mark.e2e

PROJECT = "tpu-rl-e2e-id"


def conf(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "project": PROJECT,
        "cluster_name": f"e2e-{name}",
        "bucket": f"tpu-rl-e2e-id-{name}",
        "num_batches": 2,
        **extra,
    }


def spec_of(result: DagRunResult) -> GkePipelineSpec:
    return gke_pipeline_from_conf(result.conf, dag_id=result.dag_id, run_id=result.run_id)


@pytest.fixture(scope="module")
def default_runs(world: E2EWorld) -> tuple[DagRunResult, DagRunResult]:
    """The same conf twice, no run_name: the default."""
    settings = conf("default")
    return world.run_dag(GKE_DAG_ID, settings), world.run_dag(GKE_DAG_ID, settings)


@pytest.fixture(scope="module")
def named_runs(world: E2EWorld) -> tuple[DagRunResult, DagRunResult, DagRunResult]:
    """run_name "rl-named" three times: first, resumed with the same settings, with another lr."""
    settings = conf("named", run_name="rl-named")
    first = world.run_dag(GKE_DAG_ID, settings)
    same = world.run_dag(GKE_DAG_ID, settings)
    other = world.run_dag(GKE_DAG_ID, {**settings, "train_overrides": {"learning_rate": 0.5}})
    return first, same, other


def test_two_default_runs_each_train_and_export_their_own_model(
    world: E2EWorld, default_runs: tuple[DagRunResult, DagRunResult]
) -> None:
    first, second = default_runs
    for run in default_runs:
        assert run.state == "success", run.describe()
        spec = spec_of(run)
        assert run.submitted_jobs() == (
            [spec.convert_job, spec.train_job, spec.export_job]
            if run is first
            else [spec.train_job, spec.export_job]
        ), run.describe()
        assert world.hf_export_problems(spec.export.output_directory) == [], run.describe()
    assert spec_of(first).training.run_name != spec_of(second).training.run_name
    assert spec_of(first).export.output_directory != spec_of(second).export.output_directory


def test_a_reused_run_name_with_the_same_settings_adopts_the_model_and_says_so(
    world: E2EWorld, named_runs: tuple[DagRunResult, DagRunResult, DagRunResult]
) -> None:
    first, same, _ = named_runs
    assert first.state == "success", first.describe()
    assert same.state == "success", same.describe()
    assert same.submitted_jobs() == [], same.describe()  # converted, trained and exported already
    # One message each for the training and the export (Airflow 2's `dags test` prints every log
    # line twice, by two handlers with two time formats: count messages, not lines).
    adopted = {line.split("} ", 1)[-1] for line in same.output.splitlines() if "this run adopts it" in line}
    assert len(adopted) == 2, same.describe()
    assert all(f"{GKE_DAG_ID}/{first.run_id}" in line for line in adopted)


def test_a_reused_run_name_with_another_learning_rate_is_refused_before_any_job(
    world: E2EWorld, named_runs: tuple[DagRunResult, DagRunResult, DagRunResult]
) -> None:
    first, _, other = named_runs
    assert other.state == "failed", other.describe()
    assert other.task_state("train") == "failed", other.describe()
    assert other.submitted_jobs() == [], other.describe()
    refusals = [m for m in other.raised() if "learning_rate" in m]
    assert refusals, other.describe()
    assert f"{GKE_DAG_ID}/{first.run_id}" in refusals[0]
    assert "\n" not in refusals[0]
    assert spec_of(other).cluster.cluster_name not in world.live_clusters(), other.describe()
