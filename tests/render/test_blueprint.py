"""The blueprint edit (render/blueprint.py): the GKE TPU node pool in a deployment group of its own.

The edit is checked against the sandbox's copy of the example and against the fake gcluster's
expansion rules (cluster-toolkit ``pkg/config/expand.go`` validateModuleReference); the argv that
selects the groups is tests/render/test_gke.py's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

import tpu_rl_sandbox
from airflow_provider_tpu_rl.render.blueprint import (
    BLUEPRINT_RELPATH,
    BlueprintError,
    customize_blueprint,
    module_references,
)
from airflow_provider_tpu_rl.spec import gke_pipeline_from_conf
from tpu_rl_sandbox.clis.gcluster.deploy import INTERGROUP_ORDER, Fatal, check_intergroup_order

BUNDLE_BLUEPRINT = (Path(tpu_rl_sandbox.__file__).parent / "bundle" / BLUEPRINT_RELPATH).read_text()
POOL = "gke-tpu-v6e-pool"


def _pipeline(**conf: Any) -> Any:
    return gke_pipeline_from_conf(
        {"model": "qwen3-30b-a3b", "project": "my-proj-123", "bucket": "my-bkt", **conf}
    )


def _split(text: str = BUNDLE_BLUEPRINT, **kwargs: Any) -> dict[str, Any]:
    cluster = _pipeline().cluster
    kwargs.setdefault("tpu_quota", cluster.total_chips)
    document = yaml.safe_load(customize_blueprint(text, cluster.blueprint, **kwargs))
    assert isinstance(document, dict)
    return document


def test_the_tpu_pool_moves_to_a_last_group_of_its_own() -> None:
    doc = _split()
    assert [g["group"] for g in doc["deployment_groups"]] == ["primary", "tpu"]
    primary, tpu = doc["deployment_groups"]
    assert [m["id"] for m in tpu["modules"]] == [POOL]
    assert POOL not in {m["id"] for m in primary["modules"]}
    # everything else stays where it was: network, accounts, cluster (and its cpu-np), Kueue
    original = yaml.safe_load(BUNDLE_BLUEPRINT)["deployment_groups"][0]["modules"]
    assert [m["id"] for m in primary["modules"]] == [m["id"] for m in original if m["id"] != POOL]
    # the pool still uses the earlier group's cluster and service account
    assert set(tpu["modules"][0]["use"]) == {"gke-tpu-v6e-cluster", "node_pool_service_account"}


def test_kueue_gets_the_slices_chips_as_a_literal_quota() -> None:
    """The example computes tpu_quota from the pool's outputs; a later group cannot be read, so
    the quota is the chip count of the slices (v6e 4x8 = 32 chips, x num_slices)."""
    for slices, quota in ((1, 32), (2, 64)):
        cluster = _pipeline(num_slices=slices).cluster
        assert cluster.total_chips == quota
        doc = yaml.safe_load(customize_blueprint(BUNDLE_BLUEPRINT, cluster.blueprint, tpu_quota=quota))
        (kubectl,) = [
            m for g in doc["deployment_groups"] for m in g["modules"] if m["id"] == "workload-manager-install"
        ]
        assert kubectl["settings"]["kueue"]["config_template_vars"]["tpu_quota"] == quota


def test_no_module_refers_to_a_later_group() -> None:
    """What gcluster's expansion checks (the sandbox's copy of validateModuleReference)."""
    doc = _split()
    primary = doc["deployment_groups"][0]
    assert not any(POOL in module_references(m) for m in primary["modules"])
    check_intergroup_order(doc["deployment_groups"])
    # moving the pool without the quota edit is what the real tool refuses
    unedited = yaml.safe_load(BUNDLE_BLUEPRINT)
    modules = unedited["deployment_groups"][0]["modules"]
    pool = next(m for m in modules if m["id"] == POOL)
    modules.remove(pool)
    unedited["deployment_groups"].append({"group": "tpu", "modules": [pool]})
    with pytest.raises(Fatal, match=f"{INTERGROUP_ORDER}: {POOL} is in a later group"):
        check_intergroup_order(unedited["deployment_groups"])


def test_the_reservation_edit_stays_on_the_moved_pool() -> None:
    reserved = _split()["deployment_groups"][1]["modules"][0]["settings"]["reservation_affinity"]
    assert reserved == {
        "consume_reservation_type": "SPECIFIC_RESERVATION",
        "specific_reservations": [{"name": "$(vars.reservation)"}],
    }
    unreserved = _split(reservation=False)["deployment_groups"][1]["modules"][0]["settings"]
    assert unreserved["reservation_affinity"] == {"consume_reservation_type": "NO_RESERVATION"}


def _with_module(module: dict[str, Any]) -> str:
    doc = yaml.safe_load(BUNDLE_BLUEPRINT)
    doc["deployment_groups"][0]["modules"].append(module)
    return yaml.safe_dump(doc, sort_keys=False)


def test_the_fio_benchmark_template_is_dropped() -> None:
    """The upstream example's fio job template uses the pool; it only benchmarks disks."""
    text = _with_module(
        {
            "id": "fio-bench-job-template",
            "source": "modules/compute/gke-job-template",
            "use": ["gke-tpu-v6e-pool", "training-pv"],
            "settings": {"image": "ubuntu:latest"},
        }
    )
    doc = _split(text)
    assert "fio-bench-job-template" not in {m["id"] for g in doc["deployment_groups"] for m in g["modules"]}
    check_intergroup_order(doc["deployment_groups"])


@pytest.mark.parametrize(
    "module",
    [
        {"id": "other", "source": "modules/compute/gke-job-template", "use": [POOL]},
        {
            "id": "other",
            "source": "modules/management/kubectl-apply",
            "settings": {"x": f"$(vars.num_slices * {POOL}.tpu_chips_per_node)"},
        },
    ],
)
def test_another_module_reading_the_pool_is_refused(module: dict[str, Any]) -> None:
    with pytest.raises(BlueprintError, match=r"\['other'\] refer to the TPU node pool"):
        _split(_with_module(module))


@pytest.mark.parametrize("quota", [0, -1, True])
def test_a_quota_that_is_not_a_chip_count_is_refused(quota: Any) -> None:
    with pytest.raises(BlueprintError, match="tpu_quota must be a positive chip count"):
        _split(tpu_quota=quota)


def test_a_blueprint_without_one_tpu_pool_is_refused() -> None:
    doc = yaml.safe_load(BUNDLE_BLUEPRINT)
    doc["deployment_groups"][0]["modules"] = [
        m for m in doc["deployment_groups"][0]["modules"] if m["id"] != POOL
    ]
    with pytest.raises(BlueprintError, match="exactly one modules/compute/gke-node-pool"):
        _split(yaml.safe_dump(doc))
