"""From a DAG run's params to the pipeline spec, once per task, at execute time."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, Literal

from airflow.providers.common.compat.sdk import AirflowFailException, BaseOperator, Context, conf

from airflow_provider_tpu_rl.hooks.gcluster import GclusterHook
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

PipelineKind = Literal["gke", "tpu_vm"]


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
        raise AirflowFailException(f"invalid pipeline conf: {err}") from None


def validate_pipeline_conf(
    dag_id: str, run_id: str, conf: Mapping[str, Any] | None, params: Mapping[str, Any]
) -> dict[str, Any]:
    """Refuse unknown conf keys and bad values before anything is spent; return derived paths."""
    kind: PipelineKind = "gke" if dag_id == GKE_DAG_ID or "cluster_name" in params else "tpu_vm"
    known = GKE_DEFAULTS if kind == "gke" else TPU_VM_DEFAULTS
    unknown = sorted(set(conf or {}) - set(known))
    if unknown:
        raise AirflowFailException(
            f"invalid pipeline conf: {unknown[0]}: unknown conf key; valid keys are {sorted(known)}"
        )
    pipeline = build_pipeline(kind, conf_from_params(params, kind), dag_id, run_id)
    training = pipeline.training
    derived: dict[str, Any] = {
        "model": pipeline.preset.model_name,
        "suffix": pipeline.suffix,
        "final_step": training.final_step,
        "run_name": training.run_name,
    }
    if isinstance(pipeline, GkePipelineSpec):
        derived |= {
            "cluster_name": pipeline.cluster.cluster_name,
            "chips": pipeline.cluster.total_chips,
            "converted_root": pipeline.conversion.output_directory,
            "actor_root": training.actor_checkpoint_root,
            "export_uri": pipeline.export.output_directory,
            "jobs": {
                "convert": pipeline.convert_job,
                "train": pipeline.train_job,
                "export": pipeline.export_job,
            },
        }
    else:
        derived |= {
            "vm_name": pipeline.vm.vm_name,
            "chips": pipeline.vm.chips,
            "actor_root": pipeline.gcs_actor_checkpoint_root,
            "export_uri": pipeline.gcs_export + "/",
        }
    return derived


def transient_retries() -> dict[str, Any]:
    """Retry settings for tasks whose failures can be transient (capacity, API 5xx, network).

    Operators raise ``AirflowFailException`` for configuration errors, which skips the remaining
    retries. The first delay is ``[tpu_rl] retry_delay`` seconds (default 120), doubling up to 30
    minutes; the multiplier is a float on Airflow 3.3 (``True`` would mean a constant delay).
    """
    return {
        "retries": conf.getint("tpu_rl", "retries", fallback=3),
        "retry_delay": timedelta(seconds=conf.getfloat("tpu_rl", "retry_delay", fallback=120.0)),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(minutes=30),
    }


def run_expiry(context: Context, hours: int) -> int:
    """Expiry label: the run's start plus the allowed hours (the same value on every retry)."""
    dag_run = context.get("dag_run")
    start = getattr(dag_run, "start_date", None) or getattr(dag_run, "logical_date", None)
    started = start.timestamp() if start is not None else time.time()
    return int(started + hours * 3600)


class PipelineOperator(BaseOperator):
    """Base of the pipeline operators: the spec comes from the run's params (or ``pipeline_conf``)."""

    template_fields: Sequence[str] = ("pipeline_conf",)
    pipeline_kind: PipelineKind = "gke"

    def __init__(
        self,
        *,
        pipeline_conf: dict[str, Any] | None = None,
        gcluster_conn_id: str = GclusterHook.default_conn_name,
        gcp_conn_id: str = "google_cloud_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.pipeline_conf = pipeline_conf
        self.gcluster_conn_id = gcluster_conn_id
        self.gcp_conn_id = gcp_conn_id
        self._hook: GclusterHook | None = None

    def pipeline_conf_for(self, context: Context) -> dict[str, Any]:
        """The conf this task runs with: ``pipeline_conf`` or the run's params."""
        if self.pipeline_conf is not None:
            return dict(self.pipeline_conf)
        return conf_from_params(context["params"], self.pipeline_kind)

    def pipeline(self, context: Context) -> Any:
        return build_pipeline(
            self.pipeline_kind, self.pipeline_conf_for(context), self.dag_id, context["run_id"]
        )

    @property
    def hook(self) -> GclusterHook:
        if self._hook is None:
            self._hook = GclusterHook(gcluster_conn_id=self.gcluster_conn_id)
        return self._hook

    def on_kill(self) -> None:
        if self._hook is not None:
            self._hook.terminate()
