"""Whole-pipeline specs built from a DAG run's conf (the DAG params), validated up front."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from airflow_provider_tpu_rl.spec import rules
from airflow_provider_tpu_rl.spec.cluster import ClusterSpec, TpuVmSpec
from airflow_provider_tpu_rl.spec.errors import SpecError
from airflow_provider_tpu_rl.spec.presets import POST_TRAINING_IMAGE, ModelPreset, Runner, get_preset
from airflow_provider_tpu_rl.spec.workloads import (
    ConversionSpec,
    ExportSpec,
    TrainingSpec,
    validate_overrides,
)

GKE_DAG_ID: Final = "tpu_rl_gke_pipeline"
TPU_VM_DAG_ID: Final = "tpu_rl_tpu_vm_pipeline"

# Values every run needs that no preset can know. The DAG params show them as defaults; they are
# placeholders that validate, so `tpu-rl plan` and the local sandbox work without any conf.
GKE_DEFAULTS: Final[Mapping[str, Any]] = {
    "model": "qwen3-30b-a3b",
    "project": "my-tpu-project",
    "region": "us-east5",
    "zone": "us-east5-b",
    "cluster_name": "tpu-rl",
    "bucket": "my-tpu-rl-bucket",
    "reservation": "",
    "image": None,
    "compute_type": None,
    "topology": None,
    "num_slices": None,
    "hf_model_path": None,
    "run_name": None,
    "num_batches": None,
    "train_overrides": {},
    "keep_cluster": False,
    "delete_bucket": False,
    "hf_token_conn_id": "huggingface_default",
    "hf_token_secret": None,
    "authorized_cidr": "0.0.0.0/0",
    "max_cluster_hours": 12,
}

TPU_VM_DEFAULTS: Final[Mapping[str, Any]] = {
    "model": "llama3.1-8b-Instruct",
    "project": "my-tpu-project",
    "zone": "us-east5-b",
    "vm_name": "tpu-rl-vm",
    "bucket": "my-tpu-rl-bucket",
    "reservation": "my-v6e-8-reservation",
    "hf_model_path": None,
    "run_name": None,
    "num_batches": None,
    "train_overrides": {},
    "keep_vm": False,
    "delete_bucket": False,
    "hf_token_conn_id": "huggingface_default",
    "hf_token_secret": None,
    "service_account": None,
    "max_vm_hours": 6,
}

_BOOL_KEYS: Final = {"keep_cluster", "keep_vm", "delete_bucket"}


def run_suffix(dag_id: str, run_id: str) -> str:
    """Six hex characters that identify one DAG run: the same for every retry of its tasks."""
    return hashlib.sha256(f"{dag_id}\x00{run_id}".encode()).hexdigest()[:6]


def job_name(prefix: str, suffix: str) -> str:
    """``<tutorial prefix>-<run suffix>``, at most 28 characters (gcluster's limit)."""
    rules.match("job_prefix", prefix, rules.DNS_1035, "job name prefix must be DNS-1035")
    room = 28 - len(suffix) - 1
    name = f"{prefix[:room].rstrip('-')}-{suffix}"
    return rules.job_name("job_name", name)


def secret_id_for_connection(conn_id: str) -> str:
    return "tpu-rl-hf-token-" + re.sub(r"[^a-z0-9_-]", "-", conn_id.lower())


def _merge_conf(defaults: Mapping[str, Any], conf: Mapping[str, Any] | None) -> dict[str, Any]:
    conf = dict(conf or {})
    unknown = sorted(set(conf) - set(defaults))
    if unknown:
        raise SpecError(unknown[0], f"unknown conf key; valid keys are {sorted(defaults)}", conf[unknown[0]])
    merged = {**defaults, **conf}
    for key in _BOOL_KEYS & merged.keys():
        if not isinstance(merged[key], bool):
            raise SpecError(key, "must be true or false", merged[key])
    return merged


def _pick(merged: Mapping[str, Any], key: str, preset_value: Any) -> Any:
    value = merged.get(key)
    return preset_value if value is None or value == "" else value


@dataclass(frozen=True)
class HfTokenSpec:
    """Where the HF token comes from and the Secret Manager secret the workload reads it from.

    With ``sync_from_connection`` the token is read from the Airflow connection at run time and
    written to ``secret_id`` (over stdin); otherwise ``secret_id`` already holds it.
    """

    conn_id: str
    secret_id: str
    sync_from_connection: bool

    def __post_init__(self) -> None:
        rules.match(
            "hf_token_conn_id", self.conn_id, rules.CONN_ID, "connection id must match [A-Za-z0-9_.-]+"
        )
        rules.match(
            "hf_token_secret", self.secret_id, rules.SECRET_ID, "secret id must match [A-Za-z0-9_-]{1,255}"
        )


def _hf_token(merged: Mapping[str, Any]) -> HfTokenSpec:
    conn_id = rules.require_str("hf_token_conn_id", merged["hf_token_conn_id"])
    secret = merged.get("hf_token_secret")
    if secret:
        return HfTokenSpec(conn_id=conn_id, secret_id=secret, sync_from_connection=False)
    rules.match("hf_token_conn_id", conn_id, rules.CONN_ID, "connection id must match [A-Za-z0-9_.-]+")
    return HfTokenSpec(
        conn_id=conn_id, secret_id=secret_id_for_connection(conn_id), sync_from_connection=True
    )


def _training_overrides(preset: ModelPreset, merged: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    user = validate_overrides(
        "train_overrides", {} if merged.get("train_overrides") is None else merged["train_overrides"]
    )
    combined = dict(preset.train_overrides)
    combined.update(dict(user))
    return tuple(combined.items())


def _workloads(
    preset: ModelPreset,
    merged: Mapping[str, Any],
    *,
    converted: str,
    trained: str,
    exported: str,
    default_run_name: str,
    trailing_slash: str,
    on_cluster: bool,
) -> tuple[ConversionSpec, TrainingSpec, ExportSpec]:
    """Conversion → training → export, each reading what the previous one writes.

    ``exported`` is a format string with ``{run_name}``; ``trailing_slash`` is how the tutorial
    writes the load paths ("/" on GKE, "" on the TPU VM).
    """
    model = preset.model_name
    conversion = ConversionSpec(
        model_name=model,
        output_directory=converted,
        scan_layers=preset.scan_layers,
        hf_model_path=_pick(merged, "hf_model_path", preset.hf_model_path),
        lazy_load_tensors=preset.lazy_load_tensors,
        checkpoint_storage_use_zarr3=preset.checkpoint_storage_use_zarr3,
        checkpoint_storage_use_ocdbt=preset.checkpoint_storage_use_ocdbt,
    )
    training = TrainingSpec(
        model_name=model,
        run_name=_pick(merged, "run_name", default_run_name),
        base_output_directory=trained,
        load_parameters_path=conversion.items_path + trailing_slash,
        num_batches=_pick(merged, "num_batches", preset.num_batches),
        overrides=_training_overrides(preset, merged),
    )
    export = ExportSpec(
        model_name=preset.export_model_name,
        load_parameters_path=training.actor_params_path(training.final_step) + trailing_slash,
        output_directory=exported.format(run_name=training.run_name),
        scan_layers=preset.scan_layers,
        on_cluster=on_cluster,
    )
    return conversion, training, export


@dataclass(frozen=True)
class GkePipelineSpec:
    """Everything one run of the multi-host pipeline does, derived once from the conf."""

    dag_id: str
    run_id: str
    preset: ModelPreset
    cluster: ClusterSpec
    image: str
    conversion: ConversionSpec
    training: TrainingSpec
    export: ExportSpec
    hf_token: HfTokenSpec
    keep_cluster: bool
    delete_bucket: bool
    max_cluster_hours: int

    @property
    def suffix(self) -> str:
        return run_suffix(self.dag_id, self.run_id)

    @property
    def model_prefix(self) -> str:
        return f"gs://{self.cluster.bucket}/{self.preset.model_name}"

    @property
    def pathways_gcs_location(self) -> str:
        return f"gs://{self.cluster.bucket}/pathways/"

    @property
    def convert_job(self) -> str:
        assert self.preset.job_prefixes is not None
        return job_name(self.preset.job_prefixes.convert, self.suffix)

    @property
    def train_job(self) -> str:
        assert self.preset.job_prefixes is not None
        return job_name(self.preset.job_prefixes.train, self.suffix)

    @property
    def export_job(self) -> str:
        assert self.preset.job_prefixes is not None
        return job_name(self.preset.job_prefixes.export, self.suffix)


def gke_pipeline_from_conf(
    conf: Mapping[str, Any] | None, *, dag_id: str = GKE_DAG_ID, run_id: str = "manual__plan"
) -> GkePipelineSpec:
    """Validate a conf for ``tpu_rl_gke_pipeline`` and derive every spec from it."""
    merged = _merge_conf(GKE_DEFAULTS, conf)
    preset = get_preset(merged["model"])
    if preset.runner is not Runner.GKE:
        raise SpecError(
            "model", f"{preset.model_name} runs on one TPU VM; use the {TPU_VM_DAG_ID} DAG", preset.model_name
        )
    cluster = ClusterSpec(
        project=merged["project"],
        region=merged["region"],
        zone=merged["zone"],
        cluster_name=merged["cluster_name"],
        bucket=merged["bucket"],
        reservation=merged["reservation"] if merged["reservation"] is not None else "",
        compute_type=_pick(merged, "compute_type", preset.compute_type),
        topology=_pick(merged, "topology", preset.topology),
        num_slices=_pick(merged, "num_slices", preset.num_slices),
        authorized_cidr=merged["authorized_cidr"],
        blueprint=preset.blueprint,
    )
    image = rules.image("image", _pick(merged, "image", preset.image or POST_TRAINING_IMAGE))
    prefix = f"gs://{cluster.bucket}/{preset.model_name}"
    conversion, training, export = _workloads(
        preset,
        merged,
        converted=f"{prefix}/max-text-format/",
        trained=f"{prefix}/trained/",
        # One folder per run_name (the tutorial writes hf-trained/ directly): a later run never
        # overwrites an earlier model, and "already exported" means this run's checkpoint.
        exported=prefix + "/hf-trained/{run_name}/",
        default_run_name=preset.run_name,
        trailing_slash="/",
        on_cluster=True,
    )
    return GkePipelineSpec(
        dag_id=dag_id,
        run_id=run_id,
        preset=preset,
        cluster=cluster,
        image=image,
        conversion=conversion,
        training=training,
        export=export,
        hf_token=_hf_token(merged),
        keep_cluster=merged["keep_cluster"],
        delete_bucket=merged["delete_bucket"],
        max_cluster_hours=rules.int_range("max_cluster_hours", merged["max_cluster_hours"], 1, 24 * 14),
    )


@dataclass(frozen=True)
class TpuVmPipelineSpec:
    """Everything one run of the single-host pipeline does (seed 002)."""

    dag_id: str
    run_id: str
    preset: ModelPreset
    vm: TpuVmSpec
    conversion: ConversionSpec
    training: TrainingSpec
    export: ExportSpec
    hf_token: HfTokenSpec
    keep_vm: bool
    delete_bucket: bool
    max_vm_hours: int
    service_account: str | None = None

    @property
    def suffix(self) -> str:
        return run_suffix(self.dag_id, self.run_id)

    @property
    def region(self) -> str:
        return self.vm.zone.rsplit("-", 1)[0]

    @property
    def gcs_prefix(self) -> str:
        return f"gs://{self.vm.bucket}/{self.preset.model_name}"

    @property
    def gcs_actor_checkpoint(self) -> str:
        """Where the final actor checkpoint is kept once copied out of /dev/shm."""
        step = self.training.final_step
        return f"{self.gcs_prefix}/post-train/{self.training.run_name}/checkpoints/actor/{step}"

    @property
    def gcs_actor_checkpoint_root(self) -> str:
        return f"{self.gcs_prefix}/post-train/{self.training.run_name}/checkpoints/actor/"

    @property
    def gcs_export(self) -> str:
        return f"{self.gcs_prefix}/hf-trained/{self.training.run_name}"


def tpu_vm_pipeline_from_conf(
    conf: Mapping[str, Any] | None, *, dag_id: str = TPU_VM_DAG_ID, run_id: str = "manual__plan"
) -> TpuVmPipelineSpec:
    """Validate a conf for ``tpu_rl_tpu_vm_pipeline`` and derive every spec from it."""
    merged = _merge_conf(TPU_VM_DEFAULTS, conf)
    preset = get_preset(merged["model"])
    if preset.runner is not Runner.TPU_VM:
        raise SpecError(
            "model",
            f"{preset.model_name} needs a multi-host slice; use the {GKE_DAG_ID} DAG",
            preset.model_name,
        )
    vm = TpuVmSpec(
        project=merged["project"],
        zone=merged["zone"],
        vm_name=merged["vm_name"],
        reservation=merged["reservation"],
        bucket=merged["bucket"],
        machine_type=preset.compute_type,
        topology=preset.topology,
    )
    shm = f"/dev/shm/{preset.model_name}"  # noqa: S108 - the seed keeps its outputs in /dev/shm on the VM
    conversion, training, export = _workloads(
        preset,
        merged,
        converted=f"{shm}/mt-format/",
        trained=f"{shm}/post-train/",
        exported=f"{shm}/hf-trained/",
        default_run_name=f"rl-{run_suffix(dag_id, run_id)}",
        trailing_slash="",
        on_cluster=False,
    )
    return TpuVmPipelineSpec(
        dag_id=dag_id,
        run_id=run_id,
        preset=preset,
        vm=vm,
        conversion=conversion,
        training=training,
        export=export,
        hf_token=_hf_token(merged),
        keep_vm=merged["keep_vm"],
        delete_bucket=merged["delete_bucket"],
        max_vm_hours=rules.int_range("max_vm_hours", merged["max_vm_hours"], 1, 24 * 7),
        service_account=(
            rules.match(
                "service_account",
                merged["service_account"],
                rules.SERVICE_ACCOUNT,
                "must be a service account e-mail",
            )
            if merged["service_account"]
            else None
        ),
    )
