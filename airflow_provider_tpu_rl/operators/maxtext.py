"""MaxText workloads as gcluster jobs: conversion both ways and GRPO training on Pathways.

Each job name derives from the DAG run, so a retry finds the job its first try submitted and
re-attaches instead of submitting a duplicate. Waiting is deferred to a trigger.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, Literal

from airflow.providers.common.compat.sdk import AirflowException, AirflowFailException, Context, conf
from airflow.providers.google.cloud.hooks.gcs import GCSHook

from airflow_provider_tpu_rl.hooks.jobs import GclusterJob, JobState
from airflow_provider_tpu_rl.links import CloudLoggingJobLink, GCSBrowserLink, GKEWorkloadLink
from airflow_provider_tpu_rl.maxtext.layout import (
    checkpoint_event_payload,
    export_event_payload,
    parse_gs_uri,
    probe_checkpoint,
    probe_hf_export,
)
from airflow_provider_tpu_rl.maxtext.logs import TrainingLogTracker
from airflow_provider_tpu_rl.operators.pipeline import PipelineOperator
from airflow_provider_tpu_rl.render import gke
from airflow_provider_tpu_rl.render.command import Command
from airflow_provider_tpu_rl.sensors.checkpoint import run_probe_sync
from airflow_provider_tpu_rl.spec import GkePipelineSpec
from airflow_provider_tpu_rl.triggers.gcluster_job import GclusterJobTrigger

Direction = Literal["to_maxtext", "to_huggingface"]


MAX_FOLLOWS = 50  # `logs --follow` calls in one in-worker wait


def default_poll_interval() -> float:
    """Seconds between job-state polls: ``[tpu_rl] poll_interval`` in the Airflow config."""
    return conf.getfloat("tpu_rl", "poll_interval", fallback=60.0)


def checkpoint_ready(
    gcp_conn_id: str, root_uri: str, step: int, items: tuple[str, ...]
) -> dict[str, Any] | None:
    """The sensor payload when ``root_uri`` holds a committed ``step`` with ``items``, else None."""
    bucket, prefix = parse_gs_uri(root_uri)
    result = run_probe_sync(GCSHook(gcp_conn_id=gcp_conn_id), bucket, probe_checkpoint(prefix, step, items))
    return (
        checkpoint_event_payload(bucket, result.state, items) if result.is_complete and result.state else None
    )


def export_ready(gcp_conn_id: str, export_uri: str) -> dict[str, Any] | None:
    bucket, prefix = parse_gs_uri(export_uri)
    result = run_probe_sync(GCSHook(gcp_conn_id=gcp_conn_id), bucket, probe_hf_export(prefix))
    return export_event_payload(bucket, prefix, result.status) if result.status.complete else None


class _GclusterJobOperator(PipelineOperator):
    """Submit-or-attach, defer, verify the output in GCS."""

    operator_extra_links = (GKEWorkloadLink(), CloudLoggingJobLink(), GCSBrowserLink())
    pathways = False

    def __init__(
        self,
        *,
        deferrable: bool = True,
        poll_interval: float | None = None,
        job_timeout: timedelta | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.deferrable = deferrable
        # None: the [tpu_rl] poll_interval option (AIRFLOW__TPU_RL__POLL_INTERVAL), default 60 s.
        self.poll_interval = poll_interval if poll_interval is not None else default_poll_interval()
        self.job_timeout = job_timeout
        self._submitted: tuple[str, str, str, str] | None = None

    # what a subclass says
    def job(self, p: GkePipelineSpec) -> tuple[str, Command]:
        raise NotImplementedError

    def output_ready(self, p: GkePipelineSpec) -> dict[str, Any] | None:
        raise NotImplementedError

    def output_uri(self, p: GkePipelineSpec) -> str:
        raise NotImplementedError

    # the shared mechanism
    def _persist_links(self, context: Context, p: GkePipelineSpec, name: str) -> None:
        c = p.cluster
        GKEWorkloadLink.persist(
            context,
            project_id=c.project,
            location=c.region,
            cluster_name=c.cluster_name,
            jobset_name=name,
            pathways=self.pathways,
        )
        CloudLoggingJobLink.persist(
            context, project_id=c.project, jobset_name=name, location=c.region, cluster_name=c.cluster_name
        )
        GCSBrowserLink.persist(context, uri=self.output_uri(p), project_id=c.project)

    def _find(self, p: GkePipelineSpec, name: str) -> GclusterJob | None:
        c = p.cluster
        return self.hook.get_job(name, c.project, c.cluster_name, c.region)

    def submit_or_attach(self, p: GkePipelineSpec, name: str, command: Command) -> str:
        """Submit ``command`` unless a job of this run already exists; a failed one is replaced."""
        existing = self._find(p, name)
        c = p.cluster
        if existing is not None and existing.state is JobState.FAILED:
            self.log.warning("Job %s failed in an earlier try; deleting it and submitting again", name)
            self.hook.cancel_job(name, c.project, c.cluster_name, c.region)
            existing = None
        if existing is None:
            self.log.info("Submitting job %s", name)
            with self.hook.job_session() as home:
                for auth in gke.docker_auth(c.region):
                    self.hook.run_checked(auth, job_home=home)
                self.hook.run_checked(command, job_home=home)
            self._submitted = (name, c.project, c.cluster_name, c.region)
            return "submitted"
        self.log.info(
            "Job %s already exists (%s): re-attaching, nothing submitted", name, existing.state.value
        )
        return "attached"

    def execute(self, context: Context) -> dict[str, Any]:
        p: GkePipelineSpec = self.pipeline(context)
        name, command = self.job(p)
        context["ti"].xcom_push(key="job_name", value=name)
        self._persist_links(context, p, name)
        ready = self.output_ready(p)
        if ready is not None:
            self.log.info(
                "Output %s is already complete: job %s is skipped, no TPU time spent",
                self.output_uri(p),
                name,
            )
            return {"job_name": None, "skipped": True, **ready}
        self.submit_or_attach(p, name, command)
        c = p.cluster
        if not self.deferrable:
            return self._wait_in_worker(context, p, name)
        self.defer(
            trigger=GclusterJobTrigger(
                job_name=name,
                project=c.project,
                cluster=c.cluster_name,
                location=c.region,
                gcluster_conn_id=self.gcluster_conn_id,
                poll_interval=self.poll_interval,
                total_steps=self.total_steps(p),
                deadline=time.time() + self.job_timeout.total_seconds() if self.job_timeout else None,
            ),
            method_name="execute_complete",
        )
        raise AssertionError("defer() raises")  # pragma: no cover

    def _wait_in_worker(self, context: Context, p: GkePipelineSpec, name: str) -> dict[str, Any]:
        """``deferrable=False``: poll in the worker, following the job's log while it runs."""
        deadline = time.monotonic() + self.job_timeout.total_seconds() if self.job_timeout else None
        total = self.total_steps(p)
        tracker = TrainingLogTracker() if total is not None else None
        follows = 0
        c = p.cluster
        while True:
            job = self._find(p, name)
            extra: dict[str, Any] = {"metrics": tracker.metrics()} if tracker is not None else {}
            if job is None:
                return self.execute_complete(context, {"status": "missing", "job_name": name, **extra})
            if job.state.finished:
                status = "success" if job.state is JobState.SUCCEEDED else "failed"
                return self.execute_complete(
                    context, {"status": status, "job_name": name, "state": job.state.value, **extra}
                )
            if deadline is not None and time.monotonic() > deadline:
                return self.execute_complete(
                    context, {"status": "timeout", "job_name": name, "state": job.state.value, **extra}
                )
            if tracker is not None and total is not None and follows < MAX_FOLLOWS:
                # `logs --follow` returns when the pods end, or at once while they do not run yet;
                # follow again until the job has ended, then poll for its state.
                follows += 1
                try:
                    self.hook.stream_job_logs(
                        name,
                        c.project,
                        c.cluster_name,
                        c.region,
                        follow=True,
                        on_line=lambda line: _feed(tracker, line, total, self.log),
                        timeout=deadline - time.monotonic() if deadline is not None else None,
                    )
                except AirflowException as err:
                    self.log.warning("Could not follow the log of %s: %s", name, str(err).splitlines()[:1])
                continue
            time.sleep(self.poll_interval)

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        p: GkePipelineSpec = self.pipeline(context)
        event = event or {}
        name = event.get("job_name") or self.job(p)[0]
        status = event.get("status")
        if status in {"success", "missing"}:
            ready = self.output_ready(p)
            if ready is not None:
                if status == "missing":
                    self.log.info("Job %s is gone (JobSet TTL) but its output is complete: success", name)
                return {"job_name": name, "skipped": False, **ready, **self.after_success(p, name, event)}
            raise AirflowException(
                f"job {name} ended ({status}) but {self.output_uri(p)} is not complete: {event.get('message', '')}"
            )
        if status == "timeout":
            c = p.cluster
            self.log.error(
                "Job %s exceeded job_timeout=%s: cancelling it so it stops holding TPUs",
                name,
                self.job_timeout,
            )
            self.hook.cancel_job(name, c.project, c.cluster_name, c.region)
            raise AirflowFailException(
                f"job {name} did not finish within {self.job_timeout}; it was cancelled"
            )
        raise AirflowException(
            f"job {name} {status or 'ended'}: {event.get('message', '')} (state {event.get('state')})"
        )

    def total_steps(self, p: GkePipelineSpec) -> int | None:
        """Training jobs report progress and metrics from their log; others do not."""
        return None

    def after_success(self, p: GkePipelineSpec, name: str, event: dict[str, Any]) -> dict[str, Any]:
        return {}

    def on_kill(self) -> None:
        super().on_kill()
        if self._submitted:
            name, project, cluster, location = self._submitted
            self.log.warning("Task killed: cancelling job %s", name)
            try:
                self.hook.cancel_job(name, project, cluster, location)
            except Exception:  # the kill must not raise
                self.log.exception("could not cancel job %s", name)


class MaxTextConvertOperator(_GclusterJobOperator):
    """HF→MaxText (``to_maxtext``) or MaxText→HF (``to_huggingface``) as a gcluster job.

    Skipped when the target is already complete in GCS: a converted checkpoint with its commit
    markers, or an export whose index lists shards that all exist.
    """

    template_fields: Sequence[str] = (*PipelineOperator.template_fields, "direction")

    def __init__(self, *, direction: Direction = "to_maxtext", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if direction not in ("to_maxtext", "to_huggingface"):
            raise ValueError(f"direction must be 'to_maxtext' or 'to_huggingface', got {direction!r}")
        self.direction = direction

    def job(self, p: GkePipelineSpec) -> tuple[str, Command]:
        if self.direction == "to_maxtext":
            return p.convert_job, gke.conversion_job(p)
        return p.export_job, gke.export_job(p)

    def output_uri(self, p: GkePipelineSpec) -> str:
        return p.conversion.output_directory if self.direction == "to_maxtext" else p.export.output_directory

    def output_ready(self, p: GkePipelineSpec) -> dict[str, Any] | None:
        if self.direction == "to_maxtext":
            return checkpoint_ready(self.gcp_conn_id, p.conversion.output_directory, 0, ("items",))
        return export_ready(self.gcp_conn_id, p.export.output_directory)


class PathwaysRLTrainOperator(_GclusterJobOperator):
    """GRPO training on Pathways; metrics parsed from MaxText's log lines go to XCom."""

    pathways = True

    def job(self, p: GkePipelineSpec) -> tuple[str, Command]:
        return p.train_job, gke.training_job(p)

    def output_uri(self, p: GkePipelineSpec) -> str:
        return p.training.actor_checkpoint_root

    def output_ready(self, p: GkePipelineSpec) -> dict[str, Any] | None:
        return checkpoint_ready(
            self.gcp_conn_id, p.training.actor_checkpoint_root, p.training.final_step, ("model_params",)
        )

    def total_steps(self, p: GkePipelineSpec) -> int | None:
        return p.training.final_step

    def after_success(self, p: GkePipelineSpec, name: str, event: dict[str, Any]) -> dict[str, Any]:
        metrics = event.get("metrics")
        if metrics is None:  # waited in the worker: read what the log still holds
            tracker = TrainingLogTracker()
            total = p.training.final_step
            c = p.cluster
            try:
                self.hook.stream_job_logs(
                    name,
                    c.project,
                    c.cluster_name,
                    c.region,
                    on_line=lambda line: _feed(tracker, line, total, self.log),
                )
            except AirflowException as err:
                self.log.warning("No workload log for %s (%s): metrics unavailable", name, err)
            metrics = tracker.metrics()
        pre, post = metrics.get("pre"), metrics.get("post")
        if pre and post:
            self.log.info("mean_reward %s -> %s", pre.get("mean_reward"), post.get("mean_reward"))
        return {"metrics": metrics}


def _feed(tracker: TrainingLogTracker, line: str, total: int, log: Any) -> None:
    before = tracker.last_step
    tracker.feed(line)
    if tracker.last_step is not None and tracker.last_step != before:
        log.info("progress: %s", tracker.progress_text(total))
