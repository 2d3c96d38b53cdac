"""collect_run_from_context on fake contexts: plain objects with the attributes Airflow provides."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from airflow_provider_tpu_rl.ledger.collect import (
    TPU_VM_CHIPS,
    TPU_VM_CLUSTER_TASK_IDS,
    artifacts_from_sensor_result,
    collect_run_from_context,
    metrics_from_train_result,
)
from airflow_provider_tpu_rl.ledger.records import ArtifactRecord, MetricRecord, ResumeLoss, StepRecord
from tests.support.ledger_fakes import (
    BILLED_MINUTES,
    BUCKET,
    LEDGER_TASK,
    NOW,
    SUCCESS_XCOMS,
    T0,
    BareTaskInstance,
    FakeAirflow3DagRun,
    FakeDagRun,
    FakeLedgerTaskInstance,
    FakeTaskInstance,
    bake_result,
    context_for,
    gke_task_instances,
    minutes,
    train_result,
)


def test_successful_run_gives_the_run_steps_metrics_and_artifacts() -> None:
    context = context_for(FakeDagRun(gke_task_instances()), SUCCESS_XCOMS)
    run, steps, metrics, artifacts = collect_run_from_context(
        context, model="qwen3-30b-a3b", chips=32, now=NOW
    )

    assert run.run_id == "tpu_rl_gke_pipeline/manual__2026-03-01T08:00:00+00:00"
    assert (run.state, run.model, run.chips) == ("success", "qwen3-30b-a3b", 32)
    assert (run.started_at, run.ended_at) == (T0, NOW)
    # the TPU capacity's span: the TPU node pool's deploy start to its destroy's end
    assert (run.cluster_started_at, run.cluster_ended_at) == (minutes(36), minutes(126))
    assert run.held_chip_hours == pytest.approx(32 * 90 / 60)
    assert '"hf_token": "***"' in run.conf_json

    assert LEDGER_TASK not in {step.task_id for step in steps}
    by_task = {step.task_id: step for step in steps}
    assert len(by_task) == 10
    assert by_task["train"] == StepRecord(
        "train", "success", 1, minutes(41), minutes(120), "rl-qwen-0301-train"
    )
    assert by_task["convert_to_maxtext"].job_name == "rl-qwen-0301-convert"
    assert by_task["export_to_huggingface"].job_name == "rl-qwen-0301-export"
    assert by_task["deploy_cluster"].job_name is None

    assert MetricRecord("pre", 0, "mean_reward", 0.12) in metrics
    assert MetricRecord("post", 0, "mean_reward", 0.34) in metrics
    assert MetricRecord("pre", 0, "format_accuracy", 55.5) in metrics
    assert MetricRecord("intermediate", 25, "accuracy", 15.0) in metrics
    assert MetricRecord("train", 2, "loss", 2.25) in metrics
    assert not [metric for metric in metrics if metric.name == "note"]
    assert len(metrics) == 3 + 2 + 2 + 2

    assert artifacts == [
        ArtifactRecord("converted_checkpoint", f"{BUCKET}/max-text-format/0/items/", 0),
        ArtifactRecord("actor_checkpoint", f"{BUCKET}/trained/rl/checkpoints/actor/50/", 50),
        ArtifactRecord("hf_export", f"{BUCKET}/hf-trained/", None),
    ]


def test_failure_at_training_marks_the_run_failed() -> None:
    instances = gke_task_instances(
        train="failed",
        wait_actor_checkpoint="upstream_failed",
        export_to_huggingface="upstream_failed",
        wait_hf_export="upstream_failed",
    )
    xcoms = {
        key: value
        for key, value in SUCCESS_XCOMS.items()
        if key in {"convert_to_maxtext", "wait_converted_checkpoint"}
    }
    context = context_for(FakeDagRun(instances), xcoms)
    run, steps, metrics, artifacts = collect_run_from_context(
        context, model="qwen3-30b-a3b", chips=32, now=NOW
    )

    assert run.state == "failed"
    assert {step.task_id: step.state for step in steps}["export_to_huggingface"] == "upstream_failed"
    assert metrics == []
    assert [artifact.kind for artifact in artifacts] == ["converted_checkpoint"]
    assert run.held_chip_hours == pytest.approx(32 * 90 / 60)  # the TPU pool still lived until its destroy


def test_retry_of_a_transient_fault_records_the_latest_try() -> None:
    instances = gke_task_instances()
    train = next(ti for ti in instances if ti.task_id == "train")
    train.try_number, train.start_date = 2, minutes(60)
    context = context_for(FakeDagRun(instances), SUCCESS_XCOMS)
    run, steps, _, _ = collect_run_from_context(context, model="qwen3-30b-a3b", chips=32, now=NOW)
    assert run.state == "success"
    step = {step.task_id: step for step in steps}["train"]
    assert (step.try_number, step.started_at, step.state) == (2, minutes(60), "success")


def test_a_failed_teardown_alone_does_not_fail_the_run() -> None:
    context = context_for(FakeDagRun(gke_task_instances(destroy_cluster="failed")), SUCCESS_XCOMS)
    run, steps, _, _ = collect_run_from_context(context, model="qwen3-30b-a3b", chips=32, now=NOW)
    assert run.state == "success"
    assert {step.task_id: step.state for step in steps}["destroy_cluster"] == "failed"


def test_explicit_teardown_ids_override_the_dag() -> None:
    context = context_for(FakeDagRun(gke_task_instances(destroy_cluster="failed")), SUCCESS_XCOMS)
    run, _, _, _ = collect_run_from_context(context, model="m", chips=32, teardown_task_ids=(), now=NOW)
    assert run.state == "failed"


def test_ignored_tasks_do_not_fail_the_run() -> None:
    instances = [*gke_task_instances(), FakeTaskInstance("watcher", "failed")]
    context = context_for(FakeDagRun(instances), SUCCESS_XCOMS)
    run, _, _, _ = collect_run_from_context(
        context, model="m", chips=32, ignored_task_ids=["watcher"], now=NOW
    )
    assert run.state == "success"


def test_a_dag_run_airflow_already_failed_stays_failed() -> None:
    context = context_for(FakeDagRun(gke_task_instances(), state="failed"), SUCCESS_XCOMS)
    run, _, _, _ = collect_run_from_context(context, model="m", chips=32, now=NOW)
    assert run.state == "failed"


def test_cluster_not_destroyed_yet_counts_until_now() -> None:
    instances = [ti for ti in gke_task_instances(train="failed") if ti.task_id != "destroy_tpu_pool"]
    context = context_for(FakeDagRun(instances), {})
    run, _, _, _ = collect_run_from_context(context, model="m", chips=32, now=NOW)
    assert (run.cluster_started_at, run.cluster_ended_at) == (minutes(36), NOW)
    assert run.held_chip_hours == pytest.approx(32 * (3.0 - 36 / 60))


def test_cluster_never_deployed_costs_nothing_known() -> None:
    instances = [
        FakeTaskInstance("deploy_cluster", "success", 1, minutes(0), minutes(20)),
        FakeTaskInstance("deploy_tpu_pool", "failed", 1, None, None),
    ]
    context = context_for(FakeDagRun(instances), {})
    run, _, _, _ = collect_run_from_context(context, model="m", chips=32, now=NOW)
    assert (run.state, run.cluster_started_at, run.held_chip_hours) == ("failed", None, None)


def test_tpu_vm_pipeline_task_ids() -> None:
    instances = [
        FakeTaskInstance("create_vm", "success", 1, minutes(0), minutes(5)),
        FakeTaskInstance("train", "success", 1, minutes(5), minutes(20)),
        FakeTaskInstance("delete_vm", "success", 1, minutes(25), minutes(30)),
    ]
    dag_run = FakeDagRun(instances, dag_id="tpu_rl_tpu_vm_pipeline")
    context = {"dag_run": dag_run, "ti": FakeLedgerTaskInstance({"train": train_result()})}
    run, _, metrics, _ = collect_run_from_context(
        context,
        model="llama3.1-8b-Instruct",
        chips=TPU_VM_CHIPS,
        cluster_task_ids=TPU_VM_CLUSTER_TASK_IDS,
        now=NOW,
    )
    assert (run.cluster_started_at, run.cluster_ended_at) == (minutes(0), minutes(30))
    assert run.held_chip_hours == pytest.approx(8 * 0.5)
    assert MetricRecord("post", 0, "mean_reward", 0.34) in metrics


def test_a_tpu_vm_run_carries_its_bake_vms_span() -> None:
    instances = [
        FakeTaskInstance("bake_image", "success", 1, minutes(0), minutes(9)),
        FakeTaskInstance("create_vm", "success", 1, minutes(10), minutes(15)),
    ]
    dag_run = FakeDagRun(instances, dag_id="tpu_rl_tpu_vm_pipeline")
    context = {"dag_run": dag_run, "ti": FakeLedgerTaskInstance({"bake_image": bake_result(1, 8.5)})}
    run, _, _, _ = collect_run_from_context(
        context, model="m", chips=TPU_VM_CHIPS, cluster_task_ids=TPU_VM_CLUSTER_TASK_IDS, now=NOW
    )
    (span,) = run.vm_spans
    assert (span.purpose, span.name, span.machine_type) == ("bake", "tpu-rl-bake-0301", "n2-standard-8")
    assert (span.started_at, span.ended_at, span.billed_seconds) == (minutes(1), minutes(8.5), 450.0)


def test_a_run_without_a_bake_task_reads_no_bake_xcom() -> None:
    ti = FakeLedgerTaskInstance(SUCCESS_XCOMS)
    context = {**context_for(FakeDagRun(gke_task_instances()), SUCCESS_XCOMS), "ti": ti}
    run, _, _, _ = collect_run_from_context(context, model="m", chips=32, now=NOW)
    assert run.vm_spans == ()
    assert "bake_image" not in {task_id for task_id, _ in ti.pulled}


def test_task_ids_are_parameters() -> None:
    instances = [FakeTaskInstance("rl", "success", 1, minutes(0), minutes(5))]
    xcoms = {
        "rl": train_result(),
        "export_done": {"uris": ["gs://b/x/config.json"], "export_uri": "gs://b/x/"},
    }
    context = {"dag_run": FakeDagRun(instances), "ti": FakeLedgerTaskInstance(xcoms)}
    _, steps, metrics, artifacts = collect_run_from_context(
        context,
        model="m",
        chips=8,
        train_task_id="rl",
        job_task_ids=("rl",),
        artifact_task_ids={"hf_export": "export_done"},
        now=NOW,
    )
    assert steps[0].job_name == "rl-qwen-0301-train"
    assert MetricRecord("pre", 0, "mean_reward", 0.12) in metrics
    assert artifacts == [ArtifactRecord("hf_export", "gs://b/x/", None)]


def test_mapped_task_instances_fold_into_one_step() -> None:
    instances = [
        FakeTaskInstance("copy_out", "failed", 2, minutes(1), minutes(9), map_index=0),
        FakeTaskInstance("copy_out", "success", 1, minutes(0), minutes(5), map_index=1),
    ]
    context = context_for(FakeDagRun(instances), {})
    run, steps, _, _ = collect_run_from_context(context, model="m", chips=8, now=NOW)
    assert steps == [StepRecord("copy_out", "failed", 2, minutes(0), minutes(9))]
    assert run.state == "failed"


def test_an_unreadable_xcom_does_not_stop_the_record() -> None:
    xcoms = {**SUCCESS_XCOMS, "train": RuntimeError("xcom backend down")}
    context = context_for(FakeDagRun(gke_task_instances()), xcoms)
    run, steps, metrics, artifacts = collect_run_from_context(context, model="m", chips=32, now=NOW)
    assert run.state == "success"
    assert metrics == []
    assert len(artifacts) == 3
    assert {step.task_id: step for step in steps}["train"].job_name is None


def test_airflow3_context_uses_task_states_and_recorded_steps() -> None:
    states = {
        "deploy_tpu_pool": "success",
        "train": "failed",
        "destroy_tpu_pool": "success",
        LEDGER_TASK: "running",
    }
    recorded = {
        "deploy_tpu_pool": StepRecord("deploy_tpu_pool", "success", 1, minutes(0), minutes(20)),
        "train": StepRecord("train", "running", 3, minutes(30), None),
        "destroy_tpu_pool": StepRecord("destroy_tpu_pool", "success", 1, minutes(100), minutes(110)),
    }
    context = {
        "dag_run": FakeAirflow3DagRun(),
        "ti": FakeLedgerTaskInstance({"train": None}, task_states=states),
    }
    run, steps, _, _ = collect_run_from_context(
        context, model="m", chips=32, recorded_steps=recorded, now=NOW
    )
    by_task = {step.task_id: step for step in steps}
    assert set(by_task) == {"deploy_tpu_pool", "train", "destroy_tpu_pool"}
    assert by_task["train"] == StepRecord("train", "failed", 3, minutes(30), None)
    assert (run.state, run.cluster_started_at, run.cluster_ended_at) == ("failed", minutes(0), minutes(110))
    assert run.held_chip_hours == pytest.approx(32 * 110 / 60)


def without_start_date(instances: list[FakeTaskInstance], **fallback: str) -> list[FakeTaskInstance]:
    """Task instances as Airflow 2.11's ``dags test`` leaves them: no start_date.

    ``fallback`` names, per task id, the timestamp Airflow still recorded: "duration" (with
    end_date) or "queued_dttm" (at the real start); the other tasks have neither.
    """
    bare = []
    for ti in instances:
        start, kind = ti.start_date, fallback.get(ti.task_id)
        ti = replace(ti, start_date=None)
        if kind == "duration" and start is not None and ti.end_date is not None:
            ti = replace(ti, duration=(ti.end_date - start).total_seconds())
        elif kind == "queued_dttm":
            ti = replace(ti, queued_dttm=start)
        bare.append(ti)
    return bare


def test_without_start_date_steps_start_at_end_minus_duration_or_when_queued() -> None:
    instances = without_start_date(
        gke_task_instances(), deploy_tpu_pool="duration", train="duration", destroy_tpu_pool="queued_dttm"
    )
    context = context_for(FakeDagRun(instances), SUCCESS_XCOMS)
    run, steps, _, _ = collect_run_from_context(context, model="m", chips=32, now=NOW)

    by_task = {step.task_id: step for step in steps}
    assert (by_task["deploy_tpu_pool"].started_at, by_task["deploy_tpu_pool"].duration_seconds) == (
        minutes(36),
        5 * 60,
    )
    assert by_task["train"].duration_seconds == 79 * 60
    assert by_task["destroy_tpu_pool"].duration_seconds == 5 * 60
    assert (by_task["convert_to_maxtext"].started_at, by_task["convert_to_maxtext"].ended_at) == (
        None,
        minutes(35),
    )
    assert (run.cluster_started_at, run.cluster_ended_at) == (minutes(36), minutes(126))
    assert run.held_chip_hours == pytest.approx(32 * 90 / 60)


def test_without_start_date_the_execute_callback_row_comes_before_the_queued_time() -> None:
    instances = without_start_date(gke_task_instances(), deploy_tpu_pool="queued_dttm")
    pool = next(i for i, ti in enumerate(instances) if ti.task_id == "deploy_tpu_pool")
    instances[pool] = replace(instances[pool], queued_dttm=minutes(31))  # queued 5 minutes before it started
    recorded = {"deploy_tpu_pool": StepRecord("deploy_tpu_pool", "running", 1, minutes(36), None)}
    context = context_for(FakeDagRun(instances), SUCCESS_XCOMS)
    run, steps, _, _ = collect_run_from_context(
        context, model="m", chips=32, recorded_steps=recorded, now=NOW
    )
    assert {step.task_id: step for step in steps}["deploy_tpu_pool"].duration_seconds == 5 * 60
    assert run.held_chip_hours == pytest.approx(32 * 90 / 60)

    run, steps, _, _ = collect_run_from_context(context, model="m", chips=32, now=NOW)
    assert {step.task_id: step for step in steps}["deploy_tpu_pool"].duration_seconds == 10 * 60
    assert run.held_chip_hours == pytest.approx(32 * 95 / 60)


def test_a_start_date_wins_over_the_other_timestamps() -> None:
    instances = gke_task_instances()
    pool = next(i for i, ti in enumerate(instances) if ti.task_id == "deploy_tpu_pool")
    instances[pool] = replace(instances[pool], duration=1.0, queued_dttm=minutes(31))
    context = context_for(FakeDagRun(instances), SUCCESS_XCOMS)
    run, steps, _, _ = collect_run_from_context(context, model="m", chips=32, now=NOW)
    assert {step.task_id: step for step in steps}["deploy_tpu_pool"].started_at == minutes(36)
    assert run.held_chip_hours == pytest.approx(32 * 90 / 60)


def test_a_context_without_task_instances_still_records_the_run() -> None:
    context = {"dag_run": FakeAirflow3DagRun(), "ti": BareTaskInstance()}
    run, steps, _, _ = collect_run_from_context(context, model="m", chips=32, now=NOW)
    assert (run.state, steps, run.held_chip_hours) == ("success", [], None)


@pytest.mark.parametrize(
    "result",
    [
        None,
        "text",
        {"metrics": None},
        {"metrics": {"pre": None, "post": None, "intermediate": None, "loss": None}},
    ],
)
def test_train_results_without_metrics_give_none(result: Any) -> None:
    assert metrics_from_train_result(result) == []


def test_the_evaluations_size_is_recorded_as_a_train_metric() -> None:
    """So the ledger can say why a run has no reward (num_test_batches=0: evaluation off)."""
    result = {"metrics": {"pre": None, "post": None}, "num_test_batches": 0}
    assert metrics_from_train_result(result) == [MetricRecord("train", 0, "num_test_batches", 0.0)]
    result = {"metrics": {"pre": {"mean_reward": 0.1}}, "num_test_batches": 2}
    assert metrics_from_train_result(result) == [
        MetricRecord("train", 0, "num_test_batches", 2.0),
        MetricRecord("pre", 0, "mean_reward", 0.1),
    ]


def test_train_metrics_skip_entries_without_a_step_or_number() -> None:
    result = {
        "metrics": {
            "intermediate": [
                {"mean_reward": 0.2},
                {"step": "x", "mean_reward": 0.2},
                {"step": 5, "flag": True},
            ],
            "loss": [{"step": 3}, {"loss": 1.0}, {"step": 4, "loss": 0.5}],
        }
    }
    assert metrics_from_train_result(result) == [MetricRecord("train", 4, "loss", 0.5)]


def test_sensor_results_fall_back_to_their_uris() -> None:
    assert artifacts_from_sensor_result(
        "actor_checkpoint", {"uris": ["gs://b/a/", "gs://b/c/"], "step": "50"}
    ) == [
        ArtifactRecord("actor_checkpoint", "gs://b/a/", 50),
        ArtifactRecord("actor_checkpoint", "gs://b/c/", 50),
    ]
    assert artifacts_from_sensor_result("hf_export", None) == []
    assert artifacts_from_sensor_result("hf_export", {"uris": []}) == []


def test_trained_time_is_the_training_jobs_own_span_when_its_task_returned_one() -> None:
    ran = {"started_at": minutes(50).isoformat().replace("+00:00", "Z"), "ended_at": minutes(110).isoformat()}
    xcoms = {**SUCCESS_XCOMS, "train": {**train_result(), "ran": ran}}
    run, *_ = collect_run_from_context(
        context_for(FakeDagRun(gke_task_instances()), xcoms),
        model="qwen3-30b-a3b",
        chips=32,
        now=NOW,
        usd_per_chip_hour=2.7,
    )
    assert (run.train_started_at, run.train_ended_at) == (minutes(50), minutes(110))
    assert run.busy_chip_hours == pytest.approx(32 * 60 / 60)
    # billed: the TPU node VMs' 86 minutes by their clocks (not the pool tasks' 90, nor the cluster's 170)
    assert run.idle_share == pytest.approx(1 - 60 / BILLED_MINUTES)
    assert run.estimated_cost_usd == pytest.approx(32 * BILLED_MINUTES / 60 * 2.7)


@pytest.mark.parametrize(
    "ran",
    [
        None,
        {"started_at": "soon", "ended_at": None},
        {"started_at": "2026-03-01T09:00:00Z", "ended_at": "2026-03-01T08:00:00Z"},
    ],
)
def test_trained_time_falls_back_to_the_train_tasks_try(ran: Any) -> None:
    """The TPU VM trains inside its task; a span that is missing or makes no sense is not used."""
    xcoms = {**SUCCESS_XCOMS, "train": {**train_result(), "ran": ran}}
    run, *_ = collect_run_from_context(
        context_for(FakeDagRun(gke_task_instances()), xcoms), model="qwen3-30b-a3b", chips=32, now=NOW
    )
    assert (run.train_started_at, run.train_ended_at) == (minutes(41), minutes(120))
    assert run.estimated_cost_usd is None  # no price given


def test_training_that_never_ended_trained_nothing_known() -> None:
    instances = [
        replace(ti, end_date=None, state="running") if ti.task_id == "train" else ti
        for ti in gke_task_instances()
    ]
    xcoms = {k: v for k, v in SUCCESS_XCOMS.items() if k != "train"}
    run, *_ = collect_run_from_context(
        context_for(FakeDagRun(instances), xcoms), model="qwen3-30b-a3b", chips=32, now=NOW
    )
    assert (run.train_started_at, run.busy_chip_hours, run.idle_share) == (None, None, None)


def test_the_run_records_what_resuming_its_training_cost() -> None:
    run_id = "tpu_rl_gke_pipeline/manual__2026-03-01T08:00:00+00:00"
    attempts = [
        {"run": run_id, "job": "j", "from_step": 0, "reached_step": 3, "started_at": 0.0, "ended_at": 30.0},
        {
            "run": run_id,
            "job": "j",
            "from_step": 2,
            "reached_step": 50,
            "started_at": 90.0,
            "ended_at": 600.0,
        },
    ]
    xcoms = {**SUCCESS_XCOMS, "train": {**train_result(), "attempts": attempts}}
    run, *_ = collect_run_from_context(
        context_for(FakeDagRun(gke_task_instances()), xcoms), model="qwen3-30b-a3b", chips=32, now=NOW
    )
    assert run.resume_loss == ResumeLoss(1, 1, 60.0 + 10.0)
    plain, *_ = collect_run_from_context(
        context_for(FakeDagRun(gke_task_instances()), SUCCESS_XCOMS), model="qwen3-30b-a3b", chips=32, now=NOW
    )
    assert plain.resume_loss is None  # a train result without attempts: not known
