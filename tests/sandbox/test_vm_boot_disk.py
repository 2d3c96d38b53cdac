"""The fake gcloud's boot disk types (``clis/gcloud/compute_instances.py`` ``BOOT_DISK_TYPES_TAKEN``):
a create with a type the machine series does not take is refused as the API refuses incompatible
features, the disk keeps the type it was given (``compute disks describe``), and the provider's
rendered creates get the type each series takes, never the API's pd-standard default."""

from __future__ import annotations

import json

import pytest

from airflow_provider_tpu_rl.render import boot_image, tpu_vm
from airflow_provider_tpu_rl.spec import tpu_vm_pipeline_from_conf
from tests.sandbox.conftest import Cli


def _create(cli: Cli, names: dict[str, str], vm: str, machine_type: str, *extra: str) -> object:
    return cli.gcloud(
        "compute", "instances", "create", vm, f"--zone={names['zone']}", f"--project={names['project']}",
        f"--machine-type={machine_type}", "--image-project=ubuntu-os-cloud", "--image-family=ubuntu-2204-lts",
        *extra,
    )  # fmt: skip


def _disk_type(cli: Cli, names: dict[str, str], disk: str) -> str:
    described = cli.gcloud(
        "compute", "disks", "describe", disk, f"--zone={names['zone']}", f"--project={names['project']}",
        "--format=json",
    )  # fmt: skip
    assert described.code == 0, described.text
    return str(json.loads(described.out)["type"]).rsplit("/", 1)[-1]


@pytest.mark.parametrize(
    ("machine_type", "disk_type"),
    [
        ("n4-standard-8", "pd-standard"),  # N4: Hyperdisk only
        ("ct6e-standard-8t", "pd-balanced"),  # v6e: no Persistent Disk
        ("n2-standard-8", "hyperdisk-balanced"),  # N2: no Hyperdisk Balanced
        ("c3-standard-8", "pd-standard"),
    ],
)
def test_a_disk_type_the_series_does_not_take_is_refused(
    cli: Cli, names: dict[str, str], machine_type: str, disk_type: str
) -> None:
    refused = _create(cli, names, "vm-1", machine_type, f"--boot-disk-type={disk_type}")
    assert refused.code == 1  # type: ignore[attr-defined]
    assert (
        f"Could not fetch resource:\n - [{disk_type}, {machine_type}] features are not compatible for creating instance."
    ) in refused.err  # type: ignore[attr-defined]
    listed = cli.gcloud("compute", "instances", "list", f"--project={names['project']}", "--format=json")
    assert json.loads(listed.out or "[]") == []  # nothing was created


def test_the_disk_keeps_its_type_and_the_default_is_pd_standard(cli: Cli, names: dict[str, str]) -> None:
    """The type given is the disk's; without the flag a series that takes Persistent Disk gets the
    API's documented pd-standard; the instance's ``disks[]`` names the disk, not its type."""
    made = _create(cli, names, "fast", "n2-standard-8", "--boot-disk-type=pd-balanced")
    assert made.code == 0, made.text  # type: ignore[attr-defined]
    assert _disk_type(cli, names, "fast") == "pd-balanced"
    made = _create(cli, names, "slow", "n2-standard-8")
    assert made.code == 0, made.text  # type: ignore[attr-defined]
    assert _disk_type(cli, names, "slow") == "pd-standard"
    described = cli.gcloud(
        "compute", "instances", "describe", "fast", f"--zone={names['zone']}", f"--project={names['project']}",
        "--format=json",
    )  # fmt: skip
    (disk,) = json.loads(described.out)["disks"]
    assert (disk["boot"], disk["type"], disk["source"].rsplit("/", 2)[-2:]) == (
        True,
        "PERSISTENT",
        ["disks", "fast"],
    )
    assert "diskType" not in disk
    gone = cli.gcloud(
        "compute", "disks", "describe", "nope", f"--zone={names['zone']}", f"--project={names['project']}"
    )
    assert gone.code == 1
    assert (
        f"The resource 'projects/{names['project']}/zones/{names['zone']}/disks/nope' was not found"
        in gone.err
    )


@pytest.mark.parametrize(
    ("cpu_machine_type", "disk_type"), [(None, "pd-balanced"), ("n4-highmem-32", "hyperdisk-balanced")]
)
def test_the_providers_cpu_and_bake_vms_get_their_series_disk_type(
    cli: Cli, names: dict[str, str], cpu_machine_type: str | None, disk_type: str
) -> None:
    """The rendered CPU VM and bake VM creates pass the sandbox and their disks are of the type their
    series takes (without the flag the n2 CPU VM's disk would be the slow pd-standard)."""
    conf = {
        "project": names["project"],
        "zone": names["zone"],
        "vm_name": "llama-vm",
        "bucket": "rl-bucket-1",
    }
    pipeline = tpu_vm_pipeline_from_conf(
        {**conf, **({"cpu_machine_type": cpu_machine_type} if cpu_machine_type else {})}
    )
    created = cli.gcloud(*tpu_vm.create_cpu_vm(pipeline.cpu_vm).argv[1:])
    assert created.code == 0, created.text
    assert _disk_type(cli, names, pipeline.cpu_vm.vm_name) == disk_type
    bake = pipeline.bake_vm
    created = cli.gcloud(*boot_image.create_bake_vm(bake, None).argv[1:])
    assert created.code == 0, created.text
    assert _disk_type(cli, names, bake.vm_name) == "pd-balanced"
