"""``gcluster deploy|destroy --only/--skip`` on the provider's blueprint with the TPU pool in group ``tpu``.

The fake gcluster follows cluster-toolkit: ``cmd/utils.go`` (group selection flags),
``pkg/shell/terraform.go`` gatherUpstreamOutputs (a later group reads the earlier groups' outputs
file; missing: the export-outputs hint), ``cmd/export.go`` (export-outputs rewrites that file from
the group's state), destroy in reverse order of the selected groups only.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from airflow_provider_tpu_rl.render.blueprint import customize_blueprint
from airflow_provider_tpu_rl.spec.presets import PRESETS
from tests.sandbox.conftest import Cli, deploy_args, job_status, make_cluster, submit_args

TPU_POOL = "gke-tpu-v6e-pool"


@pytest.fixture
def split_blueprint(cli: Cli, tmp_path: Path) -> Path:
    folder = tmp_path / "blueprint"
    shutil.copytree(cli.info.blueprint.parent, folder)
    edited = folder / cli.info.blueprint.name
    edited.write_text(
        customize_blueprint(cli.info.blueprint.read_text(), PRESETS["qwen3-30b-a3b"].blueprint, tpu_quota=32)
    )
    return edited


def _pools(cli: Cli, names: dict[str, str]) -> list[str]:
    clusters = [c for c in cli.state("clusters").values() if c["name"] == names["cluster"]]
    return sorted(p["name"] for c in clusters for p in c["node_pools"])


def _lives(cli: Cli, names: dict[str, str], pool: str) -> list[tuple[float, float | None]]:
    events = cli.state("node_pool_events").get("events", [])
    return [
        (e["created_at"], e["deleted_at"])
        for e in events
        if e["pool"] == pool and e["cluster"].rsplit("/", 1)[-1] == names["cluster"]
    ]


def test_the_tpu_pool_is_deployed_and_destroyed_on_its_own(
    cli: Cli, names: dict[str, str], split_blueprint: Path
) -> None:
    bucket = f"gs://{names['bucket']}"
    assert cli.gcloud("storage", "buckets", "create", bucket, f"--project={names['project']}").code == 0
    depl = cli.cwd / names["cluster"]

    cluster = cli.gcluster("deploy", str(split_blueprint), *deploy_args(names), "--skip=tpu")
    assert cluster.code == 0, cluster.text
    assert 'skipping group "tpu"' in cluster.out
    assert _pools(cli, names) == ["cpu-np", "system"]
    assert _lives(cli, names, TPU_POOL) == []

    # A fresh folder (another worker): the tpu group needs the primary group's outputs file.
    shutil.rmtree(depl)
    args = [a for a in deploy_args(names) if a not in ("--auto-approve",)]
    assert cli.gcluster("create", str(split_blueprint), *args).code == 0
    missing = cli.gcluster("deploy", names["cluster"], "--auto-approve", "--only=tpu")
    assert missing.code == 1
    assert f'consider running "gcluster export-outputs {names["cluster"]}/primary"' in missing.err
    assert "could not be read" in missing.err
    assert _pools(cli, names) == ["cpu-np", "system"]

    exported = cli.gcluster("export-outputs", f"{names['cluster']}/primary")
    assert exported.code == 0, exported.text
    assert (depl / ".ghpc" / "artifacts" / "primary_outputs.tfvars").is_file()
    pool = cli.gcluster("deploy", names["cluster"], "--auto-approve", "--only=tpu")
    assert pool.code == 0, pool.text
    assert 'skipping group "primary"' in pool.out
    assert _pools(cli, names) == ["cpu-np", TPU_POOL, "system"]
    # a second deploy of the cluster's group keeps the pool of the other group
    again = cli.gcluster("deploy", str(split_blueprint), *deploy_args(names), "--skip=tpu")
    assert again.code == 0, again.text
    assert _pools(cli, names) == ["cpu-np", TPU_POOL, "system"]
    assert cli.gcluster("export-outputs", f"{names['cluster']}/primary").code == 0

    gone = cli.gcluster("destroy", names["cluster"], "--auto-approve", "--only=tpu")
    assert gone.code == 0, gone.text
    assert _pools(cli, names) == ["cpu-np", "system"]
    ((created, deleted),) = _lives(cli, names, TPU_POOL)
    assert deleted is not None
    assert created < deleted
    # an absent pool: nothing to destroy
    twice = cli.gcluster("destroy", names["cluster"], "--auto-approve", "--only=tpu")
    assert twice.code == 0, twice.text
    assert (
        f"Cloud infrastructure in deployment group {names['cluster']}/tpu is already destroyed" in twice.out
    )

    everything = cli.gcluster("destroy", names["cluster"], "--auto-approve")
    assert everything.code == 0, everything.text
    assert _pools(cli, names) == []
    ((_, cpu_deleted),) = _lives(cli, names, "cpu-np")
    assert cpu_deleted is not None


def test_group_selection_is_checked_like_gcluster(
    cli: Cli, names: dict[str, str], split_blueprint: Path
) -> None:
    assert (
        cli.gcloud(
            "storage", "buckets", "create", f"gs://{names['bucket']}", f"--project={names['project']}"
        ).code
        == 0
    )
    both = cli.gcluster("deploy", str(split_blueprint), *deploy_args(names), "--only=tpu", "--skip=primary")
    assert both.code == 1
    assert "cannot specify both --only and --skip" in both.err
    unknown = cli.gcluster("deploy", str(split_blueprint), *deploy_args(names), "--skip=gpu")
    assert unknown.code == 1
    assert 'group "gpu" not found' in unknown.err
    assert _pools(cli, names) == []


def test_a_tpu_pool_without_its_cluster_is_not_created(
    cli: Cli, names: dict[str, str], split_blueprint: Path
) -> None:
    """Deploying the tpu group alone first: the earlier group's outputs are missing (the hint),
    and with a stale outputs file the cluster it names does not exist."""
    assert (
        cli.gcloud(
            "storage", "buckets", "create", f"gs://{names['bucket']}", f"--project={names['project']}"
        ).code
        == 0
    )
    alone = cli.gcluster("deploy", str(split_blueprint), *deploy_args(names), "--only=tpu")
    assert alone.code == 1
    assert "consider running" in alone.err
    artifacts = cli.cwd / names["cluster"] / ".ghpc" / "artifacts"
    (artifacts / "primary_outputs.tfvars").write_text('instructions_gke-tpu-v6e-cluster = "stale"\n')
    stale = cli.gcluster("deploy", names["cluster"], "--auto-approve", "--only=tpu")
    assert stale.code == 1
    assert "Error 404: Not found" in stale.err
    assert _lives(cli, names, TPU_POOL) == []


def test_a_tpu_job_runs_only_while_the_tpu_pool_exists(
    cli: Cli, names: dict[str, str], split_blueprint: Path
) -> None:
    """Without the tpu group the cluster has no node of the TPU machine type: gcluster refuses the
    TPU job (no node pool matches its machine type), so training must follow the pool's deploy."""
    cluster = make_cluster(cli, names, split_blueprint)  # every group: the pool exists
    assert _pools(cli, names) == ["cpu-np", TPU_POOL, "system"]
    assert cli.gcluster("destroy", names["cluster"], "--auto-approve", "--only=tpu").code == 0

    refused = cli.gcluster(*submit_args("tpu-early", "echo hi"))
    assert refused.code == 1
    assert 'no matching machine types found in cluster for shorthand "ct6e-standard-4t"' in refused.err
    assert job_status(cli, cluster, "tpu-early") is None

    assert cli.gcluster("deploy", names["cluster"], "--auto-approve", "--only=tpu").code == 0
    accepted = cli.gcluster(*submit_args("tpu-later", "echo hi"))
    assert accepted.code == 0, accepted.text
    assert job_status(cli, cluster, "tpu-later") is not None
