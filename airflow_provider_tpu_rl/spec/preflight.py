"""What a run needs before it creates anything: APIs, the caller's permissions, reservation room.

Pure Python (no Airflow): the ``preflight`` operator gathers the facts (``gcloud services list``,
Resource Manager ``testIamPermissions``, ``gcloud compute reservations describe``) and these
functions turn them into problems, one line each, naming what to enable, grant or create.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from airflow_provider_tpu_rl.spec import rules
from airflow_provider_tpu_rl.spec.cluster import SliceShape
from airflow_provider_tpu_rl.spec.errors import SpecError
from airflow_provider_tpu_rl.spec.presets import Runner

# APIs each runner's commands call, from the modules and tools they use:
# - Cluster Toolkit module metadata (v1.95.0 ``spec.requirements.services``): gke-cluster,
#   gke-node-pool and kubectl-apply need container, vpc needs compute, service-account needs iam,
#   cloud-storage-bucket needs storage;
# - the service-account module's project roles are project IAM bindings (Resource Manager API),
#   which is also the API of the preflight's own testIamPermissions call;
# - ``gcluster job`` (cmd/job/prereq.go) refuses to submit unless ``gcloud services list`` shows
#   artifactregistry.googleapis.com ENABLED; ``gcloud services list`` needs Service Usage;
# - the HF token lives in Secret Manager; the run's bucket and checkpoints in Cloud Storage.
# The TPUs themselves are Compute Engine machine types (ct6e-standard-*) reached through the GKE
# node pool or ``gcloud compute instances create``: neither calls the Cloud TPU API.
GKE_SERVICES: Final = (
    "container.googleapis.com",
    "compute.googleapis.com",
    "iam.googleapis.com",
    "storage.googleapis.com",
    "cloudresourcemanager.googleapis.com",
    "serviceusage.googleapis.com",
    "artifactregistry.googleapis.com",
    "secretmanager.googleapis.com",
)
TPU_VM_SERVICES: Final = (
    "compute.googleapis.com",
    "storage.googleapis.com",
    "cloudresourcemanager.googleapis.com",
    "serviceusage.googleapis.com",
    "secretmanager.googleapis.com",
)
REQUIRED_SERVICES: Final[Mapping[Runner, tuple[str, ...]]] = MappingProxyType(
    {Runner.GKE: GKE_SERVICES, Runner.TPU_VM: TPU_VM_SERVICES}
)

# Permissions on the project the caller (the Composer environment's / worker's service account)
# needs, each with a predefined role that grants it (each pair checked against the role's permission
# list in iann0036/iam-dataset gcp/roles/, Aug 2026;
# the roles are those the tutorials ask for, plus Secret Manager and Service Usage).
# What both runners do with the bucket, the HF token secret and the enabled-API list.
_SHARED_PERMISSIONS: Final = {
    # the run's bucket, its checkpoints and outputs, the janitor's record.
    "storage.buckets.create": "roles/storage.admin",
    "storage.buckets.get": "roles/storage.admin",
    "storage.objects.create": "roles/storage.admin",
    "storage.objects.get": "roles/storage.admin",
    "storage.objects.list": "roles/storage.admin",
    "storage.objects.delete": "roles/storage.admin",
    # the HF token secret and its readers.
    "secretmanager.secrets.create": "roles/secretmanager.admin",
    "secretmanager.versions.add": "roles/secretmanager.admin",
    # a new version only when the token changed (the digest annotation), older ones disabled.
    "secretmanager.secrets.get": "roles/secretmanager.admin",
    "secretmanager.secrets.update": "roles/secretmanager.admin",
    "secretmanager.versions.list": "roles/secretmanager.admin",
    "secretmanager.versions.disable": "roles/secretmanager.admin",
    "secretmanager.secrets.getIamPolicy": "roles/secretmanager.admin",
    "secretmanager.secrets.setIamPolicy": "roles/secretmanager.admin",
    # gcloud services list (preflight, gcluster job's prerequisite check).
    "serviceusage.services.list": "roles/serviceusage.serviceUsageConsumer",
}
_GKE_PERMISSIONS: Final = {
    # gcluster deploy/destroy: the gke-cluster and gke-node-pool modules, kubectl-apply (Kueue,
    # JobSet) and gcluster job submit (JobSet objects) through the cluster's Kubernetes API.
    "container.clusters.create": "roles/container.admin",
    "container.clusters.get": "roles/container.admin",
    "container.clusters.update": "roles/container.admin",
    "container.clusters.delete": "roles/container.admin",
    "container.clusters.list": "roles/container.admin",
    "container.operations.get": "roles/container.admin",
    "container.customResourceDefinitions.create": "roles/container.admin",
    "container.thirdPartyObjects.create": "roles/container.admin",
    # the vpc modules: networks, subnetworks, firewall rules, Cloud Router + NAT with its addresses.
    "compute.networks.create": "roles/compute.admin",
    "compute.networks.get": "roles/compute.admin",
    "compute.networks.delete": "roles/compute.admin",
    "compute.subnetworks.create": "roles/compute.admin",
    "compute.subnetworks.get": "roles/compute.admin",
    "compute.subnetworks.delete": "roles/compute.admin",
    "compute.firewalls.create": "roles/compute.admin",
    "compute.firewalls.get": "roles/compute.admin",
    "compute.firewalls.delete": "roles/compute.admin",
    "compute.routers.create": "roles/compute.admin",
    "compute.routers.get": "roles/compute.admin",
    "compute.routers.delete": "roles/compute.admin",
    "compute.addresses.create": "roles/compute.admin",
    "compute.addresses.delete": "roles/compute.admin",
    "compute.reservations.get": "roles/compute.admin",
    # the service-account modules and the node pool running as one of them.
    "iam.serviceAccounts.create": "roles/iam.serviceAccountAdmin",
    "iam.serviceAccounts.get": "roles/iam.serviceAccountAdmin",
    "iam.serviceAccounts.delete": "roles/iam.serviceAccountAdmin",
    "iam.serviceAccounts.actAs": "roles/iam.serviceAccountUser",
    # the service-account modules' project_roles (project IAM bindings).
    "resourcemanager.projects.getIamPolicy": "roles/resourcemanager.projectIamAdmin",
    "resourcemanager.projects.setIamPolicy": "roles/resourcemanager.projectIamAdmin",
    # delete_bucket at teardown (the Terraform state lives in the bucket too).
    "storage.buckets.delete": "roles/storage.admin",
}
_TPU_VM_PERMISSIONS: Final = {
    # gcloud compute instances create/describe/delete (labels, service account, boot disk from a
    # public image on the default network, the reservation) and the janitor's list.
    "compute.instances.create": "roles/compute.instanceAdmin.v1",
    "compute.instances.get": "roles/compute.instanceAdmin.v1",
    "compute.instances.delete": "roles/compute.instanceAdmin.v1",
    "compute.instances.list": "roles/compute.instanceAdmin.v1",
    "compute.instances.setLabels": "roles/compute.instanceAdmin.v1",
    "compute.instances.setMetadata": "roles/compute.instanceAdmin.v1",
    "compute.instances.setServiceAccount": "roles/compute.instanceAdmin.v1",
    "compute.disks.create": "roles/compute.instanceAdmin.v1",
    "compute.images.useReadOnly": "roles/compute.instanceAdmin.v1",
    "compute.subnetworks.use": "roles/compute.instanceAdmin.v1",
    "compute.subnetworks.useExternalIp": "roles/compute.instanceAdmin.v1",
    "compute.reservations.get": "roles/compute.instanceAdmin.v1",
    "compute.zoneOperations.get": "roles/compute.instanceAdmin.v1",
    # gcloud compute ssh: reads the project and adds its key to the project's metadata.
    "compute.projects.get": "roles/compute.instanceAdmin.v1",
    "compute.projects.setCommonInstanceMetadata": "roles/compute.instanceAdmin.v1",
    # the VM runs as a service account.
    "iam.serviceAccounts.actAs": "roles/iam.serviceAccountUser",
    # the VM's object access on the bucket.
    "storage.buckets.getIamPolicy": "roles/storage.admin",
    "storage.buckets.setIamPolicy": "roles/storage.admin",
}
REQUIRED_PERMISSIONS: Final[Mapping[Runner, Mapping[str, str]]] = MappingProxyType(
    {
        Runner.GKE: MappingProxyType({**_SHARED_PERMISSIONS, **_GKE_PERMISSIONS}),
        Runner.TPU_VM: MappingProxyType({**_SHARED_PERMISSIONS, **_TPU_VM_PERMISSIONS}),
    }
)


RESERVATION_READY: Final = "READY"
# Compute Engine's VM family of v6e capacity in an aggregate (TPU) reservation.
V6E_VM_FAMILY: Final = "VM_FAMILY_CLOUD_TPU_LITE_POD_SLICE_CT6E"


def runner(value: Any) -> Runner:
    """``"gke"`` / ``"tpu_vm"`` as a :class:`Runner`."""
    try:
        return Runner(value)
    except ValueError:
        raise SpecError("runner", f"must be one of {[r.value for r in Runner]}", value) from None


def service_name(value: Any) -> str:
    """A service's DNS name, as ``gcloud services enable`` takes it (``tpu.googleapis.com``)."""
    return rules.match(
        "required_services",
        value,
        rules.re.compile(r"^[a-z][a-z0-9-]*(?:\.[a-z0-9-]+)+$"),
        "services are DNS names like compute.googleapis.com",
    )


def permission_name(value: Any) -> str:
    """An IAM permission ``service.resource.verb`` (no wildcards: testIamPermissions refuses them)."""
    return rules.match(
        "required_permissions",
        value,
        rules.re.compile(r"^[a-z][a-zA-Z0-9-]*(?:\.[a-zA-Z0-9]+){2,}$"),
        "permissions look like compute.instances.create",
    )


def missing_services(required: Iterable[str], enabled: Iterable[str]) -> list[str]:
    """The required services not in ``enabled``, in the order required."""
    have = {s.strip() for s in enabled}
    return [s for s in dict.fromkeys(required) if s not in have]


def missing_permissions(required: Mapping[str, str], granted: Iterable[str]) -> list[str]:
    """The required permissions not in ``granted``, in the order required."""
    have = set(granted)
    return [p for p in required if p not in have]


def parse_enabled_services(lines: Iterable[str]) -> list[str]:
    """Service names from ``gcloud services list --format=value(config.name)`` (other lines, such
    as warnings on stderr, are skipped)."""
    out = []
    for line in lines:
        text = line.strip()
        if text and " " not in text and text.endswith(".googleapis.com"):
            out.append(text)
    return out


def parse_json_list(lines: Iterable[str]) -> list[Any] | None:
    """The JSON list a ``--format=json`` list command printed (warnings may come first)."""
    items = list(lines)
    decoder = json.JSONDecoder()
    for index, line in enumerate(items):
        if not line.lstrip().startswith("["):
            continue
        try:
            value, _ = decoder.raw_decode("\n".join(items[index:]).lstrip())
        except ValueError:
            continue
        if isinstance(value, list):
            return value
    return None


def parse_json_document(lines: Iterable[str]) -> dict[str, Any] | None:
    """The JSON object a ``--format=json`` command printed, skipping lines before it (stderr
    warnings share the stream); ``None`` when there is none."""
    items = list(lines)
    decoder = json.JSONDecoder()
    for index, line in enumerate(items):
        if not line.lstrip().startswith("{"):
            continue
        text = "\n".join(items[index:]).lstrip()
        try:
            value, _ = decoder.raw_decode(text)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def service_problem(project: str, service: str) -> str:
    return (
        f"API {service} is not enabled in project {project}: "
        f"enable it with gcloud services enable {service} --project={project}"
    )


def permission_problems(
    project: str, missing: Iterable[str], roles: Mapping[str, str], member: str | None = None
) -> list[str]:
    """One line per role to grant, naming the missing permissions it holds.

    ``member`` is the caller as an IAM member (``serviceAccount:...``) when it is known.
    """
    who = member or "CALLER"
    by_role: dict[str, list[str]] = {}
    for permission in missing:
        by_role.setdefault(roles.get(permission, ""), []).append(permission)
    lines = []
    for role, permissions in by_role.items():
        names = ", ".join(permissions)
        if role:
            lines.append(
                f"the caller lacks {names} on project {project}: grant it {role} "
                f"(gcloud projects add-iam-policy-binding {project} --member={who} --role={role} "
                "--condition=None) or a role with these permissions"
            )
        else:
            lines.append(f"the caller lacks {names} on project {project}: grant a role that holds it")
    return lines


def reservation_not_found_problem(project: str, zone: str, reservation: str) -> str:
    return (
        f"reservation {reservation} does not exist in zone {zone} of project {project}: "
        "create it there, or set zone and reservation to an existing one"
    )


@dataclass(frozen=True)
class ReservationNeed:
    """What the run takes from the reservation: ``vms`` VMs of ``machine_type``."""

    machine_type: str
    vms: int
    chips_per_vm: int
    description: str = ""

    @property
    def chips(self) -> int:
        return self.vms * self.chips_per_vm

    @classmethod
    def for_slices(cls, compute_type: str, topology: str, num_slices: int = 1) -> ReservationNeed:
        """``num_slices`` slices of ``topology`` on ``compute_type`` VMs (chips / chips per VM each)."""
        shape = SliceShape(compute_type, topology)
        slices = rules.int_range("num_slices", num_slices, 1, 64)
        return cls(
            machine_type=compute_type,
            vms=shape.vms * slices,
            chips_per_vm=shape.chips_per_vm,
            description=f"{slices} x {shape.tpu_type} ({topology}) = {shape.vms * slices} x {compute_type}",
        )


def _count(value: Any) -> int:
    """Compute API int64 fields come as JSON strings ("8"); absent means 0."""
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _short_type(url: Any) -> str:
    """``.../machineTypes/ct6e-standard-4t`` or ``ct6e-standard-4t`` → ``ct6e-standard-4t``."""
    return str(url or "").rstrip("/").rsplit("/", 1)[-1]


def _accelerators(resources: Any) -> int:
    total = 0
    for item in resources or ():
        if isinstance(item, Mapping):
            accelerator = item.get("accelerator") or {}
            if isinstance(accelerator, Mapping):
                total += _count(accelerator.get("acceleratorCount"))
    return total


def reservation_problems(need: ReservationNeed, reservation: Mapping[str, Any]) -> list[str]:
    """What keeps the run from taking ``need`` out of ``reservation`` (the JSON of
    ``gcloud compute reservations describe --format=json``: a Compute API Reservation).

    A VM reservation has ``specificReservation`` (``count``, ``inUseCount``,
    ``instanceProperties.machineType``); TPU capacity may instead come as an
    ``aggregateReservation`` (``vmFamily``, accelerator counts reserved and in use).
    """
    name = str(reservation.get("name") or "the reservation")
    problems = []
    status = str(reservation.get("status") or "")
    if status != RESERVATION_READY:
        problems.append(
            f"reservation {name} is {status or 'in an unknown state'}, not {RESERVATION_READY}: "
            "wait until it is READY or choose another reservation"
        )
    specific = reservation.get("specificReservation")
    aggregate = reservation.get("aggregateReservation")
    if isinstance(specific, Mapping):
        properties = specific.get("instanceProperties") or {}
        machine_type = _short_type(properties.get("machineType") if isinstance(properties, Mapping) else "")
        if machine_type != need.machine_type:
            problems.append(
                f"reservation {name} reserves {machine_type or 'no'} VMs, the run needs {need.machine_type} "
                f"({need.description}): use a {need.machine_type} reservation or match compute_type to it"
            )
        else:
            count = _count(specific.get("count"))
            if count < need.vms:
                problems.append(
                    f"reservation {name} reserves {count} {machine_type} VMs, the run needs {need.vms} "
                    f"({need.description}): add capacity to it, or use fewer slices"
                )
    elif isinstance(aggregate, Mapping):
        family = str(aggregate.get("vmFamily") or "")
        if family != V6E_VM_FAMILY:
            problems.append(
                f"reservation {name} reserves {family or 'no'} capacity, the run needs TPU v6e "
                f"({V6E_VM_FAMILY}): use a v6e reservation"
            )
        else:
            reserved = _accelerators(aggregate.get("reservedResources"))
            if reserved < need.chips:
                problems.append(
                    f"reservation {name} reserves {reserved} v6e chips, the run needs {need.chips} "
                    f"({need.description}): add capacity to it, or use fewer slices"
                )
    else:
        problems.append(
            f"reservation {name} reserves no VMs or TPU chips (no specificReservation or "
            f"aggregateReservation): use a reservation of {need.machine_type} VMs"
        )
    return problems


def reservation_in_use_note(need: ReservationNeed, reservation: Mapping[str, Any]) -> str | None:
    """A warning when less is free right now than the run needs, else ``None``.

    Not a problem: what is in use may be this run's own VM or node pool from an earlier try
    (a retry or a re-run re-attaches to it); if it is someone else's, the create step waits and
    retries on the capacity error.
    """
    name = str(reservation.get("name") or "the reservation")
    specific, aggregate = reservation.get("specificReservation"), reservation.get("aggregateReservation")
    if isinstance(specific, Mapping):
        reserved, in_use, needed = _count(specific.get("count")), _count(specific.get("inUseCount")), need.vms
        unit = "VMs"
    elif isinstance(aggregate, Mapping):
        reserved = _accelerators(aggregate.get("reservedResources"))
        in_use, needed = _accelerators(aggregate.get("inUseResources")), need.chips
        unit = "v6e chips"
    else:
        return None
    if reserved - in_use >= needed:
        return None
    return (
        f"reservation {name} has {reserved - in_use} free {unit} now ({reserved} reserved, {in_use} in use), "
        f"the run needs {needed}: unless that is this run's own from an earlier try, creating waits for capacity"
    )


def parse_active_account(lines: Iterable[str]) -> str | None:
    """The account ``gcloud auth list --format=value(account)`` printed, if any (the output also
    holds gcloud's ``WARNING:``/``ERROR:`` lines: with no account it prints only a warning)."""
    for line in lines:
        text = line.strip()
        if text and " " not in text and not text.startswith(("WARNING:", "ERROR:")):
            return text
    return None


def no_account_problem(runner: Runner) -> str:
    """gcloud has no active account: every gcloud command of the run (and gcluster's ``job
    submit``, cmd/job/prereq.go ``ensureGCloudAuthenticated``) would refuse."""
    who = "gcluster job submit and every gcloud command" if runner is Runner.GKE else "every gcloud command"
    return (
        f"gcloud has no active account, so {who} of the run would fail: run `gcloud auth login` "
        "(a user) or `gcloud auth activate-service-account --key-file=KEY.json` on the worker, as the "
        "user Airflow runs as (on Cloud Composer gcloud uses the environment's service account: "
        "check the environment's service account and that CLOUDSDK_CONFIG points at no other config)"
    )


def no_adc_problem(reason: str, worker_file: str | None = None) -> str:
    """No usable Application Default Credentials where gcluster runs (cmd/job/prereq.go
    ``getADCSetupCommand``: golang.org/x/oauth2 ``FindDefaultCredentials`` and a token).

    ``worker_file`` is an ADC file the worker has that gcluster does not read (gcluster runs with
    a fresh HOME, and golang/oauth2 reads ``$HOME/.config/gcloud``, never ``CLOUDSDK_CONFIG``).
    """
    if worker_file:
        fix = (
            f"gcluster runs with a fresh HOME and does not read {worker_file}: set "
            f"GOOGLE_APPLICATION_CREDENTIALS={worker_file} in the worker's environment"
        )
    else:
        fix = (
            "set GOOGLE_APPLICATION_CREDENTIALS in the worker's environment to a service-account key "
            "file (or to the file `gcloud auth application-default login` writes), or run on Google "
            "Cloud (GCE/GKE/Cloud Composer), where the metadata server provides them"
        )
    return f"gcluster job submit needs Application Default Credentials and finds none ({reason}): {fix}"


def summary_line(problems: Iterable[str]) -> str:
    """The first line of the preflight's failure: how many problems, nothing created yet."""
    count = len(list(problems))
    return f"preflight: {count} problem(s) before anything is created"


def failure_message(problems: Iterable[str]) -> str:
    """The summary line, then one line per problem."""
    items = list(problems)
    return "\n".join([summary_line(items), *(f"- {p}" for p in items)])
