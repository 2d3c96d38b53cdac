"""The TPU VM's spot and flex-start creates through the fake gcloud, as strict as gcloud 528.

``surface/compute/instances/create.py``: ``--provisioning-model=FLEX_START`` exists on the alpha
track only (``support_flex_start``); ``command_lib/compute/instances/flags.py``
ValidateInstanceScheduling: ``--instance-termination-action`` needs a provisioning model, a max
run duration or a termination time, and the last two exclude each other.
"""

from __future__ import annotations

from airflow_provider_tpu_rl.render import tpu_vm
from airflow_provider_tpu_rl.spec.cluster import TpuVmSpec
from tests.sandbox.conftest import Cli


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
