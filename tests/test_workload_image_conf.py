"""`workload_image_patched` end to end through the conf: `tpu-rl plan` shows the shorter command."""

from __future__ import annotations

import json

import pytest

from airflow_provider_tpu_rl.cli import main

PATCHED_IMAGE = "us-docker.pkg.dev/my-proj-123/tpu-rl/tpu_post_training:0.2.4-tpu-rl"


def _train_command(capsys: pytest.CaptureFixture[str], conf: dict[str, object]) -> str:
    assert main(["plan", "tpu_rl_gke_pipeline", "--conf", json.dumps(conf)]) == 0
    steps = json.loads(capsys.readouterr().out)["steps"]
    (submit,) = [s for s in steps if s["task_id"] == "train" and "submit" in s["argv"]]
    return next(a for a in submit["argv"] if a.startswith("--command="))


def test_plan_shows_the_shorter_command(capsys: pytest.CaptureFixture[str]) -> None:
    stock = _train_command(capsys, {})
    patched = _train_command(capsys, {"image": PATCHED_IMAGE, "workload_image_patched": True})
    assert "write_text" in stock
    assert "write_text" not in patched
    assert len(patched) < len(stock)


def test_plan_refuses_the_stock_image_declared_patched(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "tpu_rl_gke_pipeline", "--conf", '{"workload_image_patched": true}']) != 0
    assert (
        "workload_image_patched: the stock tpu_post_training:0.2.4 image is not patched"
        in capsys.readouterr().err
    )
