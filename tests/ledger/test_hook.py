"""The ledger on real databases: SQLite and PostgreSQL, through Airflow connections and common.sql hooks."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from airflow_provider_tpu_rl.ledger import hook as hook_module
from airflow_provider_tpu_rl.ledger.billing import BilledSpan
from airflow_provider_tpu_rl.ledger.dialects import Dialect
from airflow_provider_tpu_rl.ledger.hook import RunLedger, default_sqlite_path
from airflow_provider_tpu_rl.ledger.records import (
    ArtifactRecord,
    MetricRecord,
    ResumeLoss,
    RunClosing,
    RunRecord,
    StepRecord,
)
from airflow_provider_tpu_rl.ledger.schema import Migration, load_migrations
from tests.ledger.rows import applied_versions, count_rows

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)
DAG = "tpu_rl_gke_pipeline"


def make_run(
    airflow_run_id: str,
    *,
    model: str = "qwen3-30b-a3b",
    state: str = "success",
    start: datetime = T0,
    hours: float = 2.0,
    chips: int = 32,
    conf: dict[str, object] | None = None,
) -> RunRecord:
    return RunRecord(
        dag_id=DAG,
        airflow_run_id=airflow_run_id,
        model=model,
        state=state,
        started_at=start,
        ended_at=start + timedelta(hours=hours),
        chips=chips,
        cluster_started_at=start + timedelta(minutes=10),
        cluster_ended_at=start + timedelta(hours=hours),
        conf=conf or {},
    )


def test_a_migration_that_fails_halfway_leaves_no_trace(
    ledger: RunLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ADD COLUMN migration runs once: in the transaction that records its version."""
    real = load_migrations(ledger.dialect)
    broken = Migration(
        len(real) + 1,
        "broken",
        "ALTER TABLE runs ADD COLUMN probe INTEGER;\n\nALTER TABLE no_such_table ADD COLUMN x INTEGER;\n",
    )
    monkeypatch.setattr(hook_module, "load_migrations", lambda dialect: [*real, broken])
    with pytest.raises(Exception, match="no_such_table"):
        ledger.apply_migrations()
    monkeypatch.setattr(hook_module, "load_migrations", load_migrations)
    assert ledger.apply_migrations() == [
        1,
        2,
        3,
        4,
        5,
        6,
        7,
        8,
        9,
        10,
        11,
        12,
    ]  # the failed try left nothing behind
    ledger.record(make_run("after"), [], [], [])
    with pytest.raises(Exception, match="probe"), ledger._session(write=False) as session:
        session.fetch("SELECT probe FROM runs", {})


def rewards(pre: float | None, post: float | None) -> list[MetricRecord]:
    metrics = []
    if pre is not None:
        metrics.append(MetricRecord("pre", 0, "mean_reward", pre))
    if post is not None:
        metrics.append(MetricRecord("post", 0, "mean_reward", post))
    return metrics


def test_migrations_apply_once_and_twice_is_a_no_op(ledger: RunLedger) -> None:
    assert ledger.apply_migrations() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    assert ledger.apply_migrations() == []
    assert RunLedger().apply_migrations() == []  # a new instance sees the recorded versions
    assert applied_versions(ledger) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    for table in ("runs", "run_steps", "run_metrics", "run_artifacts", "run_vm_spans"):
        assert count_rows(ledger, table) == 0


def test_dialect_comes_from_the_connection_type(ledger: RunLedger, ledger_uri: str) -> None:
    expected = Dialect.SQLITE if ledger_uri.startswith("sqlite") else Dialect.POSTGRES
    assert ledger.dialect is expected
    assert type(ledger.hook).__name__ == ("SqliteHook" if expected is Dialect.SQLITE else "PostgresHook")


def test_recording_the_same_run_three_times_keeps_one_row_and_the_latest_try(ledger: RunLedger) -> None:
    run = make_run("manual__1")
    for try_number in (1, 2, 3):
        step = StepRecord(
            "train",
            "success" if try_number == 3 else "failed",
            try_number,
            T0 + timedelta(minutes=20 * try_number),
            T0 + timedelta(minutes=20 * try_number + 15),
            f"rl-job-{try_number}",
        )
        ledger.record(
            run,
            [step, StepRecord("deploy_cluster", "success", 1, T0, T0 + timedelta(minutes=10))],
            rewards(0.12, 0.34),
            [ArtifactRecord("hf_export", "gs://bucket/qwen3-30b-a3b/hf-trained/")],
        )

    assert count_rows(ledger, "runs") == 1
    assert count_rows(ledger, "run_steps", run.run_id) == 2
    assert count_rows(ledger, "run_metrics", run.run_id) == 2
    assert count_rows(ledger, "run_artifacts", run.run_id) == 1
    train = ledger.recorded_steps(run.run_id)["train"]
    assert (train.state, train.try_number, train.job_name) == ("success", 3, "rl-job-3")
    assert train.started_at == T0 + timedelta(minutes=60)


def test_an_older_try_never_overwrites_a_newer_one(ledger: RunLedger) -> None:
    run = make_run("manual__stale")
    newer = StepRecord("train", "success", 2, T0, T0 + timedelta(minutes=30), "rl-job-2")
    older = StepRecord("train", "failed", 1, T0 - timedelta(hours=1), T0, "rl-job-1")
    ledger.record(run, [newer])
    ledger.record(run, [older])
    assert ledger.recorded_steps(run.run_id)["train"] == newer


def test_a_step_without_times_keeps_the_recorded_ones(ledger: RunLedger) -> None:
    run = make_run("manual__partial")
    ledger.record_steps(run.run_id, [StepRecord("train", "running", 1, T0, None)])
    ledger.record(run, [StepRecord("train", "failed", None, None, T0 + timedelta(minutes=5))])
    step = ledger.recorded_steps(run.run_id)["train"]
    assert (step.state, step.try_number, step.started_at) == ("failed", 1, T0)
    assert step.ended_at == T0 + timedelta(minutes=5)


def test_a_deferred_task_resuming_in_the_same_try_keeps_its_first_start(ledger: RunLedger) -> None:
    run = make_run("manual__deferred")
    ledger.record_steps(run.run_id, [StepRecord("train", "running", 1, T0, None)])
    resumed = T0 + timedelta(hours=3)  # the trigger fired; the task runs again, same try
    ledger.record_steps(
        run.run_id, [StepRecord("train", "success", 1, resumed, resumed + timedelta(seconds=5))]
    )
    step = ledger.recorded_steps(run.run_id)["train"]
    assert step.started_at == T0
    assert step.ended_at == resumed + timedelta(seconds=5)
    assert step.state == "success"


def test_a_new_try_clears_the_end_of_the_previous_one(ledger: RunLedger) -> None:
    run = make_run("manual__retry")
    ledger.record_steps(run.run_id, [StepRecord("train", "up_for_retry", 1, T0, T0 + timedelta(minutes=5))])
    ledger.record_steps(run.run_id, [StepRecord("train", "running", 2, T0 + timedelta(minutes=7), None)])
    step = ledger.recorded_steps(run.run_id)["train"]
    assert (step.state, step.try_number, step.ended_at) == ("running", 2, None)


def test_failed_run_is_recorded_failed_with_its_failed_steps(ledger: RunLedger) -> None:
    run = make_run("manual__bad", state="failed")
    ledger.record(
        run,
        [
            StepRecord("train", "failed", 1, T0, T0 + timedelta(minutes=3), "rl-bad"),
            StepRecord("export_to_huggingface", "upstream_failed"),
            StepRecord("destroy_cluster", "success", 1, T0, T0 + timedelta(hours=2)),
        ],
        rewards(0.2, None),
    )
    [summary] = ledger.latest_runs()
    assert summary.state == "failed"
    assert (summary.pre_mean_reward, summary.post_mean_reward, summary.export_uri) == (0.2, None, None)
    failed = ledger.failed_steps()
    assert [(row["task_id"], row["state"], row["job_name"]) for row in failed] == [
        ("export_to_huggingface", "upstream_failed", None),
        ("train", "failed", "rl-bad"),
    ]
    assert failed[1]["ended_at"] == T0 + timedelta(minutes=3)
    assert (failed[1]["model"], failed[1]["try_number"]) == ("qwen3-30b-a3b", 1)


def test_failed_steps_newest_runs_first_with_model_filter_and_limit(ledger: RunLedger) -> None:
    for name, model, day in (
        ("old", "qwen3-30b-a3b", 0),
        ("new", "qwen3-30b-a3b", 2),
        ("gem", "gemma4-26b", 1),
    ):
        ledger.record(
            make_run(name, model=model, state="failed", start=T0 + timedelta(days=day)),
            [StepRecord("train", "failed", 2), StepRecord("convert", "success", 1)],
        )

    assert [row["run_id"].split("/")[1] for row in ledger.failed_steps()] == ["new", "gem", "old"]
    assert [row["run_id"].split("/")[1] for row in ledger.failed_steps(model="gemma4-26b")] == ["gem"]
    assert [row["run_id"].split("/")[1] for row in ledger.failed_steps(limit=1)] == ["new"]
    with pytest.raises(ValueError, match="limit"):
        ledger.failed_steps(limit=0)


def test_state_changes_when_a_run_is_recorded_again(ledger: RunLedger) -> None:
    ledger.record(make_run("manual__flip", state="failed"))
    ledger.record(make_run("manual__flip", state="success"))
    assert [run.state for run in ledger.latest_runs()] == ["success"]


def test_latest_runs_newest_first_with_model_filter_and_limit(ledger: RunLedger) -> None:
    ledger.record(make_run("r_old", start=T0), [], rewards(0.1, 0.2))
    ledger.record(make_run("r_new", start=T0 + timedelta(days=2)), [], rewards(0.3, 0.5))
    ledger.record(make_run("r_mid", model="gemma4-26b", start=T0 + timedelta(days=1)))

    assert [run.airflow_run_id for run in ledger.latest_runs()] == ["r_new", "r_mid", "r_old"]
    assert [run.airflow_run_id for run in ledger.latest_runs(limit=2)] == ["r_new", "r_mid"]
    assert [run.airflow_run_id for run in ledger.latest_runs(model="qwen3-30b-a3b")] == ["r_new", "r_old"]
    assert [run.airflow_run_id for run in ledger.latest_runs(model="gemma4-26b")] == ["r_mid"]
    assert ledger.latest_runs(model="llama3.1-8b") == []
    newest = ledger.latest_runs(limit=1)[0]
    assert newest.run_id == f"{DAG}/r_new"
    assert (newest.pre_mean_reward, newest.post_mean_reward) == (0.3, 0.5)
    assert newest.started_at == T0 + timedelta(days=2)
    assert newest.duration_seconds == pytest.approx(7200.0)
    with pytest.raises(ValueError, match="limit"):
        ledger.latest_runs(limit=0)


def test_latest_runs_say_why_a_run_has_no_reward(ledger: RunLedger) -> None:
    off = [MetricRecord("train", 0, "num_test_batches", 0.0)]
    on = [MetricRecord("train", 0, "num_test_batches", 2.0), *rewards(0.1, 0.3)]
    ledger.record(make_run("off"), [], off)
    ledger.record(make_run("on", start=T0 + timedelta(days=1)), [], on)
    ledger.record(make_run("unknown", start=T0 + timedelta(days=2)))

    runs = {run.airflow_run_id: run for run in ledger.latest_runs()}
    assert [runs[name].num_test_batches for name in ("off", "on", "unknown")] == [0.0, 2.0, None]
    assert runs["off"].no_reward_reason == "no reward: num_test_batches=0, evaluation off"
    assert runs["on"].no_reward_reason is None
    assert runs["unknown"].no_reward_reason is None
    assert (runs["on"].pre_mean_reward, runs["on"].post_mean_reward) == (0.1, 0.3)


def test_latest_runs_show_what_resuming_the_training_cost(ledger: RunLedger) -> None:
    ledger.record(replace(make_run("resumed"), resume_loss=ResumeLoss(2, 7, 431.5)))
    ledger.record(make_run("unknown", start=T0 + timedelta(days=1)))
    runs = {run.airflow_run_id: run for run in ledger.latest_runs()}
    assert (runs["resumed"].resumes, runs["resumed"].steps_lost, runs["resumed"].seconds_lost) == (
        2,
        7,
        431.5,
    )
    assert (runs["unknown"].resumes, runs["unknown"].steps_lost, runs["unknown"].seconds_lost) == (None,) * 3


def test_one_runs_summary_and_its_artifacts_curves_added_after_the_run(ledger: RunLedger) -> None:
    """What the dashboard's run page reads, on SQLite and PostgreSQL."""
    ledger.record(make_run("r1", start=T0), [], rewards(0.1, 0.2))
    ledger.record(make_run("r2", start=T0 + timedelta(days=1)))
    ledger.record_artifacts(
        f"{DAG}/r1", [ArtifactRecord("curves", "gs://b/m/trained/r1/tpu-rl-curves-x.png")]
    )

    summary = ledger.run_summary(f"{DAG}/r1")
    assert summary is not None
    assert (summary.airflow_run_id, summary.pre_mean_reward, summary.post_mean_reward) == ("r1", 0.1, 0.2)
    assert ledger.run_summary(f"{DAG}/nope") is None
    assert ledger.run_artifacts(f"{DAG}/r1") == [
        ArtifactRecord("curves", "gs://b/m/trained/r1/tpu-rl-curves-x.png")
    ]
    assert ledger.run_artifacts(f"{DAG}/r2") == []


def test_reward_trend_per_model_oldest_first(ledger: RunLedger) -> None:
    ledger.record(make_run("q2", start=T0 + timedelta(days=1)), [], rewards(0.30, 0.45))
    ledger.record(make_run("q1", start=T0), [], rewards(0.10, 0.25))
    ledger.record(make_run("g1", model="gemma4-26b", start=T0), [], rewards(0.50, None))
    ledger.record(make_run("no_reward", start=T0 + timedelta(days=3)))  # Qwen seed: num_test_batches=0

    trend = ledger.reward_trend()
    assert [(row["model"], row["run_id"].split("/")[1]) for row in trend] == [
        ("gemma4-26b", "g1"),
        ("qwen3-30b-a3b", "q1"),
        ("qwen3-30b-a3b", "q2"),
    ]
    qwen = ledger.reward_trend(model="qwen3-30b-a3b")
    assert [row["reward_delta"] for row in qwen] == [pytest.approx(0.15), pytest.approx(0.15)]
    assert [row["post_mean_reward"] for row in qwen] == [pytest.approx(0.25), pytest.approx(0.45)]
    assert ledger.reward_trend(model="gemma4-26b")[0]["reward_delta"] is None


def test_chip_hours_are_chips_times_cluster_lifetime(ledger: RunLedger) -> None:
    ledger.record(make_run("gke", chips=32, hours=2.0))  # cluster lived 1h50m
    ledger.record(
        make_run("vm", model="llama3.1-8b-Instruct", chips=8, hours=1.0, start=T0 + timedelta(days=1))
    )

    runs = {run.airflow_run_id: run for run in ledger.latest_runs()}
    assert (runs["gke"].chips, runs["vm"].chips) == (32, 8)
    assert runs["gke"].held_chip_hours == pytest.approx(32 * (110 / 60))
    assert runs["vm"].held_chip_hours == pytest.approx(8 * (50 / 60))
    [vm] = ledger.latest_runs(model="llama3.1-8b-Instruct")
    assert vm.held_chip_hours == pytest.approx(8 * (50 / 60))


def test_conf_is_stored_without_secrets(ledger: RunLedger) -> None:
    run = make_run("conf", conf={"bucket": "b", "hf_token": "hf_abc", "nested": {"password": "p"}})
    ledger.record(run)
    with ledger._session(write=False) as session:
        [row] = session.fetch("SELECT conf_json FROM runs WHERE run_id = :run_id", {"run_id": run.run_id})
    stored = json.loads(row["conf_json"])
    assert stored == {"bucket": "b", "hf_token": "***", "nested": {"password": "***"}}
    assert "hf_abc" not in row["conf_json"]


def test_metrics_and_artifacts_upsert_by_their_keys(ledger: RunLedger) -> None:
    run = make_run("keys")
    ledger.record(
        run,
        [],
        [MetricRecord("intermediate", 10, "mean_reward", 0.2), MetricRecord("train", 10, "loss", 1.5)],
        [
            ArtifactRecord("actor_checkpoint", "gs://b/m/trained/rl/checkpoints/actor/25/", 25),
            ArtifactRecord("actor_checkpoint", "gs://b/m/trained/rl/checkpoints/actor/50/", 50),
        ],
    )
    ledger.record(run, [], [MetricRecord("intermediate", 10, "mean_reward", 0.25)], [])
    assert count_rows(ledger, "run_metrics", run.run_id) == 2
    assert count_rows(ledger, "run_artifacts", run.run_id) == 2
    with ledger._session(write=False) as session:
        rows = session.fetch(
            "SELECT metric_value FROM run_metrics WHERE run_id = :run_id AND phase = 'intermediate'",
            {"run_id": run.run_id},
        )
    assert [row["metric_value"] for row in rows] == [0.25]


def test_without_the_connection_the_ledger_is_sqlite_in_airflow_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_TPU_RL_LEDGER", raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow-home"))
    ledger = RunLedger()
    ledger.record(make_run("default"))
    assert ledger.dialect is Dialect.SQLITE
    assert default_sqlite_path() == tmp_path / "airflow-home" / "tpu_rl_ledger.db"
    assert default_sqlite_path().is_file()
    assert [run.airflow_run_id for run in RunLedger().latest_runs()] == ["default"]


def test_another_missing_connection_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_tpu_rl.compat import AirflowFailException
    from airflow_provider_tpu_rl.exceptions import ConfigurationError

    monkeypatch.delenv("AIRFLOW_CONN_NO_SUCH_LEDGER", raising=False)
    with pytest.raises(ConfigurationError, match="'no_such_ledger' is not defined") as raised:
        RunLedger("no_such_ledger").latest_runs()
    assert not isinstance(raised.value, AirflowFailException)


def test_an_unsupported_connection_type_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_provider_tpu_rl.exceptions import ConfigurationError

    monkeypatch.setenv("AIRFLOW_CONN_TPU_RL_LEDGER", "mysql://user@localhost/db")
    with pytest.raises(ConfigurationError, match="does not support conn_type 'mysql'"):
        RunLedger().latest_runs()


def test_concurrent_first_writers_apply_each_migration_once(ledger: RunLedger) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def first_write(index: int) -> list[int]:
        writer = RunLedger()
        applied = writer.apply_migrations()
        writer.record_steps(f"{DAG}/concurrent", [StepRecord(f"task_{index}", "success", 1)])
        return applied

    with ThreadPoolExecutor(max_workers=4) as pool:
        applied = list(pool.map(first_write, range(4)))

    assert sorted(version for versions in applied for version in versions) == [
        1,
        2,
        3,
        4,
        5,
        6,
        7,
        8,
        9,
        10,
        11,
        12,
    ]
    assert applied_versions(ledger) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    assert count_rows(ledger, "run_steps", f"{DAG}/concurrent") == 4


def running(airflow_run_id: str, start: datetime = T0) -> RunRecord:
    """A row as validate opens it (record_run_started): running, no end, no billed time."""
    return RunRecord(DAG, airflow_run_id, "qwen3-30b-a3b", "running", started_at=start, chips=8)


def test_a_crashed_runs_row_is_closed_abandoned_with_its_billed_time_and_reason(ledger: RunLedger) -> None:
    ledger.record(running("crashed"))
    destroyed = T0 + timedelta(hours=2)
    span = BilledSpan("tpu-vm-1", "42", 8, T0 + timedelta(minutes=10), destroyed, "janitor")
    reason = (
        "janitor: orphaned: its DAG run is running but none of its tasks is alive; deleted TPU VM tpu-vm-1"
    )
    closing = RunClosing(f"{DAG}/crashed", "abandoned", destroyed, reason, (span,), usd_per_chip_hour=2.0)

    assert ledger.close_run(closing) is True

    [summary] = ledger.latest_runs()
    assert (summary.state, summary.end_reason) == ("abandoned", reason)
    assert summary.ended_at == destroyed
    assert summary.duration_seconds == pytest.approx(7200.0)
    assert summary.billed_chip_seconds == pytest.approx(110 * 60 * 8)
    assert summary.chip_hours == pytest.approx(110 / 60 * 8)
    assert summary.estimated_cost_usd == pytest.approx(110 / 60 * 8 * 2.0)
    assert summary.billed_spans == (span,)


def test_closing_never_touches_a_row_already_closed_or_missing(ledger: RunLedger) -> None:
    ledger.record(make_run("finished", state="success"))
    ledger.record(running("crashed"))
    first = RunClosing(f"{DAG}/crashed", "failed", T0 + timedelta(hours=1), "janitor: its DAG run is failed")
    later = RunClosing(f"{DAG}/crashed", "abandoned", T0 + timedelta(hours=5), "janitor: again")

    assert ledger.close_run(RunClosing(f"{DAG}/finished", "abandoned", T0, "janitor: no")) is False
    assert ledger.close_run(RunClosing(f"{DAG}/nowhere", "abandoned", T0, "janitor: no")) is False
    assert ledger.close_run(first) is True
    assert ledger.close_run(later) is False  # idempotent: the first close stands

    runs = {run.airflow_run_id: run for run in ledger.latest_runs()}
    assert (runs["finished"].state, runs["finished"].end_reason) == ("success", None)
    assert runs["finished"].ended_at == T0 + timedelta(hours=2)
    crashed = runs["crashed"]
    assert (crashed.state, crashed.end_reason) == ("failed", "janitor: its DAG run is failed")
    assert crashed.ended_at == T0 + timedelta(hours=1)
    assert crashed.chip_hours is None  # no spans known: billed time unknown, not zero
    assert ledger.running_runs() == []


def test_a_later_record_run_replaces_the_state_and_keeps_the_reason(ledger: RunLedger) -> None:
    """record_run owns the row: if it runs after the janitor closed it, its state stands."""
    ledger.record(running("late"))
    ledger.close_run(
        RunClosing(f"{DAG}/late", "abandoned", T0 + timedelta(hours=1), "janitor: lease expired")
    )
    ledger.record(make_run("late", state="failed"))
    [summary] = ledger.latest_runs()
    assert (summary.state, summary.end_reason) == ("failed", "janitor: lease expired")


def test_running_runs_lists_only_rows_that_still_say_running(ledger: RunLedger) -> None:
    ledger.record(running("a"), recorded_at=T0)
    ledger.record(running("b"), recorded_at=T0 + timedelta(minutes=1))
    ledger.record(make_run("c", state="failed"))
    assert ledger.running_runs() == [f"{DAG}/b", f"{DAG}/a"]
    assert ledger.running_runs(limit=1) == [f"{DAG}/b"]


def test_a_ledger_at_version_10_upgrades_and_its_running_row_can_be_closed(
    ledger: RunLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An existing ledger (before end_reason) takes migration 0011 and keeps its rows."""
    real = load_migrations(ledger.dialect)
    monkeypatch.setattr(hook_module, "load_migrations", lambda dialect: real[:10])
    assert ledger.apply_migrations()[-1] == 10
    with ledger._session(write=True) as session:
        session.execute(
            "INSERT INTO runs (run_id, dag_id, airflow_run_id, model, state, started_at, recorded_at) "
            "VALUES (:run_id, :dag_id, :airflow_run_id, 'm', 'running', :started_at, :started_at)",
            {"run_id": f"{DAG}/old", "dag_id": DAG, "airflow_run_id": "old", "started_at": T0},
        )
    monkeypatch.setattr(hook_module, "load_migrations", load_migrations)
    upgraded = RunLedger()

    assert upgraded.apply_migrations() == [11, 12]
    assert upgraded.close_run(RunClosing(f"{DAG}/old", "abandoned", T0 + timedelta(hours=1), "janitor: x"))
    [summary] = upgraded.latest_runs()
    assert (summary.state, summary.end_reason, summary.duration_seconds) == (
        "abandoned",
        "janitor: x",
        3600.0,
    )


def test_a_ledger_at_version_11_upgrades_to_the_cluster_columns_and_keeps_its_rows(
    ledger: RunLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An existing ledger (before gke_cluster) takes migration 0012: its old rows read with no
    cluster, a later record of the same run fills it, a run on an existing cluster says so."""
    real = load_migrations(ledger.dialect)
    monkeypatch.setattr(hook_module, "load_migrations", lambda dialect: real[:11])
    assert ledger.apply_migrations()[-1] == 11
    with ledger._session(write=True) as session:  # a row as the code of version 11 wrote it
        session.execute(
            "INSERT INTO runs (run_id, dag_id, airflow_run_id, model, state, started_at, recorded_at) "
            "VALUES (:run_id, :dag_id, :airflow_run_id, 'm', 'running', :started_at, :started_at)",
            {"run_id": f"{DAG}/old", "dag_id": DAG, "airflow_run_id": "old", "started_at": T0},
        )
    monkeypatch.setattr(hook_module, "load_migrations", load_migrations)
    upgraded = RunLedger()

    assert upgraded.apply_migrations() == [12]
    [old] = upgraded.latest_runs()
    assert (old.run_id, old.state, old.gke_cluster, old.gke_cluster_origin) == (
        f"{DAG}/old",
        "running",
        None,
        None,
    )
    upgraded.record(
        replace(make_run("old"), gke_cluster="p/us-east5/c", gke_cluster_origin="kept"), [], [], []
    )
    upgraded.record(
        replace(
            make_run("new", start=T0 + timedelta(hours=3)),
            gke_cluster="team-p/us-east5-b/shared",
            gke_cluster_origin="existing",
        ),
        [],
        [],
        [],
    )
    new, old = upgraded.latest_runs()
    assert (old.state, old.cluster_text) == ("success", "p/us-east5/c (kept)")
    assert new.cluster_text == "team-p/us-east5-b/shared (existing)"
    # a later record that knows no cluster (None) keeps the one recorded
    upgraded.record(make_run("new", start=T0 + timedelta(hours=3)), [], [], [])
    assert upgraded.run_summary(f"{DAG}/new").gke_cluster_origin == "existing"  # type: ignore[union-attr]
