"""``create_vm`` with spot and flex-start capacity against the sandbox: the VM is created with the
capacity's scheduling, no reservation is consumed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from airflow_provider_tpu_rl.operators.gke import EnsureBucketOperator, HfTokenSecretOperator
from airflow_provider_tpu_rl.operators.tpu_vm import TpuVmCreateOperator
from airflow_provider_tpu_rl.spec import TPU_VM_DAG_ID
from tests.support.sandbox_run import SandboxRun

RUN_ID = "manual__2026-03-02T00:00:00+00:00"
START = datetime(2030, 1, 1, tzinfo=UTC)
SCHEDULING = {
    "spot": {"provisioningModel": "SPOT", "instanceTerminationAction": "STOP", "maxRunDuration": None},
    "flex-start": {
        "provisioningModel": "FLEX_START",
        "instanceTerminationAction": "DELETE",
        "maxRunDuration": "72h",
    },
}


def _execute(sb: SandboxRun, factory: Any, conf: dict[str, Any], **kwargs: Any) -> Any:
    op = sb.operator(factory, dag_id=TPU_VM_DAG_ID, **kwargs)
    return op.execute(sb.context(op, conf, run_id=RUN_ID, start_date=START))


@pytest.mark.parametrize("capacity", ["spot", "flex-start"])
def test_create_vm_with_spot_or_flex_start_capacity(sb: SandboxRun, capacity: str) -> None:
    conf = sb.tpu_vm_conf(capacity=capacity, reservation="")
    _execute(sb, EnsureBucketOperator, conf, task_id="ensure_bucket")
    _execute(sb, HfTokenSecretOperator, conf, task_id="sync_hf_token")

    assert _execute(sb, TpuVmCreateOperator, conf, task_id="create_vm") == sb.vm

    record = sb.state("vms")[f"{sb.project}/{conf['zone']}/{sb.vm}"]
    scheduling = {key: record["scheduling"][key] for key in SCHEDULING[capacity]}
    assert scheduling == SCHEDULING[capacity]
    assert record["reservationAffinity"]["reservation"] is None
    (create,) = [c["argv"] for c in sb.calls() if "create" in c["argv"][:4] and sb.vm in c["argv"]]
    assert (create[0] == "alpha") == (capacity == "flex-start")
