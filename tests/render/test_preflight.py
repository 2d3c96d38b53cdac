"""The preflight task's reads (render/preflight.py): each command only reads."""

from __future__ import annotations

from airflow_provider_tpu_rl.render import preflight as render

PROJECT = "my-tpu-project"


def test_the_commands_only_read() -> None:
    services = render.enabled_services(PROJECT)
    assert services.argv == (
        "gcloud",
        "services",
        "list",
        "--enabled",
        f"--project={PROJECT}",
        "--format=value(config.name)",
    )
    reservation = render.describe_reservation(PROJECT, "us-east5-b", "res-1")
    assert reservation.argv == (
        "gcloud",
        "compute",
        "reservations",
        "describe",
        "res-1",
        "--zone=us-east5-b",
        f"--project={PROJECT}",
        "--format=json",
    )
    assert not services.stdin_secret
    assert not reservation.stdin_secret
