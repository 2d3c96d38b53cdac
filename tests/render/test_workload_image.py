"""``workload_image_patched``: with an image built from docker/workload.Dockerfile the train command
starts MaxText without rewriting installed files; without it, the tutorials' command is unchanged."""

from __future__ import annotations

import dataclasses
import shlex

import pytest

from airflow_provider_tpu_rl.render import gke
from airflow_provider_tpu_rl.render.plan import gke_plan
from airflow_provider_tpu_rl.spec import GkePipelineSpec, gke_pipeline_from_conf

PATCHED_IMAGE = "us-docker.pkg.dev/my-proj-123/tpu-rl/tpu_post_training:0.2.4-tpu-rl"


def _pipeline(model: str, *, patched: bool) -> GkePipelineSpec:
    pipeline = gke_pipeline_from_conf({"model": model, "project": "my-proj-123", "bucket": "my-bkt"})
    if not patched:
        return pipeline
    training = dataclasses.replace(pipeline.training, workload_image_patched=True)
    return dataclasses.replace(pipeline, image=PATCHED_IMAGE, training=training)


def _train_command(pipeline: GkePipelineSpec) -> str:
    """The ``--command=`` of the train step of the plan (what `tpu-rl plan` prints)."""
    steps = [s for s in gke_plan(pipeline) if s.task_id == "train" and "submit" in s.command.argv]
    assert len(steps) == 1
    (command,) = [a.removeprefix("--command=") for a in steps[0].command.argv if a.startswith("--command=")]
    return command


def _python_c(command: str) -> list[str]:
    """The code of every ``python3 -c CODE`` step of a ``&&`` chain."""
    codes = []
    for step in command.split(" && "):
        words = shlex.split(step)
        if words[:2] == ["python3", "-c"]:
            codes.append(words[2])
    return codes


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("qwen3-30b-a3b", [gke.TUNIX_RESHARD_PATCH, gke.ADAFACTOR_PATCH]),
        ("gemma4-26b", [gke.ADAFACTOR_PATCH]),
    ],
)
def test_stock_image_patches_at_start_up(model: str, expected: list[str]) -> None:
    pipeline = _pipeline(model, patched=False)
    assert _python_c(_train_command(pipeline)) == expected
    assert [code for _, code in gke.startup_patches(pipeline.preset, pipeline.training)] == expected
    patched = dataclasses.replace(pipeline.training, workload_image_patched=True)
    assert gke.startup_patches(pipeline.preset, patched) == []


@pytest.mark.parametrize("model", ["qwen3-30b-a3b", "gemma4-26b"])
def test_patched_image_drops_exactly_the_patch_steps(model: str) -> None:
    stock = _train_command(_pipeline(model, patched=False))
    patched = _train_command(_pipeline(model, patched=True))
    assert _python_c(patched) == []
    assert "write_text" not in patched
    assert "optax" not in patched
    assert len(patched) < len(stock)
    # Every other step is unchanged and in the same order (cgroup limit, vLLM env, token, train_rl).
    kept = [s for s in stock.split(" && ") if shlex.split(s)[:2] != ["python3", "-c"]]
    assert patched.split(" && ") == kept
    assert patched.split(" && ")[-1].startswith(
        "JAX_PLATFORMS=proxy,cpu ENABLE_PATHWAYS_PERSISTENCE=1 python3 -m"
    )


def test_plan_shows_the_patched_image_and_says_so() -> None:
    steps = [s for s in gke_plan(_pipeline("qwen3-30b-a3b", patched=True)) if s.task_id == "train"]
    submit = next(s for s in steps if "submit" in s.command.argv)
    assert f"--image={PATCHED_IMAGE}" in submit.command.argv
    assert "no start-up patches" in submit.to_dict()["description"]
    stock = next(
        s
        for s in gke_plan(_pipeline("qwen3-30b-a3b", patched=False))
        if "submit" in s.command.argv and s.task_id == "train"
    )
    assert "patches" not in stock.to_dict()["description"]


def test_other_jobs_do_not_change_with_the_option() -> None:
    stock = {(s.task_id, s.command.argv) for s in gke_plan(_pipeline("qwen3-30b-a3b", patched=False))}
    patched = {(s.task_id, s.command.argv) for s in gke_plan(_pipeline("qwen3-30b-a3b", patched=True))}
    assert {t for t, _ in stock ^ patched} == {"convert_to_maxtext", "train", "export_to_huggingface"}
    # convert/export differ only by the image flag.
    for task in ("convert_to_maxtext", "export_to_huggingface"):
        (old,) = [a for t, a in stock if t == task and "submit" in a]
        (new,) = [a for t, a in patched if t == task and "submit" in a]
        assert [a for a in old if not a.startswith("--image=")] == [
            a for a in new if not a.startswith("--image=")
        ]
