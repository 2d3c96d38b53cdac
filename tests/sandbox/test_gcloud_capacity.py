"""The TPU VM's spot and flex-start creates through the fake gcloud, as strict as gcloud 528.

``surface/compute/instances/create.py``: ``--provisioning-model=FLEX_START`` exists on the alpha
track only (``support_flex_start``); ``command_lib/compute/instances/flags.py``
ValidateInstanceScheduling: ``--instance-termination-action`` needs a provisioning model, a max
run duration or a termination time, and the last two exclude each other.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_provider_tpu_rl.exceptions import FailureKind
from airflow_provider_tpu_rl.render import tpu_vm
from airflow_provider_tpu_rl.spec.cluster import CpuVmSpec, TpuVmSpec
from airflow_provider_tpu_rl.toolchain.failures import classify_failure
from tests.sandbox.conftest import Cli
from tpu_rl_sandbox.world.capacity import check_setting
from tpu_rl_sandbox.world.settings import SandboxSettings, update_settings


def _vm(names: dict[str, str], capacity: str) -> TpuVmSpec:
    return TpuVmSpec(
        project=names["project"],
        zone=names["zone"],
        vm_name=f"vm-{names['cluster']}",
        reservation="",
        bucket=names["bucket"],
        capacity=capacity,
        max_run_hours=24,
    )


def _record(cli: Cli, names: dict[str, str], vm: TpuVmSpec) -> dict:
    return cli.state("vms")[f"{names['project']}/{names['zone']}/{vm.vm_name}"]


def test_a_spot_vm_is_created_with_its_scheduling(cli: Cli, names: dict[str, str]) -> None:
    vm = _vm(names, "spot")
    result = cli.gcloud(*tpu_vm.create_vm(vm).argv[1:])
    assert result.code == 0, result.text
    record = _record(cli, names, vm)
    assert record["scheduling"]["provisioningModel"] == "SPOT"
    assert record["scheduling"]["instanceTerminationAction"] == "STOP"
    assert record["scheduling"]["onHostMaintenance"] == "TERMINATE"
    assert record["reservationAffinity"]["reservation"] is None


def test_a_flex_start_vm_is_created_on_the_alpha_track(cli: Cli, names: dict[str, str]) -> None:
    vm = _vm(names, "flex-start")
    argv = tpu_vm.create_vm(vm).argv
    assert argv[1] == "alpha"
    result = cli.gcloud(*argv[1:])
    assert result.code == 0, result.text
    record = _record(cli, names, vm)
    assert record["scheduling"]["provisioningModel"] == "FLEX_START"
    assert record["scheduling"]["instanceTerminationAction"] == "DELETE"
    assert record["scheduling"]["maxRunDuration"] == "24h"
    assert record["reservationAffinity"]["type"] == "none"


def test_ga_gcloud_refuses_flex_start(cli: Cli, names: dict[str, str]) -> None:
    vm = _vm(names, "flex-start")
    result = cli.gcloud(*tpu_vm.create_vm(vm).argv[2:])
    assert result.code == 2
    assert "argument --provisioning-model: Invalid choice: 'FLEX_START'." in result.err
    assert f"{names['project']}/{names['zone']}/{vm.vm_name}" not in cli.state("vms")


def test_a_termination_action_needs_a_provisioning_model_or_run_time(cli: Cli, names: dict[str, str]) -> None:
    vm = _vm(names, "spot")
    argv = [a for a in tpu_vm.create_vm(vm).argv[1:] if not a.startswith("--provisioning-model")]
    result = cli.gcloud(*argv)
    assert result.code == 1
    assert (
        "One of [--provisioning-model, --max-run-duration, --termination-time] must be supplied: "
        "required with argument `--instance-termination-action`." in result.err
    )
    both = cli.gcloud(
        *tpu_vm.create_vm(_vm(names, "flex-start")).argv[1:], "--termination-time=2027-01-01T00:00:00Z"
    )
    assert both.code == 1
    assert "Must specify exactly one of --max-run-duration or --termination-time" in both.err


# ============================================ capacity a zone cannot give (setting tpu_capacity_out)
@pytest.fixture
def out_of_capacity(cli: Cli, names: dict[str, str]) -> Iterator[str]:
    """Spot is out of quota and flex-start and on-demand out of stock in the test's zone."""
    zone = names["zone"]
    update_settings(
        cli.layout,
        tpu_capacity_out={
            f"{zone}/spot": "quota",
            f"{zone}/flex-start": "stockout",
            f"{zone}/on-demand": "stockout",
        },
        region_quotas={**SandboxSettings().region_quotas, "PREEMPTIBLE_TPU_V6E": 0.0},
    )
    try:
        yield zone
    finally:
        update_settings(cli.layout, tpu_capacity_out={}, region_quotas=dict(SandboxSettings().region_quotas))


def test_a_stockout_fails_the_create_as_compute_engine_does(
    cli: Cli, names: dict[str, str], out_of_capacity: str
) -> None:
    for capacity in ("flex-start", "on-demand"):
        vm = _vm(names, capacity)
        result = cli.gcloud(*tpu_vm.create_vm(vm).argv[1:])
        assert result.code == 1
        track = "alpha." if capacity == "flex-start" else ""
        assert result.err == (
            f"ERROR: (gcloud.{track}compute.instances.create) Could not fetch resource:\n"
            f" - The zone 'projects/{names['project']}/zones/{out_of_capacity}' does not have enough "
            "resources available to fulfill the request.  Try a different zone, or try again later.\n"
        )
        assert f"{names['project']}/{out_of_capacity}/{vm.vm_name}" not in cli.state("vms")
        assert classify_failure(result.err) is FailureKind.CAPACITY


def test_a_quota_refusal_names_the_preemptible_tpu_quota(
    cli: Cli, names: dict[str, str], out_of_capacity: str
) -> None:
    vm = _vm(names, "spot")
    result = cli.gcloud(*tpu_vm.create_vm(vm).argv[1:])
    assert result.code == 1
    region = out_of_capacity.rsplit("-", 1)[0]
    assert result.err.startswith(
        "ERROR: (gcloud.compute.instances.create) Could not fetch resource:\n"
        f" - Quota 'PREEMPTIBLE_TPU_V6E' exceeded.  Limit: 0.0 in region {region}.\n"
        "\tmetric name = compute.googleapis.com/preemptible_tpu_v6e\n"
    ), result.err
    assert f"{names['project']}/{out_of_capacity}/{vm.vm_name}" not in cli.state("vms")
    assert classify_failure(result.err) is FailureKind.CAPACITY


def test_a_cpu_vm_is_not_a_tpu_capacity_kind(cli: Cli, names: dict[str, str], out_of_capacity: str) -> None:
    vm = CpuVmSpec(
        project=names["project"],
        zone=out_of_capacity,
        vm_name=f"cpu-{names['cluster']}",
        bucket=names["bucket"],
    )
    assert cli.gcloud(*tpu_vm.create_cpu_vm(vm).argv[1:]).code == 0


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ({"us-east5-b/preemptible": "stockout"}, "is not <zone>/<one of"),
        ({"us-east5-b/on-demand": "quota"}, "can be stockout, not 'quota'"),
        ({"us-east5-b/reservation": "stockout"}, "a full reservation is its count in reservations"),
    ],
)
def test_the_setting_refuses_what_it_cannot_model(entry: dict[str, str], said: str) -> None:
    with pytest.raises(ValueError, match=said):
        check_setting(entry)
