"""The cluster and machine specs built directly (spec/cluster.py): slice shapes, the cluster's derived
names, a job's target (a TPU slice, or a CPU machine on one node)."""

from __future__ import annotations

import dataclasses

import pytest

from airflow_provider_tpu_rl.spec import ClusterSpec, SliceShape, SpecError
from airflow_provider_tpu_rl.spec.cluster import CpuVmSpec, GkeJobTarget, TpuVmSpec, boot_disk_type


@pytest.mark.parametrize(
    ("compute_type", "topology", "chips", "vms"),
    [
        ("ct6e-standard-4t", "4x8", 32, 8),
        ("ct6e-standard-4t", "4x4", 16, 4),
        ("ct6e-standard-4t", "2x2", 4, 1),
        ("ct6e-standard-8t", "2x4", 8, 1),
        ("ct6e-standard-1t", "1x1", 1, 1),
        ("ct6e-standard-4t", "16x16", 256, 64),
    ],
)
def test_slice_shapes(compute_type: str, topology: str, chips: int, vms: int) -> None:
    shape = SliceShape(compute_type, topology)
    assert (shape.chips, shape.vms, shape.tpu_type) == (chips, vms, f"v6e-{chips}")


def test_cluster_spec_can_be_built_directly() -> None:
    spec = ClusterSpec(
        project="proj-123456", region="us-east5", zone="us-east5-b", cluster_name="c1", bucket="bkt"
    )
    assert spec.total_chips == 32
    assert spec.node_pool_service_account == "c1-gke-np-sa@proj-123456.iam.gserviceaccount.com"


def test_a_job_target_is_a_tpu_slice_or_a_cpu_machine_on_one_node() -> None:
    tpu = GkeJobTarget(project="p-123456", location="us-east5", cluster_name="c1", image="gcr.io/p/i:1")
    assert (tpu.tpu, tpu.compute_type, tpu.topology, tpu.node_pool, tpu.service_account) == (
        True, "ct6e-standard-4t", "4x8", "", ""
    )  # fmt: skip
    cpu = tpu.on_cpu()
    assert (cpu.tpu, cpu.compute_type, cpu.topology, cpu.num_slices) == (False, "n4-standard-64", "", 1)
    assert (cpu.node_pool, cpu.service_account) == ("cpu-np", "workload-identity-k8s-sa")
    assert cpu.where == tpu.where  # the same cluster
    with pytest.raises(SpecError, match="topology"):
        dataclasses.replace(cpu, topology="4x8")  # gcluster: no topology for CPU jobs
    with pytest.raises(SpecError, match="num_slices"):
        dataclasses.replace(cpu, num_slices=2)
    with pytest.raises(SpecError, match="node_pool"):
        dataclasses.replace(cpu, node_pool="CPU_NP;")
    with pytest.raises(SpecError, match="compute_type"):
        dataclasses.replace(cpu, compute_type="n4 standard")


@pytest.mark.parametrize(
    ("machine_type", "disk_type"),
    [
        ("ct6e-standard-8t", "hyperdisk-balanced"),  # v6e: no Persistent Disk
        ("n4-highmem-32", "hyperdisk-balanced"),  # N4: Hyperdisk only
        ("n2-highmem-32", "pd-balanced"),  # N2: no Hyperdisk Balanced; not the pd-standard default
        ("n2-standard-8", "pd-balanced"),  # the bake VM
        ("e2-standard-32", "pd-balanced"),
    ],
)
def test_each_machine_series_boots_from_the_disk_type_it_takes(machine_type: str, disk_type: str) -> None:
    assert boot_disk_type("machine_type", machine_type) == disk_type


def test_the_vms_know_their_boot_disk_type_and_refuse_an_unknown_series() -> None:
    """A CPU VM of a series with no known boot disk type is refused in one line naming the field
    and the known series; the TPU VM's and the default CPU VM's types are their series'."""
    vm = TpuVmSpec(
        project="tpu-proj-123", zone="us-east5-b", vm_name="llama-vm", reservation="", bucket="rl-b"
    )
    assert vm.boot_disk_type == "hyperdisk-balanced"
    cpu = CpuVmSpec(project="tpu-proj-123", zone="us-east5-b", vm_name="llama-vm-cpu", bucket="rl-b")
    assert cpu.boot_disk_type == "pd-balanced"
    with pytest.raises(
        SpecError, match=r"cpu_machine_type.*machine series m3 has no known boot disk type"
    ) as err:
        CpuVmSpec(
            project="tpu-proj-123",
            zone="us-east5-b",
            vm_name="llama-vm-cpu",
            bucket="rl-b",
            machine_type="m3-ultramem-32",
        )
    assert "\n" not in str(err.value)
    assert "'n2'" in str(err.value)
