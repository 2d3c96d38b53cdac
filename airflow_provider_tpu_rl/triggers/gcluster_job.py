"""``GclusterJobTrigger``: wait (deferred) for a ``gcluster job`` to finish, following its log."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.providers.common.compat.sdk import AirflowException
from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_provider_tpu_rl.exceptions import CommandError, ConfigurationError, OutputParseError
from airflow_provider_tpu_rl.hooks.gcluster import GclusterHook
from airflow_provider_tpu_rl.hooks.jobs import GclusterJob, JobState, new_log_lines, workload_log_lines
from airflow_provider_tpu_rl.maxtext.logs import TrainingLogTracker
from airflow_provider_tpu_rl.render import gke

SEEN_LINES_KEPT = 2000  # recent workload lines kept to de-duplicate log snapshots
FOLLOW_DRAIN_SECONDS = 10.0
MAX_FOLLOW_STARTS = 20  # a follow that ends while the job runs is started again, this many times
MIN_FOLLOW_SECONDS = 1.0  # a follow that ended sooner did not follow running pods: no early poll


class GclusterJobTrigger(BaseTrigger):
    """Polls ``gcluster job list`` until the job ends; yields exactly one event.

    The event payload: ``status`` (``success`` | ``failed`` | ``error`` | ``missing`` | ``timeout``), ``job_name``,
    ``state`` (last seen JobSet status or ``None``), ``message``, ``log_lines`` (workload log lines
    relayed) and ``fatal``: true for
    an ``error`` a retry cannot fix (a bad connection or tool, a non-retryable ``gcluster job list``
    failure; list failures that may pass are retried up to ``max_consecutive_errors`` times first).
    A job that is absent from the list (its JobSet garbage-collected after
    ``--gke-ttl-after-finished``) is ``missing``: not a failure by itself, the operator decides by
    checking the final checkpoint.

    :param poll_interval: seconds between polls.
    :param log_follow: relay new lines of ``gcluster job logs NAME`` to the log on every poll.
    :param missing_confirmations: consecutive polls without the job before reporting ``missing``.
    :param max_consecutive_errors: transient ``job list`` failures tolerated in a row.
    :param total_steps: for training jobs: parse MaxText's lines, log "step N/M" and put the
        metrics (rewards, losses) into the event.
    :param deadline: epoch seconds; a job still running then ends the wait with ``timeout``.
    """

    def __init__(
        self,
        job_name: str,
        project: str | None,
        cluster: str,
        location: str | None,
        gcluster_conn_id: str = GclusterHook.default_conn_name,
        poll_interval: float = 60.0,
        log_follow: bool = True,
        missing_confirmations: int = 2,
        max_consecutive_errors: int = 5,
        query_timeout: float = 300.0,
        total_steps: int | None = None,
        deadline: float | None = None,
    ) -> None:
        super().__init__()
        self.job_name = job_name
        self.project = project
        self.cluster = cluster
        self.location = location
        self.gcluster_conn_id = gcluster_conn_id
        self.poll_interval = poll_interval
        self.log_follow = log_follow
        self.missing_confirmations = max(1, missing_confirmations)
        self.max_consecutive_errors = max(1, max_consecutive_errors)
        self.query_timeout = query_timeout
        self.total_steps = total_steps
        self.deadline = deadline
        self._tracker = TrainingLogTracker()
        self._follower: asyncio.Task[None] | None = None
        self._follow_starts = 0
        self._follow_started_at = 0.0
        self._follow_failed = False
        self._seen_log: list[str] = []
        self._log_count = 0

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "job_name": self.job_name,
                "project": self.project,
                "cluster": self.cluster,
                "location": self.location,
                "gcluster_conn_id": self.gcluster_conn_id,
                "poll_interval": self.poll_interval,
                "log_follow": self.log_follow,
                "missing_confirmations": self.missing_confirmations,
                "max_consecutive_errors": self.max_consecutive_errors,
                "query_timeout": self.query_timeout,
                "total_steps": self.total_steps,
                "deadline": self.deadline,
            },
        )

    def _hook(self) -> GclusterHook:
        return GclusterHook(self.gcluster_conn_id)

    def _event(
        self, status: str, state: JobState | None, message: str, *, fatal: bool = False
    ) -> TriggerEvent:
        return TriggerEvent(
            {
                "status": status,
                "job_name": self.job_name,
                "state": state.value if state is not None else None,
                "message": message,
                "fatal": fatal,
                "log_lines": self._log_count,
                "metrics": self._tracker.metrics() if self.total_steps is not None else None,
            }
        )

    def _on_log_line(self, line: str) -> None:
        """One new workload line: into the task log, and into the training metrics."""
        self.log.info("[%s] %s", self.job_name, line)
        self._seen_log.append(line)
        del self._seen_log[:-SEEN_LINES_KEPT]
        self._log_count += 1
        if self.total_steps is not None:
            before = self._tracker.last_step
            self._tracker.feed(line)
            if self._tracker.last_step is not None and self._tracker.last_step != before:
                self.log.info(
                    "[%s] progress: %s", self.job_name, self._tracker.progress_text(self.total_steps)
                )

    async def _relay_logs(self, hook: GclusterHook) -> None:
        """Log the workload lines that appeared since the last read; never fails the trigger.

        A snapshot of ``gcluster job logs`` holds only the last lines of each container (kubectl's
        default with a label selector), so lines between two reads can be missed; following the
        log (:meth:`_follow_logs`) is preferred and this is the fallback.
        """
        try:
            snapshot = await hook.async_get_job_logs(
                self.job_name, self.project, self.cluster, self.location, timeout=self.query_timeout
            )
        except (AirflowException, OSError) as err:
            first_line = str(err).splitlines()[0] if str(err) else type(err).__name__
            self.log.warning("Could not read logs of job %s: %s", self.job_name, first_line)
            return
        for line in new_log_lines(self._seen_log, snapshot):
            self._on_log_line(line)

    async def _follow_logs(self, hook: GclusterHook) -> None:
        """``gcluster job logs NAME --follow``: every line as it is printed, until the pods end."""
        command = gke.job_logs(self.project, self.cluster, self.location, self.job_name, follow=True)

        def on_line(raw: str) -> None:
            for line in workload_log_lines([raw]):
                if line.strip():
                    self._on_log_line(line)

        try:
            result = await hook.async_run(command, on_line=on_line, log_output=False)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # following the log is best effort; it must never end the wait
            self._follow_failed = True
            self.log.warning(
                "Following the log of job %s stopped: %s", self.job_name, str(err).splitlines()[:1]
            )
            return
        if not result.ok:
            self._follow_failed = True  # read snapshots from now on
            self.log.warning(
                "Following the log of job %s ended with exit code %s; reading snapshots instead",
                self.job_name,
                result.exit_code,
            )

    async def _stop_following(self, follower: asyncio.Task[None] | None) -> None:
        """Let the follower drain what the finished pods printed, then stop it."""
        if follower is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(follower), timeout=FOLLOW_DRAIN_SECONDS)
        except TimeoutError:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower

    async def _pause(self) -> None:
        """Wait ``poll_interval`` before the next poll; less when a log follow that really followed
        ends, since ``logs --follow`` returns when the pods end: the job's end is seen at once."""
        started = time.monotonic()
        follower = self._follower
        if follower is not None and not follower.done():
            await asyncio.wait({follower}, timeout=self.poll_interval)
            if follower.done() and time.monotonic() - self._follow_started_at >= MIN_FOLLOW_SECONDS:
                return
        await asyncio.sleep(max(0.0, self.poll_interval - (time.monotonic() - started)))

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = self._hook()
        try:
            async for event in self._poll(hook):
                if event is None:  # the job exists and has not ended: follow its log
                    idle = self._follower is None or self._follower.done()
                    if (
                        self.log_follow
                        and idle
                        and not self._follow_failed
                        and self._follow_starts < MAX_FOLLOW_STARTS
                    ):
                        # A follow of pods not yet running returns at once: start it again later.
                        self._follow_starts += 1
                        self._follow_started_at = time.monotonic()
                        self._follower = asyncio.create_task(self._follow_logs(hook))
                    continue
                await self._stop_following(self._follower)
                if self.log_follow and (event.payload.get("state") is not None or self._seen_log):
                    await self._relay_logs(hook)  # whatever the follower did not see
                yield TriggerEvent(
                    {
                        **event.payload,
                        "log_lines": self._log_count,
                        "metrics": self._tracker.metrics() if self.total_steps is not None else None,
                    }
                )
                return
        finally:
            if self._follower is not None and not self._follower.done():
                self._follower.cancel()

    async def _poll(self, hook: GclusterHook) -> AsyncIterator[TriggerEvent | None]:
        """Job states until the end; ``None`` each time the job is seen running."""
        errors_in_a_row = 0
        absent_polls = 0
        last_state: JobState | None = None
        while True:
            try:
                jobs = await hook.async_list_jobs(
                    self.project,
                    self.cluster,
                    self.location,
                    name_contains=self.job_name,
                    timeout=self.query_timeout,
                )
            except (CommandError, OutputParseError) as err:
                if isinstance(err, CommandError) and not err.retryable:
                    yield self._event("error", last_state, f"cannot list jobs: {err}", fatal=True)
                    return
                errors_in_a_row += 1
                self.log.warning(
                    "gcluster job list failed (%d/%d): %s",
                    errors_in_a_row,
                    self.max_consecutive_errors,
                    str(err).splitlines()[0],
                )
                if errors_in_a_row >= self.max_consecutive_errors:
                    yield self._event("error", last_state, f"cannot list jobs: {err}")
                    return
                await asyncio.sleep(self.poll_interval)
                continue
            except Exception as err:
                yield self._event(
                    "error",
                    last_state,
                    f"cannot list jobs: {type(err).__name__}: {err}",
                    fatal=isinstance(err, ConfigurationError),
                )
                return
            errors_in_a_row = 0
            job: GclusterJob | None = next((j for j in jobs if j.name == self.job_name), None)

            if job is None:
                absent_polls += 1
                if absent_polls >= self.missing_confirmations:
                    yield self._event(
                        "missing",
                        last_state,
                        f"job {self.job_name} is not in `gcluster job list` (its JobSet may have been "
                        "garbage-collected after its TTL, or never created); check its final checkpoint",
                    )
                    return
            else:
                absent_polls = 0
                if job.state != last_state:
                    self.log.info("Job %s is %s", self.job_name, job.state.value)
                last_state = job.state
                if job.state is JobState.SUCCEEDED:
                    yield self._event(
                        "success", job.state, f"job {self.job_name} succeeded at {job.completion_time}"
                    )
                    return
                if job.state is JobState.FAILED:
                    yield self._event(
                        "failed", job.state, f"job {self.job_name} failed at {job.completion_time}"
                    )
                    return
                yield None
            following = self._follower
            if (
                self.log_follow
                and (following is None or following.done())
                and (job is not None or self._seen_log)
            ):
                await self._relay_logs(hook)  # no live follower: read a snapshot
            if self.deadline is not None and time.time() >= self.deadline:
                yield self._event(
                    "timeout",
                    last_state,
                    f"job {self.job_name} still {getattr(last_state, 'value', 'absent')} at its deadline",
                )
                return
            await self._pause()
