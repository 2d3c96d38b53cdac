"""Knobs of the fake cloud that a real project sets outside the pipeline: whether the project's IAM
policy holds a conditional binding, which APIs are disabled, which permissions the caller lacks,
which TPU reservations exist, and whether the machine's gcloud is logged in.

Stored as ``<root>/state/settings.json`` (written atomically, read on every use, so a running
fake or API server sees a change at once). Tests change them with :func:`update_settings`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from types import MappingProxyType
from typing import Any

from tpu_rl_sandbox.world import capacity
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.timescale import CAPACITY_MINUTES, STAGE_KEYS

SETTINGS_FILE = "settings.json"


def _reservation(machine_type: str, count: int) -> dict[str, Any]:
    return {
        "machine_type": machine_type,
        "count": count,
        "status": "READY",
        "specific_reservation_required": True,
    }


# Every reservation the demo, the DAG defaults and the tests name (zone "us-east5-b"): a v6e-32
# is 8 ct6e-standard-4t VMs, a v6e-8 one ct6e-standard-8t VM. Keys are "<zone>/<name>"; each
# reservation exists in every project of the sandbox (its capacity is counted per project).
DEFAULT_RESERVATIONS: Mapping[str, dict[str, Any]] = MappingProxyType(
    {
        "us-east5-b/res-1": _reservation("ct6e-standard-4t", 8),
        "us-east5-b/demo-v6e-32": _reservation("ct6e-standard-4t", 8),
        "us-east5-b/res-8": _reservation("ct6e-standard-8t", 1),
        "us-east5-b/my-v6e-8-reservation": _reservation("ct6e-standard-8t", 1),
    }
)


@dataclass(frozen=True)
class SandboxSettings:
    """How the fake project is set up.

    * ``conditional_bindings``: the project's IAM policy holds a conditional binding (as many
      real projects do), so ``gcloud ... add-iam-policy-binding`` without ``--condition``
      refuses in non-interactive mode.
    * ``disabled_services``: APIs (``tpu.googleapis.com``) not enabled in any project.
    * ``denied_permissions``: permissions the caller lacks (``testIamPermissions`` leaves them
      out; the fake gcloud commands that need them fail with PERMISSION_DENIED).
    * ``reservations``: ``"<zone>/<name>" -> {"machine_type", "count", "status",
      "specific_reservation_required"}``.
    * ``boot_apt_seconds``: how long a new TPU VM's own apt work runs after it is created (an
      Ubuntu cloud image's apt-daily then unattended-upgrades): apt's lists lock is held for the
      first half, dpkg's frontend lock for the second.
    * ``gcloud_logged_in``: the machine's gcloud has a credentialed active account (as after
      ``gcloud auth login``). ``False`` is a fresh gcloud config: ``gcloud auth list`` lists no
      account and every command that calls an API refuses with gcloud's "You do not currently
      have an active account selected." (googlecloudsdk/core/credentials/exceptions.py
      ``NoActiveAccountException``).
    * ``gcloud_components``: the gcloud components installed besides core's (``bq``, ``core``,
      ``gcloud-crc32c``, ``gsutil``), as ``gcloud version`` lists them: by default ``alpha`` and
      ``beta``, as Debian's google-cloud-cli package ships them (``dpkg -S`` on this machine) and
      the provider's toolchain image installs ``alpha``. A command of a release track whose
      component is missing is refused as gcloud refuses it on an SDK its user cannot write
      (calliope/parser_extensions.py, then core/exceptions.py ``RequiresAdminRightsError``).
    * ``vm_docker_credential_helper``: a VM's image has gcloud's Docker credential helper on
      root's PATH (sudo's secure_path), as Debian's and Ubuntu's google-cloud-cli package links
      ``/usr/bin/docker-credential-gcloud``. ``False`` is an SDK installed elsewhere: a pull through
      the helper ``configure-docker`` registers fails as Docker fails it.
    * ``region_quotas``: each region's Compute Engine quota limits, metric -> limit, as ``gcloud
      compute regions describe`` lists them (usage 0: the sandbox does not count it). Defaults:
      PREEMPTIBLE_TPU_V6E 64 (Cloud TPU's "default preemptible quota for TPU v5e and v6e is 64
      cores", request-using-flex-start), N4_CPUS, N2_CPUS and CPUS generous; a test lowers one.
    * ``project_quotas``: the project's own quota limits (all regions), as ``gcloud compute
      project-info describe`` lists them (usage 0). Default: CPUS_ALL_REGIONS generous.
    * ``gcluster_release``: the release the fake ``gcluster`` plays, ``{"version", "terraform",
      "packer"}`` (what ``--version`` prints, and the Terraform/Packer versions its dependency
      check requires); empty: the pinned release (``clis.gcluster.dependencies.PINNED_RELEASE``).
    * ``iam_propagation_seconds``: how long a new ``secretAccessor`` grant on a secret takes to
      take effect: until then the member's reads get Secret Manager's 403. Real IAM: "typically
      2 minutes, but could potentially take 7 minutes or longer" (Google Cloud IAM docs, "Access
      change propagation"); the sandbox's default is short so the suite stays fast.
    * ``workload_identity_effective``: ``False`` is a GKE cluster whose Workload Identity binding
      (the gke-cluster module's, made at the deploy) has not taken effect yet: a pod's request for
      its service account's token gets the GKE metadata server's 403, which google-auth raises as
      ``RefreshError`` (google/auth/compute_engine/credentials.py ``_perform_refresh_token``).
    * ``kueue_admits``: ``False`` makes Kueue admit no new workload (as when other workloads hold
      the ClusterQueue's whole quota): every JobSet submitted stays ``Suspended`` until it is
      ``True`` again.
    * ``preempt_after_checkpoints``: N > 0 takes the TPU capacity from under a training run right
      after it commits its Nth checkpoint, once per run directory (a GKE pod's node shuts down:
      the kubelet fails it with reason ``Terminated`` and a ``DisruptionTarget`` condition; a TPU
      VM goes as its ``instanceTerminationAction`` says and its SSH session ends); a retry then
      resumes from that checkpoint.
    * ``preempt_steps_after``: with ``preempt_after_checkpoints``, the steps trained past that
      checkpoint before the capacity goes (0: at once); the retry trains them again.
    * ``minute_seconds``: the time scale. 0 (the default): every stage lasts a few
      ``step_seconds``. Above 0: conversion, training, export and the TPU VM's install last their
      real minutes (``timescale.STAGE_MINUTES``) times this, as ``make bench`` plays them.
    * ``capacity_minutes``: real minutes of capacity states and operations that replace
      ``timescale.CAPACITY_MINUTES``'s estimates (``{"vm_provisioning": 4}``), under the same scale.
    * ``stage_minutes``: real minutes of stages (``timescale.STAGE_KEYS``: conversion, training,
      export for every model, the TPU VM's install, pull and Docker install) that replace the time
      scale's (``{"train": 60}``), under the same scale.
    * ``spot_tpu_restart``: ``False`` (the default) refuses ``instances start`` of a Spot TPU VM
      (a ``ct*`` machine type, ``SPOT`` provisioning model) preempted since it last started, as
      Cloud TPU's spot page says (docs.cloud.google.com/tpu/docs/spot: "You can't restart TPU
      Spot VMs, and you must recreate them after preemption"); ``True`` starts it, as Compute
      Engine's spot page says of Spot VMs stopped by their termination action.
    * ``tpu_capacity_out``: the TPU capacity a zone cannot give now, ``"<zone>/<kind>"`` (kind:
      ``on-demand``, ``reservation``, ``spot``, ``flex-start``) -> ``stockout`` or ``quota`` (spot
      and flex-start, whose chips take PREEMPTIBLE_TPU_V6E): a TPU VM's ``instances create`` of
      that kind fails as Compute Engine's refusal does (``world/capacity.py``). A full reservation
      is its ``count`` in ``reservations``.
    * ``hold_seconds``: the longest a job waits on a test's hold file (``TPU_RL_SANDBOX_HOLD_FILE``)
      before it goes on by itself (120 s; the real-services tests, whose runs share two cores with
      another leg's, give theirs longer).
    * ``held_vm_states``: Compute Engine states a VM stays in while they are listed here: a
      create's ``PENDING``, ``PROVISIONING`` or ``STAGING``, a delete's ``STOPPING``. The gcloud
      that waits on the VM waits until a test takes the state out (or ``hold_seconds`` pass), then
      the VM goes on through its next states from that moment: a test sees each state whatever the
      load, where a state of a few scaled seconds may come and go between two of its reads.
    """

    conditional_bindings: bool = True
    disabled_services: tuple[str, ...] = ()
    denied_permissions: tuple[str, ...] = ()
    reservations: Mapping[str, dict[str, Any]] = field(
        default_factory=lambda: {key: dict(value) for key, value in DEFAULT_RESERVATIONS.items()}
    )
    boot_apt_seconds: float = 2.0
    gcloud_logged_in: bool = True
    gcluster_release: Mapping[str, str] = field(default_factory=dict)
    gcloud_components: tuple[str, ...] = ("alpha", "beta")
    vm_docker_credential_helper: bool = True
    region_quotas: Mapping[str, float] = field(
        default_factory=lambda: {
            "PREEMPTIBLE_TPU_V6E": 64.0,
            "N4_CPUS": 512.0,
            "N2_CPUS": 512.0,
            "CPUS": 2400.0,
        }
    )
    project_quotas: Mapping[str, float] = field(default_factory=lambda: {"CPUS_ALL_REGIONS": 2400.0})
    iam_propagation_seconds: float = 0.5
    minute_seconds: float = 0.0
    kueue_admits: bool = True
    workload_identity_effective: bool = True
    preempt_after_checkpoints: int = 0
    preempt_steps_after: int = 0
    capacity_minutes: Mapping[str, float] = field(default_factory=dict)
    stage_minutes: Mapping[str, float] = field(default_factory=dict)
    hold_seconds: float = 120.0
    spot_tpu_restart: bool = False
    tpu_capacity_out: Mapping[str, str] = field(default_factory=dict)
    held_vm_states: tuple[str, ...] = ()

    @property
    def preemption(self) -> tuple[int, int]:
        """When a training loses its machine: after this many checkpoints, this many steps past."""
        return self.preempt_after_checkpoints, self.preempt_steps_after

    def reservation(self, zone: str, name: str) -> dict[str, Any] | None:
        """The reservation ``name`` in ``zone`` with defaults filled in, or ``None``."""
        found = self.reservations.get(f"{zone}/{name}")
        if found is None:
            return None
        return {"status": "READY", "specific_reservation_required": True, **found}


def _path(layout: SandboxLayout) -> os.PathLike[str]:
    return layout.state_dir / SETTINGS_FILE


def _from_json(data: Mapping[str, Any]) -> SandboxSettings:
    known = {f.name for f in fields(SandboxSettings)}
    values: dict[str, Any] = {k: v for k, v in data.items() if k in known}
    for name in ("disabled_services", "denied_permissions", "gcloud_components", "held_vm_states"):
        if name in values:
            values[name] = tuple(str(v) for v in values[name])
    if "gcluster_release" in values:
        values["gcluster_release"] = {
            str(k): str(v) for k, v in dict(values["gcluster_release"] or {}).items()
        }
    if "reservations" in values:
        values["reservations"] = {str(k): dict(v) for k, v in dict(values["reservations"]).items()}
    if "tpu_capacity_out" in values:
        values["tpu_capacity_out"] = capacity.check_setting(dict(values["tpu_capacity_out"] or {}))
    for name in ("capacity_minutes", "stage_minutes"):
        if name in values:
            values[name] = {str(k): float(v) for k, v in dict(values[name] or {}).items()}
    return SandboxSettings(**values)


def load_settings(layout: SandboxLayout) -> SandboxSettings:
    """The sandbox's settings (defaults when none were written)."""
    try:
        with open(_path(layout)) as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return SandboxSettings()
    return _from_json(data)


@contextlib.contextmanager
def _settings_lock(layout: SandboxLayout) -> Iterator[None]:
    # Its own lock file: never taken together with the state lock, so no re-entrant deadlock.
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    with (layout.state_dir / ".settings.lock").open("a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def update_settings(layout: SandboxLayout, **changes: Any) -> SandboxSettings:
    """Change some settings (``update_settings(layout, disabled_services=("tpu.googleapis.com",))``)."""
    unknown = set(changes) - {f.name for f in fields(SandboxSettings)}
    if unknown:
        raise TypeError(f"unknown sandbox setting(s): {', '.join(sorted(unknown))}")
    strange = set(dict(changes.get("capacity_minutes") or {})) - set(CAPACITY_MINUTES)
    if strange:
        raise TypeError(f"unknown capacity_minutes key(s): {', '.join(sorted(strange))}")
    strange = set(dict(changes.get("stage_minutes") or {})) - set(STAGE_KEYS)
    if strange:
        raise TypeError(f"unknown stage_minutes key(s): {', '.join(sorted(strange))}")
    with _settings_lock(layout):
        current = load_settings(layout)
        updated = _from_json({**asdict(current), **changes})
        data = asdict(updated)
        data["reservations"] = {k: dict(v) for k, v in updated.reservations.items()}
        data["gcluster_release"] = dict(updated.gcluster_release)
        data["capacity_minutes"] = dict(updated.capacity_minutes)
        data["stage_minutes"] = dict(updated.stage_minutes)
        data["tpu_capacity_out"] = dict(updated.tpu_capacity_out)
        import tempfile  # here: a fake call that only reads starts without it

        fd, tmp = tempfile.mkstemp(dir=layout.state_dir, prefix=".settings.", suffix=".tmp")
        with os.fdopen(fd, "w") as handle:
            json.dump(data, handle, indent=1, sort_keys=True)
        os.replace(tmp, _path(layout))
    return updated


def reset_settings(layout: SandboxLayout) -> SandboxSettings:
    """Back to the defaults."""
    return update_settings(layout, **asdict(SandboxSettings()))


__all__ = [
    "DEFAULT_RESERVATIONS",
    "SandboxSettings",
    "load_settings",
    "reset_settings",
    "update_settings",
]
