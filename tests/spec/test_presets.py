"""The model presets (spec/presets.py): the MaxText keys a preset sets are keys of its MaxText version."""

from __future__ import annotations


def test_the_presets_own_overrides_are_maxtext_keys_of_their_version() -> None:
    from airflow_provider_tpu_rl.spec.presets import PRESETS
    from airflow_provider_tpu_rl.spec.workloads import check_maxtext_value, maxtext_config_key

    for preset in PRESETS.values():
        for key, value in preset.train_overrides:
            where = f"{preset.model_name}.{key}"
            check_maxtext_value(where, maxtext_config_key(where, key, preset.maxtext_version), value)
