"""The promotion gate's decision: promoted unless evaluation ran and the reward gained too little."""

from __future__ import annotations

import pytest

from airflow_provider_tpu_rl.ledger.promotion import decide, is_promoted, reward_gain


def test_a_gain_below_the_threshold_is_not_promoted_and_says_why_in_one_line() -> None:
    decision = decide(0.30, 0.31, 2, 0.05)
    assert not decision.promoted
    assert decision.gated
    assert decision.line == "not promoted: reward gain +0.01 < min_reward_gain 0.05 (mean reward 0.3 -> 0.31)"
    assert "\n" not in decision.line
    assert is_promoted(decision.line) is False


@pytest.mark.parametrize(("pre", "post", "threshold"), [(0.1, 0.2, 0.1), (0.1, 0.5, 0.05), (0.5, 0.4, -0.2)])
def test_a_gain_at_or_above_the_threshold_is_promoted(pre: float, post: float, threshold: float) -> None:
    decision = decide(pre, post, 2, threshold)
    assert decision.promoted
    assert decision.gated
    assert decision.line.startswith("promoted: reward gain ")
    assert is_promoted(decision.line) is True


def test_no_threshold_no_evaluation_or_no_reward_means_no_gate() -> None:
    assert (
        decide(0.5, 0.1, 2, None).line
        == "promoted: no gate (min_reward_gain not set); mean reward 0.5 -> 0.1"
    )
    off = decide(None, None, 0, 0.5)
    assert off.promoted
    assert not off.gated
    assert off.line == "promoted: no gate, evaluation off (num_test_batches=0)"
    missing = decide(0.2, None, 2, 0.5)
    assert missing.promoted
    assert not missing.gated
    assert "no mean reward" in missing.line


def test_gain_and_the_ledger_line_read_back() -> None:
    assert reward_gain(0.1, 0.35) == pytest.approx(0.25)
    assert reward_gain(None, 0.35) is None
    assert is_promoted(None) is None
    assert is_promoted("") is None
