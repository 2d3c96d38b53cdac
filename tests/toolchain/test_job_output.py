"""gcluster job list parsing, and the hook's job commands against the fake gcluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.exceptions import CommandError, FailureKind, OutputParseError
from airflow_provider_tpu_rl.toolchain.job_output import (
    GclusterJob,
    JobState,
    parse_job_list,
)
from tests.support.fake_tools import fixture_path

FIXTURES = Path(fixture_path("job_list.txt")).parent


def test_parse_job_list_skips_noise_and_reads_every_row():
    jobs = parse_job_list((FIXTURES / "job_list.txt").read_text().splitlines())
    assert jobs == [
        GclusterJob(
            "qwen-convert-20260403", JobState.SUCCEEDED, "2026-04-03T10:00:00Z", "2026-04-03T10:41:17Z"
        ),
        GclusterJob("qwen-rl-20260403", JobState.RUNNING, "2026-04-03T11:00:00Z", None),
        GclusterJob("gemma-rl-failed", JobState.FAILED, "2026-04-02T09:00:00Z", "2026-04-02T09:05:00Z"),
        GclusterJob("waiting-for-quota", JobState.SUSPENDED, "2026-04-03T11:30:00Z", None),
        GclusterJob("odd-one", JobState.UNKNOWN, "2026-04-03T11:45:00Z", None),
    ]
    assert jobs[0].completed_at is not None
    assert jobs[0].completed_at.minute == 41
    assert jobs[1].completed_at is None


def test_parse_job_list_handles_colour_codes_and_unknown_statuses():
    lines = [
        "\x1b[35m2026-04-03T12:00:00Z\x1b[0m: Listing jobs in cluster 'c'...",
        "NAME   STATUS   CREATION_TIME   COMPLETION_TIME",
        "a-job   Pending   2026-04-03T11:00:00Z   ",
        "b-job   Evicted   2026-04-03T11:00:00Z   ",
    ]
    assert [j.state for j in parse_job_list(lines)] == [JobState.PENDING, JobState.UNKNOWN]


def test_parse_job_list_empty_table():
    assert parse_job_list((FIXTURES / "job_list_empty.txt").read_text().splitlines()) == []


def test_parse_job_list_without_header_is_an_error():
    with pytest.raises(ValueError, match="header"):
        parse_job_list((FIXTURES / "job_list_error.txt").read_text().splitlines())


def test_rows_before_the_header_are_not_jobs():
    lines = ["fake-row   Running   2026-04-03T11:00:00Z", "NAME STATUS CREATION_TIME COMPLETION_TIME"]
    assert parse_job_list(lines) == []


def test_list_jobs_runs_job_list_with_scope_flags(make_hook, fake_tools):
    fake_tools.respond({"match": ["job", "list"], "steps": [["file", fixture_path("job_list.txt")]]})
    jobs = make_hook(region="us-east5").list_jobs(cluster="rl-cluster")
    assert [j.name for j in jobs][:2] == ["qwen-convert-20260403", "qwen-rl-20260403"]
    assert fake_tools.calls()[0]["argv"] == [
        "job", "list", "--project=proj", "--cluster=rl-cluster", "--location=us-east5",
    ]  # fmt: skip


def test_get_job_filters_by_name_and_matches_exactly(make_hook, fake_tools):
    fake_tools.respond({"match": ["job", "list"], "steps": [["file", fixture_path("job_list.txt")]]})
    hook = make_hook()
    job = hook.get_job("qwen-rl-20260403", "p", "c", "l")
    assert job is not None
    assert job.state is JobState.RUNNING
    assert hook.get_job("qwen-rl", "p", "c", "l") is None
    argv = fake_tools.calls()[0]["argv"]
    assert "--name-contains=qwen-rl-20260403" in argv


def test_list_jobs_with_unparseable_output_raises(make_hook, fake_tools):
    fake_tools.respond({"match": ["job", "list"], "steps": [["out", "something else entirely"]]})
    with pytest.raises(OutputParseError, match="header"):
        make_hook().list_jobs("p", "c", "l")


def test_list_jobs_config_error_is_not_retryable(make_hook, fake_tools):
    fake_tools.respond(
        {"match": ["job", "list"], "steps": [["file", fixture_path("job_list_error.txt")]], "exit": 1}
    )
    with pytest.raises(CommandError, match="get-credentials") as info:
        make_hook().list_jobs("p", "c", "l")
    assert info.value.kind is FailureKind.CONFIG
    assert not info.value.retryable
    assert not isinstance(info.value, AirflowFailException)


def test_cancel_job_reports_whether_there_was_a_job(make_hook, fake_tools):
    fake_tools.respond(
        {
            "match": ["cancel", "gone"],
            "steps": [["err", "Error: jobset gone not found in any namespace"]],
            "exit": 1,
        },
        {
            "match": ["cancel"],
            "steps": [["out", "2026-04-03T12:00:00Z: Cancel operation on Job 'j' completed."]],
        },
    )
    hook = make_hook()
    assert hook.cancel_job("j", "p", "c", "l") is True
    assert hook.cancel_job("gone", "p", "c", "l") is False
