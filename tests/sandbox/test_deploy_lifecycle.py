"""``gcluster create|deploy|destroy`` with Terraform state in GCS or in the deployment folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from airflow_provider_tpu_rl.render.blueprint import customize_blueprint
from airflow_provider_tpu_rl.spec.presets import PRESETS
from tests.sandbox.conftest import Cli, deploy_args


def clusters_of(cli: Cli, project: str) -> list[dict[str, Any]]:
    listed = cli.gcloud("container", "clusters", "list", f"--project={project}", "--format=json")
    assert listed.code == 0, listed.text
    return list(json.loads(listed.out or "[]"))


def test_deploy_writes_folder_and_gcs_state_then_redeploy_is_a_no_op(cli: Cli, names: dict[str, str]) -> None:
    assert (
        cli.gcloud(
            "storage", "buckets", "create", f"gs://{names['bucket']}", f"--project={names['project']}"
        ).code
        == 0
    )
    first = cli.gcluster(
        "deploy", str(cli.info.blueprint), *deploy_args(names, extra_vars="labels={team: rl}")
    )
    assert first.code == 0, first.text
    assert f'Creating deployment folder "{names["cluster"]}" ...' in first.out
    assert "Apply complete! Resources:" in first.out
    depl = cli.cwd / names["cluster"]
    expanded = yaml.safe_load((depl / ".ghpc" / "artifacts" / "expanded_blueprint.yaml").read_text())
    assert expanded["vars"]["num_slices"] == 1  # --vars values are YAML-typed
    # Cluster Toolkit's default GCS prefix is <blueprint_name>/<deployment_name>/<group>.
    state_object = f"gke-tpu-v6e/{names['cluster']}/primary/default.tfstate"
    assert cli.objects(names["bucket"]) == [state_object]
    tfstate = json.loads(cli.api.download(names["bucket"], state_object))
    assert tfstate["resources"]
    assert not (depl / "primary" / "terraform.tfstate").exists()
    listed = clusters_of(cli, names["project"])
    assert [c["name"] for c in listed] == [names["cluster"]]
    assert listed[0]["resourceLabels"]["team"] == "rl"

    again = cli.gcluster(
        "deploy", str(cli.info.blueprint), *deploy_args(names, extra_vars="labels={team: rl}")
    )
    assert again.code == 0, again.text
    assert (
        f"Cloud infrastructure in deployment group {names['cluster']}/primary is already applied" in again.out
    )
    assert "Apply complete" not in again.out


def test_existing_folder_needs_w_and_a_tty_less_deploy_needs_auto_approve(
    cli: Cli, names: dict[str, str]
) -> None:
    args = deploy_args(names, backend=False)
    created = cli.gcluster(
        "create", str(cli.info.blueprint), *[a for a in args if a not in ("--auto-approve", "-w")]
    )
    assert created.code == 0, created.text
    no_w = cli.gcluster("deploy", str(cli.info.blueprint), *[a for a in args if a != "-w"])
    assert no_w.code == 1
    assert (
        f'Error: deployment folder "{names["cluster"]}" already exists\nHint: use -w to overwrite' in no_w.err
    )
    prompt = cli.gcluster("deploy", names["cluster"])
    assert prompt.code == 1
    assert "Please select an option [d,a,s,c]:" in prompt.out
    assert prompt.err.rstrip().endswith(": EOF")
    assert clusters_of(cli, names["project"]) == []
    answered = cli.gcluster("deploy", names["cluster"], stdin="a\n")
    assert answered.code == 0, answered.text
    assert len(clusters_of(cli, names["project"])) == 1
    with_flags = cli.gcluster("deploy", names["cluster"], "--vars", "zone=x")
    assert with_flags.code == 1
    assert 'cannot specify flag "vars" with DEPLOYMENT_DIRECTORY provided' in with_flags.err
    unapproved = cli.gcluster("destroy", names["cluster"])
    assert unapproved.code == 1
    assert unapproved.err.rstrip().endswith(": EOF")
    assert len(clusters_of(cli, names["project"])) == 1
    approved = cli.gcluster("destroy", names["cluster"], stdin="a\n")
    assert approved.code == 0, approved.text
    assert clusters_of(cli, names["project"]) == []


def test_destroy_from_a_fresh_folder_finds_the_gcs_state(cli: Cli, names: dict[str, str]) -> None:
    assert (
        cli.gcloud(
            "storage", "buckets", "create", f"gs://{names['bucket']}", f"--project={names['project']}"
        ).code
        == 0
    )
    assert cli.gcluster("deploy", str(cli.info.blueprint), *deploy_args(names)).code == 0
    elsewhere = cli.cwd / "other-worker"
    elsewhere.mkdir()
    create_args = [a for a in deploy_args(names) if a not in ("--auto-approve", "-w")]
    recreated = cli.gcluster("create", str(cli.info.blueprint), *create_args, cwd=elsewhere)
    assert recreated.code == 0, recreated.text
    destroyed = cli.gcluster("destroy", names["cluster"], "--auto-approve", cwd=elsewhere)
    assert destroyed.code == 0, destroyed.text
    assert "Destroy complete! Resources:" in destroyed.out
    assert clusters_of(cli, names["project"]) == []
    state = json.loads(
        cli.api.download(names["bucket"], f"gke-tpu-v6e/{names['cluster']}/primary/default.tfstate")
    )
    assert state["resources"] == []
    assert cli.api.get_bucket(names["bucket"]) is not None  # destroy never touches buckets
    again = cli.gcluster("destroy", str(cli.cwd / names["cluster"]), "--auto-approve")
    assert again.code == 0
    assert "is already destroyed" in again.out


def test_local_state_is_lost_with_the_folder(cli: Cli, names: dict[str, str]) -> None:
    assert cli.gcluster("deploy", str(cli.info.blueprint), *deploy_args(names, backend=False)).code == 0
    assert (cli.cwd / names["cluster"] / "primary" / "terraform.tfstate").is_file()
    elsewhere = cli.cwd / "other-worker"
    elsewhere.mkdir()
    create_args = [a for a in deploy_args(names, backend=False) if a not in ("--auto-approve", "-w")]
    assert cli.gcluster("create", str(cli.info.blueprint), *create_args, cwd=elsewhere).code == 0
    destroyed = cli.gcluster("destroy", names["cluster"], "--auto-approve", cwd=elsewhere)
    assert destroyed.code == 0
    assert "is already destroyed" in destroyed.out
    assert len(clusters_of(cli, names["project"])) == 1  # the cluster leaked
    redeploy = cli.gcluster("deploy", names["cluster"], "--auto-approve", cwd=elsewhere)
    assert redeploy.code == 1
    assert (
        f"Error 409: Already exists: projects/{names['project']}/locations/{names['region']}/clusters/{names['cluster']}"
        in redeploy.err
    )


def test_destroy_and_deploy_argument_errors(cli: Cli, names: dict[str, str]) -> None:
    missing_dir = cli.gcluster("destroy", "nowhere", "--auto-approve")
    assert (missing_dir.code, missing_dir.err) == (1, 'Error: "nowhere" must be a directory\n')
    missing_bp = cli.gcluster("deploy", "nope.yaml")
    assert (missing_bp.code, missing_bp.err) == (1, 'Error: "nope.yaml" does not exist\n')
    no_bucket = cli.gcluster("deploy", str(cli.info.blueprint), *deploy_args(names))
    assert no_bucket.code == 1
    assert "storage: bucket doesn't exist" in no_bucket.err
    long_name = dict(names, cluster="a-very-long-cluster-name")
    too_long = cli.gcluster("deploy", str(cli.info.blueprint), *deploy_args(long_name, backend=False))
    assert too_long.code == 1
    assert "a-very-long-cluster-name-gke-np-sa" in too_long.err
    no_project = cli.gcluster(
        "deploy",
        str(cli.info.blueprint),
        "--vars",
        f"deployment_name={names['cluster']}x",
        "-l",
        "IGNORE",
        "--auto-approve",
    )
    # pkg/config/validate.go validateVars, in the expansion: before Terraform and the validators
    assert no_project.code == 1
    assert 'Error: vars.project_id: deployment variable "project_id" was not set\n' in no_project.err
    validated = cli.gcluster(
        "deploy",
        str(cli.info.blueprint),
        *deploy_args(dict(names, cluster=f"{names['cluster']}y", zone="europe-west4-a"), backend=False)[:2],
        "--auto-approve",
    )
    assert validated.code == 1
    assert "Validation failed due to the issues listed above" in validated.err


# ------------------------------------------------------------------ a run that names no reservation
def _no_reservation_args(names: dict[str, str]) -> list[str]:
    args = deploy_args(names)
    return [arg.replace(",reservation=res-1", "") if arg.startswith("project_id=") else arg for arg in args]


def test_an_empty_reservation_name_fails_the_tpu_pools_precondition(cli: Cli, names: dict[str, str]) -> None:
    """The example binds its TPU pool to ``$(vars.reservation)``: with the name empty, gke-node-pool's
    reservation precondition fails the plan, and nothing is created."""
    assert (
        cli.gcloud(
            "storage", "buckets", "create", f"gs://{names['bucket']}", f"--project={names['project']}"
        ).code
        == 0
    )
    # `reservation=` is a null, which gcluster refuses (pkg/config/validate.go validateVars);
    # `reservation=""` is the empty name
    unset = [arg.replace("reservation=res-1", "reservation=") for arg in deploy_args(names)]
    refused = cli.gcluster("deploy", str(cli.info.blueprint), *unset)
    assert refused.code == 1
    assert refused.err.rstrip().endswith(
        'Error: vars.reservation: deployment variable "reservation" was not set'
    )
    args = [arg.replace("reservation=res-1", 'reservation=""') for arg in deploy_args(names)]

    result = cli.gcluster("deploy", str(cli.info.blueprint), *args)

    assert result.code != 0
    assert "Error: Resource precondition failed" in result.text
    assert "Check if your reservation is configured correctly" in result.text
    assert clusters_of(cli, names["project"]) == []


def test_the_provider_blueprint_without_a_reservation_deploys_an_unreserved_tpu_pool(
    cli: Cli, names: dict[str, str], tmp_path: Path
) -> None:
    folder = tmp_path / "blueprint"
    shutil.copytree(cli.info.blueprint.parent, folder)
    edited = folder / cli.info.blueprint.name
    preset = PRESETS["qwen3-30b-a3b"].blueprint
    edited.write_text(customize_blueprint(cli.info.blueprint.read_text(), preset, reservation=False))
    assert (
        cli.gcloud(
            "storage", "buckets", "create", f"gs://{names['bucket']}", f"--project={names['project']}"
        ).code
        == 0
    )

    result = cli.gcluster("deploy", str(edited), *_no_reservation_args(names))

    assert result.code == 0, result.text
    (cluster,) = [c for c in cli.state("clusters").values() if c["name"] == names["cluster"]]
    (tpu_pool,) = [pool for pool in cluster["node_pools"] if pool.get("topology")]
    assert tpu_pool["reservation"] is None
    assert tpu_pool["reservation_affinity"] == {"type": "NO_RESERVATION", "names": []}
