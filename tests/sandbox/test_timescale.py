"""The sandbox's time scale: with ``minute_seconds`` set, conversion, training and export last
their real minutes (``timescale.STAGE_MINUTES``) times it; unset, a few ``step_seconds``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpu_rl_sandbox.machines import maxtext_sim
from tpu_rl_sandbox.machines.fsview import LocalStore, Router
from tpu_rl_sandbox.world import timescale

STEP = 0.2
MODEL = "llama3.1-8b-Instruct"


def _run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, argv: list[str], minute_seconds: float
) -> list[float]:
    """Run one simulated MaxText entry point; the waits it asked for, in order (none slept)."""
    waits: list[float] = []
    monkeypatch.setattr(maxtext_sim.MaxTextRunner, "wait", lambda self, seconds: waits.append(seconds))
    output: list[str] = []
    ctx = maxtext_sim.SimContext(
        router=Router(gcs=None, local=LocalStore(tmp_path)),  # type: ignore[arg-type]
        write=output.append,
        platform="tpu",
        seed="timescale",
        maxtext_version="0.2.3",
        step_seconds=STEP,
        minute_seconds=minute_seconds,
    )
    code = maxtext_sim.run(module, [f"model_name={MODEL}", *argv], {"HF_TOKEN": "hf_x"}, ctx)
    assert code == 0, "".join(output)
    return waits


def _convert(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, minute_seconds: float) -> list[float]:
    return _run(
        tmp_path, monkeypatch, maxtext_sim.TO_MAXTEXT, ["base_output_directory=/dev/shm/mt"], minute_seconds
    )


def _train(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, minute_seconds: float) -> list[float]:
    _convert(tmp_path, monkeypatch, 0.0)
    argv = [
        "load_parameters_path=/dev/shm/mt/0/items",
        "base_output_directory=/dev/shm/post",
        "run_name=r",
        "num_batches=6",
        "checkpoint_period=100",
    ]
    return _run(tmp_path, monkeypatch, maxtext_sim.TRAIN_RL, argv, minute_seconds)


def test_without_the_time_scale_a_conversion_lasts_a_few_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert sum(_convert(tmp_path, monkeypatch, 0.0)) == pytest.approx(STEP * 8)


def test_with_the_time_scale_a_conversion_lasts_its_real_minutes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    minutes = timescale.STAGE_MINUTES[MODEL][timescale.CONVERT]
    assert minutes == 5.0  # seed 002: "about 5 minutes"
    assert sum(_convert(tmp_path, monkeypatch, 2.0)) == pytest.approx(minutes * 2.0)


def test_with_the_time_scale_training_lasts_its_real_minutes_start_up_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    off = _train(tmp_path / "off", monkeypatch, 0.0)
    on = _train(tmp_path / "on", monkeypatch, 3.0)
    save = STEP / 2  # the one checkpoint's save pause is not scaled
    assert sum(off) == pytest.approx(STEP * (6 + 4) + save)
    assert sum(on) == pytest.approx(timescale.STAGE_MINUTES[MODEL][timescale.TRAIN] * 3.0 + save)


def test_a_model_or_stage_without_real_minutes_keeps_its_default() -> None:
    assert timescale.stage_seconds(1.0, "some-other-model", timescale.TRAIN, 7.0) == 7.0
    assert timescale.stage_seconds(1.0, MODEL, "deploy", 7.0) == 7.0
    assert timescale.stage_seconds(0.0, MODEL, timescale.TRAIN, 7.0) == 7.0
    assert timescale.stage_seconds(0.5, "qwen3-30b-a3b", timescale.EXPORT, 7.0) == 11.25


def test_capacity_operations_take_their_minutes_only_with_the_time_scale() -> None:
    assert timescale.capacity_seconds(0.0, "tpu_pool_create") == 0.0
    assert timescale.capacity_seconds(2.0, "tpu_pool_create") == 10.0
    assert timescale.capacity_seconds(2.0, "vm_delete") == 2.0
    with pytest.raises(KeyError):
        timescale.capacity_seconds(2.0, "cluster_create")
