"""``JobSetTrigger``: wait for a gcluster job's JobSet to end, relaying its workload log line by line.

Everything goes through the Kubernetes API (:mod:`airflow_provider_tpu_rl.hooks.kubernetes`) with
the GCP connection's token: the triggerer starts no process and needs no binary.

* **State** from the JobSet object, every ``poll_interval`` (gcluster's own status rules).
* **Log**: only the container that prints MaxText's progress (the Pathways head pod's
  ``workload-container``; job 0's container otherwise) is followed, with timestamps, from its
  start. A :class:`~airflow_provider_tpu_rl.hooks.kubernetes.LogCursor` (the last line's time and
  how many lines had it) is kept with the training metrics in a small JSON object in GCS
  (``cursor_uri``), saved before each batch of lines (every few seconds) is relayed and when the
  trigger stops; a trigger that starts again (triggerer restart, task retry, the operator's
  in-worker wait, even after a crash) reads from ``sinceTime`` and
  drops what it already relayed, so no line is lost or repeated.
* **What the worker no longer waits for** (it submits and defers at once): the trigger asks the
  GKE API for the cluster's endpoint (``project_id``/``location``/``cluster_name``), computes the
  deadline from the JobSet's creation (``job_timeout``), records the run directory and run on the
  JobSet (annotations, since ``gcluster job submit`` has no flag for them), and checks that no
  other live JobSet of the cluster writes the same directory: a job submitted outside this
  provider makes the trigger delete its own job and fail (``on_other_writer="fail"``), or, for a
  conversion whose output is shared, wait on that job instead (``"wait"``).
* **Claims outlive the work**: while the job runs, the run directory's writer claim and the
  cluster's lease are renewed (``keepalive``), so neither expires under a long training.
* **No early fire**: the event is held until ``not_before`` (the operator sets it a short while
  after deferring), so a job that ends in seconds does not race the scheduler's handling of the
  deferral (apache/airflow#71580, #72716).
* **Kill**: when a user kills the deferred task, the JobSet is deleted (``cancel_on_kill``):
  ``on_kill`` on Airflow 3.3+, ``safe_to_cancel`` before it, as the google provider's Dataproc
  trigger does; a triggerer restart never cancels the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_tpu_rl.compat import AIRFLOW_V_3_0_PLUS, AIRFLOW_V_3_3_PLUS, conf
from airflow_provider_tpu_rl.exceptions import ConfigurationError, FailureKind, KubernetesApiError
from airflow_provider_tpu_rl.hooks.kubernetes import (
    MAIN_JOB,
    PATHWAYS_HEAD_JOB,
    RUN_DIR_ANNOTATION,
    RUN_ID_ANNOTATION,
    ClusterAccess,
    JobSetClient,
    LogCursor,
    accelerator_start,
    container_phase,
    head_pod,
    jobset_state,
    pod_disruption,
    rfc3339_seconds,
    split_timestamp,
    waiting_for,
    workload_container,
)
from airflow_provider_tpu_rl.maxtext.logs import TrainingLogTracker
from airflow_provider_tpu_rl.toolchain.failures import classify_workload
from airflow_provider_tpu_rl.toolchain.job_output import JobState

# Airflow 3's triggerer sends each record of a trigger to its supervisor over a socket, which the
# supervisor reads 4 KiB per turn of its loop (sdk/execution_time/supervisor.py,
# make_buffered_socket_reader; jobs/triggerer_job_runner.py, run_once), each record carrying ~350
# bytes of task context; once the trigger has ended, the records still unread go to the
# triggerer's own log, not the task's (_handle_request drops the trigger's log file on
# TriggerStateChanges.finished, _process_log_messages_from_subprocess falls back): read in
# apache-airflow 3.3.2's source, direct; apache/airflow#66158 reports lines lost on a busy
# triggerer. Hence one record per batch of lines, and a pause after the last one.
LOG_SETTLE_SECONDS = 2.0  # default of [tpu_rl] trigger_log_settle_seconds
TAIL_LINES = 200  # workload lines kept to tell why a failed job failed
CURSOR_SAVE_SECONDS = 2.0  # GCS allows about one write per second to one object
FOLLOW_DRAIN_SECONDS = 30.0  # after the job ends, time for the follower to read the last lines
FOLLOW_RETRY_SECONDS = 5.0  # a pod not started yet, or a dropped stream: try again after this
STORAGE_TIMEOUT = 60


async def reap_cancelled(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` (a child this trigger started) and wait for its end, whatever it raises,
    while a cancellation of the waiting task itself still propagates.

    Neither ``suppress(CancelledError)`` around the await (which also swallows the waiter's own
    cancellation) nor Python 3.11's ``asyncio.wait_for`` (which returns a result that arrives in
    the same loop turn as the cancellation: CPython gh-86296) is used anywhere in this trigger: a
    lost cancellation keeps a killed task's JobSet training (tests/triggers/test_jobset_cancellation.py).
    """
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except Exception:  # noqa: S110 - the child's own failure is not the waiter's
        pass


def relayed_record(job_name: str, lines: list[str]) -> str:
    """The task-log record of one batch of relayed lines: each line as ``[job] text``."""
    return "\n".join(f"[{job_name}] {line}" for line in lines)


def log_settle_seconds() -> float:
    """``[tpu_rl] trigger_log_settle_seconds``: how long a trigger waits after its last relayed
    lines before it fires, so the triggerer writes them to the task log first (0: no wait)."""
    return conf.getfloat("tpu_rl", "trigger_log_settle_seconds", fallback=LOG_SETTLE_SECONDS)


class JobSetTrigger(BaseTrigger):
    """Polls the JobSet ``job_name`` until it ends; yields exactly one event.

    The event: ``status`` (``success`` | ``failed`` | ``missing`` | ``timeout`` | ``error``),
    ``job_name``, ``state`` (last JobSet state or None), ``message``, ``fatal`` (an ``error`` a retry
    cannot fix: credentials, permissions), ``log_lines`` (workload lines relayed so far, over every
    trigger of this job) and ``metrics`` (training jobs: what MaxText's lines said; None when they
    are kept in GCS with the cursor, ``metrics_uri``: the triggerer logs every event whole, and the
    metrics are kilobytes, so the event stays a few hundred bytes). A JobSet absent
    ``missing_confirmations`` polls in a row (garbage-collected after its TTL) is ``missing``: the
    operator decides by the job's output.

    :param job_name: the JobSet (gcluster job) name.
    :param cluster_url: ``https://<endpoint>`` of the cluster's Kubernetes API; None = asked from
        the GKE API for ``project_id``/``location``/``cluster_name``.
    :param ssl_ca_cert: the cluster CA (base64 PEM, as the GKE API gives it), with ``cluster_url``.
    :param gcp_conn_id: the GCP connection whose token the cluster accepts; also writes the cursor.
    :param impersonation_chain: service account(s) to impersonate.
    :param namespace: the JobSet's namespace; None = found by its ``gcluster.google.com/workload`` label.
    :param pathways: a Pathways job (follow the head pod's ``workload-container``).
    :param poll_interval: seconds between JobSet reads.
    :param total_steps: training jobs: parse MaxText's lines, log "step N/M", report metrics.
    :param deadline: epoch seconds; a job still running then ends the wait with ``timeout``.
        None = ``job_timeout`` after the JobSet's creation (the same on every retry).
    :param not_before: epoch seconds before which no event is fired.
    :param cursor_uri: ``gs://`` object keeping the log cursor and metrics; None = not kept, or
        ``<cursor_prefix>-<JobSet uid>.json`` when ``cursor_prefix`` is given.
    :param cancel_on_kill: delete the JobSet when the user kills the deferred task.
    :param follow_logs: relay the workload log to the task log.
    :param missing_confirmations: polls without the JobSet before reporting ``missing``.
    :param max_consecutive_errors: transient API failures tolerated in a row.
    :param project_id: the cluster's project (with ``location`` and ``cluster_name``).
    :param location: the cluster's region or zone.
    :param cluster_name: the GKE cluster.
    :param job_timeout: seconds from the JobSet's creation to its deadline (when no ``deadline``).
    :param cursor_prefix: ``gs://…/<job>``: the cursor object is this plus ``-<JobSet uid>.json``.
    :param run_dir: the directory the job writes; with ``run_key``, recorded on the JobSet and checked
        against the other JobSets of the cluster (``on_other_writer``).
    :param run_key: ``<dag_id>/<run_id>`` of the task that submitted the job.
    :param foreign: another run's job this task only waits on (nothing recorded, nothing renewed).
    :param on_other_writer: another live JobSet writes ``run_dir``: ``fail`` (delete this job and
        end with ``conflict``) or ``wait`` (delete this job and wait on that one).
    :param admission_timeout: seconds from the JobSet's creation within which a pod of it must
        be on a node; past it, a job Kueue still holds suspended or whose pods no node takes is
        deleted and the wait ends with ``unadmitted`` and one line on what it waited for. None =
        no bound (the job's ``deadline`` still applies).
    :param keepalive: ``{"bucket", "until_seconds", "claim": bool, "lease_cluster": str | None}``:
        every ``until_seconds / 3`` while the job runs, push the run directory's writer claim and
        the cluster's lease (when this run holds them) to ``until_seconds`` from now.
    """

    def __init__(
        self,
        job_name: str,
        cluster_url: str | None = None,
        ssl_ca_cert: str | None = None,
        gcp_conn_id: str = "google_cloud_default",
        impersonation_chain: str | list[str] | None = None,
        namespace: str | None = None,
        pathways: bool = False,
        poll_interval: float = 60.0,
        total_steps: int | None = None,
        deadline: float | None = None,
        not_before: float | None = None,
        cursor_uri: str | None = None,
        cancel_on_kill: bool = True,
        follow_logs: bool = True,
        missing_confirmations: int = 2,
        max_consecutive_errors: int = 5,
        project_id: str | None = None,
        location: str | None = None,
        cluster_name: str | None = None,
        job_timeout: float | None = None,
        cursor_prefix: str | None = None,
        run_dir: str | None = None,
        run_key: str | None = None,
        foreign: bool = False,
        on_other_writer: str = "fail",
        keepalive: dict[str, Any] | None = None,
        admission_timeout: float | None = None,
    ) -> None:
        super().__init__()
        if cluster_url is None and not (project_id and location and cluster_name):
            raise ValueError("JobSetTrigger needs cluster_url or project_id, location and cluster_name")
        if on_other_writer not in ("fail", "wait"):
            raise ValueError(f"on_other_writer must be 'fail' or 'wait', not {on_other_writer!r}")
        self.project_id = project_id
        self.location = location
        self.cluster_name = cluster_name
        self.job_timeout = job_timeout
        self.cursor_prefix = cursor_prefix
        self.run_dir = run_dir
        self.run_key = run_key
        self.foreign = foreign
        self.on_other_writer = on_other_writer
        self.keepalive = keepalive
        self.admission_timeout = admission_timeout
        self.job_name = job_name
        self.cluster_url = cluster_url
        self.ssl_ca_cert = ssl_ca_cert
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = impersonation_chain
        self.namespace = namespace
        self.pathways = pathways
        self.poll_interval = poll_interval
        self.total_steps = total_steps
        self.deadline = deadline
        self.not_before = not_before
        self.cursor_uri = cursor_uri
        self.cancel_on_kill = cancel_on_kill
        self.follow_logs = follow_logs
        self.missing_confirmations = max(1, missing_confirmations)
        self.max_consecutive_errors = max(1, max_consecutive_errors)
        self._cursor = LogCursor()
        self._tracker = TrainingLogTracker()
        self._saved_at = 0.0
        self._version = 0  # bumped by every change of the cursor or the metrics
        self._saved_version = 0
        self._save_lock = asyncio.Lock()
        self._pending: list[str] = []  # lines counted into the cursor, not relayed yet
        self._pending_since = 0.0
        self._relayed_at: float | None = None  # when lines last went to the log (monotonic)
        self._loaded = False
        self.jobset_uid: str | None = None  # seen by job_state(); not part of the serialized state
        self.jobset_created: float | None = None  # its creationTimestamp (epoch seconds), likewise
        self.jobset_completed: str | None = None  # its completion time (RFC 3339), likewise
        self._jobsets: JobSetClient | None = None
        self._follower: asyncio.Task[None] | None = None
        self._session: Any = None
        self._storage: Any = None
        self._first_seen = False  # the JobSet was seen once: deadline, cursor, record, writers
        self._kept_alive_at = 0.0
        self._follower_reading = False
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)  # the last lines relayed: why a job failed
        self._log_ended = asyncio.Event()  # the followed container ended: poll the state now
        self._quick_delay = 0.25
        self._started = False  # a pod of the job was seen on a node: the admission bound is met

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job_name": self.job_name,
                "cluster_url": self.cluster_url,
                "ssl_ca_cert": self.ssl_ca_cert,
                "gcp_conn_id": self.gcp_conn_id,
                "impersonation_chain": self.impersonation_chain,
                "namespace": self.namespace,
                "pathways": self.pathways,
                "poll_interval": self.poll_interval,
                "total_steps": self.total_steps,
                "deadline": self.deadline,
                "not_before": self.not_before,
                "cursor_uri": self.cursor_uri,
                "cancel_on_kill": self.cancel_on_kill,
                "follow_logs": self.follow_logs,
                "missing_confirmations": self.missing_confirmations,
                "max_consecutive_errors": self.max_consecutive_errors,
                "project_id": self.project_id,
                "location": self.location,
                "cluster_name": self.cluster_name,
                "job_timeout": self.job_timeout,
                "cursor_prefix": self.cursor_prefix,
                "run_dir": self.run_dir,
                "run_key": self.run_key,
                "foreign": self.foreign,
                "on_other_writer": self.on_other_writer,
                "keepalive": self.keepalive,
                "admission_timeout": self.admission_timeout,
            },
        )

    def client(self) -> JobSetClient:
        """The Kubernetes API client of this trigger (opened once per run, see :meth:`close`);
        :meth:`resolve_cluster` first when the trigger was given the cluster's name only."""
        if self._jobsets is None:
            if self.cluster_url is None or self.ssl_ca_cert is None:
                raise ConfigurationError(f"the cluster of job {self.job_name} is not resolved")
            self._jobsets = JobSetClient(
                ClusterAccess(self.cluster_url, self.ssl_ca_cert), self.gcp_conn_id, self.impersonation_chain
            )
        return self._jobsets

    async def resolve_cluster(self) -> None:
        """The cluster's endpoint and CA from the GKE API (in a thread: a blocking client)."""
        if self.cluster_url is not None and self.ssl_ca_cert is not None:
            return
        from airflow_provider_tpu_rl.hooks.kubernetes import GkeClusterHook

        assert self.location is not None
        assert self.cluster_name is not None
        assert self.project_id is not None
        hook = GkeClusterHook(self.gcp_conn_id, self.location, self.impersonation_chain)
        access = await asyncio.to_thread(hook.cluster_access, self.cluster_name, self.project_id)
        self.cluster_url, self.ssl_ca_cert = access.url, access.ca_cert

    async def close(self) -> None:
        """Close the Kubernetes and GCS clients."""
        jobsets, self._jobsets = self._jobsets, None
        if jobsets is not None:
            await jobsets.close()
        session, self._session, self._storage = self._session, None, None
        if session is not None:
            with contextlib.suppress(Exception):
                await session.close()

    async def _storage_client(self) -> Any:
        """The GCS client for the cursor, made once: saving it on cancel needs no connection lookup."""
        if self._storage is None:
            from aiohttp import ClientSession

            self._session = ClientSession()
            self._storage = await self._storage_hook().get_storage_client(self._session)
        return self._storage

    # -- the cursor in GCS -------------------------------------------------------------------------
    def _storage_hook(self) -> Any:
        from airflow.providers.google.cloud.hooks.gcs import GCSAsyncHook

        from airflow_provider_tpu_rl.hooks.credentials import shared_hook_class

        class _AsyncHook(GCSAsyncHook):  # its token from this process's shared credentials
            sync_hook_class = shared_hook_class(GCSAsyncHook.sync_hook_class)

        return _AsyncHook(gcp_conn_id=self.gcp_conn_id, impersonation_chain=self.impersonation_chain)

    def _cursor_location(self) -> tuple[str, str] | None:
        if not self.cursor_uri:
            return None
        from airflow_provider_tpu_rl.maxtext.layout import parse_gs_uri

        return parse_gs_uri(self.cursor_uri)

    async def _load_cursor(self) -> None:
        """Read the cursor and the metrics an earlier trigger of this job kept; none is fine."""
        self._loaded = True
        location = self._cursor_location()
        if location is None:
            return
        from aiohttp import ClientResponseError

        try:
            storage = await self._storage_client()
            raw = await storage.download(*location, timeout=STORAGE_TIMEOUT)
            document = json.loads(raw)
        except ClientResponseError as err:
            if err.status != 404:
                self.log.warning("Could not read the log cursor %s: %s", self.cursor_uri, err)
            return
        except Exception as err:  # a lost cursor means repeated lines, never a failed wait
            self.log.warning("Could not read the log cursor %s: %s", self.cursor_uri, err)
            return
        self._cursor = LogCursor.from_dict(document.get("cursor"))
        self._tracker = TrainingLogTracker.restore(document.get("metrics"))
        if self._cursor.lines:
            self.log.info(
                "Resuming the log of %s after %d lines already relayed", self.job_name, self._cursor.lines
            )

    async def _save_cursor(self, force: bool = False) -> None:
        """Save the cursor and metrics as they are now. One save at a time (the follower and the
        state loop both save): a slower, older upload never lands after a newer one."""
        async with self._save_lock:
            location = self._cursor_location()
            if location is None or self._saved_version == self._version:
                return
            if not force and time.monotonic() - self._saved_at < CURSOR_SAVE_SECONDS:
                return
            version = self._version
            document = {"cursor": self._cursor.as_dict(), "metrics": self._tracker.metrics()}
            try:
                storage = await self._storage_client()
                async with asyncio.timeout(STORAGE_TIMEOUT):  # never wait_for: see reap_cancelled
                    await storage.upload(
                        *location,
                        json.dumps(document),
                        content_type="application/json",
                        timeout=STORAGE_TIMEOUT,
                    )
            except Exception as err:
                self.log.warning("Could not save the log cursor %s: %s", self.cursor_uri, err)
                return
            self._saved_at = time.monotonic()
            self._saved_version = version

    # -- the log -----------------------------------------------------------------------------------
    async def _relay(self, raw: str) -> None:
        """One line of the followed container, unless seen: counted into the cursor now, relayed
        with the next :meth:`_flush` (at most :data:`CURSOR_SAVE_SECONDS` later)."""
        parsed = split_timestamp(raw)
        nanos, text = parsed if parsed is not None else (self._cursor.last_nanos, raw)
        if not self._cursor.accept(nanos):
            return
        self._version += 1
        if not self._pending:
            self._pending_since = time.monotonic()
        self._pending.append(text)
        if time.monotonic() - self._pending_since >= CURSOR_SAVE_SECONDS:
            await self._flush()

    async def _flush(self, due_only: bool = False) -> None:
        """Relay the lines counted so far: the cursor (and the metrics they carry) is saved first,
        then they go to the task log, as one record (see :func:`relayed_record`). A trigger killed
        between the two has lost those lines from the log (they are in the metrics); one that
        starts again never relays a line twice. ``due_only``: not before the oldest line waited
        :data:`CURSOR_SAVE_SECONDS` (the state loop's flush: lines still coming join the batch)."""
        if due_only and self._pending and time.monotonic() - self._pending_since < CURSOR_SAVE_SECONDS:
            return
        batch, self._pending = self._pending, []
        if not batch:
            await self._save_cursor()
            return
        shown: list[str] = []  # the batch, each step's progress after its line
        for text in batch:
            shown.append(text)
            if self.total_steps is not None:
                before = self._tracker.last_step
                self._tracker.feed(text)
                if self._tracker.last_step is not None and self._tracker.last_step != before:
                    shown.append(f"progress: {self._tracker.progress_text(self.total_steps)}")
        self._version += 1  # the metrics changed (the cursor may have been saved without them)
        await self._save_cursor(force=True)
        self._tail.extend(batch)
        self.log.info("%s", relayed_record(self.job_name, shown))
        self._relayed_at = time.monotonic()

    def _settle_remaining(self) -> float:
        """Seconds still to wait after the last relayed lines (see :data:`LOG_SETTLE_SECONDS`)."""
        if self._relayed_at is None:
            return 0.0
        return log_settle_seconds() - (time.monotonic() - self._relayed_at)

    async def _read_log(self, follow: bool) -> str:
        """Read the workload container's log from the cursor; ``follow`` streams while it runs.

        Returns the container's phase when the read began (``none`` without a pod yet).
        """
        assert self.namespace is not None
        client = self.client()
        replicated_job = PATHWAYS_HEAD_JOB if self.pathways else MAIN_JOB
        async with client.connection() as api:
            pod = head_pod(await client.pods(api, self.namespace, self.job_name), replicated_job)
            if pod is None:
                return "none"
            container = workload_container(pod, self.pathways)
            if container is None:
                return "none"
            phase = container_phase(pod, container)
            if phase == "waiting":
                return phase
            uid = str(pod["metadata"].get("uid") or pod["metadata"].get("name"))
            if self._cursor.pod_uid != uid:  # a new pod (a JobSet restart): its log starts afresh
                self._cursor = LogCursor(pod_uid=uid, lines=self._cursor.lines)
                self._version += 1
            self._cursor.rewind()
            async for line in client.log_lines(
                api,
                self.namespace,
                str(pod["metadata"]["name"]),
                container,
                since_time=self._cursor.since_time(),
                follow=follow and phase == "running",
            ):
                await self._relay(line)
            await self._flush()
            return phase

    async def _follow(self) -> None:
        """Follow the workload log until the container ends; never fails the wait. Its end wakes
        the state loop (:meth:`_pause`): the JobSet's state is read at once, not a poll later."""
        look_again = True
        while True:
            self._follower_reading = True
            try:
                phase = await self._read_log(follow=True)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                self.log.warning("Reading the log of %s: %s (trying again)", self.job_name, str(err)[:300])
                phase = "error"
            finally:
                self._follower_reading = False
            if phase == "terminated":
                self._log_ended.set()
                return
            if phase == "running" and look_again:
                # The stream ended: most often because the container did. Look again at once; a
                # stream that keeps ending (dropped connections) is re-opened every half second.
                look_again = False
                continue
            look_again = True
            await asyncio.sleep(FOLLOW_RETRY_SECONDS if phase != "running" else 0.5)

    async def _pause(self) -> None:
        """Wait ``poll_interval`` between state reads, or less: once the followed container has
        ended, the JobSet's end follows within moments, so read again after 0.25 s, 0.5 s, 1 s, …"""
        if self._log_ended.is_set():
            delay, self._quick_delay = self._quick_delay, self._quick_delay * 2
            await asyncio.sleep(min(delay, self.poll_interval))
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.poll_interval):
                await self._log_ended.wait()

    async def _stop_follower(self) -> None:
        follower = self._follower
        if follower is not None and not follower.done():
            await reap_cancelled(follower)

    async def _finish_log(self, follower: asyncio.Task[None] | None) -> None:
        """After the job ended: let the follower drain (unless it is between two reads), then read
        whatever it did not see."""
        if follower is not None and not follower.done():
            if self._follower_reading:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(FOLLOW_DRAIN_SECONDS):
                        await asyncio.shield(follower)
            await reap_cancelled(follower)
        if self.follow_logs and self.namespace is not None:
            try:
                await self._read_log(follow=False)
            except Exception as err:
                self.log.warning(
                    "Could not read the rest of the log of %s: %s", self.job_name, str(err)[:300]
                )

    # -- state -------------------------------------------------------------------------------------
    async def job_state(self) -> JobState | None:
        """The JobSet's state now (finding its namespace first); None when it does not exist."""
        client = self.client()
        async with client.connection() as api:
            if self.namespace is None:
                found = await client.find(api, self.job_name)
                if found is None:
                    return None
                self.namespace = str(found["metadata"].get("namespace") or "default")
                self._seen(found)
                return jobset_state(found)[0]
            obj = await client.get(api, self.namespace, self.job_name)
        if obj is None:
            return None
        self._seen(obj)
        return jobset_state(obj)[0]

    def _seen(self, obj: dict[str, Any]) -> None:
        metadata = obj.get("metadata") or {}
        self.jobset_uid = metadata.get("uid")
        self.jobset_completed = jobset_state(obj)[1]
        created = metadata.get("creationTimestamp")
        if isinstance(created, str) and created:
            with contextlib.suppress(ValueError):
                self.jobset_created = rfc3339_seconds(created)

    async def _why_failed(self) -> dict[str, Any]:
        """Why the job failed: its pods lost to their nodes (preemption, node shutdown, eviction:
        transient), else what its workload's last lines say (:func:`classify_workload`)."""
        disrupted = None
        if self.namespace is not None:
            with contextlib.suppress(Exception):  # the log still tells
                client = self.client()
                async with client.connection() as api:
                    disrupted = pod_disruption(await client.pods(api, self.namespace, self.job_name))
        if disrupted is not None:
            return {"kind": FailureKind.TRANSIENT.value, "line": disrupted}
        kind, line = classify_workload(list(self._tail))
        return {"kind": kind.value, "line": line}

    async def _ran(self) -> dict[str, str] | None:
        """The job's running span: its first accelerator pod's start to the JobSet's completion
        (what the ledger counts as TPU time that trained); None when unknown."""
        if self.namespace is None:
            return None
        try:
            client = self.client()
            async with client.connection() as api:
                started = accelerator_start(await client.pods(api, self.namespace, self.job_name))
        except Exception:  # the span is for the ledger: never fail the wait over it
            self.log.warning("Could not read the pods of %s: its running span is not recorded", self.job_name)
            return None
        if started is None:
            return None
        ended = self.jobset_completed or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return {"started_at": started, "ended_at": ended}

    def _event(
        self,
        status: str,
        state: JobState | None,
        message: str,
        fatal: bool = False,
        failure: dict[str, Any] | None = None,
        ran: dict[str, str] | None = None,
    ) -> TriggerEvent:
        # Metrics the cursor object holds as they are now are read from there by the operator.
        kept = self.total_steps is not None and self._metrics_kept()
        return TriggerEvent(
            {
                "status": status,
                "job_name": self.job_name,
                "namespace": self.namespace,
                "state": state.value if state is not None else None,
                "message": message,
                "fatal": fatal,
                "foreign": self.foreign,
                "failure": failure,
                "ran": ran,
                "log_lines": self._cursor.lines,
                "metrics": self._tracker.metrics() if self.total_steps is not None and not kept else None,
                "metrics_uri": self.cursor_uri if kept else None,
            }
        )

    def _metrics_kept(self) -> bool:
        """The cursor object in GCS holds the metrics as they are now (its last save succeeded)."""
        return (
            self._cursor_location() is not None
            and self._saved_version == self._version
            and self._saved_at > 0
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        try:
            # The API clients' modules take seconds to import: not on the triggerer's event loop.
            await asyncio.to_thread(_import_clients)
            status, state, message, fatal = await self._watch()
            if status not in ("error", "conflict") or state is not None:
                await self._finish_log(self._follower)
            await self._flush()
            await self._save_cursor(force=True)
            failure = await self._why_failed() if status == "failed" else None
            ran = await self._ran() if status in ("success", "failed") and not self.foreign else None
            event = self._event(status, state, message, fatal, failure, ran)  # with every line read
            # Closed before the event, not only in `finally`: a caller may leave this generator
            # suspended at its yield (`dags test` takes the first event with `anext` and ends its
            # loop, which cancels the generator's clean-up), and each open client holds a session.
            await self._stop_follower()
            await self.close()
            # Never fire right after deferring (the scheduler may not be done with it), nor right
            # after the last lines went to the log (the triggerer may not have written them yet).
            delay = max((self.not_before or 0.0) - time.time(), self._settle_remaining())
            if delay > 0:
                await asyncio.sleep(delay)
            yield event
        except asyncio.CancelledError:
            await self._stop_follower()  # before saving: no line may be counted after the save
            await self._flush()
            await self._save_cursor(force=True)
            if not AIRFLOW_V_3_3_PLUS and self.cancel_on_kill:
                try:
                    if await self.safe_to_cancel():
                        await self.on_kill()
                except Exception:  # the cancellation still propagates; the JobSet may be left running
                    self.log.error(
                        "Could not delete JobSet %s after the task was killed: it runs until its "
                        "cluster is destroyed, or `gcluster job cancel` deletes it",
                        self.job_name,
                        exc_info=True,
                    )
            raise
        finally:
            await self._stop_follower()
            await self.close()

    async def _watch(self) -> tuple[str, JobState | None, str, bool]:
        """Poll until the job ends; the follower runs beside it while the job runs."""
        errors_in_a_row = 0
        absent = 0
        last: JobState | None = None
        while True:
            try:
                await self.resolve_cluster()
                state = await self.job_state()
                if state is not None and not self._first_seen:
                    watched = self.job_name
                    outcome = await self._on_first_sight()
                    if outcome is not None:
                        return outcome
                    if self.job_name != watched:  # now waiting on another job: read its state
                        continue
            except ConfigurationError as err:
                return "error", last, f"cannot read JobSet {self.job_name}: {err}", True
            except KubernetesApiError as err:
                if not err.retryable:
                    return "error", last, f"cannot read JobSet {self.job_name}: {err}", True
                errors_in_a_row += 1
                self.log.warning(
                    "Reading JobSet %s failed (%d/%d): %s",
                    self.job_name,
                    errors_in_a_row,
                    self.max_consecutive_errors,
                    err,
                )
                if errors_in_a_row >= self.max_consecutive_errors:
                    return "error", last, f"cannot read JobSet {self.job_name}: {err}", False
                await asyncio.sleep(self.poll_interval)
                continue
            errors_in_a_row = 0
            if state is None:
                absent += 1
                if absent >= self.missing_confirmations:
                    return (
                        "missing",
                        last,
                        f"JobSet {self.job_name} does not exist (garbage-collected after its TTL, deleted, "
                        "or never created); check the job's output",
                        False,
                    )
            else:
                absent = 0
                if state != last:
                    self.log.info("Job %s is %s", self.job_name, state.value)
                last = state
                if state is JobState.SUCCEEDED:
                    return "success", state, f"job {self.job_name} succeeded", False
                if state is JobState.FAILED:
                    return "failed", state, f"job {self.job_name} failed", False
                if self.follow_logs and (self._follower is None or self._follower.done()):
                    self._log_ended.clear()  # a new follower (a JobSet restart: a new pod)
                    self._quick_delay = 0.25
                    self._follower = asyncio.create_task(self._follow())
            if state is not None and not state.finished:
                unadmitted = await self._unadmitted(state)
                if unadmitted is not None:
                    await self._delete_jobset()
                    return "unadmitted", state, unadmitted, True
            if self.deadline is not None and time.time() >= self.deadline:
                return (
                    "timeout",
                    last,
                    f"job {self.job_name} still {getattr(last, 'value', 'absent')} at its deadline",
                    False,
                )
            await self._keep_alive()
            await self._flush(due_only=True)
            await self._pause()

    async def _unadmitted(self, state: JobState) -> str | None:
        """Past the admission bound with no pod of the job on a node: what it waited for, one line
        (else None; once a pod was seen on a node, never again)."""
        if self._started or self.admission_timeout is None or self.foreign or self.namespace is None:
            return None
        waited = time.time() - (self.jobset_created or time.time())
        if waited < self.admission_timeout:
            return None
        client = self.client()
        async with client.connection() as api:
            pods = await client.pods(api, self.namespace, self.job_name)
        if accelerator_start(pods) is not None:
            self._started = True
            return None
        return f"job {self.job_name} did not start within {waited / 60:.0f} min of its creation: " + (
            waiting_for(state, pods) + "; it was cancelled"
        )

    # -- the first sight of the JobSet --------------------------------------------------------------
    async def _on_first_sight(self) -> tuple[str, JobState | None, str, bool] | None:
        """Once the JobSet is seen: its deadline and cursor; for a job of this run, the run
        directory recorded on it and no other live JobSet writing the same directory.

        Returns the wait's outcome when it must end here (``conflict``), else None.
        """
        self._first_seen = True
        if self.deadline is None and self.job_timeout:
            self.deadline = (self.jobset_created or time.time()) + self.job_timeout
        if self.cursor_uri is None and self.cursor_prefix and self.jobset_uid:
            self.cursor_uri = f"{self.cursor_prefix}-{self.jobset_uid}.json"
        if not self._loaded:
            await self._load_cursor()
        if self.foreign or not self.run_dir:
            return None
        client = self.client()
        async with client.connection() as api:
            if self.run_key:
                await self._record_on_jobset(client, api)
            others = [
                job
                for job in await client.writing(api, self.run_dir)
                if job.live and job.name != self.job_name
            ]
        if not others:
            return None
        other = others[0]
        owner = f"run {other.run_id}" if other.run_id else "a run not recorded on the JobSet"
        mine = self.job_name
        await self._delete_jobset()
        if self.on_other_writer == "wait":
            self.log.warning(
                "Job %s/%s of %s is writing %s (%s): deleted job %s, waiting for that one instead",
                other.namespace,
                other.name,
                owner,
                self.run_dir,
                other.state.value,
                mine,
            )
            self.job_name, self.namespace = other.name, other.namespace
            self.foreign, self.cancel_on_kill, self.keepalive = True, False, None
            self.cursor_uri, self.cursor_prefix, self._cursor = None, None, LogCursor()
            self._first_seen = False
            return None
        return (
            "conflict",
            None,
            f"{self.run_dir} is being written by job {other.namespace}/{other.name} of {owner} "
            f"({other.state.value}); never two jobs on one directory: this run's job {mine} was "
            f"deleted; wait for that job to end or cancel it (gcluster job cancel {other.name}), "
            "or choose another run_name",
            True,
        )

    async def _record_on_jobset(self, client: JobSetClient, api: Any) -> None:
        """Annotate the JobSet with its run directory and run (``gcluster job submit`` has no flag
        for it); one already annotated is left alone. Never ends the wait: without the annotation
        the JobSet is still judged by its command line."""
        try:
            found = await client.find(api, self.job_name)
            if found is None:
                return
            metadata = found.get("metadata") or {}
            annotations = metadata.get("annotations") or {}
            if annotations.get(RUN_DIR_ANNOTATION) and annotations.get(RUN_ID_ANNOTATION):
                return
            await client.annotate(
                api,
                str(metadata.get("namespace") or "default"),
                self.job_name,
                {RUN_DIR_ANNOTATION: self.run_dir, RUN_ID_ANNOTATION: self.run_key},
            )
        except Exception as err:  # the job runs either way
            self.log.warning("Could not annotate JobSet %s with its run directory: %s", self.job_name, err)

    # -- keeping the claims alive -------------------------------------------------------------------
    async def _keep_alive(self) -> None:
        """Renew the writer claim and the cluster lease every third of their extension."""
        spec = self.keepalive
        if not spec or self.foreign:
            return
        seconds = float(spec.get("until_seconds") or 0)
        now = time.monotonic()
        if seconds <= 0 or (self._kept_alive_at and now - self._kept_alive_at < seconds / 3):
            return
        self._kept_alive_at = now
        try:
            await asyncio.to_thread(self._renew, spec, time.time() + seconds)
        except Exception as err:  # the next round tries again; the claims outlast a few misses
            self.log.warning("Could not renew the claims of job %s: %s", self.job_name, err)

    def _renew(self, spec: dict[str, Any], until: float) -> None:
        from airflow_provider_tpu_rl.records.lease import ClusterLeaseHook
        from airflow_provider_tpu_rl.records.run_dirs import RunDirRecords

        bucket = str(spec["bucket"])
        if spec.get("claim") and self.run_dir and self.run_key:
            records = RunDirRecords(self.gcp_conn_id, self.impersonation_chain)
            if not records.renew(bucket, self.run_dir, run=self.run_key, job=self.job_name, until=until):
                self.log.warning(
                    "Job %s no longer holds the writer claim on %s (released, or taken over)",
                    self.job_name,
                    self.run_dir,
                )
        cluster = spec.get("lease_cluster")
        if cluster and self.run_key:
            ClusterLeaseHook(self.gcp_conn_id, self.impersonation_chain).extend(
                bucket, str(cluster), holder=self.run_key, until=until
            )

    # -- kill --------------------------------------------------------------------------------------
    async def on_kill(self) -> None:
        """Delete the JobSet when the user kills the deferred task (Airflow 3.3+ calls this)."""
        if not self.cancel_on_kill:
            return
        try:
            await self._delete_jobset()
        finally:
            await self.close()

    async def _delete_jobset(self) -> None:
        await self.resolve_cluster()
        client = self.client()
        async with client.connection() as api:
            namespace = self.namespace
            if namespace is None:
                found = await client.find(api, self.job_name)
                if found is None:
                    self.log.info("Task killed: JobSet %s does not exist, nothing to delete", self.job_name)
                    return
                namespace = str(found["metadata"].get("namespace") or "default")
            self.log.info("Task killed: deleting JobSet %s/%s", namespace, self.job_name)
            await client.delete(api, namespace, self.job_name)

    async def safe_to_cancel(self) -> bool:
        """Before Airflow 3.3: the task is no longer deferred, so a user killed it (a triggerer
        restart leaves it deferred and must not cancel the job)."""
        from airflow.utils.state import TaskInstanceState

        ti = getattr(self, "task_instance", None)
        if ti is None:
            return False
        if AIRFLOW_V_3_0_PLUS:
            from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance
            from asgiref.sync import sync_to_async

            states = await sync_to_async(RuntimeTaskInstance.get_task_states)(
                dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id], map_index=ti.map_index
            )
            state = states[ti.run_id][ti.task_id]
        else:  # Airflow 2: the metadata database
            from asgiref.sync import sync_to_async

            state = await sync_to_async(_task_state_airflow2)(ti)
        return state != TaskInstanceState.DEFERRED


def _import_clients() -> None:
    """Import what the trigger's first API calls would import (kubernetes_asyncio, the google
    provider's GKE and GCS hooks, gcloud-aio), so it happens in a thread, not in the event loop."""
    import kubernetes_asyncio.client  # noqa: F401


def _task_state_airflow2(ti: Any) -> Any:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        current = (
            session.query(TaskInstance)
            .filter_by(dag_id=ti.dag_id, task_id=ti.task_id, run_id=ti.run_id, map_index=ti.map_index)
            .one_or_none()
        )
        return None if current is None else current.state


async def first_event(trigger: BaseTrigger) -> dict[str, Any]:
    """Run ``trigger`` to its first event (the operator's in-worker wait) and return its payload."""
    events = trigger.run()
    try:
        async for event in events:
            return dict(event.payload)
    finally:
        await events.aclose()  # type: ignore[attr-defined]  # runs the trigger's clean-up now
    raise KubernetesApiError(f"{type(trigger).__name__} ended without an event")
