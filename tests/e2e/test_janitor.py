"""The janitor DAG end to end in the sandbox: a crashed run's cluster goes, a live run's stays.

Two GKE pipeline runs are started with ``airflow dags test`` and killed (SIGKILL of their process
group) once their training job is submitted, its TPU pods held pending: each DAG run stays
``running`` in the metadata DB with its ``train`` task deferred, as a dead worker leaves it. For
the crashed run the test then marks that task ``failed``, as the scheduler does to a task whose
worker stopped heart-beating; the other run's task stays ``deferred`` (a triggerer would pick it
up again): it is alive. The janitor (``airflow dags test tpu_rl_janitor``) finds both clusters
through the bucket named in ``[tpu_rl] janitor_buckets`` (their project is neither the
connection's nor a param), reads the runs' states through the Task SDK, notes the crashed run
as orphaned, and destroys its cluster (``orphan_minutes`` 0 here).
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tpu_rl.operators.janitor import orphan_marker_object
from airflow_provider_tpu_rl.records.lease import lease_object
from tests.support.harness import AIRFLOW, GKE_DAG_ID, E2EWorld
from tpu_rl_sandbox.apis.kube_api import POD_HOLD_ENV, POD_HOLD_TPU_ONLY
from tpu_rl_sandbox.world.calls import read_calls

pytestmark = pytest.mark.e2e

JANITOR_DAG_ID = "tpu_rl_janitor"
PROJECT = "tpu-rl-e2e-far"
BUCKET = "tpu-rl-e2e-janitor"
CRASHED, ALIVE = "e2e-jan-crashed", "e2e-jan-alive"
# Deadline against hangs while waiting for a run's training job (not a timing assertion).
WAIT_SECONDS = 900.0
# orphan_minutes 0: one scan notes the crashed run and destroys its cluster (that a noted run is
# destroyed only once it has been orphaned for orphan_minutes is tests/operators/test_janitor_orphans.py)
JANITOR_ENV = {"AIRFLOW__TPU_RL__JANITOR_BUCKETS": BUCKET, "AIRFLOW__TPU_RL__ORPHAN_MINUTES": "0"}


def conf(cluster: str) -> dict[str, Any]:
    return {
        "project": PROJECT,
        "cluster_name": cluster,
        "bucket": BUCKET,
        "num_batches": 3,
        "run_name": cluster,
    }


def training_submitted(world: E2EWorld, cluster: str) -> bool:
    for entry in read_calls(world.layout):
        argv = [str(a) for a in entry["argv"]]
        if (
            entry["tool"] == "gcluster"
            and argv[:2] == ["job", "submit"]
            and f"--cluster={cluster}" in argv
            and int(entry["exit_code"]) == 0
            and not any("-hf-to-mt-" in a for a in argv)
        ):
            return True
    return False


def crash_mid_training(world: E2EWorld, cluster: str, hold: Path) -> str:
    """Start the pipeline for ``cluster``, SIGKILL it once its training job is submitted; its run id."""
    hold.write_text(POD_HOLD_TPU_ONLY)
    env = {**world.env, POD_HOLD_ENV: str(hold)}
    log = (world.root / f"crashed-{cluster}.log").open("w")
    process = subprocess.Popen(
        [AIRFLOW, "dags", "test", GKE_DAG_ID, "-c", json.dumps(conf(cluster))],
        env=env,
        cwd=world.root,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + WAIT_SECONDS
        while not training_submitted(world, cluster):
            assert process.poll() is None, f"the run of {cluster} ended before training"
            assert time.monotonic() < deadline, f"the run of {cluster} never submitted its training job"
            time.sleep(0.2)
        # the task deferred once the operator handed the job to its trigger: `dags test` then runs
        # the trigger in line, with the task instance set back to QUEUED (Airflow 3.3
        # sdk/definitions/dag.py, "[DAG TEST] running trigger in line")
        log_path = world.root / f"crashed-{cluster}.log"
        while not _trigger_running(log_path.read_text()):
            assert process.poll() is None, f"the run of {cluster} ended before its train task deferred"
            assert time.monotonic() < deadline, f"the train task of {cluster} never deferred"
            time.sleep(0.2)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
        log.close()
    return run_id_of(world, cluster)


def _trigger_running(output: str) -> bool:
    """Whether ``dags test`` runs the train task's trigger (in line, after the task deferred)."""
    start = output.find("[DAG TEST] starting task_id=train ")
    return start >= 0 and "[DAG TEST] running trigger in line" in output[start:]


def conf_text(raw: object) -> str:
    """A ``dag_run.conf`` cell as JSON text: Airflow 3 stores JSON, Airflow 2 a pickle (PickleType)."""
    if isinstance(raw, bytes) and raw[:1] == b"\x80":  # pickle protocol 2+; our own metadata DB
        return json.dumps(pickle.loads(raw))  # noqa: S301
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def run_id_of(world: E2EWorld, cluster: str) -> str:
    for run_id, raw in world.metadata("SELECT run_id, conf FROM dag_run WHERE dag_id = ?", (GKE_DAG_ID,)):
        if f'"{cluster}"' in conf_text(raw):
            return str(run_id)
    raise AssertionError(f"no DAG run for {cluster}")


def task_state(world: E2EWorld, cluster: str, task_id: str) -> str | None:
    try:
        run_id = run_id_of(world, cluster)
    except AssertionError:
        return None
    rows = world.metadata(
        "SELECT state FROM task_instance WHERE dag_id = ? AND run_id = ? AND task_id = ?",
        (GKE_DAG_ID, run_id, task_id),
    )
    return str(rows[0][0]) if rows and rows[0][0] is not None else None


@pytest.fixture(scope="module")
def crashed_runs(world: E2EWorld, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Two killed runs: the crashed one's train task failed (a purged zombie), the other's deferred."""
    # Only TPU jobs are held: the first run converts on CPU, then waits at its training job; the
    # second finds the converted checkpoint in the shared bucket.
    holds = tmp_path_factory.mktemp("holds")
    runs = {cluster: crash_mid_training(world, cluster, holds / cluster) for cluster in (CRASHED, ALIVE)}
    with world_db(world) as db:
        db.execute(
            "UPDATE task_instance SET state = 'failed' WHERE dag_id = ? AND run_id = ? AND task_id = 'train'",
            (GKE_DAG_ID, runs[CRASHED]),
        )
        # The live run's train task as a deferred task stands in the metadata DB under a real
        # triggerer (`dags test` had it QUEUED while it ran the trigger in line).
        db.execute(
            "UPDATE task_instance SET state = 'deferred' WHERE dag_id = ? AND run_id = ? AND task_id = 'train'",
            (GKE_DAG_ID, runs[ALIVE]),
        )
        db.commit()
    yield runs
    for hold in holds.iterdir():
        hold.unlink()


def world_db(world: E2EWorld) -> Any:
    import sqlite3
    from contextlib import closing

    return closing(sqlite3.connect(world.home / "airflow.db"))


def marker(world: E2EWorld, cluster: str) -> dict[str, Any] | None:
    if not world.gcs.exists(BUCKET, orphan_marker_object(cluster)):
        return None
    return dict(json.loads(world.gcs.download(BUCKET, orphan_marker_object(cluster))))


def test_a_crashed_runs_cluster_goes_and_a_live_runs_cluster_stays(
    world: E2EWorld, crashed_runs: dict[str, str]
) -> None:
    states = {
        cluster: world.metadata_one(
            "SELECT state FROM dag_run WHERE dag_id = ? AND run_id = ?", (GKE_DAG_ID, run_id)
        )[0]
        for cluster, run_id in crashed_runs.items()
    }
    assert states == {CRASHED: "running", ALIVE: "running"}
    assert task_state(world, ALIVE, "train") == "deferred"
    assert {CRASHED, ALIVE} <= world.live_clusters()

    janitor = world.run_dag(JANITOR_DAG_ID, {}, env_overrides=JANITOR_ENV)

    assert janitor.state == "success", janitor.describe()
    assert f"orphaned: its DAG run {GKE_DAG_ID}/{crashed_runs[CRASHED]} is running" in janitor.output, (
        janitor.describe()
    )
    assert CRASHED not in world.live_clusters(), janitor.describe()
    assert ALIVE in world.live_clusters(), janitor.describe()
    destroyed = janitor.calls_of("gcluster", "destroy")
    assert len(destroyed) == 1, janitor.describe()
    assert any(CRASHED in arg for arg in destroyed[0].argv), janitor.describe()
    # the crashed run's lease released, its marker gone; the live run's lease is still its own
    assert not world.gcs.exists(BUCKET, lease_object(CRASHED))
    assert marker(world, CRASHED) is None
    assert marker(world, ALIVE) is None
    alive_lease = json.loads(world.gcs.download(BUCKET, lease_object(ALIVE)))
    assert alive_lease["run_id"] == crashed_runs[ALIVE]
    assert world.bucket_exists(BUCKET)
    # The crashed run's ledger row, left running by its killed worker, is closed: abandoned, with its
    # TPU pool's billed time and why; the live run's stays running for its record_run.
    row = "SELECT state, end_reason, billed_chip_seconds FROM runs WHERE run_id = ?"
    [(state, reason, billed)] = world.ledger(row, (f"{GKE_DAG_ID}/{crashed_runs[CRASHED]}",))
    assert state == "abandoned", janitor.describe()
    assert reason.startswith(f"janitor: destroyed cluster {CRASHED} (orphaned: its DAG run"), reason
    assert billed > 0
    assert world.ledger(row, (f"{GKE_DAG_ID}/{crashed_runs[ALIVE]}",)) == [("running", None, None)]


def test_the_metadata_database_reader_sees_the_states_the_task_sdk_sees(
    world: E2EWorld, crashed_runs: dict[str, str]
) -> None:
    """``MetadataDbRuns`` (the Airflow 2 reader: a task there may open the metadata DB), run in a
    process with this world's AIRFLOW_HOME, reads the same run and task states."""
    script = (
        "import json, sys\n"
        "from airflow_provider_tpu_rl.records.janitor_sources import MetadataDbRuns\n"
        "runs = MetadataDbRuns()\n"
        "ids = json.loads(sys.argv[1])\n"
        "print(json.dumps({c: [runs.dagrun_state(sys.argv[2], r), runs.task_states(sys.argv[2], r)]"
        " for c, r in ids.items()}))\n"
        "print(json.dumps(runs.dagrun_state(sys.argv[2], 'manual__never')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, json.dumps(crashed_runs), GKE_DAG_ID],
        env=world.env,
        cwd=world.root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen_line, unknown_line = done.stdout.strip().splitlines()[-2:]
    seen = json.loads(seen_line)
    assert json.loads(unknown_line) is None
    assert seen[CRASHED][0] == seen[ALIVE][0] == "running"
    assert seen[CRASHED][1]["train"] == "failed"
    assert seen[ALIVE][1]["train"] == "deferred"
    assert seen[CRASHED][1]["deploy_cluster"] == "success"
    assert seen[ALIVE][1]["destroy_cluster"] is None
