"""The fake ``gcluster`` is as strict as Cluster Toolkit about its tools and staged files.

Each rule is read from cluster-toolkit's source (the pinned v1.103.0 was not fetchable; read at
the newest ``develop`` of mid-2026): ``gcluster.go``/``pkg/dependencies/resolver.go`` (PATH patch,
terraform version, packer, the ``[y/N]`` prompt), ``cmd/dependencies.go`` (which commands check),
``cmd/job/prereq.go`` (``job submit`` prerequisites), ``pkg/config/staging.go`` and
``pkg/modulewriter/modulewriter.go`` (``ghpc_stage``). The fake runs as a real process through
its shim, with PATH built by :func:`tests.support.toolpath.path_without`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.sandbox.conftest import Cli, Result, deploy_args, submit_args
from tests.support.toolpath import path_without
from tpu_rl_sandbox.clis.gcluster import dependencies
from tpu_rl_sandbox.clis.tool_stubs import (
    STUB_MARKER,
    STUB_PACKER_VERSION,
    STUB_TERRAFORM_VERSION,
    STUB_TOOLS,
    write_tool_stubs,
)
from tpu_rl_sandbox.world.settings import reset_settings, update_settings

REQUIRED_TERRAFORM = "1.12.2"  # pkg/dependencies/checksums_generated.go TerraformVersion
REQUIRED_PACKER = "1.15.0"  # pkg/dependencies/checksums_generated.go PackerVersion
STAGED_SOURCE = "./kueue-configuration.yaml.tftpl"


def _path(cli: Cli, tmp_path: Path, *hidden: str, first: Path | None = None) -> str:
    path = path_without(hidden, tmp_path / "path", cli.env["PATH"]) if hidden else cli.env["PATH"]
    return f"{first}{os.pathsep}{path}" if first is not None else path


def _gcluster(cli: Cli, path: str, *argv: str, stdin: bytes = b"", cwd: Path | None = None) -> Result:
    """The fake through its shim, as a process; ``stdin`` is all it can read (then EOF)."""
    completed = subprocess.run(
        [str(cli.info.gcluster), *argv],
        input=stdin,
        capture_output=True,
        env={**cli.env, **cli.extra, "PATH": path},
        cwd=cwd or cli.cwd,
        check=False,
        timeout=180,
    )
    return Result(completed.returncode, completed.stdout.decode(), completed.stderr.decode())


def _example(cli: Cli, *, whole: bool = True) -> Path:
    """A copy of the bundle's example folder (or of its blueprint alone) in the test's folder."""
    source = cli.info.blueprint.parent
    target = cli.cwd / ("example" if whole else "alone")
    if whole:
        shutil.copytree(source, target)
    else:
        target.mkdir()
        shutil.copy(cli.info.blueprint, target)
    return target / cli.info.blueprint.name


def _staged_name(src: str) -> str:
    # pkg/config/staging.go makeGhpcStageImpl: <base>_<md5(src)[:10]>
    return f"{os.path.basename(src)}_{hashlib.md5(src.encode(), usedforsecurity=False).hexdigest()[:10]}"


def _prompt(tool: str, version: str) -> str:
    return f"{tool} v{version} is missing. Do you want to download it? [y/N]: "


# ================================================================================ the stubs
def test_stubs_answer_version_queries_like_the_real_tools(tmp_path: Path) -> None:
    written = write_tool_stubs(tmp_path)
    assert sorted(p.name for p in written) == sorted(STUB_TOOLS)
    assert STUB_TERRAFORM_VERSION == REQUIRED_TERRAFORM == dependencies.TERRAFORM_VERSION
    assert STUB_PACKER_VERSION == REQUIRED_PACKER == dependencies.PACKER_VERSION

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(tmp_path / argv[0]), *argv[1:]], capture_output=True, text=True, check=False, timeout=30
        )

    form: tuple[str, ...]
    for form in (("version", "-json"), ("version", "--json"), ("-version", "-json")):
        data = json.loads(run("terraform", *form).stdout)
        assert data["terraform_version"] == REQUIRED_TERRAFORM
    for form in (("version",), ("-version",), ("--version",), ("-v",)):
        assert run("terraform", *form).stdout.startswith(f"Terraform v{REQUIRED_TERRAFORM}\non ")
    for form in (("version",), ("--version",)):
        assert run("packer", *form).stdout == f"Packer v{REQUIRED_PACKER}\n"
    for form in (("--output=json",), ("-o", "json"), ("-ojson",), ("-o=json",)):
        for client in ("--client", "--client=true"):
            data = json.loads(run("kubectl", "version", client, *form).stdout)
            assert data["clientVersion"]["gitVersion"].startswith("v1.")
    assert run("kubectl", "version", "--client").stdout.startswith("Client Version: v1.")
    assert run("gke-gcloud-auth-plugin", "--version").stdout.startswith("Kubernetes v1.")
    for argv in (
        ("terraform", "apply"),
        ("terraform", "init"),
        ("packer", "build", "."),
        ("kubectl", "apply", "-f", "x.yaml"),
        ("kubectl", "version"),  # without --client the real one contacts a server
        ("gke-gcloud-auth-plugin",),
    ):
        done = run(*argv)
        assert done.returncode == 1, argv
        assert STUB_MARKER in done.stderr
        assert "refusing" in done.stderr


def test_stub_versions_are_shell_quoted(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must look like"):
        write_tool_stubs(tmp_path, tools=["terraform"], terraform_version="1.0; rm -rf /")
    (path,) = write_tool_stubs(tmp_path, tools=["terraform"], terraform_version="1.11.4")
    done = subprocess.run(
        [str(path), "version", "-json"], capture_output=True, text=True, timeout=30, check=True
    )
    assert json.loads(done.stdout)["terraform_version"] == "1.11.4"


@pytest.mark.parametrize("tool", ["kubectl", "gke-gcloud-auth-plugin", "terraform", "git"])
def test_path_without_hides_each_host_tool(tool: str, tmp_path: Path) -> None:
    path = path_without([tool], tmp_path)
    assert shutil.which(tool, path=path) is None
    for kept in ("sh", "python3", "gcloud"):
        if shutil.which(kept):
            assert shutil.which(kept, path=path) is not None, kept


# ========================================================================= terraform, packer
@pytest.mark.parametrize("command", ["deploy", "destroy"])
def test_missing_terraform_prompts_and_closed_stdin_refuses(
    command: str, cli: Cli, names: dict[str, str], tmp_path: Path
) -> None:
    blueprint = _example(cli)
    target = str(blueprint) if command == "deploy" else str(cli.cwd)
    extra = deploy_args(names, backend=False) if command == "deploy" else ["--auto-approve"]
    result = _gcluster(cli, _path(cli, tmp_path, "terraform"), command, target, *extra)
    assert result.code == 1
    assert _prompt("terraform", REQUIRED_TERRAFORM) in result.out
    assert result.err.rstrip().endswith("Failed to setup dependencies: user declined to download terraform")
    assert not (cli.cwd / names["cluster"]).exists()  # refused before anything was written


@pytest.mark.parametrize("answer", [b"n\n", b"no\n", b"maybe\n", b"\n"])
def test_any_answer_but_yes_declines(answer: bytes, cli: Cli, names: dict[str, str], tmp_path: Path) -> None:
    result = _gcluster(
        cli,
        _path(cli, tmp_path, "terraform"),
        "deploy",
        str(_example(cli)),
        *deploy_args(names, backend=False),
        stdin=answer,
    )
    assert result.code == 1
    assert "user declined to download terraform" in result.err


def test_create_does_not_check_dependencies(cli: Cli, names: dict[str, str], tmp_path: Path) -> None:
    # cmd/dependencies.go: only deploy, destroy and export-outputs resolve terraform and packer.
    path = _path(cli, tmp_path, "terraform", "packer")
    result = _gcluster(cli, path, "create", str(_example(cli)), *deploy_args(names, backend=False)[:-2])
    assert result.code == 0, result.text
    assert "is missing" not in result.out
    assert (cli.cwd / names["cluster"] / "primary" / "main.tf").is_file()


def test_old_terraform_is_refused(cli: Cli, names: dict[str, str], tmp_path: Path) -> None:
    old = tmp_path / "old"
    write_tool_stubs(old, tools=["terraform"], terraform_version="1.11.4")
    path = _path(cli, tmp_path, "terraform", first=old)
    result = _gcluster(cli, path, "deploy", str(_example(cli)), *deploy_args(names, backend=False))
    assert result.code == 1
    assert (
        f"Installed terraform version 1.11.4 is older than required version {REQUIRED_TERRAFORM}.\n"
        in result.out
    )
    assert _prompt("terraform", REQUIRED_TERRAFORM) in result.out
    assert "Failed to setup dependencies: user declined to download terraform" in result.err


def test_host_terraform_is_asked_for_its_version(cli: Cli, names: dict[str, str], tmp_path: Path) -> None:
    """The real ``terraform`` of this machine (1.11.4) through ``terraform version --json``."""
    host = shutil.which("terraform", path=os.environ["PATH"])
    if host is None:
        pytest.skip("no terraform on this machine's PATH")
    done = subprocess.run([host, "version", "-json"], capture_output=True, text=True, timeout=60, check=False)
    version = json.loads(done.stdout)["terraform_version"]
    if dependencies.go_version_compare(version, REQUIRED_TERRAFORM) >= 0:
        pytest.skip(f"this machine's terraform {version} is new enough")
    only = tmp_path / "host"
    only.mkdir()
    (only / "terraform").symlink_to(host)
    path = _path(cli, tmp_path, "terraform", first=only)
    result = _gcluster(cli, path, "deploy", str(_example(cli)), *deploy_args(names, backend=False))
    assert result.code == 1
    assert f"Installed terraform version {version} is older than required version" in result.out


def test_newer_terraform_warns_and_proceeds(cli: Cli, names: dict[str, str], tmp_path: Path) -> None:
    newer = tmp_path / "newer"
    write_tool_stubs(newer, tools=["terraform"], terraform_version="1.13.0")
    path = _path(cli, tmp_path, "terraform", first=newer)
    result = _gcluster(cli, path, "deploy", str(_example(cli)), *deploy_args(names, backend=False))
    assert result.code == 0, result.text
    assert (
        f"WARNING: Terraform version 1.13.0 is currently installed. We recommend using version {REQUIRED_TERRAFORM} "
        "for compatibility with all features." in result.out
    )


def test_broken_terraform_is_treated_as_missing(cli: Cli, names: dict[str, str], tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    script = broken / "terraform"
    script.write_text("#!/bin/sh\nexit 3\n")
    script.chmod(0o755)
    path = _path(cli, tmp_path, "terraform", first=broken)
    result = _gcluster(cli, path, "deploy", str(_example(cli)), *deploy_args(names, backend=False))
    assert result.code == 1
    assert (
        "Warning: Could not determine installed terraform version: exit status 3. Proceeding to download "
        f"recommended version {REQUIRED_TERRAFORM}." in result.out
    )


def test_missing_packer_prompts_and_refuses(cli: Cli, names: dict[str, str], tmp_path: Path) -> None:
    result = _gcluster(
        cli, _path(cli, tmp_path, "packer"), "deploy", str(_example(cli)), *deploy_args(names, backend=False)
    )
    assert result.code == 1
    assert _prompt("packer", REQUIRED_PACKER) in result.out
    assert "terraform" not in result.out
    assert "Failed to setup dependencies: user declined to download packer" in result.err


def test_download_dependencies_false_refuses_without_asking(
    cli: Cli, names: dict[str, str], tmp_path: Path
) -> None:
    result = _gcluster(
        cli,
        _path(cli, tmp_path, "terraform"),
        "deploy",
        str(_example(cli)),
        *deploy_args(names, backend=False),
        "--download-dependencies=false",
        stdin=b"y\n",
    )
    assert result.code == 1
    assert "[y/N]" not in result.out
    assert (
        "Failed to setup dependencies: terraform is missing. Download is explicitly disabled. Enable download by "
        "specifying --download-dependencies flag." in result.err
    )


def test_download_dependencies_installs_into_the_user_cache(
    cli: Cli, names: dict[str, str], tmp_path: Path
) -> None:
    path = _path(cli, tmp_path, "terraform", "packer")
    result = _gcluster(
        cli,
        path,
        "--download-dependencies",
        "deploy",
        str(_example(cli)),
        *deploy_args(names, backend=False),
    )
    assert result.code == 0, result.text
    assert "[y/N]" not in result.out
    assert f"Downloading terraform v{REQUIRED_TERRAFORM}...\n" in result.out
    assert f"Downloading packer v{REQUIRED_PACKER}...\n" in result.out
    cache = Path(cli.env["HOME"]) / ".cache" / "cluster-toolkit"
    terraform = cache / f"terraform-{REQUIRED_TERRAFORM}" / "terraform"
    assert (cache / f"packer-{REQUIRED_PACKER}" / "packer").is_file()
    done = subprocess.run(
        [str(terraform), "version", "-json"], capture_output=True, text=True, timeout=30, check=True
    )
    assert json.loads(done.stdout)["terraform_version"] == REQUIRED_TERRAFORM
    # gcluster.go PatchPath puts the cache first on PATH: the next call finds both there.
    again = _gcluster(cli, path, "deploy", names["cluster"], "--auto-approve")
    assert again.code == 0, again.text
    assert "missing" not in again.out
    assert "Downloading" not in again.out


def test_yes_on_stdin_downloads(cli: Cli, names: dict[str, str], tmp_path: Path) -> None:
    result = _gcluster(
        cli,
        _path(cli, tmp_path, "terraform"),
        "deploy",
        str(_example(cli)),
        *deploy_args(names, backend=False),
        stdin=b"y",  # ReadString's partial line at EOF still counts
    )
    assert result.code == 0, result.text
    assert (
        _prompt("terraform", REQUIRED_TERRAFORM) + f"Downloading terraform v{REQUIRED_TERRAFORM}..."
        in result.out
    )


def test_first_terraform_init_needs_git(cli: Cli, names: dict[str, str], tmp_path: Path) -> None:
    """The blueprint's registry modules are git::https sources: ``terraform init`` runs git."""
    result = _gcluster(
        cli, _path(cli, tmp_path, "git"), "deploy", str(_example(cli)), *deploy_args(names, backend=False)
    )
    assert result.code == 1
    assert "Error: Failed to download module" in result.err
    assert "git must be available and on the PATH" in result.err
    assert "Hint: initialization of deployment group" in result.err
    assert names["cluster"] not in json.dumps(cli.state("clusters"))


# ===================================================================================== jobs
def _docker_config(cli: Cli, region: str) -> None:
    folder = Path(cli.env["HOME"]) / ".docker"
    folder.mkdir(parents=True, exist_ok=True)
    helpers = {"gcr.io": "gcloud", f"{region}-docker.pkg.dev": "gcloud"}
    (folder / "config.json").write_text(json.dumps({"credHelpers": helpers}))


def _job_flags(names: dict[str, str]) -> list[str]:
    return ["--project", names["project"], "--location", names["region"], "--cluster", names["cluster"]]


@pytest.mark.parametrize("tool", ["kubectl", "gke-gcloud-auth-plugin"])
def test_job_submit_lists_a_missing_k8s_tool(
    tool: str, cli: Cli, names: dict[str, str], tmp_path: Path
) -> None:
    _docker_config(cli, names["region"])
    argv = submit_args("j1", "echo hi")
    result = _gcluster(cli, _path(cli, tmp_path, tool), *argv[:2], *_job_flags(names), *argv[2:])
    assert result.code == 1
    assert "Some required prerequisites are missing." in result.out
    assert f"\n - {tool}\n" in result.out
    other = {"kubectl", "gke-gcloud-auth-plugin"} - {tool}
    assert f" - {other.pop()}\n" not in result.out
    assert "Docker Credentials" not in result.out
    assert "Error: job could not be submitted because some prerequisites are missing." in result.err
    assert not (Path(cli.env["HOME"]) / ".gcluster" / "job_prereq_state.json").exists()


def test_job_submit_dry_run_skips_the_prerequisites(cli: Cli, names: dict[str, str], tmp_path: Path) -> None:
    argv = submit_args("j1", "echo hi", "--dry-run-out", str(tmp_path / "manifest.yaml"))
    result = _gcluster(cli, _path(cli, tmp_path, "kubectl"), *argv[:2], *_job_flags(names), *argv[2:])
    assert "prerequisites are missing" not in result.text


def test_job_submit_needs_the_artifact_registry_api(cli: Cli, names: dict[str, str]) -> None:
    _docker_config(cli, names["region"])
    argv = submit_args("j1", "echo hi")
    update_settings(cli.layout, disabled_services=("artifactregistry.googleapis.com",))
    try:
        result = _gcluster(cli, cli.env["PATH"], *argv[:2], *_job_flags(names), *argv[2:])
    finally:
        reset_settings(cli.layout)
    assert result.code == 1
    assert " - Artifact Registry API\n" in result.out
    assert (
        f"Command: gcloud services enable artifactregistry.googleapis.com --project {names['project']} --quiet"
        in result.out
    )


def test_job_commands_reach_the_cluster_through_the_auth_plugin(
    cli: Cli, names: dict[str, str], tmp_path: Path
) -> None:
    deployed = cli.gcluster("deploy", str(cli.info.blueprint), *deploy_args(names, backend=False))
    assert deployed.code == 0, deployed.text
    path = _path(cli, tmp_path, "gke-gcloud-auth-plugin")
    listed = _gcluster(cli, path, "job", "list", *_job_flags(names))
    assert listed.code == 1
    assert 'Error: failed to list jobsets across all namespaces: Get "https://' in listed.err
    assert "getting credentials: exec: executable gke-gcloud-auth-plugin not found" in listed.err
    cancelled = _gcluster(cli, path, "job", "cancel", "j1", *_job_flags(names))
    assert cancelled.code == 1
    assert "Error: failed to search for jobset j1 across namespaces:" in cancelled.err
    logs = _gcluster(cli, path, "job", "logs", "j1", *_job_flags(names))
    assert logs.code == 1
    assert "getting credentials: exec: executable gke-gcloud-auth-plugin not found" in logs.err
    # with every tool there, the same commands work
    assert _gcluster(cli, cli.env["PATH"], "job", "list", *_job_flags(names)).code == 0


# ================================================================================== staging
def test_missing_staged_file_fails_create_with_the_real_message(cli: Cli, names: dict[str, str]) -> None:
    blueprint = _example(cli, whole=False)
    args = deploy_args(names, backend=False)[:-2]
    result = _gcluster(cli, cli.env["PATH"], "create", str(blueprint), *args)
    assert result.code == 1
    missing = blueprint.parent / "kueue-configuration.yaml.tftpl"
    assert f"Error: file for staging {missing} does not exists" in result.err
    # relative to the blueprint as given on the command line
    relative = _gcluster(
        cli, cli.env["PATH"], "create", blueprint.name, *args, "-o", "rel", cwd=blueprint.parent
    )
    assert relative.code == 1
    assert "Error: file for staging kueue-configuration.yaml.tftpl does not exists" in relative.err
    # modulewriter had prepared the folder: without an expanded blueprint, a re-run needs --force
    again = _gcluster(cli, cli.env["PATH"], "create", str(blueprint), *args, "-w")
    assert again.code == 1
    assert "expanded blueprint file" in again.err
    assert "is missing" in again.err


def test_missing_staged_file_fails_deploy(cli: Cli, names: dict[str, str]) -> None:
    blueprint = _example(cli, whole=False)
    result = _gcluster(cli, cli.env["PATH"], "deploy", str(blueprint), *deploy_args(names, backend=False))
    assert result.code == 1
    assert (
        f"Error: file for staging {blueprint.parent / 'kueue-configuration.yaml.tftpl'} does not exists"
        in (result.err)
    )


def test_staged_file_is_copied_into_the_deployment_folder(cli: Cli, names: dict[str, str]) -> None:
    blueprint = _example(cli)
    result = _gcluster(cli, cli.env["PATH"], "deploy", str(blueprint), *deploy_args(names, backend=False))
    assert result.code == 0, result.text
    depl = cli.cwd / names["cluster"]
    staged = depl / ".ghpc" / "staged" / _staged_name(STAGED_SOURCE)
    source = blueprint.parent / "kueue-configuration.yaml.tftpl"
    assert staged.read_bytes() == source.read_bytes()
    assert f'"../.ghpc/staged/{_staged_name(STAGED_SOURCE)}"' in (depl / "primary" / "main.tf").read_text()
    expanded = yaml.safe_load((depl / ".ghpc" / "artifacts" / "expanded_blueprint.yaml").read_text())
    assert expanded["vars"]["kueue_configuration_path"] == f'$(ghpc_stage("{STAGED_SOURCE}"))'
    # the source gone, a re-create uses the previous staged copy (with a warning)
    source.unlink()
    again = _gcluster(
        cli, cli.env["PATH"], "create", str(blueprint), *deploy_args(names, backend=False)[:-2], "-w"
    )
    assert again.code == 0, again.text
    assert f"WARNING: file {source} does not exists, proceeding by using previously staged copy" in again.err
    assert staged.is_file()


# ====================================================== a newer release, gcluster's own check
# A hypothetical release newer than the pinned one whose checksums_generated.go pins a newer
# Terraform: the sandbox's gcluster plays it through the settings' gcluster_release.
NEWER_RELEASE = {"version": "v1.200.0", "terraform": "1.14.0"}


def test_a_newer_release_wants_its_own_terraform_and_a_closed_stdin_declines(
    cli: Cli, names: dict[str, str]
) -> None:
    update_settings(cli.layout, gcluster_release=NEWER_RELEASE)
    try:
        version = _gcluster(cli, cli.env["PATH"], "--version")
        result = _gcluster(
            cli, cli.env["PATH"], "deploy", str(_example(cli)), *deploy_args(names, backend=False)
        )
    finally:
        reset_settings(cli.layout)
    assert version.out.startswith("gcluster version v1.200.0\n")
    assert result.code == 1
    # the sandbox's terraform is the pinned 1.12.2: enough for v1.103.0, too old for this release
    assert "Installed terraform version 1.12.2 is older than required version 1.14.0.\n" in result.out
    assert _prompt("terraform", "1.14.0") in result.out
    assert result.err.rstrip().endswith("Failed to setup dependencies: user declined to download terraform")
    assert not (cli.cwd / names["cluster"]).exists()
    assert names["cluster"] not in json.dumps(cli.state("clusters"))


def test_export_outputs_of_an_empty_folder_checks_the_dependencies_and_stops(
    cli: Cli, tmp_path: Path
) -> None:
    """cmd/export.go: checkDir, then initDependencies, then the artifacts folder: nothing runs."""
    root = tmp_path / "probe"
    group = root / "deployment" / "primary"
    group.mkdir(parents=True)
    passed = _gcluster(cli, cli.env["PATH"], "export-outputs", str(group), "--download-dependencies=false")
    assert passed.code == 1
    assert "Failed to setup dependencies" not in passed.text
    assert f"Error: {root / 'deployment' / '.ghpc' / 'artifacts'} must be a writable directory" in passed.err
    assert sorted(p.name for p in root.rglob("*")) == ["deployment", "primary"]
    not_a_dir = _gcluster(cli, cli.env["PATH"], "export-outputs", str(root / "nope"))
    assert not_a_dir.code == 1
    assert f'Error: "{root / "nope"}" must be a directory' in not_a_dir.err
    update_settings(cli.layout, gcluster_release=NEWER_RELEASE)
    try:
        refused = _gcluster(
            cli, cli.env["PATH"], "export-outputs", str(group), "--download-dependencies=false", stdin=b"y\n"
        )
    finally:
        reset_settings(cli.layout)
    assert refused.code == 1
    assert "[y/N]" not in refused.out
    assert "Installed terraform version 1.12.2 is older than required version 1.14.0.\n" in refused.out
    assert (
        "Failed to setup dependencies: terraform is missing. Download is explicitly disabled. Enable download by "
        "specifying --download-dependencies flag." in refused.err
    )
    assert "writable directory" not in refused.err
