"""The single-host pipeline's commands (render/tpu_vm.py): the TPU VM's create argv of each capacity.

The stage scripts and the VM commands against the tutorial's own text are
tests/golden/test_tpu_vm_tutorial.py; what a first real run needs of them (one kept SSH key, the VM's
service account granted), tests/render/test_plan.py."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_tpu_rl.render import tpu_vm
from airflow_provider_tpu_rl.render.plan import tpu_vm_plan
from airflow_provider_tpu_rl.spec import tpu_vm_pipeline_from_conf

VM_CONF = {"project": "tpu-proj-123", "zone": "us-east5-b", "vm_name": "llama-vm", "bucket": "rl-bucket-1"}
COMMON = [
    "--zone=us-east5-b",
    "--project=tpu-proj-123",
    "--machine-type=ct6e-standard-8t",
    "--image-project=ubuntu-os-accelerator-images",
    "--image-family=ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e",
    "--boot-disk-size=200GB",
]
# the golden argv of each capacity (before the service account, scopes and labels)
CREATE = {
    "on-demand": [
        "gcloud", "compute", "instances", "create", "llama-vm", *COMMON,
        "--maintenance-policy=TERMINATE",
        "--provisioning-model=STANDARD",
        "--reservation-affinity=none",
    ],
    "reservation": [
        "gcloud", "compute", "instances", "create", "llama-vm", *COMMON,
        "--maintenance-policy=TERMINATE",
        "--instance-termination-action=DELETE",
        "--provisioning-model=RESERVATION_BOUND",
        "--reservation-affinity=specific",
        "--reservation=v6e8-res",
    ],
    "spot": [
        "gcloud", "compute", "instances", "create", "llama-vm", *COMMON,
        "--maintenance-policy=TERMINATE",
        "--provisioning-model=SPOT",
        "--instance-termination-action=STOP",
    ],
    "flex-start": [
        "gcloud", "alpha", "compute", "instances", "create", "llama-vm", *COMMON,
        "--maintenance-policy=TERMINATE",
        "--provisioning-model=FLEX_START",
        "--max-run-duration=72h",
        "--instance-termination-action=DELETE",
        "--reservation-affinity=none",
    ],
}  # fmt: skip


def _vm_pipeline(capacity: str, **conf: Any) -> Any:
    reservation = "v6e8-res" if capacity == "reservation" else ""
    return tpu_vm_pipeline_from_conf({**VM_CONF, "capacity": capacity, "reservation": reservation, **conf})


@pytest.mark.parametrize("capacity", list(CREATE))
def test_the_tpu_vm_create_of_each_capacity(capacity: str) -> None:
    create = tpu_vm.create_vm(_vm_pipeline(capacity).vm)
    assert list(create.argv) == [*CREATE[capacity], "--scopes=cloud-platform"]


def test_the_plan_creates_the_tpu_vm_with_its_capacity() -> None:
    (create,) = [s.command for s in tpu_vm_plan(_vm_pipeline("spot")) if s.task_id == "create_vm"][:1]
    assert "--provisioning-model=SPOT" in create.argv
    assert "spot capacity" in create.description


def test_the_flex_start_run_time_is_max_vm_hours() -> None:
    create = tpu_vm.create_vm(_vm_pipeline("flex-start", max_vm_hours=100).vm)
    assert "--max-run-duration=100h" in create.argv


def test_the_tpu_vm_defaults_to_on_demand() -> None:
    create = tpu_vm.create_vm(tpu_vm_pipeline_from_conf(VM_CONF).vm)
    assert list(create.argv) == [*CREATE["on-demand"], "--scopes=cloud-platform"]
    assert create.description.endswith("on-demand capacity)")
