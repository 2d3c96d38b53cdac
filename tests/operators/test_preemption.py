"""Preemption is a transient failure: a training whose TPU nodes shut down under it (the sandbox's
``preempt_after_checkpoints``) fails its try as retryable, and the retry's job resumes from the
newest checkpoint the lost one committed, as tunix restores it."""

from __future__ import annotations

import pytest

from airflow_provider_tpu_rl.compat import AirflowException, AirflowFailException
from airflow_provider_tpu_rl.ledger.records import resume_loss
from airflow_provider_tpu_rl.operators.gke_jobs import PathwaysRLTrainOperator
from airflow_provider_tpu_rl.spec import gke_pipeline_from_conf
from tests.support.sandbox_run import (
    RecordingTI,
    SandboxRun,
    convert_checkpoint,
    defer,
    prepare_cluster,
    run_job_operator,
    run_trigger,
)
from tpu_rl_sandbox.world.settings import update_settings

RUN_ID = "manual__2026-03-03T00:00:00+00:00"


@pytest.mark.usefixtures("preempt_after_two")
def test_a_training_preempted_after_its_second_checkpoint_of_five_resumes_there(sb: SandboxRun) -> None:
    conf = sb.gke_conf(num_batches=5, train_overrides={"checkpoint_period": 1, "num_test_batches": 0})
    prepare_cluster(sb, conf, run_id=RUN_ID)
    convert_checkpoint(sb, conf, run_id=RUN_ID)
    train_job = gke_pipeline_from_conf(conf, run_id=RUN_ID).train_job

    first_try = sb.operator(PathwaysRLTrainOperator, task_id="train")
    context = sb.context(first_try, conf, run_id=RUN_ID, ti=RecordingTI(1))
    event = run_trigger(defer(first_try, context).trigger)
    assert (event["status"], event["failure"]["kind"]) == ("failed", "transient")
    line = event["failure"]["line"]
    assert "TerminationByKubelet: Pod was terminated in response to imminent node shutdown." in line
    with pytest.raises(AirflowException, match=train_job) as failed:
        first_try.execute_complete(context, event)
    assert not isinstance(failed.value, AirflowFailException)  # retried
    pods = sb.pods(train_job)  # every pod of the slice went with its node
    assert pods
    assert {(p["status"]["phase"], p["status"].get("reason")) for p in pods} == {("Failed", "Terminated")}

    second_try = sb.operator(PathwaysRLTrainOperator, task_id="train")
    result = run_job_operator(sb, second_try, conf, run_id=RUN_ID, ti=RecordingTI(2))
    assert result["step"] == 5
    log = sb.job_log_of(train_job)
    assert "Restored params from step: 2 in" in log  # steps 1-2 are not trained again
    assert "Train step 2 " not in log
    assert "Train step 3 " in log
    assert "Fast forwarded 2 micro-batches." in log  # the consumed batches are skipped, as tunix does

    # the run directory's record kept both attempts: the ledger's resume view comes from them
    run = f"{first_try.dag_id}/{RUN_ID}"
    first, second = result["attempts"]
    assert (first["from_step"], second["from_step"], second["reached_step"]) == (0, 2, 5)
    assert first["reached_step"] >= 2
    loss = resume_loss(result["attempts"], run)
    assert loss is not None
    assert (loss.resumes, loss.steps_lost) == (1, first["reached_step"] - 2)
    assert loss.seconds_lost is not None
    assert loss.seconds_lost > 0


def test_with_the_default_checkpoint_period_a_preemption_loses_the_steps_since_the_last_one(
    sb: SandboxRun,
) -> None:
    """Checkpoints every 10 steps (the default): preempted 7 steps past step 10, the retry restores
    step 10 and trains 11-17 again, fewer than the period; the attempts say so for the ledger."""
    run_id = "manual__2026-03-06T00:00:00+00:00"
    conf = sb.gke_conf(num_batches=20, train_overrides={"num_test_batches": 0})
    prepare_cluster(sb, conf, run_id=run_id)
    convert_checkpoint(sb, conf, run_id=run_id)
    update_settings(sb.layout, preempt_after_checkpoints=1, preempt_steps_after=7)
    try:
        first_try = sb.operator(PathwaysRLTrainOperator, task_id="train")
        context = sb.context(first_try, conf, run_id=run_id, ti=RecordingTI(1))
        event = run_trigger(defer(first_try, context).trigger)
        assert (event["status"], event["failure"]["kind"]) == ("failed", "transient")
        with pytest.raises(AirflowException):
            first_try.execute_complete(context, event)
    finally:
        update_settings(sb.layout, preempt_after_checkpoints=0, preempt_steps_after=0)

    second_try = sb.operator(PathwaysRLTrainOperator, task_id="train")
    result = run_job_operator(sb, second_try, conf, run_id=run_id, ti=RecordingTI(2))
    assert result["step"] == 20
    assert "Restored params from step: 10 in" in sb.job_log_of(
        gke_pipeline_from_conf(conf, run_id=run_id).train_job
    )
    first, second = result["attempts"]
    assert (first["from_step"], first["reached_step"]) == (0, 17)
    assert (second["from_step"], second["reached_step"]) == (10, 20)
    loss = resume_loss(result["attempts"], f"{first_try.dag_id}/{run_id}")
    assert loss is not None
    assert (loss.resumes, loss.steps_lost) == (1, 7)  # at most checkpoint_period - 1
