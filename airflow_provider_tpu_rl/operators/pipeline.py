"""The pipeline DAGs' ``validate`` step (from a DAG run's params to the resolved values, once), and
how the pipelines report a failure in one line (``validate``, ``watcher``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Final, Literal, NoReturn

from airflow_provider_tpu_rl import timeouts
from airflow_provider_tpu_rl.compat import AirflowFailException, conf, exponential_backoff, task_error
from airflow_provider_tpu_rl.render.blueprint import TPU_GROUP
from airflow_provider_tpu_rl.spec import (
    GKE_DAG_ID,
    GKE_DEFAULTS,
    TPU_VM_DEFAULTS,
    GkePipelineSpec,
    SpecError,
    TpuVmPipelineSpec,
    gke_pipeline_from_conf,
    tpu_vm_pipeline_from_conf,
)
from airflow_provider_tpu_rl.spec.cluster import default_capacity
from airflow_provider_tpu_rl.spec.errors import field_name
from airflow_provider_tpu_rl.spec.pipeline import ENVIRONMENT_OPTIONS, refuse_placeholders

PipelineKind = Literal["gke", "tpu_vm"]

log = logging.getLogger(__name__)

ERROR_XCOM_KEY: Final = "tpu_rl_error"
"""XCom key under which a failed task of a pipeline leaves the first line of its error."""
_MAX_ERROR_CHARS = 500
INVALID_CONF: Final = "invalid pipeline conf: "
"""How ``validate``'s refusal of a conf starts."""


class OneLineFailure(SystemExit):
    """A task failure that is fully told by its message: a configuration error, the watcher's verdict.

    Airflow 3's task runner logs every ``Exception`` with its traceback
    (``airflow/sdk/execution_time/task_runner.py``, ``_run_task_and_map_outcome``:
    ``log.exception("Task failed with exception")``), 14 frames of which say nothing about a
    wrong zone. A ``SystemExit`` is logged as one line there (``log.error("Task exited",
    exit_code=...)``) and fails the try like any error (retries apply, so use it only on tasks
    with ``retries=0``). Airflow 2.11 fails it as ``Task failed due to SystemExit(<message>)``.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def fail_in_one_line(message: str) -> NoReturn:
    """Log ``message`` as the task's error and fail the task with it, without a traceback."""
    log.error("%s", message)
    raise OneLineFailure(message)


def first_line(error: BaseException | str | None) -> str:
    """The first non-empty line of an error's message (its class name when the message is empty).

    A first line ending in ``:`` gets the next line too (a command error's "last output:", the
    first item of a list such as preflight's problems, its ``- `` dropped).
    """
    if error is None:
        return ""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    line = lines[0]
    if line.endswith(":") and len(lines) > 1:  # "...; last output:" announces the line that says why
        line = f"{line} {lines[1].removeprefix('- ')}"
    return line if len(line) <= _MAX_ERROR_CHARS else line[: _MAX_ERROR_CHARS - 1] + "…"


def note_failure(context: Mapping[str, Any]) -> None:
    """``on_failure_callback``: leave the first line of the task's error in XCom for the watcher.

    Never raises: a callback must not hide the task's own failure.
    """
    try:
        line = first_line(task_error(context.get("exception")))
        if line:
            context["ti"].xcom_push(key=ERROR_XCOM_KEY, value=line)
    except Exception:
        log.exception("could not note this task's error for the watcher")


def failure_summary(
    states: Mapping[str, str | None],
    errors: Callable[[str], Any],
    *,
    order: Sequence[str] = (),
    ignored: Iterable[str] = (),
) -> str:
    """One line naming the failed tasks and the first line of each one's error.

    ``states`` are the run's task states; ``errors(task_id)`` gives what :func:`note_failure`
    left (None when the task left nothing, e.g. it never ran). Tasks are named in ``order``
    (the DAG's), then alphabetically. When no task failed itself, the upstream_failed ones are named.
    """
    skip = set(ignored)
    rank = {task_id: index for index, task_id in enumerate(order)}

    def named(state: str) -> list[str]:
        found = [t for t, s in states.items() if s == state and t not in skip]
        return sorted(found, key=lambda t: (rank.get(t, len(rank)), t))

    failed = named("failed")
    if not failed:
        upstream = named("upstream_failed")
        if not upstream:
            return "a task of this run failed; see the task logs"
        return f"upstream failed (no task failed itself): {', '.join(upstream)}"
    parts = []
    for task_id in failed:
        try:
            error = errors(task_id)
        except Exception:
            error = None
        # an error that starts with its task's id ("preflight: 2 problems ...") is not named twice
        said = first_line(error).removeprefix(f"{task_id}: ") if error else ""
        parts.append(f"{task_id}: {said}" if said else f"{task_id} (see its log)")
    noun = "task" if len(failed) == 1 else "tasks"
    return f"{len(failed)} {noun} failed: " + "; ".join(parts)


def conf_from_params(params: Mapping[str, Any], kind: PipelineKind) -> dict[str, Any]:
    """The pipeline conf is the DAG params restricted to the spec's keys."""
    keys = GKE_DEFAULTS if kind == "gke" else TPU_VM_DEFAULTS
    return {k: params[k] for k in keys if k in params}


def build_pipeline(
    kind: PipelineKind, conf: Mapping[str, Any], dag_id: str, run_id: str
) -> GkePipelineSpec | TpuVmPipelineSpec:
    try:
        if kind == "gke":
            return gke_pipeline_from_conf(conf, dag_id=dag_id, run_id=run_id)
        return tpu_vm_pipeline_from_conf(conf, dag_id=dag_id, run_id=run_id)
    except SpecError as err:
        raise AirflowFailException(f"{INVALID_CONF}{err}") from None


def validate_pipeline_conf(
    dag_id: str, run_id: str, conf: Mapping[str, Any] | None, params: Mapping[str, Any]
) -> dict[str, Any]:
    """Refuse unknown conf keys, bad values and the form's example values (all of them in one
    line) before anything is spent; return the resolved values."""
    kind: PipelineKind = "gke" if dag_id == GKE_DAG_ID or "cluster_name" in params else "tpu_vm"
    known = GKE_DEFAULTS if kind == "gke" else TPU_VM_DEFAULTS
    unknown = sorted(set(conf or {}) - set(known), key=str)
    if unknown:
        raise AirflowFailException(
            f"{INVALID_CONF}{field_name(unknown[0])}: unknown conf key; valid keys are {sorted(known)}"
        )
    values = conf_from_params(params, kind)
    if "reservation" in (conf or {}) and "capacity" not in (conf or {}):
        # a conf naming its reservation (or none) and no capacity: as the spec reads one (REST, CLI)
        values["capacity"] = default_capacity((conf or {})["reservation"])
    resolved = build_pipeline(kind, values, dag_id, run_id).resolved()
    try:
        refuse_placeholders(resolved, ENVIRONMENT_OPTIONS[kind])
    except SpecError as err:
        raise AirflowFailException(f"{INVALID_CONF}{err}") from None
    refuse_short_expiry(kind, resolved)
    return resolved


def refuse_short_expiry(kind: PipelineKind, resolved: Mapping[str, Any]) -> None:
    """The cluster's (VM's) expiry must cover every stage it lives through: the janitor destroys
    what is past it, and a run's jobs only renew its lease, not the label."""
    field = "max_cluster_hours" if kind == "gke" else "max_vm_hours"
    needed = timeouts.resource_hours(kind)
    hours = int(resolved[field])
    if hours >= needed:
        return
    stages = ", ".join(
        f"{stage} {timeouts.duration_text(bound)}" for stage, bound in timeouts.resource_stage_bounds(kind)
    )
    raise AirflowFailException(
        f"{INVALID_CONF}{field}: {hours} h is shorter than the {needed} h the run's stages may "
        f"take while its {'cluster' if kind == 'gke' else 'VM'} exists ({stages}; [tpu_rl] "
        "<stage>_timeout_minutes): raise it, or lower those bounds"
    )


def transient_retries() -> dict[str, Any]:
    """Retry settings for tasks whose failures can be transient (capacity, API 5xx, network).

    Operators raise ``AirflowFailException`` for configuration errors, which skips the remaining
    retries. The first delay is ``[tpu_rl] retry_delay`` seconds (default 120), doubling up to 30
    minutes: :func:`~airflow_provider_tpu_rl.compat.exponential_backoff` gives the multiplier
    each Airflow version expects (``True`` before 3.2, ``2.0`` from 3.2 on).
    """
    return {
        "retries": conf.getint("tpu_rl", "retries", fallback=3),
        "retry_delay": timedelta(seconds=conf.getfloat("tpu_rl", "retry_delay", fallback=120.0)),
        "retry_exponential_backoff": exponential_backoff(2.0),
        "max_retry_delay": timedelta(minutes=30),
    }


Value = Callable[[str], Any]


def _hf_token_arguments(value: Value) -> dict[str, Any]:
    return {
        "project_id": value("project"),
        "hf_token_conn_id": value("hf_token_conn_id"),
        "hf_token_secret": value("hf_token_secret"),
        "sync_from_connection": value("sync_hf_token"),
        "reader_service_accounts": value("secret_readers"),
    }


def gke_task_arguments(value: Value) -> dict[str, dict[str, Any]]:
    """The arguments of each ``tpu_rl_gke_pipeline`` operator, named by task id.

    ``value(key)`` gives one of ``validate``'s resolved values (``GkePipelineSpec.resolved``): the
    DAG passes a template that pulls it from XCom; a test passes the value itself.
    """
    scope = {"project_id": value("project"), "location": value("region"), "bucket": value("bucket")}
    cluster = {
        **scope,
        "zone": value("zone"),
        "cluster_name": value("cluster_name"),
        "reservation": value("reservation"),
        "capacity": value("capacity"),
        "model": value("model"),
        "compute_type": value("compute_type"),
        "topology": value("topology"),
        "num_slices": value("num_slices"),
        "authorized_cidr": value("authorized_cidr"),
        "max_cluster_hours": value("max_cluster_hours"),
        "keep_cluster": value("keep_cluster"),
    }
    job = {
        **scope,
        "cluster_name": value("cluster_name"),
        "model": value("model"),
        "image": value("image"),
        "compute_type": value("compute_type"),
        "topology": value("topology"),
        "hf_token_conn_id": value("hf_token_conn_id"),
        "hf_token_secret": value("hf_token_secret"),
    }
    # the conversions are CPU programs: the cluster's CPU node pool, not the slice's shape
    cpu_job = {key: item for key, item in job.items() if key not in ("compute_type", "topology")}
    return {
        "preflight": {
            "runner": "gke",
            "project_id": value("project"),
            "zone": value("zone"),
            "reservation": value("reservation"),
            "capacity": value("capacity"),
            "compute_type": value("compute_type"),
            "topology": value("topology"),
            "num_slices": value("num_slices"),
            "cluster_name": value("cluster_name"),
            "bucket": value("bucket"),
        },
        "ensure_bucket": scope,
        # the cluster without its TPU node pool; the pool is deployed once the conversion is done
        "deploy_cluster": {**cluster, "skip_groups": [TPU_GROUP]},
        "deploy_tpu_pool": {**cluster, "only_groups": [TPU_GROUP]},
        # keep_cluster keeps the cluster, never the TPU pool (it bills most)
        "destroy_tpu_pool": {
            **{key: item for key, item in cluster.items() if key != "keep_cluster"},
            "only_groups": [TPU_GROUP],
        },
        "sync_hf_token": _hf_token_arguments(value),
        "convert_to_maxtext": {**cpu_job, "hf_model_path": value("hf_model_path")},
        "train": {
            **job,
            "cancel_previous_writer": value("cancel_previous_writer"),
            "run_name": value("run_name"),
            "num_batches": value("num_batches"),
            "train_overrides": value("train_overrides"),
            "num_slices": value("num_slices"),
            "workload_image_patched": value("workload_image_patched"),
        },
        "export_to_huggingface": {
            **cpu_job,
            "run_name": value("run_name"),
            "checkpoint_step": value("final_step"),
            "cancel_previous_writer": value("cancel_previous_writer"),
        },
        "destroy_cluster": {
            **cluster,
            "delete_bucket": value("delete_bucket"),
            "hf_token_conn_id": value("hf_token_conn_id"),
            "hf_token_secret": value("hf_token_secret"),
        },
    }


def tpu_vm_task_arguments(value: Value) -> dict[str, dict[str, Any]]:
    """The arguments of each ``tpu_rl_tpu_vm_pipeline`` operator, named by task id (see above)."""
    vm = {
        "project_id": value("project"),
        "zone": value("zone"),
        "vm_name": value("vm_name"),
        "bucket": value("bucket"),
        "model": value("model"),
    }
    stage = {
        **vm,
        "run_name": value("run_name"),
        "num_batches": value("num_batches"),
        "train_overrides": value("train_overrides"),
        "hf_model_path": value("hf_model_path"),
        "hf_token_conn_id": value("hf_token_conn_id"),
        "hf_token_secret": value("hf_token_secret"),
        # how the TPU VM runs MaxText (its install and training; the CPU VM always installs): every
        # stage gets it, so each checks train_overrides against the MaxText that trains
        "runtime": value("runtime"),
        "workload_image": value("workload_image"),
    }
    return {
        "preflight": {
            "runner": "tpu_vm",
            "project_id": value("project"),
            "zone": value("zone"),
            "reservation": value("reservation"),
            "capacity": value("capacity"),
            "compute_type": value("compute_type"),
            "topology": value("topology"),
            "num_slices": 1,
        },
        "ensure_bucket": {
            "project_id": value("project"),
            "location": value("region"),
            "bucket": value("bucket"),
        },
        "sync_hf_token": _hf_token_arguments(value),
        "create_vm": {
            **vm,
            "reservation": value("reservation"),
            "capacity": value("capacity"),
            "service_account": value("service_account"),
            "hf_token_conn_id": value("hf_token_conn_id"),
            "hf_token_secret": value("hf_token_secret"),
            "keep_vm": value("keep_vm"),
            "max_vm_hours": value("max_vm_hours"),
        },
        "create_cpu_vm": {
            **vm,
            "cpu_machine_type": value("cpu_machine_type"),
            "service_account": value("service_account"),
            "hf_token_conn_id": value("hf_token_conn_id"),
            "hf_token_secret": value("hf_token_secret"),
            "keep_vm": value("keep_vm"),
            "max_vm_hours": value("max_vm_hours"),
        },
        "install_cpu_vm": {**stage, "stage": "install", "on_machine": "cpu"},
        "install_maxtext": {**stage, "stage": "install", "on_machine": "tpu"},
        "convert_to_maxtext": {**stage, "stage": "convert"},
        "train": {**stage, "stage": "train", "cancel_previous_writer": value("cancel_previous_writer")},
        "export_to_huggingface": {
            **stage,
            "stage": "export",
            "cancel_previous_writer": value("cancel_previous_writer"),
        },
        # The TPU VM goes as soon as the actor checkpoint is committed; the CPU VM's delete is the
        # last teardown and owns delete_bucket.
        "delete_vm": {**vm, "keep_vm": value("keep_vm"), "delete_bucket": False},
        "delete_cpu_vm": {**vm, "keep_vm": value("keep_vm"), "delete_bucket": value("delete_bucket")},
    }
