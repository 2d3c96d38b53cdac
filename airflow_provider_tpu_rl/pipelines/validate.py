"""``validate``: a DAG run's params checked whole by the spec, before anything is spent, and resolved
once into the values every later task takes (its one XCom)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Literal

from airflow.providers.common.compat.sdk import get_current_context, task

from airflow_provider_tpu_rl import timeouts
from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.ledger.collect import INVALID_CONF
from airflow_provider_tpu_rl.ledger.hook import record_run_started
from airflow_provider_tpu_rl.ledger.records import gke_cluster
from airflow_provider_tpu_rl.operators.ledger import run_settings
from airflow_provider_tpu_rl.pipelines.dag import LEDGER_CONN_ID, bounded
from airflow_provider_tpu_rl.pipelines.failures import fail_in_one_line
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


def validate_task() -> Any:
    """``validate``: refuse a bad conf (unknown keys included) before anything is spent."""

    # One XCom (return_value), not one per key: a dict return type would make TaskFlow push every
    # key apart too (``multiple_outputs``), ~30 more API calls that nothing reads.
    @task(task_id="validate", retries=0, multiple_outputs=False, **bounded("validate"))
    def validate() -> dict[str, Any]:
        """Check the whole conf with the spec; XCom the derived paths the sensors watch.

        A bad conf fails the task with its one line (no traceback: it is not a bug).
        """
        context = get_current_context()
        dag_run = context["dag_run"]
        try:
            resolved = validate_pipeline_conf(
                dag_run.dag_id, dag_run.run_id, dag_run.conf or {}, dict(context["params"])
            )
        except AirflowFailException as err:
            fail_in_one_line(str(err))
        note_run_started(context, resolved)
        return resolved

    return validate()


def note_run_started(context: Mapping[str, Any], resolved: Mapping[str, Any]) -> None:
    """List the validated run in the ledger as ``running``, with its settings (the runs dashboard
    shows it while it runs). A ledger error is logged, never raised: it must not fail the run."""
    try:
        record_run_started(
            context,
            model=str(resolved["model"]),
            chips=resolved.get("chips"),
            settings=run_settings(resolved),
            conn_id=LEDGER_CONN_ID,
            # existing mode's cluster is known now; a create-mode one's origin once it is deployed
            gke_cluster=gke_cluster(resolved),
        )
    except Exception:
        log.exception("ledger: could not list this run as running; it goes on")
