"""Taking a run directory over from a claim that no longer vouches for its job (see
:mod:`airflow_provider_tpu_rl.records.run_dirs`): only once that job is proven dead where it runs.

A claim expired, or its run ended (a killed worker, a run marked failed after an outage), but its
job may still run on its cluster or VM. Before another run writes the directory:

* the job's state is read where it runs (:mod:`airflow_provider_tpu_rl.records.writers`);
* **live**: refused in one line naming the job and how to stop it; with ``cancel_previous_writer``
  the job is stopped first (its JobSet deleted, or its container and processes on the VM), and
  the takeover waits, bounded, until nothing of it runs;
* **unreachable** (its cluster's or VM's API cannot be read): refused unless nothing under the
  directory was written for longer than the claim window plus one checkpoint period (the longest
  two committed checkpoints were apart; without two, the stage's whole bound);
* **gone**: taken over. The claim replaced is the one proven dead (a claim renewed meanwhile is
  not), and for a training the attempt the displaced job made is recorded with it, so the new
  run's resumes and the steps lost reach the ledger.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from airflow_provider_tpu_rl import timeouts
from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.records.lease import utc_text
from airflow_provider_tpu_rl.records.run_dirs import GKE, TrainingAttempt, WriterClaim
from airflow_provider_tpu_rl.records.writers import (
    LIVE,
    UNREACHABLE,
    JobSetWriter,
    VmWriter,
    WriterState,
    read_directory_activity,
    stop_command,
)

if TYPE_CHECKING:
    from airflow_provider_tpu_rl.operators.base import GclusterBaseOperator

# How long a stopped job may take to end (a pod's termination grace period, a container's stop).
DEFAULT_STOP_TIMEOUT: Final = timedelta(minutes=10)


def minutes_text(seconds: float) -> str:
    """``45 s``, ``12 min``, ``3.5 h``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def why_not_vouching(held: WriterClaim, finished: bool) -> str:
    return "belongs to a run that has ended" if finished else f"expired at {utc_text(held.expires_at)}"


def previous_writer(
    operator: GclusterBaseOperator, held: WriterClaim, directory: str, *, pathways: bool
) -> JobSetWriter | VmWriter:
    """What reads (and stops) the claim's job where it runs."""
    if held.platform == GKE:
        return JobSetWriter(held, operator.gcp_conn_id, operator.chain, pathways=pathways)
    return VmWriter(held, operator.hook, directory)


def prove_dead(
    operator: GclusterBaseOperator,
    held: WriterClaim,
    directory: str,
    *,
    finished: bool,
    stage: str,
    cancel: bool,
    pathways: bool,
    stop_timeout: timedelta = DEFAULT_STOP_TIMEOUT,
    poll: float = 5.0,
    claim_seconds: float,
) -> WriterState:
    """The state of ``held``'s job once this task may take ``directory`` over (gone, or an
    unreachable one whose directory has been silent long enough); anything else fails the task
    in one line (``AirflowFailException``). ``cancel``: a live job is stopped first."""
    why = why_not_vouching(held, finished)
    writer = previous_writer(operator, held, directory, pathways=pathways)
    state = writer.state()
    operator.log.info("The claim of job %s on %s %s: %s", held.job, directory, why, state.detail)
    if state.state == LIVE and cancel:
        operator.log.warning(
            "cancel_previous_writer=true: stopping job %s of run %s (%s) before taking %s over",
            held.job,
            held.run,
            state.detail,
            directory,
        )
        state = writer.stop(stop_timeout.total_seconds(), poll)
        if state.state == LIVE:
            raise AirflowFailException(
                f"{directory}: job {held.job} of run {held.run} was told to stop but is still "
                f"running ({state.detail}); never two jobs on one directory: stop it "
                f"({stop_command(held)}) and run again"
            )
        operator.log.warning("Job %s of run %s: %s", held.job, held.run, state.detail)
    if state.state == LIVE:
        raise AirflowFailException(
            f"{directory} is still written by job {held.job} of run {held.run} ({state.detail}), "
            f"although its claim {why}; never two jobs on one directory: stop it "
            f"({stop_command(held)}) or run again with cancel_previous_writer=true, or choose "
            "another run_name"
        )
    if state.state == UNREACHABLE:
        activity = read_directory_activity(operator.gcp_conn_id, directory, operator.chain)
        if activity.period is not None:
            period = activity.period
            period_text = (
                f"one checkpoint period ({minutes_text(period)}, the longest two checkpoints were apart)"
            )
        else:
            period = timeouts.task_timeout(stage).total_seconds()
            period_text = (
                f"the {stage} stage's bound ({minutes_text(period)}: fewer than two checkpoints to measure)"
            )
        needed = claim_seconds + period
        quiet = activity.quiet_for()
        if quiet is not None and quiet < needed:
            raise AirflowFailException(
                f"{directory} is claimed by job {held.job} of run {held.run}, whose claim {why}, but "
                f"where it runs cannot be read ({state.detail}) and the directory was written "
                f"{minutes_text(quiet)} ago: that job is not proven dead; a takeover waits until "
                f"nothing was written for {minutes_text(needed)} (the claim window "
                f"{minutes_text(claim_seconds)} plus {period_text}), or stop it ({stop_command(held)}) "
                "and run again"
            )
        ended = activity.newest or time.time()
        state = WriterState(
            state.state,
            f"{state.detail}; nothing written under {directory} for "
            f"{minutes_text(quiet or 0.0)} (since {utc_text(ended)})",
        )
    return state


def displaced_attempt(
    held: WriterClaim, state: WriterState, metrics: dict[str, Any] | None, ended_at: float | None = None
) -> TrainingAttempt:
    """The training attempt of the job taken over: the step it resumed from and the last one it
    reached as its kept metrics (the log cursor) and its log's tail tell, when it worked."""
    metrics = metrics or {}
    resumed, last = metrics.get("resumed_from_step"), metrics.get("last_step")
    steps = [
        step for step in (last, state.reached_step) if isinstance(step, int) and not isinstance(step, bool)
    ]
    return TrainingAttempt(
        run=held.run,
        job=held.job,
        from_step=resumed if isinstance(resumed, int) and not isinstance(resumed, bool) else 0,
        reached_step=max(steps) if steps else None,
        started_at=state.started_at,
        ended_at=ended_at or time.time(),
    )
