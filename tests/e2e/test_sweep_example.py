"""``tpu_rl_sweep_example``: a DAG written by hand from the operators runs end to end in the sandbox."""

from __future__ import annotations

import pytest

from tests.support.harness import DagRunResult, E2EWorld

pytestmark = pytest.mark.e2e

DAG_ID = "tpu_rl_sweep_example"
MODEL = "qwen3-30b-a3b"
CONF = {
    "project": "tpu-rl-e2e-sweep",
    "cluster_name": "e2e-sweep",
    "bucket": "tpu-rl-e2e-sweep",
    "num_batches": 3,
    "sweep": "lr-sweep",
}


@pytest.fixture(scope="module")
def sweep(world: E2EWorld) -> DagRunResult:
    return world.run_dag(DAG_ID, CONF)


def test_the_sweep_succeeds_with_one_cluster_and_two_trained_and_exported_runs(
    world: E2EWorld, sweep: DagRunResult
) -> None:
    assert sweep.exit_code == 0, sweep.describe()
    assert sweep.state == "success", sweep.describe()
    assert {t: r.state for t, r in sweep.tasks.items()} == dict.fromkeys(sweep.tasks, "success")
    assert len(sweep.calls_of("gcluster", "deploy")) == 1
    assert len(sweep.calls_of("gcluster", "destroy")) == 1
    assert "e2e-sweep" not in world.live_clusters()
    bucket = f"gs://{CONF['bucket']}/{MODEL}"
    for key in ("a", "b"):
        run_dir = f"{bucket}/trained/lr-sweep-lr-{key}/checkpoints/actor/3"
        assert "commit_success.txt" in world.objects(run_dir), sweep.describe()
        assert world.hf_export_problems(f"{bucket}/hf-trained/lr-sweep-lr-{key}/") == []


def test_each_run_trained_with_its_own_learning_rate_in_its_own_job(sweep: DagRunResult) -> None:
    submits = sweep.calls_of("gcluster", "job", "submit")
    trains = [c for c in submits if "--pathways" in c.argv]
    assert len(trains) == 2, sweep.describe()
    assert len({c.flag("name") for c in trains}) == 2  # one job per task, never a shared name
    commands = sorted(str(c.flag("command")) for c in trains)
    assert "learning_rate=1e-6" in commands[0] + commands[1]
    assert "learning_rate=3e-6" in commands[0] + commands[1]
    for run, rate in (("lr-sweep-lr-a", "3e-6"), ("lr-sweep-lr-b", "1e-6")):
        (command,) = [c for c in commands if f"run_name={run}" in c]
        assert f"learning_rate={rate}" in command
    # The model was converted once, for both runs; each run was exported from its own checkpoint.
    converts = [c for c in submits if "to_maxtext" in str(c.flag("command"))]
    exports = [c for c in submits if "to_huggingface" in str(c.flag("command"))]
    assert len(converts) == 1
    assert len(exports) == 2
