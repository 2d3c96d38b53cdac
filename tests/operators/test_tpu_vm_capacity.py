"""``create_vm`` with spot and flex-start capacity against the sandbox: the VM is created with the
capacity's scheduling, no reservation is consumed; an ordered list of kinds falls through the ones
the zone cannot give, in the same try."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.exceptions import CommandError, FailureKind
from airflow_provider_tpu_rl.operators.gke import EnsureBucketOperator, HfTokenSecretOperator
from airflow_provider_tpu_rl.operators.tpu_vm import CAPACITY_XCOM, TpuVmCreateOperator, vm_create_command
from airflow_provider_tpu_rl.render.gke import resource_record_object
from airflow_provider_tpu_rl.spec import TPU_VM_DAG_ID
from tests.support.sandbox_run import ZONE, RecordingTI, SandboxRun
from tpu_rl_sandbox.world.settings import DEFAULT_RESERVATIONS, SandboxSettings, update_settings

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


# ==================== an ordered capacity list falls through in the same try (issue 56)
FALLBACK = ["reservation", "flex-start", "spot"]


@pytest.fixture
def scarce(sb: SandboxRun) -> Iterator[Callable[..., None]]:
    """Set which kinds the test's zone cannot give (``tpu_capacity_out``; ``full_reservation``:
    res-8 holds no VM); the defaults come back afterwards."""

    def make(out: dict[str, str], *, full_reservation: bool = False) -> None:
        reservations = {key: dict(value) for key, value in DEFAULT_RESERVATIONS.items()}
        if full_reservation:
            reservations[f"{ZONE}/res-8"]["count"] = 0
        update_settings(
            sb.layout,
            tpu_capacity_out={f"{ZONE}/{kind}": why for kind, why in out.items()},
            reservations=reservations,
            region_quotas={**SandboxSettings().region_quotas, "PREEMPTIBLE_TPU_V6E": 0.0},
        )

    try:
        yield make
    finally:
        defaults = SandboxSettings()
        update_settings(
            sb.layout,
            tpu_capacity_out={},
            reservations={key: dict(value) for key, value in DEFAULT_RESERVATIONS.items()},
            region_quotas=dict(defaults.region_quotas),
        )


def _prepared(sb: SandboxRun, conf: dict[str, Any]) -> None:
    _execute(sb, EnsureBucketOperator, conf, task_id="ensure_bucket")
    _execute(sb, HfTokenSecretOperator, conf, task_id="sync_hf_token")


def _creates(sb: SandboxRun) -> list[list[str]]:
    return [c["argv"] for c in sb.calls() if "create" in c["argv"][:4] and sb.vm in c["argv"]]


def test_a_full_reservation_and_a_flex_start_stockout_fall_through_to_spot_in_one_try(
    sb: SandboxRun,
    scarce: Callable[..., None],
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    scarce({"flex-start": "stockout"}, full_reservation=True)
    conf = sb.tpu_vm_conf(capacity=FALLBACK)
    _prepared(sb, conf)
    op = sb.operator(TpuVmCreateOperator, dag_id=TPU_VM_DAG_ID, task_id="create_vm")
    ti = RecordingTI()
    with caplog.at_level(logging.INFO):
        assert op.execute(sb.context(op, conf, run_id=RUN_ID, start_date=START, ti=ti)) == sb.vm

    record = sb.state("vms")[f"{sb.project}/{ZONE}/{sb.vm}"]
    assert record["scheduling"]["provisioningModel"] == "SPOT"
    assert record["reservationAffinity"]["reservation"] is None
    assert len(_creates(sb)) == 3
    # Airflow 3 logs through structlog (stdout), Airflow 2 through logging (caplog)
    logged = caplog.text + capsys.readouterr().out
    refused = re.findall(
        r"Capacity (?:reservation|flex-start|spot|on-demand)\b.*?(?= \[airflow|$)", logged, re.M
    )
    assert len(refused) == 3, refused
    assert refused[0].startswith("Capacity reservation refused: ERROR: (gcloud.compute.instances.create)")
    assert "Specified reservation 'res-8' does not have available resources" in refused[0]
    assert refused[1].startswith(
        "Capacity flex-start refused: ERROR: (gcloud.alpha.compute.instances.create)"
    )
    assert "does not have enough resources available" in refused[1]
    assert refused[2] == f"Capacity spot: TPU VM {sb.vm} created after 2 refused kind(s)"
    assert not any("last output" in line for line in refused)
    served = ti.pulled(CAPACITY_XCOM)
    assert served["served"] == "spot"
    assert [a["capacity"] for a in served["attempts"]] == ["reservation", "flex-start"]
    # the record a train retry re-creates from and the janitor reads names the kind that served
    resource = json.loads(sb.api.download(sb.bucket, resource_record_object(sb.vm)))
    assert (resource["conf"]["capacity"], resource["conf"]["reservation"]) == ("spot", "")
    assert [a["capacity"] for a in resource["capacity_attempts"]] == ["reservation", "flex-start"]
    # what a train retry re-creates a lost (preempted) VM with: the spot create, as a one-kind spot run's
    _, recreate = vm_create_command(
        resource["conf"],
        dag_id=TPU_VM_DAG_ID,
        run_id=RUN_ID,
        machine="tpu",
        expires_at=resource["expires_at"],
    )
    assert "--provisioning-model=SPOT" in recreate.argv
    assert "--instance-termination-action=STOP" in recreate.argv

    # a retry of the create (its grant failed, say): the kind that served is tried first, the VM
    # is this run's and reused, the refusals stay recorded
    again = sb.operator(TpuVmCreateOperator, dag_id=TPU_VM_DAG_ID, task_id="create_vm")
    retry = RecordingTI(try_number=2)
    assert again.execute(sb.context(again, conf, run_id=RUN_ID, start_date=START, ti=retry)) == sb.vm
    assert "--provisioning-model=SPOT" in _creates(sb)[-1]
    assert len(_creates(sb)) == 4
    assert retry.pulled(CAPACITY_XCOM) == served


def test_every_kind_refused_fails_the_create_in_one_line_with_nothing_left(
    sb: SandboxRun, scarce: Callable[..., None]
) -> None:
    scarce({"flex-start": "stockout", "spot": "quota"}, full_reservation=True)
    conf = sb.tpu_vm_conf(capacity=FALLBACK)
    _prepared(sb, conf)
    with pytest.raises(CommandError) as caught:
        _execute(sb, TpuVmCreateOperator, conf, task_id="create_vm")
    line = str(caught.value)
    assert "\n" not in line
    assert caught.value.kind is FailureKind.CAPACITY  # the task's retries may find capacity later
    assert line.startswith(f"TPU VM {sb.vm}: no capacity kind could create it in {ZONE}: reservation: ")
    assert "; flex-start: ERROR: (gcloud.alpha.compute.instances.create)" in line
    assert "; spot: ERROR: (gcloud.compute.instances.create) Could not fetch resource: - Quota " in line
    # nothing bills or lingers: no instance of the run's VM in the zone
    assert not [key for key in sb.state("vms") if key.endswith(f"/{sb.vm}")]


def test_a_failure_that_is_not_capacity_stops_the_fall_through(
    sb: SandboxRun, scarce: Callable[..., None]
) -> None:
    """gcloud without its alpha component refuses flex-start's create: spot is not tried."""
    scarce({})
    update_settings(sb.layout, gcloud_components=("beta",))
    try:
        conf = sb.tpu_vm_conf(capacity=["flex-start", "spot"], reservation="")
        _prepared(sb, conf)
        with pytest.raises(AirflowFailException):
            _execute(sb, TpuVmCreateOperator, conf, task_id="create_vm")
    finally:
        update_settings(sb.layout, gcloud_components=SandboxSettings().gcloud_components)
    assert len(_creates(sb)) == 1


def test_a_single_kind_create_is_as_before(sb: SandboxRun, scarce: Callable[..., None]) -> None:
    """One kind: no fall-through, no capacity XCom; its stockout is today's retryable failure."""
    scarce({"spot": "stockout"})
    conf = sb.tpu_vm_conf(capacity="spot", reservation="")
    _prepared(sb, conf)
    with pytest.raises(CommandError) as caught:
        _execute(sb, TpuVmCreateOperator, conf, task_id="create_vm")
    assert caught.value.kind is FailureKind.CAPACITY
    assert str(caught.value).startswith(f"create TPU VM {sb.vm} (v6e-8, spot capacity) failed")
