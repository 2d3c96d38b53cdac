"""``capacity``: one of reservation, spot, flex-start, and consistent with ``reservation``, on both
pipelines; each bad combination is one line naming the field."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_tpu_rl.spec import SpecError, gke_pipeline_from_conf, tpu_vm_pipeline_from_conf
from airflow_provider_tpu_rl.spec.cluster import CAPACITIES

GKE = {"project": "my-proj-123", "bucket": "my-bkt"}
TPU_VM = {"project": "my-proj-123", "bucket": "my-bkt"}


def _refused(build: Any, conf: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as caught:
        build(conf)
    line = str(caught.value)
    assert "\n" not in line
    return line


def test_the_default_is_reservation_as_the_seeds() -> None:
    assert gke_pipeline_from_conf(GKE).resolved()["capacity"] == "reservation"
    assert tpu_vm_pipeline_from_conf(TPU_VM).resolved()["capacity"] == "reservation"
    assert CAPACITIES == ("reservation", "spot", "flex-start")


@pytest.mark.parametrize("build", [gke_pipeline_from_conf, tpu_vm_pipeline_from_conf])
def test_an_unknown_capacity_lists_the_choices(build: Any) -> None:
    line = _refused(build, {**GKE, "capacity": "preemptible", "reservation": ""})
    assert line == "capacity: must be one of ['reservation', 'spot', 'flex-start'] (got 'preemptible')"


@pytest.mark.parametrize("build", [gke_pipeline_from_conf, tpu_vm_pipeline_from_conf])
def test_a_capacity_must_be_a_string(build: Any) -> None:
    assert _refused(build, {**GKE, "capacity": None}).startswith("capacity: must be a string")


@pytest.mark.parametrize("capacity", ["spot", "flex-start"])
@pytest.mark.parametrize("build", [gke_pipeline_from_conf, tpu_vm_pipeline_from_conf])
def test_spot_and_flex_start_refuse_a_reservation(build: Any, capacity: str) -> None:
    line = _refused(build, {**GKE, "capacity": capacity, "reservation": "res-1"})
    assert line == (
        f"capacity: {capacity} capacity consumes no reservation: clear reservation (res-1) or set "
        f"capacity to reservation (got '{capacity}')"
    )


def test_the_tpu_vm_forms_example_reservation_is_refused_with_spot() -> None:
    """The form's prefilled example reservation must be cleared for spot: one line says so."""
    line = _refused(tpu_vm_pipeline_from_conf, {**TPU_VM, "capacity": "spot"})
    assert "clear reservation (my-v6e-8-reservation)" in line


@pytest.mark.parametrize("capacity", ["spot", "flex-start"])
def test_spot_and_flex_start_need_no_reservation(capacity: str) -> None:
    gke = gke_pipeline_from_conf({**GKE, "capacity": capacity})
    assert (gke.cluster.capacity, gke.cluster.reservation) == (capacity, "")
    vm = tpu_vm_pipeline_from_conf({**TPU_VM, "capacity": capacity, "reservation": ""})
    assert (vm.vm.capacity, vm.vm.reservation) == (capacity, "")
    assert vm.resolved()["capacity"] == capacity


def test_reservation_capacity_on_the_tpu_vm_needs_a_reservation() -> None:
    line = _refused(tpu_vm_pipeline_from_conf, {**TPU_VM, "reservation": ""})
    assert line.startswith("reservation: ")


def test_a_flex_start_vm_runs_at_most_max_vm_hours() -> None:
    vm = tpu_vm_pipeline_from_conf(
        {**TPU_VM, "capacity": "flex-start", "reservation": "", "max_vm_hours": 30}
    )
    assert vm.vm.max_run_hours == 30
