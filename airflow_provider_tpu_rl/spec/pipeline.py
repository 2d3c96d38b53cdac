"""Whole-pipeline specs built from a DAG run's conf (the DAG params), validated up front."""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Final

from airflow_provider_tpu_rl.maxtext.layout import run_dir
from airflow_provider_tpu_rl.spec import params, rules
from airflow_provider_tpu_rl.spec.cluster import (
    BAKE_VM_MACHINE_TYPE,
    CPU_VM_MACHINE_TYPE,
    FALLBACK,
    K8S_NAME,
    ClusterSpec,
    CpuVmSpec,
    GkeJobTarget,
    TpuVmSpec,
    bake_vm_name,
    capacity_order,
    capacity_value,
    cpu_vm_name,
    default_capacity,
    require_reservation_name,
    with_fallback,
)
from airflow_provider_tpu_rl.spec.errors import SpecError
from airflow_provider_tpu_rl.spec.existing_cluster import (
    COMPUTE_CLASS_CREATE_MODE,
    COMPUTE_CLASS_ROUTE,
    CREATE,
    EXISTING,
    EXISTING_CLUSTER_VALUE,
    EXISTING_ONE_KIND,
    POOLS_ROUTE,
    ExistingCluster,
    RunPools,
    capacity_route,
    cluster_mode,
    job_target_on,
    parse_existing_cluster,
)
from airflow_provider_tpu_rl.spec.params import TPU_VM_RUNTIMES
from airflow_provider_tpu_rl.spec.presets import (
    GKE_MAXTEXT_VERSION,
    POST_TRAINING_IMAGE,
    ModelPreset,
    Runner,
    get_preset,
)
from airflow_provider_tpu_rl.spec.workloads import (
    DEFAULT_CHECKPOINT_PERIOD,
    ConversionSpec,
    ExportSpec,
    TrainingSpec,
    actor_params_path,
    check_patched_image,
    validate_overrides,
)

GKE_DAG_ID: Final = "tpu_rl_gke_pipeline"
TPU_VM_DAG_ID: Final = "tpu_rl_tpu_vm_pipeline"

# The defaults, examples, per-environment options and JSON types of the conf keys come from the
# run parameters' table (spec/params.py). The capacity a first run needs is on-demand: no
# reservation to buy or name, no preemption, no queue (README, "TPU capacity"); a `[tpu_rl]
# default_*_reservation` makes `reservation` the forms' default (pipelines/form.py).
GKE_DEFAULTS: Final[Mapping[str, Any]] = MappingProxyType(params.defaults_of(params.GKE))
TPU_VM_DEFAULTS: Final[Mapping[str, Any]] = MappingProxyType(params.defaults_of(params.TPU_VM))

# The form's examples: a value every user must replace. `validate` refuses them (one line naming
# the field), `tpu-rl plan` marks them.
PLACEHOLDERS: Final[Mapping[str, tuple[str, str]]] = MappingProxyType(params.placeholders_table())

# The values every run of one Airflow environment shares: each form field's default comes from its
# ``[tpu_rl]`` option when the option is set, else from the defaults above. Per pipeline: the two
# reservations differ in shape.
ENVIRONMENT_OPTIONS: Final[Mapping[str, Mapping[str, str]]] = MappingProxyType(
    {pipeline: MappingProxyType(params.environment_options_of(pipeline)) for pipeline in params.PIPELINES}
)

# The task order of each pipeline DAG, written once: the DAG files chain their tasks in this order,
# `tpu-rl plan` lists commands in it and the structure test checks both against it.
GKE_TASK_ORDER: Final = (
    "validate",
    "preflight",
    "ensure_bucket",
    "deploy_cluster",
    "sync_hf_token",
    # The training image copied into the run's own Artifact Registry repository (once per digest),
    # beside the cluster and the conversion (GKE_SIDE_TASKS), so the TPU node pool streams it.
    "copy_workload_image",
    "convert_to_maxtext",
    "wait_converted_checkpoint",
    "deploy_tpu_pool",
    "train",
    "wait_actor_checkpoint",
    "destroy_tpu_pool",
    "export_to_huggingface",
    "wait_hf_export",
    "promote_model",
    "destroy_cluster",
    "record_run",
)
TPU_VM_TASK_ORDER: Final = (
    "validate",
    "preflight",
    "ensure_bucket",
    "sync_hf_token",
    # The TPU VM's boot image, baked beside the CPU VM's tasks (TPU_VM_SIDE_TASKS): Docker and the
    # workload image on its disk, so the billed TPU VM installs and pulls nothing.
    "bake_image",
    "delete_bake_vm",
    # The conversions force JAX onto the CPU: they run on a CPU VM, GCS to GCS.
    "create_cpu_vm",
    "install_cpu_vm",
    "convert_to_maxtext",
    "wait_converted_checkpoint",
    # The TPU VM exists only around training: created once the converted checkpoint is committed,
    # deleted as soon as the actor checkpoint is (a teardown: also when training failed).
    "create_vm",
    "install_maxtext",
    "train",
    "wait_actor_checkpoint",
    "delete_vm",
    "export_to_huggingface",
    "wait_hf_export",
    "promote_model",
    "delete_cpu_vm",
    "record_run",
)
# Tasks of TPU_VM_TASK_ORDER that run beside the main line instead of after the task before them:
# task -> the one it follows. The bake costs no TPU time and, running while the CPU VM installs and
# converts, no wall time on the way to training; create_vm waits for it (the DAG's joins).
TPU_VM_SIDE_TASKS: Final[Mapping[str, str]] = MappingProxyType(
    {"bake_image": "sync_hf_token", "delete_bake_vm": "bake_image"}
)
# Tasks of GKE_TASK_ORDER that run beside the main line (task -> the one it follows): the image's
# copy costs no TPU time; deploy_tpu_pool waits for it (the DAG's join).
GKE_SIDE_TASKS: Final[Mapping[str, str]] = MappingProxyType({"copy_workload_image": "preflight"})
# The GKE pipeline's job tasks; a job's default name derives from its task id.
GKE_JOB_TASKS: Final = {"convert": "convert_to_maxtext", "train": "train", "export": "export_to_huggingface"}


def run_suffix(dag_id: str, run_id: str) -> str:
    """Six hex characters that identify one DAG run: the same for every retry of its tasks."""
    return hashlib.sha256(f"{dag_id}\x00{run_id}".encode()).hexdigest()[:6]


def job_suffix(dag_id: str, run_id: str, task_id: str) -> str:
    """Six hex characters for one task of one DAG run: stable across retries, distinct per task."""
    return hashlib.sha256(f"{dag_id}\x00{run_id}\x00{task_id}".encode()).hexdigest()[:6]


def default_job_name(prefix: str, dag_id: str, run_id: str, task_id: str) -> str:
    """The job name a task submits when none is given: the tutorial's prefix and a task suffix."""
    return job_name(prefix, job_suffix(dag_id, run_id, task_id))


def job_name(prefix: str, suffix: str) -> str:
    """``<tutorial prefix>-<run suffix>``, at most 28 characters (gcluster's limit)."""
    rules.match("job_prefix", prefix, rules.DNS_1035, "job name prefix must be DNS-1035")
    room = 28 - len(suffix) - 1
    name = f"{prefix[:room].rstrip('-')}-{suffix}"
    return rules.job_name("job_name", name)


def secret_id_for_connection(conn_id: str) -> str:
    return "tpu-rl-hf-token-" + re.sub(r"[^a-z0-9_-]", "-", conn_id.lower())


def check_conf_type(key: str, value: Any) -> None:
    """A conf value has its JSON type (one line naming the field otherwise); numbers are finite.

    Checked before anything else, so a wrong type is one line; a nullable key may be null or ""
    (the preset's value).
    """
    found = params.conf_kind(key)
    if found is None:
        return
    kind, nullable = found
    if nullable and (value is None or value == ""):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError(key, "must be a finite number", value)
    ok = {
        "str": isinstance(value, str),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "object": isinstance(value, Mapping),
        "list": isinstance(value, list | tuple) and all(isinstance(item, str) for item in value),
        "str_list": isinstance(value, str)
        or (isinstance(value, list | tuple) and all(isinstance(item, str) for item in value)),
    }[kind]
    if not ok:
        raise SpecError(key, params.TYPE_RULES[kind], value)


def _merge_conf(defaults: Mapping[str, Any], conf: Mapping[str, Any] | None) -> dict[str, Any]:
    if conf is not None and not isinstance(conf, Mapping):
        raise SpecError("conf", "must be a JSON object", conf)
    conf = dict(conf or {})
    unknown = sorted(set(conf) - set(defaults), key=str)
    if unknown:
        raise SpecError(
            str(unknown[0]), f"unknown conf key; valid keys are {sorted(defaults)}", conf[unknown[0]]
        )
    merged = {**defaults, **conf}
    for key, value in merged.items():
        check_conf_type(key, value)
    if "capacity" in defaults and "capacity" not in conf:
        # a conf naming a reservation and no capacity consumes it (as before capacity was a key)
        merged["capacity"] = default_capacity(merged["reservation"])
    if merged.get(FALLBACK):
        # the kinds tried after capacity (the forms' list field): one ordered capacity from here on
        merged["capacity"] = capacity_value(with_fallback(merged["capacity"], merged[FALLBACK]))
    return merged


def placeholders(resolved: Mapping[str, Any]) -> dict[str, str]:
    """The fields of a conf (or of ``validate``'s resolved values) still holding the form's example."""
    return {
        field: value
        for field, (value, _) in PLACEHOLDERS.items()
        if field in resolved and resolved[field] == value
    }


def refuse_placeholders(resolved: Mapping[str, Any], options: Mapping[str, str] | None = None) -> None:
    """One SpecError naming every field that still holds the form's example value.

    ``options`` (field → ``[tpu_rl]`` option, :data:`ENVIRONMENT_OPTIONS`) adds where to set them
    once for the whole Airflow environment.
    """
    found = placeholders(resolved)
    if not found:
        return
    todo = "; ".join(
        f"{PLACEHOLDERS[field][1]} ({value} is the form's example)" for field, value in found.items()
    )
    named = [options[field] for field in found if options and field in options]
    once = f"; or set [tpu_rl] {', '.join(named)} once for this Airflow" if named else ""
    raise SpecError(", ".join(found), todo + once, show_value=False)


MIN_REWARD_GAIN_BOUND: Final = 1000.0


def min_reward_gain(value: Any) -> float | None:
    """The promotion gate's threshold: None (no gate) for null or "", else a finite number in
    [-1000, 1000] (a mean reward's gain; negative allows a model somewhat worse than its base)."""
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SpecError("min_reward_gain", "must be a finite number", value)
    if abs(value) > MIN_REWARD_GAIN_BOUND:
        raise SpecError("min_reward_gain", "must be between -1000 and 1000", value)
    return float(value)


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
        rules.match("hf_token_conn_id", self.conn_id, rules.CONN_ID, rules.CONN_ID_RULE)
        rules.match(
            "hf_token_secret",
            self.secret_id,
            rules.SECRET_ID,
            rules.SECRET_ID_RULE,
        )


def _hf_token(merged: Mapping[str, Any]) -> HfTokenSpec:
    conn_id = rules.require_str("hf_token_conn_id", merged["hf_token_conn_id"])
    secret = merged.get("hf_token_secret")
    if secret:
        return HfTokenSpec(conn_id=conn_id, secret_id=secret, sync_from_connection=False)
    rules.match("hf_token_conn_id", conn_id, rules.CONN_ID, rules.CONN_ID_RULE)
    return HfTokenSpec(
        conn_id=conn_id, secret_id=secret_id_for_connection(conn_id), sync_from_connection=True
    )


def gcs_model_prefix(bucket: str, model: str) -> str:
    return f"gs://{rules.bucket_name('bucket', bucket)}/{model}"


def converted_directory(bucket: str, model: str) -> str:
    """Where ``to_maxtext`` writes a model's converted checkpoint on GKE (one per model)."""
    return f"{gcs_model_prefix(bucket, model)}/max-text-format/"


def trained_directory(bucket: str, model: str) -> str:
    """MaxText ``base_output_directory`` of the GKE training runs (one folder per run_name)."""
    return f"{gcs_model_prefix(bucket, model)}/trained/"


def export_directory(bucket: str, model: str, run_name: str) -> str:
    """Where a run's Hugging Face export goes: one folder per run_name, never overwritten by another."""
    return f"{gcs_model_prefix(bucket, model)}/hf-trained/{run_name}/"


# The values a GKE cluster is built from (a run's conf, an operator's arguments, a janitor record).
CLUSTER_ARGUMENTS: Final = (
    "region",
    "zone",
    "cluster_name",
    "bucket",
    "reservation",
    "capacity",
    "compute_type",
    "topology",
    "num_slices",
    "authorized_cidr",
)


# The cluster arguments an empty value leaves to the preset (or to ClusterSpec's default).
_CLUSTER_DEFAULTED: Final = frozenset({"reservation", "capacity", "compute_type", "topology", "num_slices"})


def cluster_from_arguments(arguments: Mapping[str, Any], model: str | None, *, project: str) -> ClusterSpec:
    """The one way a GKE cluster's spec is built, from plain values: the pipeline's conf, a
    deploy or destroy operator's arguments, a janitor's resource record.

    A shape value or a capacity left empty (None or "") takes the model preset's (the blueprint
    edits always come from it), else ``ClusterSpec``'s own default; an empty capacity is the
    reservation's (``default_capacity``). Every other value is checked as given.
    """
    unknown = sorted(set(arguments) - set(CLUSTER_ARGUMENTS))
    if unknown:
        raise SpecError(
            unknown[0], f"not a cluster argument; they are {list(CLUSTER_ARGUMENTS)}", show_value=False
        )
    preset = get_preset(model, "model", Runner.GKE) if model else None
    values = {
        key: value
        for key, value in arguments.items()
        if key not in _CLUSTER_DEFAULTED or value not in (None, "")
    }
    values["reservation"] = arguments.get("reservation") or ""
    if "num_slices" in values:
        values["num_slices"] = rules.integer("num_slices", values["num_slices"], 1, 64)
    for key in ("compute_type", "topology", "num_slices"):
        if key not in values and preset is not None:
            values[key] = getattr(preset, key)
    values.setdefault("capacity", default_capacity(values["reservation"]))
    if preset is not None:
        values["blueprint"] = preset.blueprint
    return ClusterSpec(project=project, **values)


def conversion_spec(
    preset: ModelPreset, output_directory: str, hf_model_path: str | None = None
) -> ConversionSpec:
    """HF→MaxText conversion of ``preset`` (``hf_model_path`` empty = the preset's checkpoint)."""
    return ConversionSpec(
        model_name=preset.model_name,
        output_directory=output_directory,
        scan_layers=preset.scan_layers,
        hf_model_path=hf_model_path or preset.hf_model_path,
        lazy_load_tensors=preset.lazy_load_tensors,
        checkpoint_storage_use_zarr3=preset.checkpoint_storage_use_zarr3,
        checkpoint_storage_use_ocdbt=preset.checkpoint_storage_use_ocdbt,
    )


def training_spec(
    preset: ModelPreset,
    *,
    run_name: str,
    base_output_directory: str,
    load_parameters_path: str,
    num_batches: int | None = None,
    train_overrides: Mapping[str, Any] | None = None,
    workload_image_patched: bool = False,
) -> TrainingSpec:
    """GRPO training of ``preset``: its overrides, then the user's (``train_overrides``)."""
    user = validate_overrides(
        "train_overrides",
        {} if train_overrides is None else train_overrides,
        maxtext_version=preset.maxtext_version,
    )
    combined = dict(preset.train_overrides)
    combined.setdefault("checkpoint_period", str(DEFAULT_CHECKPOINT_PERIOD))  # bounds lost work
    combined.update(dict(user))
    return TrainingSpec(
        model_name=preset.model_name,
        maxtext_version=preset.maxtext_version,
        run_name=run_name,
        base_output_directory=base_output_directory,
        load_parameters_path=load_parameters_path,
        num_batches=preset.num_batches if num_batches in (None, "") else num_batches,  # type: ignore[arg-type]
        overrides=tuple(combined.items()),
        workload_image_patched=workload_image_patched,
    )


def export_spec(preset: ModelPreset, *, load_parameters_path: str, output_directory: str) -> ExportSpec:
    """MaxText→HF export of a trained ``preset`` checkpoint."""
    return ExportSpec(
        model_name=preset.export_model_name,
        load_parameters_path=load_parameters_path,
        output_directory=output_directory,
        scan_layers=preset.scan_layers,
    )


def workload_image(preset: ModelPreset, image: str | None) -> str:
    """The GKE jobs' image: the one given, else the preset's, else the post-training image."""
    return rules.image("image", image or preset.image or POST_TRAINING_IMAGE)


def default_shape(runner: Runner) -> tuple[str, str]:
    """``(compute_type, topology)`` of the pipeline's default model preset: what a task given no
    shape (preflight) checks."""
    pipeline = params.GKE if runner is Runner.GKE else params.TPU_VM
    preset = get_preset(params.PARAMS_BY_KEY["model"].default_on(pipeline), runner=runner)
    return preset.compute_type, preset.topology


def gke_job_target(
    preset: ModelPreset,
    *,
    project: str,
    location: str,
    cluster_name: str,
    image: str | None = None,
    compute_type: str | None = None,
    topology: str | None = None,
    num_slices: Any = None,
) -> GkeJobTarget:
    """Where a GKE job of ``preset`` runs: the slice's shape and image, each the preset's when empty."""
    return GkeJobTarget(
        project=project,
        location=location,
        cluster_name=cluster_name,
        image=workload_image(preset, image),
        compute_type=compute_type or preset.compute_type,
        topology=topology or preset.topology,
        num_slices=preset.num_slices
        if num_slices in (None, "")
        else rules.integer("num_slices", num_slices, 1, 64),
    )


# The GKE pipeline's workloads from plain values: what ``gke_pipeline_from_conf`` and the GKE job
# operators (``operators/gke_jobs.py``) both build them with, paths derived from the bucket the same
# way. The TPU VM's stages build their whole pipeline spec (``tpu_vm_pipeline_from_conf``).
def gke_conversion(
    preset: ModelPreset, *, bucket: str, hf_model_path: str | None = None, output_directory: str | None = None
) -> ConversionSpec:
    """``to_maxtext`` of ``preset`` into the bucket's converted folder (one per model)."""
    return conversion_spec(
        preset, output_directory or converted_directory(bucket, preset.model_name), hf_model_path or None
    )


def gke_training(
    preset: ModelPreset,
    *,
    bucket: str,
    run_name: str,
    num_batches: Any = None,
    train_overrides: Mapping[str, Any] | None = None,
    workload_image_patched: bool = False,
    load_parameters_path: str | None = None,
    base_output_directory: str | None = None,
) -> TrainingSpec:
    """GRPO training from the converted checkpoint into the bucket's trained folder."""
    return training_spec(
        preset,
        run_name=run_name,
        base_output_directory=base_output_directory or trained_directory(bucket, preset.model_name),
        load_parameters_path=load_parameters_path or gke_conversion(preset, bucket=bucket).items_path + "/",
        num_batches=None if num_batches in (None, "") else rules.integer("num_batches", num_batches, 1),
        train_overrides=train_overrides or {},
        workload_image_patched=workload_image_patched,
    )


def gke_export(
    preset: ModelPreset,
    *,
    bucket: str,
    run_name: str,
    checkpoint_step: Any = None,
    load_parameters_path: str | None = None,
    output_directory: str | None = None,
) -> ExportSpec:
    """``to_huggingface`` of a run's actor checkpoint (the preset's last step unless given) into
    its own export folder."""
    step = (
        preset.num_batches
        if checkpoint_step in (None, "")
        else rules.integer("checkpoint_step", checkpoint_step, 1)
    )
    return export_spec(
        preset,
        load_parameters_path=load_parameters_path
        or actor_params_path(trained_directory(bucket, preset.model_name), run_name, step) + "/",
        output_directory=output_directory or export_directory(bucket, preset.model_name, run_name),
    )


def _workloads(
    preset: ModelPreset,
    merged: Mapping[str, Any],
    *,
    converted: str,
    trained: str,
    exported: str,
    default_run_name: str,
    trailing_slash: str,
) -> tuple[ConversionSpec, TrainingSpec, ExportSpec]:
    """Conversion → training → export, each reading what the previous one writes.

    ``exported`` is a format string with ``{run_name}``; ``trailing_slash`` is how the tutorial
    writes the load paths ("/" on GKE, "" on the TPU VM).
    """
    conversion = conversion_spec(preset, converted, _pick(merged, "hf_model_path", None))
    training = training_spec(
        preset,
        run_name=_pick(merged, "run_name", default_run_name),
        base_output_directory=trained,
        load_parameters_path=conversion.items_path + trailing_slash,
        num_batches=_pick(merged, "num_batches", None),
        train_overrides=merged.get("train_overrides") or {},
        workload_image_patched=merged.get("workload_image_patched", False),
    )
    export = export_spec(
        preset,
        load_parameters_path=training.actor_params_path(training.final_step) + trailing_slash,
        output_directory=exported.format(run_name=training.run_name),
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
    cancel_previous_writer: bool = False
    min_reward_gain: float | None = None  # the promotion gate (None: no gate)
    # The Artifact Registry repository the training image is copied into and streamed from by the
    # TPU node pool (render/image_stream.py); "" = no copy, the pool pulls the image whole.
    image_repository: str = ""

    @property
    def streams_image(self) -> bool:
        """The TPU node pool streams the training image (copied into :attr:`image_repository`)."""
        return bool(self.image_repository)

    # cluster_mode existing: the cluster the run does not own, its LocalQueue and CPU pool (empty:
    # the only LocalQueue; the run's own CPU pool)
    existing: ExistingCluster | None = None
    kueue_queue: str = ""
    cpu_node_pool: str = ""
    # how the TPU nodes come in existing mode: the run's own pools, or its ComputeClass
    capacity_route: str = POOLS_ROUTE

    @property
    def compute_class(self) -> bool:
        """The run's TPU nodes come from its ComputeClass (existing mode, ``compute-class``)."""
        return self.capacity_route == COMPUTE_CLASS_ROUTE

    @property
    def suffix(self) -> str:
        return run_suffix(self.dag_id, self.run_id)

    @property
    def cluster_mode(self) -> str:
        return CREATE if self.existing is None else EXISTING

    @property
    def run_pools(self) -> RunPools | None:
        """The node pools the run adds to the existing cluster (None in *create* mode)."""
        if self.existing is None:
            return None
        c = self.cluster
        return RunPools(self.existing, self.suffix, c.zone, c.shape, c.num_slices, self.cpu_node_pool)

    @property
    def pathways_gcs_location(self) -> str:
        return pathways_gcs_location(self.cluster.bucket)

    @property
    def job_target(self) -> GkeJobTarget:
        target = self._create_job_target
        pools = self.run_pools
        return (
            target
            if pools is None
            else job_target_on(
                target, pools.cluster, pools.suffix, pools.cpu_pool, self.kueue_queue, self.capacity_route
            )
        )

    @property
    def _create_job_target(self) -> GkeJobTarget:
        c = self.cluster
        return gke_job_target(
            self.preset,
            project=c.project,
            location=c.region,
            cluster_name=c.cluster_name,
            image=self.image,
            compute_type=c.compute_type,
            topology=c.topology,
            num_slices=c.num_slices,
        )

    @property
    def cpu_job_target(self) -> GkeJobTarget:
        """Where the conversions run: the cluster's CPU node pool (they are CPU programs)."""
        target = self._create_job_target.on_cpu()
        pools = self.run_pools
        return (
            target
            if pools is None
            else job_target_on(target, pools.cluster, pools.suffix, pools.cpu_pool, self.kueue_queue)
        )

    @property
    def token_resource(self) -> str:
        return secret_version(self.cluster.project, self.hf_token.secret_id)

    def _job(self, kind: str) -> str:
        assert self.preset.job_prefixes is not None
        prefix = getattr(self.preset.job_prefixes, kind)
        return default_job_name(prefix, self.dag_id, self.run_id, GKE_JOB_TASKS[kind])

    @property
    def convert_job(self) -> str:
        return self._job("convert")

    @property
    def train_job(self) -> str:
        return self._job("train")

    @property
    def export_job(self) -> str:
        return self._job("export")

    @property
    def written_run_dirs(self) -> tuple[str, str]:
        """The run's own directories, each claimed by one writer: its training's and its export's
        (``preflight`` reads their claims, ``train`` and ``export_to_huggingface`` take them)."""
        t = self.training
        return run_dir(f"{t.base_output_directory.rstrip('/')}/{t.run_name}"), run_dir(
            self.export.output_directory
        )

    def resolved(self) -> dict[str, Any]:
        """Every value the pipeline's operators take, resolved once (``validate``'s XCom)."""
        c, t = self.cluster, self.training
        return {
            "model": self.preset.model_name,
            "project": c.project,
            "region": c.region,
            "zone": c.zone,
            "cluster_name": c.cluster_name,
            "bucket": c.bucket,
            "reservation": c.reservation,
            "capacity": capacity_value(c.capacities),
            "compute_type": c.compute_type,
            "topology": c.topology,
            "num_slices": c.num_slices,
            "authorized_cidr": c.authorized_cidr,
            "image": self.image,
            "image_repository": self.image_repository,
            "workload_image_patched": t.workload_image_patched,
            **workload_values(self.preset, self.conversion, t, self.hf_token),
            # existing mode: none (the toolkit cluster's accounts are not there; the platform team
            # grants the run's pools' node account: docs/platform-teams.md)
            "secret_readers": []
            if self.existing
            else [c.workload_service_account, c.node_pool_service_account],
            "keep_cluster": self.keep_cluster,
            "delete_bucket": self.delete_bucket,
            "max_cluster_hours": self.max_cluster_hours,
            "cancel_previous_writer": self.cancel_previous_writer,
            "min_reward_gain": self.min_reward_gain,
            "suffix": self.suffix,
            "final_step": t.final_step,
            "chips": c.total_chips,
            "converted_root": self.conversion.output_directory,
            "actor_root": t.actor_checkpoint_root,
            "export_uri": self.export.output_directory,
            "run_dirs": dict(zip(("train", "export"), self.written_run_dirs, strict=True)),
            "jobs": {"convert": self.convert_job, "train": self.train_job, "export": self.export_job},
            "cluster_mode": self.cluster_mode,
            "existing_cluster": self.existing.where if self.existing else "",
            "kueue_queue": self.kueue_queue,
            "cpu_node_pool": self.cpu_node_pool,
            "capacity_route": self.capacity_route,
        }


def workload_values(
    preset: ModelPreset, conversion: ConversionSpec, training: TrainingSpec, token: HfTokenSpec
) -> dict[str, Any]:
    """The resolved workload values both pipelines share."""
    return {
        "hf_model_path": conversion.hf_model_path,
        "run_name": training.run_name,
        "num_batches": training.num_batches,
        "train_overrides": user_overrides(preset, training),
        "hf_token_conn_id": token.conn_id,
        "hf_token_secret": token.secret_id,
        "sync_hf_token": token.sync_from_connection,
    }


def user_overrides(preset: ModelPreset, training: TrainingSpec) -> dict[str, str]:
    """The training overrides that are not the preset's own (what ``train_overrides`` added)."""
    own = dict(preset.train_overrides)
    return {k: v for k, v in training.overrides if own.get(k) != v}


def pathways_gcs_location(bucket: str) -> str:
    return f"gs://{bucket}/pathways/"


def secret_version(project: str, secret_id: str) -> str:
    """The Secret Manager resource a workload reads the HF token from."""
    return f"projects/{project}/secrets/{secret_id}/versions/latest"


def hf_token_spec(conn_id: str, secret_id: str | None) -> HfTokenSpec:
    """``secret_id`` given: the token is already there; else it is synced from the connection."""
    return _hf_token({"hf_token_conn_id": conn_id, "hf_token_secret": secret_id})


def gke_pipeline_from_conf(
    conf: Mapping[str, Any] | None, *, dag_id: str = GKE_DAG_ID, run_id: str = "manual__plan"
) -> GkePipelineSpec:
    """Validate a conf for ``tpu_rl_gke_pipeline`` and derive every spec from it."""
    merged = _merge_conf(GKE_DEFAULTS, conf)
    preset = get_preset(merged["model"], runner=Runner.GKE)
    if preset.runner is not Runner.GKE:
        raise SpecError(
            "model", f"{preset.model_name} runs on one TPU VM; use the {TPU_VM_DAG_ID} DAG", preset.model_name
        )
    cluster = cluster_from_arguments(
        {key: merged[key] for key in CLUSTER_ARGUMENTS}, preset.model_name, project=merged["project"]
    )
    image = check_patched_image(workload_image(preset, merged["image"]), merged["workload_image_patched"])
    # Unique per DAG run (outputs are keyed by run_name): a second run trains its own model. One
    # export folder per run_name (the tutorial writes hf-trained/ directly): a later run never
    # overwrites an earlier model, and "already exported" means this run's checkpoint.
    conversion = gke_conversion(preset, bucket=cluster.bucket, hf_model_path=merged["hf_model_path"])
    training = gke_training(
        preset,
        bucket=cluster.bucket,
        run_name=_pick(merged, "run_name", f"rl-{run_suffix(dag_id, run_id)}"),
        num_batches=merged["num_batches"],
        train_overrides=merged["train_overrides"],
        workload_image_patched=merged["workload_image_patched"],
    )
    export = gke_export(
        preset, bucket=cluster.bucket, run_name=training.run_name, checkpoint_step=training.final_step
    )
    route = capacity_route(merged["capacity_route"] or POOLS_ROUTE)
    existing = _existing_cluster(merged, cluster, route)
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
        cancel_previous_writer=merged["cancel_previous_writer"],
        min_reward_gain=min_reward_gain(merged.get("min_reward_gain")),
        image_repository=image_repository(merged.get("image_repository")),
        existing=existing,
        kueue_queue=merged["kueue_queue"] or "",
        cpu_node_pool=merged["cpu_node_pool"] or "",
        capacity_route=route,
    )


# The conf keys that only mean something on a cluster the run does not own.
EXISTING_ONLY_KEYS: Final = ("existing_cluster", "kueue_queue", "cpu_node_pool")
# Their formats, each refused with its run parameter's rule (spec/params.py) in either mode.
_EXISTING_FORMATS: Final = tuple(
    (key, pattern, params.PARAMS_BY_KEY[key].rule or "")
    for key, pattern in (
        ("existing_cluster", EXISTING_CLUSTER_VALUE),
        ("kueue_queue", K8S_NAME),
        ("cpu_node_pool", K8S_NAME),
    )
)


def _existing_cluster(
    merged: Mapping[str, Any], cluster: ClusterSpec, route: str = POOLS_ROUTE
) -> ExistingCluster | None:
    """``cluster_mode``'s cluster the run does not own, or None (*create*); one line per wrong
    combination: the existing-only keys or the ``compute-class`` route with *create*, no cluster,
    an ordered capacity on the ``pools`` route, another project or region, ``keep_cluster`` (an
    existing cluster is never deleted: nothing to keep)."""
    for key, pattern, rule in _EXISTING_FORMATS:
        if merged[key]:
            rules.match(key, merged[key], pattern, rule)
    if cluster_mode(merged["cluster_mode"]) == CREATE:
        for key in EXISTING_ONLY_KEYS:
            if merged[key]:
                raise SpecError(key, "is for cluster_mode existing; leave it empty with create", merged[key])
        if route == COMPUTE_CLASS_ROUTE:
            raise SpecError("capacity_route", COMPUTE_CLASS_CREATE_MODE, route)
        return None
    if not merged["existing_cluster"]:
        raise SpecError(
            "existing_cluster",
            "cluster_mode existing needs the cluster: PROJECT/LOCATION/NAME",
            show_value=False,
        )
    existing = parse_existing_cluster(merged["existing_cluster"])
    if cluster.fallback and route != COMPUTE_CLASS_ROUTE:
        if any(kind.strip() for kind in merged.get(FALLBACK) or ()):
            raise SpecError(FALLBACK, f"{EXISTING_ONE_KIND}: clear {FALLBACK}", list(cluster.capacities))
        raise SpecError("capacity", EXISTING_ONE_KIND, list(cluster.capacities))
    if existing.project != cluster.project:
        raise SpecError(
            "existing_cluster",
            f"is in project {existing.project}, not the run's {cluster.project}: set project to it",
            existing.where,
        )
    if existing.region != cluster.region:
        raise SpecError(
            "existing_cluster",
            f"is in {existing.location}, not in the run's region {cluster.region}: set region and zone to it",
            existing.where,
        )
    if rules.ZONE.fullmatch(existing.location) and existing.location != cluster.zone:
        raise SpecError(
            "existing_cluster",
            f"is a zonal cluster in {existing.location}: set zone to it (its node pools are there)",
            existing.where,
        )
    if merged["keep_cluster"]:
        raise SpecError(
            "keep_cluster",
            "is for cluster_mode create: an existing cluster is never deleted",
            show_value=False,
        )
    return existing


def image_repository(value: Any) -> str:
    """The ``image_repository`` conf value: an Artifact Registry repository ID, or "" (no streaming)."""
    if value is None or value == "":
        return ""
    return rules.match("image_repository", value, rules.REPOSITORY_ID, rules.REPOSITORY_ID_RULE)


@dataclass(frozen=True)
class TpuVmPipelineSpec:
    """Everything one run of the single-host pipeline does (seed 002)."""

    dag_id: str
    run_id: str
    preset: ModelPreset
    vm: TpuVmSpec
    cpu_vm: CpuVmSpec
    conversion: ConversionSpec
    training: TrainingSpec
    export: ExportSpec
    hf_token: HfTokenSpec
    keep_vm: bool
    delete_bucket: bool
    max_vm_hours: int
    service_account: str | None = None
    runtime: str = "container"  # TPU_VM_RUNTIMES
    workload_image: str = POST_TRAINING_IMAGE  # the image training runs in (runtime container)
    cancel_previous_writer: bool = False
    min_reward_gain: float | None = None  # the promotion gate (None: no gate)
    # the TPU VM boots from a baked image (render/boot_image.py) with runtime container
    bake_image: bool = True

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
    def bakes(self) -> bool:
        """Whether the run bakes (or reuses) the TPU VM's boot image: runtime ``container`` with
        ``bake_image`` on (the install runtime builds MaxText on the VM, nothing to bake)."""
        return self.bake_image and self.runtime == "container"

    @property
    def bake_vm(self) -> CpuVmSpec:
        """The CPU VM the boot image is baked on: booted from the TPU VM's own image family and
        disk size, so the image it leaves is the TPU VM's image plus Docker and the workload image."""
        return CpuVmSpec(
            project=self.vm.project,
            zone=self.vm.zone,
            vm_name=bake_vm_name(self.suffix),
            bucket=self.vm.bucket,
            machine_type=BAKE_VM_MACHINE_TYPE,
            image_project=self.vm.image_project,
            image_family=self.vm.image_family,
            boot_disk_size=self.vm.boot_disk_size,
        )

    @property
    def cpu_machine_types(self) -> tuple[str, ...]:
        """The CPU VMs that run at once, before the TPU VM exists: the bake VM (when the run bakes)
        beside the conversion's CPU VM; preflight checks their vCPU quotas."""
        return (*((self.bake_vm.machine_type,) if self.bakes else ()), self.cpu_vm.machine_type)

    @property
    def gcs_actor_checkpoint(self) -> str:
        """The final actor checkpoint: training writes it to GCS, the export reads it there."""
        step = self.training.final_step
        return f"{self.gcs_prefix}/post-train/{self.training.run_name}/checkpoints/actor/{step}"

    @property
    def gcs_actor_checkpoint_root(self) -> str:
        return f"{self.gcs_prefix}/post-train/{self.training.run_name}/checkpoints/actor/"

    @property
    def gcs_export(self) -> str:
        return f"{self.gcs_prefix}/hf-trained/{self.training.run_name}"

    @property
    def training_run_dir(self) -> str:
        return run_dir(f"{self.gcs_prefix}/post-train/{self.training.run_name}")

    @property
    def written_run_dirs(self) -> tuple[str, str]:
        """The run's own directories, each claimed by one writer: its training's and its export's
        (``preflight`` reads their claims, ``train`` and ``export`` take them)."""
        return self.training_run_dir, run_dir(self.gcs_export)

    def resolved(self) -> dict[str, Any]:
        """Every value the pipeline's operators take, resolved once (``validate``'s XCom)."""
        v, t = self.vm, self.training
        return {
            "model": self.preset.model_name,
            "project": v.project,
            "region": self.region,
            "zone": v.zone,
            "vm_name": v.vm_name,
            "cpu_vm_name": self.cpu_vm.vm_name,
            "cpu_machine_type": self.cpu_vm.machine_type,
            "cpu_machine_types": list(self.cpu_machine_types),
            "bucket": v.bucket,
            "reservation": v.reservation,
            "capacity": capacity_value(v.capacities),
            "service_account": self.service_account,
            **workload_values(self.preset, self.conversion, t, self.hf_token),
            # create_vm grants the VM's own service account (named or the default) access
            "secret_readers": [],
            "keep_vm": self.keep_vm,
            "delete_bucket": self.delete_bucket,
            "max_vm_hours": self.max_vm_hours,
            "cancel_previous_writer": self.cancel_previous_writer,
            "min_reward_gain": self.min_reward_gain,
            "runtime": self.runtime,
            "workload_image": self.workload_image,
            # the image training runs in: none when MaxText is installed from sources (the card's)
            "training_image": self.workload_image if self.runtime == "container" else None,
            "bakes": self.bakes,
            "compute_type": v.machine_type,
            "topology": v.topology,
            "suffix": self.suffix,
            "final_step": t.final_step,
            "chips": v.chips,
            "converted_root": self.conversion.output_directory,
            "actor_root": self.gcs_actor_checkpoint_root,
            "export_uri": self.gcs_export + "/",
            "run_dirs": dict(zip(("train", "export"), self.written_run_dirs, strict=True)),
        }


def tpu_vm_pipeline_from_conf(
    conf: Mapping[str, Any] | None,
    *,
    dag_id: str = TPU_VM_DAG_ID,
    run_id: str = "manual__plan",
    require_reservation: bool = True,
) -> TpuVmPipelineSpec:
    """Validate a conf for ``tpu_rl_tpu_vm_pipeline`` and derive every spec from it.

    ``require_reservation=False`` is for the tasks that work on a VM that exists already; only
    ``reservation`` capacity needs one.
    """
    merged = _merge_conf(TPU_VM_DEFAULTS, conf)
    max_vm_hours = rules.int_range("max_vm_hours", merged["max_vm_hours"], 1, 24 * 7)
    kinds = capacity_order(merged["capacity"])
    if require_reservation:
        require_reservation_name(kinds, merged["reservation"])
    preset = get_preset(merged["model"], runner=Runner.TPU_VM)
    if preset.runner is not Runner.TPU_VM:
        raise SpecError(
            "model",
            f"{preset.model_name} needs a multi-host slice; use the {GKE_DAG_ID} DAG",
            preset.model_name,
        )
    runtime = rules.one_of("runtime", merged["runtime"], TPU_VM_RUNTIMES)
    workload_image = rules.image("workload_image", _pick(merged, "workload_image", POST_TRAINING_IMAGE))
    if runtime == "container":
        # training runs the image's MaxText (the GKE jobs' release): overrides are checked against it
        preset = replace(preset, maxtext_version=GKE_MAXTEXT_VERSION)
    vm = TpuVmSpec(
        project=merged["project"],
        zone=merged["zone"],
        vm_name=merged["vm_name"],
        reservation=merged["reservation"] or "",
        bucket=merged["bucket"],
        capacity=kinds[0],
        fallback=kinds[1:],
        # a flex-start VM runs at most as long as the janitor lets it live
        max_run_hours=max_vm_hours,
        machine_type=preset.compute_type,
        topology=preset.topology,
    )
    cpu_vm = CpuVmSpec(
        project=vm.project,
        zone=vm.zone,
        vm_name=cpu_vm_name(vm.vm_name),
        bucket=vm.bucket,
        machine_type=merged.get("cpu_machine_type") or CPU_VM_MACHINE_TYPE,
    )
    # Every stage reads and writes GCS: the conversions run on the CPU VM, training on the TPU VM.
    prefix = gcs_model_prefix(vm.bucket, preset.model_name)
    conversion, training, export = _workloads(
        preset,
        merged,
        converted=f"{prefix}/mt-format/",
        trained=f"{prefix}/post-train/",
        exported=f"{prefix}/hf-trained/{{run_name}}/",
        default_run_name=f"rl-{run_suffix(dag_id, run_id)}",
        trailing_slash="",
    )
    return TpuVmPipelineSpec(
        dag_id=dag_id,
        run_id=run_id,
        preset=preset,
        vm=vm,
        cpu_vm=cpu_vm,
        conversion=conversion,
        training=training,
        export=export,
        hf_token=_hf_token(merged),
        keep_vm=merged["keep_vm"],
        delete_bucket=merged["delete_bucket"],
        max_vm_hours=max_vm_hours,
        service_account=(
            rules.match(
                "service_account",
                merged["service_account"],
                rules.SERVICE_ACCOUNT,
                rules.SERVICE_ACCOUNT_RULE,
            )
            if merged["service_account"]
            else None
        ),
        runtime=runtime,
        workload_image=workload_image,
        cancel_previous_writer=merged["cancel_previous_writer"],
        min_reward_gain=min_reward_gain(merged.get("min_reward_gain")),
        bake_image=rules.boolean("bake_image", merged["bake_image"]),
    )
