"""``tpu-rl-sandbox bench`` section 6: the same training on a cluster the run does not own beside a
create-mode run.

Two runs of the shipped GKE DAG, each in a fresh sandbox on the bench's time scale, with the same
conf but for the cluster: *create* (``gcluster deploy`` of the run's own cluster, destroyed at the
end) and *existing* (``cluster_mode existing`` on a cluster a platform team made:
``world/existing_clusters.make_existing_cluster``, its ``cpu-np`` pool and ``team-queue``; the run
adds and deletes only its own TPU pool). The platform team grants what the run's pods read with
(platform-teams.md, "What a run creates and deletes there"): ``roles/secretmanager.secretAccessor``
and ``roles/storage.objectAdmin`` on the project to the pools' node account (Compute Engine's
default, no ``node_service_account`` named) and to the namespace ``default``'s Kubernetes service
account's Workload Identity principal, before the run, through the sandbox's gcloud; and it binds
that Kubernetes service account to the nodes' account (Workload Identity's
``iam.gke.io/gcp-service-account`` annotation: the cluster record's ``workload_identity_ksa``), so
the conversion and the export write the bucket as that account.

The figures: TPU billed from the ledger (the machines' clocks: in both modes the run's own TPU
pool's node VMs, which the sandbox brings up and stops on the time scale) and the run's wall time,
measured here; the stages' real minutes are the time scale's (``world/timescale.py``, shortened
here: :data:`STAGE_MINUTES`, ``--stage-minutes``). What the sandbox does not play is added from a
stated source and said so: a create-mode cluster's deploy and teardown (``gcluster deploy`` and
``destroy`` of the cluster take sandbox seconds here). Should the ledger hold no billed span, the
TPU pool's life by the sandbox's calls log stands in, and says so.
"""

from __future__ import annotations

import json
import tempfile
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from airflow_provider_tpu_rl.spec import GKE_DAG_ID
from tpu_rl_sandbox.clis.gcloud.app import Gcloud
from tpu_rl_sandbox.commands import tpu_cost
from tpu_rl_sandbox.commands.lifecycle import (
    dags_test,
    migrated_airflow,
    provider_on_the_scale,
    sandbox_down,
    sandbox_env,
    sandbox_up,
)
from tpu_rl_sandbox.world.calls import read_calls
from tpu_rl_sandbox.world.existing_clusters import make_existing_cluster
from tpu_rl_sandbox.world.inventory import cluster_key, project_number
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.settings import update_settings
from tpu_rl_sandbox.world.store import StateStore
from tpu_rl_sandbox.world.timescale import split_minutes

PROJECT: Final = "tpu-rl-bench"
REGION: Final = "us-east5"
ZONE: Final = "us-east5-b"
SHARED_CLUSTER: Final = "team-gke"
# The same training in both runs; the stages shortened (real minutes) to keep the section's cost
# small: conversion, training and export of the GKE preset play these instead of the time scale's
# 22.5, 35 and 22.5 (``--stage-minutes`` replaces them again).
STAGE_MINUTES: Final[Mapping[str, float]] = {"convert": 3.0, "train": 10.0, "export": 3.0}
CONF: Final[Mapping[str, Any]] = {
    "project": PROJECT,
    "region": REGION,
    "zone": ZONE,
    "bucket": "tpu-rl-bench-bucket",
    "num_batches": 3,
}
MODES: Final[Mapping[str, Mapping[str, Any]]] = {
    "create": {"cluster_name": "tpu-rl-bench"},
    "existing": {
        "cluster_mode": "existing",
        "existing_cluster": f"{PROJECT}/{REGION}/{SHARED_CLUSTER}",
        "kueue_queue": "team-queue",
        "cpu_node_pool": "cpu-np",
    },
}
# accelerated-platforms, platforms/gke/base/use-cases/reinforcement-learning/terraform/README.md
# (commit 041210223fd6d4e153f4c006547f5c4c91217c4f, direct): "The `deploy-standard.sh` script usually
# takes 15 to 20 minutes", "The `teardown-standard.sh` script usually takes 10 to 15 minutes". Its
# own reference cluster (Terraform, a system pool, Kueue, JobSet, ...), not a Cluster Toolkit v6e
# cluster's measured deploy: the one published figure for an RL cluster on GKE (issue 55 cites it).
DEPLOY_MINUTES: Final = (15.0, 20.0)
TEARDOWN_MINUTES: Final = (10.0, 15.0)
README: Final = "accelerated-platforms reinforcement-learning/terraform/README.md"
ROLES: Final = ("roles/secretmanager.secretAccessor", "roles/storage.objectAdmin")


def node_account(project: str) -> str:
    """Compute Engine's default service account: the run's pools' nodes' (no ``node_service_account``)."""
    return f"{project_number(project)}-compute@developer.gserviceaccount.com"


def platform_team_members(project: str) -> list[str]:
    """Who the run's pods are on the platform team's cluster: the pools' node account (TPU pods
    use the host network) and namespace ``default``'s service account's Workload Identity principal."""
    return [
        f"serviceAccount:{node_account(project)}",
        f"principal://iam.googleapis.com/projects/{project_number(project)}/locations/global/"
        f"workloadIdentityPools/{project}.svc.id.goog/subject/ns/default/sa/default",
    ]


def _gcloud(root: Path, argv: list[str]) -> None:
    err: list[str] = []
    layout = SandboxLayout(root.resolve())
    code = Gcloud(layout, sandbox_env(root), lambda: b"", lambda _: None, err.append).run(argv)
    if code != 0:
        raise RuntimeError(f"gcloud {' '.join(argv[:3])} failed: {''.join(err)[:300]}")


def platform_team_world(root: Path, project: str = PROJECT) -> dict[str, Any]:
    """The cluster a platform team made, and the grants it gives the run's pods (the module's
    docstring); its record."""
    store = StateStore(SandboxLayout(root.resolve()))
    make_existing_cluster(store, project, REGION, ZONE, SHARED_CLUSTER)
    account = node_account(project)
    with store.txn() as txn:  # namespace default's service account bound to the nodes' account
        clusters = txn.doc("clusters")
        record: dict[str, Any] = clusters[cluster_key(project, REGION, SHARED_CLUSTER)]
        record["workload_identity_ksa"] = "default"
        record["service_accounts"] = {"workload": account, "node_pool": account}
        txn.save("clusters")
    for member in platform_team_members(project):
        for role in ROLES:
            binding = [f"--member={member}", f"--role={role}", "--condition=None"]
            _gcloud(root, ["projects", "add-iam-policy-binding", project, *binding])
    return record


def _run(
    tmp: Path,
    mode: str,
    minute_seconds: float,
    step_seconds: float,
    stages: Mapping[str, float],
    dags_dir: Path,
) -> dict[str, Any]:
    root, home = tmp / mode / "sandbox", tmp / mode / "airflow"
    sandbox_up(root)
    try:
        played, capacity = split_minutes(stages)
        update_settings(
            SandboxLayout(root.resolve()),
            minute_seconds=minute_seconds,
            stage_minutes=played,
            capacity_minutes=capacity,
        )
        if mode == "existing":
            platform_team_world(root)
        airflow, env = migrated_airflow(root, home, dags_dir, step_seconds)
        env.update(provider_on_the_scale(minute_seconds))
        alone = tmp / mode / "dag" / f"{GKE_DAG_ID}.py"
        alone.parent.mkdir(parents=True)
        alone.write_text((dags_dir / f"{GKE_DAG_ID}.py").read_text())
        wall, _ = dags_test(
            airflow, GKE_DAG_ID, alone, env, {**CONF, **MODES[mode], "run_name": f"bench-{mode}"}
        )
        return {
            "wall": wall,
            "tpu": tpu_cost.ledger_tpu_time(home, GKE_DAG_ID),
            "pool_seconds": tpu_pool_seconds(root),
        }
    finally:
        sandbox_down(root, wipe=True)


def tpu_pool_seconds(root: Path) -> float | None:
    """The run's TPU pool's life on a cluster it does not own, by the sandbox's calls log: from the
    end of its ``gcloud container node-pools create`` to the end of its ``delete`` (None: no such
    pair). The sandbox's own clock of the pool, not the machines' (it makes no node VMs for it)."""
    created = deleted = None
    for call in read_calls(SandboxLayout(root.resolve())):
        argv = [str(a) for a in call.get("argv") or []]
        if argv[:2] != ["container", "node-pools"] or len(argv) < 4 or "-tpu-" not in argv[3]:
            continue
        if argv[2] == "create" and call.get("exit_code") == 0:
            created = float(call["end"])
        elif argv[2] == "delete" and call.get("exit_code") == 0:
            deleted = float(call["end"])
    return None if created is None or deleted is None else deleted - created


def bench_existing(
    dags_dir: Path,
    minute_seconds: float,
    step_seconds: float,
    stage_minutes: Mapping[str, float] | None = None,
) -> list[str]:
    """Section 6's lines (the module's docstring)."""
    stages = {**STAGE_MINUTES, **(stage_minutes or {})}
    lines = [
        f"6. The same training on an existing cluster and on a cluster the run creates (GKE pipeline,"
        f" 1 real minute = {minute_seconds:g}s here)",
        f"   stage real minutes played: {json.dumps(stages, sort_keys=True)} (the rest: world/timescale.py)",
    ]
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in MODES:
            runs[mode] = _run(Path(tmp), mode, minute_seconds, step_seconds, stages, dags_dir)
    low, high = (DEPLOY_MINUTES[0] + TEARDOWN_MINUTES[0], DEPLOY_MINUTES[1] + TEARDOWN_MINUTES[1])
    for mode, run in runs.items():
        tpu = run["tpu"] or {}
        billed = tpu.get("billed_seconds")
        wall_minutes = tpu_cost.real_minutes(run["wall"], minute_seconds)
        if billed is not None:
            chips = int(tpu.get("chips") or 0)
            real = tpu_cost.real_minutes(billed, minute_seconds)
            lines.append(
                f"   {mode}: TPU billed (the ledger: the run's TPU pool's node VMs, by their clocks) "
                f"{billed:.1f}s = {real:.1f} real min of the slice, {real * chips / 60:.1f} chip-hours"
            )
        else:
            pool = run["pool_seconds"]
            lines.append(f"   {mode}: TPU billed: not recorded by the ledger (no billed span)")
            if pool is not None:
                lines += textwrap.wrap(
                    f"in its place the TPU pool's life, its create to its delete by the sandbox's calls log: "
                    f"{pool:.1f}s = {tpu_cost.real_minutes(pool, minute_seconds):.1f} real min of the slice "
                    "(the sandbox's clock of the pool, not its nodes')",
                    width=100,
                    initial_indent="     ",
                    subsequent_indent="     ",
                )
        lines.append(
            f"     wall time measured {run['wall']:.1f}s = {wall_minutes:.1f} real min on the time scale"
            " (Airflow's own seconds count as minutes too: an upper bound)"
        )
        if mode == "create":
            lines += textwrap.wrap(
                f"the cluster's deploy and teardown take sandbox seconds here (not on the time scale): a real "
                f"create run adds {low:g}-{high:g} real min of wall time ({README}: deploy 15-20, teardown "
                f"10-15 min, its own reference cluster's figure), {wall_minutes + low:.1f}-{wall_minutes + high:.1f} "
                "real min in all; the TPU pool is deployed after the cluster, so that time bills no TPU",
                width=100,
                initial_indent="     ",
                subsequent_indent="     ",
            )
        else:
            lines += textwrap.wrap(
                "no cluster deploy or teardown: the run creates and deletes its TPU pool only (the "
                "cluster's control plane and system pool are the platform team's, charged to no run)",
                width=100,
                initial_indent="     ",
                subsequent_indent="     ",
            )
    create, existing = (runs[mode] for mode in MODES)
    billed = [(r["tpu"] or {}).get("billed_seconds") for r in (create, existing)]
    if billed[0] is not None and billed[1] is not None:
        made, named = (tpu_cost.real_minutes(float(b), minute_seconds) for b in billed)
        lines.append(
            f"   the same training: TPU billed {made:.1f} (create) vs {named:.1f} (existing) real min: "
            "each run bills its own TPU pool, from its create to its delete, in both modes"
        )
    wall = [tpu_cost.real_minutes(r["wall"], minute_seconds) for r in (create, existing)]
    lines.append(
        f"   wall time: {wall[0] + low:.1f}-{wall[0] + high:.1f} (create, with the README's deploy and"
        f" teardown) vs {wall[1]:.1f} (existing) real min"
    )
    return lines
