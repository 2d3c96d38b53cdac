"""The promotion gate: is a trained model good enough to announce (no Airflow import).

A run's model is *promoted* unless evaluation ran (a mean reward before and after training) and its
gain, after minus before, is below the run's ``min_reward_gain``. A promoted model gets its asset
event; one that is not is still exported, carded and recorded, and the ledger says why.
"""

from __future__ import annotations

from dataclasses import dataclass

PROMOTED = "promoted"
NOT_PROMOTED = "not promoted"


@dataclass(frozen=True)
class Promotion:
    """The gate's decision and its one line (what the ledger's ``promotion`` column holds)."""

    promoted: bool
    line: str
    gain: float | None = None
    gated: bool = True  # False: no gate applied (not set, or no evaluation)


def _number(value: float) -> str:
    return f"{value:.4g}"


def reward_gain(pre: float | None, post: float | None) -> float | None:
    """The mean reward after training minus before; None when either is unknown."""
    return None if pre is None or post is None else post - pre


def decide(
    pre: float | None,
    post: float | None,
    num_test_batches: float | None,
    min_reward_gain: float | None,
) -> Promotion:
    """The gate's decision from the run's mean rewards, the evaluation's size and the threshold."""
    if num_test_batches is not None and num_test_batches <= 0:
        return Promotion(True, f"{PROMOTED}: no gate, evaluation off (num_test_batches=0)", gated=False)
    gain = reward_gain(pre, post)
    if gain is None:
        return Promotion(
            True, f"{PROMOTED}: no gate, no mean reward before and after training to compare", gated=False
        )
    rewards = f"mean reward {_number(pre or 0.0)} -> {_number(post or 0.0)}"
    if min_reward_gain is None:
        return Promotion(True, f"{PROMOTED}: no gate (min_reward_gain not set); {rewards}", gain, gated=False)
    if gain < min_reward_gain:
        return Promotion(
            False,
            f"{NOT_PROMOTED}: reward gain {gain:+.4g} < min_reward_gain {_number(min_reward_gain)} ({rewards})",
            gain,
        )
    return Promotion(
        True,
        f"{PROMOTED}: reward gain {gain:+.4g} >= min_reward_gain {_number(min_reward_gain)} ({rewards})",
        gain,
    )


def is_promoted(line: str | None) -> bool | None:
    """Whether a ledger ``promotion`` line says promoted; None when the run has none (the gate never ran)."""
    if not line:
        return None
    return line.startswith(PROMOTED)
