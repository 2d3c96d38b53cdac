"""Run identity of the job operators in the sandbox (issue 11, item 1).

* "already complete, skip" only for outputs this run wrote; another run's complete output under
  a reused ``run_name`` is adopted as a resume, said in the log and in ``resumed_from``; a resume
  with other settings is refused in one line;
* never two jobs on one run directory: a second DAG run (a re-created run: new run id, same
  ``run_name``) refuses in one line while the first run's claim is live; the same run re-attaches;
* the JobSet carries its run directory and run as annotations (a JSON merge patch by the job's
  wait); a JobSet writing the directory without a claim (submitted by hand) is found by its
  MaxText arguments right after the submit, and the newcomer's job is deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from typing import Any

import pytest

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.hooks.kubernetes import RUN_DIR_ANNOTATION, RUN_ID_ANNOTATION
from airflow_provider_tpu_rl.operators.gke_jobs import (
    MaxTextConvertOperator,
    MaxTextExportOperator,
    PathwaysRLTrainOperator,
)
from airflow_provider_tpu_rl.records.run_dirs import RunDirRecords, run_record_object
from airflow_provider_tpu_rl.spec import GKE_DAG_ID, gke_pipeline_from_conf
from tests.support.sandbox_run import (
    REGION,
    RecordingTI,
    SandboxRun,
    convert_checkpoint,
    defer,
    prepare_cluster,
    run_job_operator,
    run_trigger,
    wait_for,
)
from tpu_rl_sandbox.apis import kube_access

RUN_1 = "manual__2026-03-01T00:00:00+00:00"
RUN_2 = "manual__2026-03-01T00:00:00+00:00__recreated"
RUN_NAME = "rl-shared"
JOBSETS = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets"


def _train(sb: SandboxRun, **kwargs: Any) -> PathwaysRLTrainOperator:
    return sb.operator(PathwaysRLTrainOperator, task_id="train", **kwargs)


def _export(sb: SandboxRun, **kwargs: Any) -> MaxTextExportOperator:
    return sb.operator(MaxTextExportOperator, task_id="export_to_huggingface", **kwargs)


def _train_job(conf: dict[str, Any], run_id: str) -> str:
    return gke_pipeline_from_conf(conf, run_id=run_id).train_job


def _run_dir(sb: SandboxRun) -> str:
    return f"gs://{sb.bucket}/gemma4-26b/trained/{RUN_NAME}/"


def _submits(sb: SandboxRun) -> list[dict[str, Any]]:
    return [c for c in sb.calls() if c["argv"][:2] == ["job", "submit"]]


def _trained(sb: SandboxRun, conf: dict[str, Any]) -> dict[str, Any]:
    """RUN_1 deploys, converts and trains to completion."""
    prepare_cluster(sb, conf, run_id=RUN_1)
    convert_checkpoint(sb, conf, run_id=RUN_1)
    result = run_job_operator(sb, _train(sb), conf, run_id=RUN_1)
    assert result["skipped"] is False
    return result


def _jobset(sb: SandboxRun, name: str) -> dict[str, Any]:
    answer = kube_access.request(sb.kube(), "GET", f"{JOBSETS}/{name}")
    assert answer.status == 200, answer.text
    return dict(answer.json())


# -- complete outputs: this run's are skipped, another run's are adopted only as a resume ---------------
def test_this_runs_complete_output_is_skipped(sb: SandboxRun) -> None:
    conf = sb.gke_conf(run_name=RUN_NAME)
    _trained(sb, conf)
    submits = len(_submits(sb))

    again = run_job_operator(sb, _train(sb), conf, run_id=RUN_1)  # a cleared task of the same run

    assert again["skipped"] is True
    assert again["resumed_from"] is None
    assert len(_submits(sb)) == submits
    record = sb.api.download(sb.bucket, run_record_object(_run_dir(sb)))
    assert f"{GKE_DAG_ID}/{RUN_1}" in record.decode()


def test_another_run_reusing_the_run_name_adopts_the_output_and_says_so(
    sb: SandboxRun, capfd: pytest.CaptureFixture[str]
) -> None:
    conf = sb.gke_conf(run_name=RUN_NAME)
    _trained(sb, conf)
    submits = len(_submits(sb))
    capfd.readouterr()

    later = run_job_operator(sb, _train(sb, conf=conf, run_id=RUN_2), conf, run_id=RUN_2)

    first = f"{GKE_DAG_ID}/{RUN_1}"
    assert later["skipped"] is True
    assert later["job_name"] is None
    assert later["resumed_from"] == first  # the model is the first run's, and the result says so
    assert len(_submits(sb)) == submits
    printed = capfd.readouterr()
    warnings = [line for line in (printed.out + printed.err).splitlines() if "this run adopts it" in line]
    assert len(warnings) == 1, printed
    assert first in warnings[0]


def test_another_run_reusing_the_run_name_with_other_settings_is_refused_in_one_line(sb: SandboxRun) -> None:
    conf = sb.gke_conf(run_name=RUN_NAME)
    _trained(sb, conf)
    submits = len(_submits(sb))
    changed = {**conf, "train_overrides": {"learning_rate": 0.5}}
    op = _train(sb, conf=changed, run_id=RUN_2)

    with pytest.raises(AirflowFailException) as refused:
        op.execute(sb.context(op, changed, run_id=RUN_2))

    message = str(refused.value)
    assert "\n" not in message
    assert _run_dir(sb) in message
    assert f"{GKE_DAG_ID}/{RUN_1}" in message
    assert "learning_rate" in message
    assert len(_submits(sb)) == submits


def test_another_runs_export_is_adopted_only_as_a_resume(sb: SandboxRun) -> None:
    conf = sb.gke_conf(run_name=RUN_NAME)
    _trained(sb, conf)
    exported = run_job_operator(sb, _export(sb), conf, run_id=RUN_1)
    assert exported["skipped"] is False
    assert exported["resumed_from"] is None

    later = run_job_operator(sb, _export(sb, conf=conf, run_id=RUN_2), conf, run_id=RUN_2)

    assert later["skipped"] is True
    assert later["resumed_from"] == f"{GKE_DAG_ID}/{RUN_1}"


# -- never two jobs on one directory -----------------------------------------------------------------
def test_a_recreated_run_refuses_while_the_first_runs_job_is_live(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = sb.gke_conf(run_name=RUN_NAME)
    prepare_cluster(sb, conf, run_id=RUN_1)
    convert_checkpoint(sb, conf, run_id=RUN_1)
    hold = sb.hold_file()  # the first job stays live: its final checkpoint waits before the commit
    monkeypatch.setenv("TPU_RL_SANDBOX_HOLD_FILE", str(hold))
    first_op = _train(sb)
    first_context = sb.context(first_op, conf, run_id=RUN_1)
    first = defer(first_op, first_context)
    first_job = _train_job(conf, RUN_1)
    assert len(sb.job_calls("submit", first_job)) == 1

    recreated = _train(sb, conf=conf, run_id=RUN_2)
    with pytest.raises(AirflowFailException) as refused:
        recreated.execute(sb.context(recreated, conf, run_id=RUN_2))

    message = str(refused.value)
    assert "\n" not in message
    assert f"job {first_job} ({sb.project}/{REGION}/{sb.cluster}) of run {GKE_DAG_ID}/{RUN_1}" in message
    assert _run_dir(sb) in message
    assert sb.job_calls("submit", _train_job(conf, RUN_2)) == []
    assert len(_submits(sb)) == 2  # the conversion and the first run's training, nothing more

    hold.unlink()
    done = first_op.execute_complete(first_context, run_trigger(first.trigger))
    assert done["skipped"] is False
    assert done["job_name"] == first_job


def test_a_job_submitted_without_a_claim_is_found_by_its_arguments_and_the_newcomer_deleted(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = sb.gke_conf(run_name=RUN_NAME)
    prepare_cluster(sb, conf, run_id=RUN_1)
    convert_checkpoint(sb, conf, run_id=RUN_1)
    hold = sb.hold_file()
    monkeypatch.setenv("TPU_RL_SANDBOX_HOLD_FILE", str(hold))
    first_op = _train(sb)
    first = defer(first_op, sb.context(first_op, conf, run_id=RUN_1))
    first_job = _train_job(conf, RUN_1)
    # As a JobSet submitted by hand: no claim in the run directory's record, no annotations.
    RunDirRecords().release(sb.bucket, _run_dir(sb), run=f"{GKE_DAG_ID}/{RUN_1}")
    assert first.trigger.serialize()[1]["run_dir"] == _run_dir(sb)
    removed = kube_access.request(
        sb.kube(),
        "PATCH",
        f"{JOBSETS}/{first_job}",
        {"metadata": {"annotations": {RUN_DIR_ANNOTATION: None, RUN_ID_ANNOTATION: None}}},
        content_type="application/merge-patch+json",
    )
    assert removed.status == 200, removed.text
    assert RUN_DIR_ANNOTATION not in (removed.json()["metadata"].get("annotations") or {})

    recreated = _train(sb, conf=conf, run_id=RUN_2)
    context = sb.context(recreated, conf, run_id=RUN_2)
    second = defer(recreated, context)  # the claim is free: it submits
    second_job = _train_job(conf, RUN_2)
    assert len(sb.job_calls("submit", second_job)) == 1
    event = run_trigger(second.trigger)  # its wait finds the first job writing the same directory

    assert event["status"] == "conflict"
    with pytest.raises(AirflowFailException) as refused:
        recreated.execute_complete(context, event)
    message = str(refused.value)
    assert "\n" not in message
    assert f"default/{first_job} of a run not recorded on the JobSet" in message
    assert f"job {second_job} was deleted" in message
    assert kube_access.request(sb.kube(), "GET", f"{JOBSETS}/{second_job}").status == 404
    assert _jobset(sb, first_job)["metadata"]["name"] == first_job  # the first job runs on
    hold.unlink()


def test_the_same_run_re_attaches_to_its_live_job_under_another_name(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = sb.gke_conf(run_name=RUN_NAME)
    prepare_cluster(sb, conf, run_id=RUN_1)
    convert_checkpoint(sb, conf, run_id=RUN_1)
    hold = sb.hold_file()
    monkeypatch.setenv("TPU_RL_SANDBOX_HOLD_FILE", str(hold))
    first_op = _train(sb)
    defer(first_op, sb.context(first_op, conf, run_id=RUN_1))
    first_job = _train_job(conf, RUN_1)

    renamed = _train(sb, job_name="train-renamed")  # same DAG run, another job name
    ti = RecordingTI(2)
    context = sb.context(renamed, conf, run_id=RUN_1, ti=ti)
    second = defer(renamed, context)

    _, kwargs = second.trigger.serialize()
    assert kwargs["job_name"] == first_job
    assert ti.pulled("job_name") == first_job
    assert sb.job_calls("submit", "train-renamed") == []
    hold.unlink()
    result = renamed.execute_complete(context, run_trigger(second.trigger))
    assert result["job_name"] == first_job
    assert result["skipped"] is False


def test_the_jobset_carries_its_run_directory_and_run(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = sb.gke_conf(run_name=RUN_NAME)
    prepare_cluster(sb, conf, run_id=RUN_1)
    convert_checkpoint(sb, conf, run_id=RUN_1)
    hold = sb.hold_file()
    monkeypatch.setenv("TPU_RL_SANDBOX_HOLD_FILE", str(hold))
    op = _train(sb)
    context = sb.context(op, conf, run_id=RUN_1)
    deferred = defer(op, context)
    job = _train_job(conf, RUN_1)
    assert RUN_DIR_ANNOTATION not in (_jobset(sb, job)["metadata"].get("annotations") or {})

    async def release_once_annotated() -> None:
        while RUN_DIR_ANNOTATION not in (_jobset(sb, job)["metadata"].get("annotations") or {}):
            await asyncio.sleep(0.05)
        hold.unlink()

    event = run_trigger(deferred.trigger, alongside=release_once_annotated)  # the wait annotates it
    annotations = _jobset(sb, job)["metadata"]["annotations"]
    assert annotations[RUN_DIR_ANNOTATION] == _run_dir(sb)
    assert annotations[RUN_ID_ANNOTATION] == f"{GKE_DAG_ID}/{RUN_1}"
    op.execute_complete(context, event)


def test_the_job_operators_have_a_default_job_timeout() -> None:
    from airflow_provider_tpu_rl.timeouts import job_timeout

    common = {
        "project_id": "p",
        "location": "us-east5",
        "cluster_name": "c",
        "bucket": "b",
        "model": "gemma4-26b",
    }
    train = PathwaysRLTrainOperator(task_id="train", run_name="rl-1", **common)
    export = MaxTextExportOperator(task_id="export", run_name="rl-1", **common)
    assert train.job_timeout == job_timeout("train")
    assert export.job_timeout == job_timeout("export")
    assert train.job_timeout > export.job_timeout


def test_a_conversion_waits_on_another_runs_live_conversion_of_the_same_model(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = sb.gke_conf()
    prepare_cluster(sb, conf, run_id=RUN_1)
    hold = sb.hold_file()  # the first conversion stays live until its checkpoint may commit
    monkeypatch.setenv("TPU_RL_SANDBOX_HOLD_FILE", str(hold))
    first_op = sb.operator(MaxTextConvertOperator, task_id="convert_to_maxtext")
    defer(first_op, sb.context(first_op, conf, run_id=RUN_1))
    first_job = gke_pipeline_from_conf(conf, run_id=RUN_1).convert_job

    other = sb.operator(MaxTextConvertOperator, task_id="convert_to_maxtext", run_id=RUN_2)
    context = sb.context(other, conf, run_id=RUN_2)
    waiting = defer(other, context)

    _, kwargs = waiting.trigger.serialize()
    assert kwargs["job_name"] == first_job
    assert kwargs["cancel_on_kill"] is False  # another run's job: never cancelled by this task
    assert sb.job_calls("submit", gke_pipeline_from_conf(conf, run_id=RUN_2).convert_job) == []
    hold.unlink()
    result = other.execute_complete(context, run_trigger(waiting.trigger))
    assert result["job_name"] == first_job
    assert result["checkpoint_uri"] == f"gs://{sb.bucket}/gemma4-26b/max-text-format/0/items/"


class RunStatesTI(RecordingTI):
    """A task instance that reads other DAG runs' states through the Task SDK (Airflow 3.1+)."""

    def __init__(self, states: dict[str, str], try_number: int = 1) -> None:
        super().__init__(try_number)
        self.states = states

    def get_dagrun_state(self, dag_id: str, run_id: str) -> str:
        return self.states.get(run_id, "running")

    def get_task_states(self, dag_id: str, run_ids: list[str]) -> dict[str, dict[str, str]]:
        return {}


def test_a_run_on_another_cluster_is_refused_while_the_first_lives_and_resumes_after_it_ended(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The claim is in the bucket, so it holds across clusters: a re-created run on another
    cluster (same bucket, same run_name) never writes the directory while the first run lives."""
    conf = sb.gke_conf(run_name=RUN_NAME)
    elsewhere = {**conf, "cluster_name": f"{sb.cluster}b"}
    prepare_cluster(sb, conf, run_id=RUN_1)
    convert_checkpoint(sb, conf, run_id=RUN_1)
    hold = sb.hold_file()
    monkeypatch.setenv("TPU_RL_SANDBOX_HOLD_FILE", str(hold))
    first_op = _train(sb)
    defer(first_op, sb.context(first_op, conf, run_id=RUN_1))
    first_job = _train_job(conf, RUN_1)
    prepare_cluster(sb, elsewhere, run_id=RUN_2)

    later = _train(sb, conf=elsewhere, run_id=RUN_2)
    with pytest.raises(AirflowFailException) as refused:
        later.execute(sb.context(later, elsewhere, run_id=RUN_2, ti=RunStatesTI({RUN_1: "running"})))
    message = str(refused.value)
    assert "\n" not in message
    assert f"job {first_job} ({sb.project}/{REGION}/{sb.cluster}) of run {GKE_DAG_ID}/{RUN_1}" in message
    assert sb.job_calls("submit", _train_job(elsewhere, RUN_2)) == []

    # The first run ends (failed: its teardown destroyed its cluster, the job with it); its pods
    # are gone before anything is released (a deleted pod's grace period could still commit).
    worker = int((sb.job_record(first_job) or {})["pid"])
    assert kube_access.request(sb.kube(), "DELETE", f"{JOBSETS}/{first_job}").status == 200
    with contextlib.suppress(ProcessLookupError):  # past the pods' grace period: gone for good
        os.killpg(worker, signal.SIGKILL)
    wait_for(lambda: not _alive(worker), "the first job's pods to stop")
    hold.unlink()
    capfd.readouterr()
    context = sb.context(later, elsewhere, run_id=RUN_2, ti=RunStatesTI({RUN_1: "failed"}))
    resumed = defer(later, context)
    assert len(sb.job_calls("submit", _train_job(elsewhere, RUN_2))) == 1
    printed = capfd.readouterr()
    assert f"Resuming {_run_dir(sb)}, started by run {GKE_DAG_ID}/{RUN_1}" in printed.out + printed.err
    writer = RunDirRecords().read(sb.bucket, _run_dir(sb)).writer
    assert writer is not None
    assert (writer.run, writer.where) == (f"{GKE_DAG_ID}/{RUN_2}", f"{sb.project}/{REGION}/{sb.cluster}b")
    result = later.execute_complete(context, run_trigger(resumed.trigger))
    assert result["skipped"] is False
    assert result["resumed_from"] == f"{GKE_DAG_ID}/{RUN_1}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"  # a zombie has stopped
    return True
