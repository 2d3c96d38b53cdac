"""On the TPU VM pipeline, preemption is a transient failure too: the VM goes as its termination
action says (DELETE: gone; STOP: TERMINATED), the train try fails retryable in one line, and the
retry brings the VM back (re-created and reinstalled, or started) and resumes from the newest
committed checkpoint."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from airflow_provider_tpu_rl.compat import AirflowException, AirflowFailException
from airflow_provider_tpu_rl.ledger.records import resume_loss
from airflow_provider_tpu_rl.operators.gke import EnsureBucketOperator
from airflow_provider_tpu_rl.operators.tpu_vm import (
    TpuVmCreateOperator,
    TpuVmStageOperator,
)
from airflow_provider_tpu_rl.records.lease import ClusterLeaseHook, vm_lease_name
from airflow_provider_tpu_rl.spec import TPU_VM_DAG_ID
from tests.support.compat import capture_task_logs
from tests.support.sandbox_run import TPU_VM_CONVERSION_TASKS, RecordingTI, SandboxRun

RUN_ID = "manual__2026-03-04T00:00:00+00:00"
START = datetime(2030, 1, 1, tzinfo=UTC)


def _execute(sb: SandboxRun, factory: Any, conf: dict[str, Any], task_id: str, try_number: int = 1) -> Any:
    op = sb.operator(factory, dag_id=TPU_VM_DAG_ID, conf=conf, run_id=RUN_ID, task_id=task_id)
    return op.execute(sb.context(op, conf, run_id=RUN_ID, start_date=START, ti=RecordingTI(try_number)))


def _ready_to_train(sb: SandboxRun, conf: dict[str, Any]) -> None:
    """The pipeline up to training: the converted checkpoint in GCS, the TPU VM created and installed."""
    for task_id, factory in TPU_VM_CONVERSION_TASKS:
        _execute(sb, factory, conf, task_id)
    _execute(sb, TpuVmCreateOperator, conf, "create_vm")
    _execute(sb, TpuVmStageOperator, conf, "install_maxtext")


def _train_log(logs: list[dict[str, Any]]) -> str:
    return "\n".join(str(entry.get("event")) for entry in logs)


def _calls(sb: SandboxRun, *words: str) -> list[list[str]]:
    return [c["argv"] for c in sb.calls() if c["tool"] == "gcloud" and c["argv"][: len(words)] == list(words)]


def _installs_on_vm(sb: SandboxRun) -> int:
    """The install stage's runs on the TPU VM (the container runtime's: its ``docker pull`` of the
    workload image), from the VM's own tool-call log."""
    calls = sb.vm_tool_calls(sb.vm)
    return sum(call["tool"] == "docker" and call["argv"][1:2] == ["pull"] for call in calls)


def _preempted_try(sb: SandboxRun, conf: dict[str, Any], status: str) -> None:
    with pytest.raises(AirflowException) as failed:
        _execute(sb, TpuVmStageOperator, conf, "train", try_number=1)
    assert not isinstance(failed.value, AirflowFailException)  # retried
    assert str(failed.value) == (
        f"TPU VM {sb.vm} was lost under training (status {status}); the retry brings it back and "
        "resumes from the newest committed checkpoint (step 2)"
    )


def _resumed_try(sb: SandboxRun, conf: dict[str, Any], seen: list[str] | None = None) -> dict[str, Any]:
    with capture_task_logs() as logs:
        result = _execute(sb, TpuVmStageOperator, conf, "train", try_number=2)
    log = _train_log(logs)
    if seen is not None:
        seen.append(log)
    assert "Restored params from step: 2 in" in log  # steps 1-2 are not trained again
    assert "Train step 2 " not in log
    assert "Train step 3 " in log
    assert result["metrics"]["last_step"] == 5
    # both attempts are in the run directory's record: the ledger's resume view
    first, second = result["attempts"]
    assert (first["from_step"], second["from_step"], second["reached_step"]) == (0, 2, 5)
    loss = resume_loss(result["attempts"], f"{TPU_VM_DAG_ID}/{RUN_ID}")
    assert loss is not None
    assert (loss.resumes, loss.steps_lost) == (1, first["reached_step"] - 2)
    assert loss.seconds_lost is not None
    return result


CONF = {"num_batches": 5, "train_overrides": {"checkpoint_period": 1, "num_test_batches": 0}}


@pytest.mark.usefixtures("preempt_after_two")
def test_a_deleted_tpu_vm_is_re_created_and_reinstalled_and_training_resumes(sb: SandboxRun) -> None:
    conf = sb.tpu_vm_conf(**CONF)
    vm_key = f"{sb.project}/{conf['zone']}/{sb.vm}"
    _ready_to_train(sb, conf)

    _preempted_try(sb, conf, "DELETED")
    assert vm_key not in sb.state("vms")  # --instance-termination-action=DELETE
    (lost,) = sb.state("vm_history")[vm_key]
    assert lost["deleted"] is not None
    assert len(lost["preempted"]) == 1

    _resumed_try(sb, conf)
    first, second = _calls(sb, "compute", "instances", "create")[-2:]
    assert "--instance-termination-action=DELETE" in second
    assert first == second  # the create task's argv, re-rendered from the resource record
    assert sb.state("vms")[vm_key]["status"] == "RUNNING"
    assert [p["module"] for p in sb.state("vm_history")[vm_key][1]["programs"]] == [
        "maxtext.trainers.post_train.rl.train_rl"
    ]
    assert _installs_on_vm(sb) == 1  # the new VM got MaxText installed before training


@pytest.mark.usefixtures("preempt_after_two", "spot_tpu_restarts")
def test_a_stopped_tpu_vm_is_started_without_reinstalling_and_training_resumes(sb: SandboxRun) -> None:
    # spot capacity: a preempted VM is stopped (--instance-termination-action=STOP), not deleted
    conf = sb.tpu_vm_conf(**CONF, capacity="spot", reservation="")
    vm_key = f"{sb.project}/{conf['zone']}/{sb.vm}"
    _ready_to_train(sb, conf)
    assert _installs_on_vm(sb) == 1

    (create,) = _calls(sb, "compute", "instances", "create")[-1:]
    assert {"--provisioning-model=SPOT", "--instance-termination-action=STOP"} <= set(create)
    _preempted_try(sb, conf, "TERMINATED")
    vm = sb.state("vms")[vm_key]
    assert vm["status"] == "TERMINATED"
    assert vm["lastStopTimestamp"]
    creates = len(_calls(sb, "compute", "instances", "create"))

    _resumed_try(sb, conf)
    assert len(_calls(sb, "compute", "instances", "start")) == 1
    assert len(_calls(sb, "compute", "instances", "create")) == creates  # not re-created
    assert _installs_on_vm(sb) == 1  # its boot disk kept MaxText: no reinstall
    assert sb.state("vms")[vm_key]["status"] == "RUNNING"
    (life,) = sb.state("vm_history")[vm_key]
    assert len(life["preempted"]) == len(life["started"]) == 1


@pytest.mark.usefixtures("preempt_after_two")
def test_a_preempted_spot_tpu_vm_whose_start_is_refused_is_re_created_and_training_resumes(
    sb: SandboxRun,
) -> None:
    """Issue 53 item 0: Cloud TPU's spot page: a preempted TPU Spot VM cannot be restarted, it must
    be re-created. The retry's start is refused (the sandbox's default): the VM is deleted, created
    again from its resource record, installed, and training resumes; the run does not fail."""
    conf = sb.tpu_vm_conf(**CONF, capacity="spot", reservation="")
    vm_key = f"{sb.project}/{conf['zone']}/{sb.vm}"
    _ready_to_train(sb, conf)
    _preempted_try(sb, conf, "TERMINATED")
    creates = _calls(sb, "compute", "instances", "create")

    seen: list[str] = []
    _resumed_try(sb, conf, seen)
    assert len(_calls(sb, "compute", "instances", "start")) == 1  # tried once, refused
    assert len(_calls(sb, "compute", "instances", "delete")) == 1
    again = _calls(sb, "compute", "instances", "create")
    assert len(again) == len(creates) + 1
    assert again[-1] == creates[-1]  # the create task's argv, from the resource record
    assert f"TPU VM {sb.vm} cannot be started again (ERROR: (gcloud.compute.instances.start) " in seen[0]
    first, _new = sb.state("vm_history")[vm_key]  # the stopped VM's life ended, a new one began
    assert first["deleted"] is not None
    assert len(first["preempted"]) == 1
    assert "started" not in first
    assert sb.state("vms")[vm_key]["status"] == "RUNNING"
    assert _installs_on_vm(sb) == 1  # the new VM (its own call log) got the workload before training


def test_only_the_run_holding_the_vms_lease_re_creates_it(sb: SandboxRun) -> None:
    """A train retry finding the TPU VM gone re-creates it only for the run that holds its lease:
    with nobody's, or another run's, the try fails for good and nothing is created."""
    conf = sb.tpu_vm_conf()
    _execute(sb, EnsureBucketOperator, conf, "ensure_bucket")

    with pytest.raises(
        AirflowFailException, match=f"TPU VM {sb.vm} is gone and this run does not hold its lease"
    ):
        _execute(sb, TpuVmStageOperator, conf, "train", try_number=2)

    other = f"{TPU_VM_DAG_ID}/manual__2026-03-05T00:00:00+00:00"
    ClusterLeaseHook().acquire(
        sb.bucket,
        vm_lease_name(sb.vm),
        dag_id=TPU_VM_DAG_ID,
        run_id=other.split("/")[1],
        ttl=timedelta(hours=1),
    )
    with pytest.raises(AirflowFailException, match=re.escape(f"in use by run {other} until ")):
        _execute(sb, TpuVmStageOperator, conf, "train", try_number=2)
    assert _calls(sb, "compute", "instances", "create") == []
    assert _calls(sb, "compute", "ssh") == []
