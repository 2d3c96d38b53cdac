"""tools/machine_speed.py: the figure `make test` prints beside the legs' times."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tools import machine_speed

ROOT = Path(__file__).resolve().parents[1]


def test_the_workload_is_the_same_work_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine_speed, "ROUNDS", 500)
    first = machine_speed.workload()
    assert first == machine_speed.workload()
    monkeypatch.setattr(machine_speed, "ROUNDS", 1000)
    assert machine_speed.workload() > first  # ROUNDS sets the amount of work


def test_the_best_of_the_runs_is_a_cpu_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine_speed, "ROUNDS", 2000)
    times = iter([10.0, 10.5, 20.0, 20.2, 30.0, 30.9])  # process_time at each start and end
    monkeypatch.setattr(machine_speed.time, "process_time", lambda: next(times))
    assert machine_speed.best_cpu_seconds(3) == pytest.approx(0.2)


def test_make_test_prints_the_figure_before_and_after_the_legs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(machine_speed, "ROUNDS", 500)
    assert machine_speed.main() == 0
    line = capsys.readouterr().out
    assert re.fullmatch(r"machine speed: the reference workload took \d+\.\d\d CPU-s \(.*\)\n", line)
    recipe = (ROOT / "Makefile").read_text().split("\ntest: ", 1)[1].split("\n\n", 1)[0]
    assert 'speed=$$($(BIN)/python tools/machine_speed.py); echo "$$speed"' in recipe
    assert 'cat $(LEG_TIMES) 2>/dev/null; echo "$$speed"' in recipe
