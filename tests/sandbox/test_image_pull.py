"""Pulls take their time (issue 46, item 3): a GKE pod on a TPU node waits for the workload image's
pull once per node pool, on the sandbox's time scale, so the time until training starts counts it."""

from __future__ import annotations

import time
from pathlib import Path

from tpu_rl_sandbox.machines.job_worker import Worker
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.settings import update_settings
from tpu_rl_sandbox.world.store import StateStore
from tpu_rl_sandbox.world.timescale import PULL_MINUTES

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
