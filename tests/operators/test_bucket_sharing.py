"""``delete_bucket=true`` in a bucket runs share: a run deletes only what is provably its own.

Two runs (their own clusters) share one bucket. The first run's teardown with ``delete_bucket``
must leave the other run's lease, Terraform state, run directories, records and cluster alone:
nothing at all while the other run lives, only its own folders once the other run has ended, and
the whole bucket only when it created the bucket and nothing in it names another run.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from airflow_provider_tpu_rl.operators.gke import GclusterDestroyOperator
from airflow_provider_tpu_rl.records.bucket_usage import BUCKET_OWNER_OBJECT
from airflow_provider_tpu_rl.records.lease import ClusterLeaseHook, lease_object
from airflow_provider_tpu_rl.records.run_dirs import RunDirRecords, WriterClaim, run_record_object
from airflow_provider_tpu_rl.render import gke
from airflow_provider_tpu_rl.spec import GKE_DAG_ID
from tests.support.compat import capture_task_logs
from tests.support.sandbox_run import RecordingTI, SandboxRun, prepare_cluster

RUN_A = "manual__2026-03-01T00:00:00+00:00"
RUN_B = "manual__2026-03-02T00:00:00+00:00"
MODEL = "gemma4-26b"


class RunStatesTI(RecordingTI):
    """A task instance that reads other DAG runs' states (the Task SDK's calls)."""

    def __init__(self, states: dict[str, str]) -> None:
        super().__init__(1)
        self.states = states

    def get_dagrun_state(self, dag_id: str, run_id: str) -> str:
        return self.states.get(run_id, "running")

    def get_task_states(self, dag_id: str, run_ids: list[str]) -> dict[str, dict[str, str]]:
        return {}


def _confs(sb: SandboxRun) -> tuple[dict[str, Any], dict[str, Any]]:
    a = sb.gke_conf(run_name="rl-a")
    b = {**a, "cluster_name": f"{sb.cluster}b", "run_name": "rl-b"}
    return a, b


def _trained(sb: SandboxRun, run_id: str, run_name: str) -> str:
    """What a finished training leaves in the bucket: a checkpoint under its run directory and the
    record naming the run that wrote it (the claim released)."""
    directory = f"gs://{sb.bucket}/{MODEL}/trained/{run_name}/"
    run = f"{GKE_DAG_ID}/{run_id}"
    records = RunDirRecords()
    writer = WriterClaim(run, f"job-{run_name}", "p/us-east5/c", time.time() + 600)
    records.claim(sb.bucket, directory, run=run, settings={"model_name": MODEL}, writer=writer)
    records.release(sb.bucket, directory, run=run)
    sb.api.upload(sb.bucket, f"{MODEL}/trained/{run_name}/checkpoints/actor/3/model_params/x", b"weights")
    return directory


def _destroy(sb: SandboxRun, conf: dict[str, Any], run_id: str, states: dict[str, str]) -> dict[str, Any]:
    destroy = sb.operator(GclusterDestroyOperator, task_id="destroy_cluster", conf=conf, run_id=run_id)
    with capture_task_logs() as logs:
        result: dict[str, Any] = destroy.execute(
            sb.context(destroy, conf, run_id=run_id, ti=RunStatesTI(states))
        )
    result["log"] = "\n".join(str(line.get("event")) for line in logs)
    return result


@pytest.fixture
def two_runs(sb: SandboxRun) -> tuple[dict[str, Any], dict[str, Any]]:
    a, b = _confs(sb)
    prepare_cluster(sb, {**a, "delete_bucket": True}, run_id=RUN_A)  # A creates the bucket
    prepare_cluster(sb, {**b, "delete_bucket": True}, run_id=RUN_B)
    _trained(sb, RUN_A, "rl-a")
    _trained(sb, RUN_B, "rl-b")
    return a, b


def test_a_teardown_deletes_nothing_while_another_run_uses_the_bucket(
    sb: SandboxRun, two_runs: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    _, b = two_runs
    before = set(sb.objects())

    done = _destroy(sb, {**b, "delete_bucket": True}, RUN_B, {RUN_A: "running"})

    assert done["destroyed"] is True  # B's own cluster goes
    assert done["bucket_deleted"] is False
    assert done["objects_deleted"] == []
    line = done["bucket_kept"]
    assert "\n" not in line
    assert line.startswith(
        f"delete_bucket: gs://{sb.bucket} is still used: cluster {sb.cluster} is in use by run"
    )
    assert line.endswith("nothing was deleted")
    assert line in done["log"]
    # Everything of A is there: its lease, state, record, run directory; its cluster runs on.
    after = set(sb.objects())
    assert {n for n in before if "rl-a" in n or f"/{sb.cluster}/" in n} <= after
    assert lease_object(sb.cluster) in after
    assert f"{MODEL}/trained/rl-a/checkpoints/actor/3/model_params/x" in after
    record = sb.cluster_record()
    assert record is not None
    assert record.get("exists", True) is not False
    assert sb.bucket_exists()


def test_once_the_other_run_ended_only_the_runs_own_folders_go(
    sb: SandboxRun, two_runs: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    _, b = two_runs
    ClusterLeaseHook().release(sb.bucket, ClusterLeaseHook().read(sb.bucket, sb.cluster))  # A ended
    ended = {RUN_A: "success"}

    done = _destroy(sb, {**b, "delete_bucket": True}, RUN_B, ended)

    assert done["bucket_deleted"] is False
    deleted = set(done["objects_deleted"])
    assert f"{MODEL}/trained/rl-b/" in deleted
    assert run_record_object(f"gs://{sb.bucket}/{MODEL}/trained/rl-b/") in deleted
    assert gke.resource_record_object(f"{sb.cluster}b") in deleted
    assert f"gke-tpu-v6e/{sb.cluster}b/" in deleted  # the Terraform state of the cluster B destroyed
    left = set(sb.objects())
    assert not any(n.startswith(f"{MODEL}/trained/rl-b/") for n in left)
    assert f"{MODEL}/trained/rl-a/checkpoints/actor/3/model_params/x" in left  # A's model stays
    assert gke.resource_record_object(sb.cluster) in left
    assert any(n.startswith(f"gke-tpu-v6e/{sb.cluster}/") for n in left)
    assert sb.bucket_exists()


def test_a_bucket_that_is_provably_the_runs_own_is_deleted_whole(sb: SandboxRun) -> None:
    a, _ = _confs(sb)
    prepare_cluster(sb, a, run_id=RUN_A)
    _trained(sb, RUN_A, "rl-a")
    assert BUCKET_OWNER_OBJECT in sb.objects()

    done = _destroy(sb, {**a, "delete_bucket": True}, RUN_A, {})

    assert done["bucket_deleted"] is True
    assert not sb.bucket_exists()


def test_a_bucket_the_run_did_not_create_is_never_deleted_whole(sb: SandboxRun) -> None:
    a, _ = _confs(sb)
    prepare_cluster(sb, a, run_id=RUN_A)
    sb.api.delete(sb.bucket, BUCKET_OWNER_OBJECT)  # as a bucket the user made beforehand
    _trained(sb, RUN_A, "rl-a")

    done = _destroy(sb, {**a, "delete_bucket": True}, RUN_A, {})

    assert done["bucket_deleted"] is False
    assert f"{MODEL}/trained/rl-a/" in done["objects_deleted"]
    assert sb.bucket_exists()
