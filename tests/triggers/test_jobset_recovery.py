"""JobSetTrigger recovery that no Airflow line changes: no process, a retry after the job ended,
the event held until ``not_before``, a trigger killed mid-training (SIGKILL: no clean-up runs).

The trigger's cancel path (a triggerer restart, a kill before Airflow 3.3) and its provider clients
are tested on every Airflow line and provider version in test_jobset.py; these tests reuse
its helpers and run on Airflow 3.3 (the Makefile's ``SAME_ON_EVERY_AIRFLOW``).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tpu_rl.operators.gke_jobs import PathwaysRLTrainOperator
from airflow_provider_tpu_rl.spec import gke_pipeline_from_conf
from airflow_provider_tpu_rl.triggers.jobset import JobSetTrigger
from tests.support.sandbox_run import (
    RecordingTI,
    SandboxRun,
    convert_checkpoint,
    defer,
    prepare_cluster,
    printed_rewards,
    run_trigger,
    wait_for,
)
from tests.triggers.test_jobset import (
    HEAD,
    RUN_ID,
    WORKLOAD,
    _held_training,
    _release_when,
    long_holds,  # noqa: F401  (autouse: imported here, it holds this module's jobs 600 s too)
    recording,
)


def test_the_trigger_starts_no_process(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _train, _context, trigger, _job_name, hold = _held_training(sb, monkeypatch)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"the trigger started a process: {args[:1]}")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(asyncio, "create_subprocess_exec", refuse)
    monkeypatch.setattr(asyncio, "create_subprocess_shell", refuse)
    monkeypatch.setattr(os, "fork", refuse)
    monkeypatch.setattr(os, "posix_spawn", refuse)
    monkeypatch.setattr(os, "posix_spawnp", refuse)

    with recording(trigger) as recorder:
        event = run_trigger(trigger, alongside=_release_when(recorder, hold, "Pre RL Training"))
    monkeypatch.undo()  # execute_complete may read GCS through its own means
    assert event["status"] == "success"
    assert recorder.lines


def test_a_retry_after_the_job_ended_keeps_its_result_and_rewards(sb: SandboxRun) -> None:
    """The first try submitted and deferred, then its worker died; the job ended meanwhile. The
    retry finds this run's complete checkpoint: nothing is submitted again, and the rewards the
    first wait read from the log (kept with its cursor in GCS) are still reported."""
    conf = sb.gke_conf(train_overrides={"num_test_batches": 2})
    prepare_cluster(sb, conf, run_id=RUN_ID)
    convert_checkpoint(sb, conf, run_id=RUN_ID)
    job_name = gke_pipeline_from_conf(conf, run_id=RUN_ID).train_job
    first = sb.operator(PathwaysRLTrainOperator, task_id="train")
    deferred = defer(first, sb.context(first, conf, run_id=RUN_ID))
    assert run_trigger(deferred.trigger)["status"] == "success"  # the triggerer read the log; no resume

    retry = sb.operator(PathwaysRLTrainOperator, task_id="train")
    result = retry.execute(sb.context(retry, conf, run_id=RUN_ID, ti=RecordingTI(2)))  # no TaskDeferred

    rewards = printed_rewards("\n".join(sb.container_log(job_name, HEAD, WORKLOAD)))
    assert result["skipped"] is True
    assert result["metrics"]["pre"]["mean_reward"] == rewards["pre"]
    assert result["metrics"]["post"]["mean_reward"] == rewards["post"]
    assert len(sb.job_calls("submit", job_name)) == 1


def test_the_event_is_held_until_not_before(sb: SandboxRun, monkeypatch: pytest.MonkeyPatch) -> None:
    _, _, trigger, _job_name, hold = _held_training(sb, monkeypatch)
    hold.unlink()
    trigger.not_before = time.time() + 3.0
    event = run_trigger(trigger)
    assert event["status"] == "success"
    assert time.time() >= trigger.not_before


# A trigger in its own process, its relayed lines appended to a file (flushed line by line): what a
# triggerer that dies at once (SIGKILL, a lost node) had put in the task log.
_KILLED_TRIGGER = """
import asyncio, json, logging, sys
from airflow_provider_tpu_rl.triggers.jobset import JobSetTrigger

trigger = JobSetTrigger(**json.loads(sys.argv[1]))

class ToFile(logging.Handler):
    def emit(self, record):
        prefix = "[" + trigger.job_name + "] "
        lines = [line[len(prefix):] for line in record.getMessage().split("\\n") if line.startswith(prefix)]
        with open(sys.argv[2], "a") as out:
            out.writelines(line + "\\n" for line in lines if not line.startswith("progress: "))

logger = logging.getLogger("killed-trigger")
logger.addHandler(ToFile())
logger.setLevel(logging.INFO)
trigger._log = logger

async def main():
    async for _ in trigger.run():
        return

asyncio.run(main())
"""


def _relayed_pre_training(relayed: Path, trigger: subprocess.Popen[bytes]) -> bool:
    """Whether the trigger's process relayed the pre-training reward; an error if it ended first."""
    if relayed.is_file() and "Pre RL Training" in relayed.read_text():
        return True
    code = trigger.poll()
    assert code is None, f"the trigger's process exited ({code}) before it relayed the pre-training reward"
    return False


def test_a_trigger_killed_mid_training_never_relays_a_line_twice(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    train, context, trigger, job_name, hold = _held_training(sb, monkeypatch)
    kwargs = trigger.serialize()[1]
    relayed = sb.work_dir / "relayed-before-the-kill.txt"
    killed = subprocess.Popen(
        [sys.executable, "-c", _KILLED_TRIGGER, json.dumps(kwargs), str(relayed)], env=dict(os.environ)
    )
    try:
        wait_for(  # a new interpreter imports the provider first: a minute and more, loaded
            lambda: _relayed_pre_training(relayed, killed),
            "the first trigger to relay the pre-training reward",
        )
        time.sleep(1.0)  # more lines counted, some not yet relayed
    finally:
        killed.send_signal(signal.SIGKILL)  # no clean-up, no last save
        killed.wait(timeout=30)
    first = relayed.read_text().splitlines()

    restarted = JobSetTrigger(**kwargs)
    hold.unlink()
    with recording(restarted) as second:
        event = run_trigger(restarted)
    train.execute_complete(context, event)

    full = sb.container_log(job_name, HEAD, WORKLOAD)
    combined = first + second.lines
    # In the container's order, each line at most once: a line may be lost at the kill, never repeated.
    position = 0
    for line in combined:
        assert line in full[position:], f"relayed twice or out of order: {line!r}"
        position = full.index(line, position) + 1
    assert second.lines
    assert full[-1] == combined[-1]
