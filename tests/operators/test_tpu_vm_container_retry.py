"""A TPU VM retry follows its own run's training container (issue 54, item 2), in the sandbox.

Run A trains in the post-training container; its SSH session dies with its worker, the container
(the VM's docker daemon's) trains on. Before, the retry's stage script removed it (``docker rm
--force``) and trained again from the last checkpoint. Now the retry finds the container labelled
with this run and its directory and follows it: its logs, then its exit status as the stage's; the
container is never restarted. Another run's running container on the VM is refused in one line.
"""

from __future__ import annotations

import pytest

from airflow_provider_tpu_rl.compat import AirflowException, AirflowFailException
from airflow_provider_tpu_rl.operators.tpu_vm import (
    TpuVmCreateOperator,
    TpuVmStageOperator,
    container_failure,
    container_start,
)
from airflow_provider_tpu_rl.render import tpu_vm
from airflow_provider_tpu_rl.spec import TPU_VM_DAG_ID
from airflow_provider_tpu_rl.spec.presets import POST_TRAINING_IMAGE
from tests.operators.test_run_dir_takeover_vm import (
    CONTAINER,
    RUN_A,
    RUN_B,
    RUN_NAME,
    _container,
    _execute,
    _in_thread,
    _operator,
    _training,
)
from tests.support.sandbox_run import TPU_VM_CONVERSION_TASKS, ZONE, RecordingTI, SandboxRun, wait_for
from tests.support.waiting import joined
from tpu_rl_sandbox.machines import dockerd

TRAIN_RL = "maxtext.trainers.post_train.rl.train_rl"


def _waits_on_the_container(sb: SandboxRun) -> bool:
    return any(call["argv"][:3] == ["docker", "wait", CONTAINER] for call in sb.vm_tool_calls(sb.vm))


def test_a_retry_follows_its_runs_running_container_to_its_end_and_another_run_is_refused(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = sb.tpu_vm_conf(run_name=RUN_NAME)
    directory = f"gs://{sb.bucket}/llama3.1-8b-Instruct/post-train/{RUN_NAME}/"
    for task_id, factory in TPU_VM_CONVERSION_TASKS:
        _execute(sb, factory, conf, task_id, RUN_A)
    _execute(sb, TpuVmCreateOperator, conf, "create_vm", RUN_A)
    _execute(sb, TpuVmStageOperator, conf, "install_maxtext", RUN_A)
    hold = sb.hold_file()  # the container stays live: its final checkpoint waits before the commit
    monkeypatch.setenv("TPU_RL_SANDBOX_HOLD_FILE", str(hold))
    first = _operator(sb, TpuVmStageOperator, conf, "train", RUN_A)
    context = sb.context(first, conf, run_id=RUN_A)
    thread, errors, _ = _in_thread(lambda: first.execute(context))
    try:
        wait_for(lambda: errors or _training(sb, sb.vm), "run A's container to train")
        assert not errors, f"run A's train failed before its container trained: {errors[0]!r}"
        first.hook.terminate()  # the worker dies: its SSH session with it, not the container
        joined(thread, "the first try to end once its session is gone")
        assert errors, "the first try must fail once its session is gone"
        before = _container(sb, sb.vm)
        assert before is not None
        assert before["labels"] == {
            "io.tpu-rl.run-dir": directory,
            "io.tpu-rl.run-id": f"{TPU_VM_DAG_ID}/{RUN_A}",
        }

        # Another run's training on this VM (its own run directory) is refused, the container kept.
        other = {**conf, "run_name": "other-rn"}
        with pytest.raises(AirflowFailException) as refused:
            _execute(sb, TpuVmStageOperator, other, "train", RUN_B)
        message = str(refused.value)
        assert "\n" not in message
        assert message.startswith(
            f"container {CONTAINER} on VM {sb.vm} is running for run {TPU_VM_DAG_ID}/{RUN_A} writing "
            f"{directory}, not gs://{sb.bucket}/llama3.1-8b-Instruct/post-train/other-rn/ of this run"
        )
        assert _container(sb, sb.vm) == before

        # The retry of run A follows the container instead of starting another.
        retry = _operator(sb, TpuVmStageOperator, conf, "train", RUN_A)
        retry_context = sb.context(retry, conf, run_id=RUN_A, ti=RecordingTI(try_number=2))
        r_thread, r_errors, r_results = _in_thread(lambda: retry.execute(retry_context))
        wait_for(lambda: _waits_on_the_container(sb), "the retry to wait on the container")
        assert _container(sb, sb.vm) == before  # the same container: same id, same start
        hold.unlink()
        joined(r_thread, "the retry to end")
        assert r_errors == []
        (result,) = r_results
        assert result["metrics"]["last_step"] == 3  # its whole log, from the container's start
        (attempt,) = result["attempts"]
        assert attempt["run"] == f"{TPU_VM_DAG_ID}/{RUN_A}"
        assert abs(attempt["started_at"] - before["started"]) < 1  # the container's start
        assert _container(sb, sb.vm) is None  # --rm: gone once it ended
        (life,) = sb.state("vm_history")[f"{sb.project}/{ZONE}/{sb.vm}"]
        assert [p["module"] for p in life["programs"]].count(TRAIN_RL) == 1  # trained once
        docker = [call["argv"][1] for call in sb.vm_tool_calls(sb.vm) if call["argv"][:1] == ["docker"]]
        assert "rm" not in docker
    finally:
        hold.unlink(missing_ok=True)
        dockerd.stop_all(sb.layout.vm_dir(sb.vm))


def test_a_stopped_container_of_the_stages_name_is_removed_and_a_new_one_trains(sb: SandboxRun) -> None:
    conf = sb.tpu_vm_conf(run_name=RUN_NAME)
    for task_id, factory in TPU_VM_CONVERSION_TASKS:
        _execute(sb, factory, conf, task_id, RUN_A)
    _execute(sb, TpuVmCreateOperator, conf, "create_vm", RUN_A)
    _execute(sb, TpuVmStageOperator, conf, "install_maxtext", RUN_A)
    op = _operator(sb, TpuVmStageOperator, conf, "train", RUN_A)
    # an earlier try's container that ended without --rm (or one created and never started)
    left = f"sudo docker run --name={CONTAINER} {POST_TRAINING_IMAGE} bash -c 'exit 9' || true\n"
    op.hook.run_checked(tpu_vm.ssh_named(sb.project, ZONE, sb.vm, left, "leave a stopped container"))
    stopped = _container(sb, sb.vm)
    assert stopped is not None
    assert not dockerd.running(stopped)

    result = op.execute(sb.context(op, conf, run_id=RUN_A))
    assert result["metrics"]["last_step"] == 3
    assert _container(sb, sb.vm) is None  # the stopped one removed, the new one (--rm) gone
    docker = [call["argv"][1:3] for call in sb.vm_tool_calls(sb.vm) if call["argv"][:1] == ["docker"]]
    assert ["rm", CONTAINER] in docker


def test_a_stage_scripts_own_failure_lines_become_the_tasks_error() -> None:
    """Another run's container refused: fatal, its line alone; a followed container's lost exit
    status: retryable; any other failure: the command's own classification (None here)."""
    refused = container_failure(
        "ssh failed with exit code 3 (config); last output:\n"
        f"{tpu_vm.REFUSED_CONTAINER} container tpu-rl-train on VM v is running for run d/r writing gs://b/x/\n"
    )
    assert isinstance(refused, AirflowFailException)
    assert str(refused) == "container tpu-rl-train on VM v is running for run d/r writing gs://b/x/"
    lost = container_failure(f"failed; last output:\n  {tpu_vm.UNSEEN_EXIT} container c ended\n")
    assert type(lost) is AirflowException
    assert str(lost) == "container c ended"
    assert (
        container_failure("failed; last output:\nTraceback (most recent call last):\nValueError: x") is None
    )


def test_the_followed_containers_start_is_read_from_its_line() -> None:
    line = (
        f"{tpu_vm.FOLLOWING_CONTAINER} tpu-rl-train of this run (started 2026-03-01T00:00:01.250000000Z): …"
    )
    assert container_start(line) == 1772323201.25
    assert container_start(f"{tpu_vm.FOLLOWING_CONTAINER} tpu-rl-train of this run (started ): …") is None
