"""One writer per run directory on the TPU VM pipeline too (issue 43, item 1), in the sandbox.

Run A trains on its TPU VM in the post-training container; its SSH session dies (the worker that
held it is gone). The container is the VM's docker daemon's: it trains on (the sandbox's dockerd
plays moby's rule). Before issue 43, A's stage released its claim as its session ended, and run B,
the same ``run_name`` on another VM, trained into the same directory. Now A keeps its claim while
its container still runs, and B, once A's run has ended, reads A's VM over SSH: it refuses naming
the container, or with ``cancel_previous_writer`` removes it and takes the directory over.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.operators.preflight import TpuRlPreflightOperator
from airflow_provider_tpu_rl.operators.tpu_vm import TpuVmCreateOperator, TpuVmStageOperator
from airflow_provider_tpu_rl.records.run_dirs import RunDirRecords
from airflow_provider_tpu_rl.spec import TPU_VM_DAG_ID
from tests.operators.test_run_identity import RunStatesTI
from tests.support.sandbox_run import TPU_VM_CONVERSION_TASKS, ZONE, SandboxRun, wait_for
from tests.support.waiting import joined
from tpu_rl_sandbox.machines import dockerd

RUN_A = "manual__2026-03-01T00:00:00+00:00"
RUN_B = "manual__2026-03-02T00:00:00+00:00"
RUN_NAME = "dup-rn"
CONTAINER = "tpu-rl-train"


def _operator(sb: SandboxRun, factory: Any, conf: dict[str, Any], task_id: str, run_id: str) -> Any:
    return sb.operator(factory, dag_id=TPU_VM_DAG_ID, conf=conf, run_id=run_id, task_id=task_id)


def _execute(
    sb: SandboxRun, factory: Any, conf: dict[str, Any], task_id: str, run_id: str, **ctx: Any
) -> Any:
    op = _operator(sb, factory, conf, task_id, run_id)
    return op.execute(sb.context(op, conf, run_id=run_id, **ctx))


def _container(sb: SandboxRun, vm: str) -> dict[str, Any] | None:
    return dockerd.containers(sb.layout.vm_dir(vm)).get(CONTAINER)


def _training(sb: SandboxRun, vm: str) -> bool:
    record = _container(sb, vm)
    return record is not None and dockerd.running(record) and "Train step" in open(record["out"]).read()


def _in_thread(run: Any) -> tuple[threading.Thread, list[BaseException], list[Any]]:
    errors: list[BaseException] = []
    results: list[Any] = []

    def target() -> None:
        try:
            results.append(run())
        except BaseException as err:  # reported to the test
            errors.append(err)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, errors, results


def test_a_crashed_runs_training_container_refuses_the_run_reusing_its_run_name_until_stopped(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = sb.tpu_vm_conf(run_name=RUN_NAME)
    other = {**conf, "vm_name": f"{sb.vm}b", "capacity": "spot", "reservation": ""}
    directory = f"gs://{sb.bucket}/llama3.1-8b-Instruct/post-train/{RUN_NAME}/"
    for task_id, factory in TPU_VM_CONVERSION_TASKS:
        _execute(sb, factory, conf, task_id, RUN_A)
    _execute(sb, TpuVmCreateOperator, conf, "create_vm", RUN_A)
    _execute(sb, TpuVmStageOperator, conf, "install_maxtext", RUN_A)
    hold = sb.hold_file()  # A's container stays live: its final checkpoint waits before the commit
    monkeypatch.setenv("TPU_RL_SANDBOX_HOLD_FILE", str(hold))
    first = _operator(sb, TpuVmStageOperator, conf, "train", RUN_A)
    context = sb.context(first, conf, run_id=RUN_A)
    thread, errors, _ = _in_thread(lambda: first.execute(context))
    try:
        wait_for(lambda: _training(sb, sb.vm), "run A's container to train")
        # Issue 54 item 1: B is refused at preflight, before its TPU VM exists: A's claim vouches
        # for its job while A runs ...
        with pytest.raises(AirflowFailException) as refused:
            _execute(
                sb, TpuRlPreflightOperator, other, "preflight", RUN_B, ti=RunStatesTI({RUN_A: "running"})
            )
        said = str(refused.value)
        assert f"- {directory} is being written by job {sb.vm}/train (" in said, said
        assert f"of run {TPU_VM_DAG_ID}/{RUN_A}, claimed until " in said, said
        first.hook.terminate()  # A's SSH session dies with its worker; the container is dockerd's
        joined(thread, "run A's stage to end once its session is gone")
        assert errors, "run A's stage must fail once its session is gone"
        assert _training(sb, sb.vm)  # it trains on
        writer = RunDirRecords().read(sb.bucket, directory).writer
        assert writer is not None  # kept: never released under a running writer
        assert (writer.run, writer.job) == (f"{TPU_VM_DAG_ID}/{RUN_A}", f"{sb.vm}/train")

        # ... and once A's run has ended, while its container still trains (read over SSH): the
        # same line train gives, and nothing stopped without cancel_previous_writer
        with pytest.raises(AirflowFailException) as refused:
            _execute(sb, TpuRlPreflightOperator, other, "preflight", RUN_B, ti=RunStatesTI({RUN_A: "failed"}))
        line = f"- {directory} is still written by job {sb.vm}/train of run {TPU_VM_DAG_ID}/{RUN_A} ("
        assert line in str(refused.value)
        assert "cancel_previous_writer=true" in str(refused.value)
        assert _training(sb, sb.vm)

        _execute(sb, TpuVmCreateOperator, other, "create_vm", RUN_B)
        _execute(sb, TpuVmStageOperator, other, "install_maxtext", RUN_B)
        with pytest.raises(AirflowFailException) as refused:
            _execute(sb, TpuVmStageOperator, other, "train", RUN_B, ti=RunStatesTI({RUN_A: "failed"}))
        message = str(refused.value)
        assert "\n" not in message
        assert message.startswith(
            f"{directory} is still written by job {sb.vm}/train of run {TPU_VM_DAG_ID}/{RUN_A} ("
        )
        assert f"container {CONTAINER} on VM {sb.vm} ({sb.project}/{ZONE})" in message
        assert f"gcloud compute ssh {sb.vm} --zone={ZONE} --project={sb.project}" in message
        assert "cancel_previous_writer=true" in message
        assert _container(sb, f"{sb.vm}b") is None  # B trained nothing
        assert _training(sb, sb.vm)

        # With cancel_previous_writer, B removes A's container, then takes over and trains.
        again = {**other, "cancel_previous_writer": True}
        second = _operator(sb, TpuVmStageOperator, again, "train", RUN_B)
        b_context = sb.context(second, again, run_id=RUN_B, ti=RunStatesTI({RUN_A: "failed"}))
        b_thread, b_errors, b_results = _in_thread(lambda: second.execute(b_context))

        def taken_over() -> bool:
            held = RunDirRecords().read(sb.bucket, directory).writer
            return held is not None and held.run == f"{TPU_VM_DAG_ID}/{RUN_B}"

        wait_for(taken_over, "run B's takeover")
        assert _container(sb, sb.vm) is None  # removed before B claimed the directory
        hold.unlink()
        joined(b_thread, "run B's stage to end")
        assert b_errors == []
        (result,) = b_results
        assert result["metrics"]["last_step"] == 3
        assert [a["run"] for a in result["attempts"]] == [
            f"{TPU_VM_DAG_ID}/{RUN_A}",
            f"{TPU_VM_DAG_ID}/{RUN_B}",
        ]
    finally:
        hold.unlink(missing_ok=True)
        dockerd.stop_all(sb.layout.vm_dir(sb.vm))
