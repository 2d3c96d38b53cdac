"""Run directories: who wrote one, and the one job allowed to write it now.

A *run directory* is what one job writes: ``<base_output_directory>/<run_name>/`` for training, the
export folder for an export, the converted checkpoint's folder for a conversion. Its record is the
object ``gs://BUCKET/tpu-rl/run-dirs/<hash>.json``:

* ``runs``: the runs (``<dag_id>/<run_id>``) that wrote the directory, first claim first, each
  once, the latest writer last; ``settings``: what the first run started it with (a resume must
  keep them);
* ``attempts``: what each training job that wrote it did, once it ended (the last
  :data:`MAX_ATTEMPTS`): the step it resumed from and the last step it reached, so a resume can
  tell the steps the previous attempt trained that no checkpoint kept;
* ``writer``: the claim of the job writing it now: its run, job name, where it runs
  (``platform``: ``gke`` or ``vm``; ``where``: ``project/location/cluster`` or
  ``project/zone/vm``) and an expiry the job's wait renews (:meth:`RunDirRecords.renew`) and the
  job's end clears (:meth:`RunDirRecords.release`).

One writer per directory, whatever cluster or VM the job runs on: a claim held by another live run
refuses the newcomer (:class:`~airflow_provider_tpu_rl.exceptions.RunDirBusyError`). A claim whose
expiry has passed, or whose run has finished, no longer vouches for its job: a crashed worker
leaves its job running. Such a claim is taken over only once its job is proven dead where it runs
(:mod:`airflow_provider_tpu_rl.records.writers`); the caller then names that exact claim
(``takeover``) and the attempt it made (``displaced``), and the write fails if the claim changed
meanwhile. Every write names the GCS generation it read (``ifGenerationMatch``, 0 for a new
object), so of two runs claiming at once exactly one wins, the other re-reads and decides again.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Final

from airflow_provider_tpu_rl.compat import AirflowNotFoundException
from airflow_provider_tpu_rl.exceptions import ConfigurationError, RunDirBusyError, TpuRlError
from airflow_provider_tpu_rl.maxtext.layout import run_dir, run_record_object
from airflow_provider_tpu_rl.records.lease import read_generation

GCS_TIMEOUT_S = 60.0
MAX_ROUNDS = 8  # re-read-and-decide rounds after a precondition failure
MAX_ATTEMPTS = 20  # training attempts a record keeps (the latest)


def _utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@dataclass(frozen=True)
class TrainingAttempt:
    """One training job's time on a run directory: the ``run`` and ``job``, the checkpoint step it
    resumed from (0: from the start), the last step its log reported, and when it trained (epoch
    seconds; ``started_at`` None when unknown)."""

    run: str
    job: str
    from_step: int
    reached_step: int | None
    started_at: float | None
    ended_at: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "job": self.job,
            "from_step": self.from_step,
            "reached_step": self.reached_step,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
        }

    @classmethod
    def from_dict(cls, body: Any) -> TrainingAttempt | None:
        """An attempt from its stored form; None for anything malformed."""
        if not isinstance(body, Mapping):
            return None
        try:
            reached, started = body.get("reached_step"), body.get("started_at")
            return cls(
                str(body["run"]),
                str(body["job"]),
                int(body["from_step"]),
                None if reached is None else int(reached),
                None if started is None else float(started),
                float(body["ended_at"]),
            )
        except (KeyError, TypeError, ValueError):
            return None


def _epoch(value: Any) -> float | None:
    """Epoch seconds from an ISO-8601 time (``Z`` or an offset) or a number; None otherwise."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            return None
        return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
    return None


def attempt_from_log(
    run: str,
    job: str,
    metrics: Mapping[str, Any],
    ran: Mapping[str, Any] | None,
    ended_at: float | None = None,
) -> TrainingAttempt:
    """The attempt a training's log tells of: ``metrics`` as a
    :class:`~airflow_provider_tpu_rl.maxtext.logs.TrainingLogTracker` returns them, ``ran`` its
    running span (``started_at``/``ended_at``), else ``ended_at`` (else now) as its end."""
    resumed, reached = metrics.get("resumed_from_step"), metrics.get("last_step")
    span = ran or {}
    return TrainingAttempt(
        run=run,
        job=job,
        from_step=resumed if isinstance(resumed, int) and not isinstance(resumed, bool) else 0,
        reached_step=reached if isinstance(reached, int) and not isinstance(reached, bool) else None,
        started_at=_epoch(span.get("started_at")),
        ended_at=_epoch(span.get("ended_at")) or ended_at or time.time(),
    )


GKE: Final = "gke"
VM: Final = "vm"


@dataclass(frozen=True)
class WriterClaim:
    """The job writing a run directory now: ``run`` (``<dag_id>/<run_id>``), ``job`` (its name:
    the JobSet on GKE, ``<vm>/<stage>`` on a VM), ``where`` it runs (``project/location/cluster``
    or ``project/zone/vm``), until when the claim holds unrenewed, and its ``platform`` (``gke`` or
    ``vm``; a claim written before it was recorded tells by its job's name)."""

    run: str
    job: str
    where: str
    expires_at: float
    platform: str = ""

    def __post_init__(self) -> None:
        if not self.platform:
            object.__setattr__(self, "platform", VM if "/" in self.job else GKE)

    def expired(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) >= self.expires_at

    @property
    def place(self) -> tuple[str, str, str] | None:
        """``(project, location or zone, cluster or VM)`` of :attr:`where`; None when malformed."""
        parts = self.where.split("/")
        return (parts[0], parts[1], parts[2]) if len(parts) == 3 and all(parts) else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "job": self.job,
            "where": self.where,
            "platform": self.platform,
            "expires_at": self.expires_at,
            "expires": _utc(self.expires_at),
        }

    @classmethod
    def from_dict(cls, body: Any) -> WriterClaim | None:
        if not isinstance(body, Mapping):
            return None
        try:
            return cls(
                str(body["run"]),
                str(body["job"]),
                str(body["where"]),
                float(body["expires_at"]),
                str(body.get("platform") or ""),
            )
        except (KeyError, TypeError, ValueError):
            return None

    def describe(self) -> str:
        """``job J (where W) of run R, claimed until T``."""
        return f"job {self.job} ({self.where}) of run {self.run}, claimed until {_utc(self.expires_at)}"


@dataclass(frozen=True)
class RunDirRecord:
    """One read of a run directory's record (generation 0: no object)."""

    directory: str
    runs: tuple[str, ...] = ()
    settings: Mapping[str, str] = field(default_factory=dict)
    writer: WriterClaim | None = None
    generation: int = 0
    attempts: tuple[TrainingAttempt, ...] = ()

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
                "writer": self.writer.as_dict() if self.writer is not None else None,
                "attempts": [attempt.as_dict() for attempt in self.attempts],
                "updated": datetime.now(UTC).isoformat(timespec="seconds"),
            },
            sort_keys=True,
        )

    @classmethod
    def parse(cls, directory: str, text: str | bytes, generation: int) -> RunDirRecord:
        """A record from its object's text; one that is not JSON reads as unrecorded."""
        try:
            document = json.loads(text)
        except ValueError:
            return cls(run_dir(directory), generation=generation)
        if not isinstance(document, Mapping):
            return cls(run_dir(directory), generation=generation)
        return cls(
            run_dir(directory),
            tuple(str(run) for run in document.get("runs") or []),
            {str(k): str(v) for k, v in (document.get("settings") or {}).items()},
            WriterClaim.from_dict(document.get("writer")),
            generation,
            tuple(
                attempt
                for body in document.get("attempts") or []
                if (attempt := TrainingAttempt.from_dict(body)) is not None
            ),
        )


def busy_message(directory: str, writer: WriterClaim) -> str:
    """The one line refusing a second writer."""
    return (
        f"{directory} is being written by {writer.describe()}; never two jobs on one directory: "
        "wait for that run to end, or choose another run_name"
    )


def vouches(writer: WriterClaim, run_ended: bool, now: float | None = None) -> bool:
    """Whether a claim still speaks for its job: unexpired and of a run that has not ended. One
    that does not is taken over only once its job is proven dead where it runs."""
    return not writer.expired(now) and not run_ended


def _precondition_failed(exc: BaseException) -> bool:
    from google.api_core.exceptions import PreconditionFailed

    return isinstance(exc, PreconditionFailed)


class RunDirRecords:
    """Reads, claims, renews and releases run directory records through the google provider's
    ``GCSHook`` (blocking calls; a trigger runs them in a thread).

    :param gcp_conn_id: the GCP connection.
    :param impersonation_chain: service account(s) to impersonate.
    """

    def __init__(self, gcp_conn_id: str = "google_cloud_default", impersonation_chain: Any = None) -> None:
        self.gcp_conn_id = gcp_conn_id
        self.impersonation_chain = impersonation_chain
        self._client: Any = None

    def _blob(self, bucket: str, directory: str) -> Any:
        if self._client is None:
            from airflow_provider_tpu_rl.hooks.credentials import gcs_hook

            try:
                hook = gcs_hook(self.gcp_conn_id, self.impersonation_chain)
            except AirflowNotFoundException:
                raise ConfigurationError(
                    f"connection {self.gcp_conn_id} is not defined: the record of {directory} "
                    f"(gs://{bucket}/{run_record_object(directory)}) cannot be read"
                ) from None
            self._client = hook.get_conn()
        return self._client.bucket(bucket).blob(run_record_object(directory))

    def read(self, bucket: str, directory: str) -> RunDirRecord:
        """The record of ``directory`` (an empty one, generation 0, when none exists)."""
        changing = TpuRlError(f"the record of {directory} keeps changing while it is read")
        found = read_generation(lambda: self._blob(bucket, directory), changing)
        return RunDirRecord(run_dir(directory)) if found is None else RunDirRecord.parse(directory, *found)

    def _write(self, bucket: str, record: RunDirRecord) -> RunDirRecord:
        """Write ``record`` if the object is still at the generation it was read at."""
        blob = self._blob(bucket, record.directory)
        blob.upload_from_string(
            record.payload(),
            content_type="application/json",
            if_generation_match=record.generation,  # 0: only if it does not exist yet
            timeout=GCS_TIMEOUT_S,
        )
        return replace(record, generation=int(blob.generation or 0))

    def _update(
        self, bucket: str, directory: str, change: Callable[[RunDirRecord], RunDirRecord | None]
    ) -> RunDirRecord:
        """Read, apply ``change`` (None: nothing to write), write with the generation read;
        again from the read when another writer got there first."""
        for _ in range(MAX_ROUNDS):
            current = self.read(bucket, directory)
            wanted = change(current)
            if wanted is None:
                return current
            try:
                return self._write(bucket, wanted)
            except Exception as exc:
                if not _precondition_failed(exc):
                    raise
        raise TpuRlError(f"the record of {directory} keeps changing while it is written")

    def claim(
        self,
        bucket: str,
        directory: str,
        *,
        run: str,
        settings: Mapping[str, str],
        writer: WriterClaim | None,
        takeover: WriterClaim | None = None,
        displaced: TrainingAttempt | None = None,
    ) -> RunDirRecord:
        """Record ``run`` as the directory's latest writer (the settings of the first claim stay)
        and, with ``writer``, claim it for that job.

        Another run's claim is replaced only when it is exactly ``takeover`` (the claim whose job
        the caller proved dead: one renewed or changed since is not), recording ``displaced``
        (the attempt that job made) with it; any other claim of another run raises
        :class:`RunDirBusyError` and writes nothing. Returns the record as written.
        """

        def change(current: RunDirRecord) -> RunDirRecord | None:
            held = current.writer
            attempts = current.attempts
            if writer is not None and held is not None and held.run != run:
                if held != takeover:
                    raise RunDirBusyError(busy_message(current.directory, held), held)
                if displaced is not None:
                    attempts = (*attempts, displaced)[-MAX_ATTEMPTS:]
            runs = (*(r for r in current.runs if r != run), run)
            new_writer = writer if writer is not None else held  # recording a run is not writing
            if current.generation and runs == current.runs and new_writer == held:
                return None
            return replace(
                current,
                runs=runs,
                settings=current.settings or dict(settings),
                writer=new_writer,
                attempts=attempts,
            )

        return self._update(bucket, directory, change)

    def renew(self, bucket: str, directory: str, *, run: str, job: str, until: float) -> bool:
        """Push the claim of ``run``'s ``job`` to at least ``until``; False when it holds no claim
        any more (released, or taken over after it expired)."""
        held: list[bool] = []

        def change(current: RunDirRecord) -> RunDirRecord | None:
            held.clear()
            writer = current.writer
            if writer is None or writer.run != run or writer.job != job:
                held.append(False)
                return None
            held.append(True)
            if writer.expires_at >= until:
                return None
            return replace(current, writer=replace(writer, expires_at=until))

        self._update(bucket, directory, change)
        return bool(held and held[0])

    def release(
        self,
        bucket: str,
        directory: str,
        *,
        run: str,
        job: str | None = None,
        attempt: TrainingAttempt | None = None,
    ) -> RunDirRecord:
        """Clear the claim when ``run`` (and ``job``, if given) holds it, recording the training
        ``attempt`` that ends with it; another's claim is left alone. Returns the record as it is now."""

        def change(current: RunDirRecord) -> RunDirRecord | None:
            writer = current.writer
            if writer is None or writer.run != run or (job is not None and writer.job != job):
                return None
            attempts = current.attempts if attempt is None else (*current.attempts, attempt)
            return replace(current, writer=None, attempts=attempts[-MAX_ATTEMPTS:])

        return self._update(bucket, directory, change)


@contextmanager
def claim_kept_alive(
    records: RunDirRecords, bucket: str, directory: str, *, run: str, job: str, seconds: float
) -> Iterator[None]:
    """While the block runs (a long blocking call: a VM stage over SSH), renew the writer claim of
    ``run``'s ``job`` to ``seconds`` from now, every third of it, from a daemon thread."""
    stop = threading.Event()

    def renew() -> None:
        while not stop.wait(seconds / 3):
            with contextlib.suppress(Exception):  # the next round tries again
                records.renew(bucket, directory, run=run, job=job, until=time.time() + seconds)

    thread = threading.Thread(target=renew, name=f"claim-{job}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=GCS_TIMEOUT_S)
