"""Model presets: exactly the values of the tutorials, keyed by MaxText ``model_name``.

Every value can be overridden: cluster values through the pipeline params, MaxText keys through
``train_overrides``. tests/golden/tutorials holds the tutorials' command text and compares against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

from airflow_provider_tpu_rl.spec.errors import SpecError

POST_TRAINING_IMAGE: Final = "us-docker.pkg.dev/cloud-tpu-images/maxtext-images/tpu_post_training:0.2.4"
CLUSTER_TOOLKIT_VERSION: Final = "v1.103.0"
MAXTEXT_PIP_SPEC: Final = "maxtext[tpu-post-train]==0.2.3"
# The MaxText release each path runs (its config keys: maxtext/config_keys.py): the GKE jobs run
# the tpu_post_training:0.2.4 image, built from MaxText's maxtext-v0.2.4; the TPU VM installs
# MAXTEXT_PIP_SPEC. tests/maxtext/test_config_keys.py checks both against the pins above.
GKE_MAXTEXT_VERSION: Final = POST_TRAINING_IMAGE.rsplit(":", 1)[1]
TPU_VM_MAXTEXT_VERSION: Final = MAXTEXT_PIP_SPEC.rsplit("==", 1)[1]
OPENMATH_TEMPLATE: Final = "maxtext/examples/chat_templates/openmathinstruct2_rl.json"

# Explicit dataset selection (difference from the GKE tutorials, see README): without these keys
# MaxText trains on its default dataset (GSM8K), not on OpenMathInstruct-2. Values from MaxText's
# own src/maxtext/trainers/post_train/rl/scripts/run_qwen3_30b_rl.sh.
OPENMATH_DATASET: Final[tuple[tuple[str, str], ...]] = (
    ("dataset_name", "nvidia/OpenMathInstruct-2"),
    ("eval_dataset_name", "nvidia/OpenMathInstruct-2"),
    ("hf_train_files", "hf://datasets/nvidia/OpenMathInstruct-2/data/train_1M-*.parquet"),
    ("train_split", "train_1M"),
)


class Runner(StrEnum):
    """Where a preset runs."""

    GKE = "gke"  # multi-host slice on GKE via Cluster Toolkit, Pathways
    TPU_VM = "tpu_vm"  # one TPU VM over SSH, McJAX


@dataclass(frozen=True)
class BlueprintEdits:
    """Structured edits of the Cluster Toolkit blueprint (never sed on text)."""

    grant_storage_admin: bool = True
    system_node_pool_machine_type: str | None = None
    pin_system_node_pool_zone: bool = False


@dataclass(frozen=True)
class JobPrefixes:
    """Tutorial job names; the pipeline adds a run-derived suffix."""

    convert: str
    train: str
    export: str


@dataclass(frozen=True)
class ModelPreset:
    model_name: str
    runner: Runner
    hf_model_path: str | None
    export_model_name: str
    scan_layers: bool
    train_overrides: tuple[tuple[str, str], ...]
    image: str = POST_TRAINING_IMAGE
    compute_type: str = "ct6e-standard-4t"
    topology: str = "4x8"
    num_slices: int = 1
    num_batches: int = 50
    run_name: str = "rl"  # the tutorials' (a pipeline run's default is unique per DAG run)
    maxtext_version: str = GKE_MAXTEXT_VERSION
    job_prefixes: JobPrefixes | None = None
    blueprint: BlueprintEdits = field(default_factory=BlueprintEdits)
    cgroup_memory_limit: str | None = None
    patch_tunix_reshard_chunk_size: bool = False
    patch_adafactor: bool = True
    lazy_load_tensors: bool = True
    checkpoint_storage_use_zarr3: int = 0
    checkpoint_storage_use_ocdbt: int = 0


def _shared_gke_overrides(model_name: str) -> dict[str, str]:
    return {
        "max_prefill_predict_length": "256",
        "mu_dtype": "bfloat16",
        "grad_dtype": "bfloat16",
        "trainer_devices_fraction": "0.5",
        "sampler_devices_fraction": "0.5",
        "ici_tensor_parallelism": "2",
        "ici_expert_parallelism": "4",
        "ici_fsdp_parallelism": "-1",
        "remat_policy": "full",
        "async_scheduling": "False",
        "allow_split_physical_axes": "true",
        "ragged_gather_reduce_fallback": "True",
        "enable_dp_attention": "False",
        "decode_sampling_temperature": "0.8",
        "decode_sampling_top_k": "50",
        "decode_sampling_nucleus_p": "0.95",
        "learning_rate": "2e-5",
        "learning_rate_schedule_steps": "100",
        "rl.num_generations": "4",
        "rl.reshard_chunk_size": "4",
        "debug": "True",
        "vllm_hf_overrides": '{"architectures": ["MaxTextForCausalLM"]}',
        "vllm_additional_config": (
            "{'maxtext_config': {'model_name': '" + model_name + "', 'model_call_mode': 'inference', "
            "'enable_dp_attention': false, 'allow_split_physical_axes': true, 'use_ragged_sort': false, "
            "'ragged_gather_reduce_fallback': true, 'prefuse_moe_weights': true, 'weight_dtype': 'bfloat16'}}"
        ),
    }


def _gke_overrides(
    model_name: str, specific: dict[str, str], order: list[str]
) -> tuple[tuple[str, str], ...]:
    merged = {"data_template_path": OPENMATH_TEMPLATE, **dict(OPENMATH_DATASET)}
    merged.update(_shared_gke_overrides(model_name))
    merged.update(specific)
    ordered = [k for k in order if k in merged] + [k for k in merged if k not in order]
    return tuple((k, merged[k]) for k in ordered)


# Order of the keys as the tutorials write them (the dataset keys follow the template).
_TUTORIAL_ORDER = [
    "scan_layers",
    "data_template_path",
    "dataset_name",
    "eval_dataset_name",
    "hf_train_files",
    "train_split",
    "num_test_batches",
    "batch_size",
    "train_micro_batch_size",
    "max_target_length",
    "max_prefill_predict_length",
    "mu_dtype",
    "grad_dtype",
    "rollout_tensor_parallelism",
    "rollout_expert_parallelism",
    "trainer_devices_fraction",
    "sampler_devices_fraction",
    "tokenizer_path",
    "ici_tensor_parallelism",
    "ici_expert_parallelism",
    "ici_fsdp_parallelism",
    "hbm_utilization_vllm",
]

QWEN3_30B_A3B = ModelPreset(
    model_name="qwen3-30b-a3b",
    runner=Runner.GKE,
    hf_model_path="Qwen/Qwen3-30B-A3B-Instruct-2507",
    export_model_name="qwen3-30b-a3b",
    scan_layers=True,
    job_prefixes=JobPrefixes(convert="qwen-hf-to-mt", train="qwen-rl", export="qwen-mt-to-hf"),
    blueprint=BlueprintEdits(grant_storage_admin=True),
    cgroup_memory_limit="190G",
    patch_tunix_reshard_chunk_size=True,
    train_overrides=_gke_overrides(
        "qwen3-30b-a3b",
        {
            # The tutorial's 0 evaluates nothing and records no reward; 2 batches of 8 prompts
            # before and after training and every eval_interval (10) steps (docs/tutorial-differences.md).
            "num_test_batches": "2",
            "batch_size": "8",
            "train_micro_batch_size": "8",
            "max_target_length": "512",
            "rollout_tensor_parallelism": "1",
            "rollout_expert_parallelism": "4",
            "tokenizer_path": "Qwen/Qwen3-30B-A3B-Instruct-2507",
            "hbm_utilization_vllm": "0.55",
        },
        _TUTORIAL_ORDER,
    ),
)

GEMMA4_26B = ModelPreset(
    model_name="gemma4-26b",
    runner=Runner.GKE,
    hf_model_path="google/gemma-4-26b-a4b-it",
    export_model_name="gemma4-26b",
    scan_layers=False,
    job_prefixes=JobPrefixes(convert="gemma4-hf-to-mt", train="gemma4-training", export="gemma4-mt-to-hf"),
    blueprint=BlueprintEdits(
        grant_storage_admin=True,
        system_node_pool_machine_type="e2-standard-8",
        pin_system_node_pool_zone=True,
    ),
    train_overrides=_gke_overrides(
        "gemma4-26b",
        {
            "scan_layers": "False",
            "batch_size": "4",
            "train_micro_batch_size": "2",
            "max_target_length": "640",
            "rollout_tensor_parallelism": "4",
            "rollout_expert_parallelism": "1",
            "tokenizer_path": "google/gemma-4-26b-a4b-it",
            "hbm_utilization_vllm": "0.7",
        },
        _TUTORIAL_ORDER,
    ),
)

# What the TPU VM tutorial (seed 002) runs every model with: its conversion's keys (eager tensors,
# zarr3 and OCDBT checkpoints), no Adafactor patch, and the TPU VM's MaxText release.
_TPU_VM_TUTORIAL: Final[dict[str, Any]] = {
    "patch_adafactor": False,
    "lazy_load_tensors": False,
    "checkpoint_storage_use_zarr3": 1,
    "checkpoint_storage_use_ocdbt": 1,
    "maxtext_version": TPU_VM_MAXTEXT_VERSION,
}

LLAMA31_8B_INSTRUCT = ModelPreset(
    model_name="llama3.1-8b-Instruct",
    runner=Runner.TPU_VM,
    hf_model_path=None,  # the tutorial lets MaxText pick the checkpoint for model_name
    export_model_name="llama3.1-8b",
    scan_layers=True,
    compute_type="ct6e-standard-8t",
    topology="2x4",
    **_TPU_VM_TUTORIAL,
    train_overrides=(
        ("chips_per_vm", "8"),
        ("num_test_batches", "10"),
        ("rollout_data_parallelism", "1"),
        ("rollout_tensor_parallelism", "-1"),
    ),
)

PRESETS: Final[MappingProxyType[str, ModelPreset]] = MappingProxyType(
    {p.model_name: p for p in (QWEN3_30B_A3B, GEMMA4_26B, LLAMA31_8B_INSTRUCT)}
)

# The rehearsal: every step of a real run at the smallest model MaxText's RL trainer and converters
# support, qwen3-0.6b (the smallest of MaxText's HF_IDS, src/maxtext/utils/globals.py l.60 at
# maxtext-v0.2.3 and v0.2.4: "qwen3-0.6b": "Qwen/Qwen3-0.6B"; its own RL integration test trains
# it: tests/post_training/integration/single_host_train_rl_test.py), for a few steps, on the
# smallest slice each pipeline can use: on GKE a 4x4 v6e slice of four ct6e-standard-4t VMs (the
# toolkit's TPU pool is a multi-host COMPACT slice of ct6e-standard-4t, and the smallest multi-host
# v6e slice is 4x4: a 2x4 is one ct6e-standard-8t, spec/cluster.py SliceShape), on a TPU VM one
# ct6e-standard-4t (v6e-4: the trainer and the vLLM sampler share its chips).
# One model name on both pipelines: each pipeline has its own preset of it (get_preset's runner).
REHEARSAL_MODEL: Final = "qwen3-0.6b"
REHEARSAL_HF_MODEL: Final = "Qwen/Qwen3-0.6B"
# MaxText's RL integration test's vLLM share of HBM for qwen3-0.6b (hbm_utilization_vllm=0.4).
_REHEARSAL_VLLM_HBM: Final = "0.4"
REHEARSAL_PRESETS: Final[MappingProxyType[Runner, ModelPreset]] = MappingProxyType(
    {
        Runner.GKE: ModelPreset(
            model_name=REHEARSAL_MODEL,
            runner=Runner.GKE,
            hf_model_path=REHEARSAL_HF_MODEL,
            export_model_name=REHEARSAL_MODEL,
            scan_layers=True,
            topology="4x4",
            num_batches=4,
            job_prefixes=JobPrefixes(
                convert="rehearsal-hf-to-mt", train="rehearsal-rl", export="rehearsal-mt-to-hf"
            ),
            blueprint=BlueprintEdits(grant_storage_admin=True),
            train_overrides=_gke_overrides(
                REHEARSAL_MODEL,
                {
                    "num_test_batches": "1",
                    "batch_size": "4",
                    "train_micro_batch_size": "4",
                    "max_target_length": "256",
                    "rollout_tensor_parallelism": "1",
                    "rollout_expert_parallelism": "1",
                    # a dense model: no experts to shard
                    "ici_tensor_parallelism": "1",
                    "ici_expert_parallelism": "1",
                    "tokenizer_path": REHEARSAL_HF_MODEL,
                    "hbm_utilization_vllm": _REHEARSAL_VLLM_HBM,
                },
                _TUTORIAL_ORDER,
            ),
        ),
        Runner.TPU_VM: ModelPreset(
            model_name=REHEARSAL_MODEL,
            runner=Runner.TPU_VM,
            hf_model_path=None,  # as the TPU VM tutorial: MaxText picks the checkpoint (HF_IDS)
            export_model_name=REHEARSAL_MODEL,
            scan_layers=True,
            compute_type="ct6e-standard-4t",
            topology="2x2",
            num_batches=4,
            **_TPU_VM_TUTORIAL,
            train_overrides=(
                ("chips_per_vm", "4"),
                ("num_test_batches", "1"),
                ("rollout_data_parallelism", "1"),
                ("rollout_tensor_parallelism", "-1"),
                ("hbm_utilization_vllm", _REHEARSAL_VLLM_HBM),
            ),
        ),
    }
)


def get_preset(model: str, field: str = "model", runner: Runner | None = None) -> ModelPreset:
    """The preset of ``model``; the rehearsal's for ``runner`` (its settings that both pipelines
    share, the dataset and the learning rate, are the same in both: without a runner, the GKE one)."""
    if model == REHEARSAL_MODEL:
        return REHEARSAL_PRESETS[runner or Runner.GKE]
    try:
        return PRESETS[model]
    except (KeyError, TypeError):
        known = sorted([*PRESETS, REHEARSAL_MODEL])
        raise SpecError(field, f"unknown model; choose one of {known}", model) from None


def presets_for(runner: Runner) -> list[str]:
    """The models a pipeline offers: the tutorials' for its runner, then the rehearsal."""
    return [*tutorial_presets_for(runner), REHEARSAL_MODEL]


def tutorial_presets_for(runner: Runner) -> list[str]:
    """The tutorials' models of a pipeline (no rehearsal)."""
    return [name for name, p in PRESETS.items() if p.runner is runner]
