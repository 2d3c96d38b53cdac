"""One container of a sandbox VM's docker daemon (:mod:`tpu_rl_sandbox.machines.dockerd`), as a detached
process: its program runs on a :class:`~tpu_rl_sandbox.machines.hosts.ContainerHost` with the VM's services,
its output goes to the daemon's files, its exit status is recorded for the attached client."""

from __future__ import annotations

import json
import shutil
import signal
import sys
from pathlib import Path

from tpu_rl_sandbox.machines import dockerd
from tpu_rl_sandbox.machines.hosts import ContainerHost
from tpu_rl_sandbox.machines.vm_services import vm_services
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.store import StateStore


def main() -> int:
    """The container's process: run its program on a ContainerHost with the VM's services."""
    spec = json.loads(sys.stdin.read())
    record, root = spec["record"], Path(spec["root"])
    layout = SandboxLayout(Path(spec["layout"]))
    project, zone, vm_name = spec["vm"]
    vm = StateStore(layout).read("vms").get(f"{project}/{zone}/{vm_name}") or {}
    services = vm_services(layout, spec["caller_env"], project, zone, vm_name, vm)
    container = ContainerHost(
        root / ".containers" / record["name"], services, spec["hostname"], spec["chips"]
    )
    # SIGTERM (docker stop) ends the program: SystemExit unwinds through Machine.run, which kills it.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    code = 137
    try:
        with open(record["out"], "ab", buffering=0) as out, open(record["err"], "ab", buffering=0) as err:
            code = container.run(
                ["bash", "-c", 'exec "$0" "$@"', *spec["command"]],
                None,
                out.fileno(),
                err.fileno(),
                {**container.base_env(), **spec["env"]},
                spec["workdir"] or container.workdir,
                spec["caller_env"],
            )
    finally:
        # --rm: the container is removed before its exit status is given, as the attached docker
        # client waits for the condition "removed" (docker/cli cli/command/container/utils.go,
        # waitExitOrRemoved): a client that has its status finds the container gone.
        with dockerd.locked(root) as found:
            if (found.get(record["name"]) or {}).get("id") == record["id"]:
                if record["rm"]:
                    del found[record["name"]]
                else:
                    found[record["name"]]["exit"] = code
        if record["rm"]:
            shutil.rmtree(root / ".containers" / record["name"], ignore_errors=True)
        Path(record["exit_file"]).write_text(json.dumps({"exit": code, "preempted": container.preempted}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
