"""A GKE TPU node pool's nodes are Compute Engine instances with GKE's labels: created when the
pool is deployed (PENDING → PROVISIONING → STAGING → RUNNING), deleted when it is destroyed, each
with its zone operation."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tpu_rl.render.blueprint import customize_blueprint
from airflow_provider_tpu_rl.spec.presets import PRESETS
from tests.sandbox.conftest import Cli, deploy_args
from tpu_rl_sandbox.world.settings import update_settings

TPU_POOL = "gke-tpu-v6e-pool"
SCALE = 0.2


@pytest.fixture
def split_blueprint(cli: Cli, tmp_path: Path) -> Path:
    folder = tmp_path / "blueprint"
    shutil.copytree(cli.info.blueprint.parent, folder)
    edited = folder / cli.info.blueprint.name
    edited.write_text(
        customize_blueprint(cli.info.blueprint.read_text(), PRESETS["qwen3-30b-a3b"].blueprint, tpu_quota=32)
    )
    return edited


@pytest.fixture
def scaled(cli: Cli) -> Iterator[None]:
    update_settings(
        cli.layout,
        minute_seconds=SCALE,
        capacity_minutes={
            "vm_provisioning": 5.0,
            "vm_staging": 0.0,
            "tpu_node_ready": 5.0,
        },
    )
    try:
        yield
    finally:
        update_settings(cli.layout, minute_seconds=0.0, capacity_minutes={})


def _nodes(cli: Cli, names: dict[str, str]) -> list[dict[str, Any]]:
    result = cli.gcloud(
        "compute", "instances", "list", f"--project={names['project']}", f"--zones={names['zone']}",
        f"--filter=labels.goog-k8s-cluster-name={names['cluster']} AND labels.goog-k8s-node-pool-name=({TPU_POOL})",
        "--format=json",
    )  # fmt: skip
    assert result.code == 0, result.text
    return list(json.loads(result.out)) if result.out.strip() else []


def _operations(cli: Cli, names: dict[str, str], base: str) -> list[dict[str, Any]]:
    result = cli.gcloud(
        "compute", "operations", "list", f"--project={names['project']}", f"--zones={names['zone']}",
        f'--filter=targetLink~"/instances/({base})-[a-z0-9]{{4}}$"', "--format=json",
    )  # fmt: skip
    assert result.code == 0, result.text
    return list(json.loads(result.out)) if result.out.strip() else []


@pytest.mark.usefixtures("scaled")
def test_the_tpu_pools_nodes_are_labelled_vms_that_run_after_provisioning_and_stop_at_destroy(
    cli: Cli, names: dict[str, str], split_blueprint: Path
) -> None:
    assert (
        cli.gcloud(
            "storage", "buckets", "create", f"gs://{names['bucket']}", f"--project={names['project']}"
        ).code
        == 0
    )
    cluster = cli.gcluster("deploy", str(split_blueprint), *deploy_args(names), "--skip=tpu")
    assert cluster.code == 0, cluster.text
    assert _nodes(cli, names) == []  # the cluster alone has no TPU node VM

    began = datetime.now().astimezone()
    pool = cli.gcluster("deploy", names["cluster"], "--auto-approve", "--only=tpu")
    assert pool.code == 0, pool.text
    nodes = _nodes(cli, names)
    assert len(nodes) == 8  # a 4x8 slice of ct6e-standard-4t: 8 VMs of 4 chips
    for node in nodes:
        assert node["status"] == "RUNNING"
        assert node["machineType"].endswith("/machineTypes/ct6e-standard-4t")
        labels = node["labels"]
        assert labels["goog-k8s-cluster-name"] == names["cluster"]
        assert labels["goog-k8s-node-pool-name"] == TPU_POOL
        assert labels["goog-k8s-cluster-location"] == names["region"]
        assert "goog-gke-node" in labels
        assert labels["ghpc_module"] == "gke-node-pool"  # the pool's resource labels (gke-node-pool)
        # created with the pool; RUNNING (billed) only after the pool API's minute and 5 minutes
        # of provisioning: both before any billing
        created = datetime.fromisoformat(node["creationTimestamp"])
        started = datetime.fromisoformat(node["lastStartTimestamp"])
        assert (created - began).total_seconds() >= 1 * SCALE - 0.05
        assert (started - created).total_seconds() >= 5 * SCALE - 0.05
    (base,) = {node["name"].rsplit("-", 1)[0] for node in nodes}
    assert len(base) <= 58
    inserts = _operations(cli, names, base)
    assert sorted(op["targetId"] for op in inserts) == sorted(node["id"] for node in nodes)
    assert {op["operationType"] for op in inserts} == {"insert"}
    assert all(op["user"].endswith("@cloudservices.gserviceaccount.com") for op in inserts)

    destroyed = cli.gcluster("destroy", names["cluster"], "--auto-approve", "--only=tpu")
    assert destroyed.code == 0, destroyed.text
    assert _nodes(cli, names) == []
    deletes = [op for op in _operations(cli, names, base) if op["operationType"] == "delete"]
    assert sorted(op["targetId"] for op in deletes) == sorted(node["id"] for node in nodes)
    last_start = max(datetime.fromisoformat(node["lastStartTimestamp"]) for node in nodes)
    for op in deletes:
        # the nodes ran (billed) until they went STOPPING as their delete started (no pod ran on
        # them: no drain, tests/sandbox/test_pool_drain.py)
        assert datetime.fromisoformat(op["startTime"]) >= last_start
        assert op["status"] == "DONE"


def test_a_cluster_destroyed_whole_takes_its_tpu_nodes_with_it(cli: Cli, names: dict[str, str]) -> None:
    deployed = cli.gcluster("deploy", str(cli.info.blueprint), *deploy_args(names, backend=False))
    assert deployed.code == 0, deployed.text
    assert len(_nodes(cli, names)) == 8
    destroyed = cli.gcluster("destroy", names["cluster"], "--auto-approve")
    assert destroyed.code == 0, destroyed.text
    assert _nodes(cli, names) == []
