"""gcluster's own dependency check, run ahead of time and read as one line.

``gcluster deploy``/``destroy``/``export-outputs`` check Terraform and Packer themselves before
anything else (cluster-toolkit ``cmd/dependencies.go`` ``initDependencies``, ``pkg/dependencies/
resolver.go`` ``EnsureDependencies``): ``terraform version --json`` on PATH at least the version
compiled into that release (``checksums_generated.go`` ``TerraformVersion``), ``packer`` on PATH.
Anything short of that goes to ``downloadFlow``, which asks ``[y/N]`` on stdin; with stdin closed
(as this provider runs every command) that is "user declined to download terraform", in the middle
of a deploy. A gcluster release newer than the connection's ``terraform_version`` pin can want a
newer Terraform than the provider installed.

:func:`~airflow_provider_tpu_rl.render.preflight.gcluster_dependency_check` is the cheapest command that runs the same check without a side
effect: ``gcluster export-outputs <empty folder> --download-dependencies=false``. Its argument
passes ``checkDir`` (``cmd/utils.go``, run before the check), the explicit ``false`` makes a
missing or old tool an error naming it instead of a prompt (``confirmDownload``), and when the
check passes the export stops at once: the folder's ``../.ghpc/artifacts`` does not exist
(``cmd/export.go`` ``runExportCmd``: ``shell.CheckWritableDir``), before any Terraform runs.
:func:`parse_dependency_check` reads its output; :func:`dependency_problem_line` says what to do.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from airflow_provider_tpu_rl.toolchain.tools import ToolStatus

# cmd/dependencies.go initDependencies: logging.Fatal("Failed to setup dependencies: %v", err)
FAILED_PREFIX = "Failed to setup dependencies: "
# pkg/dependencies/resolver.go ensureBinary / confirmDownload (v1.95.0; the same at develop 2026-06)
_OLDER_RE = re.compile(r"Installed terraform version (\S+) is older than required version (\S+?)\.?$")
_UNREADABLE_RE = re.compile(
    r"Warning: Could not (?:determine|parse) installed terraform version(?: \"[^\"]*\")?: (.*)\. "
    r"Proceeding to download recommended version (\S+?)\.?$"
)
_NEWER_RE = re.compile(
    r"WARNING: Terraform version (\S+) is currently installed\. We recommend using version (\S+) "
)
_DISABLED_RE = re.compile(r"(\S+) is missing\. Download is explicitly disabled\.")
_DECLINED_RE = re.compile(r"user declined to download (\S+)")


@dataclass(frozen=True)
class DependencyCheck:
    """What gcluster's dependency check said.

    ``failed``: it refused (``Failed to setup dependencies: …``, whose text is ``error``);
    ``tool``: the tool it refused; ``required``/``installed``: the Terraform versions it wanted and
    found (when it said them); ``newer_warning``: it accepted a newer Terraform than its own.
    """

    failed: bool
    error: str = ""
    tool: str | None = None
    required: str | None = None
    installed: str | None = None
    unreadable: str | None = None
    newer_warning: str | None = None


def parse_dependency_check(lines: Sequence[str]) -> DependencyCheck:
    """Read the output of the check (stdout and stderr lines, in order)."""
    required = installed = unreadable = newer = tool = None
    error = ""
    for raw in lines:
        line = raw.strip()
        if match := _OLDER_RE.search(line):
            installed, required = match.group(1), match.group(2)
        elif match := _UNREADABLE_RE.search(line):
            unreadable, required = match.group(1), match.group(2)
        elif match := _NEWER_RE.search(line):
            newer = line[match.start() :]
        if FAILED_PREFIX in line:
            error = line[line.index(FAILED_PREFIX) + len(FAILED_PREFIX) :]
            match = _DISABLED_RE.search(error) or _DECLINED_RE.search(error)
            tool = match.group(1) if match else None
    if not error:
        return DependencyCheck(False, newer_warning=newer)
    if tool != "terraform":
        required = installed = unreadable = None
    return DependencyCheck(True, error, tool, required, installed, unreadable, newer)


def _where(terraform: ToolStatus | None, configured: str, default: str) -> str:
    """Where the deploy's terraform comes from, and which connection extra decides it."""
    pin = (
        f"the gcluster connection extra `terraform_version` ({configured})"
        if configured != default
        else f"the gcluster connection extra `terraform_version` (unset: the provider's default {default})"
    )
    if terraform is None or not terraform.path:
        return f"pinned by {pin}"
    if terraform.source in ("cache", "downloaded"):
        return f"at {terraform.path}, installed by the provider as pinned by {pin}"
    return f"at {terraform.path} on PATH, which satisfies {pin}"


def dependency_problem_line(
    check: DependencyCheck,
    *,
    gcluster_version: str | None,
    terraform: ToolStatus | None,
    configured_terraform: str,
    default_terraform: str,
    platform: str,
) -> str | None:
    """One line saying what gcluster's check refused and what to set; ``None`` when it passed."""
    if not check.failed:
        return None
    who = f"gcluster {gcluster_version}" if gcluster_version else "gcluster"
    if check.tool == "terraform" and check.required:
        wanted = check.required
        if check.installed:
            found = f"found terraform {check.installed} {_where(terraform, configured_terraform, default_terraform)}"
        else:
            found = (
                f"cannot read the version of the terraform it finds ({check.unreadable}); "
                f"{_where(terraform, configured_terraform, default_terraform)}"
            )
        return (
            f"{who} requires terraform >= {wanted} ({found}) and would stop the deploy asking to download it: "
            f"set the gcluster connection extras terraform_version={wanted} and terraform_sha256 (the SHA-256 "
            f"of terraform_{wanted}_{platform}.zip in HashiCorp's terraform_{wanted}_SHA256SUMS), or put "
            f"terraform >= {wanted} first on the worker's PATH"
        )
    if check.tool:
        return (
            f"{who} finds no {check.tool} on the PATH the deploy runs with and would stop the deploy asking to "
            f"download it ({check.error}); run `tpu-rl doctor` for the toolchain"
        )
    return f"{who} refuses its dependencies: {check.error}"


__all__ = [
    "FAILED_PREFIX",
    "DependencyCheck",
    "dependency_problem_line",
    "parse_dependency_check",
]
