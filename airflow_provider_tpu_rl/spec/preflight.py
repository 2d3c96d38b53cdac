"""What a run needs before it creates anything: APIs, the caller's permissions, reservation room.

Pure Python (no Airflow): the ``preflight`` operator gathers the facts (``gcloud services list``,
Resource Manager ``testIamPermissions``, ``gcloud compute reservations describe``) and these
functions turn them into problems, one line each, naming what to enable, grant or create.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from airflow_provider_tpu_rl.spec import rules
from airflow_provider_tpu_rl.spec.cluster import FLEX_START, SPOT, SliceShape
from airflow_provider_tpu_rl.spec.errors import SpecError
from airflow_provider_tpu_rl.spec.existing_cluster import EXISTING_CLUSTER_PERMISSIONS
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
# GKE image streaming (a run whose image_repository is named): "You must enable the Container File
# System API" (docs.cloud.google.com/kubernetes-engine/docs/how-to/image-streaming, "Requirements";
# states). Artifact Registry, which holds the copy, is among GKE_SERVICES already.
STREAMING_SERVICES: Final = ("containerfilesystem.googleapis.com",)
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
    # preflight's read of the region's quotas
    "compute.regions.get": "roles/compute.admin",
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
    # preflight's read of the region's quotas
    "compute.regions.get": "roles/compute.instanceAdmin.v1",
    # the baked boot image (render/boot_image.py): its family looked up, the bake VM stopped and
    # its disk imaged (images.insert reads the disk), the TPU VM booted from the family.
    "compute.images.get": "roles/compute.instanceAdmin.v1",
    "compute.images.getFromFamily": "roles/compute.instanceAdmin.v1",
    "compute.images.create": "roles/compute.instanceAdmin.v1",
    "compute.instances.stop": "roles/compute.instanceAdmin.v1",
    "compute.disks.useReadOnly": "roles/compute.instanceAdmin.v1",
    "compute.globalOperations.get": "roles/compute.instanceAdmin.v1",
    # preflight's reads of the VM's network and its firewall rules.
    "compute.networks.get": "roles/compute.networkViewer",
    "compute.firewalls.list": "roles/compute.networkViewer",
    # gcloud compute ssh: reads the project and adds its key to the project's metadata.
    "compute.projects.get": "roles/compute.instanceAdmin.v1",
    "compute.projects.setCommonInstanceMetadata": "roles/compute.instanceAdmin.v1",
    # the VM runs as a service account.
    "iam.serviceAccounts.actAs": "roles/iam.serviceAccountUser",
    # the VM's object access on the bucket.
    "storage.buckets.getIamPolicy": "roles/storage.admin",
    "storage.buckets.setIamPolicy": "roles/storage.admin",
}
# The image's copy for streaming (render/image_stream.py): the repository created when missing, the
# source read and the copy pushed (Artifact Registry's predefined roles: admin creates
# repositories, writer uploads, reader downloads; cloud.google.com/artifact-registry/docs/access-control).
STREAMING_PERMISSIONS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "artifactregistry.repositories.create": "roles/artifactregistry.admin",
        "artifactregistry.repositories.uploadArtifacts": "roles/artifactregistry.writer",
        "artifactregistry.repositories.downloadArtifacts": "roles/artifactregistry.reader",
    }
)
REQUIRED_PERMISSIONS: Final[Mapping[Runner, Mapping[str, str]]] = MappingProxyType(
    {
        Runner.GKE: MappingProxyType({**_SHARED_PERMISSIONS, **_GKE_PERMISSIONS}),
        Runner.TPU_VM: MappingProxyType({**_SHARED_PERMISSIONS, **_TPU_VM_PERMISSIONS}),
    }
)
# A GKE run on a cluster it does not own: the bucket and token's, and the cluster's reads and its
# own node pools' (spec/existing_cluster.py), never a cluster's create or delete.
EXISTING_CLUSTER_RUN_PERMISSIONS: Final[Mapping[str, str]] = MappingProxyType(
    {**_SHARED_PERMISSIONS, **EXISTING_CLUSTER_PERMISSIONS}
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


def enabled_secret_versions(lines: Iterable[str]) -> list[int]:
    """The ENABLED version numbers ``gcloud secrets versions list --format=json`` printed, ascending."""
    return sorted(
        int(str(item["name"]).rsplit("/", 1)[-1])
        for item in parse_json_list(lines) or []
        if isinstance(item, dict)
        and item.get("state") == "ENABLED"
        and str(item.get("name", "")).rsplit("/", 1)[-1].isdigit()
    )


# Regional Compute Engine quotas the run takes (``gcloud compute regions describe``: ``quotas[]``
# with ``metric``, ``limit``, ``usage``), by metric name, and where each name comes from:
# - PREEMPTIBLE_TPU_V6E: Spot and flex-start TPU v6e chips. Google's TPU Builders Program guide
#   (2026-07-14; a second-hand copy): "compute.googleapis.com/preemptible_tpu_v6e" ("Metric:
#   PREEMPTIBLE_TPU_V6E"), v6e on "the standard Google Cloud Engine (GCE) quota backend"; flex-start
#   VMs "consume preemptible quota" (the flex-start VMs GA blog, direct). GKE TPU node pools take
#   Compute Engine quota too (kubernetes-engine/docs/how-to/tpus, direct). A reservation's capacity
#   needs none; on-demand v6e quota's metric name has no source we could read: not checked.
# - N4_CPUS: the vCPUs of cpu-np's n4-standard-64 nodes (cluster-toolkit gke-cluster main.tf l.580 at
#   c765092), which the conversion needs before any TPU exists. The name is Compute Engine's own in
#   its quota error ("Quota 'N4_CPUS' exceeded"), seen in public code, no Google page read: indirect.
PREEMPTIBLE_TPU_V6E_QUOTA: Final = "PREEMPTIBLE_TPU_V6E"
N4_CPUS_QUOTA: Final = "N4_CPUS"
CPU_NP_VCPUS: Final = 64  # one n4-standard-64 node: a conversion's pod needs the pool to scale to one
# - N2_CPUS and the other series' vCPU quotas: the TPU VM pipeline's CPU VMs, which run at once
#   before the TPU VM exists: the bake VM (n2-standard-8, when the run bakes its boot image) beside
#   the conversion's CPU VM (n2-highmem-32). CPUS_ALL_REGIONS: the project's vCPUs in every region
#   (``gcloud compute project-info describe``: ``quotas[]``, compute v1 Project.quotas, the same
#   fields). The names are gcloud
#   528's (compute_v1_messages.py, Quota.MetricValueValuesEnum: CPUS, CPUS_ALL_REGIONS, N2_CPUS,
#   N2D_CPUS, C2_CPUS, C2D_CPUS, C3_CPUS, T2D_CPUS; direct); which series takes which metric is read
#   from the names (N1 has no metric of its own and takes CPUS; inferred). A machine type of another
#   series, or not named <series>-<standard|highmem|highcpu>-<vCPUs>, is a note, not a refusal. The
#   TPU VM's own vCPUs are not counted: no source says whether a ct6e VM takes CPU quota.
CPUS_ALL_REGIONS_QUOTA: Final = "CPUS_ALL_REGIONS"
SERIES_CPU_QUOTAS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "n1": "CPUS",
        "n2": "N2_CPUS",
        "n2d": "N2D_CPUS",
        "c2": "C2_CPUS",
        "c2d": "C2D_CPUS",
        "c3": "C3_CPUS",
        "t2d": "T2D_CPUS",
        "n4": N4_CPUS_QUOTA,
    }
)
_PREDEFINED_MACHINE_TYPE: Final = re.compile(r"^([a-z][a-z0-9]*)-(?:standard|highmem|highcpu)-([1-9][0-9]*)$")


def machine_vcpus(machine_type: str) -> tuple[str, int] | None:
    """``(vCPU quota metric, vCPUs)`` of a predefined machine type of a known series, else None."""
    match = _PREDEFINED_MACHINE_TYPE.fullmatch(machine_type)
    if match is None or match[1] not in SERIES_CPU_QUOTAS:
        return None
    return SERIES_CPU_QUOTAS[match[1]], int(match[2])


def cpu_vm_quota_needs(machine_types: Sequence[str]) -> tuple[dict[str, int], int, list[str]]:
    """What CPU VMs running at once take: ``(regional metric -> vCPUs, vCPUs in all, notes)``;
    a note per machine type whose quota is not known (not counted)."""
    regional: dict[str, int] = {}
    total = 0
    notes: list[str] = []
    for machine_type in machine_types:
        known = machine_vcpus(machine_type)
        if known is None:
            notes.append(f"the vCPU quota of machine type {machine_type} is not known: not checked")
            continue
        metric, vcpus = known
        regional[metric] = regional.get(metric, 0) + vcpus
        total += vcpus
    return regional, total, notes


def quota_needs(
    runner: Runner, capacity: str, chips: int, cpu_machine_types: Sequence[str] = ()
) -> dict[str, int]:
    """metric -> how much of it the run takes in its region (:data:`PREEMPTIBLE_TPU_V6E_QUOTA`,
    :data:`N4_CPUS_QUOTA`, and the series' vCPU quotas of ``cpu_machine_types``, the CPU VMs that
    run at once)."""
    needs: dict[str, int] = {}
    if capacity in (SPOT, FLEX_START):
        needs[PREEMPTIBLE_TPU_V6E_QUOTA] = chips
    if runner is Runner.GKE:
        needs[N4_CPUS_QUOTA] = CPU_NP_VCPUS
    for metric, vcpus in cpu_vm_quota_needs(cpu_machine_types)[0].items():
        needs[metric] = needs.get(metric, 0) + vcpus
    return needs


def quota_problems(
    project: str,
    region: str | None,
    needs: Mapping[str, int],
    document: Mapping[str, Any],
    what: Mapping[str, str] | None = None,
) -> tuple[list[str], list[str]]:
    """``(problems, notes)``: one problem line per quota with less free (limit - usage) than the run
    needs; a note per quota the document does not list (a name we could not confirm at its source
    is not reason enough to refuse). ``region`` None: the project's own quotas (all regions);
    ``what``: metric -> what takes it, said in the line."""
    listed = {str(q.get("metric")): q for q in document.get("quotas") or [] if isinstance(q, Mapping)}
    where = f"region {region} of project {project}" if region else f"project {project} (all regions)"
    elsewhere = "choose another region" if region else "delete VMs the project no longer needs"
    problems: list[str] = []
    notes: list[str] = []
    for metric, need in needs.items():
        quota = listed.get(metric)
        if quota is None:
            notes.append(f"{where} lists no {metric} quota: not checked")
            continue
        free = float(quota.get("limit") or 0) - float(quota.get("usage") or 0)
        if free < need:
            taker = f" ({what[metric]})" if what and metric in what else ""
            problems.append(
                f"quota {metric} in {where} has {free:g} free "
                f"(limit {float(quota.get('limit') or 0):g}, in use {float(quota.get('usage') or 0):g}); "
                f"the run needs {need}{taker}: request more (IAM & Admin > Quotas) or {elsewhere}"
            )
    return problems, notes


def cpu_vms_taking(machine_types: Sequence[str]) -> dict[str, str]:
    """metric -> the CPU VMs that take it, in words (``2 CPU VMs at once: n2-standard-8 + n2-highmem-32``),
    for :func:`quota_problems`' lines; :data:`CPUS_ALL_REGIONS_QUOTA` takes them all."""
    by_metric: dict[str, list[str]] = {}
    for machine_type in machine_types:
        known = machine_vcpus(machine_type)
        if known is not None:
            by_metric.setdefault(known[0], []).append(machine_type)
            by_metric.setdefault(CPUS_ALL_REGIONS_QUOTA, []).append(machine_type)

    def words(types: list[str]) -> str:
        return (
            f"{len(types)} CPU VMs at once: {' + '.join(types)}"
            if len(types) > 1
            else f"its CPU VM {types[0]}"
        )

    return {metric: words(types) for metric, types in by_metric.items()}


# Zones where the sources we could read say v6e flex-start is offered, by API (each read
# 2026-12-05): Compute Engine TPU VMs (the TPU Builders Program guide, 2026-07-14, a program's
# capacity) and GKE's flex-start page. Lists change: a zone outside them is a note, not a refusal.
FLEX_START_V6E_ZONES: Final[Mapping[Runner, frozenset[str]]] = MappingProxyType(
    {
        Runner.TPU_VM: frozenset(
            {"us-east5-a", "us-east5-b", "us-central1-a", "europe-west4-a", "southamerica-west1-a"}
        ),
        Runner.GKE: frozenset({"asia-northeast1-b", "us-east5-a", "us-east5-b"}),
    }
)


def flex_start_zone_note(runner: Runner, zone: str) -> str | None:
    """A note when ``zone`` is not one the sources list for v6e flex-start."""
    zones = FLEX_START_V6E_ZONES[runner]
    if zone in zones:
        return None
    return (
        f"flex-start v6e in zone {zone}: not among the zones the docs list ({', '.join(sorted(zones))}); "
        "the request may wait for capacity until it fails"
    )


# GKE runs TPU v6e from 1.31.2-gke.1115000 (GKE's TPU page, as Ray's GKE TPU guide quotes it:
# second-hand); the blueprint's version_prefix must not choose an older minor.
GKE_V6E_MINIMUM_MINOR: Final = (1, 31)


def gke_version_problem(version_prefix: object) -> str | None:
    """One line when the blueprint's ``version_prefix`` picks a GKE minor older than v6e's."""
    match = re.fullmatch(r"(\d+)\.(\d+)\.?", str(version_prefix or "").strip())
    if match is None:
        return None
    if (int(match.group(1)), int(match.group(2))) < GKE_V6E_MINIMUM_MINOR:
        return (
            f"the blueprint's version_prefix {version_prefix!r} picks a GKE older than 1.31.2-gke.1115000, "
            'the first to run TPU v6e: set it to "1.31." or newer'
        )
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
    project: str,
    missing: Iterable[str],
    roles: Mapping[str, str],
    member: str | None = None,
    reasons: Mapping[str, str] | None = None,
) -> list[str]:
    """One line per role to grant, naming the missing permissions it holds.

    ``member`` is the caller as an IAM member (``serviceAccount:...``) when it is known;
    ``reasons`` says why a role is needed (role -> text), for the roles that need saying.
    """
    who = member or "CALLER"
    by_role: dict[str, list[str]] = {}
    for permission in missing:
        by_role.setdefault(roles.get(permission, ""), []).append(permission)
    lines = []
    for role, permissions in by_role.items():
        names = ", ".join(permissions)
        why = f" ({reasons[role]})" if reasons and role in reasons else ""
        if role:
            lines.append(
                f"the caller lacks {names} on project {project}{why}: grant it {role} "
                f"(gcloud projects add-iam-policy-binding {project} --member={who} --role={role} "
                "--condition=None) or a role with these permissions"
            )
        else:
            lines.append(f"the caller lacks {names} on project {project}{why}: grant a role that holds it")
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


def parse_gcloud_components(lines: Iterable[str]) -> set[str] | None:
    """The components ``gcloud version --format=json`` lists (its keys but the SDK's own version),
    or None when the output holds no such JSON object (gcloud's stderr lines may surround it)."""
    lines = list(lines)
    starts = [i for i, line in enumerate(lines) if line.startswith("{")]
    ends = [i for i, line in enumerate(lines) if line.startswith("}")]
    if not starts or not ends or ends[-1] < starts[0]:
        return None
    try:
        data = json.loads("\n".join(lines[starts[0] : ends[-1] + 1]))
    except ValueError:
        return None
    if not isinstance(data, dict) or "Google Cloud SDK" not in data:
        return None
    return {str(key) for key in data if key != "Google Cloud SDK"}


def missing_component_problem(component: str, capacity: str) -> str:
    """One line: the run's gcloud command needs ``component``, which this gcloud lacks."""
    return (
        f"{capacity} capacity on a TPU VM runs `gcloud {component} compute instances create` (gcloud "
        f"offers FLEX_START on its {component} track only) and this gcloud has no {component} component: "
        f"install it where gcloud is installed (`gcloud components install {component}` as the SDK's "
        "owner; Debian's and Ubuntu's google-cloud-cli package ships it; the provider's toolchain image has "
        "it), or choose another capacity"
    )


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
    """The first line of the preflight's failure: how many problems, nothing created yet. It ends
    in ``:``, so a one-line summary of the failure (the watcher's) takes the first problem too."""
    count = len(list(problems))
    return f"preflight: {count} problem{'' if count == 1 else 's'} before anything is created:"


def one_line(text: str) -> str:
    """``text`` on one line: its lines joined by a space, blank ones dropped."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def failure_message(problems: Iterable[str]) -> str:
    """The summary line, then each problem on one line of its own (``- `` first)."""
    items = [one_line(p) for p in problems]
    return "\n".join([summary_line(items), *(f"- {p}" for p in items)])


# ---------------------------------------------------------------------------- the TPU VM's network
# ``gcloud compute instances create`` without ``--network`` puts the VM's one interface on the
# project's ``default`` network with an external IP (render/tpu_vm.py create_vm passes neither
# ``--network`` nor ``--no-address``), and ``gcloud compute ssh`` reaches that external IP on port 22.
VM_NETWORK: Final = "default"
SSH_PORT: Final = 22
# Where IAP's TCP forwarding connects from (``gcloud compute ssh --tunnel-through-iap``).
IAP_SOURCE_RANGE: Final = "35.235.240.0/20"
ANYWHERE: Final = "0.0.0.0/0"
# ``enable-oslogin`` in the project's metadata: googlecloudsdk/command_lib/util/ssh/ssh.py
# (OSLOGIN_ENABLE_METADATA_KEY, MetadataHasEnable: the first item with that key, ``.lower() == 'true'``).
OS_LOGIN_KEY: Final = "enable-oslogin"
# Under OS Login, sudo on the VM needs the admin login permission (roles/compute.osAdminLogin);
# roles/compute.osLogin logs in without sudo, and the stage scripts run sudo apt-get.
OS_ADMIN_LOGIN: Final = "compute.instances.osAdminLogin"
OS_ADMIN_LOGIN_ROLE: Final = "roles/compute.osAdminLogin"


def _last_segment(url: Any) -> str:
    return str(url or "").rstrip("/").rsplit("/", 1)[-1]


def _covers_port(ports: Any, port: int) -> bool:
    """A Compute API ``allowed``/``denied`` entry's ``ports`` (``["22"]``, ``["0-65535"]``; none =
    every port) holds ``port``."""
    if not ports:
        return True
    for item in ports:
        low, _, high = str(item).partition("-")
        try:
            if int(low) <= port <= int(high or low):
                return True
        except ValueError:
            continue
    return False


def _matches_tcp_port(entries: Any, port: int) -> bool:
    for entry in entries or ():
        if (
            isinstance(entry, Mapping)
            and str(entry.get("IPProtocol", "")).lower() in ("tcp", "all", "6")
            and _covers_port(entry.get("ports"), port)
        ):
            return True
    return False


def _networks(ranges: Iterable[str]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    out = []
    for text in ranges:
        try:
            out.append(ipaddress.ip_network(str(text).strip(), strict=False))
        except ValueError:
            continue
    return out


def _source_covered(rule_ranges: list[Any], source: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    return any(
        source.version == have.version and source.subnet_of(have)  # type: ignore[arg-type]
        for have in rule_ranges
    )


SSH_SOURCE_RANGES_RULE = (
    "must be a list of CIDR ranges like 203.0.113.0/24, or one string of them separated by commas "
    "(as gcloud's --source-ranges)"
)


def ssh_source_ranges(values: Any) -> tuple[str, ...]:
    """The CIDR ranges the provider's SSH sessions come from (``ssh_source_ranges``), validated.

    A list (or tuple) of strings, or one string (a rendered template) of ranges separated by
    commas; empty (``None``, ``""``, ``[]``) is none. A number, a mapping or a non-string item is
    refused in one line, never iterated character by character or digit by digit.
    """
    if values is None or values == "":
        return ()
    if isinstance(values, str):
        items: list[Any] = values.split(",")
    elif isinstance(values, list | tuple):
        items = list(values)
    else:
        raise SpecError("ssh_source_ranges", SSH_SOURCE_RANGES_RULE, values)
    out = []
    for value in items:
        if not isinstance(value, str):
            raise SpecError("ssh_source_ranges", f"{SSH_SOURCE_RANGES_RULE}; an item is not a string", value)
        try:
            out.append(str(ipaddress.ip_network(value.strip(), strict=False)))
        except ValueError:
            raise SpecError("ssh_source_ranges", "must be CIDR ranges like 203.0.113.0/24", value) from None
    return tuple(out)


def _applies_to_the_vm(rule: Mapping[str, Any], network: str) -> bool:
    """An enabled ingress rule of ``network`` that targets every instance: the VM is created with
    no network tags, and a rule for named service accounts is not counted (it may not be the VM's)."""
    return (
        _last_segment(rule.get("network")) == network
        and str(rule.get("direction") or "INGRESS") == "INGRESS"
        and not rule.get("disabled")
        and not rule.get("targetTags")
        and not rule.get("targetServiceAccounts")
    )


def _rule_sources(rule: Mapping[str, Any]) -> list[Any]:
    """The source ranges an ingress rule matches; with no source at all, the API's 0.0.0.0/0
    (firewalls_utils.AddCommonArgs: "If neither --source-ranges nor --source-tags are specified,
    --source-ranges defaults to 0.0.0.0/0"). Tags and service accounts match no external address."""
    ranges = rule.get("sourceRanges")
    if not ranges and not rule.get("sourceTags") and not rule.get("sourceServiceAccounts"):
        ranges = [ANYWHERE]
    return _networks(ranges or ())


def _reaches_from_outside(ranges: list[Any]) -> bool:
    """Some range holds a public address other than IAP's: the VM's external IP is reached from
    the internet (a private range such as default-allow-internal's 10.128.0.0/9 is not)."""
    iap = ipaddress.ip_network(IAP_SOURCE_RANGE)
    return any(
        not net.is_private and not (net.version == iap.version and net.subnet_of(iap))  # type: ignore[arg-type]
        for net in ranges
    )


def _priority(rule: Mapping[str, Any]) -> int:
    return _count(rule.get("priority") if rule.get("priority") is not None else 1000)


def ssh_allowing_rule(
    rules: Iterable[Mapping[str, Any]], network: str, sources: Iterable[str] = ()
) -> str | None:
    """The name of a firewall rule that lets SSH (tcp:22) from every range in ``sources`` reach a
    VM on ``network`` (when ``sources`` is empty: from some public address, IAP's range and private
    ranges not counted, since the provider connects to the external IP); ``None`` when none does.

    ``rules`` is ``gcloud compute firewall-rules list --format=json`` (Compute API Firewall
    resources). An allow rule counts only when no deny rule for tcp:22 from the same sources has
    the same or a higher priority (a lower number; at equal priority deny wins).
    """
    candidates = [r for r in rules if isinstance(r, Mapping) and _applies_to_the_vm(r, network)]
    wanted = _networks(sources)
    denies = [
        (_priority(r), _rule_sources(r)) for r in candidates if _matches_tcp_port(r.get("denied"), SSH_PORT)
    ]
    allows = sorted((r for r in candidates if _matches_tcp_port(r.get("allowed"), SSH_PORT)), key=_priority)
    for rule in allows:
        have = _rule_sources(rule)
        if not have or (not wanted and not _reaches_from_outside(have)):
            continue
        if wanted and not all(_source_covered(have, source) for source in wanted):
            continue
        checked = wanted or have
        if any(
            priority <= _priority(rule) and all(_source_covered(denied, s) for s in checked)  # type: ignore[arg-type]
            for priority, denied in denies
        ):
            continue
        return str(rule.get("name") or "")
    return None


def network_not_found_problem(project: str, network: str) -> str:
    return (
        f"network {network} does not exist in project {project}: the TPU VM is created on it "
        f"(gcloud compute instances create without --network); create it with gcloud compute networks "
        f"create {network} --project={project} --subnet-mode=auto, and a firewall rule for SSH"
    )


def ssh_firewall_problem(
    project: str, network: str, sources: Iterable[str] = (), *, iap: bool = False
) -> str:
    """No ingress rule lets SSH reach the VM: ``gcloud compute ssh`` would time out on port 22."""
    ranges = ",".join(sources) or (IAP_SOURCE_RANGE if iap else ANYWHERE)
    origin = "IAP's range" if iap else ("the provider's address" if sources else "anywhere")
    return (
        f"no firewall rule on network {network} of project {project} allows SSH (tcp:{SSH_PORT}) "
        f"from {origin} ({ranges}): every SSH stage would time out; create one with gcloud compute "
        f"firewall-rules create tpu-rl-allow-ssh --project={project} --network={network} "
        f"--direction=INGRESS --allow=tcp:{SSH_PORT} --source-ranges={ranges}"
    )


def os_login_enabled(project_info: Mapping[str, Any]) -> bool:
    """Whether the project's metadata (``gcloud compute project-info describe --format=json``)
    enforces OS Login: ``commonInstanceMetadata.items`` holds ``enable-oslogin`` = true (any case),
    its first such item deciding, as ssh.py MetadataHasEnable reads it."""
    metadata = project_info.get("commonInstanceMetadata") or {}
    items = metadata.get("items") if isinstance(metadata, Mapping) else None
    for item in items or ():
        if isinstance(item, Mapping) and item.get("key") == OS_LOGIN_KEY:
            return str(item.get("value") or "").lower() == "true"
    return False


def os_login_reason(project: str) -> str:
    """Why the caller needs compute.instances.osAdminLogin, for its permission line."""
    return (
        f"OS Login is enforced in project {project} ({OS_LOGIN_KEY}=TRUE in its metadata): "
        "gcloud compute ssh logs in through OS Login and the stages' sudo needs admin login"
    )


# What gcloud 528 prints after its ``ERROR: (gcloud.…)`` line, when the reason is not on it:
# - ``Could not fetch resource:`` then `` - <reason>`` lines (api_lib/compute/client_adapter.py
#   MakeRequests, base_classes.py; utils.RaiseToolException);
# - ``---`` then a YAML list of the operation's errors, for a stockout or a quota
#   (api_lib/compute/operations/poller.py OperationErrors: utils.ShouldUseYaml on the codes
#   ZONE_RESOURCE_POOL_EXHAUSTED[_WITH_DETAILS] and QUOTA_EXCEEDED, then utils.ConstructList), whose
#   ``code:`` and ``message:`` say what was refused.
_YAML_REASON = re.compile(r"^(code|message):\s*(?P<value>\S.*)$")


def gcloud_reason(lines: Sequence[str], index: int) -> list[str]:
    """The lines after gcloud's ``ERROR:`` line ``lines[index]`` that hold its reason: the first
    `` - `` bullet (``Could not fetch resource:``), or the ``code:`` and ``message:`` of a YAML
    error list (``---``); none when the ERROR line says it all."""
    head = lines[index].strip()
    after = list(lines[index + 1 :])
    if head.endswith("---"):
        # each error is a YAML document (resource_printer's yaml format): its own keys start a line,
        # a long value goes on in lines indented by two; keys nested in errorDetails are indented
        reason: dict[str, str] = {}
        for number, line in enumerate(after):
            match = _YAML_REASON.match(line)
            if match is None or match[1] in reason:
                continue
            value = [match["value"].strip()]
            for more in after[number + 1 :]:
                if not more.startswith("  ") or more.lstrip().startswith("- "):
                    break
                value.append(more.strip())
            reason[match[1]] = " ".join(value)
        return [f"{key}: {reason[key]}" for key in ("code", "message") if key in reason]
    bullets = [line.strip() for line in after if line.strip().startswith("- ")]
    return bullets[:1]


def error_line(message: str) -> str:
    """The line of a failed command's message that says what went wrong: gcloud's ``ERROR:`` line
    with its reason (:func:`gcloud_reason`), else the last line."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    for index, line in enumerate(lines):
        if line.startswith("ERROR:"):
            return " ".join([line, *gcloud_reason(lines, index)])
    return lines[-1] if lines else "no output"
