"""Two runs naming one ``cluster_name``, end to end in the sandbox: the cluster lease.

The first run's training job is held live (``TPU_RL_SANDBOX_POD_HOLD_FILE`` reading ``tpu``: the
pods of its TPU jobs stay pending while the file exists; its conversion, on CPU, goes on) while a
second ``airflow dags test`` of the same DAG names the same cluster and bucket. The second run is
refused at preflight and must neither deploy over nor destroy the cluster, nor overwrite the
resource record; the first run then finishes as if alone. (Preflight's refusal of a lease taken
before the cluster is up is tests/operators/test_preflight.py; the deploy's own refusal of a leased
cluster, for two runs that pass preflight together, and the hand-over of a kept cluster to a later
run are tests/operators/test_gke.py.)

The second run uses its own AIRFLOW_HOME (a copy of the migrated metadata DB): two ``dags test``
processes never share one SQLite file; both share the module's sandbox.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tpu_rl.records.lease import lease_object
from airflow_provider_tpu_rl.render.gke import resource_record_object
from tests.support.harness import GKE_DAG_ID, Call, DagRunResult, E2EWorld
from tpu_rl_sandbox.apis.kube_api import POD_HOLD_ENV, POD_HOLD_TPU_ONLY
from tpu_rl_sandbox.world.calls import read_calls

pytestmark = pytest.mark.e2e

PROJECT = "tpu-rl-e2e"
BUCKET = "tpu-rl-e2e-lease"
NUM_BATCHES = 3
# Deadline against hangs while waiting for the first run's training job (not a timing assertion: on a
# loaded 2-core machine `dags test` alone took 5 min to reach preflight once).
WAIT_SECONDS = 900.0


def conf(cluster: str, run_name: str, **extra: Any) -> dict[str, Any]:
    """One bucket for every run of this module (the lease and the converted checkpoint live there);
    each run its own run_name, so each trains."""
    return {
        "project": PROJECT,
        "cluster_name": cluster,
        "bucket": BUCKET,
        "num_batches": NUM_BATCHES,
        "run_name": run_name,
        **extra,
    }


@pytest.fixture(scope="module")
def second_world(world: E2EWorld) -> E2EWorld:
    """Another AIRFLOW_HOME on the same sandbox, for a run concurrent with one of ``world``."""
    root = world.root / "second"
    home = root / "airflow"
    home.mkdir(parents=True)
    shutil.copy2(world.home / "airflow.db", home / "airflow.db")
    return E2EWorld(root=root, sandbox=world.sandbox, home=home, env={**world.env, "AIRFLOW_HOME": str(home)})


class Background:
    """A DAG run in a thread (``world.run_dag``), its training pods held until
    :meth:`finish`."""

    def __init__(self, world: E2EWorld, run_conf: dict[str, Any], hold: Path) -> None:
        self.hold = hold
        hold.write_text(POD_HOLD_TPU_ONLY)
        self.result: DagRunResult | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(
            target=self._run, args=(world, run_conf, {POD_HOLD_ENV: str(hold)}), daemon=True
        )
        self.thread.start()

    def _run(self, world: E2EWorld, run_conf: dict[str, Any], env: dict[str, str]) -> None:
        try:
            self.result = world.run_dag(GKE_DAG_ID, run_conf, env_overrides=env)
        except BaseException as err:  # reported by finish()
            self.error = err

    def finish(self) -> DagRunResult:
        self.hold.unlink(missing_ok=True)
        self.thread.join(timeout=WAIT_SECONDS * 2)
        if self.error is not None:
            raise self.error
        assert self.result is not None, "the background run did not finish"
        return self.result


def wait_for_training(world: E2EWorld, cluster: str, background: Background) -> Call:
    """The first run's successful ``gcluster job submit`` of its training job on ``cluster``."""
    deadline = time.monotonic() + WAIT_SECONDS
    while time.monotonic() < deadline:
        for entry in read_calls(world.layout):
            call = Call(str(entry["tool"]), tuple(entry["argv"]), int(entry["exit_code"]))
            name = str(call.flag("name"))
            if (
                call.is_("gcluster", "job", "submit")
                and call.flag("cluster") == cluster
                and call.exit_code == 0
            ) and "-hf-to-mt-" not in name:
                return call
        if not background.thread.is_alive():
            break
        time.sleep(0.2)
    raise AssertionError(f"the first run never submitted its training job on {cluster}")


def resource_record(world: E2EWorld, cluster: str) -> dict[str, Any]:
    return dict(json.loads(world.gcs.download(BUCKET, resource_record_object(cluster))))


def lease(world: E2EWorld, cluster: str) -> dict[str, Any] | None:
    if not world.gcs.exists(BUCKET, lease_object(cluster)):
        return None
    return dict(json.loads(world.gcs.download(BUCKET, lease_object(cluster))))


def first_run_id(world: E2EWorld) -> str:
    """The run id of ``world``'s newest run of the DAG (it may still be running)."""
    (run_id,) = world.metadata_one(
        "SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1", (GKE_DAG_ID,)
    )
    return str(run_id)


@pytest.fixture(scope="module")
def overlap(
    world: E2EWorld, second_world: E2EWorld, tmp_path_factory: pytest.TempPathFactory
) -> tuple[DagRunResult, DagRunResult, dict[str, Any], str]:
    """Run A trains on a cluster; run B names the same cluster; then A finishes.
    ``(A, B, the record while B had ended, A's run id)``."""
    cluster = "e2e-lease-ok"
    hold = tmp_path_factory.mktemp("hold") / "pods-pending"
    background = Background(world, conf(cluster, "a-ok"), hold)
    try:
        wait_for_training(world, cluster, background)
        run_a = first_run_id(world)
        second = second_world.run_dag(GKE_DAG_ID, conf(cluster, "b-ok"))
        # while A still trains: the cluster is up and the record is A's
        assert cluster in world.live_clusters(), second.describe()
        record = resource_record(world, cluster)
    finally:
        first = background.finish()
    return first, second, record, run_a


def test_a_second_run_never_deploys_over_nor_destroys_a_leased_cluster(
    world: E2EWorld, overlap: tuple[DagRunResult, DagRunResult, dict[str, Any], str]
) -> None:
    first, second, record, run_a = overlap
    cluster = first.conf["cluster_name"]
    # B: refused in one line at preflight, before it touched the cluster (the deploy's own lease
    # check, for two runs passing preflight together, is tested in tests/operators); its teardown
    # never ran, so it left the cluster alone
    assert second.state == "failed", second.describe()
    assert second.task_state("preflight") == "failed", second.describe()
    assert second.task_state("deploy_cluster") == "upstream_failed", second.describe()
    expected = f"cluster {cluster} is in use by run {GKE_DAG_ID}/{run_a} until "
    assert f"\n- {expected}" in second.output, second.describe()  # preflight's list of problems
    assert second.calls_of("gcluster", "deploy") == [], second.describe()
    assert second.calls_of("gcluster", "destroy") == [], second.describe()
    assert second.calls_of("gcluster", "job", "submit") == [], second.describe()
    assert second.task_state("destroy_cluster") == "upstream_failed", second.describe()
    # the resource record is still A's
    assert record["run_id"] == run_a
    # A: trained, exported and tore its own cluster down as if alone
    assert first.run_id == run_a
    assert first.state == "success", first.describe()
    assert first.task_state("train") == "success", first.describe()
    # its TPU node pool's destroy, then the cluster's
    assert [c.argv[-1] for c in first.calls_of("gcluster", "destroy")] == ["--only=tpu", "--robust"], (
        first.describe()
    )
    assert cluster not in world.live_clusters()
    assert lease(world, cluster) is None
