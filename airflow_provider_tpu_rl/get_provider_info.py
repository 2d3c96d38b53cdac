"""Provider metadata read by Airflow's ProvidersManager."""

from __future__ import annotations

from typing import Any

from airflow_provider_tpu_rl import __version__


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-provider-tpu-rl",
        "name": "TPU RL (MaxText GRPO on Cloud TPU)",
        "description": "GRPO RL post-training of LLMs with MaxText on Cloud TPU v6e.",
        "versions": [__version__],
    }
