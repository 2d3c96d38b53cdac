"""Training metrics: what the operator reports equals what MaxText printed.

Against the sandbox (the simulated trainer prints MaxText's reward lines) and against a recorded
MaxText log (tests/fixtures/maxtext/train_rl_gemma4_50_steps.log).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from airflow.providers.common.compat.sdk import Context

from airflow_provider_tpu_rl.hooks.kubernetes import LogCursor
from airflow_provider_tpu_rl.maxtext.layout import parse_gs_uri
from airflow_provider_tpu_rl.maxtext.logs import TrainingLogTracker
from airflow_provider_tpu_rl.operators.gke_jobs import PathwaysRLTrainOperator
from airflow_provider_tpu_rl.spec import gke_pipeline_from_conf
from airflow_provider_tpu_rl.triggers.jobset import JobSetTrigger
from tests.support.sandbox_run import (
    SandboxRun,
    convert_checkpoint,
    defer,
    prepare_cluster,
    printed_losses,
    printed_rewards,
    run_trigger,
    wait_for,
)

RUN_ID = "manual__2026-03-01T00:00:00+00:00"
RECORDED_LOG = Path(__file__).resolve().parents[1] / "fixtures" / "maxtext" / "train_rl_gemma4_50_steps.log"


# -- an independent reading of the printed figures ------------------------------------------------
_EVAL_LINE = re.compile(r"(Pre RL Training|Post RL Training|Intermediate Eval \(step=(\d+)\)): (.*)$")


def _figures(text: str) -> dict[str, float]:
    """``corr=7, total=24, accuracy=29.1%, ...`` → numbers (percent signs dropped)."""
    out = {}
    for item in text.split(", "):
        key, _, value = item.partition("=")
        out[key.strip()] = float(value.rstrip("%"))
    return out


def printed_evaluations(lines: Sequence[str]) -> dict[str, Any]:
    pre = post = None
    intermediate: dict[int, dict[str, float]] = {}
    for line in lines:
        match = _EVAL_LINE.search(line)
        if match is None:
            continue
        figures = _figures(match[3])
        if match[1].startswith("Pre"):
            pre = figures
        elif match[1].startswith("Post"):
            post = figures
        else:
            intermediate[int(match[2])] = figures
    return {"pre": pre, "post": post, "intermediate": intermediate}


def assert_same_figures(reported: dict[str, Any] | None, printed: dict[str, float] | None) -> None:
    assert printed is not None
    assert reported is not None
    assert {k: float(reported[k]) for k in printed} == printed


# -- the sandbox ---------------------------------------------------------------------------------
def _train(sb: SandboxRun, **kwargs: Any) -> PathwaysRLTrainOperator:
    return sb.operator(PathwaysRLTrainOperator, task_id="train", **kwargs)


def _release_after_first_log_read(trigger: Any, hold: Path) -> Callable[[], Any]:
    """Let the held job finish once the trigger has received workload log lines."""

    async def release() -> None:
        while not trigger._cursor.lines:
            await asyncio.sleep(0.02)
        hold.unlink()

    return release


def _start_held_training(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch, conf: dict[str, Any]
) -> tuple[PathwaysRLTrainOperator, Context, Any, str, Path]:
    """Submit the training job; it stops before committing its final checkpoint."""
    prepare_cluster(sb, conf, run_id=RUN_ID)
    convert_checkpoint(sb, conf, run_id=RUN_ID)
    pipeline = gke_pipeline_from_conf(conf, run_id=RUN_ID)
    hold = sb.hold_file()
    monkeypatch.setenv("TPU_RL_SANDBOX_HOLD_FILE", str(hold))
    train = _train(sb)
    context = sb.context(train, conf, run_id=RUN_ID)
    deferred = defer(train, context)
    final = pipeline.training.final_step
    wait_for(
        lambda: f"Saving checkpoint for step {final} " in sb.job_log_of(pipeline.train_job),
        "the training job to reach its final checkpoint",
    )
    return train, context, deferred.trigger, pipeline.train_job, hold


def test_reported_rewards_equal_the_rewards_the_training_job_printed(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = sb.gke_conf(train_overrides={"num_test_batches": 2})
    train, context, trigger, job_name, hold = _start_held_training(sb, monkeypatch, conf)
    assert (trigger.job_name, trigger.cluster_name, trigger.total_steps) == (job_name, sb.cluster, 3)

    event = run_trigger(trigger, alongside=_release_after_first_log_read(trigger, hold))
    result = train.execute_complete(context, event)

    log = sb.job_log_of(job_name)
    printed = printed_evaluations(log.splitlines())
    rewards = printed_rewards(log)
    assert set(rewards) == {"pre", "post"}
    metrics = result["metrics"]
    # The event stays small (the triggerer logs it whole): the operator reads the metrics the
    # trigger kept with its cursor in GCS.
    assert event["metrics"] is None
    assert event["metrics_uri"] == trigger.cursor_uri
    assert trigger.cursor_uri is not None
    assert metrics == json.loads(sb.api.download(*parse_gs_uri(trigger.cursor_uri)))["metrics"]
    assert len(json.dumps(event)) < 1000
    assert metrics["pre"]["mean_reward"] == rewards["pre"]
    assert metrics["post"]["mean_reward"] == rewards["post"]
    assert_same_figures(metrics["pre"], printed["pre"])
    assert_same_figures(metrics["post"], printed["post"])
    assert metrics["completed"] is True
    assert metrics["last_step"] == 3
    assert result["num_test_batches"] == 2  # what the ledger says a missing reward by
    assert {e["step"]: e["loss"] for e in metrics["loss"]}.items() <= printed_losses(log).items()
    run_name = gke_pipeline_from_conf(conf, run_id=context["run_id"]).training.run_name
    assert result["checkpoint_uri"].endswith(f"/trained/{run_name}/checkpoints/actor/3/model_params/")


def test_a_reward_line_more_than_ten_lines_before_a_log_read_is_still_reported(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The trigger starts only after six steps printed 12 lines past "Pre RL Training" (more than
    # kubectl's 10-line snapshot held): it reads the workload container's log from its start.
    conf = sb.gke_conf(num_batches=6, train_overrides={"num_test_batches": 2})
    train, context, trigger, job_name, hold = _start_held_training(sb, monkeypatch, conf)

    event = run_trigger(trigger, alongside=_release_after_first_log_read(trigger, hold))
    result = train.execute_complete(context, event)

    rewards = printed_rewards(sb.job_log_of(job_name))
    assert result["metrics"]["post"]["mean_reward"] == rewards["post"]
    assert result["metrics"]["pre"] is not None
    assert result["metrics"]["pre"]["mean_reward"] == rewards["pre"]


def test_waiting_in_the_worker_reports_the_printed_rewards(sb: SandboxRun) -> None:
    """``deferrable=False``: the worker follows the log the way the trigger does. The Qwen preset
    untouched: it evaluates before and after training by default (the tutorial's
    num_test_batches=0 printed no reward)."""
    conf = sb.gke_conf(model="qwen3-30b-a3b")
    prepare_cluster(sb, conf, run_id=RUN_ID)
    convert_checkpoint(sb, conf, run_id=RUN_ID)
    train = _train(sb, deferrable=False)

    result = train.execute(sb.context(train, conf, run_id=RUN_ID))

    rewards = printed_rewards(sb.job_log_of(result["job_name"]))
    assert set(rewards) == {"pre", "post"}
    assert result["metrics"]["post"]["mean_reward"] == rewards["post"]
    assert result["metrics"]["pre"] is not None
    assert result["metrics"]["pre"]["mean_reward"] == rewards["pre"]
    assert result["num_test_batches"] == 2


# -- a recorded MaxText log ------------------------------------------------------------------------
def _recorded_lines() -> list[str]:
    return RECORDED_LOG.read_text().splitlines()


def _expected_from_recording() -> dict[str, Any]:
    lines = _recorded_lines()
    printed = printed_evaluations(lines)
    text = "\n".join(lines)
    assert printed["pre"]["mean_reward"] == 1.2346  # the fixture is what we think it is
    assert printed["post"]["mean_reward"] == 2.7292
    assert sorted(printed["intermediate"]) == [10, 20, 30, 40, 50]
    return {
        **printed,
        "losses": printed_losses(text),
        "reshards": len(re.findall(r"Reshard finished in", text)),
    }


def assert_metrics_match_recording(metrics: dict[str, Any]) -> None:
    expected = _expected_from_recording()
    assert_same_figures(metrics["pre"], expected["pre"])
    assert_same_figures(metrics["post"], expected["post"])
    reported_intermediate = {e["step"]: e for e in metrics["intermediate"]}
    assert sorted(reported_intermediate) == sorted(expected["intermediate"])
    for step, figures in expected["intermediate"].items():
        assert_same_figures(reported_intermediate[step], figures)
    assert {e["step"]: e["loss"] for e in metrics["loss"]} == expected["losses"]
    assert len(expected["losses"]) == 50
    assert metrics["last_step"] == 50
    assert metrics["reshard_count"] == expected["reshards"]
    assert metrics["started"] is True
    assert metrics["completed"] is True


def test_the_operator_feed_parses_the_recorded_log() -> None:
    tracker = TrainingLogTracker()
    for line in _recorded_lines():
        tracker.feed(line)
    assert_metrics_match_recording(tracker.metrics())
    assert_metrics_match_recording(TrainingLogTracker.restore(tracker.metrics()).metrics())


T0 = 1_796_119_200_000_000_000  # 2026-12-01T10:00:00Z in nanoseconds


def _stamp(nanos: int) -> str:
    """``timestamps=true`` form: RFC 3339 with nanoseconds, as the kubelet writes it."""
    seconds, frac = divmod(nanos, 1_000_000_000)
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:09d}Z"


@pytest.mark.parametrize("restart_after", [None, 7, 64])
def test_the_trigger_relay_parses_the_recorded_log(restart_after: int | None) -> None:
    """The recorded log through the trigger's relay; a restart re-reads from ``sinceTime``."""
    lines = _recorded_lines()
    # 4 lines per millisecond: several lines share a whole second, some share a nanosecond.
    stamped = [f"{_stamp(T0 + (i // 4) * 1_000_000)} {line}" for i, line in enumerate(lines)]
    trigger = JobSetTrigger("gemma4-training-abc123", "https://127.0.0.1:1", "", total_steps=50)

    async def relay(target: JobSetTrigger, items: list[str]) -> None:
        for item in items:
            await target._relay(item)
        await target._flush()  # as the end of a log read does

    if restart_after is None:
        asyncio.run(relay(trigger, stamped))
        final = trigger
    else:
        asyncio.run(relay(trigger, stamped[:restart_after]))
        final = JobSetTrigger("gemma4-training-abc123", "https://127.0.0.1:1", "", total_steps=50)
        final._cursor = LogCursor.from_dict(trigger._cursor.as_dict())  # what the GCS cursor keeps
        final._tracker = TrainingLogTracker.restore(trigger._tracker.metrics())
        final._cursor.rewind()
        since = final._cursor.since_time()
        assert since is not None
        # the API server sends every line from the whole second of sinceTime on
        resent = [line for line in stamped if line[:19] >= since[:19]]
        assert len(resent) > len(stamped) - restart_after  # some lines come twice
        asyncio.run(relay(final, resent))

    assert final._cursor.lines == len(lines)
    assert_metrics_match_recording(final._tracker.metrics())
