"""Stub ``terraform``/``packer``/``kubectl``/``gke-gcloud-auth-plugin`` executables for the sandbox.

The fake ``gcluster`` checks its dependencies the way Cluster Toolkit does (``terraform`` at the
pinned minimum version and ``packer`` on PATH, ``kubectl`` and ``gke-gcloud-auth-plugin`` for
``gcluster job submit``), so a sandbox ships small ``#!/bin/sh`` stand-ins in ``<root>/bin`` that
answer the version queries exactly as the real tools print them and refuse everything else.

Versions: cluster-toolkit ``pkg/dependencies/checksums_generated.go`` (``TerraformVersion``,
``PackerVersion``); the query forms: ``pkg/dependencies/resolver.go`` (``terraform version
--json``), ``cmd/job/prereq.go`` (``kubectl version --client --output=json``,
``gke-gcloud-auth-plugin --version``).
"""

from __future__ import annotations

import platform
import re
import shlex
import stat
from collections.abc import Iterable
from pathlib import Path

STUB_TOOLS = ("terraform", "packer", "kubectl", "gke-gcloud-auth-plugin")
# cluster-toolkit pkg/dependencies/checksums_generated.go: TerraformVersion, PackerVersion
STUB_TERRAFORM_VERSION = "1.12.2"
STUB_PACKER_VERSION = "1.15.0"
STUB_KUBECTL_VERSION = "1.33.5"
STUB_KUSTOMIZE_VERSION = "5.6.0"
STUB_AUTH_PLUGIN_VERSION = "1.30.0"
STUB_MARKER = "sandbox stub written by tpu_rl_sandbox.clis.tool_stubs"

_VERSION_RE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+(?:-[0-9A-Za-z.-]+)?$")


def _go_platform() -> tuple[str, str]:
    """``(GOOS, GOARCH)`` of this machine, as the real binaries report it."""
    system = platform.system().lower() or "linux"
    machine = platform.machine().lower()
    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)
    return system, arch


def _check_version(tool: str, version: str) -> str:
    if not _VERSION_RE.match(version):
        raise ValueError(f"{tool} stub version must look like 1.2.3, got {version!r}")
    return version


def _refuse(tool: str) -> str:
    return (
        "refuse() {\n"
        f"  printf '%s: %s; it answers version queries only, refusing: %s\\n' {shlex.quote(tool)} "
        f'{shlex.quote(STUB_MARKER)} "$ALL" >&2\n'
        "  exit 1\n"
        "}\n"
        'ALL="$*"\n'
    )


def _header(tool: str) -> str:
    return f"#!/bin/sh\n# {tool}: {STUB_MARKER} (the sandbox's stand-in, not the real tool).\n"


def _terraform(version: str) -> str:
    goos, goarch = _go_platform()
    # terraform version [-json]; also -version/--version/-v as the first argument (terraform main.go).
    return (
        _header("terraform")
        + f"VERSION={shlex.quote(version)}\n"
        + f"PLATFORM={shlex.quote(f'{goos}_{goarch}')}\n"
        + _refuse("terraform")
        + 'case "${1-}" in\n'
        + "  version|-version|--version|-v) ;;\n"
        + '  *) refuse "$@" ;;\n'
        + "esac\n"
        + "shift\n"
        + 'case "$#:${1-}" in\n'
        + '  0:) printf \'Terraform v%s\\non %s\\n\' "$VERSION" "$PLATFORM" ;;\n'
        + "  1:-json|1:--json)\n"
        + '    printf \'{\\n  "terraform_version": "%s",\\n  "platform": "%s",\\n'
        + '  "provider_selections": {},\\n  "terraform_outdated": false\\n}\\n\' "$VERSION" "$PLATFORM" ;;\n'
        + '  *) refuse "$@" ;;\n'
        + "esac\n"
    )


def _packer(version: str) -> str:
    # packer version | packer --version | -version | -v -> "Packer vX.Y.Z"
    return (
        _header("packer")
        + f"VERSION={shlex.quote(version)}\n"
        + _refuse("packer")
        + 'case "$#:${1-}" in\n'
        + "  1:version|1:--version|1:-version|1:-v) printf 'Packer v%s\\n' \"$VERSION\" ;;\n"
        + '  *) refuse "$@" ;;\n'
        + "esac\n"
    )


def _kubectl(version: str, kustomize: str) -> str:
    goos, goarch = _go_platform()
    major, minor, _ = version.split(".", 2)
    # kubectl version --client[=true] [-o json|--output=json]; without --client it would contact a server.
    return (
        _header("kubectl")
        + f"VERSION={shlex.quote(version)}\n"
        + f"MAJOR={shlex.quote(major)}\n"
        + f"MINOR={shlex.quote(minor)}\n"
        + f"KUSTOMIZE={shlex.quote(kustomize)}\n"
        + f"PLATFORM={shlex.quote(f'{goos}/{goarch}')}\n"
        + _refuse("kubectl")
        + '[ "${1-}" = version ] || refuse "$@"\n'
        + "shift\n"
        + "client=0\n"
        + "output=\n"
        + "while [ $# -gt 0 ]; do\n"
        + '  case "$1" in\n'
        + "    --client|--client=true) client=1 ;;\n"
        + "    -o|--output)\n"
        + '      [ $# -ge 2 ] || refuse "$@"\n'
        + '      output="$2"\n'
        + "      shift ;;\n"
        + '    -o=*|--output=*) output="${1#*=}" ;;\n'
        + '    -o?*) output="${1#-o}" ;;\n'
        + '    *) refuse "$@" ;;\n'
        + "  esac\n"
        + "  shift\n"
        + "done\n"
        + '[ "$client" = 1 ] || refuse version\n'
        + 'case "$output" in\n'
        + "  '')\n"
        + '    printf \'Client Version: v%s\\nKustomize Version: v%s\\n\' "$VERSION" "$KUSTOMIZE" ;;\n'
        + "  json)\n"
        + '    printf \'{\\n  "clientVersion": {\\n    "major": "%s",\\n    "minor": "%s",\\n'
        + '    "gitVersion": "v%s",\\n    "gitTreeState": "clean",\\n    "compiler": "gc",\\n'
        + '    "platform": "%s"\\n  },\\n  "kustomizeVersion": "v%s"\\n}\\n\' '
        + '"$MAJOR" "$MINOR" "$VERSION" "$PLATFORM" "$KUSTOMIZE" ;;\n'
        + "  yaml)\n"
        + "    printf 'clientVersion:\\n  compiler: gc\\n  gitTreeState: clean\\n  gitVersion: v%s\\n"
        + '  major: "%s"\\n  minor: "%s"\\n  platform: %s\\nkustomizeVersion: v%s\\n\' '
        + '"$VERSION" "$MAJOR" "$MINOR" "$PLATFORM" "$KUSTOMIZE" ;;\n'
        + "  *)\n"
        + "    printf 'error: --output must be '\"'\"'yaml'\"'\"' or '\"'\"'json'\"'\"'\\n' >&2\n"
        + "    exit 1 ;;\n"
        + "esac\n"
    )


def _auth_plugin(version: str) -> str:
    # gke-gcloud-auth-plugin --version -> "Kubernetes vX.Y.Z+<commit>"
    return (
        _header("gke-gcloud-auth-plugin")
        + f"VERSION={shlex.quote(version)}\n"
        + _refuse("gke-gcloud-auth-plugin")
        + 'case "$#:${1-}" in\n'
        + "  1:--version) printf 'Kubernetes v%s+sandbox\\n' \"$VERSION\" ;;\n"
        + '  *) refuse "$@" ;;\n'
        + "esac\n"
    )


def stub_script(
    tool: str,
    *,
    terraform_version: str = STUB_TERRAFORM_VERSION,
    packer_version: str = STUB_PACKER_VERSION,
) -> str:
    """The ``#!/bin/sh`` text of one stub tool."""
    if tool == "terraform":
        return _terraform(_check_version(tool, terraform_version))
    if tool == "packer":
        return _packer(_check_version(tool, packer_version))
    if tool == "kubectl":
        return _kubectl(STUB_KUBECTL_VERSION, STUB_KUSTOMIZE_VERSION)
    if tool == "gke-gcloud-auth-plugin":
        return _auth_plugin(STUB_AUTH_PLUGIN_VERSION)
    raise ValueError(f"no sandbox stub for {tool!r}; known: {', '.join(STUB_TOOLS)}")


def write_tool_stubs(
    bin_dir: Path,
    *,
    tools: Iterable[str] = STUB_TOOLS,
    terraform_version: str = STUB_TERRAFORM_VERSION,
    packer_version: str = STUB_PACKER_VERSION,
) -> list[Path]:
    """Write executable stubs for ``tools`` into ``bin_dir`` (replacing older ones); their paths."""
    texts = {
        tool: stub_script(tool, terraform_version=terraform_version, packer_version=packer_version)
        for tool in tools
    }
    bin_dir = Path(bin_dir)
    bin_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for tool, text in texts.items():
        path = bin_dir / tool
        if path.is_symlink():
            path.unlink()
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        written.append(path)
    return written
