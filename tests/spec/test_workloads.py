"""The workload-image option in the training spec: a boolean, and never claimed for the stock image."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_tpu_rl.spec import SpecError
from airflow_provider_tpu_rl.spec.presets import POST_TRAINING_IMAGE
from airflow_provider_tpu_rl.spec.workloads import TrainingSpec, check_patched_image

TRAINING: dict[str, Any] = {
    "model_name": "qwen3-30b-a3b",
    "run_name": "rl",
    "base_output_directory": "gs://my-bkt/qwen3-30b-a3b/trained/",
    "load_parameters_path": "gs://my-bkt/qwen3-30b-a3b/max-text-format/0/items/",
    "num_batches": 50,
}


def test_default_is_the_stock_image_behaviour() -> None:
    assert TrainingSpec(**TRAINING).workload_image_patched is False


@pytest.mark.parametrize("value", ["true", 1, None])
def test_option_must_be_a_boolean(value: Any) -> None:
    with pytest.raises(SpecError) as err:
        TrainingSpec(**TRAINING, workload_image_patched=value)
    assert str(err.value).startswith("workload_image_patched: must be true or false")


def test_stock_image_cannot_be_declared_patched() -> None:
    with pytest.raises(SpecError) as err:
        check_patched_image(POST_TRAINING_IMAGE, True)
    assert err.value.field == "workload_image_patched"
    assert "docker/workload.Dockerfile" in str(err.value)


@pytest.mark.parametrize(
    ("image", "patched"),
    [
        (POST_TRAINING_IMAGE, False),
        ("us-docker.pkg.dev/my-proj-123/tpu-rl/tpu_post_training:0.2.4-tpu-rl", True),
        ("us-docker.pkg.dev/my-proj-123/tpu-rl/tpu_post_training:0.2.4-tpu-rl", False),
    ],
)
def test_other_combinations_pass(image: str, patched: bool) -> None:
    assert check_patched_image(image, patched) == image
