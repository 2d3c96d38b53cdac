"""JobSetTrigger against the sandbox's Kubernetes API: every line once, restarts, kill, errors.

The training job runs in the sandbox (fake ``gcluster job submit`` creates the JobSet and its pods
in the fake cluster's Kubernetes API); the trigger reads them as it would a GKE cluster's. What a
test expects comes from the API itself (the workload container's whole log). What no Airflow line
changes (no process started, a retry after the job ended, ``not_before``, a SIGKILLed trigger) is in
test_jobset_recovery.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import logging
import re
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.providers.common.compat.sdk import Context

from airflow_provider_tpu_rl.hooks import kubernetes
from airflow_provider_tpu_rl.operators.gke_jobs import PathwaysRLTrainOperator
from airflow_provider_tpu_rl.records.lease import ClusterLeaseHook
from airflow_provider_tpu_rl.records.run_dirs import RunDirRecords
from airflow_provider_tpu_rl.spec import gke_pipeline_from_conf
from airflow_provider_tpu_rl.triggers import jobset as jobset_module
from airflow_provider_tpu_rl.triggers.jobset import JobSetTrigger
from tests.support.sandbox_run import (
    REGION,
    SandboxRun,
    convert_checkpoint,
    defer,
    prepare_cluster,
    printed_rewards,
    run_trigger,
    wait_for,
)
from tpu_rl_sandbox.apis import kube_access
from tpu_rl_sandbox.world.settings import reset_settings, update_settings

RUN_ID = "manual__2026-03-01T00:00:00+00:00"
_TRAIN_STEP = re.compile(r"\] Train step (\d+) ")  # MaxText's peft_trainer line of each step
HEAD, WORKLOAD = "pathways-head", "workload-container"


class LineRecorder(logging.Handler):
    """The workload lines a trigger relayed to its log (records of ``[job] line`` lines), the
    progress it reported (``[job] progress: step N/M``) and how many records held them."""

    def __init__(self, job_name: str) -> None:
        super().__init__(logging.INFO)
        self.prefix = f"[{job_name}] "
        self.lines: list[str] = []
        self.progress: list[str] = []
        self.records = 0
        self.last_at = 0.0  # time.monotonic() of the last record

    def emit(self, record: logging.LogRecord) -> None:
        relayed = [line for line in record.getMessage().split("\n") if line.startswith(self.prefix)]
        if not relayed:
            return
        self.records += 1
        self.last_at = time.monotonic()
        for line in relayed:
            text = line[len(self.prefix) :]
            if text.startswith("progress: "):
                self.progress.append(text.removeprefix("progress: "))
            else:
                self.lines.append(text)


@contextlib.contextmanager
def recording(trigger: JobSetTrigger) -> Iterator[LineRecorder]:
    recorder = LineRecorder(trigger.job_name)
    logger = logging.getLogger(f"tests.jobset_trigger.{id(trigger)}")
    logger.addHandler(recorder)
    logger.setLevel(logging.INFO)
    trigger._log = logger  # a stdlib logger in place of Airflow's structlog one
    try:
        yield recorder
    finally:
        logger.removeHandler(recorder)


@pytest.fixture(autouse=True)
def long_holds(sb: SandboxRun) -> Iterator[None]:
    """A held job waits for its release up to 600 s, not the sandbox's default 120: on a loaded
    machine a test's own steps (the trigger's imports, its cancellation) can take longer, and a job
    that went on by itself would end before the trigger is cancelled."""
    update_settings(sb.layout, hold_seconds=600.0)
    yield
    reset_settings(sb.layout)


def _held_training(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch, **conf_overrides: Any
) -> tuple[PathwaysRLTrainOperator, Context, JobSetTrigger, str, Path]:
    """A training job submitted and deferred; it stops before its final checkpoint until released."""
    conf = sb.gke_conf(train_overrides={"num_test_batches": 2}, **conf_overrides)
    prepare_cluster(sb, conf, run_id=RUN_ID)
    convert_checkpoint(sb, conf, run_id=RUN_ID)
    job_name = gke_pipeline_from_conf(conf, run_id=RUN_ID).train_job
    hold = sb.hold_file()
    monkeypatch.setenv("TPU_RL_SANDBOX_HOLD_FILE", str(hold))
    train = sb.operator(PathwaysRLTrainOperator, task_id="train")
    context = sb.context(train, conf, run_id=RUN_ID)
    deferred = defer(train, context)
    assert isinstance(deferred.trigger, JobSetTrigger)
    return train, context, deferred.trigger, job_name, hold


# How long a cancelled trigger may take to end: its clean-up saves the cursor and, on a kill, deletes
# the JobSet (seconds); a cancellation it lost would leave it waiting on the held job instead.
CANCELLED_END_SECONDS = 60.0


async def _cancel_while_watching(trigger: JobSetTrigger) -> bool:
    """Run the trigger as a triggerer does (``async for`` in a task of its own), cancel that task
    once the trigger watches the JobSet, and wait (bounded) for it to end: True when it ended with
    the cancellation, False when it fired an event instead."""

    async def first_event() -> Any:
        async for event in trigger.run():
            return event
        return None

    task = asyncio.create_task(first_event())
    deadline = time.monotonic() + 120
    while not trigger._first_seen:
        assert not task.done(), f"the trigger ended before it watched the JobSet: {task.result()}"
        assert time.monotonic() < deadline, "the trigger never saw the JobSet"
        await asyncio.sleep(0.02)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=CANCELLED_END_SECONDS)
    assert done, f"the trigger was still running {CANCELLED_END_SECONDS:.0f} s after its cancellation"
    return task.cancelled()


def _release_when(recorder: LineRecorder, hold: Path, text: str) -> Any:
    async def release() -> None:
        while not any(text in line for line in recorder.lines):
            await asyncio.sleep(0.02)
        hold.unlink()

    return release


def _containers(pods: list[dict[str, Any]]) -> list[str]:
    return [
        f"{pod['metadata']['name']}/{c['name']}"
        for pod in pods
        for c in [*(pod["spec"].get("initContainers") or []), *pod["spec"]["containers"]]
    ]


def test_the_trigger_state_is_plain_data_and_names_the_cluster(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, _, trigger, job_name, hold = _held_training(sb, monkeypatch)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_provider_tpu_rl.triggers.jobset.JobSetTrigger"
    assert (kwargs["project_id"], kwargs["location"], kwargs["cluster_name"]) == (
        sb.project,
        REGION,
        sb.cluster,
    )
    assert kwargs["job_name"] == job_name
    assert kwargs["pathways"] is True
    assert kwargs["cursor_prefix"] == f"gs://{sb.bucket}/tpu-rl/log-cursors/{job_name}"
    assert kwargs["run_dir"].startswith(f"gs://{sb.bucket}/gemma4-26b/trained/")
    assert kwargs["run_key"] == f"tpu_rl_gke_pipeline/{RUN_ID}"
    assert kwargs["keepalive"]["bucket"] == sb.bucket
    assert kwargs["not_before"] is not None
    rebuilt = JobSetTrigger(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert json.loads(json.dumps(kwargs)) == kwargs  # plain data: what the metadata database keeps
    hold.unlink()


def test_a_pathways_job_of_eleven_containers_is_followed_line_for_line(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    train, context, trigger, job_name, hold = _held_training(sb, monkeypatch)
    # v6e-32 (4x8, 4 chips per VM): the head pod's two sidecars and workload container, 8 workers.
    wait_for(lambda: len(_containers(sb.pods(job_name))) == 11, "the JobSet's pods (after admission)")
    monkeypatch.setenv("AIRFLOW__TPU_RL__TRIGGER_LOG_SETTLE_SECONDS", "2.5")

    with recording(trigger) as recorder:
        event = run_trigger(trigger, alongside=_release_when(recorder, hold, "Pre RL Training"))
    fired_at = time.monotonic()
    result = train.execute_complete(context, event)

    full = sb.container_log(job_name, HEAD, WORKLOAD)
    assert recorder.lines == full
    assert event["log_lines"] == len(full)
    # the lines read together go as one record (a triggerer passes each record on separately)
    assert recorder.records < len(full) / 2, (recorder.records, len(full))
    # each step's progress once, in order, after the step's line
    steps = [int(m.group(1)) for line in full if (m := _TRAIN_STEP.search(line))]
    assert steps
    assert recorder.progress == [f"step {n}/{trigger.total_steps}" for n in steps]
    # the event waited for the triggerer to write the last record
    assert fired_at - recorder.last_at >= 2.5
    rewards = printed_rewards("\n".join(full))
    assert set(rewards) == {"pre", "post"}
    assert result["metrics"]["pre"]["mean_reward"] == rewards["pre"]
    assert result["metrics"]["post"]["mean_reward"] == rewards["post"]


def test_a_triggerer_restart_mid_training_loses_and_repeats_no_line(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    train, context, trigger, job_name, hold = _held_training(sb, monkeypatch)

    async def until_pre_reward_then_stop() -> None:
        task = asyncio.ensure_future(anext(aiter(trigger.run())))
        deadline = time.monotonic() + 120
        while not any("Pre RL Training" in line for line in first.lines):
            assert time.monotonic() < deadline, "no Pre RL Training line relayed"
            assert not task.done(), "the trigger ended before the restart"
            await asyncio.sleep(0.02)
        task.cancel()  # what a triggerer shutdown does to its triggers
        with contextlib.suppress(asyncio.CancelledError):
            await task

    with recording(trigger) as first:
        asyncio.run(until_pre_reward_then_stop())
    # The task is still deferred: the job was not cancelled.
    assert (
        kube_access.request(
            sb.kube(), "GET", f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/{job_name}"
        ).status
        == 200
    )

    # The triggerer that picks the trigger up again builds it from its serialized state.
    restarted = JobSetTrigger(**trigger.serialize()[1])
    hold.unlink()
    with recording(restarted) as second:
        event = run_trigger(restarted)
    result = train.execute_complete(context, event)

    full = sb.container_log(job_name, HEAD, WORKLOAD)
    assert first.lines + second.lines == full
    assert second.lines, "the restarted trigger relayed nothing"
    assert event["log_lines"] == len(full)
    rewards = printed_rewards("\n".join(full))
    # the pre-training reward was printed before the restart: it survives it
    assert result["metrics"]["pre"]["mean_reward"] == rewards["pre"]
    assert result["metrics"]["post"]["mean_reward"] == rewards["post"]
    # the TPU time that trained: the first TPU worker's start to the JobSet's completion, as the
    # API reports them (the CPU head is left out: test_kubernetes)
    pods = sb.pods(job_name)
    workers = [pod for pod in pods if pod["metadata"]["labels"][kubernetes.REPLICATED_JOB_LABEL] == "worker"]
    assert len(workers) == 8
    assert result["ran"]["started_at"] == min(pod["status"]["startTime"] for pod in workers)
    answer = kube_access.request(
        sb.kube(), "GET", f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/{job_name}"
    )
    assert result["ran"]["ended_at"] == kubernetes.jobset_state(answer.json())[1]
    # Kubernetes' timestamps have whole seconds: a short job may start and end within one
    assert result["ran"]["started_at"] <= result["ran"]["ended_at"]


def test_the_trigger_closes_its_sessions_before_its_event(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller may take the first event and never close the generator (``dags test`` takes it with
    ``anext`` and ends its loop; a triggerer may stop a trigger at its event): no Kubernetes or GCS
    session of the trigger may be left open then."""
    from aiohttp import ClientSession

    def open_sessions() -> set[int]:
        return {id(o) for o in gc.get_objects() if isinstance(o, ClientSession) and not o.closed}

    _, _, trigger, _job_name, hold = _held_training(sb, monkeypatch)
    hold.unlink()
    before = open_sessions()
    events = trigger.run()
    loop = asyncio.new_event_loop()
    try:
        event = loop.run_until_complete(anext(events))
        left_open = open_sessions() - before
    finally:
        loop.close()  # the generator stays suspended at its yield: its `finally` never runs
    assert event.payload["status"] == "success"
    assert left_open == set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # closing the abandoned generator on a closed loop
        del events
        gc.collect()


def test_killing_the_task_deletes_the_jobset(sb: SandboxRun, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, trigger, job_name, hold = _held_training(sb, monkeypatch)
    path = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/{job_name}"
    assert kube_access.request(sb.kube(), "GET", path).status == 200
    asyncio.run(trigger.on_kill())
    assert kube_access.request(sb.kube(), "GET", path).status == 404
    hold.unlink()


@pytest.mark.parametrize("killed", [True, False])
def test_before_airflow_3_3_only_a_kill_cancels_the_job(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch, killed: bool
) -> None:
    _, _, trigger, job_name, hold = _held_training(sb, monkeypatch)
    monkeypatch.setattr(jobset_module, "AIRFLOW_V_3_3_PLUS", False)

    async def safe_to_cancel() -> bool:
        return killed  # the task left the deferred state: a user killed it; else a restart

    monkeypatch.setattr(trigger, "safe_to_cancel", safe_to_cancel)

    async def run_then_cancel() -> bool:
        try:
            return await _cancel_while_watching(trigger)
        finally:
            # Released before asyncio.run shuts down: nothing it waits for waits on the held job.
            hold.unlink()

    assert asyncio.run(run_then_cancel()) is True
    path = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/{job_name}"
    assert kube_access.request(sb.kube(), "GET", path).status == (404 if killed else 200)


def test_a_kill_whose_delete_fails_says_so_and_still_cancels(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before Airflow 3.3 the delete runs on the cancel path: its failure is logged with what to do
    (the JobSet keeps running), and the cancellation still reaches the caller."""
    from airflow_provider_tpu_rl.exceptions import FailureKind, KubernetesApiError

    _, _, trigger, job_name, hold = _held_training(sb, monkeypatch)
    monkeypatch.setattr(jobset_module, "AIRFLOW_V_3_3_PLUS", False)

    async def safe_to_cancel() -> bool:
        return True

    async def refused() -> None:
        raise KubernetesApiError("delete JobSet: 403 forbidden", FailureKind.CONFIG)

    monkeypatch.setattr(trigger, "safe_to_cancel", safe_to_cancel)
    monkeypatch.setattr(trigger, "on_kill", refused)

    with caplog.at_level(logging.ERROR, logger=f"tests.jobset_trigger.{id(trigger)}"), recording(trigger):
        assert asyncio.run(_cancel_while_watching(trigger)) is True
    (record,) = [r for r in caplog.records if "Could not delete JobSet" in r.getMessage()]
    assert job_name in record.getMessage()
    assert "gcluster job cancel" in record.getMessage()
    assert record.exc_info is not None
    assert "403 forbidden" in str(record.exc_info[1])
    path = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/{job_name}"
    assert kube_access.request(sb.kube(), "GET", path).status == 200
    hold.unlink()


def test_a_deleted_jobset_is_missing_after_two_polls(sb: SandboxRun, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, trigger, job_name, hold = _held_training(sb, monkeypatch)
    path = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/{job_name}"
    assert kube_access.request(sb.kube(), "DELETE", path).status == 200
    event = run_trigger(trigger)
    assert event["status"] == "missing"
    assert "does not exist" in event["message"]
    hold.unlink()


def test_a_cluster_the_gke_api_does_not_know_is_a_configuration_error(sb: SandboxRun) -> None:
    from airflow_provider_tpu_rl.exceptions import ConfigurationError

    hook = kubernetes.GkeClusterHook("google_cloud_default", "us-east5")
    with pytest.raises(
        ConfigurationError, match=f"GKE cluster no-such-cluster not found in {sb.project}/us-east5"
    ):
        hook.cluster_access("no-such-cluster", sb.project)


def test_kubernetes_api_errors_say_whether_a_retry_may_help() -> None:
    from kubernetes_asyncio.client.exceptions import ApiException

    from airflow_provider_tpu_rl.exceptions import ConfigurationError, FailureKind, KubernetesApiError

    def api_error(status: int) -> Exception:
        err = ApiException(status=status, reason="x")
        err.body = json.dumps({"kind": "Status", "message": f"refused with {status}"})
        return kubernetes._api_error(err, "get JobSet default/j")

    assert isinstance(api_error(401), ConfigurationError)
    assert isinstance(api_error(403), ConfigurationError)
    assert "refused with 403" in str(api_error(403))
    for status, kind in [
        (500, FailureKind.TRANSIENT),
        (429, FailureKind.TRANSIENT),
        (422, FailureKind.CONFIG),
    ]:
        err = api_error(status)
        assert isinstance(err, KubernetesApiError)
        assert err.kind is kind
    assert kubernetes._api_error(OSError("connection reset"), "x").retryable  # type: ignore[attr-defined]


def test_the_wait_renews_the_writer_claim_and_the_lease_while_the_job_runs(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__TPU_RL__RUN_DIR_CLAIM_MINUTES", "0.05")  # 3 s: renewed every second
    train, context, trigger, job_name, hold = _held_training(sb, monkeypatch)
    run_dir = trigger.run_dir
    assert run_dir is not None
    records, leases = RunDirRecords(), ClusterLeaseHook()
    claimed = records.read(sb.bucket, run_dir).writer
    assert claimed is not None
    assert claimed.job == job_name
    lease = leases.read(sb.bucket, sb.cluster)
    assert lease is not None
    # as if the cluster's lease were about to run out under the long training
    leases._write(sb.bucket, dataclasses.replace(lease, expires_at=time.time() + 1), lease.generation)

    async def release_once_both_renewed() -> None:
        while True:
            writer = records.read(sb.bucket, run_dir).writer
            current = leases.read(sb.bucket, sb.cluster)
            if (
                writer
                and current
                and writer.expires_at > claimed.expires_at + 1
                and current.expires_at > time.time() + 1
            ):
                break
            await asyncio.sleep(0.1)
        hold.unlink()

    event = run_trigger(trigger, alongside=release_once_both_renewed)
    train.execute_complete(context, event)
    assert records.read(sb.bucket, run_dir).writer is None  # the job's end released the claim
