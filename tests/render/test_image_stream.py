"""Image streaming for the GKE TPU node pool (issue 53 item 5): the copy's commands, the blueprint's
``enable_gcfs`` and role, the plan's copy and the training image, the parameter's rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

import tpu_rl_sandbox
from airflow_provider_tpu_rl.render import image_stream
from airflow_provider_tpu_rl.render.blueprint import (
    BLUEPRINT_RELPATH,
    NODE_POOL_SA_MODULE,
    STREAMING_ROLE,
    customize_blueprint,
)
from airflow_provider_tpu_rl.render.plan import api_calls, gke_image_streaming, gke_plan
from airflow_provider_tpu_rl.spec import Runner, SpecError, gke_pipeline_from_conf
from airflow_provider_tpu_rl.spec.preflight import STREAMING_PERMISSIONS

BUNDLE_BLUEPRINT = (Path(tpu_rl_sandbox.__file__).parent / "bundle" / BLUEPRINT_RELPATH).read_text()
POOL = "gke-tpu-v6e-pool"
DIGEST = "sha256:" + "ab" * 32
SOURCE = "us-docker.pkg.dev/cloud-tpu-images/maxtext-images/tpu_post_training:0.2.4"
CONF = {"project": "my-proj-123", "bucket": "my-bkt", "region": "us-east5", "zone": "us-east5-b"}


def _modules(text: str) -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(text)
    return {m["id"]: m for g in doc["deployment_groups"] for m in g["modules"]}


def _edited(stream: bool) -> dict[str, dict[str, Any]]:
    p = gke_pipeline_from_conf({**CONF, "model": "qwen3-30b-a3b"})
    c = p.cluster
    text = customize_blueprint(
        BUNDLE_BLUEPRINT,
        c.blueprint,
        reservation=False,
        capacity=c.capacity,
        slice_vms=c.shape.vms,
        tpu_quota=c.total_chips,
        stream_image=stream,
    )
    return _modules(text)


def test_streaming_turns_on_gcfs_on_the_tpu_pool_and_grants_its_account_service_usage_consumer() -> None:
    modules = _edited(True)
    assert modules[POOL]["settings"]["enable_gcfs"] is True
    roles = modules[NODE_POOL_SA_MODULE]["settings"]["project_roles"]
    assert roles.count(STREAMING_ROLE) == 1
    assert "artifactregistry.reader" in roles
    # the CPU pool is not streamed (the conversions run the source image)
    assert not any(m["settings"].get("enable_gcfs") for i, m in _modules_without(modules, POOL))


def _modules_without(modules: dict[str, dict[str, Any]], skip: str) -> list[tuple[str, dict[str, Any]]]:
    return [(i, {**m, "settings": m.get("settings") or {}}) for i, m in modules.items() if i != skip]


def test_without_streaming_the_blueprint_has_neither() -> None:
    modules = _edited(False)
    assert "enable_gcfs" not in modules[POOL]["settings"]
    assert STREAMING_ROLE not in modules[NODE_POOL_SA_MODULE]["settings"]["project_roles"]


def test_the_copy_keeps_the_digest_and_is_tagged_with_it() -> None:
    dest = image_stream.copy_repository("p-1", "us-east5", "tpu-rl-images", SOURCE)
    assert dest == "us-east5-docker.pkg.dev/p-1/tpu-rl-images/tpu_post_training"
    assert image_stream.copy_tag(DIGEST) == "sha256-" + "ab" * 32
    copy = image_stream.copy_image(SOURCE, DIGEST, "p-1", "us-east5", "tpu-rl-images")
    assert copy.argv == (
        "gcloud",
        "container",
        "images",
        "add-tag",
        f"us-docker.pkg.dev/cloud-tpu-images/maxtext-images/tpu_post_training@{DIGEST}",
        f"{dest}:sha256-{'ab' * 32}",
        "--quiet",
    )
    assert (
        image_stream.streamed_image("p-1", "us-east5", "tpu-rl-images", SOURCE, DIGEST) == f"{dest}@{DIGEST}"
    )
    with pytest.raises(ValueError, match="not an image digest"):
        image_stream.copy_tag("sha256:short")


def test_an_existing_repository_is_kept() -> None:
    create = image_stream.create_repository("p-1", "us-east5", "tpu-rl-images")
    assert create.argv[:5] == ("gcloud", "artifacts", "repositories", "create", "tpu-rl-images")
    assert "--repository-format=docker" in create.argv
    assert "--location=us-east5" in create.argv
    assert create.ok_if_output_contains == image_stream.REPOSITORY_EXISTS


def test_the_plan_copies_the_image_beside_the_cluster_and_trains_the_copy() -> None:
    p = gke_pipeline_from_conf({**CONF, "image_repository": "tpu-rl-images"})
    steps = gke_plan(p)
    copy = [s.command.argv for s in steps if s.task_id == "copy_workload_image"]
    assert [argv[1:4] for argv in copy] == [
        ("container", "images", "describe"),  # the tag resolved to its digest
        ("artifacts", "repositories", "create"),
        ("container", "images", "add-tag"),
    ]
    train = " ".join(a for s in steps if s.task_id == "train" for a in s.command.argv)
    assert (
        f"--image=us-east5-docker.pkg.dev/my-proj-123/tpu-rl-images/tpu_post_training@{image_stream.PLAN_DIGEST_STANDIN}"
        in train
    )
    assert gke_image_streaming(p)["streamed"] is True
    permissions = api_calls(Runner.GKE, "my-proj-123", streams_image=True)[0].call.body["permissions"]
    assert set(STREAMING_PERMISSIONS) <= set(permissions)


def test_without_a_repository_nothing_is_copied_and_training_runs_the_source() -> None:
    p = gke_pipeline_from_conf(CONF)
    assert not p.streams_image
    assert p.resolved()["image_repository"] == ""
    steps = gke_plan(p)
    assert not [s for s in steps if s.task_id == "copy_workload_image"]
    assert f"--image={SOURCE}" in " ".join(a for s in steps if s.task_id == "train" for a in s.command.argv)
    assert gke_image_streaming(p)["streamed"] is False


@pytest.mark.parametrize("bad", ["Tpu-images", "1repo", "repo-", "a/b", "x" * 64])
def test_a_bad_repository_id_is_refused_in_one_line(bad: str) -> None:
    with pytest.raises(SpecError, match="image_repository") as err:
        gke_pipeline_from_conf({**CONF, "image_repository": bad})
    assert "\n" not in str(err.value)
