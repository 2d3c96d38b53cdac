"""MaxText workloads as gcluster jobs: conversion both ways and GRPO training on Pathways.

Each job name derives from the DAG run and the task, so a retry finds the job its first try
submitted and re-attaches instead of submitting a duplicate. Submission goes through gcluster;
the wait reads the JobSet and its log through the Kubernetes API (:class:`JobSetTrigger`), in the
triggerer when deferrable, else in the worker.

**Run identity.** A job writes one *run directory*: ``<base_output_directory>/<run_name>/`` for
training, the export folder for an export, the converted checkpoint's folder for a conversion.

* *Who wrote it*: training and export record the runs (``<dag_id>/<run_id>``) that wrote a run
  directory, in claim order, with the settings it was started with, in a small object
  ``gs://BUCKET/tpu-rl/run-dirs/<hash>.json`` (:class:`RunDirRecords`; written with GCS
  generation preconditions). "Already complete, skip" holds only for outputs this run wrote; a
  converted checkpoint depends only on the model, so any run's is reused.
* *Reusing a run_name on purpose resumes that run*: the job continues from the run directory's
  newest checkpoint, and a complete output of the earlier run is adopted, never silently: a
  warning names the run it came from and the result's ``resumed_from`` says so. A resume with
  other settings (a different ``learning_rate``, model or start checkpoint) is refused in one line.
* *Never two jobs on one directory*: before submitting, the operator lists the cluster's JobSets
  and finds those writing the same run directory (the ``tpu-rl.io/run-dir`` annotation it puts on
  every JobSet right after the submit, else the JobSet's MaxText arguments). A live one of this
  run is re-attached to; one of another run (or of an unknown one) makes the task fail in one
  line naming it. A conversion waits on another run's live conversion of the same model instead
  (the output is the same), without cancelling it on kill or timeout.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from airflow.providers.common.compat.sdk import Context

from airflow_provider_tpu_rl import timeouts
from airflow_provider_tpu_rl.compat import AirflowException, AirflowFailException, conf
from airflow_provider_tpu_rl.hooks.jobs import GclusterJob, JobState
from airflow_provider_tpu_rl.hooks.kubernetes import RUN_DIR_ANNOTATION, RUN_ID_ANNOTATION, run_dir
from airflow_provider_tpu_rl.links import CloudLoggingJobLink, GCSBrowserLink, GKEWorkloadLink
from airflow_provider_tpu_rl.maxtext.logs import TrainingLogTracker
from airflow_provider_tpu_rl.operators.base import GclusterBaseOperator, fail_fast
from airflow_provider_tpu_rl.render import gke
from airflow_provider_tpu_rl.render.command import Command
from airflow_provider_tpu_rl.spec import rules
from airflow_provider_tpu_rl.spec.cluster import GkeJobTarget
from airflow_provider_tpu_rl.spec.errors import SpecError
from airflow_provider_tpu_rl.spec.pipeline import (
    conversion_spec,
    converted_directory,
    default_job_name,
    export_directory,
    export_spec,
    hf_token_spec,
    pathways_gcs_location,
    secret_version,
    trained_directory,
    training_spec,
)
from airflow_provider_tpu_rl.spec.presets import POST_TRAINING_IMAGE, ModelPreset, get_preset
from airflow_provider_tpu_rl.spec.workloads import actor_params_path, check_patched_image

if TYPE_CHECKING:
    from airflow_provider_tpu_rl.hooks.kubernetes import ClusterAccess, RunDirJob
    from airflow_provider_tpu_rl.triggers.jobset import JobSetTrigger

GCS_TIMEOUT_S = 60.0
RUN_RECORD_ROUNDS = 5  # read-modify-write attempts of a run directory record under contention


def min_deferral_seconds() -> float:
    """``[tpu_rl] min_deferral_seconds``: the least time a job's trigger waits before firing."""
    return conf.getfloat("tpu_rl", "min_deferral_seconds", fallback=15.0)


def log_cursor_uri(bucket: str, job_name: str, jobset_uid: str) -> str:
    """Where the trigger keeps how far it relayed a JobSet's log (one object per JobSet)."""
    return f"gs://{bucket}/tpu-rl/log-cursors/{job_name}-{jobset_uid}.json"


def default_poll_interval() -> float:
    """Seconds between job-state polls: ``[tpu_rl] poll_interval`` in the Airflow config."""
    return conf.getfloat("tpu_rl", "poll_interval", fallback=60.0)


def default_deferrable() -> bool:
    """``[operators] default_deferrable``, as the google provider's operators read it."""
    return conf.getboolean("operators", "default_deferrable", fallback=False)


def checkpoint_ready(
    gcp_conn_id: str, root_uri: str, step: int, items: tuple[str, ...]
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
    result = run_probe_sync(gcs_hook(gcp_conn_id), bucket, probe_checkpoint(prefix, step, items))
    return (
        checkpoint_event_payload(bucket, result.state, items) if result.is_complete and result.state else None
    )


def export_ready(gcp_conn_id: str, export_uri: str) -> dict[str, Any] | None:
    """The sensor payload when ``export_uri`` holds a complete Hugging Face export, else None."""
    from airflow_provider_tpu_rl.hooks.credentials import gcs_hook
    from airflow_provider_tpu_rl.maxtext.layout import export_event_payload, parse_gs_uri, probe_hf_export
    from airflow_provider_tpu_rl.sensors.checkpoint import run_probe_sync

    bucket, prefix = parse_gs_uri(export_uri)
    result = run_probe_sync(gcs_hook(gcp_conn_id), bucket, probe_hf_export(prefix))
    return export_event_payload(bucket, prefix, result.status) if result.status.complete else None


def run_record_object(directory: str) -> str:
    """The object recording who wrote ``directory`` (one per run directory, in the run's bucket)."""
    return f"tpu-rl/run-dirs/{hashlib.sha256(run_dir(directory).encode()).hexdigest()[:24]}.json"


@dataclass(frozen=True)
class RunDirRecord:
    """Who wrote a run directory: ``runs`` (``<dag_id>/<run_id>``, first claim first, each once,
    the current writer last) and the ``settings`` it was started with."""

    directory: str
    runs: tuple[str, ...] = ()
    settings: Mapping[str, str] = field(default_factory=dict)
    generation: int = 0  # the GCS object's generation when read (0: no object)

    @property
    def owner(self) -> str | None:
        """The run that claimed the directory last (the one writing or that wrote it)."""
        return self.runs[-1] if self.runs else None

    def before(self, run: str) -> str | None:
        """The run that held the directory before ``run`` claimed it (None: ``run`` started it)."""
        if run not in self.runs:
            return self.owner
        index = self.runs.index(run)
        return self.runs[index - 1] if index else None

    def payload(self) -> str:
        return json.dumps(
            {
                "directory": self.directory,
                "runs": list(self.runs),
                "settings": dict(self.settings),
                "updated": datetime.now(UTC).isoformat(timespec="seconds"),
            },
            sort_keys=True,
        )


class RunDirRecords:
    """Reads and claims run directory records through the google provider's ``GCSHook``."""

    def __init__(self, gcp_conn_id: str) -> None:
        self.gcp_conn_id = gcp_conn_id
        self._client: Any = None

    def _blob(self, bucket: str, directory: str) -> Any:
        if self._client is None:
            from airflow_provider_tpu_rl.hooks.credentials import gcs_hook

            self._client = gcs_hook(self.gcp_conn_id).get_conn()
        return self._client.bucket(bucket).blob(run_record_object(directory))

    def read(self, bucket: str, directory: str) -> RunDirRecord:
        """The record of ``directory`` (an empty one, generation 0, when none exists)."""
        from google.api_core.exceptions import NotFound, PreconditionFailed

        for _ in range(RUN_RECORD_ROUNDS):
            blob = self._blob(bucket, directory)
            try:
                blob.reload(timeout=GCS_TIMEOUT_S)
                generation = int(blob.generation or 0)
                document = json.loads(
                    blob.download_as_bytes(if_generation_match=generation, timeout=GCS_TIMEOUT_S)
                )
            except NotFound:
                return RunDirRecord(run_dir(directory))
            except PreconditionFailed:
                continue  # rewritten between the two calls: read again
            except ValueError:  # not JSON: nobody's record, treat as unrecorded
                return RunDirRecord(run_dir(directory), generation=generation)
            return RunDirRecord(
                run_dir(directory),
                tuple(str(run) for run in document.get("runs") or []),
                {str(k): str(v) for k, v in (document.get("settings") or {}).items()},
                generation,
            )
        raise AirflowException(f"the record of {directory} keeps changing while it is read")

    def claim(self, bucket: str, directory: str, run: str, settings: Mapping[str, str]) -> RunDirRecord:
        """Make ``run`` the directory's current writer (the settings of its first claim stay)."""
        from google.api_core.exceptions import PreconditionFailed

        for _ in range(RUN_RECORD_ROUNDS):
            current = self.read(bucket, directory)
            if current.owner == run:
                return current
            wanted = replace(
                current,
                runs=(*(r for r in current.runs if r != run), run),
                settings=current.settings or dict(settings),
            )
            blob = self._blob(bucket, directory)
            try:
                blob.upload_from_string(
                    wanted.payload(),
                    content_type="application/json",
                    if_generation_match=current.generation,  # 0: only if it does not exist yet
                    timeout=GCS_TIMEOUT_S,
                )
            except PreconditionFailed:
                continue  # another run wrote it meanwhile: read again and decide again
            return replace(wanted, generation=int(blob.generation or 0))
        raise AirflowException(f"could not record run {run} as the writer of {directory}: it keeps changing")


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


class _GclusterJobOperator(GclusterBaseOperator):
    """Submit-or-attach a ``gcluster job``, defer while it runs, verify its output in GCS.

    :param project_id: project of the cluster.
    :param location: region of the cluster.
    :param cluster_name: the GKE cluster the job runs on.
    :param bucket: the bucket the model's folders are in (``gs://BUCKET/<model>/…``).
    :param model: model preset name (``qwen3-30b-a3b``, ``gemma4-26b``): MaxText model and defaults.
    :param image: workload image; empty = the preset's ``tpu_post_training`` image.
    :param compute_type: TPU machine type of the job's pods; empty = the preset's.
    :param topology: slice topology of the job's pods; empty = the preset's.
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
    )
    pathways = False
    job_kind = "convert"
    # Outputs owned by one run (training, export): "complete" counts only for the run that wrote
    # them; a conversion's output depends only on the model and is shared by every run.
    owns_output: ClassVar[bool] = True

    def __init__(
        self,
        *,
        project_id: str,
        location: str,
        cluster_name: str,
        bucket: str,
        model: str,
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
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
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
        self._submitted: tuple[str, str, str, str] | None = None

    # -- resolving the arguments (in execute: templates are rendered by then) ---------------------
    def preset(self) -> ModelPreset:
        preset = get_preset(self.model, "model")
        if preset.job_prefixes is None:
            raise SpecError(
                "model", f"{preset.model_name} is a single-host preset; it has no GKE jobs", self.model
            )
        return preset

    def target(self, preset: ModelPreset, num_slices: int = 1) -> GkeJobTarget:
        return GkeJobTarget(
            project=self.project_id,
            location=self.location,
            cluster_name=self.cluster_name,
            image=self.image or preset.image or POST_TRAINING_IMAGE,
            compute_type=self.compute_type or preset.compute_type,
            topology=self.topology or preset.topology,
            num_slices=num_slices,
        )

    def resolved_job_name(self, context: Context, preset: ModelPreset) -> str:
        if self.job_name:
            return rules.job_name("job_name", self.job_name)
        assert preset.job_prefixes is not None
        dag_id, run_id = self.run_ids(context)
        return default_job_name(getattr(preset.job_prefixes, self.job_kind), dag_id, run_id, self.task_id)

    def token_resource(self) -> str:
        token = hf_token_spec(self.hf_token_conn_id, self.hf_token_secret or None)
        return secret_version(rules.project_id("project_id", self.project_id), token.secret_id)

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

    def submit_or_attach(self, plan: JobPlan) -> str:
        """Submit the job unless this task's job already exists; a failed one is replaced.

        ``plan.foreign`` (another run's live conversion of the same model): only waited on.
        """
        t, name = plan.target, plan.name
        if plan.foreign:
            self.log.info("Waiting on job %s of another run: it writes the same %s", name, plan.run_dir)
            return "attached"
        existing = self._find(plan)
        if existing is not None and existing.state is JobState.FAILED:
            self.log.warning("Job %s failed in an earlier try; deleting it and submitting again", name)
            self.hook.cancel_job(name, t.project, t.cluster_name, t.location)
            existing = None
        if existing is None:
            self.log.info("Submitting job %s", name)
            with self.hook.job_session() as home:
                for auth in gke.docker_auth(t.location):
                    self.hook.run_checked(auth, job_home=home)
                self.hook.run_checked(plan.command, job_home=home)
            self._submitted = (name, t.project, t.cluster_name, t.location)
            return "submitted"
        self.log.info(
            "Job %s already exists (%s): re-attaching, nothing submitted", name, existing.state.value
        )
        self._submitted = (name, t.project, t.cluster_name, t.location)
        return "attached"

    # -- run identity (see the module docstring) ----------------------------------------------------
    def run_identity(self, context: Context) -> str:
        """``<dag_id>/<run_id>``: what the run directory record and the JobSet annotation hold."""
        dag_id, run_id = self.run_ids(context)
        return f"{dag_id}/{run_id}"

    def run_records(self) -> RunDirRecords:
        return RunDirRecords(self.gcp_conn_id)

    def _jobs_writing(self, plan: JobPlan, access: ClusterAccess) -> list[RunDirJob]:
        from airflow_provider_tpu_rl.hooks.kubernetes import JobSetClient

        async def listing() -> list[RunDirJob]:
            client = JobSetClient(access, self.gcp_conn_id)
            try:
                async with client.connection() as api:
                    return await client.writing(api, plan.run_dir)
            finally:
                await client.close()

        return asyncio.run(listing())

    def guard_run_dir(self, plan: JobPlan, access: ClusterAccess, run: str) -> JobPlan:
        """Never two jobs on one directory: the plan to follow, given the live JobSets writing
        ``plan.run_dir``. This task's own job (a retry) is left to :meth:`submit_or_attach`;
        another job of this run is re-attached to; another run's fails the task in one line
        (a conversion waits on it instead: same model, same output)."""
        for job in self._jobs_writing(plan, access):
            if not job.live or (job.name == plan.name and job.run_id in (None, run)):
                continue
            if job.run_id == run:
                self.log.warning(
                    "Job %s of this run already writes %s (%s): re-attaching to it instead of submitting %s",
                    job.name,
                    plan.run_dir,
                    job.state.value,
                    plan.name,
                )
                return replace(plan, name=job.name)
            if not self.owns_output:
                self.log.warning(
                    "Job %s of run %s is writing %s (%s): waiting for it instead of converting again",
                    job.name,
                    job.run_id or "(not recorded)",
                    plan.run_dir,
                    job.state.value,
                )
                return replace(plan, name=job.name, foreign=True)
            owner = f"run {job.run_id}" if job.run_id else "a run not recorded on the JobSet"
            raise AirflowFailException(
                f"{plan.run_dir} is being written by job {job.namespace}/{job.name} of {owner} "
                f"({job.state.value}); never two jobs on one directory: wait for it to end or cancel it "
                f"(gcluster job cancel {job.name}), or choose another run_name"
            )
        return plan

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

    def record_on_jobset(self, plan: JobPlan, access: ClusterAccess, run: str) -> None:
        """Annotate this task's JobSet with the run directory and run (``gcluster job submit`` has
        no flag for it); a JobSet already annotated is left alone. Never fails the task: without
        the annotation the JobSet is still judged by its command line."""
        from airflow_provider_tpu_rl.hooks.kubernetes import JobSetClient

        async def annotate() -> None:
            client = JobSetClient(access, self.gcp_conn_id)
            try:
                async with client.connection() as api:
                    found = await client.find(api, plan.name)
                    if found is None:
                        return
                    metadata = found.get("metadata") or {}
                    annotations = metadata.get("annotations") or {}
                    if annotations.get(RUN_DIR_ANNOTATION) and annotations.get(RUN_ID_ANNOTATION):
                        return
                    await client.annotate(
                        api,
                        str(metadata.get("namespace") or "default"),
                        plan.name,
                        {RUN_DIR_ANNOTATION: plan.run_dir, RUN_ID_ANNOTATION: run},
                    )
            finally:
                await client.close()

        try:
            asyncio.run(annotate())
        except Exception as err:  # the job runs either way
            self.log.warning("Could not annotate JobSet %s with its run directory: %s", plan.name, err)

    def cluster_access(self, plan: JobPlan) -> ClusterAccess:
        """The cluster's Kubernetes API URL and CA, from the GKE API (in the worker)."""
        from airflow_provider_tpu_rl.hooks.kubernetes import GkeClusterHook

        t = plan.target
        return GkeClusterHook(self.gcp_conn_id, t.location).cluster_access(t.cluster_name, t.project)

    def job_trigger(self, plan: JobPlan, access: ClusterAccess) -> JobSetTrigger:
        """The trigger that waits for ``plan``'s JobSet (also run in the worker when not deferring)."""
        from airflow_provider_tpu_rl.triggers.jobset import JobSetTrigger

        return JobSetTrigger(
            job_name=plan.name,
            cluster_url=access.url,
            ssl_ca_cert=access.ca_cert,
            gcp_conn_id=self.gcp_conn_id,
            pathways=self.pathways,
            poll_interval=self.poll_interval,
            total_steps=plan.total_steps,
            deadline=time.time() + self.job_timeout.total_seconds() if self.job_timeout else None,
            cancel_on_kill=self.cancel_on_kill and not plan.foreign,
        )

    @fail_fast
    def execute(self, context: Context) -> dict[str, Any]:
        plan = self.plan(context)
        run = self.run_identity(context)
        context["ti"].xcom_push(key="job_name", value=plan.name)
        self._persist_links(context, plan)
        ready = self.output_ready(plan)
        record = self.run_records().read(self.bucket, plan.run_dir) if self.owns_output else None
        if ready is not None and (record is None or record.owner == run):
            self.log.info(
                "Output %s is already complete%s: job %s is skipped, no TPU time spent",
                plan.output_uri,
                "" if record is None else " (written by this run)",
                plan.name,
            )
            return {"job_name": None, "skipped": True, "resumed_from": None, **ready}
        # kubectl and gke-gcloud-auth-plugin: one line here, not gcluster's error after a retry
        self.hook.require_toolchain("jobs")
        access = self.cluster_access(plan)
        planned = plan.name
        plan = self.guard_run_dir(plan, access, run)
        if plan.name != planned:  # re-attached to another job writing the same directory
            context["ti"].xcom_push(key="job_name", value=plan.name)
        if record is not None:
            self.check_resume(plan, record, run)
            if ready is not None:  # another run's complete output, resumed on purpose: adopted, said so
                claimed = self.run_records().claim(self.bucket, plan.run_dir, run, plan.settings)
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
            claimed = self.run_records().claim(self.bucket, plan.run_dir, run, plan.settings)
            if claimed.before(run):
                self.log.warning(
                    "Resuming %s, started by run %s: the job continues from its newest checkpoint",
                    plan.run_dir,
                    claimed.before(run),
                )
        self.submit_or_attach(plan)
        if not plan.foreign:
            self.record_on_jobset(plan, access, run)
        trigger = self.job_trigger(plan, access)
        from airflow_provider_tpu_rl.triggers.jobset import first_event

        state = asyncio.run(trigger.probe())  # also finds the JobSet's namespace, uid and creation
        if trigger.jobset_uid:
            trigger.cursor_uri = log_cursor_uri(self.bucket, plan.name, trigger.jobset_uid)
        if self.job_timeout and trigger.jobset_created is not None:
            # job_timeout counts from the job's creation: a retry re-attaching gets the same deadline
            trigger.deadline = trigger.jobset_created + self.job_timeout.total_seconds()
        if not self.deferrable or (state is not None and state.finished):
            if state is not None and state.finished:
                self.log.info("Job %s already %s: finishing in the worker", plan.name, state.value)
            return self.execute_complete(context, asyncio.run(first_event(trigger)))
        # A job that ends seconds after deferring must not race the scheduler (see JobSetTrigger).
        trigger.not_before = time.time() + min_deferral_seconds()
        self.defer(trigger=trigger, method_name="execute_complete")
        raise AssertionError("defer() raises")  # pragma: no cover

    @fail_fast
    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> dict[str, Any]:
        plan = self.plan(context)
        event = event or {}
        name = event.get("job_name") or plan.name
        status = event.get("status")
        if status in {"success", "missing"}:
            ready = self.output_ready(plan)
            if ready is not None:
                if status == "missing":
                    self.log.info("Job %s is gone (JobSet TTL) but its output is complete: success", name)
                resumed_from = None
                if self.owns_output:
                    record = self.run_records().read(self.bucket, plan.run_dir)
                    resumed_from = record.before(self.run_identity(context))
                return {
                    "job_name": name,
                    "skipped": False,
                    "resumed_from": resumed_from,
                    **ready,
                    **self.after_success(plan, event),
                }
            raise AirflowException(
                f"job {name} ended ({status}) but {plan.output_uri} is not complete: {event.get('message', '')}"
            )
        if status == "timeout" and name != plan.name and not self.owns_output:
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
        message = f"job {name} {status or 'ended'}: {event.get('message', '')} (state {event.get('state')})"
        if event.get("fatal"):  # the trigger met an error a retry cannot fix (connection, tool)
            raise AirflowFailException(message)
        raise AirflowException(message)

    def after_success(self, plan: JobPlan, event: dict[str, Any]) -> dict[str, Any]:
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

    Takes the job arguments of :class:`_GclusterJobOperator`, plus:

    :param hf_model_path: HF repo id to convert; empty = the preset's.
    :param output_directory: where the checkpoint goes; empty = ``gs://BUCKET/<model>/max-text-format/``.
    """

    template_fields: Sequence[str] = (
        *_GclusterJobOperator.template_fields,
        "hf_model_path",
        "output_directory",
    )
    job_kind = "convert"
    owns_output = False

    def __init__(
        self, *, hf_model_path: str | None = None, output_directory: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.hf_model_path = hf_model_path
        self.output_directory = output_directory

    def plan(self, context: Context) -> JobPlan:
        preset = self.preset()
        conversion = conversion_spec(
            preset,
            self.output_directory or converted_directory(self.bucket, preset.model_name),
            self.hf_model_path or None,
        )
        target, name = self.target(preset), self.resolved_job_name(context, preset)
        command = gke.conversion_job(target, name, conversion, self.token_resource())
        return JobPlan(
            target,
            name,
            command,
            conversion.output_directory,
            run_dir=run_dir(conversion.output_directory),
            settings={"model_name": conversion.model_name, "hf_model_path": conversion.hf_model_path or ""},
        )

    def output_ready(self, plan: JobPlan) -> dict[str, Any] | None:
        return checkpoint_ready(self.gcp_conn_id, plan.output_uri, 0, ("items",))


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
        run_name = rules.match("run_name", self.run_name, rules.RUN_NAME, "run name like rl-1")
        step = (
            preset.num_batches
            if self.checkpoint_step in (None, "")
            else rules.integer("checkpoint_step", self.checkpoint_step, 1)
        )
        load = self.load_parameters_path or (
            actor_params_path(trained_directory(self.bucket, preset.model_name), run_name, step) + "/"
        )
        export = export_spec(
            preset,
            load_parameters_path=load,
            output_directory=self.output_directory
            or export_directory(self.bucket, preset.model_name, run_name),
            on_cluster=True,
        )
        target, name = self.target(preset), self.resolved_job_name(context, preset)
        command = gke.export_job(target, name, export, self.token_resource())
        return JobPlan(
            target,
            name,
            command,
            export.output_directory,
            run_dir=run_dir(export.output_directory),
            settings={"model_name": export.model_name, "load_parameters_path": export.load_parameters_path},
        )

    def output_ready(self, plan: JobPlan) -> dict[str, Any] | None:
        return export_ready(self.gcp_conn_id, plan.output_uri)


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
        model = preset.model_name
        patched = rules.boolean("workload_image_patched", self.workload_image_patched)
        training = training_spec(
            preset,
            run_name=self.run_name,
            base_output_directory=self.base_output_directory or trained_directory(self.bucket, model),
            load_parameters_path=self.load_parameters_path
            or converted_directory(self.bucket, model) + "0/items/",
            num_batches=None
            if self.num_batches in (None, "")
            else rules.integer("num_batches", self.num_batches, 1),
            train_overrides=self.train_overrides or {},
            workload_image_patched=patched,
        )
        slices = preset.num_slices if self.num_slices in (None, "") else self.num_slices
        target = self.target(preset, rules.integer("num_slices", slices, 1, 64))
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
        )

    def output_ready(self, plan: JobPlan) -> dict[str, Any] | None:
        return checkpoint_ready(
            self.gcp_conn_id, plan.output_uri, int(plan.total_steps or 0), ("model_params",)
        )

    def after_success(self, plan: JobPlan, event: dict[str, Any]) -> dict[str, Any]:
        metrics = event.get("metrics") or TrainingLogTracker().metrics()
        pre, post = metrics.get("pre") or {}, metrics.get("post") or {}
        self.log.info(
            "Training %s: final step %s/%s, mean reward before %s, after %s; checkpoint %s%s/model_params/",
            plan.name,
            metrics.get("last_step"),
            plan.total_steps,
            pre.get("mean_reward", "-"),
            post.get("mean_reward", "-"),
            plan.output_uri,
            plan.total_steps,
        )
        return {"metrics": metrics}
