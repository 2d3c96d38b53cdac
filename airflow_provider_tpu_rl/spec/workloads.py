"""MaxText workloads: HF→MaxText conversion, GRPO training, MaxText→HF export."""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from airflow_provider_tpu_rl.maxtext import config_keys
from airflow_provider_tpu_rl.maxtext.config_keys import ConfigKey
from airflow_provider_tpu_rl.maxtext.layout import CONVERTED_CHECKPOINT_ITEMS, CONVERTED_CHECKPOINT_STEP
from airflow_provider_tpu_rl.spec import rules
from airflow_provider_tpu_rl.spec.errors import SpecError
from airflow_provider_tpu_rl.spec.presets import POST_TRAINING_IMAGE

SHM_PATH = re.compile(r"^/dev/shm/[A-Za-z0-9._-]+(?:/[A-Za-z0-9._-]+)*/?$")

_DERIVED_BY_MAXTEXT: Final = (
    "MaxText derives it from `base_output_directory` and `run_name` and ignores any value"
)
# Keys the pipeline sets itself: a user override would point training at the wrong data or put a
# secret on the command line.
RESERVED_KEYS: Final[dict[str, str]] = {
    "model_name": "set by the `model` param",
    "run_name": "set by the `run_name` param",
    "base_output_directory": "derived from `bucket` and `model`",
    "load_parameters_path": "derived from the converted checkpoint",
    "hf_access_token": "the HF token never goes on a command line; use `hf_token_conn_id`",
    "num_batches": "set it with the `num_batches` param",
    # MaxText derives these from base_output_directory and run_name (both set by the pipeline) and
    # overwrites any value given (0.2.3 and 0.2.4: configs/types.py, set_derived_and_validate_values and RLConfig's
    # validator): an override would not move the checkpoints, it would be dropped without a word.
    "checkpoint_dir": _DERIVED_BY_MAXTEXT,
    "metrics_dir": _DERIVED_BY_MAXTEXT,
    "tensorboard_dir": _DERIVED_BY_MAXTEXT,
}
# The largest num_batches a run may ask for (the tutorials train 50).
MAX_NUM_BATCHES: Final = 10**7
# Steps between two training checkpoints unless train_overrides sets checkpoint_period: a failure
# or a preemption loses at most this many steps less one, as a retry resumes from the newest
# committed step. MaxText's rl.yml saves every 50 (the tutorials' whole run, so a failure restarts
# at step 0); tunix saves every checkpoint_period steps and the final step at the end, and keeps
# rl.yml's max_num_checkpoints_to_keep (10) newest (docs/tutorial-differences.md).
DEFAULT_CHECKPOINT_PERIOD: Final = 10
_INT64: Final = 2**63 - 1


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
        return json.dumps(value, allow_nan=False)
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


def _int_between(low: int, high: int) -> Callable[[str, str], None]:
    def check(field: str, value: str) -> None:
        if not re.fullmatch(r"-?[0-9]+", value):
            raise SpecError(field, "must be an integer", value)
        if int(value) < low:
            raise SpecError(field, f"must be >= {low}", value)
        if int(value) > high:
            raise SpecError(field, f"must be <= {high}", value)

    return check


def _learning_rate(field: str, value: str) -> None:
    if not 0 < _number(field, value) <= 1:
        raise SpecError(field, "must be > 0 and <= 1", value)


def _fraction(field: str, value: str) -> None:
    if not 0 < _number(field, value) <= 1:
        raise SpecError(field, "must be in (0, 1]", value)


# Range rules for well-known keys, applied whatever their source (preset, param or override).
KEY_RULES: Final[dict[str, Callable[[str, str], None]]] = {
    "num_batches": _int_between(1, MAX_NUM_BATCHES),
    "num_test_batches": _int_between(0, MAX_NUM_BATCHES),
    "batch_size": _int_between(1, 2**16),
    "train_micro_batch_size": _int_between(1, 2**16),
    "max_target_length": _int_between(1, 2**20),
    "max_prefill_predict_length": _int_between(1, 2**20),
    "checkpoint_period": _int_between(1, MAX_NUM_BATCHES),
    "eval_interval": _int_between(1, MAX_NUM_BATCHES),
    "learning_rate_schedule_steps": _int_between(1, MAX_NUM_BATCHES),
    "rl.num_generations": _int_between(1, 1024),
    "rl.reshard_chunk_size": _int_between(1, 2**20),
    "learning_rate": _learning_rate,
    "trainer_devices_fraction": _fraction,
    "sampler_devices_fraction": _fraction,
    "hbm_utilization_vllm": _fraction,
}


def _did_you_mean(name: str, candidates: Iterable[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.75)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def maxtext_config_key(where: str, key: str, version: str) -> ConfigKey:
    """What MaxText ``version``'s ``train_rl`` takes for ``key`` (SpecError if it is no key of it).

    A dotted ``rl.num_generations`` is a field of the nested model ``rl`` (MaxText would ignore
    an unknown one silently) or a key inside a dict-valued key.
    """
    keys = config_keys.KEYS.get(version)
    if keys is None:
        raise SpecError("maxtext_version", f"no MaxText key list for {version}", version)
    head, dot, rest = key.partition(".")
    if not dot:
        info = keys.get(key)
        if info is None:
            raise SpecError(where, "not a MaxText config key" + _did_you_mean(key, keys), show_value=False)
        return info
    nested = config_keys.NESTED[version].get(head)
    if nested is not None:
        sub = nested.get(rest)
        if sub is None:
            raise SpecError(
                where,
                f"not a key of MaxText's `{head}` config" + _did_you_mean(rest, nested, f"{head}."),
                show_value=False,
            )
        return sub
    info = keys.get(head)
    if info is not None and info.kind in {"dict", "any"}:
        return ConfigKey("any")
    dotted = [f"{h}.{k}" for h, sub_keys in config_keys.NESTED[version].items() for k in sub_keys]
    raise SpecError(where, "not a MaxText config key" + _did_you_mean(key, dotted), show_value=False)


_BOOL_TEXT: Final = frozenset({"true", "false", "t", "f", "yes", "no", "y", "n", "on", "off", "1", "0"})


def _as_number(where: str, raw: Any, rule: str) -> float | int:
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        raise SpecError(where, rule, raw)
    if isinstance(raw, str):
        try:
            number: float | int = int(raw) if re.fullmatch(r"[+-]?[0-9]+", raw.strip()) else float(raw)
        except ValueError:
            raise SpecError(where, rule, raw) from None
    else:
        number = raw
    if isinstance(number, float) and not math.isfinite(number):
        raise SpecError(where, "must be a finite number", raw)
    return number


def check_maxtext_value(where: str, info: ConfigKey, raw: Any) -> None:
    """``raw`` (a JSON value, or its text on the command line) is a value MaxText takes for the key.

    MaxText reads ``key=value`` with OmegaConf, turns ``none`` into null, and pydantic coerces
    (``"4"`` is an int, ``"true"`` a bool) within the field's type and bounds.
    """
    if isinstance(raw, str) and raw.strip().lower() in {"none", "null"}:
        if info.nullable or info.kind == "any":
            return
        raise SpecError(where, "cannot be null in MaxText", raw)
    kind = info.kind
    if kind == "bool":
        if isinstance(raw, bool) or (isinstance(raw, int) and raw in (0, 1)):
            return
        if isinstance(raw, str) and raw.strip().lower() in _BOOL_TEXT:
            return
        raise SpecError(where, "must be true or false", raw)
    if kind in {"int", "float"}:
        number = _as_number(where, raw, "must be an integer" if kind == "int" else "must be a number")
        if kind == "int":
            if isinstance(number, float) and not number.is_integer():
                raise SpecError(where, "must be an integer", raw)
            if abs(number) > _INT64:
                raise SpecError(where, "must fit in a 64-bit integer", raw)
        _check_bounds(where, info, number, raw)
        if info.choices and number not in info.choices:
            raise SpecError(where, f"must be one of {list(info.choices)}", raw)
        return
    if kind == "str":
        if not isinstance(raw, str):
            raise SpecError(where, "must be a string", raw)
        if info.choices and raw not in info.choices:
            shown = list(info.choices)[:12]
            more = ", ..." if len(info.choices) > 12 else ""
            raise SpecError(where, f"must be one of {', '.join(map(str, shown))}{more}", raw)
        return
    if kind == "list" and not isinstance(raw, list | str):
        raise SpecError(where, "must be a list", raw)
    if kind in {"dict", "model"} and not isinstance(raw, Mapping | str):
        raise SpecError(where, "must be an object", raw)


def _check_bounds(where: str, info: ConfigKey, number: float, raw: Any) -> None:
    for name, ok in (
        ("ge", info.ge is None or number >= info.ge),
        ("gt", info.gt is None or number > info.gt),
        ("le", info.le is None or number <= info.le),
        ("lt", info.lt is None or number < info.lt),
    ):
        if not ok:
            symbol = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}[name]
            raise SpecError(where, f"must be {symbol} {getattr(info, name):g} in MaxText", raw)


def validate_overrides(
    field: str, overrides: Mapping[str, Any], maxtext_version: str | None = None
) -> tuple[tuple[str, str], ...]:
    """Check user MaxText overrides; return them as (key, rendered value) pairs.

    With ``maxtext_version`` each key must be one of that MaxText's ``train_rl`` config keys and
    its value of the key's type.
    """
    if not isinstance(overrides, Mapping):
        raise SpecError(field, "must be an object of MaxText key → value", overrides)
    out: list[tuple[str, str]] = []
    for key, raw in overrides.items():
        rules.maxtext_key(f"{field}.{key}" if isinstance(key, str) else field, key)
        where = f"{field}.{key}"
        if key in RESERVED_KEYS:
            raise SpecError(where, f"cannot be overridden: {RESERVED_KEYS[key]}", raw, show_value=False)
        if raw is None:
            # Airflow 3 hands a task a NaN or Infinity of the run conf as null (seen in `dags test`).
            raise SpecError(where, "must not be null (NaN and Infinity arrive as null)", show_value=False)
        if not isinstance(raw, str | int | float | bool | dict | list):
            raise SpecError(where, "value must be a string, number, boolean, object or list", raw)
        if isinstance(raw, float) and not math.isfinite(raw):
            raise SpecError(where, "must be a finite number", raw)
        try:
            value = format_value(raw)
        except (TypeError, ValueError):
            raise SpecError(where, "value must be finite and JSON-serialisable", raw) from None
        rules.single_line(where, value)
        if maxtext_version is not None:
            info = maxtext_config_key(where, key, maxtext_version)
        if key in KEY_RULES:
            KEY_RULES[key](where, value)
        if maxtext_version is not None:
            check_maxtext_value(where, info, raw)
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
            rules.match("hf_model_path", self.hf_model_path, rules.HF_REPO_ID, rules.HF_REPO_ID_RULE)
        for name in ("checkpoint_storage_use_zarr3", "checkpoint_storage_use_ocdbt"):
            rules.int_range(name, getattr(self, name), 0, 1)

    @property
    def items_path(self) -> str:
        """Where ``to_maxtext`` writes the parameters: ``<output>/0/items``."""
        return (
            f"{self.output_directory.rstrip('/')}/{CONVERTED_CHECKPOINT_STEP}/{CONVERTED_CHECKPOINT_ITEMS[0]}"
        )


# MaxText's own num_test_batches when neither the preset nor the run sets it: 5
# (src/maxtext/configs/post_train/rl.yml and types.RLConfig at maxtext-v0.2.3 and maxtext-v0.2.4).
# train_rl evaluates that many batches (eval_batch_size, else batch_size, prompts each) before
# training, after it and every eval_interval steps, only when it is > 0.
MAXTEXT_NUM_TEST_BATCHES: Final = 5


def num_test_batches(overrides: Mapping[str, Any]) -> int:
    """The test batches MaxText evaluates with these train overrides (0: no evaluation, no reward)."""
    value = overrides.get("num_test_batches")
    return MAXTEXT_NUM_TEST_BATCHES if value is None or value == "" else int(value)


# -- what the tasks after training need of MaxText's settings -------------------------------------
_TRUE_TEXT: Final = frozenset({"true", "t", "yes", "y", "on", "1"})


def _is_true(text: str) -> bool:
    return text.strip().lower() in _TRUE_TEXT


def _is_one(text: str) -> bool:
    try:
        return float(text) == 1
    except ValueError:
        return False


def _keeps_some(text: str) -> bool:
    if text.strip().lower() in {"none", "null"}:
        return True
    try:
        return int(text) >= 1
    except ValueError:
        return False


@dataclass(frozen=True)
class TrainingNeed:
    """What the tasks after training need of one MaxText setting: a value of ``keys`` (the same
    setting under each spelling ``train_rl`` takes) for which ``holds`` is false contradicts them.

    ``wanted`` is what the setting must be, ``needed_by`` which tasks read what it makes,
    ``because`` what MaxText does otherwise (with its source), ``contradiction`` a value that
    breaks it (the tests try each one, the docs list them).
    """

    keys: tuple[str, ...]
    holds: Callable[[str], bool]
    wanted: str
    needed_by: str
    because: str
    contradiction: Any

    def refusal(self, key: str, value: str) -> SpecError:
        """The one-line refusal of ``key=value``."""
        return SpecError(
            f"train_overrides.{key}",
            f"must be {self.wanted}: {self.needed_by}, and {self.because}",
            value,
        )


_FINAL_CHECKPOINT: Final = (
    "wait_actor_checkpoint and export_to_huggingface read the actor checkpoint of step num_batches "
    "(and a retry resumes from the newest one)"
)
_LAST_STEP: Final = (
    "wait_actor_checkpoint and export_to_huggingface read the actor checkpoint of step num_batches"
)
_STEPS: Final = (
    "MaxText trains num_batches x rl.num_iterations x train_fraction x num_epoch steps "
    "(types.py train_steps at maxtext-v0.2.4, train_rl.py get_max_train_steps at maxtext-v0.2.3): "
    "training would end at another step; set num_batches instead"
)
# The one list of the MaxText settings a later task depends on (validate refuses a contradicting
# one before anything is spent; so does every training operator before it submits). Read from
# the RL trainer at the pinned releases: train_rl.py sets up checkpointing only when
# enable_checkpointing is true (maxtext-v0.2.4 l.443-450, v0.2.3 l.383-390) and gives Orbax
# max_num_checkpoints_to_keep as max_to_keep and checkpoint_period as save_interval_steps. No task
# needs evaluation: num_test_batches 0 is allowed (no reward is recorded).
TRAINING_NEEDS: Final[tuple[TrainingNeed, ...]] = (
    TrainingNeed(
        ("enable_checkpointing",),
        _is_true,
        "true",
        _FINAL_CHECKPOINT,
        "train_rl saves no checkpoint at all without it (train_rl.py: no checkpoint directory)",
        False,
    ),
    TrainingNeed(
        ("save_checkpoint_on_completion",),
        _is_true,
        "true",
        _FINAL_CHECKPOINT,
        "false asks MaxText not to save the final step (base.yml); train_rl leaves that save to "
        "tunix, which always makes it, so the pipeline cannot honour it",
        False,
    ),
    TrainingNeed(
        ("max_num_checkpoints_to_keep",),
        _keeps_some,
        "null (keep all) or at least 1",
        _FINAL_CHECKPOINT,
        "Orbax keeps that many newest checkpoints (max_to_keep, preservation_policy.LatestN): 0 "
        "deletes every one, the final step's too, and a negative value fails the trainer",
        0,
    ),
    TrainingNeed(("train_fraction", "dataset.train_fraction"), _is_one, "1", _LAST_STEP, _STEPS, 0.5),
    TrainingNeed(("num_epoch",), _is_one, "1", _LAST_STEP, _STEPS, 2),
    TrainingNeed(("num_iterations", "rl.num_iterations"), _is_one, "1", _LAST_STEP, _STEPS, 2),
)


def check_training_needs(overrides: Iterable[tuple[str, str]]) -> None:
    """Refuse, in one line, the first override that contradicts :data:`TRAINING_NEEDS`."""
    needs = {key: need for need in TRAINING_NEEDS for key in need.keys}
    for key, value in overrides:
        need = needs.get(key)
        if need is not None and not need.holds(value):
            raise need.refusal(key, value)


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
    maxtext_version: str | None = None  # check the override keys against this MaxText's

    def __post_init__(self) -> None:
        if not isinstance(self.workload_image_patched, bool):
            raise SpecError("workload_image_patched", "must be true or false", self.workload_image_patched)
        rules.match("model", self.model_name, rules.MODEL_NAME, "MaxText model_name like qwen3-30b-a3b")
        rules.match("run_name", self.run_name, rules.RUN_NAME, rules.RUN_NAME_RULE)
        output_location("base_output_directory", self.base_output_directory)
        output_location("load_parameters_path", self.load_parameters_path)
        rules.int_range("num_batches", self.num_batches, 1)
        if self.num_batches > MAX_NUM_BATCHES:
            raise SpecError("num_batches", f"must be <= {MAX_NUM_BATCHES}", self.num_batches)
        for key, value in self.overrides:
            rules.maxtext_key("train_overrides", key)
            rules.single_line(f"train_overrides.{key}", value)
            if key in RESERVED_KEYS:
                raise SpecError(f"train_overrides.{key}", f"cannot be overridden: {RESERVED_KEYS[key]}")
            if self.maxtext_version is not None:
                where = f"train_overrides.{key}"
                check_maxtext_value(where, maxtext_config_key(where, key, self.maxtext_version), value)
            if key in KEY_RULES:
                KEY_RULES[key](f"train_overrides.{key}", value)
        check_training_needs(self.overrides)

    @property
    def num_test_batches(self) -> int:
        """The test batches MaxText evaluates before and after training (0: no reward recorded)."""
        return num_test_batches(dict(self.overrides))

    @property
    def final_step(self) -> int:
        """The step of the last actor checkpoint (the tutorials export ``actor/<num_batches>``)."""
        return self.num_batches

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

    def __post_init__(self) -> None:
        rules.match("model", self.model_name, rules.MODEL_NAME, "MaxText model_name like llama3.1-8b")
        output_location("load_parameters_path", self.load_parameters_path)
        output_location("export_directory", self.output_directory)
        if self.weight_dtype not in {"bfloat16", "float32", "float16"}:
            raise SpecError("weight_dtype", "must be bfloat16, float16 or float32", self.weight_dtype)
