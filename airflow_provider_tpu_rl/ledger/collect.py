"""Build the ledger records of a DAG run from a task's context (duck-typed; no Airflow import).

The ledger task runs as a teardown at the end of a pipeline, so its DAG run is still running:
the run's state is derived from the other tasks. Task instances come from
``dag_run.get_task_instances()`` where the context offers it (Airflow 2, tests); on Airflow 3
a task can only ask for the states of its run's tasks (``ti.get_task_states``), so start, end
and try number come from ``recorded_steps``: what :func:`~airflow_provider_tpu_rl.ledger.hook.record_step_callback`
wrote into the ledger while the run went on. A task instance without a ``start_date``
(Airflow 2.11's ``airflow dags test``) gets its start from ``end_date - duration``, else from the
execute callback's row, else from ``queued_dttm``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from airflow_provider_tpu_rl.ledger.billing import (
    BilledSpan,
    closed_at,
    spans_from_json,
    vm_spans_from_result,
)
from airflow_provider_tpu_rl.ledger.records import (
    NUM_TEST_BATCHES_METRIC,
    ArtifactRecord,
    MetricRecord,
    RunRecord,
    StepRecord,
    as_utc,
    gke_cluster,
    make_run_id,
    resume_loss,
    task_instance_start,
)

log = logging.getLogger(__name__)

# The TPU capacity's create and delete: on GKE the TPU node pool's own deployment group, deployed
# after the conversion and destroyed once the actor checkpoint is committed. The delete returns the
# capacity's billed spans, read from the machines' clocks (operators/billing.py); the two tasks'
# span is the capacity the run held.
GKE_CLUSTER_TASK_IDS = ("deploy_tpu_pool", "destroy_tpu_pool")
# The TPU VM: its create and delete, which surround training only (the CPU VM the conversions run
# on is not TPU time).
TPU_VM_CLUSTER_TASK_IDS = ("create_vm", "delete_vm")
TPU_VM_CHIPS = 8
# The TPU VM pipeline's bake of its boot image, on a CPU VM: its result's ``vm_spans`` are the bake
# VM's billed spans (a GKE run has no such task).
BAKE_TASK_ID = "bake_image"
BAKE_PURPOSE = "bake"
TRAIN_TASK_ID = "train"
JOB_TASK_IDS = ("convert_to_maxtext", "train", "export_to_huggingface")
ARTIFACT_TASK_IDS: Mapping[str, str] = {
    "converted_checkpoint": "wait_converted_checkpoint",
    "actor_checkpoint": "wait_actor_checkpoint",
    "hf_export": "wait_hf_export",
}
# What a pipeline's failed task leaves in XCom: the first line of its error (pipelines/failures.py),
# and how validate's refusal of a conf starts (pipelines/validate.py): the ledger reads both.
ERROR_XCOM_KEY = "tpu_rl_error"
# The capacity that served a TPU VM whose ``capacity`` is an ordered list: ``create_vm``'s XCom
# ``{"served": kind, "attempts": [{"capacity": kind, "error": line}, ...]}`` (the kinds refused first).
CAPACITY_XCOM_KEY = "capacity"
INVALID_CONF = "invalid pipeline conf: "
FAILED_STATES = frozenset({"failed", "upstream_failed"})
_STATE_PRIORITY = ("failed", "upstream_failed", "up_for_retry", "running", "deferred", "queued", "success")

Collected = tuple[RunRecord, list[StepRecord], list[MetricRecord], list[ArtifactRecord]]


def state_name(state: Any) -> str | None:
    """A task or run state as plain text (Airflow passes str enums)."""
    if state is None:
        return None
    return str(getattr(state, "value", state))


def collect_run_from_context(
    context: Mapping[str, Any],
    *,
    model: str,
    chips: int | None,
    cluster_task_ids: tuple[str, str] = GKE_CLUSTER_TASK_IDS,
    train_task_id: str = TRAIN_TASK_ID,
    job_task_ids: Sequence[str] = JOB_TASK_IDS,
    artifact_task_ids: Mapping[str, str] = ARTIFACT_TASK_IDS,
    teardown_task_ids: Iterable[str] | None = None,
    ignored_task_ids: Iterable[str] = (),
    recorded_steps: Mapping[str, StepRecord] | None = None,
    now: datetime | None = None,
    usd_per_chip_hour: float | None = None,
    billing_task_id: str | None = None,
    bake_task_id: str = BAKE_TASK_ID,
) -> Collected:
    """The run, its steps, metrics and artifacts, as the ledger stores them.

    The run is ``failed`` when a task other than a teardown (and other than ``ignored_task_ids``)
    failed or was upstream_failed, or when Airflow already marked the DAG run failed; else
    ``success``. Teardown tasks are ``teardown_task_ids`` or, when None, the DAG's tasks with
    ``is_teardown``; the calling task is always one. Billed TPU time comes from the machines'
    clocks: the spans ``billing_task_id`` (default ``cluster_task_ids[1]``, the task that deletes
    the capacity) returned under ``billed`` (:func:`billed_spans`); the capacity held is the start
    of ``cluster_task_ids[0]`` to the end of ``cluster_task_ids[1]`` (or ``now``); the TPU time that
    trained is :func:`training_span`. The CPU VM that baked the TPU VM's boot image is billed by
    the spans ``bake_task_id`` returned under ``vm_spans``, read when the run has that task.
    """
    current = now or datetime.now(UTC)
    dag_run = context["dag_run"]
    own_ti = context["ti"]
    own_task_id = own_ti.task_id

    steps, queued = _steps_from_context(context, dag_run, own_ti)
    steps.pop(own_task_id, None)
    steps = _fill_from_recorded(steps, recorded_steps or {})
    steps = _fill_from_queued(steps, queued)
    steps = _attach_job_names(steps, own_ti, job_task_ids)

    teardowns = _teardown_task_ids(context, teardown_task_ids, cluster_task_ids) | {own_task_id}
    skipped = teardowns | set(ignored_task_ids)
    failed = any(step.state in FAILED_STATES for task_id, step in steps.items() if task_id not in skipped)
    if state_name(getattr(dag_run, "state", None)) == "failed":
        failed = True

    deploy, destroy = (steps.get(task_id) for task_id in cluster_task_ids)
    cluster_started = deploy.started_at if deploy else None
    cluster_ended: datetime | None = None
    if cluster_started is not None:
        cluster_ended = (destroy.ended_at if destroy else None) or current

    train_result = _xcom(own_ti, train_task_id)
    train_started, train_ended = training_span(train_result, steps.get(train_task_id))
    billed = billed_spans(_xcom(own_ti, billing_task_id or cluster_task_ids[1]), current)
    run = RunRecord(
        dag_id=dag_run.dag_id,
        airflow_run_id=dag_run.run_id,
        model=model,
        state="failed" if failed else "success",
        started_at=as_utc(getattr(dag_run, "start_date", None)),
        ended_at=as_utc(getattr(dag_run, "end_date", None)) or current,
        chips=chips,
        cluster_started_at=as_utc(cluster_started),
        cluster_ended_at=as_utc(cluster_ended),
        conf=dict(getattr(dag_run, "conf", None) or {}),
        train_started_at=train_started,
        train_ended_at=train_ended,
        usd_per_chip_hour=usd_per_chip_hour,
        billed_spans=billed,
        vm_spans=(
            vm_spans_from_result(BAKE_PURPOSE, _xcom(own_ti, bake_task_id), current)
            if bake_task_id in steps
            else ()
        ),
        resume_loss=resume_loss(
            train_result.get("attempts") if isinstance(train_result, Mapping) else None,
            make_run_id(dag_run.dag_id, dag_run.run_id),
        ),
    )
    metrics = metrics_from_train_result(train_result)
    artifacts = [
        artifact
        for kind, task_id in artifact_task_ids.items()
        for artifact in artifacts_from_sensor_result(kind, _xcom(own_ti, task_id))
    ]
    return run, sorted(steps.values(), key=lambda step: step.task_id), metrics, artifacts


def billed_spans(result: Any, now: datetime) -> tuple[BilledSpan, ...] | None:
    """The TPU machines' RUNNING spans a capacity-deleting task returned (``{"billed": {"spans":
    [...]}}``), a span still open ended at ``now`` (the machine still ran, or its end could not be
    read, when the run was recorded); None when the task returned none (it failed, or never ran)."""
    billed = result.get("billed") if isinstance(result, Mapping) else None
    spans = spans_from_json(billed.get("spans")) if isinstance(billed, Mapping) else None
    return None if spans is None else closed_at(spans, now)


def training_span(result: Any, step: StepRecord | None) -> tuple[datetime | None, datetime | None]:
    """When the TPU trained: the training job's own running span where its task returned one
    (``{"ran": {"started_at", "ended_at"}}``: the JobSet's first pod start to its completion),
    else the train task's latest try (the TPU VM's training runs inside it). Unknown (None, None)
    when the training never ended."""
    ran = result.get("ran") if isinstance(result, Mapping) else None
    if isinstance(ran, Mapping):
        try:
            started, ended = as_utc(ran.get("started_at")), as_utc(ran.get("ended_at"))
        except (TypeError, ValueError):
            started = ended = None
        if started is not None and ended is not None and ended >= started:
            return started, ended
    if step is not None and step.started_at is not None and step.ended_at is not None:
        return as_utc(step.started_at), as_utc(step.ended_at)
    return None, None


def _steps_from_context(
    context: Mapping[str, Any], dag_run: Any, own_ti: Any
) -> tuple[dict[str, StepRecord], dict[str, datetime]]:
    """The steps the context knows, and the earliest ``queued_dttm`` of each task (a start of last resort)."""
    get_task_instances = getattr(dag_run, "get_task_instances", None)
    if callable(get_task_instances):
        instances = list(get_task_instances())
        queued: dict[str, datetime] = {}
        for ti in instances:
            when = as_utc(getattr(ti, "queued_dttm", None))
            if when is not None:
                queued[ti.task_id] = min(when, queued.get(ti.task_id, when))
        steps = _merge_mapped(
            StepRecord(
                task_id=ti.task_id,
                state=state_name(ti.state),
                try_number=getattr(ti, "try_number", None),
                started_at=task_instance_start(ti, estimate=False),
                ended_at=as_utc(getattr(ti, "end_date", None)),
            )
            for ti in instances
        )
        return steps, queued
    get_task_states = getattr(own_ti, "get_task_states", None)
    if callable(get_task_states):
        by_run = get_task_states(dag_id=dag_run.dag_id, run_ids=[dag_run.run_id])
        states: Mapping[str, Any] = by_run.get(dag_run.run_id, {})
        return {
            task_id: StepRecord(task_id=task_id, state=state_name(state)) for task_id, state in states.items()
        }, {}
    log.warning("the context offers no way to list task instances; the ledger records no steps")
    return {}, {}


def _merge_mapped(steps: Iterable[StepRecord]) -> dict[str, StepRecord]:
    """One step per task id: mapped task instances fold into one (worst state, widest time span)."""
    merged: dict[str, StepRecord] = {}
    for step in steps:
        seen = merged.get(step.task_id)
        if seen is None:
            merged[step.task_id] = step
            continue
        merged[step.task_id] = StepRecord(
            task_id=step.task_id,
            state=min((seen.state, step.state), key=_state_rank),
            try_number=max((t for t in (seen.try_number, step.try_number) if t is not None), default=None),
            started_at=min((t for t in (seen.started_at, step.started_at) if t is not None), default=None),
            ended_at=max((t for t in (seen.ended_at, step.ended_at) if t is not None), default=None),
        )
    return merged


def _state_rank(state: str | None) -> int:
    return _STATE_PRIORITY.index(state) if state in _STATE_PRIORITY else len(_STATE_PRIORITY)


def _fill_from_recorded(
    steps: dict[str, StepRecord], recorded: Mapping[str, StepRecord]
) -> dict[str, StepRecord]:
    """Fill what the context does not know (times, try, job) from steps already in the ledger."""
    filled = dict(steps)
    for task_id, old in recorded.items():
        new = filled.get(task_id)
        if new is None:
            continue
        if new.try_number is not None and old.try_number is not None and old.try_number != new.try_number:
            continue
        filled[task_id] = StepRecord(
            task_id=task_id,
            state=new.state or old.state,
            try_number=new.try_number if new.try_number is not None else old.try_number,
            started_at=new.started_at or old.started_at,
            ended_at=new.ended_at or old.ended_at,
            job_name=new.job_name or old.job_name,
        )
    return filled


def _fill_from_queued(steps: dict[str, StepRecord], queued: Mapping[str, datetime]) -> dict[str, StepRecord]:
    """A step that ended with no start known at all starts when it was queued."""
    return {
        task_id: (
            replace(step, started_at=queued[task_id])
            if step.started_at is None and step.ended_at is not None and task_id in queued
            else step
        )
        for task_id, step in steps.items()
    }


def _attach_job_names(
    steps: dict[str, StepRecord], own_ti: Any, job_task_ids: Sequence[str]
) -> dict[str, StepRecord]:
    attached = dict(steps)
    for task_id in job_task_ids:
        result = _xcom(own_ti, task_id)
        job_name = result.get("job_name") if isinstance(result, Mapping) else None
        if not job_name:
            continue
        step = attached.get(task_id) or StepRecord(task_id=task_id, state=None)
        attached[task_id] = replace(step, job_name=str(job_name))
    return attached


def _teardown_task_ids(
    context: Mapping[str, Any], given: Iterable[str] | None, cluster_task_ids: tuple[str, str]
) -> set[str]:
    if given is not None:
        return set(given)
    dag = context.get("dag")
    tasks = getattr(dag, "tasks", None)
    if tasks:
        return {task.task_id for task in tasks if getattr(task, "is_teardown", False)}
    return {cluster_task_ids[1]}


def _xcom(ti: Any, task_id: str) -> Any:
    """The return value of ``task_id`` in this run, or None (a missing or unreadable XCom)."""
    try:
        return ti.xcom_pull(task_ids=task_id, key="return_value")
    except Exception:
        log.warning("could not read the XCom of task %s; the ledger records the run without it", task_id)
        return None


def capacity_served(ti: Any, task_id: str) -> dict[str, Any] | None:
    """``task_id``'s :data:`CAPACITY_XCOM_KEY` as run settings (``capacity_served``,
    ``capacity_attempts``), or None when it left none (one kind asked, or no create ran)."""
    try:
        found = ti.xcom_pull(task_ids=task_id, key=CAPACITY_XCOM_KEY)
    except Exception:
        log.warning("could not read the capacity XCom of task %s", task_id)
        return None
    if not isinstance(found, Mapping) or not found.get("served"):
        return None
    attempts = [dict(a) for a in found.get("attempts") or () if isinstance(a, Mapping)]
    return {"capacity_served": str(found["served"]), "capacity_attempts": attempts}


# The task that deploys a create-mode GKE cluster: its result's ``cluster_origin`` says whether the
# run deployed it or took over one an earlier run kept (records.gke_cluster).
GKE_DEPLOY_CLUSTER_TASK_ID = "deploy_cluster"


def gke_cluster_of(
    ti: Any, derived: Mapping[str, Any], deploy_task_id: str = GKE_DEPLOY_CLUSTER_TASK_ID
) -> tuple[str | None, str | None]:
    """The run's GKE cluster and where it came from (:func:`records.gke_cluster`), reading
    ``deploy_task_id``'s result only for a create-mode GKE run; ``(None, None)`` without one."""
    cluster, origin = gke_cluster(derived)
    if cluster is None or origin is not None:
        return cluster, origin
    deployed = _xcom(ti, deploy_task_id)
    return gke_cluster(derived, deployed if isinstance(deployed, Mapping) else None)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _step_number(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def metrics_from_train_result(result: Any) -> list[MetricRecord]:
    """Metrics from the train task's return value ``{"metrics": {"pre", "post", "intermediate", "loss"},
    "num_test_batches": N}``.

    pre and post are stored at step 0; every numeric field becomes one metric; ``num_test_batches``
    (the evaluation's size, 0 = off) is a ``train`` metric at step 0.
    """
    if not isinstance(result, Mapping) or not isinstance(result.get("metrics"), Mapping):
        return []
    found = result["metrics"]
    metrics: list[MetricRecord] = []
    evaluated = _number(result.get(NUM_TEST_BATCHES_METRIC))
    if evaluated is not None:
        metrics.append(MetricRecord("train", 0, NUM_TEST_BATCHES_METRIC, evaluated))
    for phase in ("pre", "post"):
        values = found.get(phase)
        if isinstance(values, Mapping):
            metrics.extend(
                MetricRecord(phase, 0, str(name), number)
                for name, value in values.items()
                if (number := _number(value)) is not None
            )
    for entry in found.get("intermediate") or []:
        step = _step_number(entry.get("step")) if isinstance(entry, Mapping) else None
        if step is None:
            continue
        metrics.extend(
            MetricRecord("intermediate", step, str(name), number)
            for name, value in entry.items()
            if name != "step" and (number := _number(value)) is not None
        )
    for entry in found.get("loss") or []:
        step = _step_number(entry.get("step")) if isinstance(entry, Mapping) else None
        loss = _number(entry.get("loss")) if isinstance(entry, Mapping) else None
        if step is not None and loss is not None:
            metrics.append(MetricRecord("train", step, "loss", loss))
    return metrics


def artifacts_from_sensor_result(kind: str, result: Any) -> list[ArtifactRecord]:
    """Artifacts from a sensor's return value: its ``export_uri`` or ``checkpoint_uri``, else its ``uris``."""
    if not isinstance(result, Mapping):
        return []
    step = _step_number(result.get("step")) if result.get("step") is not None else None
    primary = result.get("export_uri") or result.get("checkpoint_uri")
    uris = [primary] if primary else list(result.get("uris") or [])
    return [ArtifactRecord(kind, str(uri), step) for uri in uris if uri]


def task_states(context: Mapping[str, Any]) -> dict[str, str | None]:
    """The state of every task of the context's DAG run (mapped instances folded), by task id."""
    steps, _ = _steps_from_context(context, context["dag_run"], context["ti"])
    return {task_id: step.state for task_id, step in steps.items()}
