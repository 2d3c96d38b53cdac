"""``preflight``'s (``airflow_provider_tpu_rl.operators.preflight``) paths through the providers, on every Airflow line and provider version the
provider supports: both runners passing with their defaults (the Resource Manager client's
permission check, the kubernetes and GCS hooks), a permission the client finds missing, and the
cluster lease read through the GCS hook, held, and waited for in a ``TimeDeltaTrigger`` deferral.

The preflight's other checks (tests/operators/test_preflight.py) are the provider's own logic over
the same calls: they run on Airflow 3.3 only (the Makefile's ``SAME_ON_EVERY_AIRFLOW``).
"""

from __future__ import annotations

import pytest

from airflow_provider_tpu_rl.compat import AirflowFailException, TaskDeferred
from airflow_provider_tpu_rl.records.lease import ClusterLeaseHook
from airflow_provider_tpu_rl.spec import TPU_VM_DAG_ID
from airflow_provider_tpu_rl.spec.pipeline import GKE_DAG_ID
from tests.operators.test_preflight import (
    OTHER_RUN,
    _created_nothing,
    _gke_preflight,
    _lease_for,
    _refusal,
    _run,
    pf,
)
from tests.support.sandbox_run import SandboxRun
from tpu_rl_sandbox.world.settings import update_settings

__all__ = ["pf"]  # the sandbox fixture of test_preflight.py, shared


def test_the_gke_preflight_passes_with_defaults(pf: SandboxRun) -> None:
    result = _run(pf)
    assert result["runner"] == "gke"
    assert result["reservation"] == "res-1"
    assert result["reservation_vms"] == 8  # v6e-32 (4x8) = 8 ct6e-standard-4t VMs
    assert result["permissions_checked"] > 0
    _created_nothing(pf)


def test_the_tpu_vm_preflight_passes_with_defaults(pf: SandboxRun) -> None:
    result = _run(pf, TPU_VM_DAG_ID)
    assert (result["runner"], result["reservation"], result["reservation_vms"]) == ("tpu_vm", "res-8", 1)
    _created_nothing(pf)


def test_a_missing_permission_is_one_line_naming_the_role(pf: SandboxRun) -> None:
    update_settings(pf.layout, denied_permissions=("compute.instances.create",))
    (line,) = _refusal(pf, TPU_VM_DAG_ID)
    assert "compute.instances.create" in line
    assert "--role=roles/compute.instanceAdmin.v1" in line
    _created_nothing(pf)


def test_a_cluster_leased_by_another_run_is_one_line(pf: SandboxRun) -> None:
    _lease_for(pf, OTHER_RUN)
    operator, context = _gke_preflight(pf)
    with pytest.raises(AirflowFailException) as failed:
        operator.execute(context)
    lines = str(failed.value).splitlines()
    assert len(lines) == 2, lines
    assert lines[1].startswith(f"- cluster {pf.cluster} is in use by run {GKE_DAG_ID}/{OTHER_RUN} until ")
    assert lines[1].endswith(" UTC")


def test_preflight_waits_for_a_held_lease_deferred_and_bounded(
    pf: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__TPU_RL__LEASE_WAIT_MINUTES", "30")
    held = _lease_for(pf, OTHER_RUN)
    operator, context = _gke_preflight(pf)
    with pytest.raises(TaskDeferred) as deferred:
        operator.execute(context)
    assert deferred.value.method_name == "execute_lease_wait"
    deadline = deferred.value.kwargs["deadline"]
    # still held: waits again, until the deadline; past it, the one line
    with pytest.raises(TaskDeferred):
        operator.execute_lease_wait(context, None, deadline=deadline)
    with pytest.raises(AirflowFailException) as failed:
        operator.execute_lease_wait(context, None, deadline=0.0)
    assert str(failed.value).startswith(
        f"cluster {pf.cluster} is in use by run {GKE_DAG_ID}/{OTHER_RUN} until "
    )
    # released: the run goes on
    ClusterLeaseHook().release(pf.bucket, held)
    assert operator.execute_lease_wait(context, None, deadline=deadline)["cluster_lease"] == "free"
