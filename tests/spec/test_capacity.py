"""``capacity``: one of on-demand, reservation, spot, flex-start, and consistent with
``reservation``, on both pipelines; each bad combination is one line naming the field."""

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


def test_the_default_is_on_demand_with_no_reservation() -> None:
    """What a first user needs: no reservation to buy or name (README, "TPU capacity")."""
    assert CAPACITIES == ("on-demand", "reservation", "spot", "flex-start")
    for build in (gke_pipeline_from_conf, tpu_vm_pipeline_from_conf):
        resolved = build(GKE).resolved()
        assert (resolved["capacity"], resolved["reservation"]) == ("on-demand", "")


@pytest.mark.parametrize("build", [gke_pipeline_from_conf, tpu_vm_pipeline_from_conf])
def test_a_conf_naming_a_reservation_and_no_capacity_consumes_it(build: Any) -> None:
    """As before capacity was a conf key: a sweep's or a script's conf keeps its meaning."""
    resolved = build({**GKE, "reservation": "res-1"}).resolved()
    assert (resolved["capacity"], resolved["reservation"]) == ("reservation", "res-1")


@pytest.mark.parametrize("build", [gke_pipeline_from_conf, tpu_vm_pipeline_from_conf])
@pytest.mark.parametrize("reservation", ["", None])
def test_reservation_capacity_without_a_reservation_is_refused_in_one_line(
    build: Any, reservation: str | None
) -> None:
    line = _refused(build, {**GKE, "capacity": "reservation", "reservation": reservation})
    assert line == (
        "capacity: reservation capacity needs a reservation: name it in reservation, or set capacity "
        "to on-demand (no reservation) (got 'reservation')"
    )


@pytest.mark.parametrize("build", [gke_pipeline_from_conf, tpu_vm_pipeline_from_conf])
def test_an_unknown_capacity_lists_the_choices(build: Any) -> None:
    line = _refused(build, {**GKE, "capacity": "preemptible", "reservation": ""})
    assert line == (
        "capacity: must be one of ['on-demand', 'reservation', 'spot', 'flex-start'] (got 'preemptible')"
    )


@pytest.mark.parametrize("build", [gke_pipeline_from_conf, tpu_vm_pipeline_from_conf])
def test_a_capacity_must_be_a_string(build: Any) -> None:
    assert _refused(build, {**GKE, "capacity": None}).startswith("capacity: must be a string")


@pytest.mark.parametrize("capacity", ["on-demand", "spot", "flex-start"])
@pytest.mark.parametrize("build", [gke_pipeline_from_conf, tpu_vm_pipeline_from_conf])
def test_only_reservation_capacity_takes_a_reservation(build: Any, capacity: str) -> None:
    line = _refused(build, {**GKE, "capacity": capacity, "reservation": "res-1"})
    assert line == (
        f"capacity: {capacity} capacity consumes no reservation: clear reservation (res-1) or set "
        f"capacity to reservation (got '{capacity}')"
    )


@pytest.mark.parametrize("capacity", ["on-demand", "spot", "flex-start"])
def test_on_demand_spot_and_flex_start_need_no_reservation(capacity: str) -> None:
    gke = gke_pipeline_from_conf({**GKE, "capacity": capacity})
    assert (gke.cluster.capacity, gke.cluster.reservation) == (capacity, "")
    vm = tpu_vm_pipeline_from_conf({**TPU_VM, "capacity": capacity, "reservation": ""})
    assert (vm.vm.capacity, vm.vm.reservation) == (capacity, "")
    assert vm.resolved()["capacity"] == capacity


def test_a_spec_of_an_existing_vm_needs_no_reservation() -> None:
    """The stages and the delete work on a VM that exists: its capacity names nothing to create."""
    vm = tpu_vm_pipeline_from_conf(
        {**TPU_VM, "capacity": "reservation", "reservation": ""}, require_reservation=False
    )
    assert (vm.vm.capacity, vm.vm.reservation) == ("reservation", "")


def test_a_flex_start_vm_runs_at_most_max_vm_hours() -> None:
    vm = tpu_vm_pipeline_from_conf(
        {**TPU_VM, "capacity": "flex-start", "reservation": "", "max_vm_hours": 30}
    )
    assert vm.vm.max_run_hours == 30


# An ordered list of kinds (issue 56): the TPU VM's create tries them in turn.


def test_a_tpu_vm_conf_takes_an_ordered_list_of_kinds() -> None:
    """The list is kept in its order: the VM's capacity is the first, the rest its fallback."""
    conf = {**TPU_VM, "reservation": "res-8", "capacity": ["reservation", "flex-start", "spot"]}
    p = tpu_vm_pipeline_from_conf(conf)
    assert (p.vm.capacity, p.vm.fallback) == ("reservation", ("flex-start", "spot"))
    assert p.vm.capacities == ("reservation", "flex-start", "spot")
    assert p.resolved()["capacity"] == ["reservation", "flex-start", "spot"]
    spot = p.vm.attempt("spot")
    assert (spot.capacity, spot.fallback, spot.reservation) == ("spot", (), "")
    assert p.vm.attempt("reservation").reservation == "res-8"


def test_a_one_kind_list_is_that_kind() -> None:
    """A single value keeps today's meaning, spelt as a string or as a list of one."""
    resolved = tpu_vm_pipeline_from_conf({**TPU_VM, "capacity": ["spot"]}).resolved()
    assert resolved["capacity"] == "spot"


@pytest.mark.parametrize(
    ("capacity", "said"),
    [
        ([], "capacity: an empty list names no capacity"),
        (["spot", "spot"], "capacity: spot is listed twice"),
        (
            ["spot", "preemptible"],
            "capacity: must be one of ['on-demand', 'reservation', 'spot', 'flex-start']",
        ),
        (["spot", 3], "capacity: must be a string or a list of strings"),
        (["reservation", "spot"], "capacity: reservation capacity needs a reservation"),
    ],
)
def test_a_bad_list_is_refused_in_one_line(capacity: Any, said: str) -> None:
    line = _refused(tpu_vm_pipeline_from_conf, {**TPU_VM, "capacity": capacity})
    assert line.startswith(said), line


def test_a_reservation_needs_reservation_in_the_list() -> None:
    line = _refused(
        tpu_vm_pipeline_from_conf, {**TPU_VM, "reservation": "res-8", "capacity": ["flex-start", "spot"]}
    )
    assert line.startswith("capacity: flex-start, spot capacity consumes no reservation"), line


def test_the_gke_pipeline_takes_flex_start_anywhere_in_a_list() -> None:
    """A flex-start TPU pool before other kinds is proved by a placeholder pod at its deploy
    (operators/gke.py flex_start_refusal): no place in the list is refused."""
    p = gke_pipeline_from_conf({**GKE, "capacity": ["on-demand", "spot", "flex-start"]})
    assert (p.cluster.capacity, p.cluster.fallback) == ("on-demand", ("spot", "flex-start"))
    assert p.resolved()["capacity"] == ["on-demand", "spot", "flex-start"]
    assert p.cluster.attempt("spot").capacities == ("spot",)
    first = gke_pipeline_from_conf(
        {**GKE, "reservation": "res-1", "capacity": ["reservation", "flex-start", "spot"]}
    )
    assert (first.cluster.capacity, first.cluster.fallback) == ("reservation", ("flex-start", "spot"))
    assert first.cluster.attempt("flex-start").reservation == ""
    assert gke_pipeline_from_conf({**GKE, "capacity": ["spot"]}).resolved()["capacity"] == "spot"


# capacity_fallback (the forms' list field): the kinds tried after capacity, in order.


@pytest.mark.parametrize("build", [gke_pipeline_from_conf, tpu_vm_pipeline_from_conf])
def test_capacity_then_its_fallback_is_the_ordered_capacity(build: Any) -> None:
    """As the same list given as ``capacity``; the form's blank lines and spaces mean nothing."""
    conf = {"project": "my-proj-123", "bucket": "my-bkt", "capacity": "spot"}
    fallback = build({**conf, "capacity_fallback": ["on-demand", "", " flex-start "]}).resolved()
    listed = build({**conf, "capacity": ["spot", "on-demand", "flex-start"]}).resolved()
    assert fallback["capacity"] == listed["capacity"] == ["spot", "on-demand", "flex-start"]


@pytest.mark.parametrize("build", [gke_pipeline_from_conf, tpu_vm_pipeline_from_conf])
@pytest.mark.parametrize("empty", [[], None, "", ["", " "]])
def test_an_empty_fallback_is_capacity_alone(build: Any, empty: Any) -> None:
    resolved = build({**GKE, "capacity": "spot", "capacity_fallback": empty}).resolved()
    assert resolved == build({**GKE, "capacity": "spot"}).resolved()
    assert resolved["capacity"] == "spot"


def test_a_fallback_after_a_named_reservation_and_no_capacity_follows_it() -> None:
    """A conf naming a reservation and no capacity consumes it first, then the fallback's kinds."""
    conf = {**TPU_VM, "reservation": "res-8", "capacity_fallback": ["spot"]}
    vm = tpu_vm_pipeline_from_conf(conf).vm
    assert (vm.capacities, vm.reservation) == (("reservation", "spot"), "res-8")


@pytest.mark.parametrize(
    ("conf", "said"),
    [
        (
            {"capacity": "spot", "capacity_fallback": ["on-demand", "spot"]},
            "capacity_fallback: spot is tried already (capacity, or listed twice): each kind is tried "
            "once (got 'spot')",
        ),
        (
            {"capacity": "spot", "capacity_fallback": ["on-demand", "on-demand"]},
            "capacity_fallback: on-demand is tried already",
        ),
        (
            {"capacity_fallback": ["preemptible"]},
            "capacity_fallback: must list kinds of ['on-demand', 'reservation', 'spot', 'flex-start'] "
            "(got 'preemptible')",
        ),
        ({"capacity_fallback": "spot"}, "capacity_fallback: must be a list of strings (got 'spot')"),
        ({"capacity_fallback": ["spot", 3]}, "capacity_fallback: must be a list of strings"),
        (
            {"capacity": "spot", "capacity_fallback": ["reservation"]},
            "capacity: reservation capacity needs a reservation",
        ),
    ],
)
def test_a_bad_fallback_is_refused_in_one_line(conf: dict[str, Any], said: str) -> None:
    for build in (gke_pipeline_from_conf, tpu_vm_pipeline_from_conf):
        line = _refused(build, {**GKE, **conf})
        assert line.startswith(said), line


def test_on_gke_a_fallback_after_flex_start_keeps_its_order() -> None:
    """Flex-start before other kinds is proved by a placeholder pod (operators/gke.py)."""
    p = gke_pipeline_from_conf({**GKE, "capacity": "flex-start", "capacity_fallback": ["spot"]})
    assert p.cluster.capacities == ("flex-start", "spot")
    p = gke_pipeline_from_conf({**GKE, "capacity": "spot", "capacity_fallback": ["flex-start"]})
    assert p.cluster.capacities == ("spot", "flex-start")
