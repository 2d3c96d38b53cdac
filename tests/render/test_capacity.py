"""What each ``capacity`` renders on GKE: the TPU node pool's settings in the blueprint (the TPU VM's
create argv of each capacity: tests/render/test_tpu_vm.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

import tpu_rl_sandbox
from airflow_provider_tpu_rl.render.blueprint import BLUEPRINT_RELPATH, BlueprintError, customize_blueprint
from airflow_provider_tpu_rl.spec import gke_pipeline_from_conf

BUNDLE_BLUEPRINT = (Path(tpu_rl_sandbox.__file__).parent / "bundle" / BLUEPRINT_RELPATH).read_text()


def _tpu_pool(capacity: str, **conf: Any) -> dict[str, Any]:
    cluster = gke_pipeline_from_conf(
        {"model": "qwen3-30b-a3b", "project": "my-proj-123", "bucket": "my-bkt", "capacity": capacity, **conf}
    ).cluster
    text = customize_blueprint(
        BUNDLE_BLUEPRINT,
        cluster.blueprint,
        reservation=bool(cluster.reservation),
        capacity=cluster.capacity,
        slice_vms=cluster.shape.vms,
        tpu_quota=cluster.total_chips,
    )
    doc = yaml.safe_load(text)
    (tpu,) = [g for g in doc["deployment_groups"] if g["group"] == "tpu"]
    (pool,) = tpu["modules"]
    settings: dict[str, Any] = pool["settings"]
    return settings


def test_reservation_capacity_keeps_the_examples_pool() -> None:
    pool = _tpu_pool("reservation", reservation="res-1")
    assert pool["reservation_affinity"]["consume_reservation_type"] == "SPECIFIC_RESERVATION"
    assert not {"spot", "enable_flex_start", "auto_repair"} & set(pool)


def test_an_on_demand_pool_consumes_no_reservation_and_sets_no_consumption_option() -> None:
    """gke-node-pool's defaults (variables.tf: spot false, reservation_affinity NO_RESERVATION): the
    pool's nodes are standard VMs; the example's static node count stays (no autoscaling needed)."""
    pool = _tpu_pool("on-demand")
    assert pool["reservation_affinity"] == {"consume_reservation_type": "NO_RESERVATION"}
    assert not {"spot", "enable_flex_start", "auto_repair", "autoscaling_max_node_count"} & set(pool)
    assert pool == {
        **_tpu_pool("reservation", reservation="res-1"),
        "reservation_affinity": pool["reservation_affinity"],
    }


def test_a_spot_pool_consumes_no_reservation() -> None:
    pool = _tpu_pool("spot")
    assert pool["spot"] is True
    assert pool["reservation_affinity"] == {"consume_reservation_type": "NO_RESERVATION"}
    assert "enable_flex_start" not in pool


def test_a_flex_start_pool_scales_from_zero_to_its_slice() -> None:
    pool = _tpu_pool("flex-start")
    assert pool["enable_flex_start"] is True
    assert pool["auto_repair"] is False
    assert "static_node_count" not in pool
    assert pool["reservation_affinity"] == {"consume_reservation_type": "NO_RESERVATION"}
    # qwen3-30b-a3b: v6e-32 (4x8) of ct6e-standard-4t, 8 VMs per slice
    assert (pool["autoscaling_min_node_count"], pool["autoscaling_max_node_count"]) == (0, 8)
    assert pool["placement_policy"]["type"] == "COMPACT"  # allowed with flex-start for TPUs


def test_flex_start_needs_the_slice_size() -> None:
    cluster = gke_pipeline_from_conf({"project": "my-proj-123", "bucket": "my-bkt"}).cluster
    with pytest.raises(BlueprintError, match="slice_vms"):
        customize_blueprint(BUNDLE_BLUEPRINT, cluster.blueprint, reservation=False, capacity="flex-start")
