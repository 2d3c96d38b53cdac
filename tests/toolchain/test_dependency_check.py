"""Reading gcluster's own dependency check (cluster-toolkit v1.95.0 ``pkg/dependencies/resolver.go``,
``cmd/dependencies.go``): its exact output lines, and the one line preflight and doctor print."""

from __future__ import annotations

from airflow_provider_tpu_rl.render.preflight import gcluster_dependency_check
from airflow_provider_tpu_rl.toolchain.dependency_check import (
    dependency_problem_line,
    parse_dependency_check,
)
from airflow_provider_tpu_rl.toolchain.tools import ToolStatus

DISABLED = (
    "2026-06-25T10:00:00Z: Failed to setup dependencies: terraform is missing. Download is explicitly disabled. "
    "Enable download by specifying --download-dependencies flag."
)


def _line(lines: list[str], terraform: ToolStatus | None = None, configured: str = "1.12.2") -> str | None:
    return dependency_problem_line(
        parse_dependency_check(lines),
        gcluster_version="v1.200.0",
        terraform=terraform,
        configured_terraform=configured,
        default_terraform="1.12.2",
        platform="linux_amd64",
    )


def test_the_check_is_export_outputs_without_download() -> None:
    assert gcluster_dependency_check("/tmp/x/d/primary").argv == (
        "gcluster",
        "export-outputs",
        "/tmp/x/d/primary",
        "--download-dependencies=false",
    )


def test_a_passed_check_is_no_problem() -> None:
    artifacts = "2026-06-25T10:00:00Z: Error: /tmp/x/d/.ghpc/artifacts must be a writable directory"
    assert _line([artifacts]) is None
    newer = (
        "WARNING: Terraform version 1.13.0 is currently installed. We recommend using version 1.12.2 for "
        "compatibility with all features."
    )
    check = parse_dependency_check([newer, artifacts])
    assert not check.failed
    assert check.newer_warning == newer


def test_an_older_terraform_names_both_versions_and_the_extra() -> None:
    cached = ToolStatus(
        "terraform", ">= 1.12.2", "1.12.2", "/c/tools/terraform-1.12.2/linux_amd64/terraform", "cache", True
    )
    line = _line(
        ["Installed terraform version 1.12.2 is older than required version 1.14.0.", DISABLED], cached
    )
    assert line is not None
    assert line.startswith(
        "gcluster v1.200.0 requires terraform >= 1.14.0 (found terraform 1.12.2 at /c/tools/"
    )
    assert "installed by the provider as pinned by the gcluster connection extra `terraform_version`" in line
    assert "terraform_version=1.14.0 and terraform_sha256" in line
    assert "terraform_1.14.0_linux_amd64.zip in HashiCorp's terraform_1.14.0_SHA256SUMS" in line
    assert "\n" not in line
    explicit = _line(
        ["Installed terraform version 1.13.0 is older than required version 1.14.0.", DISABLED],
        cached,
        "1.13.0",
    )
    assert explicit is not None
    assert "`terraform_version` (1.13.0)" in explicit


def test_an_unreadable_terraform_names_the_version_wanted() -> None:
    warning = (
        "Warning: Could not determine installed terraform version: exit status 3. Proceeding to download "
        "recommended version 1.14.0."
    )
    line = _line([warning, DISABLED])
    assert line is not None
    assert (
        "requires terraform >= 1.14.0 (cannot read the version of the terraform it finds (exit status 3)"
        in line
    )


def test_a_missing_packer_or_another_refusal_is_named() -> None:
    packer = DISABLED.replace("terraform is missing", "packer is missing")
    line = _line([packer])
    assert line is not None
    assert line.startswith("gcluster v1.200.0 finds no packer on the PATH the deploy runs with")
    other = _line(
        [
            "Failed to setup dependencies: failed to determine user cache dir: neither $XDG_CACHE_HOME nor $HOME are defined"
        ]
    )
    assert other == (
        "gcluster v1.200.0 refuses its dependencies: failed to determine user cache dir: neither $XDG_CACHE_HOME "
        "nor $HOME are defined"
    )
