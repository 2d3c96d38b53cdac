"""``tpu-rl-sandbox up|down|env`` and the emulator helpers."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from airflow_provider_tpu_rl.spec.pipeline import ENVIRONMENT_OPTIONS
from tpu_rl_sandbox.apis import gcs_emulator
from tpu_rl_sandbox.clis.tool_stubs import STUB_TERRAFORM_VERSION, STUB_TOOLS
from tpu_rl_sandbox.commands.lifecycle import (
    SandboxInfo,
    add_sandbox_subcommands,
    sandbox_down,
    sandbox_env,
    sandbox_up,
)
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.settings import DEFAULT_RESERVATIONS


def test_up_is_idempotent_and_env_describes_the_sandbox(sandbox: SandboxInfo) -> None:
    again = sandbox_up(sandbox.root)
    assert again.emulator_pid == sandbox.emulator_pid
    env = sandbox_env(sandbox.root)
    assert env["PATH"].split(os.pathsep)[0] == str(sandbox.bin_dir)
    assert env["STORAGE_EMULATOR_HOST"] == sandbox.emulator_url
    assert env["TPU_RL_SANDBOX_DIR"] == str(sandbox.root)
    gcp_extra = json.loads(env["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"])["extra"]
    first = json.loads(sandbox.env["AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT"])["extra"]
    assert gcp_extra["keyfile_dict"] == first["keyfile_dict"]  # one key per sandbox, kept across `up`
    assert gcp_extra["keyfile_dict"]["type"] == "service_account"
    assert gcp_extra["keyfile_dict"]["token_uri"] == env["AIRFLOW__TPU_RL__CONTAINER_ENDPOINT"] + "/token"
    assert json.loads(env["AIRFLOW_CONN_GCLUSTER_DEFAULT"]) == {
        "conn_type": "gcluster",
        "extra": {
            "gcluster_path": str(sandbox.bin_dir / "gcluster"),
            "gcloud_path": str(sandbox.bin_dir / "gcloud"),
            "bundle_dir": str(sandbox.bundle_dir),
            "cache_dir": str(sandbox.root / "cache"),
            "inherit_env": ["TPU_RL_SANDBOX_*"],
        },
    }
    assert json.loads(env["AIRFLOW_CONN_HUGGINGFACE_DEFAULT"]) == {
        "conn_type": "generic",
        "password": "hf_sandbox_not_a_real_token",
    }
    # The trigger forms' defaults are the sandbox's own values, so the untouched forms run here.
    defaults = {k: v for k, v in env.items() if k.startswith("AIRFLOW__TPU_RL__DEFAULT_")}
    assert defaults == {
        "AIRFLOW__TPU_RL__DEFAULT_PROJECT": "sandbox-project",
        "AIRFLOW__TPU_RL__DEFAULT_REGION": "us-east5",
        "AIRFLOW__TPU_RL__DEFAULT_ZONE": "us-east5-b",
        "AIRFLOW__TPU_RL__DEFAULT_BUCKET": "tpu-rl-sandbox-bucket",
        "AIRFLOW__TPU_RL__DEFAULT_TPU_VM_RESERVATION": "res-8",
    }
    options = {option for fields in ENVIRONMENT_OPTIONS.values() for option in fields.values()}
    assert {name.removeprefix("AIRFLOW__TPU_RL__").lower() for name in defaults} <= options
    # ... and the reservation is one the fake project defines, of the TPU VM's shape.
    reservation = DEFAULT_RESERVATIONS["us-east5-b/res-8"]
    assert (reservation["machine_type"], reservation["count"]) == ("ct6e-standard-8t", 1)


def test_shims_run_the_fakes_with_the_sandbox_baked_in(sandbox: SandboxInfo, tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path)}  # no TPU_RL_SANDBOX_DIR in the caller
    result = subprocess.run(
        [str(sandbox.gcluster), "--version"], capture_output=True, env=env, check=False, text=True
    )
    assert result.returncode == 0
    assert result.stdout.startswith("gcluster version v1.103.0")
    assert os.access(sandbox.gcloud, os.X_OK)
    assert f"TPU_RL_SANDBOX_DIR={shlex.quote(str(sandbox.root))}" in sandbox.gcloud.read_text()


def test_bundle_blueprint_has_the_real_structure(sandbox: SandboxInfo) -> None:
    blueprint = yaml.safe_load(sandbox.blueprint.read_text())
    assert blueprint["blueprint_name"] == "gke-tpu-v6e"
    for key in (
        "project_id",
        "deployment_name",
        "region",
        "zone",
        "num_slices",
        "machine_type",
        "tpu_topology",
        "authorized_cidr",
        "reservation",
    ):
        assert key in blueprint["vars"]
    modules = {m["id"]: m for m in blueprint["deployment_groups"][0]["modules"]}
    assert "storage.objectViewer" in modules["node_pool_service_account"]["settings"]["project_roles"]
    assert "workload_service_account" in modules
    assert modules["gke-tpu-v6e-cluster"]["settings"]["system_node_pool_machine_type"] == "n2-standard-8"
    # the real example stages its Kueue configuration from the blueprint's own folder
    assert (
        blueprint["vars"]["kueue_configuration_path"] == '$(ghpc_stage("./kueue-configuration.yaml.tftpl"))'
    )
    assert modules["workload-manager-install"]["settings"]["kueue"]["config_path"] == (
        "$(vars.kueue_configuration_path)"
    )


# cluster-toolkit examples/gke-tpu-v6e/ at the pinned release, file for file
REAL_EXAMPLE_FILES = {
    "README.md",
    "gke-tpu-v6e-advanced.yaml",
    "gke-tpu-v6e-deployment.yaml",
    "gke-tpu-v6e.yaml",
    "kueue-configuration.yaml.tftpl",
    "kueue-job-sample.yaml",
    "ml-diagnostics-sample-workload-test/Dockerfile",
    "ml-diagnostics-sample-workload-test/README.md",
    "ml-diagnostics-sample-workload-test/sample_job.yaml",
    "ml-diagnostics-sample-workload-test/sample_workload/sample_workload.py",
    "tpu-multislice.yaml",
}


def test_bundle_mirrors_the_real_example_folder(sandbox: SandboxInfo) -> None:
    folder = sandbox.blueprint.parent
    written = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
    assert written == REAL_EXAMPLE_FILES
    for name in ("gke-tpu-v6e-advanced.yaml", "gke-tpu-v6e.yaml"):
        text = (folder / name).read_text()
        staged = re.findall(r'ghpc_stage\("\./([^"]+)"\)', text)
        assert "kueue-configuration.yaml.tftpl" in staged
        for item in staged:
            assert (folder / item).is_file(), f"{name} stages {item}, which the bundle lacks"


def test_up_writes_the_tool_stubs(sandbox: SandboxInfo) -> None:
    for tool in STUB_TOOLS:
        assert os.access(sandbox.bin_dir / tool, os.X_OK)
    done = subprocess.run(
        [str(sandbox.bin_dir / "terraform"), "version", "-json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    assert json.loads(done.stdout)["terraform_version"] == STUB_TERRAFORM_VERSION


def test_env_subcommand_prints_shell_exports(
    sandbox: SandboxInfo, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser(prog="tpu-rl-sandbox")
    add_sandbox_subcommands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["env", "--dir", str(sandbox.root)])
    assert args.func(args) == 0
    lines = capsys.readouterr().out.splitlines()
    exported = dict(shlex.split(line[len("export ") :])[0].split("=", 1) for line in lines)
    assert exported == sandbox_env(sandbox.root)


# An Airflow 2-style config: Airflow 3 warns about each moved option when it loads it.
STRAY_AIRFLOW_CFG = "[core]\nsql_alchemy_conn = sqlite:////tmp/stray.db\n[webserver]\nsecret_key = stray\n"


def test_env_prints_only_assignments_with_a_stray_airflow_cfg_in_home(
    sandbox: SandboxInfo, tmp_path: Path
) -> None:
    """``eval "$(tpu-rl-sandbox env)"`` works whatever Airflow config the user's home holds."""
    (tmp_path / "airflow").mkdir()
    (tmp_path / "airflow" / "airflow.cfg").write_text(STRAY_AIRFLOW_CFG)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env["HOME"] = str(tmp_path)
    done = subprocess.run(
        [str(Path(sys.executable).with_name("tpu-rl-sandbox")), "env", "--dir", str(sandbox.root)],
        capture_output=True,
        env=env,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines
    assert [line for line in lines if not re.fullmatch(r"export [A-Z_][A-Z0-9_]*=\S.*", line)] == []
    evaluated = subprocess.run(
        ["bash", "-c", f'{done.stdout}\necho "$TPU_RL_SANDBOX_DIR"'],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        env={"PATH": os.environ["PATH"]},
    )
    assert evaluated.stdout.strip() == str(sandbox.root)


def test_gcs_client_helper_talks_to_the_emulator(
    sandbox: SandboxInfo, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", sandbox.emulator_url)
    client = gcs_emulator.gcs_client(sandbox.emulator_url)
    bucket = client.create_bucket("helper-bucket-control")
    bucket.blob("a/b.txt").upload_from_string("hello")
    assert (
        gcs_emulator.api_for(SandboxLayout(sandbox.root)).download("helper-bucket-control", "a/b.txt")
        == b"hello"
    )


def test_down_keeps_data_and_wipe_deletes(tmp_path: Path) -> None:
    root = tmp_path / "own-sandbox"
    info = sandbox_up(root)
    gcs_emulator.api_for(SandboxLayout(info.root)).create_bucket("kept")
    assert sandbox_down(root) is True
    assert gcs_emulator.running_info(SandboxLayout(info.root)) is None
    assert (root / "gcs").is_dir()
    restarted = sandbox_up(root)
    assert restarted.emulator_pid != info.emulator_pid
    assert gcs_emulator.api_for(SandboxLayout(root)).get_bucket("kept") is not None
    sandbox_down(root, wipe=True)
    assert not root.exists()
