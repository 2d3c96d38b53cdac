"""MaxText workloads as gcluster jobs: conversion both ways and GRPO training on Pathways.

Each job name derives from the DAG run and the task, so a retry finds the job its first try
submitted and re-attaches instead of submitting a duplicate. Submission goes through gcluster;
the wait reads the JobSet and its log through the Kubernetes API (:class:`JobSetTrigger`), in the
triggerer when deferrable, else in the worker.

**Run identity.** A job writes one *run directory*: ``<base_output_directory>/<run_name>/`` for
training, the export folder for an export, the converted checkpoint's folder for a conversion.
Its record (:mod:`airflow_provider_tpu_rl.records.run_dirs`) says who wrote it and which job writes
it now.

* *Who wrote it*: "already complete, skip" holds only for outputs this run wrote; a converted
  checkpoint depends only on the model, so any run's is reused.
* *Reusing a run_name on purpose resumes that run*: the job continues from the run directory's
  newest checkpoint, and a complete output of the earlier run is adopted, never silently: a
  warning names the run it came from and the result's ``resumed_from`` says so. A resume with
  other settings (a different ``learning_rate``, model or start checkpoint) is refused in one line.
* *One writer per directory*, whatever cluster it runs on: before submitting, the task claims the
  directory for its job in the record (a GCS write with a generation precondition). A claim of
  another live run refuses the task in one line (a conversion waits on that run's job instead:
  same model, same output); a claim whose run has finished, or that nobody renewed, is taken
  over. The job's wait renews the claim while the job runs and the task's end releases it. Right
  after the submit, the wait also checks the cluster's other JobSets: one that writes the same
  directory without a claim (submitted by hand) makes it delete this job and fail.

The worker only submits: the cluster's endpoint, the JobSet's deadline, its annotations and the
check of the other JobSets are the trigger's (:class:`JobSetTrigger`), so a job task holds a
worker slot for seconds and imports no Kubernetes client.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, Final

from airflow.providers.common.compat.sdk import Context

from airflow_provider_tpu_rl import timeouts
from airflow_provider_tpu_rl.assets import (
    converted_checkpoint_asset_uri,
    emit_asset_events,
    leave_converted_event,
)
from airflow_provider_tpu_rl.compat import AirflowException, AirflowFailException, conf, default_deferrable
from airflow_provider_tpu_rl.exceptions import ConfigurationError, RunDirBusyError
from airflow_provider_tpu_rl.ledger.model_card import base_model_facts
from airflow_provider_tpu_rl.ledger.records import NUM_TEST_BATCHES_METRIC, reward_summary
from airflow_provider_tpu_rl.lineage import (
    Lineage,
    LineageMixin,
    conversion_lineage,
    export_lineage,
    training_lineage,
)
from airflow_provider_tpu_rl.links import CloudLoggingJobLink, GCSBrowserLink, GKEWorkloadLink
from airflow_provider_tpu_rl.maxtext.layout import (
    CONVERTED_CHECKPOINT_ITEMS,
    CONVERTED_CHECKPOINT_STEP,
    run_dir,
)
from airflow_provider_tpu_rl.maxtext.logs import TrainingLogTracker
from airflow_provider_tpu_rl.operators.base import GclusterBaseOperator, fail_fast
from airflow_provider_tpu_rl.operators.takeover import (
    DEFAULT_STOP_TIMEOUT,
    displaced_attempt,
    previous_writer,
    prove_dead,
)
from airflow_provider_tpu_rl.records.janitor_sources import run_finished, run_probe
from airflow_provider_tpu_rl.records.run_dirs import (
    GKE,
    RunDirRecord,
    RunDirRecords,
    TrainingAttempt,
    WriterClaim,
    attempt_from_log,
    busy_message,
    vouches,
)
from airflow_provider_tpu_rl.records.writers import WriterState
from airflow_provider_tpu_rl.render import gke, maxtext
from airflow_provider_tpu_rl.render.command import Command
from airflow_provider_tpu_rl.spec import rules
from airflow_provider_tpu_rl.spec.cluster import CPU_COMPUTE_TYPE, GkeJobTarget
from airflow_provider_tpu_rl.spec.errors import SpecError
from airflow_provider_tpu_rl.spec.existing_cluster import POOLS_ROUTE, job_target_on, parse_existing_cluster
from airflow_provider_tpu_rl.spec.pipeline import (
    default_job_name,
    gke_conversion,
    gke_export,
    gke_job_target,
    gke_training,
    hf_token_spec,
    pathways_gcs_location,
    run_suffix,
    secret_version,
)
from airflow_provider_tpu_rl.spec.preflight import enabled_secret_versions
from airflow_provider_tpu_rl.spec.presets import ModelPreset, Runner, get_preset
from airflow_provider_tpu_rl.spec.workloads import check_patched_image, num_test_batches
from airflow_provider_tpu_rl.toolchain.job_output import GclusterJob, JobState

if TYPE_CHECKING:
    from airflow_provider_tpu_rl.triggers.jobset import JobSetTrigger


def min_deferral_seconds() -> float:
    """``[tpu_rl] min_deferral_seconds``: the least time a job's trigger waits before firing."""
    return conf.getfloat("tpu_rl", "min_deferral_seconds", fallback=15.0)


def log_cursor_prefix(bucket: str, job_name: str) -> str:
    """Where the trigger keeps how far it relayed a JobSet's log: this plus ``-<JobSet uid>.json``
    (one object per JobSet)."""
    return f"gs://{bucket}/tpu-rl/log-cursors/{job_name}"


def claim_seconds() -> float:
    """``[tpu_rl] run_dir_claim_minutes``: how long a writer claim (and the cluster lease a job's
    wait renews) holds unrenewed; the wait renews both every third of it."""
    return conf.getfloat("tpu_rl", "run_dir_claim_minutes", fallback=30.0) * 60.0


def default_poll_interval() -> float:
    """Seconds between job-state polls: ``[tpu_rl] poll_interval`` in the Airflow config."""
    return conf.getfloat("tpu_rl", "poll_interval", fallback=60.0)


def checkpoint_ready(
    gcp_conn_id: str,
    root_uri: str,
    step: int,
    items: tuple[str, ...],
    impersonation_chain: str | Sequence[str] | None = None,
) -> dict[str, Any] | None:
    """The sensor payload when ``root_uri`` holds a committed ``step`` with ``items``, else None."""
    from airflow_provider_tpu_rl.hooks.credentials import gcs_hook
    from airflow_provider_tpu_rl.maxtext.layout import (
        checkpoint_event_payload,
        parse_gs_uri,
        probe_checkpoint,
    )
    from airflow_provider_tpu_rl.sensors.checkpoint import run_probe_sync

    bucket, prefix = parse_gs_uri(root_uri)
    result = run_probe_sync(
        gcs_hook(gcp_conn_id, impersonation_chain), bucket, probe_checkpoint(prefix, step, items)
    )
    return (
        checkpoint_event_payload(bucket, result.state, items) if result.is_complete and result.state else None
    )


def newest_committed_step(
    gcp_conn_id: str, root_uri: str, impersonation_chain: str | Sequence[str] | None = None
) -> int | None:
    """The newest complete actor checkpoint step under ``root_uri`` (what a resumed training
    restores), None when none is committed yet."""
    from airflow_provider_tpu_rl.hooks.credentials import gcs_hook
    from airflow_provider_tpu_rl.maxtext.layout import parse_gs_uri, probe_checkpoint
    from airflow_provider_tpu_rl.sensors.checkpoint import run_probe_sync

    bucket, prefix = parse_gs_uri(root_uri)
    result = run_probe_sync(
        gcs_hook(gcp_conn_id, impersonation_chain), bucket, probe_checkpoint(prefix, None, ("model_params",))
    )
    return result.state.step if result.is_complete and result.state else None


def export_ready(
    gcp_conn_id: str, export_uri: str, impersonation_chain: str | Sequence[str] | None = None
) -> dict[str, Any] | None:
    """The sensor payload when ``export_uri`` holds a complete Hugging Face export, else None."""
    from airflow_provider_tpu_rl.hooks.credentials import gcs_hook
    from airflow_provider_tpu_rl.maxtext.layout import export_event_payload, parse_gs_uri, probe_hf_export
    from airflow_provider_tpu_rl.sensors.checkpoint import run_probe_sync

    bucket, prefix = parse_gs_uri(export_uri)
    result = run_probe_sync(gcs_hook(gcp_conn_id, impersonation_chain), bucket, probe_hf_export(prefix))
    return export_event_payload(bucket, prefix, result.status) if result.status.complete else None


@dataclass(frozen=True)
class JobPlan:
    """One job as the operator resolved it from its arguments: where, what, and what it writes.

    ``run_dir`` is the directory the job writes (see the module's "Run identity"); ``settings``
    are what a resume of it must keep; ``foreign`` marks another run's job this task waits on
    without owning it (never cancelled by this task).
    """

    target: GkeJobTarget
    name: str
    command: Command
    output_uri: str
    total_steps: int | None = None
    run_dir: str = ""
    settings: Mapping[str, str] = field(default_factory=dict)
    foreign: bool = False
    lineage: Lineage | None = None  # what the job reads and writes, for OpenLineage


# The trigger's outcomes after which this run's job no longer writes its directory.
JOB_OVER: Final = frozenset({"success", "missing", "failed", "timeout", "conflict", "unadmitted"})


class _GclusterJobOperator(LineageMixin, GclusterBaseOperator):
    """Submit-or-attach a ``gcluster job``, defer while it runs, verify its output in GCS.

    With the OpenLineage provider, the finished task reports the job's inputs and outputs (GCS
    folders, the Hugging Face repos) and its MaxText command (:mod:`airflow_provider_tpu_rl.lineage`).

    :param project_id: project of the cluster; empty: the GCP connection's project.
    :param location: region of the cluster.
    :param cluster_name: the GKE cluster the job runs on.
    :param bucket: the bucket the model's folders are in (``gs://BUCKET/<model>/…``).
    :param model: model preset name (``qwen3-30b-a3b``, ``gemma4-26b``): MaxText model and defaults.
    :param image: workload image; empty = the preset's ``tpu_post_training`` image.
    :param compute_type: machine type of the job's pods; empty = the preset's TPU type for
        training, ``n4-standard-64`` on the cluster's CPU node pool (``cpu-np``) for the
        conversions, which are CPU programs (a ``ct6e-…`` type runs a conversion on the TPU slice,
        as the tutorials do).
    :param topology: slice topology of the job's pods (TPU types only); empty = the preset's.
    :param job_name: JobSet name (DNS-1035, at most 28 characters); empty = the preset's job
        prefix and a suffix of the DAG run and task, the same on every retry.
    :param hf_token_conn_id: the HF token connection, which names the default secret.
    :param hf_token_secret: the Secret Manager secret the job reads ``HF_TOKEN`` from; empty =
        ``tpu-rl-hf-token-<hf_token_conn_id>`` (what :class:`HfTokenSecretOperator` writes).
    :param deferrable: wait in the triggerer (default ``[operators] default_deferrable``).
    :param poll_interval: seconds between job-state polls (default ``[tpu_rl] poll_interval``).
    :param job_timeout: cancel the job and fail when it exists longer than this (counted from the
        JobSet's creation, so a retry that re-attaches keeps the deadline); empty =
        :func:`airflow_provider_tpu_rl.timeouts.job_timeout` of the job's stage (``[tpu_rl]``
        ``<stage>_timeout_minutes`` less ``job_timeout_margin_minutes``).
    :param cancel_on_kill: delete the job when the task is killed (marked failed, cleared) while
        it waits, in the worker or deferred.
    :param admission_timeout: cancel the job and fail, not retried, when no pod of it is on a node
        this long after its creation (Kueue holds it suspended for lack of quota, or no node has
        the capacity its pods ask); empty = ``[tpu_rl] admission_timeout_minutes`` (30).
    :param cancel_previous_writer: when the run directory's claim no longer vouches for its job
        (it expired, or its run ended: a crashed worker) and that job is still running, stop it
        (delete its JobSet, or its container and processes on a VM) and wait until nothing of it
        runs, then take the directory over. Off (default): such a job fails this task in one line
        naming it and how to stop it. A claim of a live run is never taken over.
    :param previous_writer_stop_timeout: how long the stopped job may take to end (its pods'
        termination grace period); default 10 minutes.
    :param capacity_route: with ``existing_cluster``: ``pools`` (default; a TPU job selects the
        run's own pools) or ``compute-class`` (it selects the run's ComputeClass).
    """

    operator_extra_links = (GKEWorkloadLink(), CloudLoggingJobLink(), GCSBrowserLink())
    template_fields: Sequence[str] = (
        "project_id",
        "location",
        "cluster_name",
        "bucket",
        "model",
        "image",
        "compute_type",
        "topology",
        "job_name",
        "hf_token_conn_id",
        "hf_token_secret",
        "gcluster_conn_id",
        "gcp_conn_id",
        "impersonation_chain",
        "cancel_previous_writer",
        "existing_cluster",
        "kueue_queue",
        "cpu_node_pool",
        "capacity_route",
    )
    pathways = False
    job_kind = "convert"
    # The conversions are CPU programs (MaxText's converters set jax_platforms=cpu).
    on_tpu: ClassVar[bool] = True
    # Outputs owned by one run (training, export): "complete" counts only for the run that wrote
    # them; a conversion's output depends only on the model and is shared by every run.
    owns_output: ClassVar[bool] = True

    def __init__(
        self,
        *,
        location: str,
        cluster_name: str,
        bucket: str,
        model: str,
        project_id: str | None = None,
        image: str | None = None,
        compute_type: str | None = None,
        topology: str | None = None,
        job_name: str | None = None,
        hf_token_conn_id: str = "huggingface_default",
        hf_token_secret: str | None = None,
        deferrable: bool | None = None,
        poll_interval: float | None = None,
        job_timeout: timedelta | None = None,
        cancel_on_kill: bool = True,
        admission_timeout: timedelta | None = None,
        cancel_previous_writer: bool | str = False,
        previous_writer_stop_timeout: timedelta = DEFAULT_STOP_TIMEOUT,
        existing_cluster: str | None = None,
        kueue_queue: str | None = None,
        cpu_node_pool: str | None = None,
        capacity_route: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.existing_cluster = existing_cluster
        self.kueue_queue = kueue_queue
        self.cpu_node_pool = cpu_node_pool
        self.capacity_route = capacity_route
        self.cancel_previous_writer = cancel_previous_writer
        self.previous_writer_stop_timeout = previous_writer_stop_timeout
        self.project_id = project_id
        self.location = location
        self.cluster_name = cluster_name
        self.bucket = bucket
        self.model = model
        self.image = image
        self.compute_type = compute_type
        self.topology = topology
        self.job_name = job_name
        self.hf_token_conn_id = hf_token_conn_id
        self.hf_token_secret = hf_token_secret
        self.deferrable = default_deferrable() if deferrable is None else deferrable
        # None: the [tpu_rl] poll_interval option (AIRFLOW__TPU_RL__POLL_INTERVAL), default 60 s.
        self.poll_interval = poll_interval if poll_interval is not None else default_poll_interval()
        self.job_timeout = job_timeout if job_timeout is not None else timeouts.job_timeout(self.job_kind)
        self.cancel_on_kill = cancel_on_kill
        self.admission_timeout = (
            admission_timeout if admission_timeout is not None else timeouts.admission_timeout()
        )
        self._submitted: tuple[str, str, str, str] | None = None

    # -- resolving the arguments (in execute: templates are rendered by then) ---------------------
    def preset(self) -> ModelPreset:
        preset = get_preset(self.model, "model", Runner.GKE)
        if preset.job_prefixes is None:
            raise SpecError(
                "model", f"{preset.model_name} is a single-host preset; it has no GKE jobs", self.model
            )
        return preset

    def target(self, preset: ModelPreset, num_slices: Any = 1) -> GkeJobTarget:
        """The job's target (``num_slices`` None or empty: the preset's)."""
        on_cpu = not self.on_tpu and not (self.compute_type or "").startswith("ct")
        if on_cpu and self.topology:
            raise SpecError(
                "topology",
                f"the {self.job_kind} job runs on CPU ({self.compute_type or CPU_COMPUTE_TYPE}): leave it "
                "empty, or set a ct6e compute_type to run it on the TPU slice",
                self.topology,
            )
        target = gke_job_target(
            preset,
            project=self.resolve_project_id(),
            location=self.location,
            cluster_name=self.cluster_name,
            image=self.image,
            compute_type=None if on_cpu else self.compute_type,
            topology=self.topology,
            num_slices=num_slices,
        )
        return target.on_cpu(self.compute_type or CPU_COMPUTE_TYPE) if on_cpu else target

    def on_run_cluster(self, target: GkeJobTarget, context: Context) -> GkeJobTarget:
        """The target on the cluster the run does not own (``existing_cluster``): its own pools and
        ``kueue_queue`` (spec/existing_cluster.py ``job_target_on``); as given otherwise."""
        if not self.existing_cluster:
            return target
        dag_id, run_id = self.run_ids(context)
        return job_target_on(
            target,
            parse_existing_cluster(self.existing_cluster),
            run_suffix(dag_id, run_id),
            self.cpu_node_pool or "",
            self.kueue_queue or "",
            self.capacity_route or POOLS_ROUTE,
        )

    def resolved_job_name(self, context: Context, preset: ModelPreset) -> str:
        if self.job_name:
            return rules.job_name("job_name", self.job_name)
        assert preset.job_prefixes is not None
        dag_id, run_id = self.run_ids(context)
        return default_job_name(getattr(preset.job_prefixes, self.job_kind), dag_id, run_id, self.task_id)

    def require_token_secret(self) -> None:
        """The job's pod reads ``HF_TOKEN`` from Secret Manager: a secret that does not exist or
        has no enabled version would fail the pod after the job was submitted and admitted, as a
        generic job failure. Checked before submitting, it is one line and no retry."""
        project, secret_id = self.token_secret()
        command = gke.list_secret_versions(project, secret_id)
        listed = self.hook.run(command, log_output=False)
        fix = "run HfTokenSecretOperator first (the pipelines' sync_hf_token) or name another hf_token_secret"
        if not listed.ok and "NOT_FOUND" in listed.output:
            raise ConfigurationError(
                f"HF token secret {secret_id} does not exist in project {project}: the job could not read "
                f"its token; {fix}"
            )
        self.hook.check_result(command, listed)
        if not enabled_secret_versions(listed.output_lines):
            raise ConfigurationError(
                f"HF token secret {secret_id} in project {project} has no enabled version: the job could "
                f"not read its token; {fix}"
            )

    def token_secret(self) -> tuple[str, str]:
        """``(project, secret id)`` of the HF token secret the job's pod reads."""
        token = hf_token_spec(self.hf_token_conn_id, self.hf_token_secret or None)
        return rules.project_id("project_id", self.resolve_project_id()), token.secret_id

    def token_resource(self) -> str:
        return secret_version(*self.token_secret())

    def plan(self, context: Context) -> JobPlan:
        """The job this task runs (what a subclass renders)."""
        raise NotImplementedError

    def output_ready(self, plan: JobPlan) -> dict[str, Any] | None:
        raise NotImplementedError

    # -- the shared mechanism ------------------------------------------------------------------------
    def _persist_links(self, context: Context, plan: JobPlan) -> None:
        t = plan.target
        GKEWorkloadLink.persist(
            context,
            project_id=t.project,
            location=t.location,
            cluster_name=t.cluster_name,
            jobset_name=plan.name,
            pathways=self.pathways,
        )
        CloudLoggingJobLink.persist(
            context,
            project_id=t.project,
            jobset_name=plan.name,
            location=t.location,
            cluster_name=t.cluster_name,
        )
        GCSBrowserLink.persist(context, uri=plan.output_uri, project_id=t.project)

    def _find(self, plan: JobPlan) -> GclusterJob | None:
        t = plan.target
        return self.hook.get_job(plan.name, t.project, t.cluster_name, t.location)

    def submit_or_attach(self, plan: JobPlan) -> GclusterJob | None:
        """Submit the job unless this task's job already exists (a failed one is replaced).

        Returns the job as ``gcluster job list`` showed it when re-attaching, None after a submit.
        ``plan.foreign`` (another run's conversion of the same model): only waited on.
        """
        t, name = plan.target, plan.name
        if plan.foreign:
            self.log.info("Waiting on job %s of another run: it writes the same %s", name, plan.run_dir)
            return None
        existing = self._find(plan)
        if existing is not None and existing.state is JobState.FAILED:
            self.log.warning("Job %s failed in an earlier try; deleting it and submitting again", name)
            self.hook.cancel_job(name, t.project, t.cluster_name, t.location)
            existing = None
        self._submitted = (name, t.project, t.cluster_name, t.location)
        if existing is None:
            self.require_token_secret()
            self.log.info("Submitting job %s", name)
            with self.hook.job_session() as home:
                for auth in gke.docker_auth(t.location):
                    self.hook.run_checked(auth, job_home=home)
                self.hook.run_checked(plan.command, job_home=home)
            return None
        self.log.info(
            "Job %s already exists (%s): re-attaching, nothing submitted", name, existing.state.value
        )
        return existing

    # -- run identity (see the module docstring) ----------------------------------------------------
    def run_identity(self, context: Context) -> str:
        """``<dag_id>/<run_id>``: what the run directory record and the JobSet annotation hold."""
        dag_id, run_id = self.run_ids(context)
        return f"{dag_id}/{run_id}"

    def run_records(self) -> RunDirRecords:
        return RunDirRecords(self.gcp_conn_id, self.chain)

    def check_resume(self, plan: JobPlan, record: RunDirRecord, run: str) -> None:
        """A run directory another run started is resumed only with the settings it started with."""
        if not record.runs or run in record.runs or not record.settings:
            return
        changed = sorted(
            key
            for key in set(record.settings) | set(plan.settings)
            if record.settings.get(key) != plan.settings.get(key)
        )
        if changed:
            shown = ", ".join(
                f"{key}: {record.settings.get(key, '-')} -> {plan.settings.get(key, '-')}"
                for key in changed[:5]
            )
            raise AirflowFailException(
                f"{plan.run_dir} was started by run {record.runs[0]} with other settings ({shown}); "
                "reusing a run_name resumes that run and keeps its settings: choose a new run_name"
            )

    def claim_run_dir(self, context: Context, plan: JobPlan, record: RunDirRecord, run: str) -> JobPlan:
        """One writer per directory: claim ``plan.run_dir`` for this task's job; the plan to follow.

        This run's claim on a live job of another name (the same DAG run, re-created task) is
        re-attached to; another live run's claim fails the task in one line, or, for a conversion
        (same model, same output), makes it wait on that run's job. A claim that no longer vouches
        for its job (expired, or its run ended) is taken over only once that job is proven dead
        (:mod:`~airflow_provider_tpu_rl.operators.takeover`).
        """
        t = plan.target
        held = record.writer
        if held is not None and held.run == run and held.job != plan.name and held.where == t.where:
            existing = self.hook.get_job(held.job, t.project, t.cluster_name, t.location)
            if existing is not None and not existing.state.finished:
                self.log.warning(
                    "Job %s of this run already writes %s (%s): re-attaching to it instead of submitting %s",
                    held.job,
                    plan.run_dir,
                    existing.state.value,
                    plan.name,
                )
                plan = replace(plan, name=held.job)
                context["ti"].xcom_push(key="job_name", value=plan.name)
        probe = run_probe(context)
        records = self.run_records()
        for _ in range(3):  # the record changed between the proof and the write: decide again
            held = record.writer
            takeover, displaced = None, None
            if held is not None and held.run != run:
                finished = run_finished(probe, held.run)
                if not vouches(held, finished):
                    state = self.prove_previous_writer_dead(held, plan, finished)
                    if state is None:  # a conversion: another run's live job of the same output
                        return self.wait_on(context, plan, held)
                    takeover, displaced = held, self.displaced(held, state)
            writer = WriterClaim(run, plan.name, t.where, time.time() + claim_seconds(), GKE)
            try:
                claimed = records.claim(
                    self.bucket,
                    plan.run_dir,
                    run=run,
                    settings=plan.settings,
                    writer=writer,
                    takeover=takeover,
                    displaced=displaced,
                )
            except RunDirBusyError as busy:
                other: WriterClaim = busy.writer
                if held is not None and other == held and takeover is None:
                    if self.owns_output or t.at(other.where) is None:
                        raise AirflowFailException(str(busy)) from None
                    return self.wait_on(context, plan, other)
                record = records.read(self.bucket, plan.run_dir)
                continue
            break
        else:
            raise AirflowFailException(f"the record of {plan.run_dir} keeps changing: another run claims it")
        previous = claimed.before(run)
        if takeover is not None:
            self.log.warning(
                "Resuming %s, started by run %s: took it over from job %s of run %s (%s), proven no "
                "longer writing it; the job continues from its newest checkpoint",
                plan.run_dir,
                previous,
                takeover.job,
                takeover.run,
                takeover.where,
            )
        elif self.owns_output and previous:
            self.log.warning(
                "Resuming %s, started by run %s (no longer writing it): the job continues from its "
                "newest checkpoint",
                plan.run_dir,
                previous,
            )
        return plan

    def wait_on(self, context: Context, plan: JobPlan, other: WriterClaim) -> JobPlan:
        """A conversion: wait on another run's job writing the same output instead of converting again."""
        target = plan.target.at(other.where)
        if target is None:
            raise AirflowFailException(busy_message(plan.run_dir, other))
        self.log.warning(
            "Job %s of run %s is writing %s (%s): waiting for it instead of converting again",
            other.job,
            other.run,
            plan.run_dir,
            other.where,
        )
        plan = replace(plan, name=other.job, target=target, foreign=True)
        context["ti"].xcom_push(key="job_name", value=plan.name)
        return plan

    def prove_previous_writer_dead(
        self, held: WriterClaim, plan: JobPlan, finished: bool
    ) -> WriterState | None:
        """The state of a claim's job that no longer vouches for it, once this task may take the
        directory over; None when this task waits on it instead (a conversion of the same model);
        a live or unproven one fails the task in one line."""
        if not self.owns_output:  # a conversion waits on a live one rather than stopping it
            state = previous_writer(self, held, plan.run_dir, pathways=self.pathways).state()
            if state.live and plan.target.at(held.where) is not None:
                return None
        return prove_dead(
            self,
            held,
            plan.run_dir,
            finished=finished,
            stage=self.job_kind,
            cancel=rules.boolean("cancel_previous_writer", self.cancel_previous_writer),
            pathways=self.pathways,
            stop_timeout=self.previous_writer_stop_timeout,
            poll=min(self.poll_interval, 5.0),
            claim_seconds=claim_seconds(),
        )

    def displaced(self, held: WriterClaim, state: WriterState) -> TrainingAttempt | None:
        """The attempt of the job taken over (a training's; None for other jobs)."""
        return None

    def saved_metrics(self, plan: JobPlan) -> dict[str, Any] | None:
        """The metrics the newest wait on ``plan``'s job kept with its log cursor; None without one."""
        if plan.total_steps is None:
            return None
        return self.job_metrics(plan.name)

    def job_metrics(self, job: str) -> dict[str, Any] | None:
        """The metrics the newest wait on ``job`` kept with its log cursor; None without one."""
        from airflow_provider_tpu_rl.hooks.credentials import gcs_hook
        from airflow_provider_tpu_rl.maxtext.layout import parse_gs_uri

        bucket, prefix = parse_gs_uri(log_cursor_prefix(self.bucket, job) + "-")
        try:
            blobs = list(
                gcs_hook(self.gcp_conn_id, self.chain).get_conn().bucket(bucket).list_blobs(prefix=prefix)
            )
            if not blobs:
                return None
            newest = max(blobs, key=lambda blob: blob.updated or 0)
            metrics = json.loads(newest.download_as_bytes(timeout=60)).get("metrics")
        except Exception as err:  # the result stands without them
            self.log.warning("Could not read the metrics kept for job %s: %s", job, err)
            return None
        return metrics if isinstance(metrics, dict) else None

    def kept_metrics(self, plan: JobPlan, uri: str | None) -> dict[str, Any]:
        """The metrics the trigger kept in GCS with its cursor (``uri``; else the newest cursor of
        ``plan``'s job); none found: empty metrics."""
        metrics = None
        if uri:
            from airflow_provider_tpu_rl.hooks.credentials import gcs_hook
            from airflow_provider_tpu_rl.maxtext.layout import parse_gs_uri

            try:
                document = json.loads(gcs_hook(self.gcp_conn_id, self.chain).download(*parse_gs_uri(uri)))
                metrics = document.get("metrics")
            except Exception as err:  # the newest cursor of the job, then none: the result stands
                self.log.warning("Could not read the metrics kept in %s: %s", uri, err)
        if not isinstance(metrics, dict):
            metrics = self.saved_metrics(plan)
        return metrics if isinstance(metrics, dict) else TrainingLogTracker().metrics()

    def release_run_dir(
        self, plan: JobPlan, run: str, job: str, attempt: TrainingAttempt | None = None
    ) -> RunDirRecord | None:
        """The job ended: its claim on the directory goes, with the training ``attempt`` it made
        (never fails the task); the record."""
        try:
            return self.run_records().release(self.bucket, plan.run_dir, run=run, job=job, attempt=attempt)
        except Exception as err:  # the claim expires on its own; the result stands
            self.log.warning("Could not release the claim on %s: %s", plan.run_dir, err)
            return None

    def job_trigger(self, plan: JobPlan, run: str) -> JobSetTrigger:
        """The trigger that waits for ``plan``'s JobSet (also run in the worker when not deferring)."""
        from airflow_provider_tpu_rl.triggers.jobset import JobSetTrigger

        t = plan.target
        return JobSetTrigger(
            job_name=plan.name,
            project_id=t.project,
            location=t.location,
            cluster_name=t.cluster_name,
            gcp_conn_id=self.gcp_conn_id,
            impersonation_chain=self.chain,
            pathways=self.pathways,
            poll_interval=self.poll_interval,
            total_steps=plan.total_steps,
            job_timeout=self.job_timeout.total_seconds() if self.job_timeout else None,
            admission_timeout=self.admission_timeout.total_seconds(),
            cursor_prefix=None if plan.foreign else log_cursor_prefix(self.bucket, plan.name),
            cancel_on_kill=self.cancel_on_kill and not plan.foreign,
            run_dir=plan.run_dir,
            run_key=run,
            foreign=plan.foreign,
            on_other_writer="fail" if self.owns_output else "wait",
            keepalive=None
            if plan.foreign
            else {
                "bucket": self.bucket,
                "until_seconds": claim_seconds(),
                "claim": True,
                "lease_cluster": t.cluster_name,
            },
        )

    @fail_fast
    def execute(self, context: Context) -> dict[str, Any]:
        plan = self.plan(context)
        self._lineage = plan.lineage
        # Said before the first GCS and GKE calls: their clients' imports and the connection
        # lookups take seconds, which would otherwise be silent in the task log.
        self.log.info(
            "Job %s on cluster %s: looking for its output %s and for the job",
            plan.name,
            plan.target.cluster_name,
            plan.output_uri,
        )
        run = self.run_identity(context)
        context["ti"].xcom_push(key="job_name", value=plan.name)
        self._persist_links(context, plan)
        ready = self.output_ready(plan)
        record = self.run_records().read(self.bucket, plan.run_dir)
        if ready is not None and (not self.owns_output or record.owner == run):
            self.log.info(
                "Output %s is already complete%s: job %s is skipped, no TPU time spent",
                plan.output_uri,
                " (written by this run)" if self.owns_output else "",
                plan.name,
            )
            done = {"job_name": None, "skipped": True, "resumed_from": None, **ready}
            if self.owns_output:  # an earlier try's job: what its wait read from the log
                done.update(self.after_success(plan, {"metrics": self.saved_metrics(plan)}))
            return done
        # kubectl and gke-gcloud-auth-plugin: one line here, not gcluster's error after a retry
        self.hook.require_toolchain("jobs")
        if self.owns_output:
            self.check_resume(plan, record, run)
            if ready is not None:  # another run's complete output, resumed on purpose: adopted, said so
                claimed = self.run_records().claim(
                    self.bucket, plan.run_dir, run=run, settings=plan.settings, writer=None
                )
                previous = claimed.before(run) or "(a run not recorded)"
                self.log.warning(
                    "Resuming %s: its output %s is already complete, written by run %s; this run adopts "
                    "it (resumed_from=%s), no job submitted",
                    plan.run_dir,
                    plan.output_uri,
                    previous,
                    previous,
                )
                return {"job_name": None, "skipped": True, "resumed_from": previous, **ready}
        plan = self.claim_run_dir(context, plan, record, run)
        existing = self.submit_or_attach(plan)
        trigger = self.job_trigger(plan, run)
        from airflow_provider_tpu_rl.triggers.jobset import first_event

        finished = existing is not None and existing.state.finished
        if not self.deferrable or finished:
            if finished:
                assert existing is not None
                self.log.info("Job %s already %s: finishing in the worker", plan.name, existing.state.value)
            return self.execute_complete(context, asyncio.run(first_event(trigger)))
        # A job that ends seconds after deferring must not race the scheduler (see JobSetTrigger).
        trigger.not_before = time.time() + min_deferral_seconds()
        self.defer(trigger=trigger, method_name="execute_complete")
        raise AssertionError("defer() raises")  # pragma: no cover

    @fail_fast
    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        plan = self.plan(context)
        self._lineage = plan.lineage
        event = event or {}
        name = event.get("job_name") or plan.name
        status = event.get("status")
        run = self.run_identity(context)
        record = None
        if not event.get("foreign") and status in JOB_OVER:
            event = self.with_metrics(plan, event)
            # the job is over (a timed-out one: cancelled below)
            record = self.release_run_dir(plan, run, name, self.training_attempt(run, name, event))
        if status in {"success", "missing"}:
            ready = self.output_ready(plan)
            if ready is not None:
                if status == "missing":
                    self.log.info("Job %s is gone (JobSet TTL) but its output is complete: success", name)
                resumed_from = None
                if self.owns_output:
                    record = record or self.run_records().read(self.bucket, plan.run_dir)
                    resumed_from = record.before(run)
                return {
                    "job_name": name,
                    "skipped": False,
                    "resumed_from": resumed_from,
                    **ready,
                    **({"ran": event["ran"]} if event.get("ran") else {}),
                    **self.after_success(plan, event),
                    **self.attempts_of(record),
                }
            raise AirflowException(
                f"job {name} ended ({status}) but {plan.output_uri} is not complete: {event.get('message', '')}"
            )
        if status in ("conflict", "unadmitted"):  # the trigger deleted the job
            raise AirflowFailException(str(event.get("message")))
        if status == "timeout" and event.get("foreign"):
            # another run's conversion this task waited on: that run decides about its job
            raise AirflowFailException(f"job {name} of another run did not finish within {self.job_timeout}")
        if status == "timeout":
            t = plan.target
            self.log.error(
                "Job %s exceeded job_timeout=%s: cancelling it so it stops holding TPUs",
                name,
                self.job_timeout,
            )
            self.hook.cancel_job(name, t.project, t.cluster_name, t.location)
            raise AirflowFailException(
                f"job {name} did not finish within {self.job_timeout}; it was cancelled"
            )
        failure = event.get("failure") or {}
        if status == "failed" and failure.get("line"):
            message = f"job {name} failed: {failure['line']}"
        else:
            message = (
                f"job {name} {status or 'ended'}: {event.get('message', '')} (state {event.get('state')})"
            )
        if event.get("fatal"):  # the trigger met an error a retry cannot fix (connection, tool)
            raise AirflowFailException(message)
        if failure.get("kind") == "config":  # the workload's own error: a retry fails the same way
            raise AirflowFailException(f"{message} (the workload's own error: not retried)")
        raise AirflowException(message)

    def after_success(self, plan: JobPlan, event: dict[str, Any]) -> dict[str, Any]:
        return {}

    def with_metrics(self, plan: JobPlan, event: dict[str, Any]) -> dict[str, Any]:
        """``event`` with the job's metrics in it (a training's); others as they are."""
        return event

    def training_attempt(self, run: str, job: str, event: Mapping[str, Any]) -> TrainingAttempt | None:
        """What the ended job did as a training attempt (None: not a training)."""
        return None

    def attempts_of(self, record: RunDirRecord | None) -> dict[str, Any]:
        """The result's ``attempts``: every training attempt the run directory recorded."""
        return {}

    def on_kill(self) -> None:
        super().on_kill()
        if self._submitted and self.cancel_on_kill:
            name, project, cluster, location = self._submitted
            self.log.warning("Task killed: cancelling job %s", name)
            try:
                self.hook.cancel_job(name, project, cluster, location)
            except Exception:  # the kill must not raise
                self.log.exception("could not cancel job %s", name)


class MaxTextConvertOperator(_GclusterJobOperator):
    """Convert a Hugging Face checkpoint to MaxText (``to_maxtext``) as a CPU-only gcluster job.

    Skipped when the converted checkpoint is already complete in GCS (commit markers present):
    it depends only on the model, so any run may reuse it.

    Once the checkpoint is verified complete (converted now or reused), the task's ``outlets`` get
    an asset event (:func:`airflow_provider_tpu_rl.assets.emit_asset_events`): an ``Asset`` such as
    ``converted_checkpoint_asset(model)`` gets the ``extra`` below, an ``AssetAlias`` gets
    ``tpu-rl://converted-checkpoints/<model>`` added with it. ``extra``: ``run_id``, ``dag_id``,
    ``airflow_run_id``, ``model``, ``base_model``, ``checkpoint_uri`` (the conversion's folder),
    ``parameters_uri`` (its ``0/items/``), ``job_name``, ``reused`` and ``maxtext_release``.

    Takes the job arguments of :class:`_GclusterJobOperator`, plus:

    :param hf_model_path: HF repo id to convert; empty = the preset's.
    :param output_directory: where the checkpoint goes; empty = ``gs://BUCKET/<model>/max-text-format/``.
    """

    template_fields: Sequence[str] = (
        *_GclusterJobOperator.template_fields,
        "hf_model_path",
        "output_directory",
    )
    on_tpu = False
    job_kind = "convert"
    owns_output = False

    def __init__(
        self, *, hf_model_path: str | None = None, output_directory: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.hf_model_path = hf_model_path
        self.output_directory = output_directory
        self._emitted_for: int | None = None

    def execute(self, context: Context) -> dict[str, Any]:
        return self.emit_converted(context, super().execute(context))

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.emit_converted(context, super().execute_complete(context, event))

    def converted_extra(self, context: Context, result: Mapping[str, Any]) -> dict[str, Any]:
        """The converted checkpoint's asset event ``extra``: flat, no secret."""
        preset = self.preset()
        dag_id, run_id = self.run_ids(context)
        return {
            "run_id": f"{dag_id}/{run_id}",
            "dag_id": dag_id,
            "airflow_run_id": run_id,
            "model": str(self.model),
            "base_model": base_model_facts(str(self.model), self.hf_model_path or None).hub_id,
            "checkpoint_uri": run_dir(self.plan(context).output_uri),
            "parameters_uri": result.get("checkpoint_uri"),
            "job_name": result.get("job_name"),
            "reused": bool(result.get("skipped")),
            "maxtext_release": preset.maxtext_version,
        }

    def emit_converted(self, context: Context, result: dict[str, Any]) -> dict[str, Any]:
        """Emit the checkpoint's asset events once per try (``execute`` may finish in ``execute_complete``)."""
        if self._emitted_for == id(context):
            return result
        self._emitted_for = id(context)
        uri, extra = converted_checkpoint_asset_uri(str(self.model)), self.converted_extra(context, result)
        for line in emit_asset_events(context, self.outlets or (), uri, extra):
            self.log.info("Asset event: %s", line)
        leave_converted_event(context, extra)
        return result

    def plan(self, context: Context) -> JobPlan:
        preset = self.preset()
        conversion = gke_conversion(
            preset,
            bucket=self.bucket,
            hf_model_path=self.hf_model_path,
            output_directory=self.output_directory,
        )
        target, name = (
            self.on_run_cluster(self.target(preset), context),
            self.resolved_job_name(context, preset),
        )
        command = gke.conversion_job(target, name, conversion, self.token_resource())
        return JobPlan(
            target,
            name,
            command,
            conversion.output_directory,
            run_dir=run_dir(conversion.output_directory),
            settings={"model_name": conversion.model_name, "hf_model_path": conversion.hf_model_path or ""},
            lineage=conversion_lineage(conversion, machine=maxtext.TPU if target.tpu else maxtext.CPU),
        )

    def output_ready(self, plan: JobPlan) -> dict[str, Any] | None:
        return checkpoint_ready(
            self.gcp_conn_id,
            plan.output_uri,
            CONVERTED_CHECKPOINT_STEP,
            CONVERTED_CHECKPOINT_ITEMS,
            self.chain,
        )


class MaxTextExportOperator(_GclusterJobOperator):
    """Export a trained actor checkpoint to Hugging Face format (``to_huggingface``) as a gcluster job.

    Skipped when this run's export is already complete (its index lists shards that all exist);
    another run's complete export in the same folder is adopted only as a resume (``resumed_from``).

    Takes the job arguments of :class:`_GclusterJobOperator`, plus:

    :param run_name: the training run whose checkpoint is exported.
    :param checkpoint_step: the actor checkpoint step; empty = the preset's ``num_batches``.
    :param load_parameters_path: the parameters to export; empty =
        ``gs://BUCKET/<model>/trained/<run_name>/checkpoints/actor/<step>/model_params/``.
    :param output_directory: empty = ``gs://BUCKET/<model>/hf-trained/<run_name>/``.
    """

    template_fields: Sequence[str] = (
        *_GclusterJobOperator.template_fields,
        "run_name",
        "checkpoint_step",
        "load_parameters_path",
        "output_directory",
    )
    on_tpu = False
    job_kind = "export"

    def __init__(
        self,
        *,
        run_name: str,
        checkpoint_step: int | str | None = None,
        load_parameters_path: str | None = None,
        output_directory: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.run_name = run_name
        self.checkpoint_step = checkpoint_step
        self.load_parameters_path = load_parameters_path
        self.output_directory = output_directory

    def plan(self, context: Context) -> JobPlan:
        preset = self.preset()
        export = gke_export(
            preset,
            bucket=self.bucket,
            run_name=rules.match("run_name", self.run_name, rules.RUN_NAME, "run name like rl-1"),
            checkpoint_step=self.checkpoint_step,
            load_parameters_path=self.load_parameters_path,
            output_directory=self.output_directory,
        )
        target, name = (
            self.on_run_cluster(self.target(preset), context),
            self.resolved_job_name(context, preset),
        )
        command = gke.export_job(target, name, export, self.token_resource())
        return JobPlan(
            target,
            name,
            command,
            export.output_directory,
            run_dir=run_dir(export.output_directory),
            settings={"model_name": export.model_name, "load_parameters_path": export.load_parameters_path},
            lineage=export_lineage(
                export, machine=maxtext.TPU if target.tpu else maxtext.CPU, override_architecture=True
            ),
        )

    def output_ready(self, plan: JobPlan) -> dict[str, Any] | None:
        return export_ready(self.gcp_conn_id, plan.output_uri, self.chain)


class PathwaysRLTrainOperator(_GclusterJobOperator):
    """GRPO training on Pathways; progress and metrics parsed from MaxText's log lines go to XCom.

    Skipped when this run's final actor checkpoint is already complete in GCS. The run directory
    ``<base_output_directory>/<run_name>/`` belongs to the runs recorded for it: re-using a
    ``run_name`` resumes that run (same settings only), never silently; a live job of another run
    in it fails the task in one line (see the module docstring).

    Takes the job arguments of :class:`_GclusterJobOperator`, plus:

    :param run_name: MaxText ``run_name``: the run's folder under ``base_output_directory``.
        Re-using a run name resumes that run from its newest checkpoint (with the settings it
        started with; a complete one is adopted and reported as ``resumed_from``).
    :param num_batches: GRPO steps; empty = the preset's (50).
    :param train_overrides: extra MaxText ``key: value`` overrides, applied after the preset's.
    :param load_parameters_path: the parameters to start from; empty = the model's converted
        checkpoint ``gs://BUCKET/<model>/max-text-format/0/items/``.
    :param base_output_directory: empty = ``gs://BUCKET/<model>/trained/``.
    :param num_slices: TPU slices the job spans; empty = the preset's.
    :param workload_image_patched: ``image`` already holds the preset's start-up patches (built
        from ``docker/workload.Dockerfile``): the train command does not rewrite installed files.
        Refused with the stock ``tpu_post_training`` image.
    """

    template_fields: Sequence[str] = (
        *_GclusterJobOperator.template_fields,
        "run_name",
        "num_batches",
        "train_overrides",
        "load_parameters_path",
        "base_output_directory",
        "num_slices",
        "workload_image_patched",
    )
    pathways = True
    job_kind = "train"

    def __init__(
        self,
        *,
        run_name: str,
        num_batches: int | str | None = None,
        train_overrides: Mapping[str, Any] | None = None,
        load_parameters_path: str | None = None,
        base_output_directory: str | None = None,
        num_slices: int | str | None = None,
        workload_image_patched: bool | str = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.workload_image_patched = workload_image_patched
        self.run_name = run_name
        self.num_batches = num_batches
        self.train_overrides = train_overrides
        self.load_parameters_path = load_parameters_path
        self.base_output_directory = base_output_directory
        self.num_slices = num_slices

    def plan(self, context: Context) -> JobPlan:
        preset = self.preset()
        patched = rules.boolean("workload_image_patched", self.workload_image_patched)
        training = gke_training(
            preset,
            bucket=self.bucket,
            run_name=self.run_name,
            num_batches=self.num_batches,
            train_overrides=self.train_overrides,
            workload_image_patched=patched,
            load_parameters_path=self.load_parameters_path,
            base_output_directory=self.base_output_directory,
        )
        target = self.on_run_cluster(self.target(preset, self.num_slices), context)
        check_patched_image(target.image, patched)
        name = self.resolved_job_name(context, preset)
        command = gke.training_job(
            target, name, preset, training, self.token_resource(), pathways_gcs_location(self.bucket)
        )
        # What a resume must keep: everything MaxText trains with but the step count (raising
        # num_batches continues a finished run) and the run's own folder.
        settings = {
            "model_name": training.model_name,
            "load_parameters_path": training.load_parameters_path,
            **{key: str(value) for key, value in training.overrides if key != "num_batches"},
        }
        return JobPlan(
            target,
            name,
            command,
            training.actor_checkpoint_root,
            training.final_step,
            run_dir=run_dir(f"{training.base_output_directory.rstrip('/')}/{training.run_name}"),
            settings=settings,
            lineage=training_lineage(
                training,
                maxtext.program_argv(maxtext.TRAIN_RL, gke.train_rl_pairs(training), machine=maxtext.TPU),
            ),
        )

    def output_ready(self, plan: JobPlan) -> dict[str, Any] | None:
        return checkpoint_ready(
            self.gcp_conn_id, plan.output_uri, int(plan.total_steps or 0), ("model_params",), self.chain
        )

    def with_metrics(self, plan: JobPlan, event: dict[str, Any]) -> dict[str, Any]:
        if event.get("metrics"):
            return event
        return {**event, "metrics": self.kept_metrics(plan, event.get("metrics_uri"))}

    def training_attempt(self, run: str, job: str, event: Mapping[str, Any]) -> TrainingAttempt | None:
        return attempt_from_log(run, job, event.get("metrics") or {}, event.get("ran"))

    def displaced(self, held: WriterClaim, state: WriterState) -> TrainingAttempt | None:
        """The training the takeover ends: where its kept metrics and its log's tail say it got."""
        return displaced_attempt(held, state, self.job_metrics(held.job))

    def attempts_of(self, record: RunDirRecord | None) -> dict[str, Any]:
        attempts = record.attempts if record is not None else ()
        return {"attempts": [attempt.as_dict() for attempt in attempts]} if attempts else {}

    def after_success(self, plan: JobPlan, event: dict[str, Any]) -> dict[str, Any]:
        metrics = event.get("metrics") or self.kept_metrics(plan, event.get("metrics_uri"))
        evaluated = num_test_batches(plan.settings or {})
        self.log.info(
            "Training %s: final step %s/%s, %s; checkpoint %s%s/model_params/",
            plan.name,
            metrics.get("last_step"),
            plan.total_steps,
            reward_summary(metrics, evaluated),
            plan.output_uri,
            plan.total_steps,
        )
        return {"metrics": metrics, NUM_TEST_BATCHES_METRIC: evaluated}
