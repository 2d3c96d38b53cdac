"""One writer per run directory even after a crash (issue 43, item 1), in the sandbox.

Run A trains on cluster ``c``; its worker is killed while the job runs (A's task deferred, its
trigger never runs again): the JobSet keeps training, its claim on the run directory is no longer
renewed. Run B uses the same ``run_name`` on cluster ``cb``. Before issue 43, B took the directory
over as soon as A's run was marked failed or A's claim expired, and both jobs wrote it. Now the
claim's job is read where it runs before any takeover:

* alive: B refuses in one line naming it and how to stop it; with ``cancel_previous_writer`` B
  stops it, waits until no pod of it is left, takes over and resumes (the ledger's resume);
* its cluster unreadable: B refuses while the directory was written recently, takes over once it
  has been silent for the claim window plus one checkpoint period;
* the orphaned cluster ``c`` is found by the janitor.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.hooks import kubernetes
from airflow_provider_tpu_rl.hooks.gcluster import GclusterHook
from airflow_provider_tpu_rl.ledger.records import resume_loss
from airflow_provider_tpu_rl.operators.gke_jobs import PathwaysRLTrainOperator
from airflow_provider_tpu_rl.operators.janitor import find_expired_resources
from airflow_provider_tpu_rl.records.run_dirs import RunDirRecords
from airflow_provider_tpu_rl.spec import GKE_DAG_ID, gke_pipeline_from_conf
from tests.operators.test_janitor_orphans import MetadataStandIn
from tests.operators.test_run_identity import RunStatesTI, _alive
from tests.support.sandbox_run import (
    REGION,
    SandboxRun,
    convert_checkpoint,
    defer,
    prepare_cluster,
    run_trigger,
    wait_for,
)
from tpu_rl_sandbox.apis import kube_access
from tpu_rl_sandbox.world.settings import update_settings

RUN_A = "manual__2026-03-01T00:00:00+00:00"
RUN_B = "manual__2026-03-02T00:00:00+00:00"
RUN_NAME = "dup-rn"
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets"


def _train(sb: SandboxRun, conf: dict[str, Any], run_id: str, **kwargs: Any) -> PathwaysRLTrainOperator:
    return sb.operator(PathwaysRLTrainOperator, task_id="train", conf=conf, run_id=run_id, **kwargs)


def _job(conf: dict[str, Any], run_id: str) -> str:
    return gke_pipeline_from_conf(conf, run_id=run_id).train_job


def _run_dir(sb: SandboxRun) -> str:
    return f"gs://{sb.bucket}/gemma4-26b/trained/{RUN_NAME}/"


def _jobset_status(sb: SandboxRun, name: str) -> int:
    return kube_access.request(sb.kube(), "GET", f"{JOBSETS}/{name}").status


class Crashed:
    """Run A, killed while its training job runs on cluster ``c``; run B's conf names ``cb``."""

    def __init__(self, sb: SandboxRun, hold: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sb = sb
        self.hold = hold
        self.monkeypatch = monkeypatch
        self.conf = sb.gke_conf(run_name=RUN_NAME)
        self.elsewhere = {**self.conf, "cluster_name": f"{sb.cluster}b"}
        self.job = _job(self.conf, RUN_A)

    def start(self) -> None:
        sb = self.sb
        prepare_cluster(sb, self.conf, run_id=RUN_A)
        convert_checkpoint(sb, self.conf, run_id=RUN_A)
        # A's job stays live: its final checkpoint waits before the commit
        self.monkeypatch.setenv("TPU_RL_SANDBOX_HOLD_FILE", str(self.hold))
        first = _train(sb, self.conf, RUN_A)
        # A submits and defers; its trigger never runs (the worker and the triggerer are gone)
        defer(first, sb.context(first, self.conf, run_id=RUN_A))
        wait_for(lambda: "Train step" in sb.job_log_of(self.job), "run A's job to train")
        prepare_cluster(sb, self.elsewhere, run_id=RUN_B)

    def worker(self) -> int:
        return int((self.sb.job_record(self.job) or {})["pid"])

    def second(self, **conf: Any) -> PathwaysRLTrainOperator:
        self.elsewhere = {**self.elsewhere, **conf}
        return _train(self.sb, self.elsewhere, RUN_B)

    def b_submits(self) -> list[dict[str, Any]]:
        return self.sb.job_calls("submit", _job(self.elsewhere, RUN_B))

    def stop(self) -> None:
        """Test clean-up: A's job deleted, its pods gone."""
        with contextlib.suppress(Exception):
            kube_access.request(self.sb.kube(), "DELETE", f"{JOBSETS}/{self.job}")
        self.hold.unlink(missing_ok=True)


@pytest.fixture
def crashed(sb: SandboxRun, monkeypatch: pytest.MonkeyPatch) -> Iterator[Crashed]:
    run = Crashed(sb, sb.hold_file(), monkeypatch)
    yield run
    run.stop()


def _refusal(op: PathwaysRLTrainOperator, context: Any) -> str:
    with pytest.raises(AirflowFailException) as refused:
        op.execute(context)
    message = str(refused.value)
    assert "\n" not in message
    return message


def test_a_crashed_runs_job_alive_on_another_cluster_refuses_the_run_reusing_its_run_name(
    sb: SandboxRun, crashed: Crashed
) -> None:
    """A's DAG run is marked failed (as the scheduler does for a dead worker): its claim no longer
    vouches for the job, but the JobSet trains on; B reads it on A's cluster and refuses."""
    crashed.start()
    later = crashed.second()
    message = _refusal(
        later, sb.context(later, crashed.elsewhere, run_id=RUN_B, ti=RunStatesTI({RUN_A: "failed"}))
    )

    assert message.startswith(
        f"{_run_dir(sb)} is still written by job {crashed.job} of run {GKE_DAG_ID}/{RUN_A} ("
    )
    assert (
        f"JobSet default/{crashed.job} is Running on cluster {sb.cluster} ({sb.project}/{REGION})" in message
    )
    assert "its claim belongs to a run that has ended" in message
    assert (
        f"gcluster job cancel {crashed.job} --project={sb.project} --cluster={sb.cluster} --location={REGION}"
        in message
    )
    assert "cancel_previous_writer=true" in message
    assert crashed.b_submits() == []
    writer = RunDirRecords().read(sb.bucket, _run_dir(sb)).writer
    assert writer is not None
    assert (writer.run, writer.job) == (f"{GKE_DAG_ID}/{RUN_A}", crashed.job)  # nothing written
    assert _jobset_status(sb, crashed.job) == 200
    assert _alive(crashed.worker())

    # The janitor finds A's orphaned cluster (its run ended), not B's.
    runs = MetadataStandIn(
        {f"{GKE_DAG_ID}/{RUN_A}": "failed", f"{GKE_DAG_ID}/{RUN_B}": "running"},
        {f"{GKE_DAG_ID}/{RUN_B}": {"train": "running"}},
    )
    stale = find_expired_resources(GclusterHook(), sb.project, time.time(), runs=runs)
    assert [(r.kind, r.name, r.holder) for r in stale] == [("cluster", sb.cluster, f"{GKE_DAG_ID}/{RUN_A}")]


def test_the_same_after_the_crashed_runs_claim_expired(
    sb: SandboxRun, crashed: Crashed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's run is still "running" (an Airflow outage: nothing marked it failed) and its claim
    expired unrenewed (the window shortened to stand in for 30 minutes): B still refuses."""
    monkeypatch.setenv("AIRFLOW__TPU_RL__RUN_DIR_CLAIM_MINUTES", "0.02")  # 1.2 s
    crashed.start()
    writer = RunDirRecords().read(sb.bucket, _run_dir(sb)).writer
    assert writer is not None
    wait_for(lambda: writer.expired(), "run A's claim to expire")
    later = crashed.second()
    message = _refusal(
        later, sb.context(later, crashed.elsewhere, run_id=RUN_B, ti=RunStatesTI({RUN_A: "running"}))
    )

    assert f"is still written by job {crashed.job} of run {GKE_DAG_ID}/{RUN_A}" in message
    assert "although its claim expired at " in message
    assert crashed.b_submits() == []
    assert _alive(crashed.worker())


def test_with_cancel_previous_writer_the_crashed_runs_job_is_stopped_before_the_takeover(
    sb: SandboxRun, crashed: Crashed, capfd: pytest.CaptureFixture[str]
) -> None:
    """B stops A's JobSet, waits until no pod of it is left, then takes over and resumes: one
    writer at a time, and the ledger sees the resume and the steps A trained that no checkpoint kept."""
    crashed.start()
    worker = crashed.worker()
    later = crashed.second(cancel_previous_writer=True)  # the run's conf, as the trigger form sets it
    context = sb.context(later, crashed.elsewhere, run_id=RUN_B, ti=RunStatesTI({RUN_A: "failed"}))
    capfd.readouterr()
    deferred = defer(later, context)

    assert later.cancel_previous_writer is True
    assert not _alive(worker)  # A's pods stopped before B's job was submitted
    assert _jobset_status(sb, crashed.job) == 404
    (submit,) = crashed.b_submits()
    assert submit
    printed = capfd.readouterr()
    assert f"stopping job {crashed.job} of run {GKE_DAG_ID}/{RUN_A}" in printed.out + printed.err
    record = RunDirRecords().read(sb.bucket, _run_dir(sb))
    assert record.writer is not None
    assert record.writer.run == f"{GKE_DAG_ID}/{RUN_B}"
    (killed,) = record.attempts
    assert (killed.run, killed.job, killed.from_step) == (f"{GKE_DAG_ID}/{RUN_A}", crashed.job, 0)
    assert killed.reached_step is not None
    assert killed.reached_step >= 1

    crashed.hold.unlink()
    result = later.execute_complete(context, run_trigger(deferred.trigger))
    assert result["skipped"] is False
    assert result["resumed_from"] == f"{GKE_DAG_ID}/{RUN_A}"
    attempts = result["attempts"]
    assert [a["run"] for a in attempts] == [f"{GKE_DAG_ID}/{RUN_A}", f"{GKE_DAG_ID}/{RUN_B}"]
    loss = resume_loss(attempts, f"{GKE_DAG_ID}/{RUN_B}")
    assert loss is not None
    assert loss.resumes == 1
    assert loss.steps_lost == killed.reached_step  # nothing committed: B trained them again


def test_an_unreadable_cluster_refuses_until_the_directory_has_been_silent_long_enough(
    sb: SandboxRun, crashed: Crashed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's cluster cannot be read (container.clusters.get denied): its job is not proven dead.
    B refuses while the directory was written recently; once nothing was written for the claim
    window plus one checkpoint period (no two checkpoints here: the train stage's bound), it
    takes over. Then, A's JobSet gone, an ordinary takeover proves it dead."""
    crashed.start()
    monkeypatch.setenv("AIRFLOW__TPU_RL__RUN_DIR_CLAIM_MINUTES", "0.02")  # 1.2 s
    # The refusal's silence bound is the claim window plus the train stage's: an hour while B must
    # refuse (however slowly this machine gets there), 3 s once B may take over.
    monkeypatch.setenv("AIRFLOW__TPU_RL__TRAIN_TIMEOUT_MINUTES", "60")
    update_settings(sb.layout, denied_permissions=["container.clusters.get"])
    kubernetes._cluster_access.clear()  # the process's cached endpoints: ask the GKE API again
    try:
        later = crashed.second()
        context = sb.context(later, crashed.elsewhere, run_id=RUN_B, ti=RunStatesTI({RUN_A: "failed"}))
        message = _refusal(later, context)
        assert f"cluster {sb.cluster} cannot be read: GKE API refused to describe cluster" in message
        assert "that job is not proven dead; a takeover waits until nothing was written for " in message
        assert "the train stage's bound" in message
        assert crashed.b_submits() == []

        monkeypatch.setenv("AIRFLOW__TPU_RL__TRAIN_TIMEOUT_MINUTES", "0.05")  # 3 s
        time.sleep(4.5)  # A's job is held: nothing under the directory is written any more
        defer(later, context)
        assert len(crashed.b_submits()) == 1
        record = RunDirRecords().read(sb.bucket, _run_dir(sb))
        assert record.writer is not None
        assert record.writer.run == f"{GKE_DAG_ID}/{RUN_B}"
        assert [a.run for a in record.attempts] == [f"{GKE_DAG_ID}/{RUN_A}"]
    finally:
        update_settings(sb.layout, denied_permissions=[])
        kubernetes._cluster_access.clear()
