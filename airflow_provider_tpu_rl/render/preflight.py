"""The ``gcloud`` reads of the ``preflight`` task: nothing here creates or changes anything."""

from __future__ import annotations

from airflow_provider_tpu_rl.render.command import Command

# gcloud's error for a describe of a resource that does not exist (Compute API 404).
RESERVATION_NOT_FOUND = ("was not found", "notFound")


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
