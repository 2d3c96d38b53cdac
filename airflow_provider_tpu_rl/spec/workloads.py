"""MaxText workloads: HF→MaxText conversion, GRPO training, MaxText→HF export."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from airflow_provider_tpu_rl.spec import rules
from airflow_provider_tpu_rl.spec.errors import SpecError
from airflow_provider_tpu_rl.spec.presets import POST_TRAINING_IMAGE

SHM_PATH = re.compile(r"^/dev/shm/[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)*/?$")

# Keys the pipeline sets itself: a user override would point training at the wrong data or put a
# secret on the command line.
RESERVED_KEYS: Final[dict[str, str]] = {
    "model_name": "set by the `model` param",
    "run_name": "set by the `run_name` param",
    "base_output_directory": "derived from `bucket` and `model`",
    "load_parameters_path": "derived from the converted checkpoint",
    "hf_access_token": "the HF token never goes on a command line; use `hf_token_conn_id`",
}


def output_location(field: str, value: Any) -> str:
    """A ``gs://`` URI or, for the single-host path, a folder under ``/dev/shm``."""
    text = rules.require_str(field, value)
    if text.startswith("gs://"):
        return rules.gs_uri(field, text)
    if SHM_PATH.fullmatch(text) and ".." not in text.split("/"):
        return text
    raise SpecError(field, "must be a gs:// URI or a folder under /dev/shm", value)


def format_value(value: Any) -> str:
    """A MaxText override value as it appears after ``key=`` on the command line."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("not finite")
        text = repr(value)
        mantissa, sep, exponent = text.partition("e")
        if sep:
            sign = "-" if exponent.startswith("-") else ""
            text = f"{mantissa}e{sign}{exponent.lstrip('+-').lstrip('0') or '0'}"
        return text
    if isinstance(value, dict | list):
        return json.dumps(value)
    if isinstance(value, str):
        return value
    raise TypeError(type(value).__name__)


def _number(field: str, value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise SpecError(field, "must be a number", value) from None
    if not math.isfinite(number):
        raise SpecError(field, "must be a finite number", value)
    return number


def _int_at_least(low: int) -> Callable[[str, str], None]:
    def check(field: str, value: str) -> None:
        if not re.fullmatch(r"-?[0-9]+", value):
            raise SpecError(field, "must be an integer", value)
        if int(value) < low:
            raise SpecError(field, f"must be >= {low}", value)

    return check


def _positive(field: str, value: str) -> None:
    if not _number(field, value) > 0:
        raise SpecError(field, "must be > 0", value)


def _fraction(field: str, value: str) -> None:
    if not 0 < _number(field, value) <= 1:
        raise SpecError(field, "must be in (0, 1]", value)


# Range rules for well-known keys, applied whatever their source (preset, param or override).
KEY_RULES: Final[dict[str, Callable[[str, str], None]]] = {
    "num_batches": _int_at_least(1),
    "num_test_batches": _int_at_least(0),
    "batch_size": _int_at_least(1),
    "train_micro_batch_size": _int_at_least(1),
    "max_target_length": _int_at_least(1),
    "max_prefill_predict_length": _int_at_least(1),
    "checkpoint_period": _int_at_least(1),
    "eval_interval": _int_at_least(1),
    "learning_rate_schedule_steps": _int_at_least(1),
    "rl.num_generations": _int_at_least(1),
    "rl.reshard_chunk_size": _int_at_least(1),
    "learning_rate": _positive,
    "trainer_devices_fraction": _fraction,
    "sampler_devices_fraction": _fraction,
    "hbm_utilization_vllm": _fraction,
}


def validate_overrides(field: str, overrides: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """Check user MaxText overrides; return them as (key, rendered value) pairs."""
    if not isinstance(overrides, Mapping):
        raise SpecError(field, "must be an object of MaxText key → value", overrides)
    out: list[tuple[str, str]] = []
    for key, raw in overrides.items():
        rules.maxtext_key(f"{field}.{key}" if isinstance(key, str) else field, key)
        where = f"{field}.{key}"
        if key in RESERVED_KEYS:
            raise SpecError(where, f"cannot be overridden: {RESERVED_KEYS[key]}", raw, show_value=False)
        if raw is None or not isinstance(raw, str | int | float | bool | dict | list):
            raise SpecError(where, "value must be a string, number, boolean, object or list", raw)
        try:
            value = format_value(raw)
        except (TypeError, ValueError):
            raise SpecError(where, "value must be finite and JSON-serialisable", raw) from None
        rules.single_line(where, value)
        if key in KEY_RULES:
            KEY_RULES[key](where, value)
        out.append((key, value))
    return tuple(out)


@dataclass(frozen=True)
class ConversionSpec:
    """``maxtext.checkpoint_conversion.to_maxtext``: a HF checkpoint into MaxText/Orbax format."""

    model_name: str
    output_directory: str
    scan_layers: bool
    hf_model_path: str | None = None
    lazy_load_tensors: bool = True
    checkpoint_storage_use_zarr3: int = 0
    checkpoint_storage_use_ocdbt: int = 0

    def __post_init__(self) -> None:
        rules.match("model", self.model_name, rules.MODEL_NAME, "MaxText model_name like qwen3-30b-a3b")
        output_location("output_directory", self.output_directory)
        if self.hf_model_path is not None:
            rules.match(
                "hf_model_path", self.hf_model_path, rules.HF_REPO_ID, "Hugging Face repo id like org/model"
            )
        for name in ("checkpoint_storage_use_zarr3", "checkpoint_storage_use_ocdbt"):
            rules.int_range(name, getattr(self, name), 0, 1)

    @property
    def items_path(self) -> str:
        """Where ``to_maxtext`` writes the parameters: ``<output>/0/items``."""
        return self.output_directory.rstrip("/") + "/0/items"


@dataclass(frozen=True)
class TrainingSpec:
    """``maxtext.trainers.post_train.rl.train_rl`` (GRPO).

    ``workload_image_patched``: the job's image already holds the preset's start-up patches (an
    image built from ``docker/workload.Dockerfile``), so the train command does not rewrite the
    installed tunix/MaxText files before it starts.
    """

    model_name: str
    run_name: str
    base_output_directory: str
    load_parameters_path: str
    num_batches: int
    overrides: tuple[tuple[str, str], ...] = ()
    workload_image_patched: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.workload_image_patched, bool):
            raise SpecError("workload_image_patched", "must be true or false", self.workload_image_patched)
        rules.match("model", self.model_name, rules.MODEL_NAME, "MaxText model_name like qwen3-30b-a3b")
        rules.match(
            "run_name", self.run_name, rules.RUN_NAME, "run name must match [A-Za-z0-9][A-Za-z0-9._-]{0,62}"
        )
        output_location("base_output_directory", self.base_output_directory)
        output_location("load_parameters_path", self.load_parameters_path)
        rules.int_range("num_batches", self.num_batches, 1)
        for key, value in self.overrides:
            rules.maxtext_key("train_overrides", key)
            rules.single_line(f"train_overrides.{key}", value)
            if key in RESERVED_KEYS:
                raise SpecError(f"train_overrides.{key}", f"cannot be overridden: {RESERVED_KEYS[key]}")
            if key in KEY_RULES:
                KEY_RULES[key](f"train_overrides.{key}", value)

    def override(self, key: str, default: str | None = None) -> str | None:
        for k, v in reversed(self.overrides):
            if k == key:
                return v
        return default

    @property
    def checkpoint_period(self) -> int:
        return int(self.override("checkpoint_period", "50") or 50)

    @property
    def final_step(self) -> int:
        """The step of the last actor checkpoint (the tutorials export ``actor/<num_batches>``)."""
        return self.num_batches

    @property
    def run_directory(self) -> str:
        return f"{self.base_output_directory.rstrip('/')}/{self.run_name}"

    @property
    def actor_checkpoint_root(self) -> str:
        return actor_checkpoint_root(self.base_output_directory, self.run_name)

    def actor_params_path(self, step: int) -> str:
        return actor_params_path(self.base_output_directory, self.run_name, step)


def check_patched_image(image: str, workload_image_patched: bool) -> str:
    """``image``, refused when it is the stock ``tpu_post_training`` image but is said to be patched.

    The stock image still needs the start-up patches; a patched image is one built from
    ``docker/workload.Dockerfile`` and pushed under another name.
    """
    if workload_image_patched and image == POST_TRAINING_IMAGE:
        raise SpecError(
            "workload_image_patched",
            "the stock tpu_post_training:0.2.4 image is not patched; set `image` to one built from "
            "docker/workload.Dockerfile, or set workload_image_patched to false",
            workload_image_patched,
        )
    return image


def actor_checkpoint_root(base_output_directory: str, run_name: str) -> str:
    """Where MaxText's RL trainer keeps a run's actor checkpoints (one folder per step)."""
    return f"{base_output_directory.rstrip('/')}/{run_name}/checkpoints/actor/"


def actor_params_path(base_output_directory: str, run_name: str, step: int) -> str:
    """The parameters of one actor checkpoint: what the export loads."""
    return f"{actor_checkpoint_root(base_output_directory, run_name)}{step}/model_params"


@dataclass(frozen=True)
class ExportSpec:
    """``maxtext.checkpoint_conversion.to_huggingface``: trained parameters back to HF format."""

    model_name: str
    load_parameters_path: str
    output_directory: str
    scan_layers: bool
    weight_dtype: str = "bfloat16"
    on_cluster: bool = True  # GKE jobs run CPU-only on pod 0 (skip_jax_distributed_system, hardware=cpu)

    def __post_init__(self) -> None:
        rules.match("model", self.model_name, rules.MODEL_NAME, "MaxText model_name like llama3.1-8b")
        output_location("load_parameters_path", self.load_parameters_path)
        output_location("export_directory", self.output_directory)
        if self.weight_dtype not in {"bfloat16", "float32", "float16"}:
            raise SpecError("weight_dtype", "must be bfloat16, float16 or float32", self.weight_dtype)
