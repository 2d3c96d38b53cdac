"""``tpu-rl doctor`` as a real process: the table on stdout, exit 0 with every tool, 1 (and one
line naming it) with any one tool hidden from PATH, without a gcloud account or without ADC.

The real gcloud signs in as the sandbox's service account (``auth activate-service-account``
fetches a token from the key's ``token_uri``, the sandbox's API server), and that key is the ADC."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.toolpath import path_without
from tpu_rl_sandbox.clis.tool_stubs import STUB_TOOLS, write_tool_stubs
from tpu_rl_sandbox.commands.lifecycle import SandboxInfo
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.settings import reset_settings, update_settings

TPU_RL = Path(sys.executable).with_name("tpu-rl")
PURPOSE_TOOLS = {
    "deploy": ("gcluster", "terraform", "packer", "git", "gcloud"),
    "jobs": ("gcluster", "gcloud", "kubectl", "gke-gcloud-auth-plugin"),
    "tpu_vm": ("gcloud",),
}


@pytest.fixture
def gcluster(tmp_path: Path) -> Path:
    """A stand-in gcluster binary answering ``--version`` like the release (cmd/root.go template)."""
    path = tmp_path / "gcluster-bin" / "gcluster"
    path.parent.mkdir()
    path.write_text(
        "#!/bin/sh\n"
        '[ "$1" = --version ] || exit 1\n'
        "echo 'gcluster version v1.103.0'\n"
        "echo \"Built from 'main' branch.\"\n"
    )
    path.chmod(0o755)
    return path


@pytest.fixture(scope="module")
def signed_in(sandbox: SandboxInfo, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A gcloud config whose active account is the sandbox's service account, and that key as ADC."""
    key = sandbox.env["GOOGLE_APPLICATION_CREDENTIALS"]
    config = tmp_path_factory.mktemp("gcloud-config")
    done = subprocess.run(
        [str(shutil.which("gcloud")), "auth", "activate-service-account", f"--key-file={key}"],
        env={**os.environ, "CLOUDSDK_CONFIG": str(config)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return {"CLOUDSDK_CONFIG": str(config), "GOOGLE_APPLICATION_CREDENTIALS": key}


@pytest.fixture(autouse=True)
def credentials(signed_in: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Every test runs signed in, unless it takes the credentials away."""
    for name, value in signed_in.items():
        monkeypatch.setenv(name, value)
    return signed_in


def doctor(
    tmp_path: Path, path: str, *args: str, extra: dict[str, object] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_CONN_")}
    env["PATH"] = path
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    if extra is not None:
        env["AIRFLOW_CONN_GCLUSTER_DEFAULT"] = json.dumps({"conn_type": "gcluster", "extra": extra})
    return subprocess.run(
        [str(TPU_RL), "doctor", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def stubbed_path(tmp_path: Path, hidden: tuple[str, ...] = ()) -> str:
    stubs = tmp_path / "stubs"
    write_tool_stubs(stubs, tools=[t for t in STUB_TOOLS if t not in hidden])
    # The host has a real (old) terraform, kubectl and the auth plugin: hide those behind the stubs.
    rest = path_without([*STUB_TOOLS, *hidden], tmp_path / "hidden")
    return f"{stubs}{os.pathsep}{rest}"


def test_doctor_with_every_tool_prints_the_table_and_exits_0(tmp_path: Path, gcluster: Path) -> None:
    result = doctor(tmp_path, stubbed_path(tmp_path), "--no-install", extra={"gcluster_path": str(gcluster)})
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["TOOL", "NEEDED", "FOR", "WANTED", "FOUND", "FROM", "STATUS"]
    rows = {line.split()[0]: line for line in lines[1:] if line and not line.startswith(tuple(PURPOSE_TOOLS))}
    assert set(rows) == {
        "gcluster",
        "terraform",
        "packer",
        "git",
        "gcloud",
        "kubectl",
        "gke-gcloud-auth-plugin",
    }
    assert all(row.endswith("OK") for row in rows.values())
    assert "1.12.2" in rows["terraform"]
    assert f"PATH ({tmp_path / 'stubs' / 'terraform'})" in rows["terraform"]
    assert "1.15.0" in rows["packer"]
    assert f"connection ({gcluster})" in rows["gcluster"]
    assert "1.103.0" in rows["gcluster"]
    assert lines[-3:] == ["deploy: OK", "jobs: OK", "tpu_vm: OK"]


def test_doctor_keeps_stdout_clean_without_a_connection(tmp_path: Path) -> None:
    """No gcluster_default connection: Airflow's log line goes to stderr, never into the table."""
    result = doctor(tmp_path, stubbed_path(tmp_path), "--for", "tpu_vm")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[0].startswith("TOOL ")
    assert "connection" not in result.stdout
    assert result.stdout.splitlines()[-1] == "tpu_vm: OK"


@pytest.mark.parametrize(
    "tool", ["terraform", "packer", "git", "kubectl", "gke-gcloud-auth-plugin", "gcloud"]
)
def test_doctor_names_a_hidden_tool_in_one_line_and_exits_1(
    tmp_path: Path,
    gcluster: Path,
    tool: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """In this process (``tpu-rl doctor``'s own process, its stdout and exit code, is the test above):
    the command's ``main`` with the tool hidden from PATH."""
    from airflow_provider_tpu_rl import cli

    monkeypatch.setattr(cli, "_logs_to_stderr", lambda: None)  # keeps pytest's log capture
    monkeypatch.setenv("PATH", stubbed_path(tmp_path, (tool,)))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv(
        "AIRFLOW_CONN_GCLUSTER_DEFAULT",
        json.dumps({"conn_type": "gcluster", "extra": {"gcluster_path": str(gcluster)}}),
    )
    code = cli.main(["doctor", "--no-install"])
    result = subprocess.CompletedProcess(["tpu-rl", "doctor"], code, *capsys.readouterr())
    assert result.returncode == 1, result.stdout + result.stderr
    verdicts = result.stdout.splitlines()[-3:]
    for purpose, line in zip(PURPOSE_TOOLS, verdicts, strict=True):
        if tool in PURPOSE_TOOLS[purpose]:
            assert line.startswith(f"{purpose} needs {tool} "), line
            assert "not on PATH" in line
        else:
            assert line == f"{purpose}: OK"
    row = next(line for line in result.stdout.splitlines() if line.startswith(f"{tool} "))
    assert "missing" in row


def test_doctor_for_one_purpose_and_a_missing_gcluster(tmp_path: Path) -> None:
    result = doctor(
        tmp_path,
        stubbed_path(tmp_path),
        "--for",
        "jobs",
        "--no-install",
        extra={"gcluster_path": str(tmp_path / "no-such-gcluster")},
    )
    assert result.returncode == 1
    last = result.stdout.splitlines()[-1]
    assert last.startswith("jobs needs gcluster (gcluster_path")
    assert "is not an executable file" in last
    assert "terraform" not in result.stdout  # only the jobs toolchain was checked


def test_doctor_unknown_connection_is_an_error_on_stderr(tmp_path: Path) -> None:
    result = doctor(tmp_path, stubbed_path(tmp_path), "--gcluster-conn-id", "nope")
    assert result.returncode == 1
    assert result.stdout == ""
    assert "gcluster connection 'nope' is not defined" in result.stderr


def test_doctor_names_the_terraform_a_newer_gcluster_would_ask_for(
    tmp_path: Path,
    sandbox: SandboxInfo,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every tool found, but the sandbox's gcluster plays a (hypothetical) newer release that
    requires Terraform 1.14.0: its own check would stop the deploy at a [y/N] prompt on a closed
    stdin; doctor runs that check without a prompt and fails the deploy purpose in one line."""
    from airflow_provider_tpu_rl import cli

    monkeypatch.setattr(cli, "_logs_to_stderr", lambda: None)
    monkeypatch.setenv("PATH", stubbed_path(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    extra = {"gcluster_path": str(sandbox.gcluster)}  # the shim names its sandbox itself
    layout = SandboxLayout(sandbox.root)
    monkeypatch.setenv("AIRFLOW_CONN_GCLUSTER_DEFAULT", json.dumps({"conn_type": "gcluster", "extra": extra}))
    update_settings(layout, gcluster_release={"version": "v1.200.0", "terraform": "1.14.0"})
    try:
        code = cli.main(["doctor", "--no-install"])
    finally:
        reset_settings(layout)
    out = capsys.readouterr().out
    assert code == 1, out
    deploy, jobs, tpu_vm = out.splitlines()[-3:]
    assert deploy.startswith(
        "deploy: gcluster v1.200.0 requires terraform >= 1.14.0 (found terraform 1.12.2 at "
    )
    assert "terraform_version=1.14.0 and terraform_sha256" in deploy
    assert (jobs, tpu_vm) == ("jobs: OK", "tpu_vm: OK")


def test_doctor_without_a_gcloud_account_names_it_for_every_purpose(
    tmp_path: Path, gcluster: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh gcloud config (the real gcloud lists no account): every purpose's gcloud commands
    would refuse; one line each, exit 1."""
    fresh = tmp_path / "fresh-gcloud-config"
    fresh.mkdir()
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(fresh))
    result = doctor(tmp_path, stubbed_path(tmp_path), "--no-install", extra={"gcluster_path": str(gcluster)})
    assert result.returncode == 1, result.stdout + result.stderr
    verdicts = result.stdout.splitlines()[-3:]
    assert [line.split(":", 1)[0] for line in verdicts] == ["deploy", "jobs", "tpu_vm"]
    for line in verdicts:
        assert ": gcloud has no active account, so " in line, line
        assert "gcloud auth login" in line


def test_doctor_without_adc_names_it_for_the_jobs(
    tmp_path: Path, gcluster: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Signed in, but no ADC where gcluster runs (off Google Cloud: no metadata server answers):
    ``gcluster job submit`` would refuse (cluster-toolkit cmd/job/prereq.go); one line for jobs."""
    from airflow_provider_tpu_rl import cli

    monkeypatch.setattr(cli, "_logs_to_stderr", lambda: None)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    monkeypatch.setattr("airflow_provider_tpu_rl.toolchain.adc.METADATA_HOST", "127.0.0.1:9")
    monkeypatch.setenv("PATH", stubbed_path(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv(
        "AIRFLOW_CONN_GCLUSTER_DEFAULT",
        json.dumps({"conn_type": "gcluster", "extra": {"gcluster_path": str(gcluster)}}),
    )
    code = cli.main(["doctor", "--no-install"])
    out = capsys.readouterr().out
    assert code == 1, out
    deploy, jobs, tpu_vm = out.splitlines()[-3:]
    assert (deploy, tpu_vm) == ("deploy: OK", "tpu_vm: OK")
    assert jobs.startswith(
        "jobs: gcluster job submit needs Application Default Credentials and finds none"
    ), jobs


def test_doctor_with_a_project_checks_what_the_tpu_vms_ssh_needs_there(
    tmp_path: Path,
    sandbox: SandboxInfo,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--project``: the sandbox's project has the default network and its SSH rule (OK); without
    the rule, one line naming the rule to create; a missing network is one line too; an enforced
    OS Login is a note on stderr (preflight tests the permission)."""
    from airflow_provider_tpu_rl import cli
    from tpu_rl_sandbox.world.vpc import delete_network

    monkeypatch.setattr(cli, "_logs_to_stderr", lambda: None)
    for name, value in sandbox.env.items():
        monkeypatch.setenv(name, value)  # the sandbox's gcloud first on PATH
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    project = "tpu-rl-doctor-vm"

    def doctor_vm() -> tuple[int, str, str]:
        code = cli.main(["doctor", "--for", "tpu_vm", "--no-install", "--project", project])
        out, err = capsys.readouterr()
        return code, out.splitlines()[-1], err

    def gcloud(*argv: str) -> None:
        done = subprocess.run(
            ["gcloud", *argv, f"--project={project}"],
            env=sandbox.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr

    assert doctor_vm()[:2] == (0, "tpu_vm: OK")

    gcloud("compute", "project-info", "add-metadata", "--metadata=enable-oslogin=TRUE")
    code, verdict, err = doctor_vm()
    assert (code, verdict) == (0, "tpu_vm: OK")
    assert f"OS Login is enforced in project {project}" in err
    assert "compute.instances.osAdminLogin (roles/compute.osAdminLogin)" in err

    gcloud("compute", "firewall-rules", "delete", "default-allow-ssh")
    code, verdict, _ = doctor_vm()
    assert code == 1
    assert verdict.startswith(
        f"tpu_vm: no firewall rule on network default of project {project} allows SSH (tcp:22)"
    )
    assert verdict.endswith(
        f"gcloud compute firewall-rules create tpu-rl-allow-ssh --project={project} --network=default "
        "--direction=INGRESS --allow=tcp:22 --source-ranges=0.0.0.0/0"
    )

    delete_network(SandboxLayout(sandbox.root), project, "default")
    code, verdict, _ = doctor_vm()
    assert code == 1
    assert verdict.startswith(f"tpu_vm: network default does not exist in project {project}: "), verdict
