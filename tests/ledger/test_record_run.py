"""The ledger task and the step callbacks writing to SQLite and PostgreSQL: one row per run, always."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from airflow_provider_tpu_rl.ledger import hook as ledger_hook
from airflow_provider_tpu_rl.ledger.hook import RunLedger, record_run_from_context, step_callbacks
from airflow_provider_tpu_rl.ledger.records import StepRecord
from airflow_provider_tpu_rl.operators.ledger import RecordRunOperator, run_settings
from airflow_provider_tpu_rl.pipelines.failures import ERROR_XCOM_KEY
from airflow_provider_tpu_rl.pipelines.validate import note_run_started
from airflow_provider_tpu_rl.spec import gke_pipeline_from_conf, tpu_vm_pipeline_from_conf
from tests.ledger.rows import count_rows
from tests.support.ledger_fakes import (
    BILLED_MINUTES,
    BUCKET,
    LEDGER_TASK,
    SUCCESS_XCOMS,
    FakeAirflow3DagRun,
    FakeDagRun,
    FakeLedgerTaskInstance,
    FakeTaskInstance,
    bake_result,
    context_for,
    gke_task_instances,
    minutes,
)

MODEL = "qwen3-30b-a3b"


@dataclass
class CallbackTaskInstance:
    """What a task callback finds in ``context["ti"]``."""

    task_id: str
    try_number: int
    start_date: datetime
    end_date: datetime | None = None
    state: str | None = None
    dag_id: str = "tpu_rl_gke_pipeline"
    run_id: str = "manual__a3"


def fire(callback: str, ti: Any) -> None:
    step_callbacks()[callback]({"ti": ti})


def test_success_failure_and_rerun_give_one_row_per_run(ledger: RunLedger) -> None:
    good = context_for(FakeDagRun(gke_task_instances(), run_id="good"), SUCCESS_XCOMS)
    bad = context_for(
        FakeDagRun(gke_task_instances(train="failed", export_to_huggingface="upstream_failed"), run_id="bad"),
        {"convert_to_maxtext": {"job_name": "rl-convert"}},
    )
    for context in (good, bad, good, bad):  # the ledger task retried or the run cleared and re-run
        record_run_from_context(context, model="qwen3-30b-a3b", chips=32)

    runs = {run.airflow_run_id: run for run in ledger.latest_runs()}
    assert count_rows(ledger, "runs") == 2
    assert (runs["good"].state, runs["bad"].state) == ("success", "failed")
    assert (runs["good"].pre_mean_reward, runs["good"].post_mean_reward) == (0.12, 0.34)
    assert runs["good"].export_uri == f"{BUCKET}/hf-trained/"
    assert (runs["bad"].post_mean_reward, runs["bad"].export_uri) == (None, None)
    assert runs["good"].chip_hours == pytest.approx(32 * BILLED_MINUTES / 60)  # its node VMs' clocks
    assert runs["good"].held_chip_hours == pytest.approx(32 * 90 / 60)  # the TPU node pool's tasks
    assert count_rows(ledger, "run_steps", runs["good"].run_id) == 10
    assert count_rows(ledger, "run_artifacts", runs["good"].run_id) == 3
    assert count_rows(ledger, "run_metrics", runs["good"].run_id) == 9


def test_the_record_line_counts_the_runs_stages_not_its_training_steps(
    ledger: RunLedger, caplog: pytest.LogCaptureFixture
) -> None:
    """A run trains 50 steps; the ledger writes one row per stage (task): the line says stages."""
    context = context_for(FakeDagRun(gke_task_instances(), run_id="good"), SUCCESS_XCOMS)
    with caplog.at_level("INFO", logger=ledger_hook.__name__):
        record_run_from_context(context, model="qwen3-30b-a3b", chips=32)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ledger: recorded run")]
    assert ": 10 stages, 9 metrics, 3 artifacts in " in line
    assert " steps" not in line


class KeyedLedgerTaskInstance(FakeLedgerTaskInstance):
    """A ledger task instance whose XComs have keys: ``xcoms`` maps (task_id, key) to a value."""

    def xcom_pull(self, task_ids: str, key: str = "return_value") -> Any:
        return self.xcoms.get((task_ids, key))

    def xcom_push(self, key: str, value: Any) -> None:
        """The task's own XComs (its link's): not looked at here."""


def test_a_run_refused_at_validate_is_recorded_with_its_reason(ledger: RunLedger) -> None:
    states = {"validate": "failed", "deploy_cluster": "upstream_failed", "record_run": "running"}
    said = "invalid pipeline conf: cluster_name: GKE cluster name must start with a lowercase letter"
    ti = KeyedLedgerTaskInstance({("validate", ERROR_XCOM_KEY): said}, task_states=states)
    context: dict[str, Any] = {
        "dag_run": FakeAirflow3DagRun(),
        "ti": ti,
        "params": {"model": "qwen3-30b-a3b"},
    }
    operator = RecordRunOperator(task_id="record_run", plot=False)

    result = operator.execute(context)  # type: ignore[arg-type]

    (run,) = ledger.latest_runs()
    assert (result["state"], run.state) == ("failed", "failed")
    assert run.refusal == (
        "refused at validate: cluster_name: GKE cluster name must start with a lowercase letter"
    )
    # a run whose validate passed has none
    ti = KeyedLedgerTaskInstance({}, task_states={**states, "validate": "success"})
    assert operator.refusal({"dag_run": FakeAirflow3DagRun(), "ti": ti}) is None  # type: ignore[arg-type]


def test_the_bake_vms_billed_cpu_time_is_stored_once_per_span(ledger: RunLedger) -> None:
    """The TPU VM run's bake VM: a row per span, a minute billed at least; a retry adds no row."""
    states = {"bake_image": "success", "create_vm": "success", LEDGER_TASK: "running"}
    context: dict[str, Any] = {
        "dag_run": FakeAirflow3DagRun(dag_id="tpu_rl_tpu_vm_pipeline"),
        "ti": FakeLedgerTaskInstance({"bake_image": bake_result(1, 1.5)}, task_states=states),
    }
    for _ in range(2):  # record_run retried
        run = record_run_from_context(context, model="llama3.1-8b-Instruct", chips=8)

    assert count_rows(ledger, "run_vm_spans") == 1
    with ledger._session(write=False) as session:
        (row,) = session.fetch("SELECT * FROM run_vm_spans", {})
    assert (row["run_id"], row["purpose"], row["vm_name"]) == (run.run_id, "bake", "tpu-rl-bake-0301")
    assert (row["machine_type"], row["vm_zone"]) == ("n2-standard-8", "us-east5-b")
    assert (row["seconds"], row["billed_seconds"]) == (30.0, 60.0)  # Compute Engine's one-minute minimum
    (summary,) = ledger.latest_runs()
    assert summary.bake_billed_seconds == 60.0


def test_airflow3_run_gets_step_times_from_the_callbacks(ledger: RunLedger) -> None:
    fire("on_execute_callback", CallbackTaskInstance("deploy_tpu_pool", 1, minutes(0)))
    fire(
        "on_success_callback", CallbackTaskInstance("deploy_tpu_pool", 1, minutes(0), minutes(20), "success")
    )
    # train: a transient fault in try 1, success in try 2
    fire("on_execute_callback", CallbackTaskInstance("train", 1, minutes(20)))
    fire("on_retry_callback", CallbackTaskInstance("train", 1, minutes(20), minutes(25), "up_for_retry"))
    fire("on_execute_callback", CallbackTaskInstance("train", 2, minutes(30)))
    fire("on_success_callback", CallbackTaskInstance("train", 2, minutes(30), minutes(90), "success"))
    fire(
        "on_success_callback",
        CallbackTaskInstance("destroy_tpu_pool", 1, minutes(95), minutes(100), "success"),
    )

    states = {
        "deploy_tpu_pool": "success",
        "train": "success",
        "destroy_tpu_pool": "success",
        LEDGER_TASK: "running",
    }
    context: dict[str, Any] = {
        "dag_run": FakeAirflow3DagRun(),
        "ti": FakeLedgerTaskInstance(
            {"train": {"job_name": "rl-train-a3", "metrics": None}}, task_states=states
        ),
    }
    run = record_run_from_context(context, model="qwen3-30b-a3b", chips=32)

    assert run.state == "success"
    assert run.held_chip_hours == pytest.approx(32 * 100 / 60)
    steps = ledger.recorded_steps(run.run_id)
    assert steps["train"] == StepRecord("train", "success", 2, minutes(30), minutes(90), "rl-train-a3")
    assert set(steps) == {"deploy_tpu_pool", "train", "destroy_tpu_pool"}
    assert count_rows(ledger, "runs") == 1


def test_a_failing_ledger_never_fails_the_task(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", "mysql://user@localhost/db")
    fire("on_failure_callback", CallbackTaskInstance("train", 1, minutes(0), minutes(1), "failed"))


def test_failure_callback_without_a_state_records_failed(ledger: RunLedger) -> None:
    fire(
        "on_failure_callback", CallbackTaskInstance("train", 1, minutes(0), minutes(1) + timedelta(seconds=5))
    )
    step = ledger.recorded_steps("tpu_rl_gke_pipeline/manual__a3")["train"]
    assert (step.state, step.try_number, step.ended_at) == ("failed", 1, minutes(1) + timedelta(seconds=5))


@dataclass
class DagsTestTaskInstance:
    """A task instance under Airflow 2.11's ``airflow dags test``: no start_date, no duration."""

    task_id: str
    state: str | None
    end_date: datetime | None = None
    try_number: int = 1
    start_date: datetime | None = None
    duration: float | None = None
    queued_dttm: datetime | None = None
    dag_id: str = "tpu_rl_gke_pipeline"
    run_id: str = "dags_test"


def test_airflow2_dags_test_run_gets_step_times_from_the_execute_callbacks(ledger: RunLedger) -> None:
    """Without start_date the execute callback's time is the start: durations and chip-hours recorded."""
    before = datetime.now(UTC)
    fire("on_execute_callback", DagsTestTaskInstance("deploy_tpu_pool", "running"))
    fire("on_execute_callback", DagsTestTaskInstance("train", "running"))
    after = datetime.now(UTC)
    ends = {"deploy_tpu_pool": after + timedelta(minutes=20), "train": after + timedelta(minutes=90)}
    for task_id, end in ends.items():
        fire("on_success_callback", DagsTestTaskInstance(task_id, "success", end))

    instances = [FakeTaskInstance(task_id, "success", end_date=end) for task_id, end in ends.items()]
    instances.append(FakeTaskInstance("destroy_tpu_pool", "success", end_date=after + timedelta(minutes=100)))
    instances.append(FakeTaskInstance(LEDGER_TASK, "running"))
    dag_run = FakeDagRun(instances, run_id="dags_test")
    run = record_run_from_context(context_for(dag_run, {}), model="qwen3-30b-a3b", chips=32)

    steps = ledger.recorded_steps(run.run_id)
    deploy, train = steps["deploy_tpu_pool"], steps["train"]
    assert deploy.started_at is not None
    assert before <= deploy.started_at <= after
    assert train.started_at is not None
    assert before <= train.started_at <= after
    assert 20 * 60 <= (deploy.duration_seconds or 0) <= 20 * 60 + (after - before).total_seconds()
    assert 90 * 60 <= (train.duration_seconds or 0) <= 90 * 60 + (after - before).total_seconds()
    # No callback row for destroy_tpu_pool: its start stays unknown, its end still closes the TPU pool's span.
    assert (steps["destroy_tpu_pool"].started_at, steps["destroy_tpu_pool"].ended_at) == (
        None,
        after + timedelta(minutes=100),
    )
    summary = {row.airflow_run_id: row for row in ledger.latest_runs()}["dags_test"]
    assert summary.held_chip_hours is not None
    assert (
        32 * 100 / 60 <= summary.held_chip_hours <= 32 * (100 * 60 + (after - before).total_seconds()) / 3600
    )


def test_the_execute_callback_keeps_a_start_date_airflow_gives(ledger: RunLedger) -> None:
    fire("on_execute_callback", CallbackTaskInstance("train", 1, minutes(30)))
    assert ledger.recorded_steps("tpu_rl_gke_pipeline/manual__a3")["train"].started_at == minutes(30)


def test_an_end_callback_without_an_end_date_ends_the_step_at_its_own_time(ledger: RunLedger) -> None:
    """The ledger task itself under 2.11's ``dags test``: no end_date at its success callback."""
    fire("on_execute_callback", DagsTestTaskInstance(LEDGER_TASK, "running"))
    before = datetime.now(UTC)
    fire("on_success_callback", DagsTestTaskInstance(LEDGER_TASK, "success"))
    after = datetime.now(UTC)
    step = ledger.recorded_steps("tpu_rl_gke_pipeline/dags_test")[LEDGER_TASK]
    assert step.state == "success"
    assert step.started_at is not None  # the execute callback's, kept
    assert step.ended_at is not None
    assert step.started_at <= before <= step.ended_at <= after
    assert step.duration_seconds is not None


def test_the_step_callbacks_of_a_dag_look_its_ledger_connection_up_once_per_reuse_window(
    ledger: RunLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task's execute and end callbacks (every task's, under ``dags test``) share one lookup."""
    assert ledger.dialect  # the test's own ledger looks its connection up before the count starts
    looked_up: list[str] = []
    real_lookup = ledger_hook.BaseHook.get_connection

    class CountingBaseHook:
        @staticmethod
        def get_connection(conn_id: str) -> Any:
            looked_up.append(conn_id)
            return real_lookup(conn_id)

    monkeypatch.setattr(ledger_hook, "BaseHook", CountingBaseHook)
    callbacks = step_callbacks()
    for number, task in enumerate(("deploy_tpu_pool", "train", "destroy_tpu_pool")):
        callbacks["on_execute_callback"]({"ti": CallbackTaskInstance(task, 1, minutes(number))})
        ti = CallbackTaskInstance(task, 1, minutes(number), minutes(number + 1), "success")
        callbacks["on_success_callback"]({"ti": ti})
    assert looked_up == [ledger.conn_id]
    assert set(ledger.recorded_steps("tpu_rl_gke_pipeline/manual__a3")) == {
        "deploy_tpu_pool",
        "train",
        "destroy_tpu_pool",
    }

    monkeypatch.setattr(ledger_hook, "STEP_LEDGER_REUSE_SECONDS", -1.0)  # the window has passed
    callbacks["on_execute_callback"]({"ti": CallbackTaskInstance("export_to_huggingface", 1, minutes(5))})
    assert looked_up == [ledger.conn_id] * 2


def test_a_validated_run_is_listed_running_with_its_settings_until_record_run(ledger: RunLedger) -> None:
    """validate lists the run (the dashboard shows it while it runs); record_run, its last
    teardown, replaces the state and keeps what the run was asked to do."""
    resolved = gke_pipeline_from_conf(
        {
            "project": "proj-123456",
            "bucket": "bkt-1",
            "capacity": "spot",
            "num_batches": 20,
            "run_name": "rl-a",
        }
    ).resolved()
    dag_run = FakeDagRun(gke_task_instances(), run_id="listed")
    note_run_started({"dag_run": dag_run}, resolved)

    (running,) = ledger.latest_runs()
    assert (running.state, running.model, running.chips, running.started_at) == (
        "running",
        MODEL,
        32,
        minutes(0),
    )
    assert running.settings == {
        "model": MODEL,
        "capacity": "spot",
        "steps": 20,
        "learning_rate": "2e-5",  # the preset's
        "run_name": "rl-a",
        "compute_type": "ct6e-standard-4t",
        "topology": "4x8",
        "num_slices": 1,
        "train_overrides": {"checkpoint_period": "10"},  # what validate adds (resume)
    }
    assert "hf_token" not in str(running.settings)

    context = context_for(dag_run, {**SUCCESS_XCOMS, "validate": resolved})
    context["ti"] = KeyedLedgerTaskInstance(
        {
            (task_id, "return_value"): value
            for task_id, value in {**SUCCESS_XCOMS, "validate": resolved}.items()
        }
    )
    context["params"] = {"model": MODEL}
    RecordRunOperator(task_id="record_run", plot=False).record(context)  # type: ignore[arg-type]

    (recorded,) = ledger.latest_runs()
    assert recorded.state == "success"
    assert recorded.settings == running.settings
    assert count_rows(ledger, "runs") == 1


def test_the_settings_name_the_learning_rate_the_run_trains_with() -> None:
    gke = gke_pipeline_from_conf({"train_overrides": {"learning_rate": 1e-5}}).resolved()
    assert run_settings(gke)["learning_rate"] == "1e-5"  # the run's override over the preset's 2e-5
    vm = run_settings(tpu_vm_pipeline_from_conf({}).resolved())
    assert "learning_rate" not in vm  # the preset sets none: MaxText's own default
    assert (vm["capacity"], vm["runtime"], vm["steps"]) == ("on-demand", "container", 50)


def test_listing_a_run_never_fails_its_validate(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", "postgresql://nobody@127.0.0.1:1/none")
    resolved = gke_pipeline_from_conf({}).resolved()
    note_run_started({"dag_run": FakeDagRun(gke_task_instances())}, resolved)  # logs, never raises
    assert "could not list this run as running" in caplog.text


def test_an_ordered_capacity_records_the_kind_that_served_and_its_price(
    ledger: RunLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """create_vm's capacity XCom names the kind that served and the ones refused first: the
    settings keep them, and the billed time is costed at that kind's price where one is set."""
    monkeypatch.setenv("AIRFLOW__TPU_RL__SPOT_USD_PER_CHIP_HOUR", "1.08")
    resolved = tpu_vm_pipeline_from_conf(
        {"reservation": "res-8", "capacity": ["reservation", "flex-start", "spot"]}
    ).resolved()
    attempts = [
        {"capacity": "reservation", "error": "ERROR: (gcloud.compute.instances.create) reservation full"},
        {"capacity": "flex-start", "error": "ERROR: (gcloud.alpha.compute.instances.create) stockout"},
    ]
    dag_run = FakeDagRun(gke_task_instances(), run_id="fell-back")
    context = context_for(dag_run, {**SUCCESS_XCOMS, "validate": resolved})
    context["ti"] = KeyedLedgerTaskInstance(
        {
            **{
                (task_id, "return_value"): value
                for task_id, value in {**SUCCESS_XCOMS, "validate": resolved}.items()
            },
            ("deploy_cluster", "capacity"): {"served": "spot", "attempts": attempts},
        }
    )
    context["params"] = {"model": resolved["model"]}
    RecordRunOperator(task_id="record_run", plot=False).record(context)  # type: ignore[arg-type]

    (run,) = ledger.latest_runs()
    assert run.settings["capacity"] == ["reservation", "flex-start", "spot"]
    assert run.settings["capacity_served"] == "spot"
    assert run.settings["capacity_attempts"] == attempts
    assert run.usd_per_chip_hour == pytest.approx(1.08)


def test_a_one_kind_run_is_costed_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """No per-kind price set: every kind at [tpu_rl] usd_per_chip_hour, as before."""
    from airflow_provider_tpu_rl.operators.ledger import default_usd_per_chip_hour

    monkeypatch.setenv("AIRFLOW__TPU_RL__USD_PER_CHIP_HOUR", "2.5")
    assert {
        default_usd_per_chip_hour(k) for k in (None, "on-demand", "spot", "flex-start", "reservation")
    } == {2.5}
    monkeypatch.setenv("AIRFLOW__TPU_RL__FLEX_START_USD_PER_CHIP_HOUR", "1.27")
    assert default_usd_per_chip_hour("flex-start") == pytest.approx(1.27)
    assert default_usd_per_chip_hour("on-demand") == pytest.approx(2.5)


def _record(
    ledger: RunLedger, resolved: dict[str, Any], run_id: str, deployed: dict[str, Any] | None
) -> None:
    """validate lists the run, then record_run records it, ``deploy_cluster`` having returned ``deployed``."""
    dag_run = FakeDagRun(gke_task_instances(), run_id=run_id)
    note_run_started({"dag_run": dag_run}, resolved)
    xcoms = {**SUCCESS_XCOMS, "validate": resolved, "deploy_cluster": deployed}
    context = context_for(dag_run, xcoms)
    context["ti"] = KeyedLedgerTaskInstance({(task_id, "return_value"): v for task_id, v in xcoms.items()})
    context["params"] = {"model": MODEL}
    RecordRunOperator(task_id="record_run", plot=False).record(context)  # type: ignore[arg-type]


def test_a_run_on_an_existing_cluster_is_listed_with_it_from_validate_on(ledger: RunLedger) -> None:
    resolved = gke_pipeline_from_conf(
        {
            "project": "proj-123456",
            "bucket": "bkt-1",
            "cluster_mode": "existing",
            "existing_cluster": "proj-123456/us-east5/team-gke",
        }
    ).resolved()
    note_run_started({"dag_run": FakeDagRun(gke_task_instances(), run_id="shared")}, resolved)
    (listed,) = ledger.latest_runs()
    assert (listed.state, listed.cluster_text) == ("running", "proj-123456/us-east5/team-gke (existing)")

    # its deploy_cluster created the run's CPU pool: no cluster_origin; the mode says existing
    _record(ledger, resolved, "shared", {"existing_cluster": "proj-123456/us-east5/team-gke", "pools": []})
    (recorded,) = ledger.latest_runs()
    assert (recorded.state, recorded.gke_cluster, recorded.gke_cluster_origin) == (
        "success",
        "proj-123456/us-east5/team-gke",
        "existing",
    )


@pytest.mark.parametrize(
    ("deployed", "origin"),
    [
        ({"cluster_origin": "created"}, "created"),
        ({"cluster_origin": "kept", "kept_from": "d/r"}, "kept"),
        (None, None),
    ],
)
def test_a_create_mode_run_records_the_cluster_it_deployed_or_took_over(
    ledger: RunLedger, deployed: dict[str, Any] | None, origin: str | None
) -> None:
    """The cluster is named from validate on; whether the run deployed it or took over a kept one
    is deploy_cluster's to say (no deploy: not known)."""
    resolved = gke_pipeline_from_conf({"project": "proj-123456", "bucket": "bkt-1"}).resolved()
    _record(ledger, resolved, "made", deployed)
    (recorded,) = ledger.latest_runs()
    assert (recorded.gke_cluster, recorded.gke_cluster_origin) == ("proj-123456/us-east5/tpu-rl", origin)


def test_a_tpu_vm_run_has_no_gke_cluster(ledger: RunLedger) -> None:
    resolved = tpu_vm_pipeline_from_conf({"project": "proj-123456", "bucket": "bkt-1"}).resolved()
    note_run_started({"dag_run": FakeDagRun(gke_task_instances(), run_id="vm")}, resolved)
    (listed,) = ledger.latest_runs()
    assert (listed.gke_cluster, listed.gke_cluster_origin, listed.cluster_text) == (None, None, None)
