"""``tpu-rl-sandbox bench`` section 5: the ordered capacity's time to training and cost against a run
that waits for its one kind, in a sandbox world where the first kinds are out."""

from __future__ import annotations

from tpu_rl_sandbox.commands import tpu_cost
from tpu_rl_sandbox.commands.fallback_bench import bench_fallback, first_try_after, retry_times


def test_the_waiting_runs_tries_double_their_delay_up_to_30_minutes() -> None:
    assert retry_times(120.0, 3) == [0.0, 120.0, 360.0, 840.0]
    assert retry_times(1200.0, 3) == [0.0, 1200.0, 3000.0, 4800.0]  # 2400 s capped at 1800
    assert first_try_after([0.0, 120.0, 360.0], 200.0) == 360.0
    assert first_try_after([0.0, 120.0, 360.0], 361.0) is None


def test_the_fallback_trains_on_spot_while_the_waiting_run_fails_or_waits() -> None:
    prices = tpu_cost.read_price_table(tpu_cost.DEFAULT_PRICE_TABLE)
    lines = bench_fallback(0.2, prices, stockout_minutes=120.0)
    text = "\n".join(lines)
    assert "fallback: reservation refused in " in text
    assert "Specified reservation 'res-8' does not have available resources" in text
    assert "fallback: flex-start refused in " in text
    assert "fallback ['reservation', 'flex-start', 'spot']: spot RUNNING after " in text
    assert "at $1.08/chip-hour = $1.44" in text  # 10 minutes x 8 chips at spot's price
    assert "inside the stockout: the run fails, no training" in text
    waited = "\n".join(bench_fallback(0.2, prices, stockout_minutes=5.0))
    assert "waiting for reservation: reservation RUNNING after " in waited
    assert "at $2.70/chip-hour = $3.60" in waited  # the reservation at the on-demand price
