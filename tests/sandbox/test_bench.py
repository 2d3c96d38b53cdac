"""The benchmark's arithmetic: simulated cloud work is the union of jobs and fake-CLI calls; each
task's duration from Airflow's database; section 4's flags (``--tpu-time-only``,
``--stage-minutes``) and its cost lines."""

from __future__ import annotations

import argparse
import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tpu_rl_sandbox.commands import bench, tpu_cost
from tpu_rl_sandbox.commands.bench import PipelineRun, task_seconds, union_seconds
from tpu_rl_sandbox.world.calls import CALL_START_ENV, call_start


@pytest.mark.parametrize(
    ("intervals", "seconds"),
    [
        ([], 0.0),
        ([(0.0, 1.0)], 1.0),
        ([(0.0, 1.0), (2.0, 3.5)], 2.5),
        ([(0.0, 2.0), (1.0, 3.0)], 3.0),  # overlapping: counted once
        ([(0.0, 10.0), (2.0, 3.0), (4.0, 5.0)], 10.0),  # calls during a job add nothing
        ([(5.0, 6.0), (0.0, 1.0)], 2.0),  # order does not matter
    ],
)
def test_union_seconds(intervals: list[tuple[float, float]], seconds: float) -> None:
    assert union_seconds(intervals) == pytest.approx(seconds)


def test_a_pipeline_runs_overhead_is_its_wall_time_outside_jobs_and_calls() -> None:
    run = PipelineRun(
        batches=5,
        wall=30.0,
        jobs={"convert": (100.0, 110.0), "train": (112.0, 120.0)},
        calls=[(99.0, 101.0), (110.5, 111.0), (115.0, 116.0)],  # the last one during a job
        log=[],
    )
    assert run.work == pytest.approx(19.5)  # 99-110, 110.5-111, 112-120
    assert run.overhead == pytest.approx(10.5)


def test_a_call_starts_when_its_shim_started_unless_the_stamp_is_stale() -> None:
    assert call_start({CALL_START_ENV: "99.5"}, 100.0) == 99.5
    assert call_start({CALL_START_ENV: "10.0"}, 100.0) == 100.0  # inherited from an older call
    assert call_start({CALL_START_ENV: "101.0"}, 100.0) == 100.0  # from the future
    assert call_start({CALL_START_ENV: "x"}, 100.0) == 100.0
    assert call_start({}, 100.0) == 100.0


def test_task_seconds_are_the_newest_runs_durations_in_start_order(tmp_path: Path) -> None:
    with contextlib.closing(sqlite3.connect(tmp_path / "airflow.db")) as db:
        db.execute("CREATE TABLE dag_run (id INTEGER, dag_id TEXT, run_id TEXT)")
        db.execute(
            "CREATE TABLE task_instance (dag_id TEXT, run_id TEXT, task_id TEXT, start_date TEXT, end_date TEXT)"
        )
        db.executemany(
            "INSERT INTO dag_run VALUES (?, ?, ?)", [(1, "d", "old"), (2, "d", "new"), (3, "e", "x")]
        )
        db.executemany(
            "INSERT INTO task_instance VALUES (?, ?, ?, ?, ?)",
            [
                ("d", "old", "train", "2026-01-01 00:00:00+00:00", "2026-01-01 01:00:00+00:00"),
                ("d", "new", "train", "2026-01-01 00:00:05+00:00", "2026-01-01 00:00:35.500000+00:00"),
                ("d", "new", "validate", "2026-01-01 00:00:00+00:00", "2026-01-01 00:00:01+00:00"),
                ("d", "new", "skipped", None, None),
                ("e", "x", "train", "2026-01-01 00:00:00+00:00", "2026-01-01 00:00:09+00:00"),
            ],
        )
        db.commit()
    assert list(task_seconds(tmp_path, "d").items()) == [("validate", 1.0), ("train", 30.5)]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="tpu-rl-sandbox bench")
    bench.add_bench_arguments(parser)
    return parser.parse_args(list(argv))


def test_stage_minutes_takes_a_json_object_of_stage_and_capacity_minutes() -> None:
    args = _args("--stage-minutes", '{"train": 60, "vm_provisioning": 1.5}', "--tpu-time-only")
    assert args.stage_minutes == {"train": 60.0, "vm_provisioning": 1.5}
    assert args.tpu_time_only is True
    assert _args().stage_minutes == {}
    assert _args().tpu_time_only is False


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (
            '{"train": 60, "tpu_vm_boot": 1.5}',
            "unknown duration(s) tpu_vm_boot: the known ones are convert, train",
        ),
        ("train=60", "not JSON"),
        ("[60]", "not a JSON object of minutes"),
        ('{"train": -1}', "train: -1 is not a number of minutes >= 0"),
    ],
)
def test_stage_minutes_refuses_in_one_line(value: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        _args("--stage-minutes", value)
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("tpu-rl-sandbox bench: error: argument --stage-minutes: ")
    assert says in error


def test_tpu_time_only_runs_section_4_alone_with_the_overrides(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def not_run(*args: Any) -> Any:
        raise AssertionError("sections 1-3 must not run")

    seen: list[tuple[Any, ...]] = []
    monkeypatch.setattr(bench, "bench_parse", not_run)
    monkeypatch.setattr(bench, "bench_pipeline", not_run)
    monkeypatch.setattr(bench, "bench_tpu_time", lambda *args: seen.append(args) or ["4. the TPU time"])
    args = _args("--tpu-time-only", "--stage-minutes", '{"train": 60}', "--minute-seconds", "1")
    assert bench.run_bench_command(args) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "4. the TPU time"
    (call,) = seen
    assert call[1:4] == (1.0, 2.0, {"train": 60.0})
    assert bench.run_bench_command(_args("--tpu-time-only", "--parse-only")) == 2


def test_the_cost_lines_set_the_run_against_the_tutorials_flow_on_the_same_durations() -> None:
    prices = tpu_cost.read_price_table(Path(__file__).resolve().parents[2] / "docs" / "tpu-prices.md")
    run = bench.TPU_TIME_RUNS["TPU VM (Llama 3.1 8B, v6e-8)"]
    # 26 real minutes billed at 2 s a minute, the tutorials' 53 (its guest's boot 1; train 10 -> 20
    # with the override: 63)
    tpu = {"chips": 8, "billed_seconds": 52.0}
    lines = bench.cost_lines(run, tpu, 2.0, prices, {"train": 20}, {})
    tutorial_minutes = tpu_cost.tutorial_tpu_vm_minutes(run.model, {"train": 20})
    assert tutorial_minutes == pytest.approx(63.0)
    assert lines[1].split()[3:5] == ["26.0", "real"]
    assert lines[1].split()[-3] == f"${26 / 60 * 8 * 2.70:.2f}"
    assert lines[2].split()[2] == "63.0"
    assert lines[2].split()[-3] == f"${63 / 60 * 8 * 2.70:.2f}"
    ratios = lines[4].split()[-3:]
    assert ratios[0] == f"{26 / 63:.2f}x"
    assert ratios[1] == f"{26 * prices['spot'].usd_per_chip_hour / (63 * 2.70):.2f}x"
    assert lines[5].split()[1:5] == ["on-demand", "≤", "0.50x", "(met),"]
    assert bench.cost_lines(run, None, 2.0, prices, {}, {}) == ["   cost: the ledger recorded no billed span"]


def test_section_four_plays_the_providers_sshd_wait_on_its_time_scale() -> None:
    """A booting guest is billed (RUNNING) until its sshd answers; the provider's wait for it polls
    every 5 real seconds for 5 real minutes, so on the scale a poll is not a billed minute."""
    env = bench.provider_on_the_scale(2.0)
    assert float(env["AIRFLOW__TPU_RL__SSH_BOOT_POLL_SECONDS"]) == pytest.approx(5 * 2.0 / 60)
    assert float(env["AIRFLOW__TPU_RL__SSH_BOOT_WAIT_MINUTES"]) * 60 == pytest.approx(5 * 2.0)


def test_the_gke_section_says_whether_the_pools_image_is_streamed_and_from_which_figure() -> None:
    streamed = {
        "streamed": True,
        "enable_gcfs": True,
        "reason": "streamed from images in p",
        "stage": "stream_pull",
        "real_minutes": 0.5,
    }
    whole = {**streamed, "streamed": False, "enable_gcfs": False, "stage": "pull", "real_minutes": 5.0}
    whole["reason"] = "the TPU node pool has no image streaming (enable_gcfs off)"
    text = " ".join(bench.image_pull_lines([streamed]))
    assert "image streamed (enable_gcfs on; streamed from images in p): 0.5 real min" in text
    assert "'a couple of seconds (irrespective of container size)'" in " ".join(text.split())
    text = " ".join(" ".join(bench.image_pull_lines([whole])).split())
    assert "image pulled whole (enable_gcfs off; the TPU node pool has no image streaming" in text
    assert "5.0 real min, timescale's 'pull': an estimate from the image's size" in text
    assert bench.image_pull_lines([]) == ["   the TPU node pool's image: no pull recorded"]
    both = {bench.WHOLE_GKE_RUN: 9.0, bench.STREAMED_GKE_RUN: 4.5}
    (line,) = bench.streaming_lines(both, {})
    assert "image pulled whole 9.0 real min, streamed 4.5 real min" in line
    assert "5.0 vs 0.5 real min" in line
    assert "6.0 vs 0.5 real min" in bench.streaming_lines(both, {"pull": 6.0})[0]
    assert bench.streaming_lines({bench.WHOLE_GKE_RUN: 9.0}, {}) == []
    assert bench.TPU_TIME_RUNS[bench.STREAMED_GKE_RUN].conf["image_repository"]
    assert "image_repository" not in bench.TPU_TIME_RUNS[bench.WHOLE_GKE_RUN].conf
