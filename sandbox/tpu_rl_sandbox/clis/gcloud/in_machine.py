"""``gcloud`` as run inside a machine (a TPU VM's or a pod's own gcloud): storage copies and Secret
Manager reads, with the commands and flags of :mod:`~tpu_rl_sandbox.clis.gcloud.commands`.

Kept apart from the CLI application so the machines (:mod:`~tpu_rl_sandbox.machines.hosts`) can
run gcloud without importing it (and ``gcloud compute ssh`` can import the machines).
"""

from __future__ import annotations

from collections.abc import Callable

from tpu_rl_sandbox.clis.gcloud import storage_ops
from tpu_rl_sandbox.clis.gcloud.commands import COMMANDS
from tpu_rl_sandbox.clis.gcloud.output import GcloudError, Write, api_error_text
from tpu_rl_sandbox.clis.gcloud.parser import gcloud_parse, gcloud_resolve
from tpu_rl_sandbox.machines.fsview import Router

SecretAccess = Callable[[str, str, str], tuple[str | None, str]]
VM_COMMANDS = {
    ("storage", "cp"),
    ("storage", "rsync"),
    ("storage", "ls"),
    ("storage", "rm"),
    ("secrets", "versions", "access"),
    ("config", "get-value"),
    ("auth", "print-access-token"),
}


def run_on_vm(
    argv: list[str],
    router: Router,
    to_absolute: Callable[[str], str],
    secret_access: SecretAccess,
    default_project: str,
    stdout: Write,
    stderr: Write,
    stdin: str = "",
) -> int:
    """``gcloud`` as run inside a VM by the stage scripts (storage copies, secret reads)."""
    command, rest = gcloud_resolve(COMMANDS, argv)
    if command.path not in VM_COMMANDS:
        stderr(f"sandbox: `gcloud {' '.join(command.path)}` is not available inside the VM\n")
        return 1
    parsed = gcloud_parse(command, rest)
    try:
        if command.path == ("storage", "cp") and list(parsed.positionals["SOURCE"])[:1] == ["-"]:
            storage_ops.cp_from_stdin(
                router, list(parsed.positionals["SOURCE"]), to_absolute, stdin.encode(), stderr
            )
        elif command.path == ("storage", "cp"):
            items = [to_absolute(p) for p in parsed.positionals["SOURCE"]]
            if len(items) < 2:
                raise GcloudError("argument DESTINATION: Must be specified.", code=2)
            trailing = "/" if parsed.positionals["SOURCE"][-1].endswith("/") else ""
            storage_ops.cp(router, items[:-1], items[-1] + trailing, bool(parsed.get("recursive")), stderr)
        elif command.path == ("storage", "rsync"):
            items = [to_absolute(p) for p in parsed.positionals["SOURCE"]]
            if len(items) != 2:
                raise GcloudError("rsync requires exactly one SOURCE and one DESTINATION.", code=2)
            storage_ops.rsync(
                router,
                items[0],
                items[1],
                bool(parsed.get("recursive")),
                bool(parsed.get("delete-unmatched-destination-objects")),
                stderr,
                exclude=parsed.get("exclude") or None,
            )
        elif command.path == ("storage", "ls"):
            storage_ops.ls(
                router,
                list(parsed.positionals["PATH"]),
                bool(parsed.get("long")),
                bool(parsed.get("recursive")),
                bool(parsed.get("readable-sizes")),
                stdout,
            )
        elif command.path == ("storage", "rm"):
            storage_ops.rm(router, list(parsed.positionals["URLS"]), bool(parsed.get("recursive")), stderr)
        elif command.path == ("auth", "print-access-token"):
            # the VM's service account's token, from the metadata server (an OAuth access token)
            stdout(f"ya29.sandbox-{router.gcs.identity or 'vm'}\n")
        elif command.path == ("config", "get-value"):
            stdout(default_project + "\n" if parsed.positionals["PROPERTY"] == "project" else "(unset)\n")
        else:
            project = parsed.get("project") or default_project
            secret = parsed.get("secret")
            if not secret:
                raise GcloudError("argument --secret: Must be specified.", code=2)
            value, problem = secret_access(str(project), str(secret), str(parsed.positionals["VERSION"]))
            if value is None:
                raise GcloudError(api_error_text(problem, router.gcs.identity))
            stdout(value)
    except GcloudError as error:
        stderr(f"ERROR: ({command.dotted}) {error.message}\n")
        return error.code
    except storage_ops.StorageOpError as error:
        stderr(f"ERROR: ({command.dotted}) {error}\n")
        return 1
    return 0
