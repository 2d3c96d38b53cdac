"""Pulls take their time (issue 46, item 3): a GKE pod on a TPU node waits for the workload image's
pull once per node pool, on the sandbox's time scale, so the time until training starts counts it;
a pool that streams the image (issue 53 item 5) waits the streamed estimate instead."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tpu_rl_sandbox.machines.job_worker import Worker
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.registry import REGISTRY_IMAGES
from tpu_rl_sandbox.world.settings import update_settings
from tpu_rl_sandbox.world.store import StateStore
from tpu_rl_sandbox.world.timescale import PULL_MINUTES, STREAMED_PULL_MINUTES

IMAGE = "us-docker.pkg.dev/cloud-tpu-images/maxtext-images/tpu_post_training:0.2.4"
MINUTE_SECONDS = 0.08  # the pull: PULL_MINUTES (5) x 0.08 = 0.4 s


def _world(tmp_path: Path) -> tuple[SandboxLayout, dict[str, object]]:
    layout = SandboxLayout(tmp_path)
    update_settings(layout, minute_seconds=MINUTE_SECONDS)
    job = {"uid": "u1", "cluster_key": "p/r/c", "image": IMAGE, "tpu": True}
    with StateStore(layout).txn() as txn:
        txn.doc("clusters")["p/r/c"] = {
            "node_pools": [{"name": "cpu-np"}, {"name": "tpu-pool", "topology": "2x4"}]
        }
        txn.doc("jobs")["p/r/c/train"] = job
        txn.save("clusters")
        txn.save("jobs")
    return layout, job


def _timed(worker: Worker, job: dict[str, object]) -> float:
    began = time.monotonic()
    worker.pull_image(job)  # type: ignore[arg-type]
    return time.monotonic() - began


def test_a_tpu_pools_first_pod_waits_for_the_pull_and_the_next_finds_the_image(tmp_path: Path) -> None:
    layout, job = _world(tmp_path)
    worker = Worker(layout, "p/r/c/train", "u1")
    assert _timed(worker, job) >= PULL_MINUTES * MINUTE_SECONDS
    (pool,) = [p for p in StateStore(layout).read("clusters")["p/r/c"]["node_pools"] if p.get("topology")]
    assert pool["pulled_images"] == [IMAGE]
    assert _timed(worker, job) < PULL_MINUTES * MINUTE_SECONDS / 2  # IfNotPresent: on the node already


def test_a_cpu_pod_and_a_pool_deployed_again_are_as_the_kubelet_finds_them(tmp_path: Path) -> None:
    layout, job = _world(tmp_path)
    worker = Worker(layout, "p/r/c/train", "u1")
    assert _timed(worker, {**job, "tpu": False}) < PULL_MINUTES * MINUTE_SECONDS / 2  # not modelled here
    worker.pull_image(job)  # type: ignore[arg-type]
    with StateStore(layout).txn() as txn:  # the pool destroyed and deployed again: new nodes
        txn.doc("clusters")["p/r/c"]["node_pools"][1] = {"name": "tpu-pool", "topology": "2x4"}
        txn.save("clusters")
    assert _timed(worker, job) >= PULL_MINUTES * MINUTE_SECONDS


COPY = f"us-east5-docker.pkg.dev/p/images/tpu_post_training@{REGISTRY_IMAGES[IMAGE]}"


def _streaming_world(
    tmp_path: Path, image: str, *, gcfs: bool = True, role: bool = True
) -> tuple[Worker, dict[str, Any]]:
    """A TPU pool with or without ``enable_gcfs``, its node account with or without Service Usage
    Consumer, and the registry holding the copy (as ``gcloud container images add-tag`` leaves it)."""
    layout, job = _world(tmp_path)
    job = {**job, "image": image}
    with StateStore(layout).txn() as txn:
        cluster = txn.doc("clusters")["p/r/c"]
        cluster["project"] = "p"
        cluster["node_pool_roles"] = [
            "artifactregistry.reader",
            *(["serviceusage.serviceUsageConsumer"] if role else []),
        ]
        cluster["node_pools"][1]["enable_gcfs"] = gcfs
        txn.doc("registry")["images"] = {
            "us-east5-docker.pkg.dev/p/images/tpu_post_training": {"sha256-x": REGISTRY_IMAGES[IMAGE]}
        }
        txn.save("clusters")
        txn.save("registry")
    return Worker(layout, "p/r/c/train", "u1"), job


def _pull(worker: Worker) -> dict[str, Any]:
    (pull,) = StateStore(worker.layout).read("image_pulls")["pulls"]
    return pull


def test_a_pool_with_image_streaming_streams_the_copy_in_its_projects_registry(tmp_path: Path) -> None:
    worker, job = _streaming_world(tmp_path, COPY)
    took = _timed(worker, job)
    assert STREAMED_PULL_MINUTES * MINUTE_SECONDS <= took < PULL_MINUTES * MINUTE_SECONDS
    pull = _pull(worker)
    assert (pull["streamed"], pull["stage"], pull["real_minutes"]) == (
        True,
        "stream_pull",
        STREAMED_PULL_MINUTES,
    )
    assert pull["reason"] == "streamed from images in p"


@pytest.mark.parametrize(
    ("image", "gcfs", "role", "why"),
    [
        (IMAGE, True, True, f"{IMAGE} is not in an Artifact Registry repository of p"),
        (COPY, False, True, "the TPU node pool has no image streaming (enable_gcfs off)"),
        (
            COPY,
            True,
            False,
            "the node pool's service account lacks roles/serviceusage.serviceUsageConsumer in p",
        ),
        (COPY.replace("/images/", "/other/"), True, True, "is not in its repository"),
    ],
)
def test_a_pool_that_cannot_stream_pulls_the_image_whole(
    tmp_path: Path, image: str, gcfs: bool, role: bool, why: str
) -> None:
    worker, job = _streaming_world(tmp_path, image, gcfs=gcfs, role=role)
    assert _timed(worker, job) >= PULL_MINUTES * MINUTE_SECONDS
    pull = _pull(worker)
    assert (pull["streamed"], pull["stage"], pull["real_minutes"]) == (False, "pull", PULL_MINUTES)
    assert why in pull["reason"]
