"""Parsing MaxText RL trainer logs: single lines in every prefix style, and a recorded 50-step run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from airflow_provider_tpu_rl.maxtext.logs import (
    EvalEvent,
    ReshardEvent,
    RestoredEvent,
    TrainingCompletedEvent,
    TrainingLogTracker,
    TrainingStartedEvent,
    TrainLossEvent,
    parse_log_line,
)

FIXTURE = Path(__file__).parent.parent / "fixtures" / "maxtext" / "train_rl_gemma4_50_steps.log"

PRE_MESSAGE = (
    "Pre RL Training: corr=7, total=24, accuracy=29.166666666666668%, partial_accuracy=37.5%, "
    "format_accuracy=79.16666666666666%, mean_reward=1.2346"
)


@pytest.mark.parametrize(
    "prefix",
    [
        "",
        "W0822 14:02:13.954742 140093185615872 train_rl.py:786] ",
        "2026-08-22T14:02:13.954742123Z W0822 14:02:13.954742 1400 train_rl.py:786] ",
        "[pod/rl-pathways-head-0-0-x7k2p/workload-container] W0822 14:02:13.954742 1 train_rl.py:786] ",
        "WARNING:absl:",
        "100%|██████████| 6/6 [01:20<00:00, 10.41s/it]\r",
    ],
)
def test_pre_eval_line_parses_behind_any_prefix(prefix: str) -> None:
    event = parse_log_line(prefix + PRE_MESSAGE)

    assert event == EvalEvent(
        phase="pre",
        step=None,
        corr=7,
        total=24,
        accuracy=29.166666666666668,
        partial_accuracy=37.5,
        format_accuracy=79.16666666666666,
        mean_reward=1.2346,
    )


def test_intermediate_eval_carries_its_step() -> None:
    line = (
        "W0822 hooks.py:97] Intermediate Eval (step=30): corr=12, total=24, accuracy=50.0%, "
        "partial_accuracy=58.333333333333336%, format_accuracy=95.83333333333334%, mean_reward=2.3125"
    )
    event = parse_log_line(line)

    assert isinstance(event, EvalEvent)
    assert (event.phase, event.step, event.corr, event.mean_reward) == ("intermediate", 30, 12, 2.3125)


def test_post_eval_in_pass_at_1_mode_has_float_corr_and_zero_accuracy_ints() -> None:
    event = parse_log_line(
        "Post RL Training: corr=12.75, total=24, accuracy=53.125%, partial_accuracy=0%, "
        "format_accuracy=100.0%, mean_reward=-0.5000"
    )

    assert isinstance(event, EvalEvent)
    assert event.phase == "post"
    assert event.corr == 12.75
    assert event.partial_accuracy == 0.0
    assert event.mean_reward == -0.5


def test_eval_line_without_mean_reward_from_older_images() -> None:
    event = parse_log_line(
        "Pre RL Training: corr=3, total=10, accuracy=30.0%, partial_accuracy=40.0%, format_accuracy=90.0%"
    )

    assert isinstance(event, EvalEvent)
    assert event.mean_reward is None
    assert event.format_accuracy == 90.0


def test_numpy_scalar_reprs_are_unwrapped() -> None:
    event = parse_log_line(
        "Pre RL Training: corr=np.int64(3), total=10, accuracy=np.float64(30.0)%, "
        "partial_accuracy=40.0%, format_accuracy=90.0%, mean_reward=0.1000"
    )

    assert isinstance(event, EvalEvent)
    assert (event.corr, event.accuracy) == (3, 30.0)


def test_train_loss_line() -> None:
    line = (
        "I0822 14:11:43.123675 140093185615872 peft_trainer.py:771] "
        "Train step 12 training loss: -0.004213  - training perplexity: 0.995796"
    )

    assert parse_log_line(line) == TrainLossEvent(step=12, loss=-0.004213, perplexity=0.995796)


def test_train_loss_nan_is_kept_in_the_event_but_null_in_metrics() -> None:
    tracker = TrainingLogTracker()
    [event] = tracker.feed("Train step 3 training loss: nan  - training perplexity: nan")

    assert isinstance(event, TrainLossEvent)
    assert math.isnan(event.loss)
    assert tracker.metrics()["loss"] == [{"step": 3, "loss": None}]
    json.dumps(tracker.metrics(), allow_nan=False)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("I0822 reshard.py:256] Reshard finished in 3.81s", ReshardEvent(seconds=3.81)),
        ("W0822 train_rl.py:799] Starting RL training...", TrainingStartedEvent()),
        ("W0822 train_rl.py:810] RL Training Completed Successfully!", TrainingCompletedEvent()),
    ],
)
def test_lifecycle_lines(line: str, expected: object) -> None:
    assert parse_log_line(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        "",
        "I0822 evaluate_rl.py:311] ===> corr=3, total=10, corr / total * 100=30.0, "
        "partially_corr / total * 100=40.0, corr_format / total * 100=80.0",
        "W0822 hooks.py:105] [intermediate-eval] step=10 failed: RuntimeError('boom')",
        "E0822 reshard.py:258] Reshard failed in 2.00s: INTERNAL",
        "I0822 peft_trainer.py:1159] Running evaluation on train step 10.",
        "Training Completed Successfully!",
    ],
)
def test_other_lines_are_not_events(line: str) -> None:
    assert parse_log_line(line) is None


@pytest.fixture(scope="module")
def recorded_lines() -> list[str]:
    return FIXTURE.read_text(encoding="utf-8").splitlines()


def test_recorded_run_metrics_equal_the_values_in_the_log(recorded_lines: list[str]) -> None:
    tracker = TrainingLogTracker()
    for line in recorded_lines:
        tracker.feed(line)
    metrics = tracker.metrics()

    assert metrics["pre"] == {
        "corr": 7,
        "total": 24,
        "accuracy": 29.166666666666668,
        "partial_accuracy": 37.5,
        "format_accuracy": 79.16666666666666,
        "mean_reward": 1.2346,
    }
    assert metrics["post"] == {
        "corr": 15,
        "total": 24,
        "accuracy": 62.5,
        "partial_accuracy": 66.66666666666666,
        "format_accuracy": 100.0,
        "mean_reward": 2.7292,
    }
    assert [e["step"] for e in metrics["intermediate"]] == [10, 20, 30, 40, 50]
    assert metrics["intermediate"][1] == {
        "step": 20,
        "corr": 11,
        "total": 24,
        "accuracy": 45.83333333333333,
        "partial_accuracy": 50.0,
        "format_accuracy": 91.66666666666666,
        "mean_reward": 2.0208,
    }
    assert [e["mean_reward"] for e in metrics["intermediate"]] == [1.6875, 2.0208, 2.3125, 2.5625, 2.7188]
    assert [e["step"] for e in metrics["loss"]] == list(range(1, 51))
    losses = {e["step"]: e["loss"] for e in metrics["loss"]}
    assert (losses[1], losses[2], losses[3], losses[50]) == (0.040073, 0.029361, 0.023277, -0.005843)
    assert metrics["last_step"] == 50
    assert metrics["started"] is True
    assert metrics["completed"] is True
    assert metrics["reshard_count"] == 51  # one weight sync before the pre-training eval, then one a step
    assert json.loads(json.dumps(metrics, allow_nan=False)) == metrics
    assert tracker.progress_text(50) == "step 50/50"


def test_progress_while_following_the_log(recorded_lines: list[str]) -> None:
    tracker = TrainingLogTracker()
    assert tracker.progress_text(50) == "step 0/50"
    assert tracker.last_step is None

    cut = next(i for i, line in enumerate(recorded_lines) if "Train step 12 training loss" in line)
    for line in recorded_lines[: cut + 1]:
        tracker.feed(line)

    assert tracker.progress_text(50) == "step 12/50"
    assert tracker.started is True
    assert tracker.completed is False
    metrics = tracker.metrics()
    assert metrics["post"] is None
    assert [e["step"] for e in metrics["intermediate"]] == [10]


def test_a_reread_log_does_not_duplicate_steps(recorded_lines: list[str]) -> None:
    tracker = TrainingLogTracker()
    for line in recorded_lines[:150] + recorded_lines:
        tracker.feed(line)

    metrics = tracker.metrics()
    assert len(metrics["loss"]) == 50
    assert len(metrics["intermediate"]) == 5


def test_feed_splits_a_multi_line_chunk() -> None:
    tracker = TrainingLogTracker()
    events = tracker.feed(
        "W0822 train_rl.py:799] Starting RL training...\n"
        "noise\n"
        "I0822 peft_trainer.py:771] Train step 1 training loss: 0.1  - training perplexity: 1.1\n"
    )

    assert [type(e) for e in events] == [TrainingStartedEvent, TrainLossEvent]
    assert tracker.last_step == 1


def test_a_resumed_training_says_from_which_checkpoint_step() -> None:
    # tunix's CheckpointManager.maybe_restore (c4ec573 tunix/sft/checkpoint_manager.py l.292)
    line = "I1204 10:00:01.5 140 checkpoint_manager.py:292] Restored params from step: 20 in 3.517 seconds"
    assert parse_log_line(line) == RestoredEvent(20)
    tracker = TrainingLogTracker()
    assert tracker.metrics()["resumed_from_step"] is None  # a fresh training logs no restore
    tracker.feed(line)
    tracker.feed("I1204 peft_trainer.py:771] Train step 21 training loss: 0.4")
    assert (tracker.resumed_from_step, tracker.last_step) == (20, 21)
    assert TrainingLogTracker.restore(json.loads(json.dumps(tracker.metrics()))).resumed_from_step == 20
