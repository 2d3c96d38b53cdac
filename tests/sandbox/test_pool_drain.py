"""A TPU node pool's drain as GKE does it (issue 46): its nodes' pods are deleted with the largest
``terminationGracePeriodSeconds`` among those still running (30 s unset, an hour at most), the node
VMs billed meanwhile; a pool whose pods have all finished is not drained at all."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tpu_rl_sandbox.clis.gcluster import deploy
from tpu_rl_sandbox.clis.gcluster.deploy import DeploymentRunner
from tpu_rl_sandbox.world import gke_nodes, timescale
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.settings import update_settings
from tpu_rl_sandbox.world.store import StateStore

KEY = "p/r/c"
GROUP = {"group": "tpu"}
TPU_POOL = {
    "name": "tpu-pool",
    "group": "tpu",
    "topology": "4x8",
    "machine_type": "ct6e-standard-4t",
    "nodes": 2,
}
TPU_SELECTOR = {
    gke_nodes.TPU_ACCELERATOR_SELECTOR: "tpu-v6e-slice",
    gke_nodes.TPU_TOPOLOGY_SELECTOR: "4x8",
}


def _job(phase: str, grace: Any = None, *, selector: dict[str, str] | None = None) -> dict[str, Any]:
    """A JobSet record of the cluster with one replicated job and two pods in ``phase``."""
    spec: dict[str, Any] = {"nodeSelector": TPU_SELECTOR if selector is None else selector}
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    rjob = {"name": "slice", "template": {"spec": {"template": {"spec": spec}}}}
    return {
        "cluster_key": KEY,
        "manifest": {"spec": {"replicatedJobs": [rjob]}},
        "pods": [{"replicatedJob": "slice", "phase": phase} for _ in range(2)],
    }


def test_the_drain_is_the_largest_grace_of_the_pods_still_on_the_tpu_nodes() -> None:
    graces = gke_nodes.running_pod_graces
    assert graces([_job("Succeeded", 90), _job("Failed", 90)], KEY, TPU_POOL) == []
    assert graces([_job("Running", 90), _job("Pending")], KEY, TPU_POOL) == [90, 90, None, None]
    assert graces([_job("Running", 90, selector={})], KEY, TPU_POOL) == []  # a CPU pod
    assert graces([{**_job("Running", 90), "cluster_key": "p/r/other"}], KEY, TPU_POOL) == []
    assert graces([_job("Running", 90)], KEY, {**TPU_POOL, "topology": "2x4"}) == []  # another pool
    assert timescale.drain_real_minutes([]) == 0.0  # nothing runs: no drain
    assert timescale.drain_real_minutes([None]) == pytest.approx(0.5)  # unset: 30 s
    assert timescale.drain_real_minutes([90, None, 0]) == pytest.approx(1.5)
    assert timescale.drain_real_minutes([7200]) == pytest.approx(60.0)  # capped at an hour
    assert timescale.drain_seconds(0.0, [90]) == 0.0  # the time scale off
    assert timescale.drain_seconds(2.0, [90]) == pytest.approx(3.0)


def _billed_after_destroy(
    tmp_path: Path, minute_seconds: float, jobs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> tuple[float, list[float]]:
    """The TPU pool's node VMs RUNNING from now, then its group destroyed as ``gcluster destroy``
    does it (the drain, then the VMs' delete): the drain the sandbox waited (what its clock was
    asked for, not how long the sleep took on this machine) and each node's billed seconds: RUNNING
    (its insert's end) to its delete's start (STOPPING)."""
    waited: list[float] = []
    sleep = time.sleep

    def recorded_sleep(seconds: float) -> None:
        waited.append(seconds)
        sleep(seconds)

    monkeypatch.setattr(deploy.time, "sleep", recorded_sleep)
    layout = SandboxLayout(tmp_path)
    update_settings(layout, minute_seconds=minute_seconds)
    cluster = {"name": "c", "project": "p", "region": "r", "zone": "r-a", "node_pools": [dict(TPU_POOL)]}
    with StateStore(layout).txn() as txn:
        txn.doc("clusters")[KEY] = cluster
        txn.doc("jobs").update({f"{KEY}/job-{i}": job for i, job in enumerate(jobs)})
        pool = cluster["node_pools"][0]
        running_at = gke_nodes.create_nodes(
            txn, cluster, pool, begin=time.time(), minute_seconds=0.0, overrides={}
        )
        gke_nodes.finish_creates(txn, cluster, pool, running_at)
        txn.save("clusters")
        txn.save("jobs")
    runner = DeploymentRunner(layout, None, None, None, True, lambda: None, 0.0, lambda _: None)  # type: ignore[arg-type]
    runner._drain_tpu_nodes(KEY, GROUP)
    (drain,) = waited
    runner._take_down_tpu_nodes(KEY, GROUP)
    store = StateStore(layout)
    assert store.read("vms") == {}
    ops = [op for zone in store.read("operations").values() for op in zone]
    running = {op["targetId"]: op["endTime"] for op in ops if op["operationType"] == "insert"}
    stopping = {op["targetId"]: op["startTime"] for op in ops if op["operationType"] == "delete"}
    assert set(running) == set(stopping)
    assert len(running) == 2
    return drain, [
        (datetime.fromisoformat(stopping[node]) - datetime.fromisoformat(running[node])).total_seconds()
        for node in running
    ]


def test_a_pool_whose_pods_have_all_finished_is_not_drained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the flat 2-minute drain the sandbox had would wait 2.4 s at 1 real minute = 1.2 s
    drain, billed = _billed_after_destroy(
        tmp_path, 1.2, [_job("Succeeded", 600), _job("Failed")], monkeypatch
    )
    assert drain == 0.0
    assert all(seconds >= 0.0 for seconds in billed), billed


def test_a_running_pods_grace_period_is_the_drain_billed_on_the_time_scale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 45 s of grace at 1 real minute = 1.2 s: 0.9 s, the longest of the running pods' (a finished
    # pod's longer grace does not count); the nodes bill all of it
    jobs = [_job("Running", 45), _job("Running", 10), _job("Succeeded", 600)]
    drain, billed = _billed_after_destroy(tmp_path / "grace", 1.2, jobs, monkeypatch)
    assert drain == pytest.approx(0.9)
    assert all(seconds >= drain - 0.01 for seconds in billed), billed
    # two hours of grace are capped at GKE's hour: 60 real minutes at 0.01 s each, 0.6 s (not 1.2)
    drain, billed = _billed_after_destroy(tmp_path / "cap", 0.01, [_job("Running", 7200)], monkeypatch)
    assert drain == pytest.approx(0.6)
    assert all(seconds >= drain - 0.01 for seconds in billed), billed
