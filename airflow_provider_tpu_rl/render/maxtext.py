"""MaxText's programs: where each one's JAX runs, and the ``python3 -m`` argv of a call.

Every MaxText command the provider renders is built here, so the keys a machine without TPU chips
needs are derived from where the program runs instead of being remembered by each stage.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from airflow_provider_tpu_rl.render.shell import key_values
from airflow_provider_tpu_rl.spec.workloads import ConversionSpec, ExportSpec

TO_MAXTEXT = "maxtext.checkpoint_conversion.to_maxtext"
TRAIN_RL = "maxtext.trainers.post_train.rl.train_rl"
TO_HUGGINGFACE = "maxtext.checkpoint_conversion.to_huggingface"
PROGRAMS = (TO_MAXTEXT, TRAIN_RL, TO_HUGGINGFACE)

CPU = "cpu"
TPU = "tpu"
# The device each program's JAX uses. The converters force JAX onto the CPU whatever the machine
# has (``jax.config.update("jax_platforms", "cpu")``: maxtext-v0.2.3 to_maxtext.py l.1160,
# to_huggingface.py l.589); the GRPO trainer needs the TPU.
PROGRAM_DEVICE = {TO_MAXTEXT: CPU, TRAIN_RL: TPU, TO_HUGGINGFACE: CPU}

# What a MaxText program needs to start where JAX has no TPU. Every program reads its config with
# pyconfig, which calls ``max_utils.maybe_initialize_jax_distributed_system`` first
# (maxtext-v0.2.3/v0.2.4 pyconfig.py l.542/l.565). Without ``skip_jax_distributed_system`` it
# calls ``jax.distributed.initialize()`` for the default ``hardware: 'tpu'`` (checkpointing on),
# and JAX finds no cluster off a TPU host: "ValueError: coordinator_address should be defined."
# (jax/_src/distributed.py); with ``hardware=cpu`` alone it runs ``initialize_jax_for_cpu``, which
# needs XPK's JOB_INDEX / PROCESSES_IN_JOB / JAX_PROCESS_COUNT. ``skip_jax_distributed_system=true``
# skips both; ``hardware=cpu`` makes the rest of MaxText (meshes, device checks) expect CPU devices.
# MaxText's own CPU examples pass both (to_huggingface.py's docstring, the tutorials' conversions).
CPU_KEYS: tuple[tuple[str, str], ...] = (("hardware", "cpu"), ("skip_jax_distributed_system", "true"))


def program_device(module: str, machine: str) -> str:
    """Where ``module``'s JAX runs on ``machine`` (``cpu``: no TPU chips, or ``tpu``)."""
    if module not in PROGRAM_DEVICE:
        raise ValueError(f"not a MaxText program: {module!r}")
    if machine not in (CPU, TPU):
        raise ValueError(f"machine must be {CPU!r} or {TPU!r}, got {machine!r}")
    return CPU if CPU in (PROGRAM_DEVICE[module], machine) else TPU


def program_argv(
    module: str,
    config: Iterable[tuple[str, str]],
    *,
    machine: str,
    leading: Sequence[str] = (),
    flags: Sequence[str] = (),
) -> list[str]:
    """``python3 -m module [leading] key=value… [flags]``, with :data:`CPU_KEYS` after ``config``
    when the program's JAX runs on the CPU; ``config`` may not set them otherwise."""
    pairs = list(config)
    if program_device(module, machine) == CPU:
        given = dict(pairs)
        for key, value in CPU_KEYS:
            if given.get(key, value) != value:
                raise ValueError(f"{module} runs on the CPU here: {key} must be {value}, not {given[key]!r}")
        pairs = [pair for pair in pairs if pair[0] not in dict(CPU_KEYS)] + list(CPU_KEYS)
    return ["python3", "-m", module, *leading, *key_values(pairs), *flags]


def to_maxtext_argv(conversion: ConversionSpec, *, machine: str) -> list[str]:
    """HF → MaxText (the tutorials' ``to_maxtext`` call; the same on both pipelines)."""
    leading = [f"model_name={conversion.model_name}"]
    if conversion.hf_model_path:
        leading.append(f"--hf_model_path={conversion.hf_model_path}")
    return program_argv(
        TO_MAXTEXT,
        [
            ("base_output_directory", conversion.output_directory),
            ("scan_layers", str(conversion.scan_layers)),
            ("use_multimodal", "False"),
            ("checkpoint_storage_use_zarr3", str(conversion.checkpoint_storage_use_zarr3)),
            ("checkpoint_storage_use_ocdbt", str(conversion.checkpoint_storage_use_ocdbt)),
        ],
        machine=machine,
        leading=leading,
        flags=[f"--lazy_load_tensors={conversion.lazy_load_tensors}"],
    )


def to_huggingface_argv(export: ExportSpec, *, machine: str, override_architecture: bool) -> list[str]:
    """MaxText → HF; ``override_architecture``: the GKE tutorials' ``--override_model_architecture``."""
    return program_argv(
        TO_HUGGINGFACE,
        [
            ("model_name", export.model_name),
            ("load_parameters_path", export.load_parameters_path),
            ("base_output_directory", export.output_directory),
            ("scan_layers", str(export.scan_layers)),
            ("use_multimodal", "False"),
            ("weight_dtype", export.weight_dtype),
        ],
        machine=machine,
        flags=["--override_model_architecture"] if override_architecture else (),
    )
