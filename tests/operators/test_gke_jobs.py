"""MaxText job operators against the sandbox: skip, submit-or-attach on retry, every way a job ends."""

from __future__ import annotations

import asyncio
import base64
import math
import time
from datetime import datetime, timedelta
from typing import Any

import pytest

from airflow_provider_tpu_rl.compat import AirflowException, AirflowFailException
from airflow_provider_tpu_rl.hooks.gcluster import GclusterHook
from airflow_provider_tpu_rl.lineage import gcs_dataset, hf_model_dataset
from airflow_provider_tpu_rl.operators.gke import EnsureBucketOperator, GclusterDeployOperator
from airflow_provider_tpu_rl.operators.gke_jobs import (
    MaxTextConvertOperator,
    MaxTextExportOperator,
    PathwaysRLTrainOperator,
)
from airflow_provider_tpu_rl.render.command import Command
from airflow_provider_tpu_rl.spec import SpecError, gke_pipeline_from_conf
from airflow_provider_tpu_rl.timeouts import job_timeout
from airflow_provider_tpu_rl.triggers.jobset import JobSetTrigger
from tests.support.compat import capture_task_logs
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
from tpu_rl_sandbox.world.calls import read_calls
from tpu_rl_sandbox.world.settings import reset_settings, update_settings

RUN_1 = "manual__2026-03-01T00:00:00+00:00"
RUN_2 = "manual__2026-03-02T00:00:00+00:00"
CONVERTED = "gemma4-26b/max-text-format/"


def _convert_op(sb: SandboxRun, **kwargs: Any) -> MaxTextConvertOperator:
    return sb.operator(MaxTextConvertOperator, task_id="convert_to_maxtext", **kwargs)


def _train_op(sb: SandboxRun, **kwargs: Any) -> PathwaysRLTrainOperator:
    return sb.operator(PathwaysRLTrainOperator, task_id="train", **kwargs)


def _job_names(conf: dict[str, Any], run_id: str = RUN_1) -> tuple[str, str, str]:
    p = gke_pipeline_from_conf(conf, run_id=run_id)
    return p.convert_job, p.train_job, p.export_job


# -- skipping a conversion that is already there -----------------------------------------------------
def test_conversion_runs_over_an_incomplete_checkpoint_and_is_skipped_once_complete(sb: SandboxRun) -> None:
    conf = sb.gke_conf()
    prepare_cluster(sb, conf, run_id=RUN_1)
    # A conversion that died while writing: data and metadata, but no Orbax commit marker.
    for name in ("0/_CHECKPOINT_METADATA", "0/items/_METADATA", "0/items/params.decoder/0.0"):
        sb.api.upload(sb.bucket, CONVERTED + name, b"partial")
    convert_job, _, _ = _job_names(conf, RUN_1)

    op = _convert_op(sb)
    first = run_job_operator(sb, op, conf, run_id=RUN_1)
    # what OpenLineage reads from the finished task: the Hub checkpoint in, the converted one out
    assert op._lineage is not None
    assert op._lineage.inputs == (hf_model_dataset("google/gemma-4-26b-a4b-it"),)
    assert op._lineage.outputs == (gcs_dataset(f"gs://{sb.bucket}/{CONVERTED}"),)

    assert first["skipped"] is False
    assert first["job_name"] == convert_job
    assert first["checkpoint_uri"] == f"gs://{sb.bucket}/{CONVERTED}0/items/"
    assert len(sb.job_calls("submit", convert_job)) == 1
    assert f"{CONVERTED}0/commit_success.txt" in sb.objects()

    # Another run finds the complete checkpoint: no job at all, no TPU time.
    later_job, _, _ = _job_names(conf, RUN_2)
    again = _convert_op(sb)
    ti = RecordingTI()
    with capture_task_logs() as logs:
        result = again.execute(sb.context(again, conf, run_id=RUN_2, ti=ti))
    # the task's first line comes before any slow client import or connection lookup (Airflow
    # warns first that a test calls execute outside of the Task Runner / TaskInstance)
    said = [str(entry["event"]) for entry in logs if "cannot be called outside" not in str(entry["event"])]
    assert said[0].startswith(f"Job {later_job} on cluster {sb.cluster}: looking for its output")

    assert result["skipped"] is True
    assert result["job_name"] is None
    assert again._lineage == op._lineage  # a reused checkpoint: the same lineage, no job ran
    assert result["checkpoint_uri"] == first["checkpoint_uri"]
    assert sb.job_calls("submit", later_job) == []
    all_submits = [c for c in sb.calls() if c["argv"][:2] == ["job", "submit"]]
    assert all_submits == sb.job_calls("submit", convert_job)
    assert ti.pulled("job_name") == later_job


def _run_name(conf: dict[str, Any], run_id: str = RUN_1) -> str:
    """The run's MaxText run_name (the default is unique to the DAG run)."""
    return gke_pipeline_from_conf(conf, run_id=run_id).training.run_name


def test_convert_defers_to_the_job_trigger(sb: SandboxRun) -> None:
    conf = sb.gke_conf()
    prepare_cluster(sb, conf, run_id=RUN_1)
    convert_job, _, _ = _job_names(conf)
    op = _convert_op(sb)

    deferred = defer(op, sb.context(op, conf, run_id=RUN_1))

    assert deferred.method_name == "execute_complete"
    trigger = deferred.trigger
    assert isinstance(trigger, JobSetTrigger)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_provider_tpu_rl.triggers.jobset.JobSetTrigger"
    assert kwargs["job_name"] == convert_job
    # the worker only submitted: the trigger names the cluster and asks the GKE API for its
    # Kubernetes API (no gcluster, no kubeconfig), and finds the JobSet's namespace itself
    assert (kwargs["project_id"], kwargs["location"], kwargs["cluster_name"]) == (
        sb.project,
        REGION,
        sb.cluster,
    )
    assert kwargs["cluster_url"] is None
    assert kwargs["namespace"] is None
    assert kwargs["pathways"] is False
    assert kwargs["total_steps"] is None
    assert kwargs["poll_interval"] == pytest.approx(0.2)
    assert kwargs["deadline"] is None
    assert kwargs["job_timeout"] == job_timeout("convert").total_seconds()
    event = run_trigger(trigger)
    assert event["status"] == "success"
    assert trigger.cluster_url == sb.kube().url
    assert trigger.namespace == "default"
    # the default job_timeout counts from the JobSet's creation, so a re-attaching retry keeps it
    answer = kube_access.request(
        sb.kube(), "GET", f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/{convert_job}"
    )
    created = datetime.fromisoformat(answer.json()["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    assert trigger.deadline == pytest.approx(created.timestamp() + job_timeout("convert").total_seconds())
    # a CPU program on the CPU node pool: no TPU asked for, the workload's Kubernetes account
    (replicated,) = answer.json()["spec"]["replicatedJobs"]
    pod = replicated["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-nodepool": "cpu-np"}
    assert pod["serviceAccountName"] == "workload-identity-k8s-sa"
    assert [c["resources"] for c in pod["containers"]] == [{"limits": {"cpu": "60"}}]


# -- a retry re-attaches to the job of its first try ---------------------------------------------------
def test_a_retry_attaches_to_the_running_training_job_instead_of_submitting_again(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = sb.gke_conf()
    prepare_cluster(sb, conf, run_id=RUN_1)
    convert_checkpoint(sb, conf, run_id=RUN_1)
    _, train_job, _ = _job_names(conf)
    hold = sb.hold_file()  # the job stays running: its final checkpoint waits before the commit
    monkeypatch.setenv("TPU_RL_SANDBOX_HOLD_FILE", str(hold))

    first_try = _train_op(sb)
    first = defer(first_try, sb.context(first_try, conf, run_id=RUN_1, ti=RecordingTI(1)))
    del first_try  # the worker died while the trigger was waiting
    assert len(sb.job_calls("submit", train_job)) == 1

    second_try = _train_op(sb)
    context = sb.context(second_try, conf, run_id=RUN_1, ti=RecordingTI(2))
    second = defer(second_try, context)

    _, first_kwargs = first.trigger.serialize()
    _, kwargs = second.trigger.serialize()
    assert {**kwargs, "not_before": None} == {**first_kwargs, "not_before": None}
    assert (kwargs["job_name"], kwargs["cluster_name"], kwargs["total_steps"]) == (train_job, sb.cluster, 3)
    assert len(sb.job_calls("submit", train_job)) == 1
    assert sb.job_calls("cancel", train_job) == []
    job = sb.job_record(train_job)
    assert job is not None
    assert job["status"] in ("Suspended", "Running")

    hold.unlink()
    result = second_try.execute_complete(context, run_trigger(second.trigger))

    assert result["job_name"] == train_job
    assert (
        result["checkpoint_uri"]
        == f"gs://{sb.bucket}/gemma4-26b/trained/{_run_name(conf)}/checkpoints/actor/3/model_params/"
    )
    assert len(sb.job_calls("submit", train_job)) == 1


@pytest.mark.usefixtures("clean_faults")
def test_a_training_job_that_failed_is_cancelled_and_submitted_again_on_retry(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    # checkpoint_period=1: step 1 is committed before the slice fails, the final step 3 is not.
    conf = sb.gke_conf(train_overrides={"checkpoint_period": 1})
    prepare_cluster(sb, conf, run_id=RUN_1)
    convert_checkpoint(sb, conf, run_id=RUN_1)
    _, train_job, _ = _job_names(conf)
    monkeypatch.setenv("TPU_RL_SANDBOX_FAIL", "train:transient")

    first_try = _train_op(sb)
    context = sb.context(first_try, conf, run_id=RUN_1, ti=RecordingTI(1))
    event = run_trigger(defer(first_try, context).trigger)
    assert event["status"] == "failed"
    assert event["state"] == "Failed"
    assert event["failure"]["kind"] == "transient"  # the slice was lost: a retry may pass
    with pytest.raises(AirflowException, match=train_job) as failed:
        first_try.execute_complete(context, event)
    assert not isinstance(failed.value, AirflowFailException)  # Airflow may retry it
    assert "JaxRuntimeError: UNAVAILABLE: The TPU slice became unhealthy" in str(failed.value)

    second_try = _train_op(sb)
    result = run_job_operator(sb, second_try, conf, run_id=RUN_1, ti=RecordingTI(2))

    assert len(sb.job_calls("submit", train_job)) == 2
    assert len(sb.job_calls("cancel", train_job)) == 1
    # gcluster's prerequisite check (its `gcloud auth list`) ran at most once for the
    # conversion's and both trainings' submits: the hook carried its state between sessions.
    submits = [c for c in sb.calls() if c["tool"] == "gcluster" and c["argv"][:2] == ["job", "submit"]]
    every_call = read_calls(sb.layout)
    checks = [c for c in every_call if c["tool"] == "gcloud" and c["argv"][:2] == ["auth", "list"]]
    assert len(submits) >= 3
    assert len([c for c in checks if any(s["start"] <= c["start"] <= s["end"] for s in submits)]) <= 1
    submits = sb.job_calls("submit", train_job)
    (cancel,) = sb.job_calls("cancel", train_job)
    assert submits[0]["end"] <= cancel["start"]
    assert cancel["end"] <= submits[1]["start"]
    assert result["step"] == 3
    # The new job resumed from the step-1 checkpoint the failed one had committed.
    log = sb.job_log_of(train_job)
    assert "Restored params from step: 1 in" in log
    assert "Train step 1 " not in log


# -- how a job ends ---------------------------------------------------------------------------------
def test_a_failed_job_fails_the_task(sb: SandboxRun, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = sb.gke_conf()
    prepare_cluster(sb, conf, run_id=RUN_1)
    monkeypatch.setenv("TPU_RL_SANDBOX_FAIL", "convert")
    convert_job, _, _ = _job_names(conf)
    op = _convert_op(sb)
    context = sb.context(op, conf, run_id=RUN_1)

    event = run_trigger(defer(op, context).trigger)

    assert (event["status"], event["state"]) == ("failed", "Failed")
    # The workload's own error (a traceback, no lost node, no 5xx): not retried, its line quoted.
    assert event["failure"]["kind"] == "config"
    with pytest.raises(AirflowFailException) as failed:
        op.execute_complete(context, event)
    message = str(failed.value)
    assert message.startswith(f"job {convert_job} failed: RuntimeError: Checkpoint conversion failed during ")
    assert "tensor shape mismatch" in message
    assert "not retried" in message
    assert len(sb.job_calls("submit", convert_job)) == 1
    assert f"{CONVERTED}0/commit_success.txt" not in sb.objects()


def test_a_job_past_its_timeout_is_cancelled(sb: SandboxRun, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = sb.gke_conf()
    prepare_cluster(sb, conf, run_id=RUN_1)
    hold = sb.hold_file()  # the conversion never commits while the file exists
    monkeypatch.setenv("TPU_RL_SANDBOX_HOLD_FILE", str(hold))
    convert_job, _, _ = _job_names(conf)
    op = _convert_op(sb, job_timeout=timedelta(seconds=1))
    context = sb.context(op, conf, run_id=RUN_1)

    before = time.time()
    deferred = defer(op, context)

    event = run_trigger(deferred.trigger)
    # counted from the JobSet's creationTimestamp, which has whole seconds
    assert deferred.trigger.deadline is not None
    assert deferred.trigger.deadline >= math.floor(before) + 1

    assert event["status"] == "timeout"
    assert sb.job_calls("cancel", convert_job) == []
    with pytest.raises(AirflowFailException, match="cancelled"):
        op.execute_complete(context, event)
    (cancel,) = sb.job_calls("cancel", convert_job)
    assert cancel["exit_code"] == 0
    assert sb.job_record(convert_job) is None
    hold.unlink()


def test_a_garbage_collected_job_with_complete_output_is_a_success(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = sb.gke_conf()
    prepare_cluster(sb, conf, run_id=RUN_1)
    monkeypatch.setenv("TPU_RL_SANDBOX_TTL_SCALE", "0.0001")  # the JobSet's 1h TTL becomes 0.36 s
    convert_job, _, _ = _job_names(conf)
    op = _convert_op(sb)
    context = sb.context(op, conf, run_id=RUN_1)
    deferred = defer(op, context)

    def finished_past_ttl() -> bool:
        job = sb.job_record(convert_job)
        return bool(job and job["completed_ts"] and time.time() > job["completed_ts"] + job["ttl_effective"])

    wait_for(finished_past_ttl, "the conversion job to finish and outlive its TTL")
    event = run_trigger(deferred.trigger)

    assert event["status"] == "missing"
    assert sb.job_record(convert_job) is None  # `job list` garbage-collected it
    result = op.execute_complete(context, event)
    assert result["job_name"] == convert_job
    assert result["checkpoint_uri"] == f"gs://{sb.bucket}/{CONVERTED}0/items/"


def test_a_vanished_job_without_its_output_fails_the_task(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = sb.gke_conf()
    prepare_cluster(sb, conf, run_id=RUN_1)
    hold = sb.hold_file()
    monkeypatch.setenv("TPU_RL_SANDBOX_HOLD_FILE", str(hold))
    convert_job, _, _ = _job_names(conf)
    op = _convert_op(sb)
    context = sb.context(op, conf, run_id=RUN_1)
    deferred = defer(op, context)
    wait_for(
        lambda: "Saving MaxText checkpoint" in sb.job_log_of(convert_job),
        "the conversion to start writing",
    )
    # Someone deletes the JobSet half-way (kubectl delete, a node-pool recreate, ...).
    assert GclusterHook().cancel_job(convert_job, sb.project, sb.cluster, "us-east5") is True

    event = run_trigger(deferred.trigger)

    assert event["status"] == "missing"
    with pytest.raises(AirflowException, match="is not complete"):
        op.execute_complete(context, event)
    assert f"{CONVERTED}0/commit_success.txt" not in sb.objects()
    hold.unlink()


def test_the_trigger_reports_missing_only_after_two_polls(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job that never existed: two absent polls (not one) before ``missing``."""
    conf = sb.gke_conf()
    prepare_cluster(sb, conf, run_id=RUN_1)
    access = sb.kube()
    trigger = JobSetTrigger(
        "never-submitted-job",
        access.url,
        base64.b64encode(access.ca_pem.encode()).decode(),
        poll_interval=0.05,
    )
    polls: list[object] = []
    real = JobSetTrigger.job_state

    async def counted(self: JobSetTrigger) -> object:
        state = await real(self)
        polls.append(state)
        return state

    monkeypatch.setattr(JobSetTrigger, "job_state", counted)
    event = run_trigger(trigger)

    assert event["status"] == "missing"
    assert polls == [None, None]


@pytest.mark.parametrize(
    ("operator", "arguments", "shape"),
    [
        (MaxTextConvertOperator, {}, ("n4-standard-64", "", "cpu-np")),
        (MaxTextExportOperator, {"run_name": "rl-1"}, ("n4-standard-64", "", "cpu-np")),
        (PathwaysRLTrainOperator, {"run_name": "rl-1"}, ("ct6e-standard-4t", "4x8", "")),
        # a ct6e type keeps a conversion on the slice, as the tutorials run it
        (MaxTextConvertOperator, {"compute_type": "ct6e-standard-4t"}, ("ct6e-standard-4t", "4x8", "")),
        (MaxTextConvertOperator, {"compute_type": "n4-highmem-32"}, ("n4-highmem-32", "", "cpu-np")),
    ],
)
def test_the_conversions_run_on_the_cpu_pool_and_training_on_the_slice(
    operator: type[Any], arguments: dict[str, Any], shape: tuple[str, str, str]
) -> None:
    op = operator(
        task_id="t", project_id="p-123456", location="us-east5", cluster_name="c1", bucket="b-1",
        model="qwen3-30b-a3b", **arguments,
    )  # fmt: skip
    target = op.target(op.preset())
    assert (target.compute_type, target.topology, target.node_pool) == shape


def test_a_topology_for_a_conversion_on_cpu_is_one_clear_error() -> None:
    op = MaxTextConvertOperator(
        task_id="t", project_id="p-123456", location="us-east5", cluster_name="c1", bucket="b-1",
        model="qwen3-30b-a3b", topology="4x8",
    )  # fmt: skip
    with pytest.raises(SpecError, match="runs on CPU"):
        op.target(op.preset())


# -- a job operator used alone -------------------------------------------------------------------------
@pytest.mark.parametrize("secret", ["missing", "no enabled version"])
def test_a_job_without_its_token_secret_fails_in_one_line_before_submitting(
    sb: SandboxRun, secret: str
) -> None:
    """A DAG of the user's own with no HfTokenSecretOperator: the conversion's pod could not read
    its token; the operator says so before anything is submitted, and does not retry."""
    conf = sb.gke_conf(hf_token_secret="my-hf-token")
    bucket = sb.operator(EnsureBucketOperator, task_id="ensure_bucket")
    bucket.execute(sb.context(bucket, conf, run_id=RUN_1))
    deploy = sb.operator(GclusterDeployOperator, task_id="deploy_cluster")
    deploy.execute(sb.context(deploy, conf, run_id=RUN_1))
    if secret == "no enabled version":
        gcloud = GclusterHook()
        created = gcloud.run(
            Command(("gcloud", "secrets", "create", "my-hf-token", f"--project={sb.project}"))
        )
        assert created.ok, created.output

    convert = _convert_op(sb)
    with pytest.raises(AirflowFailException) as failed:
        convert.execute(sb.context(convert, conf, run_id=RUN_1))

    message = str(failed.value)
    assert "\n" not in message
    detail = "does not exist in project" if secret == "missing" else "has no enabled version"
    assert message.startswith(f"HF token secret my-hf-token {'' if secret == 'missing' else 'in project '}")
    assert detail in message
    assert "HfTokenSecretOperator" in message
    assert sb.job_calls("submit", _job_names(conf)[0]) == []


def _conversion_through_a_wait(
    sb: SandboxRun, waiting: dict[str, Any], effective: dict[str, Any], wait_text: str
) -> tuple[str, str]:
    """The conversion run with the sandbox's ``waiting`` settings until its pod logs ``wait_text``,
    then ``effective``: it must succeed on its first attempt, one submit. ``(its log, the token
    secret's resource)``."""
    conf = sb.gke_conf()
    convert_job, _, _ = _job_names(conf)
    update_settings(sb.layout, **waiting)
    try:
        prepare_cluster(sb, conf, run_id=RUN_1)
        op = _convert_op(sb)
        context = sb.context(op, conf, run_id=RUN_1)
        deferred = defer(op, context)

        async def takes_effect() -> None:
            while wait_text not in sb.job_log_of(convert_job):
                await asyncio.sleep(0.1)
            update_settings(sb.layout, **effective)

        event = run_trigger(deferred.trigger, alongside=takes_effect)
    finally:
        reset_settings(sb.layout)

    assert event["status"] == "success", event
    assert op.execute_complete(context, event)["skipped"] is False
    job = sb.job_record(convert_job)
    assert job is not None
    assert (job["status"], job["attempt"]) == ("Succeeded", 1)  # no failed attempt, no restart
    assert len(sb.job_calls("submit", convert_job)) == 1
    assert f"{CONVERTED}0/commit_success.txt" in sb.objects()
    return sb.job_log(job), gke_pipeline_from_conf(conf, run_id=RUN_1).token_resource


def test_the_conversion_waits_for_its_workload_identity_binding_to_take_effect(sb: SandboxRun) -> None:
    """The CPU pods authenticate through Workload Identity, bound by the deploy minutes earlier.
    Until the binding is in effect the GKE metadata server refuses the pod a token, which
    google-auth raises as RefreshError (not an HTTP 403 of the read): the pod waits on it, one line
    per wait, instead of failing its JobSet."""
    log, secret = _conversion_through_a_wait(
        sb,
        {"workload_identity_effective": False},
        {"workload_identity_effective": True},
        "not readable yet (RefreshError: the pod has no token yet",
    )
    waits = [line for line in log.splitlines() if "not readable yet" in line]
    assert waits
    for line in waits:
        assert line.startswith(f"HF token secret {secret} not readable yet (RefreshError: ")
        assert line.endswith(" s, retrying")
    assert "sandbox-token" not in log


# -- the HF token secret's new grant -------------------------------------------------------------------
def test_the_conversion_waits_for_its_new_token_grant_to_take_effect(sb: SandboxRun) -> None:
    """The token task grants the cluster's accounts secretAccessor just before the conversion, and
    IAM takes minutes to make a grant effective: the conversion's pod waits on the 403 until it is,
    instead of failing its JobSet (a wasted attempt and a task retry)."""
    # far longer than the gap between the grant and the pod's read; ended by hand
    log, secret = _conversion_through_a_wait(
        sb,
        {"iam_propagation_seconds": 600.0},
        {"iam_propagation_seconds": 0.0},
        "not readable yet (403 PERMISSION_DENIED",
    )
    assert f"HF token secret {secret} not readable yet (403 PERMISSION_DENIED" in log
