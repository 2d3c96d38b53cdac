"""The TPU node pool with Spot or DWS flex-start capacity through the fake gcluster.

The fake enforces gke-node-pool's consumption preconditions (``modules/compute/gke-node-pool/
main.tf`` l.415-438 and l.452-460 at cluster-toolkit 1047080), each with the module's own
``error_message``; the provider's spot and flex-start blueprints pass them.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_provider_tpu_rl.render.blueprint import customize_blueprint
from airflow_provider_tpu_rl.spec.presets import PRESETS
from tests.sandbox.conftest import Cli, deploy_args

PRESET = PRESETS["qwen3-30b-a3b"]


def _without_reservation(names: dict[str, str]) -> list[str]:
    return [
        a.replace(",reservation=res-1", "") if a.startswith("project_id=") else a for a in deploy_args(names)
    ]


def _bucket(cli: Cli, names: dict[str, str]) -> None:
    created = cli.gcloud(
        "storage", "buckets", "create", f"gs://{names['bucket']}", f"--project={names['project']}"
    )
    assert created.code == 0, created.text


def _blueprint(cli: Cli, tmp_path: Path, capacity: str, edit: Any = None) -> Path:
    folder = tmp_path / "blueprint"
    shutil.copytree(cli.info.blueprint.parent, folder, dirs_exist_ok=True)
    text = customize_blueprint(
        cli.info.blueprint.read_text(), PRESET.blueprint, reservation=False, capacity=capacity, slice_vms=8
    )
    if edit is not None:
        doc = yaml.safe_load(text)
        pool = next(
            m
            for g in doc["deployment_groups"]
            for m in g["modules"]
            if m.get("settings", {}).get("machine_type") == "$(vars.machine_type)"
        )
        edit(pool["settings"])
        text = yaml.safe_dump(doc, sort_keys=False)
    edited = folder / cli.info.blueprint.name
    edited.write_text(text)
    return edited


def _tpu_pool(cli: Cli, names: dict[str, str]) -> dict[str, Any]:
    (cluster,) = [c for c in cli.state("clusters").values() if c["name"] == names["cluster"]]
    (pool,) = [p for p in cluster["node_pools"] if p.get("topology")]
    return pool


@pytest.mark.parametrize("capacity", ["spot", "flex-start"])
def test_the_spot_and_flex_start_blueprints_deploy(
    cli: Cli, names: dict[str, str], tmp_path: Path, capacity: str
) -> None:
    _bucket(cli, names)
    result = cli.gcluster("deploy", str(_blueprint(cli, tmp_path, capacity)), *_without_reservation(names))
    assert result.code == 0, result.text
    pool = _tpu_pool(cli, names)
    assert pool["reservation_affinity"] == {"type": "NO_RESERVATION", "names": []}
    option = pool["consumption"]
    assert (option["spot"], option["enable_flex_start"]) == (capacity == "spot", capacity == "flex-start")
    if capacity == "flex-start":
        assert option["auto_repair"] is False
        assert option["static_node_count"] is None


def _set(**values: Any) -> Any:
    return lambda settings: settings.update(values)


def _reserved(settings: dict[str, Any]) -> None:
    settings["reservation_affinity"] = {"consume_reservation_type": "ANY_RESERVATION"}


PRECONDITIONS = [
    ("flex-start", _set(auto_repair=True), "enable_flex_start needs node auto_repair set to false."),
    (
        "flex-start",
        _set(static_node_count=8, autoscaling_min_node_count=None, autoscaling_max_node_count=None),
        "enable_flex_start does not work with static_node_count. static_node_count should be set to null.",
    ),
    (
        "flex-start",
        _reserved,
        "enable_flex_start requires reservation_affinity.consume_reservation_type to be 'NO_RESERVATION'.",
    ),
    (
        "flex-start",
        _set(spot=True),
        "Both enable_flex_start and spot consumption option cannot be set to true at the same time.",
    ),
    (
        "spot",
        _set(enable_queued_provisioning=True),
        "Both enable_queued_provisioning and spot consumption option cannot be set to true at the same time.",
    ),
    (
        "spot",
        _reserved,
        "Spot consumption option only works with reservation_affinity consume_reservation_type NO_RESERVATION.",
    ),
    (
        "flex-start",
        _set(machine_type="a3-highgpu-8g"),
        "Compact placement with DWS Flex start is only supported for A3 Ultra, A4, and H4D machine types.",
    ),
]


@pytest.mark.parametrize(
    ("capacity", "edit", "message"), PRECONDITIONS, ids=[m[:40] for _, _, m in PRECONDITIONS]
)
def test_each_violated_precondition_fails_the_plan(
    cli: Cli, names: dict[str, str], tmp_path: Path, capacity: str, edit: Any, message: str
) -> None:
    _bucket(cli, names)
    result = cli.gcluster(
        "deploy", str(_blueprint(cli, tmp_path, capacity, edit)), *_without_reservation(names)
    )
    assert result.code != 0
    assert "Error: Resource precondition failed" in result.text
    assert message in result.text
    assert not [c for c in cli.state("clusters").values() if c["name"] == names["cluster"]]
