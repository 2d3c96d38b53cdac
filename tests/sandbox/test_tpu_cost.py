"""The bench's TPU cost arithmetic (section 4): real minutes from the scaled sandbox seconds, the
tutorials' flow on the same durations, and the prices of docs/tpu-prices.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpu_rl_sandbox.commands import tpu_cost
from tpu_rl_sandbox.world import timescale

PRICES = Path(__file__).resolve().parents[2] / "docs" / "tpu-prices.md"


def test_the_bench_reads_the_docs_price_table_and_says_which_prices_were_not_read() -> None:
    prices = tpu_cost.read_price_table(PRICES)
    assert prices["on-demand"].usd_per_chip_hour == 2.70  # the v6e list price, as the ledger's default
    assert {"on-demand", "spot", "flex-start"} <= set(prices)
    assert all(p.read_on and p.source for p in prices.values())
    caveats = tpu_cost.price_caveats(prices)
    # none of the three was read on its source page: each one says how it was had
    assert [line.split()[0] for line in caveats] == ["on-demand", "spot", "flex-start"]
    assert "second-hand" in caveats[0]
    assert "derived, not read" in caveats[1]


def test_a_price_table_without_a_capacity_or_with_a_short_row_is_refused(tmp_path: Path) -> None:
    table = tmp_path / "prices.md"
    table.write_text(
        "| TPU | capacity | USD per chip-hour | read on | source | how direct |\n|---|---|---|---|---|---|\n"
        "| v6e | on-demand | 2.70 | 2026-12-05 | page | states |\n| v6e | spot | 1.00 | 2026-12-05 | page | states |\n"
        "| v5e | flex-start | 0.50 | 2026-12-05 | page | states |\n"
    )
    with pytest.raises(ValueError, match="no v6e price for flex-start"):
        tpu_cost.read_price_table(table)
    table.write_text(table.read_text() + "| v6e | flex-start | 1.00 | 2026-12-05 |\n")
    with pytest.raises(ValueError, match="needs 6 cells"):
        tpu_cost.read_price_table(table)
    table.write_text(table.read_text().replace("| 2026-12-05 |\n", "| 2026-12-05 | page | states |\n"))
    prices = tpu_cost.read_price_table(table)
    assert prices["flex-start"].usd_per_chip_hour == 1.00
    assert tpu_cost.price_caveats(prices) == []  # every price read on its page: no caveat


def test_real_minutes_and_cost() -> None:
    assert tpu_cost.real_minutes(93.0, 2.0) == 46.5
    with pytest.raises(ValueError, match="time scale is off"):
        tpu_cost.real_minutes(93.0, 0.0)
    assert tpu_cost.cost_usd(30.0, 8, 2.70) == pytest.approx(10.80)  # half an hour of 8 chips
    prices = tpu_cost.read_price_table(PRICES)
    line = tpu_cost.costs(60.0, 32, prices)
    assert line.usd == pytest.approx({c: 32 * prices[c].usd_per_chip_hour for c in tpu_cost.CAPACITIES})


def test_the_tutorials_flows_bill_every_stage_on_the_tpu_on_the_same_durations() -> None:
    qwen, llama = "qwen3-30b-a3b", "llama3.1-8b-Instruct"
    capacity = timescale.CAPACITY_MINUTES
    # GKE: the TPU nodes from their start in the cluster deploy (boot to Ready) through the image's
    # pull, convert, train and export to the teardown, whose drain is none: the jobs have finished
    gke = capacity["tpu_node_ready"] + timescale.PULL_MINUTES + 22.5 + 35.0 + 22.5
    assert tpu_cost.tutorial_gke_minutes(qwen) == pytest.approx(gke)
    # the TPU VM: its guest's boot until ssh answers (billed: RUNNING), install from sources,
    # convert, train, copy, export (create and delete states unbilled)
    vm = (
        capacity["guest_boot"]
        + timescale.INSTALL_MINUTES
        + 5.0
        + 10.0
        + timescale.TUTORIAL_COPY_MINUTES
        + 5.0
    )
    assert tpu_cost.tutorial_tpu_vm_minutes(llama) == pytest.approx(vm)
    # the bench's overrides move the tutorials' flow as they move the run
    assert tpu_cost.tutorial_gke_minutes(qwen, {"train": 60}, {"tpu_node_ready": 0}) == pytest.approx(
        gke + 25.0 - capacity["tpu_node_ready"]
    )
    assert tpu_cost.tutorial_tpu_vm_minutes(llama, {"train": 60, "install": 20}) == pytest.approx(
        vm + 50.0 - timescale.INSTALL_MINUTES + 20.0
    )
    assert tpu_cost.tutorial_tpu_vm_minutes(llama, {}, {"guest_boot": 3}) == pytest.approx(
        vm - capacity["guest_boot"] + 3
    )
    with pytest.raises(ValueError, match="no convert duration for gpt-x"):
        tpu_cost.tutorial_gke_minutes("gpt-x")


def test_the_tutorials_gke_nodes_pull_the_workload_image_before_converting() -> None:
    # the conversion runs the workload image on the TPU slice (the shared reference's step 7): the
    # nodes pull it first, for the estimate the sandbox's GKE pull takes, and --stage-minutes moves it
    qwen = "qwen3-30b-a3b"
    without_pull = tpu_cost.tutorial_gke_minutes(qwen, {"pull": 0})
    assert tpu_cost.tutorial_gke_minutes(qwen) == pytest.approx(without_pull + timescale.PULL_MINUTES)
    assert tpu_cost.tutorial_gke_minutes(qwen, {"pull": 12}) == pytest.approx(without_pull + 12)


def test_the_runs_cost_is_set_against_the_tutorials_at_on_demand() -> None:
    prices = tpu_cost.read_price_table(PRICES)
    ours = tpu_cost.costs(30.0, 8, prices)
    tutorial = tpu_cost.costs(60.0, 8, prices)
    ratios = tpu_cost.ratios_to_tutorial(ours, tutorial)
    assert ratios["on-demand"] == pytest.approx(0.5)
    assert ratios["spot"] == pytest.approx(0.5 * prices["spot"].usd_per_chip_hour / 2.70)
    assert ratios["flex-start"] == pytest.approx(0.5 * prices["flex-start"].usd_per_chip_hour / 2.70)


def test_a_real_gke_run_bills_the_nodes_boot_the_pull_and_training() -> None:
    """The demo's last table: what the GKE pipeline's TPU pool bills at the seeds' durations."""
    qwen = "qwen3-30b-a3b"
    real = tpu_cost.pipeline_gke_estimate(qwen)
    boot = timescale.CAPACITY_MINUTES["tpu_node_ready"]
    train = timescale.stage_real_minutes(timescale.TRAIN, qwen)
    assert train is not None
    assert real.billed_minutes == pytest.approx(boot + timescale.PULL_MINUTES + train)
    assert real.trained_minutes == pytest.approx(train)
    assert real.idle_share == pytest.approx((boot + timescale.PULL_MINUTES) / real.billed_minutes)
    assert list(real.parts) == ["node boot", "image pull", "training"]
    # a run that converts and exports on CPU bills less than the tutorials' flow on its slice
    assert real.billed_minutes < tpu_cost.tutorial_gke_minutes(qwen)
    assert tpu_cost.pipeline_gke_estimate(qwen, {"pull": 0}).idle_share == pytest.approx(
        boot / (boot + train)
    )


def test_the_demos_last_table_sets_the_sandboxs_idle_beside_a_real_runs() -> None:
    """A newcomer's first figure: the sandbox's idle share, why it is high, and a real run's."""
    from types import SimpleNamespace

    from tpu_rl_sandbox.commands.demo import idle_table

    # 32 chips billed 12 minutes, of which 3 trained: the sandbox's 75% idle
    run = SimpleNamespace(
        model="qwen3-30b-a3b", chips=32, chip_hours=32 * 12 / 60, busy_chip_hours=32 * 3 / 60, idle_share=0.75
    )
    header, columns, sandbox_row, real_row = idle_table(run)[-4:]
    assert "qwen3-30b-a3b, 32 chips" in header
    assert columns.split()[:4] == ["BILLED", "MIN", "TRAINED", "MIN"]
    assert sandbox_row.split()[7:10] == ["12.0", "3.0", "75%"]
    assert "Airflow's own steps take their real seconds" in sandbox_row
    real = tpu_cost.pipeline_gke_estimate("qwen3-30b-a3b")
    assert f"{real.billed_minutes:.1f}" in real_row
    assert f"{real.idle_share:.0%}" in real_row
    assert "make bench" in real_row
    # a model the time scale has no duration for: the sandbox's row alone, no invented figure
    assert len(idle_table(SimpleNamespace(**{**vars(run), "model": "gpt-x"}))) == 3
