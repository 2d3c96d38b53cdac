"""gcluster job list/logs parsing, and the hook's job commands against the fake gcluster."""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow.providers.common.compat.sdk import AirflowFailException

from airflow_provider_tpu_rl.exceptions import CommandError, FailureKind, OutputParseError
from airflow_provider_tpu_rl.hooks.jobs import (
    GclusterJob,
    JobState,
    new_log_lines,
    parse_job_list,
    workload_log_lines,
)
from tests.hooks.conftest import fixture_path

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


def test_workload_log_lines_drops_gcluster_info_lines():
    lines = workload_log_lines((FIXTURES / "job_logs.txt").read_text().splitlines())
    assert lines[0] == "Starting RL training..."
    assert lines[-1] == "Train step 1 training loss: 0.482100"
    assert not any(line.startswith("2026-04-03T12:00:00Z:") for line in lines)


@pytest.mark.parametrize(
    ("seen", "current", "new"),
    [
        ([], ["a", "b"], ["a", "b"]),
        (["a", "b"], ["a", "b", "c"], ["c"]),  # whole log, grown
        (["a", "b"], ["a", "b"], []),
        (["a", "b", "c"], ["b", "c", "d", "e"], ["d", "e"]),  # sliding tail window
        (["x", "y"], ["p", "q"], ["p", "q"]),  # a gap: everything is new
        (["a", "a"], ["a", "a", "a"], ["a"]),
    ],
)
def test_new_log_lines(seen, current, new):
    assert new_log_lines(seen, current) == new


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


def test_stream_job_logs_logs_every_line_and_returns_workload_lines(make_hook, fake_tools, recording_logger):
    fake_tools.respond({"match": ["job", "logs"], "steps": [["file", fixture_path("job_logs.txt")]]})
    lines = make_hook().stream_job_logs("qwen-rl-20260403", "p", "c", "l")
    assert lines[0] == "Starting RL training..."
    assert "[gcluster] Reshard finished in 3.21s" in recording_logger.messages
    assert fake_tools.calls()[0]["argv"][:3] == ["job", "logs", "qwen-rl-20260403"]


async def test_async_list_jobs_uses_the_same_parser(make_hook, fake_tools):
    fake_tools.respond({"match": ["job", "list"], "steps": [["file", fixture_path("job_list.txt")]]})
    hook = make_hook()
    assert await hook.async_list_jobs("p", "c", "l") == hook.list_jobs("p", "c", "l")


async def test_async_run_masks_secrets_and_closes_stdin(make_hook, fake_tools):
    from airflow_provider_tpu_rl.render.command import Command

    fake_tools.respond({"match": ["secrets"], "steps": [["stdin"], ["prompt"]], "exit": 1})
    result = await make_hook().async_run(
        Command(("gcloud", "secrets", "x"), stdin_secret="t"), secrets={"t": "sekret-value-1"}, timeout=30
    )
    assert result.output_lines[0] == "received token=***"
    assert "Error: EOF" in result.output_lines


async def test_async_run_timeout_kills_the_process(make_hook, fake_tools):
    from airflow_provider_tpu_rl.render.command import Command

    fake_tools.respond({"match": [], "steps": [["sleep", 300]]})
    result = await make_hook().async_run(Command(("gcluster", "job", "logs", "j")), timeout=0.5)
    assert result.timed_out
