"""The pure parts of a run directory's takeover (operators/takeover.py): how long a wait reads, why a
claim no longer vouches for its job, and the training attempt recorded for the job taken over.

The takeover itself (a live, unreachable or gone job on GKE and on a TPU VM) runs against the
sandbox in tests/operators/test_run_dir_takeover.py and test_run_dir_takeover_vm.py.
"""

from __future__ import annotations

import pytest

from airflow_provider_tpu_rl.operators.takeover import displaced_attempt, minutes_text, why_not_vouching
from airflow_provider_tpu_rl.records.run_dirs import WriterClaim
from airflow_provider_tpu_rl.records.writers import GONE, WriterState

HELD = WriterClaim("tpu_rl_gke_pipeline/manual__a", "rl-job", "p/us-east5/c1", 1_796_169_600.0, "gke")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (45, "45 s"),
        (119, "119 s"),
        (120, "2 min"),
        (720, "12 min"),
        (7199, "120 min"),
        (7200, "2.0 h"),
        (12600, "3.5 h"),
    ],
)
def test_a_wait_reads_in_seconds_minutes_or_hours(seconds: float, text: str) -> None:
    assert minutes_text(seconds) == text


def test_a_claim_says_why_it_no_longer_vouches_for_its_job() -> None:
    assert why_not_vouching(HELD, finished=True) == "belongs to a run that has ended"
    assert why_not_vouching(HELD, finished=False) == "expired at 2026-12-02 00:00 UTC"


def test_the_attempt_taken_over_reached_the_later_of_its_cursor_and_its_log() -> None:
    state = WriterState(GONE, "no JobSet", started_at=100.0, reached_step=30)

    attempt = displaced_attempt(HELD, state, {"resumed_from_step": 10, "last_step": 20}, ended_at=500.0)

    assert (attempt.run, attempt.job) == (HELD.run, HELD.job)
    assert (attempt.from_step, attempt.reached_step) == (10, 30)
    assert (attempt.started_at, attempt.ended_at) == (100.0, 500.0)
    assert displaced_attempt(HELD, WriterState(GONE, "x"), {"last_step": 40}, ended_at=1.0).reached_step == 40


def test_an_attempt_without_metrics_started_at_step_0_and_reached_no_known_step() -> None:
    """Booleans are not steps (``True`` is an int in Python)."""
    attempt = displaced_attempt(
        HELD, WriterState(GONE, "x"), {"resumed_from_step": True, "last_step": False}, 1.0
    )
    assert (attempt.from_step, attempt.reached_step) == (0, None)
    assert displaced_attempt(HELD, WriterState(GONE, "x"), None, 1.0).from_step == 0
