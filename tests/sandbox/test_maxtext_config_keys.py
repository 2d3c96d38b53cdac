"""The simulated MaxText refuses config keys the way pyconfig does, from the product's key tables."""

from __future__ import annotations

import importlib.util

import pytest

from airflow_provider_tpu_rl.maxtext import config_keys
from airflow_provider_tpu_rl.spec.presets import GKE_MAXTEXT_VERSION, TPU_VM_MAXTEXT_VERSION
from tpu_rl_sandbox.machines import maxtext_sim


def test_the_sandbox_has_no_key_list_of_its_own() -> None:
    assert maxtext_sim.MAXTEXT_CONFIG_KEYS is config_keys.KEYS
    assert importlib.util.find_spec("tpu_rl_sandbox.maxtext_keys") is None


@pytest.mark.parametrize("version", sorted(config_keys.KEYS))
def test_every_key_of_the_version_is_taken(version: str) -> None:
    argv = [f"{key}=1" for key in config_keys.KEYS[version]]
    args = maxtext_sim.parse_args(maxtext_sim.TRAIN_RL, argv, version)
    assert set(args.config) == set(config_keys.KEYS[version])


def test_an_unknown_key_is_a_pyconfig_value_error() -> None:
    with pytest.raises(maxtext_sim.WorkloadFailed) as raised:
        maxtext_sim.parse_args(maxtext_sim.TRAIN_RL, ["model_name=gemma4-26b", "num_generation=4"])
    (line,) = raised.value.lines
    assert line.startswith("ValueError: 'num_generation' not in 'abort_on_inf_loss', ")
    assert line.endswith(
        f"({len(config_keys.KEYS[GKE_MAXTEXT_VERSION])} valid config keys of MaxText 0.2.4)."
    )


def test_each_release_takes_its_own_keys() -> None:
    only_newer = "inference_rollouts"
    only_older = "degenerate_group_masking"
    assert only_newer in config_keys.KEYS[GKE_MAXTEXT_VERSION]
    assert only_older in config_keys.KEYS[TPU_VM_MAXTEXT_VERSION]
    maxtext_sim.parse_args(maxtext_sim.TRAIN_RL, [f"{only_newer}=1"], GKE_MAXTEXT_VERSION)
    maxtext_sim.parse_args(maxtext_sim.TRAIN_RL, [f"{only_older}=true"], TPU_VM_MAXTEXT_VERSION)
    with pytest.raises(maxtext_sim.WorkloadFailed, match=f"'{only_newer}' not in .*MaxText 0.2.3"):
        maxtext_sim.parse_args(maxtext_sim.TRAIN_RL, [f"{only_newer}=1"], TPU_VM_MAXTEXT_VERSION)
    with pytest.raises(maxtext_sim.WorkloadFailed, match=f"'{only_older}' not in .*MaxText 0.2.4"):
        maxtext_sim.parse_args(maxtext_sim.TRAIN_RL, [f"{only_older}=true"], GKE_MAXTEXT_VERSION)


def test_a_dotted_key_is_checked_on_the_field_omegaconf_nests_it_under() -> None:
    args = maxtext_sim.parse_args(maxtext_sim.TRAIN_RL, ["rl.num_generations=4", "rl.anything=1"])
    assert args.config == {"rl.num_generations": "4", "rl.anything": "1"}
    with pytest.raises(maxtext_sim.WorkloadFailed, match="'nosuch' not in "):
        maxtext_sim.parse_args(maxtext_sim.TRAIN_RL, ["nosuch.num_generations=4"])


def test_a_release_without_a_key_table_cannot_be_simulated() -> None:
    with pytest.raises(maxtext_sim.WorkloadFailed, match=r"no config key table for MaxText 9\.9\.9"):
        maxtext_sim.parse_args(maxtext_sim.TRAIN_RL, ["model_name=x"], "9.9.9")
