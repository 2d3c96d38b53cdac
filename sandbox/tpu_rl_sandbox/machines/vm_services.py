"""What a program on a sandbox VM reaches (its SSH sessions' and its docker daemon's containers'
alike): GCS and Secret Manager as the VM's service account, the faults, the simulated MaxText's
pace, the preemption settings; and the VM's history of the programs it ran."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from tpu_rl_sandbox.apis import gcs_emulator
from tpu_rl_sandbox.world import iam, inventory, secret_values
from tpu_rl_sandbox.world.faults import FaultGate, claim_preemption
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.settings import load_settings
from tpu_rl_sandbox.world.store import StateStore
from tpu_rl_sandbox.world.timestamps import rfc3339


def record_program(
    store: StateStore, project: str, zone: str, name: str, module: str, runtime: str, version: str
) -> None:
    """The VM's history (``vm_history``: each life's machine type, create and delete times)
    notes a MaxText program it started, with the time, its runtime (``install``: the VM's venv;
    ``container``: a container of the post-training image) and the MaxText release it ran."""
    with store.txn() as txn:
        lives = txn.doc("vm_history").get(f"{project}/{zone}/{name}") or []
        if lives:
            lives[-1]["programs"].append(
                {"module": module, "started": time.time(), "runtime": runtime, "maxtext_version": version}
            )
            txn.save("vm_history")


def vm_services(
    layout: SandboxLayout,
    env: Mapping[str, str],
    project: str,
    zone: str,
    name: str,
    record: Mapping[str, Any],
) -> Any:
    """What a program on the VM reaches (``hosts.MachineServices``): GCS and Secret Manager as the
    VM's service account, the faults, the simulated MaxText's pace, the preemption settings. Its
    SSH sessions and the containers its docker daemon runs (``dockerd``) share it."""
    from tpu_rl_sandbox.machines import hosts, maxtext_sim

    step_seconds, hold_file = maxtext_sim.context_from_env(dict(env))
    store = StateStore(layout)
    faults = FaultGate.from_env(store, dict(env))
    # Inside the VM everything runs as the VM's service account (what `describe` reports).
    account = str(record.get("serviceAccount") or "")
    member = f"serviceAccount:{account}"

    def authorize(permission: str, resources: list[str]) -> bool:
        return iam.member_has_permission(store, resources, member, permission)

    def bucket_project(bucket: str) -> str | None:
        return inventory.bucket_project(store, bucket)

    return hosts.MachineServices(
        gcs=hosts.IamGcsStore(
            gcs_emulator.api_for(layout),
            account,
            list(record.get("scopes", [])),
            authorize,
            bucket_project,
        ),
        secret_access=lambda p, s, v: secret_values.secret_value(store, p, s, v),
        fault=faults.fire,
        seed=f"{project}/{zone}/{name}",
        step_seconds=step_seconds,
        hold_file=hold_file,
        minute_seconds=load_settings(layout).minute_seconds,
        stage_minutes=dict(load_settings(layout).stage_minutes),
        hold_seconds=load_settings(layout).hold_seconds,
        cancelled=lambda: False,
        default_project=project,
        authorize=authorize,
        bucket_project=bucket_project,
        on_program=lambda module, runtime, version: record_program(
            store, project, zone, name, module, runtime, version
        ),
        preempt=lambda run_dir, committed, past: claim_preemption(
            store,
            load_settings(layout).preemption,
            run_dir,
            committed,
            past,
            f"{project}/{zone}/{name}",
            rfc3339(),
        ),
    )
