"""The benchmark's arithmetic: simulated cloud work is the union of jobs and fake-CLI calls; each
task's duration from Airflow's database."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

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
