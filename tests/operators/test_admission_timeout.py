"""A job that never starts stops billing: past its admission bound, a JobSet Kueue still holds
suspended (or whose pods no node takes) is deleted and the task fails with one line on what it
waited for; a job that started is never cancelled by the bound."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.hooks.kubernetes import waiting_for
from airflow_provider_tpu_rl.operators.gke_jobs import PathwaysRLTrainOperator
from airflow_provider_tpu_rl.spec import gke_pipeline_from_conf
from airflow_provider_tpu_rl.toolchain.job_output import JobState
from airflow_provider_tpu_rl.triggers.jobset import JobSetTrigger
from tests.support.sandbox_run import SandboxRun, convert_checkpoint, defer, prepare_cluster, run_trigger
from tpu_rl_sandbox.apis import kube_access
from tpu_rl_sandbox.world.settings import update_settings

RUN_ID = "manual__2026-03-02T00:00:00+00:00"


@contextlib.contextmanager
def kueue_closed(sb: SandboxRun) -> Iterator[None]:
    """Kueue admits nothing inside (the sandbox's ``kueue_admits`` knob)."""
    update_settings(sb.layout, kueue_admits=False)
    try:
        yield
    finally:
        update_settings(sb.layout, kueue_admits=True)


def _jobset_status(sb: SandboxRun, job_name: str) -> int:
    path = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/{job_name}"
    return kube_access.request(sb.kube(), "GET", path).status


def test_a_job_kueue_never_admits_is_cancelled_at_the_bound_with_one_line(sb: SandboxRun) -> None:
    conf = sb.gke_conf(train_overrides={"num_test_batches": 2})
    prepare_cluster(sb, conf, run_id=RUN_ID)
    convert_checkpoint(sb, conf, run_id=RUN_ID)
    job_name = gke_pipeline_from_conf(conf, run_id=RUN_ID).train_job
    train = sb.operator(PathwaysRLTrainOperator, task_id="train", admission_timeout=timedelta(seconds=3))
    context = sb.context(train, conf, run_id=RUN_ID)
    with kueue_closed(sb):
        trigger = defer(train, context).trigger
        assert isinstance(trigger, JobSetTrigger)
        assert trigger.serialize()[1]["admission_timeout"] == 3.0
        assert _jobset_status(sb, job_name) == 200
        event = run_trigger(trigger)
    assert (event["status"], event["state"], event["fatal"]) == ("unadmitted", "Suspended", True)
    assert event["message"].startswith(f"job {job_name} did not start within 0 min of its creation: ")
    assert "Kueue kept it suspended" in event["message"]
    assert event["message"].endswith("; it was cancelled")
    assert _jobset_status(sb, job_name) == 404  # it no longer holds a place in the queue
    with pytest.raises(AirflowFailException) as failed:  # not retried: the capacity is not coming
        train.execute_complete(context, event)
    assert str(failed.value) == event["message"]


def test_a_job_that_started_outlives_its_admission_bound(sb: SandboxRun) -> None:
    conf = sb.gke_conf(train_overrides={"num_test_batches": 2})
    prepare_cluster(sb, conf, run_id=RUN_ID)
    convert_checkpoint(sb, conf, run_id=RUN_ID)
    train = sb.operator(PathwaysRLTrainOperator, task_id="train", admission_timeout=timedelta(seconds=0.5))
    context = sb.context(train, conf, run_id=RUN_ID)
    trigger = defer(train, context).trigger
    # started first (a pod start time), then watched past the bound: however long Kueue took here
    deadline = time.monotonic() + 120
    while not any(pod["status"].get("startTime") for pod in sb.pods(trigger.job_name)):
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.2)
    time.sleep(0.6)  # past the 0.5 s bound
    event = run_trigger(trigger)
    assert event["status"] == "success", event["message"]
    assert train.execute_complete(context, event)["job_name"] == trigger.job_name


def test_what_a_job_that_did_not_start_waited_for() -> None:
    assert "Kueue kept it suspended" in waiting_for(JobState.SUSPENDED, [])
    unschedulable = {
        "metadata": {"name": "job-worker-0"},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient google.com/tpu.",
                }
            ],
        },
    }
    assert waiting_for(JobState.RUNNING, [unschedulable]) == (
        "no node took its pods (pod job-worker-0: 0/3 nodes are available: 3 Insufficient google.com/tpu.): "
        "the capacity it asks for is not there"
    )
    assert waiting_for(JobState.RUNNING, [{"status": {"phase": "Pending"}}]) == (
        "its pods were created but none was placed on a node"
    )
    assert waiting_for(JobState.RUNNING, []) == "Kueue admitted it but none of its pods was created"
