"""GclusterJobTrigger against a fake gcluster: one final event per outcome, logs relayed once."""

from __future__ import annotations

import asyncio
import importlib
import json
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_tpu_rl.triggers.gcluster_job import GclusterJobTrigger
from tests.hooks.conftest import FakeTools, RecordingLogger, make_fake_tools

JOB = "qwen-rl-20260403"
HEADER = "NAME                 STATUS      CREATION_TIME          COMPLETION_TIME"
NOISE = [
    "2026-04-03T12:00:00Z: Listing jobs in cluster 'rl-cluster'...",
    "I0403 12:00:01.123456   41871 warnings.go:70] metadata.name: used in Pod names",
]


def listing(*rows: str) -> list[list[str]]:
    return [["out", line] for line in [*NOISE, HEADER, *rows]]


def row(status: str, completed: str = "") -> str:
    return f"{JOB}     {status}   2026-04-03T11:00:00Z   {completed}"


def log_snapshot(*lines: str) -> dict[str, Any]:
    info = f"2026-04-03T12:00:00Z: Fetching logs for job '{JOB}' in cluster 'rl-cluster'..."
    return {"steps": [["out", info], *(["err", line] for line in lines), ["err", ""]]}


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeTools:
    tools = make_fake_tools(tmp_path, monkeypatch)
    conn = {"conn_type": "gcluster", "extra": {"gcluster_path": tools.gcluster, "project": "proj"}}
    monkeypatch.setenv("AIRFLOW_CONN_GCLUSTER_TRIGGER_TEST", json.dumps(conn))
    return tools


def make_trigger(**overrides: Any) -> tuple[GclusterJobTrigger, RecordingLogger]:
    kwargs: dict[str, Any] = {
        "job_name": JOB,
        "project": "proj",
        "cluster": "rl-cluster",
        "location": "us-east5",
        "gcluster_conn_id": "gcluster_trigger_test",
        "poll_interval": 0,
    }
    kwargs.update(overrides)
    trigger = GclusterJobTrigger(**kwargs)
    logger = RecordingLogger()
    trigger._log = logger  # type: ignore[assignment]
    return trigger, logger


async def run_to_end(trigger: GclusterJobTrigger) -> list[dict[str, Any]]:
    return [event.payload async for event in trigger.run()]


def calls_of(tools: FakeTools, sub: str) -> list[dict[str, Any]]:
    return [c for c in tools.calls() if c["argv"][:2] == ["job", sub]]


async def test_success_relays_new_log_lines_once(tools):
    tools.respond(
        {"match": ["job", "list"], "sequence": [
            {"steps": listing(row("Running"))},
            {"steps": listing(row("Succeeded", "2026-04-03T12:30:00Z"))},
        ]},
        {"match": ["job", "logs"], "sequence": [
            log_snapshot("Starting RL training...", "Pre RL Training: mean_reward=0.1234"),
            log_snapshot("Starting RL training...", "Pre RL Training: mean_reward=0.1234", "Reshard finished in 3.2s"),
        ]},
    )  # fmt: skip
    trigger, logger = make_trigger()
    events = await run_to_end(trigger)
    assert events == [
        {
            "status": "success",
            "job_name": JOB,
            "state": "Succeeded",
            "message": f"job {JOB} succeeded at 2026-04-03T12:30:00Z",
            "fatal": False,
            "log_lines": 3,
            "metrics": None,
        }
    ]
    relayed = [m for m in logger.messages if m.startswith(f"[{JOB}] ")]
    assert relayed == [
        f"[{JOB}] Starting RL training...",
        f"[{JOB}] Pre RL Training: mean_reward=0.1234",
        f"[{JOB}] Reshard finished in 3.2s",
    ]
    list_argv = calls_of(tools, "list")[0]["argv"]
    assert "--cluster=rl-cluster" in list_argv
    assert "--location=us-east5" in list_argv


async def test_training_trigger_parses_metrics_and_logs_progress(tools):
    pre = "Pre RL Training: corr=3, total=32, accuracy=9.38%, partial_accuracy=12.50%, format_accuracy=40.62%, mean_reward=0.1234"
    post = "Post RL Training: corr=9, total=32, accuracy=28.12%, partial_accuracy=31.25%, format_accuracy=90.62%, mean_reward=0.5678"
    tools.respond(
        {"match": ["job", "list"], "sequence": [
            {"steps": listing(row("Running"))},  # the follow starts (and fails)
            {"steps": listing(row("Running"))},
            {"steps": listing(row("Running"))},
            {"steps": listing(row("Succeeded", "2026-04-03T12:30:00Z"))},
        ]},
        # Following the log fails here, so the trigger reads snapshots (its fallback).
        {"match": ["job", "logs", "--follow"], "steps": [["err", "Error: following is not possible"]], "exit": 1},
        {"match": ["job", "logs"], "sequence": [
            log_snapshot("Starting RL training...", pre),
            log_snapshot(pre, "Train step 1 training loss: 0.500000", "Train step 2 training loss: 0.400000"),
            log_snapshot("Train step 2 training loss: 0.400000", post, "RL Training Completed Successfully!"),
        ]},
    )  # fmt: skip
    # A poll interval long enough for the failing follow to end before the next poll.
    trigger, logger = make_trigger(total_steps=2, poll_interval=1.0)
    (event,) = await run_to_end(trigger)
    metrics = event["metrics"]
    assert metrics["pre"]["mean_reward"] == 0.1234
    assert metrics["post"]["mean_reward"] == 0.5678
    assert [p["step"] for p in metrics["loss"]] == [1, 2]
    assert metrics["completed"] is True
    assert f"[{JOB}] progress: step 2/2" in logger.messages
    assert GclusterJobTrigger(**trigger.serialize()[1]).total_steps == 2


async def test_the_end_of_a_followed_log_brings_the_next_poll_forward(tools):
    """`logs --follow` returns when the pods end: the trigger polls then, not a poll interval later."""
    tools.respond(
        {"match": ["job", "list"], "sequence": [
            {"steps": listing(row("Running"))},
            {"steps": listing(row("Succeeded", "2026-04-03T12:30:00Z"))},
        ]},
        {"match": ["job", "logs", "--follow"], "steps": [["sleep", 1.5], ["err", "RL Training Completed Successfully!"]]},
        {"match": ["job", "logs"], "steps": []},
    )  # fmt: skip
    trigger, _ = make_trigger(poll_interval=60.0)
    started = time.monotonic()
    (event,) = await asyncio.wait_for(run_to_end(trigger), timeout=30)
    assert event["status"] == "success"
    assert time.monotonic() - started < 30  # with a 60 s poll interval: woken by the follow's end
    assert len(calls_of(tools, "list")) == 2


async def test_a_follow_that_returns_at_once_does_not_speed_up_polling(tools):
    """Pods not running yet: the follow ends at once, and the trigger still waits its interval."""
    tools.respond(
        {"match": ["job", "list"], "sequence": [
            {"steps": listing(row("Suspended"))},
            {"steps": listing(row("Succeeded", "2026-04-03T12:30:00Z"))},
        ]},
        {"match": ["job", "logs", "--follow"], "steps": [["err", "no pods yet"]]},
        {"match": ["job", "logs"], "steps": []},
    )  # fmt: skip
    trigger, _ = make_trigger(poll_interval=2.0)
    started = time.monotonic()
    (event,) = await run_to_end(trigger)
    assert event["status"] == "success"
    assert time.monotonic() - started >= 2.0


async def test_failed_job(tools):
    tools.respond(
        {"match": ["job", "list"], "steps": listing(row("Failed", "2026-04-03T11:05:00Z"))},
        {"match": ["job", "logs"], **log_snapshot("Traceback (most recent call last):")},
    )
    events = await run_to_end(make_trigger()[0])
    assert len(events) == 1
    assert events[0]["status"] == "failed"
    assert events[0]["state"] == "Failed"


async def test_suspended_then_running_then_succeeded_keeps_polling(tools):
    tools.respond(
        {"match": ["job", "list"], "sequence": [
            {"steps": listing(row("Suspended"))},
            {"steps": listing(row("Running"))},
            {"steps": listing(row("Succeeded", "2026-04-03T12:30:00Z"))},
        ]},
    )  # fmt: skip
    trigger, logger = make_trigger(log_follow=False)
    events = await run_to_end(trigger)
    assert [e["status"] for e in events] == ["success"]
    assert len(calls_of(tools, "list")) == 3
    assert calls_of(tools, "logs") == []
    assert [m for m in logger.messages if m.startswith("Job ")] == [
        f"Job {JOB} is Suspended",
        f"Job {JOB} is Running",
        f"Job {JOB} is Succeeded",
    ]


async def test_missing_job_is_reported_as_missing_after_confirmation(tools):
    tools.respond(
        {"match": ["job", "list"], "steps": listing("other-job   Running   2026-04-03T11:00:00Z   ")}
    )
    events = await run_to_end(make_trigger(missing_confirmations=2)[0])
    assert [e["status"] for e in events] == ["missing"]
    assert events[0]["state"] is None
    assert "garbage-collected" in events[0]["message"]
    assert len(calls_of(tools, "list")) == 2
    assert calls_of(tools, "logs") == []


async def test_job_that_disappears_after_running_is_missing_with_last_state(tools):
    tools.respond(
        {"match": ["job", "list"], "sequence": [{"steps": listing(row("Running"))}, {"steps": listing()}]},
        {"match": ["job", "logs"], **log_snapshot("step 1")},
    )
    events = await run_to_end(make_trigger(missing_confirmations=1)[0])
    assert [(e["status"], e["state"]) for e in events] == [("missing", "Running")]


async def test_config_error_ends_with_error_at_once(tools):
    tools.respond(
        {
            "match": ["job", "list"],
            "steps": [["err", "Error: cluster name is required; please specify it using the --cluster flag"]],
            "exit": 1,
        }
    )
    events = await run_to_end(make_trigger()[0])
    assert [e["status"] for e in events] == ["error"]
    assert "cluster name is required" in events[0]["message"]
    assert events[0]["fatal"] is True  # a non-retryable CommandError: the operator need not retry
    assert len(calls_of(tools, "list")) == 1


async def test_a_configuration_error_of_the_hook_ends_with_a_fatal_error(tools, monkeypatch):
    conn = {"conn_type": "gcluster", "extra": {"gcluster_path": str(tools.bin_dir / "no-such-gcluster")}}
    monkeypatch.setenv("AIRFLOW_CONN_GCLUSTER_TRIGGER_TEST", json.dumps(conn))
    events = await run_to_end(make_trigger()[0])
    assert [(e["status"], e["fatal"]) for e in events] == [("error", True)]
    assert "ConfigurationError" in events[0]["message"]
    assert "not an executable file" in events[0]["message"]
    assert calls_of(tools, "list") == []


async def test_transient_list_errors_are_retried_then_recover(tools):
    tools.respond(
        {"match": ["job", "list"], "sequence": [
            {"steps": [["err", "Error: googleapi: Error 503: backendError"]], "exit": 1},
            {"steps": listing(row("Succeeded", "2026-04-03T12:30:00Z"))},
        ]},
    )  # fmt: skip
    events = await run_to_end(make_trigger(log_follow=False)[0])
    assert [e["status"] for e in events] == ["success"]
    assert events[0]["fatal"] is False


async def test_unparsable_list_output_is_retried_like_a_transient_error(tools):
    tools.respond(
        {"match": ["job", "list"], "sequence": [
            {"steps": [["out", "something that is not a job table"]]},
            {"steps": listing(row("Succeeded", "2026-04-03T12:30:00Z"))},
        ]},
    )  # fmt: skip
    events = await run_to_end(make_trigger(log_follow=False)[0])
    assert [e["status"] for e in events] == ["success"]
    assert len(calls_of(tools, "list")) == 2


async def test_too_many_transient_errors_end_with_error(tools):
    tools.respond({"match": ["job", "list"], "steps": [["err", "dial tcp: i/o timeout"]], "exit": 1})
    events = await run_to_end(make_trigger(max_consecutive_errors=2)[0])
    assert [e["status"] for e in events] == ["error"]
    assert events[0]["fatal"] is False  # it may pass: the operator's retries may still help
    assert len(calls_of(tools, "list")) == 2


async def test_log_fetch_failure_does_not_fail_the_trigger(tools):
    tools.respond(
        {"match": ["job", "list"], "steps": listing(row("Succeeded", "2026-04-03T12:30:00Z"))},
        {"match": ["job", "logs"], "steps": [["err", "Error: failed to get logs: boom"]], "exit": 1},
    )
    trigger, logger = make_trigger()
    events = await run_to_end(trigger)
    assert [e["status"] for e in events] == ["success"]
    assert any(level == "warning" and "Could not read logs" in m for level, m in logger.records)


def test_serialize_round_trips():
    trigger, _ = make_trigger(poll_interval=30, log_follow=False, missing_confirmations=3)
    classpath, kwargs = trigger.serialize()
    module_name, _, class_name = classpath.rpartition(".")
    rebuilt = getattr(importlib.import_module(module_name), class_name)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert classpath == "airflow_provider_tpu_rl.triggers.gcluster_job.GclusterJobTrigger"
    assert kwargs["poll_interval"] == 30
    assert kwargs["log_follow"] is False
    assert set(kwargs) == {
        "job_name",
        "project",
        "cluster",
        "location",
        "gcluster_conn_id",
        "poll_interval",
        "log_follow",
        "missing_confirmations",
        "max_consecutive_errors",
        "query_timeout",
        "total_steps",
        "deadline",
    }
    json.dumps(kwargs)  # storable


async def test_list_is_filtered_by_the_job_name(tools):
    tools.respond({"match": ["job", "list"], "steps": listing(row("Failed", "2026-04-03T11:05:00Z"))})
    await run_to_end(make_trigger(log_follow=False)[0])
    argv = calls_of(tools, "list")[0]["argv"]
    assert f"--name-contains={JOB}" in argv


async def test_a_job_still_running_at_its_deadline_ends_with_timeout(tools):
    tools.respond(
        {"match": ["job", "list"], "steps": listing(row("Running"))},
        {"match": ["job", "logs"], **log_snapshot("Reshard finished in 3.2s")},
    )
    (event,) = await run_to_end(make_trigger(deadline=1.0)[0])
    assert event["status"] == "timeout"
    assert event["state"] == "Running"
    assert len(calls_of(tools, "list")) == 1


async def test_following_the_log_sees_lines_that_snapshots_would_miss(tools):
    pre = "Pre RL Training: corr=3, total=32, accuracy=9.38%, partial_accuracy=12.50%, format_accuracy=40.62%, mean_reward=0.1234"
    post = "Post RL Training: corr=9, total=32, accuracy=28.12%, partial_accuracy=31.25%, format_accuracy=90.62%, mean_reward=0.5678"
    steps = [f"Train step {i} training loss: 0.{i:02d}0000" for i in range(1, 21)]
    whole_log = ["Starting RL training...", pre, *steps, post, "RL Training Completed Successfully!"]
    tools.respond(
        {"match": ["job", "list"], "sequence": [
            {"steps": listing(row("Running"))},
            {"steps": listing(row("Succeeded", "2026-04-03T12:30:00Z"))},
        ]},
        # `logs --follow` streams every line; a snapshot holds only the last ten.
        {"match": ["job", "logs", "--follow"], "steps": [["out", line] for line in whole_log]},
        {"match": ["job", "logs"], **log_snapshot(*whole_log[-10:])},
    )  # fmt: skip
    trigger, _ = make_trigger(total_steps=20)
    (event,) = await run_to_end(trigger)
    assert event["metrics"]["pre"]["mean_reward"] == 0.1234
    assert event["metrics"]["post"]["mean_reward"] == 0.5678
    assert [p["step"] for p in event["metrics"]["loss"]] == list(range(1, 21))
    assert event["log_lines"] == len(whole_log)
