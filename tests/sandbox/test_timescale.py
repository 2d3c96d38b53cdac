"""The sandbox's time scale: with ``minute_seconds`` set, conversion, training and export last
their real minutes (``timescale.STAGE_MINUTES``) times it; unset, a few ``step_seconds``. The
settings ``stage_minutes`` and ``capacity_minutes`` replace any duration (``bench --stage-minutes``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace

import pytest

from tpu_rl_sandbox.machines import hosts, maxtext_sim
from tpu_rl_sandbox.machines import vm_services as vm_services_module
from tpu_rl_sandbox.machines.fsview import LocalStore, Router
from tpu_rl_sandbox.machines.vm_services import vm_services
from tpu_rl_sandbox.world import timescale
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.settings import load_settings, update_settings

STEP = 0.2
MODEL = "llama3.1-8b-Instruct"


def _run(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    module: str,
    argv: list[str],
    minute_seconds: float,
    stage_minutes: Mapping[str, float] | None = None,
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
        stage_minutes=dict(stage_minutes or {}),
    )
    code = maxtext_sim.run(module, [f"model_name={MODEL}", *argv], {"HF_TOKEN": "hf_x"}, ctx)
    assert code == 0, "".join(output)
    return waits


def _convert(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    minute_seconds: float,
    stage_minutes: Mapping[str, float] | None = None,
) -> list[float]:
    argv = ["base_output_directory=/dev/shm/mt"]
    return _run(tmp_path, monkeypatch, maxtext_sim.TO_MAXTEXT, argv, minute_seconds, stage_minutes)


def _train(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    minute_seconds: float,
    stage_minutes: Mapping[str, float] | None = None,
) -> list[float]:
    _convert(tmp_path, monkeypatch, 0.0)
    argv = [
        "load_parameters_path=/dev/shm/mt/0/items",
        "base_output_directory=/dev/shm/post",
        "run_name=r",
        "num_batches=6",
        "checkpoint_period=100",
    ]
    return _run(tmp_path, monkeypatch, maxtext_sim.TRAIN_RL, argv, minute_seconds, stage_minutes)


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
    assert timescale.capacity_seconds(2.0, "tpu_pool_create") == 2.0
    assert timescale.capacity_seconds(2.0, "vm_stopping") == 2.0
    assert timescale.capacity_seconds(2.0, "vm_provisioning", {"vm_provisioning": 4}) == 8.0
    with pytest.raises(KeyError):
        timescale.capacity_seconds(2.0, "cluster_create")


def test_a_stage_override_replaces_its_minutes_for_every_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert sum(_convert(tmp_path / "c", monkeypatch, 2.0, {"convert": 1.5})) == pytest.approx(3.0)
    save = STEP / 2
    assert sum(_train(tmp_path / "t", monkeypatch, 3.0, {"train": 60})) == pytest.approx(180.0 + save)
    for model in ("qwen3-30b-a3b", MODEL):
        assert timescale.stage_seconds(2.0, model, timescale.EXPORT, 7.0, {"export": 4}) == 8.0
    # another stage's override leaves this one alone; with the scale off, the override too
    assert timescale.stage_seconds(2.0, MODEL, timescale.TRAIN, 7.0, {"export": 4}) == 20.0
    assert timescale.stage_seconds(0.0, MODEL, timescale.TRAIN, 7.0, {"train": 60}) == 7.0


def test_the_tpu_vms_own_stages_take_their_estimate_or_the_override() -> None:
    assert timescale.stage_real_minutes(timescale.INSTALL) == timescale.INSTALL_MINUTES
    assert timescale.stage_real_minutes(timescale.PULL) == timescale.PULL_MINUTES
    assert timescale.stage_real_minutes(timescale.PULL, overrides={"pull": 0.5}) == 0.5
    assert timescale.stage_real_minutes(timescale.TRAIN, "some-other-model") is None
    # the VM waits what the sandbox setting says (its machine services carry the settings' overrides)
    vm = SimpleNamespace(services=SimpleNamespace(stage_minutes={"install": 3.0}))
    assert hosts.VmHost.stage_minutes(vm, timescale.INSTALL) == 3.0  # type: ignore[arg-type]
    assert hosts.VmHost.stage_minutes(vm, timescale.DOCKER_INSTALL) == timescale.DOCKER_INSTALL_MINUTES  # type: ignore[arg-type]


def test_overrides_split_into_stages_and_capacity_and_unknown_keys_are_named() -> None:
    stages, capacity = timescale.split_minutes({"train": 60, "vm_provisioning": 1.5, "pull": 0})
    assert (stages, capacity) == ({"train": 60.0, "pull": 0.0}, {"vm_provisioning": 1.5})
    with pytest.raises(
        ValueError, match=r"^unknown duration\(s\) tpu_vm_boot: the known ones are convert, train,"
    ) as err:
        timescale.split_minutes({"train": 60, "tpu_vm_boot": 1.5})
    assert "\n" not in str(err.value)
    assert all(key in str(err.value) for key in (*timescale.STAGE_KEYS, *timescale.CAPACITY_MINUTES))
    for bad in (-1, math.nan, math.inf, True, "5"):
        with pytest.raises(ValueError, match="is not a number of minutes >= 0"):
            timescale.split_minutes({"train": bad})


def test_the_settings_keep_the_stage_overrides_and_refuse_unknown_stages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = SandboxLayout(tmp_path)
    monkeypatch.setattr(vm_services_module.gcs_emulator, "api_for", lambda layout: None)  # no GCS read here
    update_settings(layout, minute_seconds=2.0, stage_minutes={"train": 60})
    assert load_settings(layout).stage_minutes == {"train": 60.0}
    # what a TPU VM's programs are given (its SSH sessions' and containers' MaxText, its install)
    services = vm_services(layout, {}, "p", "us-east5-b", "vm", {"serviceAccount": "sa@p.iam"})
    assert (services.minute_seconds, services.stage_minutes) == (2.0, {"train": 60.0})
    with pytest.raises(TypeError, match="unknown stage_minutes key"):
        update_settings(layout, stage_minutes={"vm_provisioning": 1})


def test_a_guests_boot_is_billed_and_lasts_its_minute_on_the_scale_and_none_off_it_unless_set() -> None:
    assert "guest_boot" in timescale.CAPACITY_MINUTES
    assert timescale.guest_boot_seconds(2.0) == pytest.approx(2.0 * timescale.CAPACITY_MINUTES["guest_boot"])
    assert timescale.guest_boot_seconds(2.0, {"guest_boot": 3}) == pytest.approx(6.0)
    assert timescale.guest_boot_seconds(0.0) == 0.0  # a test's ssh right after its create answers
    off = timescale.SCALE_OFF_GUEST_MINUTE_SECONDS
    assert timescale.guest_boot_seconds(0.0, {"guest_boot": 10}) == pytest.approx(10 * off)
    assert timescale.guest_seconds(0.0, 60.0) == pytest.approx(off)  # gcloud's 60 s SSH poll
    assert timescale.guest_seconds(6.0, 5.0) == pytest.approx(0.5)
