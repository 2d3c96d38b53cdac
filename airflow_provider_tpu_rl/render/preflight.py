"""The reads of the ``preflight`` task: nothing here creates or changes anything."""

from __future__ import annotations

import os
from collections.abc import Sequence
from urllib.parse import quote

from airflow_provider_tpu_rl.maxtext.layout import run_record_object
from airflow_provider_tpu_rl.render.blueprint import BLUEPRINT_FILENAME, KUBECTL_APPLY_SOURCE, PRIMARY_GROUP
from airflow_provider_tpu_rl.render.command import ApiCall, Command

# gcloud's error for a describe of a resource that does not exist (Compute API 404).
RESERVATION_NOT_FOUND = ("was not found", "notFound")
NOT_FOUND = RESERVATION_NOT_FOUND


def enabled_services(project: str) -> Command:
    """The project's enabled APIs, one DNS name a line (``compute.googleapis.com``)."""
    return Command(
        (
            "gcloud",
            "services",
            "list",
            "--enabled",
            f"--project={project}",
            "--format=value(config.name)",
        ),
        description=f"list the APIs enabled in project {project}",
    )


def describe_reservation(project: str, zone: str, reservation: str) -> Command:
    """The reservation as the Compute API returns it (status, reserved and in-use counts)."""
    return Command(
        (
            "gcloud",
            "compute",
            "reservations",
            "describe",
            reservation,
            f"--zone={zone}",
            f"--project={project}",
            "--format=json",
        ),
        description=f"describe reservation {reservation} in {zone}",
    )


def active_account() -> Command:
    """gcloud's active credentialed account, the read Cluster Toolkit's ``job submit`` makes
    (cmd/job/prereq.go ``ensureGCloudAuthenticated``): exit 0 and an account on stdout, or nothing."""
    return Command(
        ("gcloud", "auth", "list", "--filter=status:ACTIVE", "--format=value(account)"),
        description="read gcloud's active account",
    )


# Resource Manager v3 projects.testIamPermissions (the google-cloud-resource-manager ProjectsClient
# the permission check uses: ``POST /v3/{resource=projects/*}:testIamPermissions``).
RESOURCE_MANAGER = "https://cloudresourcemanager.googleapis.com"
CLOUD_STORAGE = "https://storage.googleapis.com"


def test_permissions(project: str, permissions: Sequence[str]) -> ApiCall:
    """The caller's permissions on the project: an API call, not a command (the check asks in
    chunks of 100, the API's limit)."""
    return ApiCall(
        "POST",
        f"{RESOURCE_MANAGER}/v3/projects/{project}:testIamPermissions",
        {"permissions": list(permissions)},
        description=f"test the caller's {len(permissions)} permissions on project {project} (an API call)",
    )


def read_run_dir_claim(bucket: str, stage: str, directory: str) -> ApiCall:
    """Who writes one of the run's directories: its record's object, read through the Cloud
    Storage JSON API (objects.get with ``alt=media``), as ``train``/``export`` read it later."""
    name = quote(run_record_object(directory), safe="")
    return ApiCall(
        "GET",
        f"{CLOUD_STORAGE}/storage/v1/b/{bucket}/o/{name}?alt=media",
        description=(
            f"read who writes {directory} (the {stage} stage's directory): another run's live job "
            "there refuses this run before anything bills (an API call)"
        ),
    )


def describe_region(project: str, region: str) -> Command:
    """The region's Compute Engine quotas (``quotas[]``: metric, limit, usage)."""
    return Command(
        ("gcloud", "compute", "regions", "describe", region, f"--project={project}", "--format=json"),
        description=f"read the Compute Engine quotas of region {region}",
    )


def gcloud_version() -> Command:
    """gcloud's version and its installed components (surface/version.py: the update manager's
    ``GetCurrentVersionsInformation``, one key per installed component); no API call."""
    return Command(("gcloud", "version", "--format=json"), description="read gcloud's installed components")


def describe_network(project: str, network: str) -> Command:
    """The VPC network the TPU VM is created on (a missing one is gcloud's "was not found")."""
    return Command(
        (
            "gcloud",
            "compute",
            "networks",
            "describe",
            network,
            f"--project={project}",
            "--format=json",
        ),
        description=f"describe network {network}",
    )


def list_firewall_rules(project: str) -> Command:
    """The project's VPC firewall rules (direction, priority, sources, targets, allowed/denied)."""
    return Command(
        ("gcloud", "compute", "firewall-rules", "list", f"--project={project}", "--format=json"),
        description=f"list the firewall rules of project {project}",
    )


def describe_project_info(project: str, what: str = "metadata") -> Command:
    """The project's Compute Engine metadata (``enable-oslogin`` among its items) and its own quotas
    (``quotas[]``, all regions); ``what`` the description says is read."""
    return Command(
        ("gcloud", "compute", "project-info", "describe", f"--project={project}", "--format=json"),
        description=f"read project {project}'s Compute Engine {what}",
    )


def gcluster_dependency_check(group_dir: str) -> Command:
    """gcluster's own Terraform/Packer check, without a prompt and without side effects.

    ``export-outputs`` is one of the commands whose PersistentPreRun checks the dependencies
    (cluster-toolkit ``cmd/dependencies.go`` ``initDependencies``); ``--download-dependencies=false``
    turns the ``[y/N]`` prompt into an error naming the tool (``pkg/dependencies/resolver.go``
    ``confirmDownload``). ``group_dir`` is an empty folder whose parent holds no ``.ghpc``: a check
    that passes ends at "… must be a writable directory" (``cmd/export.go``), before any Terraform.
    """
    return Command(
        ("gcluster", "export-outputs", group_dir, "--download-dependencies=false"),
        description="gcluster's dependency check (export-outputs of an empty folder)",
    )


# The deployment the preflight expands the edited blueprint into (a temporary folder; nothing deploys).
BLUEPRINT_CHECK_DEPLOYMENT = "tpu-rl-preflight"


# Any valid CIDR: the expansion deploys nothing (the deploy passes the run's authorized_cidr).
BLUEPRINT_CHECK_CIDR = "0.0.0.0/0"


def expand_blueprint(
    folder: str, project: str, zone: str, *, num_slices: int, topology: str, reservation: str
) -> Command:
    """``gcluster create`` of the edited blueprint in ``folder`` into ``folder`` (cmd/create.go:
    ``--out``, ``-l IGNORE`` skips the validators); it writes the embedded modules the gcluster
    binary carries, so what the deploy's Terraform will read can be checked. No API call. The vars
    are the deploy's (gcluster refuses one left empty, pkg/config/validate.go ``validateVars``)."""
    pairs = [
        ("project_id", project),
        ("deployment_name", BLUEPRINT_CHECK_DEPLOYMENT),
        ("region", zone.rsplit("-", 1)[0]),
        ("zone", zone),
        ("num_slices", str(num_slices)),
        ("tpu_topology", topology),
        ("authorized_cidr", BLUEPRINT_CHECK_CIDR),
    ]
    if reservation:
        pairs.append(("reservation", reservation))
    variables = [arg for key, value in pairs for arg in ("--vars", f"{key}={value}")]
    return Command(
        (
            "gcluster",
            "create",
            os.path.join(folder, BLUEPRINT_FILENAME),
            *variables,
            "-l",
            "IGNORE",
            f"--out={folder}",
        ),
        description="expand the edited blueprint into a temporary folder (gcluster create; nothing deploys)",
    )


def kubectl_apply_folders(folder: str) -> tuple[str, str]:
    """Where :func:`expand_blueprint` leaves the kubectl-apply module: ``<deployment>/_modules/
    embedded/<source>`` from v1.91.0 (pkg/modulewriter/modulewriter.go ``copySharedEmbeddedModules``),
    ``<deployment>/<group>/modules/embedded/<source>`` before (``DeploymentSource`` at v1.90.0)."""
    deployment = os.path.join(folder, BLUEPRINT_CHECK_DEPLOYMENT)
    return (
        os.path.join(deployment, "_modules", "embedded", KUBECTL_APPLY_SOURCE),
        os.path.join(deployment, PRIMARY_GROUP, "modules", "embedded", KUBECTL_APPLY_SOURCE),
    )
