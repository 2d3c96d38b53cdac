"""The bounds of a pipeline's pieces (timeouts.py): the defaults, read from the ``[tpu_rl]`` options
(fractions allowed), each refused in one line unless positive and finite.

That every task of the shipped DAGs is bounded is tests/dags/test_timeouts.py's."""

from __future__ import annotations

from datetime import timedelta

import pytest

from airflow_provider_tpu_rl import timeouts


def test_defaults_match_the_issue() -> None:
    minutes = {s: timeouts.task_timeout(s) / timedelta(minutes=1) for s in timeouts.DEFAULT_TASK_MINUTES}
    assert minutes["deploy"] == 90
    assert minutes["convert"] == 180
    assert minutes["train"] == 48 * 60
    assert minutes["export"] == 180
    assert minutes["teardown"] == 90
    assert timeouts.command_timeout() == 20 * 60


def test_options_are_read_from_the_config_and_may_be_fractional(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__TPU_RL__TRAIN_TIMEOUT_MINUTES", "90")
    monkeypatch.setenv("AIRFLOW__TPU_RL__DEPLOY_TIMEOUT_MINUTES", "0.5")
    monkeypatch.setenv("AIRFLOW__TPU_RL__COMMAND_TIMEOUT_MINUTES", "2.5")
    assert timeouts.task_timeout("train") == timedelta(minutes=90)
    assert timeouts.task_timeout("deploy") == timedelta(seconds=30)
    assert timedelta(0) < timeouts.job_timeout("train") < timedelta(minutes=90)
    assert timeouts.stage_command_timeout("deploy") < 30
    assert timeouts.command_timeout() == 150


def test_dagrun_timeout_hours_overrides_the_sum(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__TPU_RL__DAGRUN_TIMEOUT_HOURS", "72")
    assert timeouts.dagrun_timeout("gke") == timedelta(hours=72)


@pytest.mark.parametrize("value", ["0", "-5", "inf", "nan"])
def test_a_bound_that_is_not_positive_and_finite_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("AIRFLOW__TPU_RL__DEPLOY_TIMEOUT_MINUTES", value)
    with pytest.raises(
        ValueError, match="deploy_timeout_minutes must be a positive, finite number"
    ) as refused:
        timeouts.task_timeout("deploy")
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("inf", "must be a positive, finite number of minutes, not inf"),
        ("1e-9", "must be at least 5 minutes, not 1e-09"),
        ("4.9", "must be at least 5 minutes, not 4.9"),
    ],
)
def test_the_admission_bound_is_finite_and_at_least_five_minutes(
    monkeypatch: pytest.MonkeyPatch, value: str, rule: str
) -> None:
    """`inf` overflowed a timedelta while the DAG was parsed; `1e-9` made a 0 s bound that cancels
    every job before its first pod could start (issue 43, item 3)."""
    monkeypatch.setenv("AIRFLOW__TPU_RL__ADMISSION_TIMEOUT_MINUTES", value)
    with pytest.raises(ValueError) as refused:
        timeouts.admission_timeout()
    assert str(refused.value) == f"[tpu_rl] admission_timeout_minutes {rule}"
    monkeypatch.setenv("AIRFLOW__TPU_RL__ADMISSION_TIMEOUT_MINUTES", "5")
    assert timeouts.admission_timeout() == timedelta(minutes=5)


@pytest.mark.parametrize(
    ("option", "value"), [("DAGRUN_TIMEOUT_HOURS", "inf"), ("KILL_GRACE_SECONDS", "inf")]
)
def test_other_unbounded_options_are_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, option: str, value: str
) -> None:
    monkeypatch.setenv(f"AIRFLOW__TPU_RL__{option}", value)
    with pytest.raises(ValueError, match=f"{option.lower()} must be a finite number"):
        timeouts.dagrun_timeout("gke") if option.startswith("DAGRUN") else timeouts.kill_grace_seconds()


def test_unknown_stage_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown stage"):
        timeouts.task_timeout("nap")


def test_the_ssh_boot_wait_is_bounded_and_polls_as_often_as_gclouds_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert timeouts.ssh_boot_wait() == (300.0, 5.0)  # gcloud's SSHPoller: every 5 s (for 60 s)
    monkeypatch.setenv("AIRFLOW__TPU_RL__SSH_BOOT_WAIT_MINUTES", "inf")
    with pytest.raises(ValueError, match="ssh_boot_wait_minutes must be a positive, finite number"):
        timeouts.ssh_boot_wait()
    monkeypatch.setenv("AIRFLOW__TPU_RL__SSH_BOOT_WAIT_MINUTES", "2")
    monkeypatch.setenv("AIRFLOW__TPU_RL__SSH_BOOT_POLL_SECONDS", "0")
    with pytest.raises(ValueError, match="ssh_boot_poll_seconds must be a finite number > 0"):
        timeouts.ssh_boot_wait()


def test_the_flex_start_probe_is_bounded_ten_minutes_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert timeouts.flex_start_probe_timeout() == 600
    monkeypatch.setenv("AIRFLOW__TPU_RL__FLEX_START_PROBE_TIMEOUT_MINUTES", "2.5")
    assert timeouts.flex_start_probe_timeout() == 150
    monkeypatch.setenv("AIRFLOW__TPU_RL__FLEX_START_PROBE_TIMEOUT_MINUTES", "inf")
    with pytest.raises(
        ValueError, match="flex_start_probe_timeout_minutes must be a positive, finite number"
    ):
        timeouts.flex_start_probe_timeout()
