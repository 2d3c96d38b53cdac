"""How long each stage of a run takes in the sandbox when it plays the tutorials' durations.

Off by default: every stage then lasts a few ``step_seconds`` so the suite stays fast. With the
sandbox setting ``minute_seconds`` above zero (``tpu-rl-sandbox bench`` sets it), a stage lasts
its real minutes below times ``minute_seconds``, so the TPU billed and busy spans a run records
keep the proportions of a real run.

Real minutes: the tutorials' where they state them (seed 002, the Llama 3.1 8B TPU VM: conversion
"about 5 minutes", training "about 10 minutes"), otherwise the estimates in the reference's
"Where the TPU time goes" (the seeds state no GKE durations): midpoints of conversion 15-30 min,
training start-up and 50 steps 20-50 min, export 15-30 min for the 26-30B models; the TPU VM's
install 15-30 min; its export a third of the 9-22 min of copy, export and delete.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

CONVERT, TRAIN, EXPORT = "convert", "train", "export"

_LARGE: Final = MappingProxyType({CONVERT: 22.5, TRAIN: 35.0, EXPORT: 22.5})
_SINGLE_HOST: Final = MappingProxyType({CONVERT: 5.0, TRAIN: 10.0, EXPORT: 5.0})
INSTALL_MINUTES: Final = 22.5  # the TPU VM's MaxText install (apt, uv, pip from sources)
# The TPU VM's container runtime instead of the install. No source states either: estimates.
# Pulling tpu_post_training (JAX, libtpu, torch, vLLM and tpu-inference: ~10-12 GB compressed,
# over 20 GB unpacked) from Artifact Registry in the same continent: docker fetches 3 layers at a
# time (dockerd's max-concurrent-downloads default), ~1-2 minutes at 100-200 MB/s, then unpacks each
# layer's gzip on one core (~100 MB/s), ~3 minutes: 5 minutes in all.
PULL_MINUTES: Final = 5.0
# Ubuntu's docker.io when the VM image has no Docker: apt fetches and sets up ~70 MB of packages.
DOCKER_INSTALL_MINUTES: Final = 1.0

# MaxText model_name -> stage -> real minutes.
STAGE_MINUTES: Final[Mapping[str, Mapping[str, float]]] = MappingProxyType(
    {
        "qwen3-30b-a3b": _LARGE,
        "gemma4-26b": _LARGE,
        "llama3.1-8b-Instruct": _SINGLE_HOST,
        "llama3.1-8b": _SINGLE_HOST,
    }
)


# How long creating and deleting capacity takes, real minutes. No source states them: estimates of
# a Compute Engine VM's create/delete operations and of Terraform creating/destroying a GKE TPU
# slice node pool (its nodes bill from their creation, so the whole span counts as billed).
CAPACITY_MINUTES: Final[Mapping[str, float]] = MappingProxyType(
    {
        "vm_create": 1.0,
        "vm_delete": 1.0,
        "tpu_pool_create": 5.0,
        "tpu_pool_delete": 3.0,
        # compute images create from a stopped VM's 200 GB boot disk (~25 GB written): no source
        # states its duration, an estimate. The bake's own cost, not TPU time.
        "image_create": 5.0,
    }
)


def capacity_seconds(minute_seconds: float, what: str) -> float:
    """Sandbox seconds of a capacity operation (:data:`CAPACITY_MINUTES`); 0 when the scale is off."""
    return CAPACITY_MINUTES[what] * minute_seconds if minute_seconds > 0 else 0.0


def stage_seconds(minute_seconds: float, model: str, stage: str, default: float) -> float:
    """Sandbox seconds of ``stage`` for ``model``: its real minutes x ``minute_seconds`` when the
    time scale is on and the stage has a duration, else ``default``."""
    if minute_seconds <= 0:
        return default
    minutes = STAGE_MINUTES.get(model, {}).get(stage)
    return default if minutes is None else minutes * minute_seconds
