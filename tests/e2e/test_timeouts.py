"""A hung CLI call is killed at its timeout and the teardown still runs (sandbox, GKE pipeline).

This run is also the pipeline's deploy that fails for good (no retry is left): the teardown
destroys what the deploy created, nothing is converted, and the bucket and the ledger row stay.

The fake gcluster's ``deploy`` creates the cluster, then hangs in a fake "terraform apply" that,
like the real one under terraform-exec, runs in a process group of its own and dies with its
parent (``TPU_RL_SANDBOX_HANG``). The deploy task's bound is set to seconds through ``[tpu_rl]``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_tpu_rl.spec import gke_pipeline_from_conf
from tests.support.harness import GKE_DAG_ID, DagRunResult, E2EWorld
from tpu_rl_sandbox.clis.gcluster.app import HANG_ENV, hung_processes

pytestmark = pytest.mark.e2e

CLUSTER = "e2e-hung"
BOUNDS = {
    HANG_ENV: "deploy",
    # Fractional minutes: the deploy task may take 40 s, its gcluster call a little less.
    "AIRFLOW__TPU_RL__DEPLOY_TIMEOUT_MINUTES": "0.67",
    "AIRFLOW__TPU_RL__KILL_GRACE_SECONDS": "5",
    "AIRFLOW__TPU_RL__RETRIES": "0",
}


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@pytest.fixture(scope="module")
def hung(world: E2EWorld) -> DagRunResult:
    conf = {
        "project": "tpu-rl-e2e",
        "cluster_name": CLUSTER,
        "bucket": "tpu-rl-e2e-gke-hung",
        "num_batches": 3,
    }
    return world.run_dag(GKE_DAG_ID, conf, env_overrides=BOUNDS)


def test_the_hung_deploy_fails_its_task_with_a_timeout(hung: DagRunResult) -> None:
    assert hung.exit_code == 1, hung.describe()
    assert hung.state == "failed", hung.describe()
    assert hung.task_state("deploy_cluster") == "failed", hung.describe()
    assert any("timed out" in m or "Timeout" in m for m in hung.raised()), hung.describe()
    # Nothing after the deploy ran; the run says why.
    assert hung.task_state("convert_to_maxtext") in ("upstream_failed", None), hung.describe()
    assert hung.task_state("watcher") == "failed", hung.describe()


def test_the_hung_gcluster_and_its_terraform_are_gone(world: E2EWorld, hung: DagRunResult) -> None:
    processes = hung_processes(world.layout)
    assert {p["role"] for p in processes} == {"gcluster", "terraform"}, processes
    assert [p for p in processes if _alive(int(str(p["pid"])))] == []
    # Terraform, outside gcluster's process group, was interrupted (it stops and releases its
    # state lock) before gcluster went, rather than killed with it.
    assert [p["ended"] for p in processes if p["role"] == "terraform"] == ["interrupted"]


def test_the_teardown_still_ran_and_destroyed_the_cluster(world: E2EWorld, hung: DagRunResult) -> None:
    assert hung.task_state("destroy_cluster") == "success", hung.describe()
    destroys = hung.calls_of("gcluster", "destroy")
    assert destroys, hung.describe()
    assert destroys[-1].exit_code == 0, hung.describe()
    assert CLUSTER not in world.live_clusters(), hung.describe()


def test_the_failed_deploy_converted_nothing_and_kept_the_bucket_and_the_record(
    world: E2EWorld, hung: DagRunResult
) -> None:
    spec = gke_pipeline_from_conf(hung.conf, dag_id=hung.dag_id, run_id=hung.run_id)
    assert hung.calls_of("gcluster", "job", "submit") == [], hung.describe()
    assert world.objects(spec.conversion.output_directory) == set()
    assert world.bucket_exists(spec.cluster.bucket)
    assert hung.task_state("record_run") == "success", hung.describe()
    (ledger_state,) = world.ledger("SELECT state FROM runs WHERE run_id = ?", (hung.ledger_run_id,))[0]
    assert ledger_state == "failed"
