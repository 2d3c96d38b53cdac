"""The preflight's pure core: required APIs and permissions, reservation arithmetic, one-line problems."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from airflow_provider_tpu_rl.spec import preflight
from airflow_provider_tpu_rl.spec.errors import SpecError
from airflow_provider_tpu_rl.spec.presets import Runner

PROJECT = "my-tpu-project"
PERMISSION = re.compile(r"^[a-z][a-zA-Z0-9-]*(?:\.[a-zA-Z0-9]+){2,}$")


def _specific(count: Any, in_use: Any, machine_type: str, status: str = "READY") -> dict[str, Any]:
    """A reservation as ``gcloud compute reservations describe --format=json`` prints it (int64 as strings)."""
    return {
        "kind": "compute#reservation",
        "name": "res-1",
        "status": status,
        "zone": "https://www.googleapis.com/compute/v1/projects/p/zones/us-east5-b",
        "specificReservationRequired": True,
        "specificReservation": {
            "count": count,
            "inUseCount": in_use,
            "instanceProperties": {"machineType": machine_type},
        },
    }


def _aggregate(reserved: int, in_use: int, family: str = preflight.V6E_VM_FAMILY) -> dict[str, Any]:
    accelerator = "projects/p/zones/us-east5-b/acceleratorTypes/ct6e"
    return {
        "name": "tpu-res",
        "status": "READY",
        "aggregateReservation": {
            "vmFamily": family,
            "workloadType": "BATCH",
            "reservedResources": [
                {"accelerator": {"acceleratorCount": reserved, "acceleratorType": accelerator}}
            ],
            "inUseResources": [{"accelerator": {"acceleratorCount": in_use, "acceleratorType": accelerator}}],
        },
    }


# -- required APIs and permissions ---------------------------------------------------------------
def test_every_runner_has_services_and_permissions_with_real_looking_names() -> None:
    for runner in Runner:
        services = preflight.REQUIRED_SERVICES[runner]
        assert services
        assert len(set(services)) == len(services)
        assert all(preflight.service_name(s) == s and s.endswith(".googleapis.com") for s in services)
        permissions = preflight.REQUIRED_PERMISSIONS[runner]
        assert permissions
        for permission, role in permissions.items():
            assert PERMISSION.fullmatch(permission), permission
            assert "*" not in permission  # testIamPermissions refuses wildcards
            assert role.startswith("roles/"), (permission, role)


def test_gke_needs_what_its_modules_and_gcluster_job_need() -> None:
    gke = set(preflight.REQUIRED_SERVICES[Runner.GKE])
    # module metadata (container, compute, iam, storage) and cmd/job/prereq.go (artifactregistry)
    assert {
        "container.googleapis.com",
        "compute.googleapis.com",
        "iam.googleapis.com",
        "storage.googleapis.com",
        "artifactregistry.googleapis.com",
        "secretmanager.googleapis.com",
    } <= gke
    permissions = preflight.REQUIRED_PERMISSIONS[Runner.GKE]
    assert permissions["container.clusters.create"] == "roles/container.admin"
    assert permissions["iam.serviceAccounts.actAs"] == "roles/iam.serviceAccountUser"
    assert permissions["serviceusage.services.list"] == "roles/serviceusage.serviceUsageConsumer"


def test_the_tpu_vm_runner_creates_a_compute_instance_not_a_gke_cluster() -> None:
    permissions = preflight.REQUIRED_PERMISSIONS[Runner.TPU_VM]
    assert "compute.instances.create" in permissions
    assert "compute.projects.setCommonInstanceMetadata" in permissions  # gcloud compute ssh's key
    assert not any(p.startswith("container.") for p in permissions)
    assert "container.googleapis.com" not in preflight.REQUIRED_SERVICES[Runner.TPU_VM]


def test_only_the_gke_runner_needs_the_gke_admin_role() -> None:
    assert "roles/container.admin" in preflight.REQUIRED_PERMISSIONS[Runner.GKE].values()
    assert "roles/container.admin" not in preflight.REQUIRED_PERMISSIONS[Runner.TPU_VM].values()


def test_runner_names() -> None:
    assert preflight.runner("gke") is Runner.GKE
    assert preflight.runner("tpu_vm") is Runner.TPU_VM
    with pytest.raises(SpecError, match="runner: must be one of"):
        preflight.runner("slurm")


@pytest.mark.parametrize("bad", ["compute", "Compute.googleapis.com", "tpu googleapis.com", ""])
def test_service_names_are_checked(bad: str) -> None:
    with pytest.raises(SpecError, match="required_services"):
        preflight.service_name(bad)


@pytest.mark.parametrize("bad", ["compute.*", "storage.buckets", "compute.instances.create ", ""])
def test_permission_names_are_checked(bad: str) -> None:
    with pytest.raises(SpecError, match="required_permissions"):
        preflight.permission_name(bad)


def test_missing_services_keeps_the_required_order() -> None:
    required = ("b.googleapis.com", "a.googleapis.com", "c.googleapis.com", "a.googleapis.com")
    assert preflight.missing_services(required, ["c.googleapis.com"]) == [
        "b.googleapis.com",
        "a.googleapis.com",
    ]
    assert (
        preflight.missing_services(required, [" a.googleapis.com", "b.googleapis.com", "c.googleapis.com"])
        == []
    )


def test_missing_permissions() -> None:
    required = {"a.b.c": "roles/x", "d.e.f": "roles/y", "g.h.i": "roles/x"}
    assert preflight.missing_permissions(required, {"d.e.f"}) == ["a.b.c", "g.h.i"]
    assert preflight.missing_permissions(required, iter(["a.b.c", "d.e.f", "g.h.i", "z.z.z"])) == []


def test_enabled_services_are_read_from_gcloud_value_output() -> None:
    lines = [
        "WARNING: Some warning on stderr",
        "compute.googleapis.com",
        "",
        "  storage.googleapis.com  ",
        "Listed 0 items.",
    ]
    assert preflight.parse_enabled_services(lines) == ["compute.googleapis.com", "storage.googleapis.com"]


# -- one line per problem ------------------------------------------------------------------------
def test_a_missing_api_names_the_enable_command() -> None:
    line = preflight.service_problem(PROJECT, "tpu.googleapis.com")
    assert "\n" not in line
    assert "gcloud services enable tpu.googleapis.com --project=my-tpu-project" in line


def test_missing_permissions_are_one_line_per_role_to_grant() -> None:
    roles = dict(preflight.REQUIRED_PERMISSIONS[Runner.GKE])
    missing = ["container.clusters.create", "container.clusters.delete", "iam.serviceAccounts.actAs"]
    lines = preflight.permission_problems(
        PROJECT, missing, roles, "serviceAccount:sa@p.iam.gserviceaccount.com"
    )
    assert len(lines) == 2
    assert all("\n" not in line for line in lines)
    container, act_as = lines
    assert "container.clusters.create, container.clusters.delete" in container
    assert "--role=roles/container.admin" in container
    assert "--member=serviceAccount:sa@p.iam.gserviceaccount.com" in container
    assert "--condition=None" in container
    assert "iam.serviceAccounts.actAs" in act_as
    assert "roles/iam.serviceAccountUser" in act_as


def test_a_permission_without_a_known_role_still_gets_its_line() -> None:
    (line,) = preflight.permission_problems(PROJECT, ["x.y.z"], {"x.y.z": ""})
    assert "x.y.z" in line
    assert "CALLER" not in line
    assert "\n" not in line


def test_failure_message_summarises_then_lists_each_problem_on_one_line() -> None:
    message = preflight.failure_message(["first", "second\n  spread over\n\nlines"])
    assert message.splitlines() == [
        "preflight: 2 problems before anything is created:",
        "- first",
        "- second spread over lines",
    ]
    assert preflight.failure_message(["only"]).splitlines()[0] == (
        "preflight: 1 problem before anything is created:"
    )


# -- reservations ----------------------------------------------------------------------------------
def test_a_4x8_slice_of_4_chip_vms_takes_8_vms() -> None:
    need = preflight.ReservationNeed.for_slices("ct6e-standard-4t", "4x8", 1)
    assert (need.machine_type, need.vms, need.chips) == ("ct6e-standard-4t", 8, 32)


def test_a_2x4_slice_on_one_8_chip_vm_takes_1_vm() -> None:
    need = preflight.ReservationNeed.for_slices("ct6e-standard-8t", "2x4")
    assert (need.vms, need.chips) == (1, 8)


def test_slices_multiply_the_vms() -> None:
    assert preflight.ReservationNeed.for_slices("ct6e-standard-4t", "4x8", 3).vms == 24
    assert preflight.ReservationNeed.for_slices("ct6e-standard-4t", "4x4", 2).vms == 8


def test_an_impossible_shape_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match="topology"):
        preflight.ReservationNeed.for_slices("ct6e-standard-8t", "4x8")
    with pytest.raises(SpecError, match="num_slices"):
        preflight.ReservationNeed.for_slices("ct6e-standard-4t", "4x8", 0)


def test_a_ready_reservation_with_room_has_no_problem() -> None:
    need = preflight.ReservationNeed.for_slices("ct6e-standard-4t", "4x8", 2)
    assert preflight.reservation_problems(need, _specific("20", "4", "ct6e-standard-4t")) == []
    # integers, and a machine type given as a URL, read the same
    url = "https://www.googleapis.com/compute/v1/projects/p/zones/z/machineTypes/ct6e-standard-4t"
    assert preflight.reservation_problems(need, _specific(16, 0, url)) == []


def test_a_reservation_smaller_than_the_slices_is_one_line_with_the_numbers() -> None:
    need = preflight.ReservationNeed.for_slices("ct6e-standard-4t", "4x8", 2)
    (line,) = preflight.reservation_problems(need, _specific("12", "0", "ct6e-standard-4t"))
    assert "\n" not in line
    assert "reserves 12 ct6e-standard-4t VMs, the run needs 16" in line


def test_capacity_in_use_is_a_note_not_a_problem() -> None:
    """What is in use may be this run's own VMs from an earlier try: a retry must not be refused."""
    need = preflight.ReservationNeed.for_slices("ct6e-standard-4t", "4x8", 1)
    busy = _specific("8", "1", "ct6e-standard-4t")
    assert preflight.reservation_problems(need, busy) == []
    note = preflight.reservation_in_use_note(need, busy)
    assert note is not None
    assert "7 free VMs now (8 reserved, 1 in use), the run needs 8" in note
    assert preflight.reservation_in_use_note(need, _specific("8", "0", "ct6e-standard-4t")) is None


def test_a_reservation_of_another_machine_type_is_refused() -> None:
    need = preflight.ReservationNeed.for_slices("ct6e-standard-8t", "2x4")
    (line,) = preflight.reservation_problems(need, _specific("4", "0", "ct6e-standard-4t"))
    assert "reserves ct6e-standard-4t VMs, the run needs ct6e-standard-8t" in line


def test_a_reservation_not_ready_is_refused() -> None:
    need = preflight.ReservationNeed.for_slices("ct6e-standard-8t", "2x4")
    (line,) = preflight.reservation_problems(need, _specific("1", "0", "ct6e-standard-8t", status="CREATING"))
    assert "is CREATING, not READY" in line


def test_aggregate_tpu_reservations_count_chips() -> None:
    need = preflight.ReservationNeed.for_slices("ct6e-standard-4t", "4x8", 2)  # 64 chips
    assert preflight.reservation_problems(need, _aggregate(64, 0)) == []
    assert preflight.reservation_problems(need, _aggregate(64, 8)) == []
    note = preflight.reservation_in_use_note(need, _aggregate(64, 8))
    assert note is not None
    assert "56 free v6e chips now (64 reserved, 8 in use), the run needs 64" in note
    (line,) = preflight.reservation_problems(need, _aggregate(32, 0))
    assert "reserves 32 v6e chips, the run needs 64" in line
    (line,) = preflight.reservation_problems(need, _aggregate(256, 0, "VM_FAMILY_CLOUD_TPU_POD_SLICE_CT5P"))
    assert "VM_FAMILY_CLOUD_TPU_POD_SLICE_CT5P" in line


def test_a_reservation_without_vms_or_chips_is_refused() -> None:
    need = preflight.ReservationNeed.for_slices("ct6e-standard-8t", "2x4")
    (line,) = preflight.reservation_problems(need, {"name": "r", "status": "READY"})
    assert "reserves no VMs or TPU chips" in line


def test_not_found_names_zone_and_project() -> None:
    line = preflight.reservation_not_found_problem(PROJECT, "us-east5-b", "res-9")
    assert "res-9" in line
    assert "us-east5-b" in line
    assert PROJECT in line
    assert "\n" not in line


def test_the_reservation_json_is_found_after_warnings() -> None:
    document = _specific("8", "0", "ct6e-standard-4t")
    lines = ["WARNING: something", *json.dumps(document, indent=2).splitlines()]
    assert preflight.parse_json_document(lines) == document
    assert preflight.parse_json_document(["ERROR: nothing"]) is None


# ---------------------------------------------------------------- the TPU VM's network, SSH, OS Login
def _fw(name: str, **fields: Any) -> dict[str, Any]:
    rule: dict[str, Any] = {
        "name": name,
        "network": "https://www.googleapis.com/compute/v1/projects/p/global/networks/default",
        "direction": "INGRESS",
        "priority": 1000,
        "sourceRanges": ["0.0.0.0/0"],
        "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
    }
    rule.update(fields)
    return rule


def test_ssh_allowing_rule_reads_the_compute_api_firewall_rules() -> None:
    internal = _fw(
        "default-allow-internal",
        sourceRanges=["10.128.0.0/9"],
        allowed=[{"IPProtocol": "tcp", "ports": ["0-65535"]}],
    )
    assert preflight.ssh_allowing_rule([_fw("ssh")], "default") == "ssh"
    assert preflight.ssh_allowing_rule([internal], "default") is None  # private sources only
    assert preflight.ssh_allowing_rule([_fw("iap", sourceRanges=["35.235.240.0/20"])], "default") is None
    assert preflight.ssh_allowing_rule([_fw("all", allowed=[{"IPProtocol": "all"}])], "default") == "all"
    assert preflight.ssh_allowing_rule([_fw("no-source", sourceRanges=[])], "default") == "no-source"
    for other in (
        _fw("rdp", allowed=[{"IPProtocol": "tcp", "ports": ["3389"]}]),
        _fw("udp", allowed=[{"IPProtocol": "udp", "ports": ["22"]}]),
        _fw("off", disabled=True),
        _fw("egress", direction="EGRESS"),
        _fw("tagged", targetTags=["ssh"]),
        _fw("sa", targetServiceAccounts=["a@p.iam.gserviceaccount.com"]),
        _fw("elsewhere", network="projects/p/global/networks/other"),
    ):
        assert preflight.ssh_allowing_rule([other], "default") is None, other["name"]
    deny = _fw("deny", allowed=None, denied=[{"IPProtocol": "tcp"}], priority=1000)
    assert preflight.ssh_allowing_rule([_fw("ssh"), deny], "default") is None  # deny wins a tie
    assert preflight.ssh_allowing_rule([_fw("ssh", priority=900), deny], "default") == "ssh"


def test_ssh_allowing_rule_covers_every_given_source_range() -> None:
    rule = _fw("office", sourceRanges=["198.51.100.0/24"])
    assert preflight.ssh_allowing_rule([rule], "default", ["198.51.100.7/32"]) == "office"
    assert preflight.ssh_allowing_rule([rule], "default", ["198.51.100.7/32", "203.0.113.0/28"]) is None
    assert preflight.ssh_source_ranges(["198.51.100.7"]) == ("198.51.100.7/32",)
    with pytest.raises(SpecError, match="ssh_source_ranges"):
        preflight.ssh_source_ranges(["not-a-range"])


def test_ssh_source_ranges_given_as_one_string_are_read_as_gcloud_reads_them() -> None:
    """A rendered template is a string: one range, or several separated by commas, never its
    characters (``"203.0.113.0/24"`` used to become 0.0.0.2/32, 0.0.0.0/32, ...)."""
    assert preflight.ssh_source_ranges("203.0.113.0/24") == ("203.0.113.0/24",)
    assert preflight.ssh_source_ranges("203.0.113.0/24, 198.51.100.7") == (
        "203.0.113.0/24",
        "198.51.100.7/32",
    )
    assert preflight.ssh_source_ranges(("203.0.113.0/24",)) == ("203.0.113.0/24",)
    assert preflight.ssh_source_ranges("") == preflight.ssh_source_ranges(None) == ()


@pytest.mark.parametrize(
    "value",
    [24, 3.5, True, {"range": "203.0.113.0/24"}, ["203.0.113.0/24", 7], [["203.0.113.0/24"]], "a,\nb"],
)
def test_ssh_source_ranges_of_another_type_are_refused_in_one_line(value: object) -> None:
    """A number used to raise TypeError (not iterable); a non-string item was str()-ed."""
    with pytest.raises(SpecError) as refused:
        preflight.ssh_source_ranges(value)
    message = str(refused.value)
    assert message.startswith("ssh_source_ranges: ")
    assert "\n" not in message


def test_ssh_problem_names_the_firewall_rule_to_create() -> None:
    line = preflight.ssh_firewall_problem("p", "default", ["203.0.113.0/28"])
    assert line.endswith(
        "gcloud compute firewall-rules create tpu-rl-allow-ssh --project=p --network=default "
        "--direction=INGRESS --allow=tcp:22 --source-ranges=203.0.113.0/28"
    )
    assert "--source-ranges=35.235.240.0/20" in preflight.ssh_firewall_problem("p", "default", iap=True)


def test_os_login_is_read_from_the_projects_metadata_as_gcloud_reads_it() -> None:
    def info(*items: tuple[str, str]) -> dict[str, Any]:
        return {"commonInstanceMetadata": {"items": [{"key": k, "value": v} for k, v in items]}}

    assert preflight.os_login_enabled(info(("enable-oslogin", "TRUE")))
    assert preflight.os_login_enabled(info(("enable-oslogin", "true"), ("enable-oslogin", "FALSE")))
    assert not preflight.os_login_enabled(info(("enable-oslogin", "FALSE")))
    assert not preflight.os_login_enabled(info(("ssh-keys", "u:ssh-rsa AAAA u")))
    assert not preflight.os_login_enabled({})


def test_the_os_login_permission_line_says_why() -> None:
    (line,) = preflight.permission_problems(
        "p",
        [preflight.OS_ADMIN_LOGIN],
        {preflight.OS_ADMIN_LOGIN: preflight.OS_ADMIN_LOGIN_ROLE},
        reasons={preflight.OS_ADMIN_LOGIN_ROLE: preflight.os_login_reason("p")},
    )
    assert line.startswith(
        "the caller lacks compute.instances.osAdminLogin on project p (OS Login is enforced"
    )
    assert "--role=roles/compute.osAdminLogin" in line


def test_enabled_secret_versions_are_the_enabled_numbered_ones_ascending() -> None:
    listed = [
        "WARNING: a line gcloud may print first",
        json.dumps(
            [
                {"name": "projects/1/secrets/hf/versions/10", "state": "ENABLED"},
                {"name": "projects/1/secrets/hf/versions/2", "state": "ENABLED"},
                {"name": "projects/1/secrets/hf/versions/3", "state": "DISABLED"},
                {"name": "projects/1/secrets/hf/versions/4", "state": "DESTROYED"},
                {"name": "projects/1/secrets/hf/versions/latest", "state": "ENABLED"},
                "not a version",
            ]
        ),
    ]
    assert preflight.enabled_secret_versions(listed) == [2, 10]
    assert preflight.enabled_secret_versions(["[]"]) == []
    assert preflight.enabled_secret_versions(["ERROR: (gcloud.secrets.versions.list) NOT_FOUND"]) == []


@pytest.mark.parametrize(
    ("machine_type", "expected"),
    [
        ("n2-standard-8", ("N2_CPUS", 8)),
        ("n2-highmem-32", ("N2_CPUS", 32)),
        ("n2d-highcpu-16", ("N2D_CPUS", 16)),
        ("n1-standard-4", ("CPUS", 4)),
        ("n4-standard-64", ("N4_CPUS", 64)),
        ("e2-standard-8", None),  # a series whose metric no source we read names
        ("n2-custom-8-65536", None),  # a custom machine type
        ("ct6e-standard-8t", None),  # the TPU VM: not counted
    ],
)
def test_a_machine_types_vcpu_quota_is_read_from_its_series_and_name(
    machine_type: str, expected: tuple[str, int] | None
) -> None:
    assert preflight.machine_vcpus(machine_type) == expected


def test_cpu_vms_at_once_add_up_per_series_and_in_all() -> None:
    regional, total, notes = preflight.cpu_vm_quota_needs(["n2-standard-8", "n2-highmem-32", "e2-standard-4"])
    assert (regional, total) == ({"N2_CPUS": 40}, 40)
    assert notes == ["the vCPU quota of machine type e2-standard-4 is not known: not checked"]
    # beside the TPU's own quota, in one mapping
    assert preflight.quota_needs(Runner.TPU_VM, "spot", 8, ["n2-standard-8", "n2-highmem-32"]) == {
        "PREEMPTIBLE_TPU_V6E": 8,
        "N2_CPUS": 40,
    }


def test_a_project_quota_line_says_all_regions_and_what_takes_it() -> None:
    what = preflight.cpu_vms_taking(["n2-highmem-32"])
    problems, notes = preflight.quota_problems(
        "p",
        None,
        {"CPUS_ALL_REGIONS": 32},
        {"quotas": [{"metric": "CPUS_ALL_REGIONS", "limit": 32.0, "usage": 8.0}]},
        what,
    )
    assert problems == [
        "quota CPUS_ALL_REGIONS in project p (all regions) has 24 free (limit 32, in use 8); the run needs 32 "
        "(its CPU VM n2-highmem-32): request more (IAM & Admin > Quotas) or delete VMs the project no longer needs"
    ]
    assert notes == []
