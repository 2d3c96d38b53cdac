"""``tpu-rl-sandbox bench`` section 6: the platform team's world it runs the existing-mode run in,
and the TPU pool's life it reads from the calls log (the runs themselves: ``make bench``)."""

from __future__ import annotations

import json
from pathlib import Path

from tpu_rl_sandbox.commands.existing_bench import (
    MODES,
    node_account,
    platform_team_members,
    platform_team_world,
    tpu_pool_seconds,
)
from tpu_rl_sandbox.commands.lifecycle import SandboxInfo
from tpu_rl_sandbox.world import iam
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.store import StateStore


def test_the_platform_team_grants_the_pods_what_they_read_and_write_with(sandbox: SandboxInfo) -> None:
    project = "bench-existing-t1"
    cluster = platform_team_world(sandbox.root, project)
    store = StateStore(SandboxLayout(Path(sandbox.root).resolve()))
    tpu_pod, _ = iam.pod_identity(cluster, {"tpu": True})
    cpu_pod, account = iam.pod_identity(cluster, {"service_account": "default"})
    assert tpu_pod == cpu_pod == node_account(project)  # namespace default's KSA bound to it
    assert iam.account_can_write(store, cluster, str(account))  # the conversion writes the bucket
    for member in platform_team_members(project):
        resources = [f"projects/{project}"]
        assert iam.member_has_permission(store, resources, member, "secretmanager.versions.access")
    assert MODES["existing"]["existing_cluster"].endswith("/us-east5/team-gke")


def test_the_tpu_pools_life_is_its_create_to_its_delete_by_the_calls_log(tmp_path: Path) -> None:
    layout = SandboxLayout(tmp_path)
    layout.calls_file.parent.mkdir(parents=True, exist_ok=True)

    def call(verb: str, pool: str, end: float, code: int = 0) -> str:
        argv = ["container", "node-pools", verb, pool, "--cluster=team-gke"]
        return json.dumps({"tool": "gcloud", "argv": argv, "start": end - 1, "end": end, "exit_code": code})

    lines = [
        call("create", "tpu-rl-abc123-cpu", 5.0),  # the CPU pool: not the TPU's
        call("create", "tpu-rl-abc123-tpu-0", 10.0),
        call("delete", "tpu-rl-abc123-tpu-0", 70.5),
    ]
    layout.calls_file.write_text("\n".join(lines) + "\n")
    assert tpu_pool_seconds(tmp_path) == 60.5
    layout.calls_file.write_text(lines[1] + "\n")
    assert tpu_pool_seconds(tmp_path) is None  # never deleted: no life to tell
