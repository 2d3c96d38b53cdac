"""Records, run ids, chip-hours and conf redaction."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from airflow_provider_tpu_rl.ledger.billing import BilledSpan
from airflow_provider_tpu_rl.ledger.records import (
    ArtifactRecord,
    MetricRecord,
    ResumeLoss,
    RunClosing,
    RunRecord,
    StepRecord,
    as_utc,
    closing_state,
    estimate_chip_hours,
    idle_share,
    make_run_id,
    redact_conf,
    resume_loss,
    reward_summary,
)

T0 = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)


def test_chip_hours_are_lifetime_times_chips() -> None:
    assert estimate_chip_hours(T0, T0 + timedelta(hours=1, minutes=30), 32) == pytest.approx(48.0)
    assert estimate_chip_hours(T0, T0 + timedelta(minutes=15), 8) == pytest.approx(2.0)
    assert estimate_chip_hours(T0, T0, 32) == 0.0


def test_chip_hours_compare_times_across_time_zones() -> None:
    tokyo = timezone(timedelta(hours=9))
    assert estimate_chip_hours(T0, datetime(2026, 3, 1, 19, 0, tzinfo=tokyo), 4) == pytest.approx(8.0)


@pytest.mark.parametrize(("started", "ended", "chips"), [(None, T0, 8), (T0, None, 8), (T0, T0, None)])
def test_chip_hours_unknown_when_an_input_is(
    started: datetime | None, ended: datetime | None, chips: int | None
) -> None:
    assert estimate_chip_hours(started, ended, chips) is None


def test_chip_hours_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="before it started"):
        estimate_chip_hours(T0, T0 - timedelta(seconds=1), 8)
    with pytest.raises(ValueError, match="chips"):
        estimate_chip_hours(T0, T0, -1)


def test_run_id_joins_dag_and_airflow_run() -> None:
    run = RunRecord("tpu_rl_gke_pipeline", "manual__2026-03-01T08:00:00+00:00", "m", "running")
    assert run.run_id == make_run_id("tpu_rl_gke_pipeline", "manual__2026-03-01T08:00:00+00:00")
    assert run.run_id == "tpu_rl_gke_pipeline/manual__2026-03-01T08:00:00+00:00"


def test_run_record_derives_duration_and_chip_hours() -> None:
    run = RunRecord("d", "r", "m", "success", T0, T0 + timedelta(hours=2), 32, T0, T0 + timedelta(hours=1))
    assert (run.duration_seconds, run.held_chip_hours, run.chip_hours) == (7200.0, 32.0, None)
    billed = replace(
        run, billed_spans=(BilledSpan("vm", "1", 32, T0 + timedelta(minutes=6), T0 + timedelta(minutes=51)),)
    )
    assert (billed.chip_hours, billed.billed_chip_seconds) == (
        24.0,
        32 * 45 * 60,
    )  # its clocks: 45 of 60 minutes
    assert RunRecord("d", "r", "m", "success").chip_hours is None


def test_run_record_splits_billed_tpu_time_into_trained_and_idle() -> None:
    hour = timedelta(hours=1)
    run = RunRecord(
        "d", "r", "m", "success", T0, T0 + 3 * hour, 32, T0, T0 + 2 * hour,
        train_started_at=T0 + hour / 2, train_ended_at=T0 + hour, usd_per_chip_hour=2.7,
        billed_spans=(BilledSpan("vm", "1", 32, T0, T0 + 2 * hour),),
    )  # fmt: skip
    assert (run.chip_hours, run.busy_chip_hours) == (64.0, 16.0)
    assert run.idle_share == pytest.approx(0.75)
    assert run.estimated_cost_usd == pytest.approx(64 * 2.7)
    # a training span reported past the capacity's end never counts more than was billed
    longer = replace(run, train_started_at=T0 - hour, train_ended_at=T0 + 3 * hour)
    assert (longer.busy_chip_hours, longer.idle_share) == (64.0, 0.0)
    unknown = replace(run, train_started_at=None, usd_per_chip_hour=None)
    assert (unknown.busy_chip_hours, unknown.idle_share, unknown.estimated_cost_usd) == (None, None, None)
    assert idle_share(0.0, 0.0) is None


def test_records_validate_their_enumerations() -> None:
    with pytest.raises(ValueError, match="run state"):
        RunRecord("d", "r", "m", "succeeded")
    with pytest.raises(ValueError, match="must not be empty"):
        RunRecord("", "r", "m", "success")
    with pytest.raises(ValueError, match="metric phase"):
        MetricRecord("eval", 0, "mean_reward", 0.1)
    with pytest.raises(ValueError, match="artifact kind"):
        ArtifactRecord("checkpoint", "gs://b/x")
    with pytest.raises(ValueError, match="uri"):
        ArtifactRecord("hf_export", "")


def test_step_duration() -> None:
    assert StepRecord("t", "success", 1, T0, T0 + timedelta(seconds=90)).duration_seconds == 90.0
    assert StepRecord("t", "running", 1, T0, None).duration_seconds is None


def test_redact_conf_hides_secret_looking_keys_at_any_depth() -> None:
    conf = {
        "hf_token": "hf_abc",
        "HF_ACCESS_TOKEN": "hf_def",
        "bucket": "b",
        "db": {"password": "p", "host": "h"},
        "extra": [{"api_key": "k"}, {"apiKey": "k2", "name": "n"}],
    }
    assert redact_conf(conf) == {
        "hf_token": "***",
        "HF_ACCESS_TOKEN": "***",
        "bucket": "b",
        "db": {"password": "***", "host": "h"},
        "extra": [{"api_key": "***"}, {"apiKey": "***", "name": "n"}],
    }
    assert conf["hf_token"] == "hf_abc"  # the input is left alone
    assert redact_conf(None) == {}


def test_as_utc_accepts_naive_aware_and_text() -> None:
    assert as_utc(datetime(2026, 3, 1, 8, 0)) == T0
    assert as_utc("2026-03-01T17:00:00+09:00") == T0
    assert as_utc("2026-03-01T08:00:00.000000+00:00") == T0
    assert as_utc(None) is None
    assert as_utc(T0).tzinfo is UTC  # type: ignore[union-attr]


def test_the_train_summary_says_why_a_reward_is_missing() -> None:
    both = {"pre": {"mean_reward": 0.125}, "post": {"mean_reward": 0.5}}
    assert reward_summary(both, 2) == "mean reward before 0.125, after 0.5"
    assert reward_summary({"pre": None, "post": None}, 0) == (
        "mean reward before -, after - (no reward: num_test_batches=0, evaluation off)"
    )
    assert reward_summary({"pre": {"mean_reward": 0.125}, "post": None}, 2) == (
        "mean reward before 0.125, after - (no reward after training: evaluation was on "
        "(num_test_batches=2) but the training log held no such line)"
    )
    assert reward_summary({}, None) == "mean reward before -, after -"


def attempt(run: str, start: int, reached: int | None, began: float | None, ended: float) -> dict[str, Any]:
    return {
        "run": run,
        "job": "j",
        "from_step": start,
        "reached_step": reached,
        "started_at": began,
        "ended_at": ended,
    }


def test_resume_loss_counts_the_steps_trained_again_and_the_time_they_cost() -> None:
    run = "dag/r1"
    # 13 steps in 130 s, then preempted; checkpoint 10 was the newest committed; restarted 60 s later
    attempts = [attempt(run, 0, 13, 1000.0, 1130.0), attempt(run, 10, 50, 1190.0, 1600.0)]
    assert resume_loss(attempts, run) == ResumeLoss(1, 3, 60.0 + 3 * 10.0)
    assert resume_loss(attempts[:1], run) == ResumeLoss(0, 0, 0.0)  # never resumed
    # a second run resuming what a failed first run left: the resume is the second run's
    assert resume_loss(attempts, "dag/r0") == ResumeLoss(0, 0, 0.0)
    assert resume_loss([{**attempts[0], "run": "dag/r0"}, attempts[1]], run) == ResumeLoss(1, 3, 90.0)


def test_resume_loss_without_times_or_progress_is_partly_unknown() -> None:
    run = "dag/r1"
    no_start = [attempt(run, 0, 13, 1000.0, 1130.0), attempt(run, 10, 50, None, 1600.0)]
    assert resume_loss(no_start, run) == ResumeLoss(1, 3, None)
    no_progress = [attempt(run, 0, None, 1000.0, 1130.0), attempt(run, 0, 50, 1190.0, 1600.0)]
    assert resume_loss(no_progress, run) == ResumeLoss(1, 0, 60.0)
    assert resume_loss(None, run) is None
    assert resume_loss(["not an attempt"], run) is None


def test_the_janitor_closes_failed_only_when_the_dag_run_failed() -> None:
    assert closing_state("failed") == "failed"
    assert [closing_state(state) for state in ("running", "success", "queued", None)] == ["abandoned"] * 4
    assert RunRecord("d", "r", "m", "abandoned").state == "abandoned"  # the ledger accepts it


def test_a_closing_is_one_line_with_a_closing_state_and_bills_its_spans_up_to_its_end() -> None:
    open_span = BilledSpan("vm", "1", 4, T0, None)
    closing = RunClosing("d/r", "abandoned", datetime(2026, 3, 1, 9, 0), "janitor: x", (open_span,))
    assert closing.ended_at == T0 + timedelta(hours=1)  # naive means UTC
    assert closing.billed_chip_seconds == 4 * 3600.0
    assert RunClosing("d/r", "failed", T0, "janitor: x").billed_chip_seconds is None
    for state, reason in (("running", "x"), ("success", "x"), ("abandoned", ""), ("failed", "a\nb")):
        with pytest.raises(ValueError):
            RunClosing("d/r", state, T0, reason)


def test_the_capacity_a_run_got_in_words() -> None:
    from airflow_provider_tpu_rl.ledger.records import capacity_text, served_capacity

    fell_back = {
        "capacity": ["reservation", "flex-start", "spot"],
        "capacity_served": "spot",
        "capacity_attempts": [
            {"capacity": "reservation", "error": "e1"},
            {"capacity": "flex-start", "error": "e2"},
        ],
    }
    assert served_capacity(fell_back) == "spot"
    assert capacity_text(fell_back) == "spot (after reservation, flex-start refused)"
    assert (
        capacity_text({"capacity": ["reservation", "spot"], "capacity_served": "reservation"})
        == "reservation"
    )
    assert capacity_text({"capacity": ["reservation", "spot"]}) == "reservation then spot"  # never served
    assert (served_capacity({"capacity": "spot"}), capacity_text({"capacity": "spot"})) == ("spot", "spot")
    assert (served_capacity({}), capacity_text({})) == (None, None)


def test_the_gke_cluster_and_its_origin_from_validates_values_and_the_deploy() -> None:
    from airflow_provider_tpu_rl.ledger.records import gke_cluster

    create = {"project": "p-1", "region": "us-east5", "cluster_name": "c", "cluster_mode": "create"}
    assert gke_cluster(create) == ("p-1/us-east5/c", None)  # not deployed yet
    assert gke_cluster(create, {"cluster_origin": "created"}) == ("p-1/us-east5/c", "created")
    assert gke_cluster(create, {"cluster_origin": "kept"}) == ("p-1/us-east5/c", "kept")
    assert gke_cluster(create, {"cluster_origin": "made up"}) == ("p-1/us-east5/c", None)
    existing = {**create, "cluster_mode": "existing", "existing_cluster": "p-1/us-east5-b/shared"}
    # the named cluster, whatever deploy_cluster returned (the run's CPU pool's result)
    assert gke_cluster(existing, {"cluster_origin": "created"}) == ("p-1/us-east5-b/shared", "existing")
    assert gke_cluster({"project": "p-1", "zone": "us-east5-b", "vm_name": "vm"}) == (None, None)


def test_a_run_record_refuses_an_unknown_cluster_origin() -> None:
    with pytest.raises(ValueError, match="gke_cluster_origin must be one of"):
        RunRecord("d", "r", "m", "success", gke_cluster="p/l/c", gke_cluster_origin="borrowed")
