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

Every duration here can be replaced, in real minutes, by the sandbox settings ``stage_minutes``
(the stages: :data:`STAGE_KEYS`) and ``capacity_minutes`` (:data:`CAPACITY_MINUTES`'s keys), as
``tpu-rl-sandbox bench --stage-minutes '{"train": 60, "vm_provisioning": 2}'`` does; a stage's
override applies to every model.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final

CONVERT, TRAIN, EXPORT = "convert", "train", "export"
INSTALL, PULL, DOCKER_INSTALL, COPY = "install", "pull", "docker_install", "copy"
STREAM_PULL = "stream_pull"

_LARGE: Final = MappingProxyType({CONVERT: 22.5, TRAIN: 35.0, EXPORT: 22.5})
_SINGLE_HOST: Final = MappingProxyType({CONVERT: 5.0, TRAIN: 10.0, EXPORT: 5.0})
# The rehearsal's qwen3-0.6b (a 13th of Llama 3.1 8B's parameters), for a few steps: no source,
# estimates a fifth of the 8B's conversion and export and half its training (start-up dominates).
_REHEARSAL: Final = MappingProxyType({CONVERT: 1.0, TRAIN: 5.0, EXPORT: 1.0})
INSTALL_MINUTES: Final = 22.5  # the TPU VM's MaxText install (apt, uv, pip from sources)
# The TPU VM's container runtime instead of the install. No source states either: estimates.
# Pulling tpu_post_training (JAX, libtpu, torch, vLLM and tpu-inference: ~10-12 GB compressed,
# over 20 GB unpacked) from Artifact Registry in the same continent: docker fetches 3 layers at a
# time (dockerd's max-concurrent-downloads default), ~1-2 minutes at 100-200 MB/s, then unpacks each
# layer's gzip on one core (~100 MB/s), ~3 minutes: 5 minutes in all.
PULL_MINUTES: Final = 5.0
# A GKE TPU node pool's pull of an image it streams (image streaming: the pool's enable_gcfs, the image
# in an Artifact Registry repository its nodes' account may use): an estimate, from two sources,
# none about TPU nodes or an image this size. Google's launch blog ("Introducing GKE image
# streaming for fast application startup and autoscaling", 2021-11-03, cloud.google.com/blog/
# products/containers-kubernetes/introducing-container-image-streaming-in-gke): the pull time goes
# "to a couple of seconds (irrespective of container size)" (GKE in general, a vendor's launch
# claim: second-hand for a v6e node and a 10+ GB image). One third party's test of Google's deep learning container (an
# aggregator's copy of a blog post, roastidio.us/topic/8750009, unverified): created in 20 s instead
# of 3 min 50 s. GKE's image-streaming page, "Limitations" (states, but gives no figure): a workload
# that reads many of the image's files while it starts (MaxText imports JAX, libtpu, torch) starts
# later, its reads being remote; and the first pull of an eligible image may show no benefit until
# image streaming has cached it. Half a minute: the blog's seconds plus an allowance for those remote
# reads, near the third party's 20 s; a guess. ``--stage-minutes '{"stream_pull": 5}'`` plays a
# first pull that shows no benefit.
STREAMED_PULL_MINUTES: Final = 0.5
# Ubuntu's docker.io when the VM image has no Docker: apt fetches and sets up ~70 MB of packages.
DOCKER_INSTALL_MINUTES: Final = 1.0
# The tutorials' TPU VM flow copies the trained checkpoint off the VM before its export: the
# reference's 9-22 minutes of copy, export and delete (midpoint 15.5) less the export's 5 and the
# delete's shutdown (vm_stopping, 1): an estimate. Only the tutorials' flow in the bench uses it (the
# pipeline trains straight into the bucket).
TUTORIAL_COPY_MINUTES: Final = 9.5

# The stages the sandbox times that are not capacity: the MaxText programs' (per model, below) and
# the TPU VM's own (one duration each).
STAGE_KEYS: Final = (CONVERT, TRAIN, EXPORT, INSTALL, PULL, STREAM_PULL, DOCKER_INSTALL, COPY)
_FIXED_MINUTES: Final = MappingProxyType(
    {
        INSTALL: INSTALL_MINUTES,
        PULL: PULL_MINUTES,
        STREAM_PULL: STREAMED_PULL_MINUTES,
        DOCKER_INSTALL: DOCKER_INSTALL_MINUTES,
        COPY: TUTORIAL_COPY_MINUTES,
    }
)

# MaxText model_name -> stage -> real minutes.
STAGE_MINUTES: Final[Mapping[str, Mapping[str, float]]] = MappingProxyType(
    {
        "qwen3-30b-a3b": _LARGE,
        "gemma4-26b": _LARGE,
        "llama3.1-8b-Instruct": _SINGLE_HOST,
        "llama3.1-8b": _SINGLE_HOST,
        "qwen3-0.6b": _REHEARSAL,
    }
)


# How long capacity takes to come and go, real minutes: the states a Compute Engine instance goes
# through (world/instances.py) and a GKE TPU node pool's own work around its node VMs. Billing runs
# from RUNNING to STOPPING only (docs/ledger.md, "What the TPU bills"), so each entry says whether
# it is billed. No source states any of these durations: every number is an estimate.
CAPACITY_MINUTES: Final[Mapping[str, float]] = MappingProxyType(
    {
        # A TPU instance's create waits in PENDING while Compute Engine finds capacity (instance
        # lifecycle page); a reservation or free on-demand capacity: at once. Unbilled.
        "vm_pending": 0.0,
        # A queued flex-start request's wait for capacity (DWS: "up to two hours" in its queue, the
        # flex-start VMs blog; the wait depends on capacity, 5 minutes is a guess). Unbilled.
        "flex_start_wait": 5.0,
        # A Spot request waits for nothing: capacity is there or the create fails. Unbilled.
        "spot_wait": 0.0,
        # PROVISIONING (resources allocated) and STAGING (prepared for first boot), unbilled; the
        # two together were the whole estimated minute of a VM create before.
        "vm_provisioning": 0.5,
        "vm_staging": 0.5,
        # RUNNING until the guest's sshd answers, after each create and each start: billed (RUNNING).
        # An earlier version of Compute Engine's lifecycle page said of RUNNING "You should be able
        # to ssh into the instance soon, but not immediately" (second-hand: as study notes quote it,
        # jayendrapatil.com/gcp-compute-engine; the current page's copy here does not show the
        # sentence); no page gives a duration. The one measurement found is a third party's (R.
        # Aboukhalil, "Move Fast and Break the Cloud", Medium, 2018: ~5,000 N1 VMs, Debian 9):
        # request-to-SSH ~25 s up to 32 vCPUs, under a minute up to 96; a ct6e-standard-8t has 180
        # vCPUs and an Ubuntu accelerator image. An estimate, not a TPU VM's measured boot.
        "guest_boot": 1.0,
        # STOPPING to gone (a delete) or TERMINATED (a stop, a preemption): the guest's shutdown,
        # unbilled; the whole estimated minute of a VM delete before.
        "vm_stopping": 1.0,
        # A TPU node pool's create: GKE's and Terraform's work before any node VM exists, unbilled;
        # then the node VMs' own PENDING, PROVISIONING and STAGING (the entries above); then, billed,
        # each node's boot until its node is Ready (kubelet, the TPU device plugin) and Terraform sees
        # the pool RUNNING. 1 + 1 + 3: the 5 estimated minutes of the pool's create before.
        "tpu_pool_create": 1.0,
        "tpu_node_ready": 3.0,
        # A TPU node pool's destroy drains its nodes first (billed; no estimate: :func:`drain_seconds`,
        # from the pods still running), then the VMs' STOPPING (vm_stopping) and the pool's removal.
        # The cluster autoscaler removes a node no pod needs after ``scale-down-unneeded-time``,
        # 10 minutes by default (kubernetes/autoscaler cluster-autoscaler/FAQ.md, direct): the
        # node pools GKE auto-created for a ComputeClass (world/compute_classes.py). Billed.
        "scale_down_unneeded": 10.0,
        # compute images create from a stopped VM's 200 GB boot disk (~25 GB written): no source
        # states its duration, an estimate. The bake's own cost, not TPU time.
        "image_create": 5.0,
    }
)


# A TPU node pool's drain, before its node VMs are deleted (they still run meanwhile: billed). The
# `gcloud container node-pools delete` reference (cloud.google.com/sdk/gcloud/reference/container/
# node-pools/delete; second-hand for GKE's own behaviour, which the page describes): GKE drains every
# node of the pool by deleting its pods with a grace period of the largest
# ``terminationGracePeriodSeconds`` among the pods on that node, capped at one hour. Kubernetes'
# PodSpec: the field "Defaults to 30 seconds". Pods that have finished (Succeeded, Failed) have
# nothing to stop and DaemonSet pods are not the workload (the sandbox has none): no pod running,
# no drain. The sandbox waits the whole grace period, an upper bound (a pod that ends on its SIGTERM
# sooner ends the real drain sooner).
DEFAULT_GRACE_SECONDS: Final = 30
DRAIN_CAP_SECONDS: Final = 3600


def drain_real_minutes(graces: Iterable[int | float | None]) -> float:
    """Real minutes of a TPU node pool's drain: the largest of ``graces`` (the running pods'
    ``terminationGracePeriodSeconds``, None where unset: :data:`DEFAULT_GRACE_SECONDS`), capped at
    :data:`DRAIN_CAP_SECONDS`, in minutes; 0 with no pod running."""
    seconds = max(
        (min(DRAIN_CAP_SECONDS, max(0.0, float(DEFAULT_GRACE_SECONDS if g is None else g))) for g in graces),
        default=0.0,
    )
    return seconds / 60.0


def drain_seconds(minute_seconds: float, graces: Iterable[int | float | None]) -> float:
    """Sandbox seconds of a TPU node pool's drain (:func:`drain_real_minutes` on the time scale);
    0 when the scale is off."""
    return drain_real_minutes(graces) * minute_seconds if minute_seconds > 0 else 0.0


def capacity_seconds(minute_seconds: float, what: str, overrides: Mapping[str, float] | None = None) -> float:
    """Sandbox seconds of a capacity state or operation (:data:`CAPACITY_MINUTES`, or the
    sandbox setting ``capacity_minutes``'s value for it); 0 when the scale is off."""
    minutes = CAPACITY_MINUTES[what]
    if overrides and what in overrides:
        minutes = float(overrides[what])
    return minutes * minute_seconds if minute_seconds > 0 else 0.0


# With the time scale off, one real minute of a guest's boot (only when ``capacity_minutes`` names
# ``guest_boot``: else none, as the other capacity states, so a test's ssh right after its create
# answers) and of gcloud's SSH poll around it lasts this long.
SCALE_OFF_GUEST_MINUTE_SECONDS: Final = 0.1


def guest_seconds(minute_seconds: float, real_seconds: float) -> float:
    """Sandbox seconds of ``real_seconds`` of a guest's boot or of ssh's tries around it: on the
    time scale, or :data:`SCALE_OFF_GUEST_MINUTE_SECONDS` a real minute when it is off."""
    per_minute = minute_seconds if minute_seconds > 0 else SCALE_OFF_GUEST_MINUTE_SECONDS
    return real_seconds / 60.0 * per_minute


def guest_boot_seconds(minute_seconds: float, overrides: Mapping[str, float] | None = None) -> float:
    """Sandbox seconds from a VM's RUNNING until its sshd answers: ``guest_boot`` (or the sandbox
    setting ``capacity_minutes``'s value for it) on the time scale; with the scale off, only an
    override's, at :data:`SCALE_OFF_GUEST_MINUTE_SECONDS` a minute."""
    given = (overrides or {}).get("guest_boot")
    if minute_seconds <= 0 and given is None:
        return 0.0
    minutes = float(CAPACITY_MINUTES["guest_boot"] if given is None else given)
    return guest_seconds(minute_seconds, minutes * 60.0)


def stage_real_minutes(
    stage: str, model: str | None = None, overrides: Mapping[str, float] | None = None
) -> float | None:
    """Real minutes of ``stage`` (:data:`STAGE_KEYS`): the override (sandbox setting
    ``stage_minutes``) if any, else the MaxText stage's for ``model`` or the TPU VM stage's own
    estimate; None when the model has no duration for it."""
    if overrides and stage in overrides:
        return float(overrides[stage])
    if stage in _FIXED_MINUTES:
        return _FIXED_MINUTES[stage]
    return STAGE_MINUTES.get(model or "", {}).get(stage)


def stage_seconds(
    minute_seconds: float,
    model: str,
    stage: str,
    default: float,
    overrides: Mapping[str, float] | None = None,
) -> float:
    """Sandbox seconds of ``stage`` for ``model``: its real minutes (:func:`stage_real_minutes`) x
    ``minute_seconds`` when the time scale is on and the stage has a duration, else ``default``."""
    if minute_seconds <= 0:
        return default
    minutes = stage_real_minutes(stage, model, overrides)
    return default if minutes is None else minutes * minute_seconds


def split_minutes(overrides: Mapping[str, object]) -> tuple[dict[str, float], dict[str, float]]:
    """Real-minute overrides split into the stages' (``stage_minutes``) and the capacity's
    (``capacity_minutes``); ValueError, in one line naming the known keys, for an unknown key or a
    value that is not a number of minutes >= 0."""
    known = (*STAGE_KEYS, *CAPACITY_MINUTES)
    unknown = sorted(str(key) for key in overrides if key not in known)
    if unknown:
        raise ValueError(f"unknown duration(s) {', '.join(unknown)}: the known ones are {', '.join(known)}")
    stages: dict[str, float] = {}
    capacity: dict[str, float] = {}
    for key, value in overrides.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
            raise ValueError(f"{key}: {value!r} is not a number of minutes >= 0")
        (stages if key in STAGE_KEYS else capacity)[key] = float(value)
    return stages, capacity
