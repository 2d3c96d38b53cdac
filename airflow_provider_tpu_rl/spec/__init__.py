"""Typed, validated specs. Pure Python: nothing here imports Airflow."""

from airflow_provider_tpu_rl.spec.cluster import ClusterSpec, SliceShape, TpuVmSpec
from airflow_provider_tpu_rl.spec.errors import SpecError
from airflow_provider_tpu_rl.spec.pipeline import (
    GKE_DAG_ID,
    GKE_DEFAULTS,
    TPU_VM_DAG_ID,
    TPU_VM_DEFAULTS,
    GkePipelineSpec,
    HfTokenSpec,
    TpuVmPipelineSpec,
    gke_pipeline_from_conf,
    job_name,
    run_suffix,
    tpu_vm_pipeline_from_conf,
)
from airflow_provider_tpu_rl.spec.presets import PRESETS, BlueprintEdits, ModelPreset, Runner, get_preset
from airflow_provider_tpu_rl.spec.workloads import ConversionSpec, ExportSpec, TrainingSpec

__all__ = [
    "GKE_DAG_ID",
    "GKE_DEFAULTS",
    "PRESETS",
    "TPU_VM_DAG_ID",
    "TPU_VM_DEFAULTS",
    "BlueprintEdits",
    "ClusterSpec",
    "ConversionSpec",
    "ExportSpec",
    "GkePipelineSpec",
    "HfTokenSpec",
    "ModelPreset",
    "Runner",
    "SliceShape",
    "SpecError",
    "TpuVmPipelineSpec",
    "TpuVmSpec",
    "TrainingSpec",
    "get_preset",
    "gke_pipeline_from_conf",
    "job_name",
    "run_suffix",
    "tpu_vm_pipeline_from_conf",
]
