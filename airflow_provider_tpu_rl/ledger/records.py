"""What the run ledger stores: one run, its task steps, metrics and artifacts (no Airflow import)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

from airflow_provider_tpu_rl.ledger.billing import BilledSpan, VmSpan, billed_chip_seconds, spans_from_json
from airflow_provider_tpu_rl.ledger.billing import as_utc as as_utc
from airflow_provider_tpu_rl.ledger.promotion import is_promoted

RUN_STATES = ("running", "success", "failed", "abandoned")
# The states a row still ``running`` is closed with by someone other than its own record_run (the
# janitor): ``failed`` when its DAG run ended failed; ``abandoned`` when the janitor ended the
# resources of a run nobody finished (its DAG run still running with no live task, ended without
# recording, unknown to this Airflow, or past its lease or expiry).
CLOSING_STATES = ("failed", "abandoned")
METRIC_PHASES = ("pre", "intermediate", "post", "train")
ARTIFACT_KINDS = ("converted_checkpoint", "actor_checkpoint", "hf_export", "curves", "model_card")
# Where a GKE run's cluster came from: ``created`` by this run (cluster_mode create), ``kept`` (a
# create-mode cluster an earlier run handed over with keep_cluster, taken over through its lease) or
# ``existing`` (cluster_mode existing: a cluster the run neither deploys nor destroys).
CLUSTER_CREATED, CLUSTER_KEPT, CLUSTER_EXISTING = "created", "kept", "existing"
CLUSTER_ORIGINS = (CLUSTER_CREATED, CLUSTER_KEPT, CLUSTER_EXISTING)

_SECRET_KEY = re.compile(
    r"token|secret|password|passwd|credential|api[_-]?key|private[_-]?key", re.IGNORECASE
)
REDACTED = "***"


def make_run_id(dag_id: str, airflow_run_id: str) -> str:
    """The ledger's key of a DAG run: ``<dag_id>/<airflow run_id>``."""
    return f"{dag_id}/{airflow_run_id}"


def task_instance_start(ti: Any, *, estimate: bool = True) -> datetime | None:
    """When a task instance's try started (duck-typed: Airflow 2 and 3 task instances, fakes).

    Its ``start_date``; when that is missing (Airflow 2.11's ``airflow dags test`` never sets it),
    ``end_date - duration`` where Airflow recorded both, which is as exact. Failing those, and
    when ``estimate``, its ``queued_dttm``: the try started after it was queued, so a duration
    from there counts the wait in the queue too.
    """
    start = as_utc(getattr(ti, "start_date", None))
    if start is not None:
        return start
    end = as_utc(getattr(ti, "end_date", None))
    duration = getattr(ti, "duration", None)
    if end is not None and isinstance(duration, int | float) and not isinstance(duration, bool):
        return end - timedelta(seconds=duration)
    return as_utc(getattr(ti, "queued_dttm", None)) if estimate else None


def seconds_between(started: datetime | None, ended: datetime | None) -> float | None:
    """Seconds from ``started`` to ``ended``, or None when either is unknown."""
    start, end = as_utc(started), as_utc(ended)
    if start is None or end is None:
        return None
    return (end - start).total_seconds()


def estimate_chip_hours(started: datetime | None, ended: datetime | None, chips: int | None) -> float | None:
    """TPU chip-hours of a cluster that lived from ``started`` to ``ended`` with ``chips`` chips.

    Returns None when the start, the end or the chip count is unknown. Raises ValueError for a
    negative chip count or an end before the start.
    """
    if chips is None:
        return None
    if chips < 0:
        raise ValueError(f"chips must be >= 0, got {chips}")
    seconds = seconds_between(started, ended)
    if seconds is None:
        return None
    if seconds < 0:
        raise ValueError(f"cluster ended ({ended}) before it started ({started})")
    return seconds / 3600.0 * chips


def idle_share(billed_chip_hours: float | None, busy_chip_hours: float | None) -> float | None:
    """The share of billed TPU time that did not train, 0..1; None when either is unknown or
    nothing was billed."""
    if billed_chip_hours is None or busy_chip_hours is None or billed_chip_hours <= 0:
        return None
    return min(1.0, max(0.0, 1.0 - busy_chip_hours / billed_chip_hours))


@dataclass(frozen=True)
class ResumeLoss:
    """What restarting training cost a run: how many times an attempt took over from an earlier
    one on the same run directory, the steps the earlier ones trained that no checkpoint kept (so
    they were trained again), and an estimate of the seconds that took: the gap from an attempt's
    end to the next one's start, plus the lost steps at the earlier attempt's seconds per step."""

    resumes: int
    steps_lost: int
    seconds_lost: float | None


def _attempt_number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def resume_loss(attempts: Any, run: str) -> ResumeLoss | None:
    """The :class:`ResumeLoss` of the attempts (oldest first, each ``{"run", "from_step",
    "reached_step", "started_at", "ended_at"}`` as the run directory records them) that ``run``
    made after an earlier attempt; None when ``attempts`` is not a list of them."""
    if not isinstance(attempts, list) or not all(isinstance(a, Mapping) for a in attempts):
        return None
    resumes = steps_lost = 0
    seconds: float | None = 0.0
    for earlier, later in pairwise(attempts):
        if later.get("run") != run:
            continue
        resumes += 1
        start = int(_attempt_number(later.get("from_step")) or 0)
        was_at = _attempt_number(earlier.get("from_step")) or 0.0
        reached = _attempt_number(earlier.get("reached_step"))
        lost = max(0, int(reached) - start) if reached is not None else 0
        steps_lost += lost
        began, ended = _attempt_number(earlier.get("started_at")), _attempt_number(earlier.get("ended_at"))
        restarted = _attempt_number(later.get("started_at"))
        if seconds is None or ended is None or restarted is None:
            seconds = None
            continue
        per_step = 0.0
        if lost and began is not None and reached is not None and reached > was_at:
            per_step = (ended - began) / (reached - was_at)
        seconds += max(0.0, restarted - ended) + lost * per_step
    return ResumeLoss(resumes, steps_lost, seconds)


def redact_conf(conf: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of a run conf with values of secret-looking keys (token, password, ...) replaced."""

    def scrub(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {
                str(key): (REDACTED if _SECRET_KEY.search(str(key)) else scrub(item))
                for key, item in value.items()
            }
        if isinstance(value, list | tuple):
            return [scrub(item) for item in value]
        return value

    return scrub(dict(conf or {}))


@dataclass(frozen=True)
class RunRecord:
    """One DAG run of a pipeline."""

    dag_id: str
    airflow_run_id: str
    model: str
    state: str
    started_at: datetime | None = None
    ended_at: datetime | None = None
    chips: int | None = None
    cluster_started_at: datetime | None = None
    cluster_ended_at: datetime | None = None
    conf: Mapping[str, Any] = field(default_factory=dict)
    train_started_at: datetime | None = None
    train_ended_at: datetime | None = None
    usd_per_chip_hour: float | None = None
    refusal: str | None = None  # "refused at validate: ..." for a run refused before anything was spent
    resume_loss: ResumeLoss | None = None  # what restarting its training cost (None: not known)
    # what the run was asked to do (model, capacity, steps, learning rate, run name, TPU shape):
    # validate's resolved values, which the dashboard's run page lists (None: not known)
    settings: Mapping[str, Any] | None = None
    # the promotion gate's one line ("promoted: ...", "not promoted: ..."; None: the gate never ran)
    promotion: str | None = None
    # the TPU machines' RUNNING spans, from their own clocks (ledger/billing.py); a machine still
    # running when the run was recorded is billed up to then (None: not known)
    billed_spans: tuple[BilledSpan, ...] | None = None
    # the CPU VMs the run used besides its TPU (the bake VM of the TPU VM's boot image): stored one
    # row per span in run_vm_spans; none on a GKE run, or when nothing was baked
    vm_spans: tuple[VmSpan, ...] = ()
    # why someone other than record_run closed the row ("janitor: ..."; None: the run recorded itself)
    end_reason: str | None = None
    # the GKE cluster the run ran on, PROJECT/LOCATION/NAME, and where it came from
    # (CLUSTER_ORIGINS); None on a TPU VM run, or when not known
    gke_cluster: str | None = None
    gke_cluster_origin: str | None = None

    def __post_init__(self) -> None:
        if self.state not in RUN_STATES:
            raise ValueError(f"run state must be one of {RUN_STATES}, got {self.state!r}")
        if self.gke_cluster_origin is not None and self.gke_cluster_origin not in CLUSTER_ORIGINS:
            raise ValueError(
                f"gke_cluster_origin must be one of {CLUSTER_ORIGINS}, got {self.gke_cluster_origin!r}"
            )
        if not self.dag_id or not self.airflow_run_id:
            raise ValueError("dag_id and airflow_run_id must not be empty")

    @property
    def run_id(self) -> str:
        """The ledger key, ``<dag_id>/<airflow run_id>``."""
        return make_run_id(self.dag_id, self.airflow_run_id)

    @property
    def duration_seconds(self) -> float | None:
        """Wall time of the run so far."""
        return seconds_between(self.started_at, self.ended_at)

    @property
    def billed_chip_seconds(self) -> float | None:
        """TPU chip-seconds billed by the machines' clocks: each RUNNING span of each TPU machine,
        at least a minute, times its chips (:func:`~airflow_provider_tpu_rl.ledger.billing.billed_chip_seconds`);
        None when the spans are not known."""
        if self.billed_spans is None:
            return None
        return billed_chip_seconds(self.billed_spans, self.ended_at)

    @property
    def chip_hours(self) -> float | None:
        """Billed TPU chip-hours (:attr:`billed_chip_seconds`)."""
        seconds = self.billed_chip_seconds
        return None if seconds is None else seconds / 3600.0

    @property
    def held_chip_hours(self) -> float | None:
        """TPU chip-hours the run held its capacity: from the start of the task that creates it to the
        end of the task that deletes it, x chips. More than billed: it counts the create's wait for
        capacity and provisioning, and the delete's shutdown, which bill nothing."""
        return estimate_chip_hours(self.cluster_started_at, self.cluster_ended_at, self.chips)

    @property
    def billed_spans_json(self) -> str | None:
        """The billed spans as JSON; None when not known."""
        if self.billed_spans is None:
            return None
        return json.dumps([span.as_dict() for span in self.billed_spans], sort_keys=True)

    @property
    def busy_chip_hours(self) -> float | None:
        """TPU chip-hours that trained: the training job's running time x chips (never more than
        billed)."""
        busy = estimate_chip_hours(self.train_started_at, self.train_ended_at, self.chips)
        billed = self.chip_hours
        return busy if busy is None or billed is None else min(busy, billed)

    @property
    def idle_share(self) -> float | None:
        """The share of billed TPU time that did not train."""
        return idle_share(self.chip_hours, self.busy_chip_hours)

    @property
    def estimated_cost_usd(self) -> float | None:
        """Billed chip-hours x the price per chip-hour the run was recorded with."""
        if self.chip_hours is None or self.usd_per_chip_hour is None:
            return None
        return self.chip_hours * self.usd_per_chip_hour

    @property
    def conf_json(self) -> str:
        """The run conf as JSON with secrets redacted."""
        return json.dumps(redact_conf(self.conf), sort_keys=True, default=str)

    @property
    def settings_json(self) -> str | None:
        """The run's settings as JSON with secrets redacted; None when not known."""
        if self.settings is None:
            return None
        return json.dumps(redact_conf(self.settings), sort_keys=True, default=str)


def closing_state(dagrun_state: str | None) -> str:
    """The state the janitor closes a ``running`` row with: ``failed`` when its DAG run ended
    failed, ``abandoned`` otherwise (:data:`CLOSING_STATES`)."""
    return "failed" if dagrun_state == "failed" else "abandoned"


@dataclass(frozen=True)
class RunClosing:
    """How a row that still says ``running`` is closed when its run never recorded its end: its
    end, state (:data:`CLOSING_STATES`), the TPU time billed so far and why, in one line."""

    run_id: str
    state: str
    ended_at: datetime
    reason: str
    # the TPU machines' spans, each ended (None: not known)
    billed_spans: tuple[BilledSpan, ...] | None = None
    usd_per_chip_hour: float | None = None  # the price, when the row has none

    def __post_init__(self) -> None:
        if self.state not in CLOSING_STATES:
            raise ValueError(f"a closed run's state must be one of {CLOSING_STATES}, got {self.state!r}")
        if not self.reason.strip() or "\n" in self.reason:
            raise ValueError(f"the reason must be one non-empty line, got {self.reason!r}")
        if "/" not in self.run_id:
            raise ValueError(f"run_id must be <dag_id>/<run_id>, got {self.run_id!r}")
        object.__setattr__(self, "ended_at", as_utc(self.ended_at))

    @property
    def billed_chip_seconds(self) -> float | None:
        """The spans' billed chip-seconds (open ones up to :attr:`ended_at`); None when not known."""
        if self.billed_spans is None:
            return None
        return billed_chip_seconds(self.billed_spans, self.ended_at)

    @property
    def billed_spans_json(self) -> str | None:
        """The spans as JSON, as :attr:`RunRecord.billed_spans_json`; None when not known."""
        if self.billed_spans is None:
            return None
        return json.dumps([span.as_dict() for span in self.billed_spans], sort_keys=True)


@dataclass(frozen=True)
class StepRecord:
    """The latest try of one task of a run."""

    task_id: str
    state: str | None
    try_number: int | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    job_name: str | None = None

    @property
    def duration_seconds(self) -> float | None:
        """Wall time of the try."""
        return seconds_between(self.started_at, self.ended_at)


@dataclass(frozen=True)
class MetricRecord:
    """One number from training: phase pre|intermediate|post|train, step 0 for pre and post."""

    phase: str
    step: int
    name: str
    value: float | None

    def __post_init__(self) -> None:
        if self.phase not in METRIC_PHASES:
            raise ValueError(f"metric phase must be one of {METRIC_PHASES}, got {self.phase!r}")


@dataclass(frozen=True)
class ArtifactRecord:
    """Where an output of the run is: kind converted_checkpoint|actor_checkpoint|hf_export|curves
    (the run's curves PNG)."""

    kind: str
    uri: str
    step: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ARTIFACT_KINDS:
            raise ValueError(f"artifact kind must be one of {ARTIFACT_KINDS}, got {self.kind!r}")
        if not self.uri:
            raise ValueError("artifact uri must not be empty")


# The train task records how many test batches MaxText evaluated before and after training (the
# preset's value or the run's override; 0 = no evaluation, so no reward), phase "train", step 0.
NUM_TEST_BATCHES_METRIC = "num_test_batches"


def no_reward_reason(num_test_batches: float | None, pre: float | None, post: float | None) -> str | None:
    """Why a run has no mean reward before or after training, when the ledger knows; else None."""
    if num_test_batches is None or (pre is not None and post is not None):
        return None
    if num_test_batches <= 0:
        return "no reward: num_test_batches=0, evaluation off"
    missing = " and ".join(side for side, value in (("before", pre), ("after", post)) if value is None)
    return (
        f"no reward {missing} training: evaluation was on (num_test_batches={int(num_test_batches)}) "
        "but the training log held no such line"
    )


def reward_summary(metrics: Mapping[str, Any], num_test_batches: float | None) -> str:
    """``mean reward before 0.12, after 0.34`` from the train task's metrics, and why a side is
    missing when the evaluation's size says (``no reward: num_test_batches=0, evaluation off``)."""

    def mean(phase: str) -> float | None:
        values = metrics.get(phase)
        value = values.get("mean_reward") if isinstance(values, Mapping) else None
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    pre, post = mean("pre"), mean("post")
    line = f"mean reward before {'-' if pre is None else pre}, after {'-' if post is None else post}"
    reason = no_reward_reason(num_test_batches, pre, post)
    return f"{line} ({reason})" if reason else line


@dataclass(frozen=True)
class RunSummary:
    """One row of ``latest_runs``: what ``tpu-rl runs`` prints."""

    run_id: str
    dag_id: str
    airflow_run_id: str
    model: str
    state: str
    started_at: datetime | None
    ended_at: datetime | None
    duration_seconds: float | None
    chips: int | None
    chip_hours: float | None
    pre_mean_reward: float | None
    post_mean_reward: float | None
    export_uri: str | None
    busy_chip_hours: float | None = None
    estimated_cost_usd: float | None = None
    refusal: str | None = None
    num_test_batches: float | None = None
    resumes: int | None = None
    steps_lost: int | None = None
    seconds_lost: float | None = None
    usd_per_chip_hour: float | None = None
    settings_json: str | None = None
    promotion: str | None = None
    billed_chip_seconds: float | None = None
    held_chip_hours: float | None = None
    billed_spans_json: str | None = None
    # the bake VM's billed CPU seconds (run_vm_spans, purpose bake); None: the run baked nothing
    bake_billed_seconds: float | None = None
    # why the janitor closed the row (RunClosing.reason); None: the run recorded itself
    end_reason: str | None = None
    # the GKE cluster and where it came from (RunRecord.gke_cluster, gke_cluster_origin)
    gke_cluster: str | None = None
    gke_cluster_origin: str | None = None

    @property
    def cluster_text(self) -> str | None:
        """``PROJECT/LOCATION/NAME (existing)``; None on a run with no GKE cluster recorded."""
        return gke_cluster_text(self.gke_cluster, self.gke_cluster_origin)

    @property
    def promoted(self) -> bool | None:
        """Whether the promotion gate promoted the model; None when it never ran."""
        return is_promoted(self.promotion)

    @property
    def billed_spans(self) -> tuple[BilledSpan, ...] | None:
        """The TPU machines' billed spans (:attr:`RunRecord.billed_spans`); None when not known."""
        if not self.billed_spans_json:
            return None
        try:
            return spans_from_json(json.loads(self.billed_spans_json))
        except ValueError:
            return None

    @property
    def idle_share(self) -> float | None:
        """The share of billed TPU time that did not train."""
        return idle_share(self.chip_hours, self.busy_chip_hours)

    @property
    def settings(self) -> dict[str, Any]:
        """What the run was asked to do (:attr:`RunRecord.settings`); empty when not recorded."""
        if not self.settings_json:
            return {}
        try:
            found = json.loads(self.settings_json)
        except ValueError:
            return {}
        return dict(found) if isinstance(found, Mapping) else {}

    @property
    def no_reward_reason(self) -> str | None:
        """Why the run has no mean reward before or after training, when the ledger knows."""
        return no_reward_reason(self.num_test_batches, self.pre_mean_reward, self.post_mean_reward)


def served_capacity(settings: Mapping[str, Any]) -> str | None:
    """The capacity kind that served the run's TPUs: ``capacity_served`` (an ordered ``capacity``
    that fell through, from ``create_vm``), else a one-kind ``capacity``; None when not known."""
    served = settings.get("capacity_served")
    if served:
        return str(served)
    capacity = settings.get("capacity")
    return capacity if isinstance(capacity, str) and capacity else None


def capacity_text(settings: Mapping[str, Any]) -> str | None:
    """The TPU capacity a run got, in words: ``spot (after reservation, flex-start refused)``
    when an ordered ``capacity`` fell through, the kind alone when the first served or one kind
    was asked, the ordered kinds when none is known to have served; None when not recorded."""
    served = served_capacity(settings)
    refused = [
        str(a.get("capacity")) for a in settings.get("capacity_attempts") or () if isinstance(a, Mapping)
    ]
    if served and refused:
        return f"{served} (after {', '.join(refused)} refused)"
    if served:
        return served
    capacity = settings.get("capacity")
    if isinstance(capacity, list | tuple) and capacity:
        return " then ".join(str(kind) for kind in capacity)
    return None


def gke_cluster_text(cluster: str | None, origin: str | None) -> str | None:
    """The cluster and where it came from, in words: ``p/us-east5/c (created)``; None when no
    cluster is recorded."""
    if not cluster:
        return None
    return f"{cluster} ({origin})" if origin else cluster


def gke_cluster(
    derived: Mapping[str, Any], deployed: Mapping[str, Any] | None = None
) -> tuple[str | None, str | None]:
    """The GKE cluster a run ran on and where it came from, from ``validate``'s resolved values and
    ``deploy_cluster``'s result (its ``cluster_origin``: ``created`` or ``kept``): in *existing*
    mode the named cluster, ``existing``; in *create* mode ``PROJECT/REGION/CLUSTER_NAME`` (the
    toolkit's cluster is regional), with the origin the deploy said (None: it has not deployed).
    ``(None, None)`` for a run without a GKE cluster (the TPU VM pipeline)."""
    if derived.get("cluster_mode") == CLUSTER_EXISTING and derived.get("existing_cluster"):
        return str(derived["existing_cluster"]), CLUSTER_EXISTING
    name, project, region = (derived.get(key) for key in ("cluster_name", "project", "region"))
    if not (name and project and region):
        return None, None
    origin = (deployed or {}).get("cluster_origin")
    return f"{project}/{region}/{name}", origin if origin in (CLUSTER_CREATED, CLUSTER_KEPT) else None
