"""What ``gcloud`` accepts (the commands and flags the sandbox knows) and ``gcloud`` as run inside
a machine (a TPU VM's or a pod's own gcloud): storage copies and Secret Manager reads.

Kept apart from :mod:`fake_gcloud` so the machines (:mod:`hosts`) can run gcloud without
importing the CLI application (and the CLI can import the machines).
"""

from __future__ import annotations

from collections.abc import Callable

from tpu_rl_sandbox import storage_ops
from tpu_rl_sandbox.flags import GcloudCommand, GFlag, GPositional, gcloud_parse, gcloud_resolve
from tpu_rl_sandbox.fsview import Router

Write = Callable[[str], None]
SecretAccess = Callable[[str, str, str], tuple[str | None, str]]

P = GPositional
F = GFlag


def _instances_create(path: tuple[str, ...], *, flex_start: bool) -> GcloudCommand:
    """``gcloud [alpha] compute instances create``; ``flex_start``: the track offers FLEX_START
    (command_lib/compute/instances/flags.py AddProvisioningModelVmArgs)."""
    models = ("SPOT", "STANDARD", "RESERVATION_BOUND", *(("FLEX_START",) if flex_start else ()))
    return GcloudCommand(
        path,
        (P("INSTANCE_NAMES", many=True),),
        (
            F("zone"),
            F("machine-type"),
            F("image-project"),
            F("image-family"),
            F("image"),
            F("boot-disk-size"),
            F("boot-disk-type"),
            F("maintenance-policy", choices=("MIGRATE", "TERMINATE")),
            F("instance-termination-action", choices=("DELETE", "STOP")),
            F("provisioning-model", choices=models),
            F("reservation-affinity", choices=("any", "none", "specific")),
            F("reservation"),
            F("labels"),
            F("metadata"),
            F("metadata-from-file"),
            F("scopes"),
            F("service-account"),
            F("network"),
            F("subnet"),
            F("tags"),
            F("accelerator"),
            F("max-run-duration"),
            F("termination-time"),
            F("async", "bool"),
            F("no-address", "bool"),
            F("shielded-secure-boot", "bool"),
        ),
    )


COMMANDS: tuple[GcloudCommand, ...] = (
    GcloudCommand(
        ("storage", "buckets", "create"),
        (P("URL", many=True),),
        (
            F("location", short="l"),
            F("default-storage-class", short="c"),
            F("uniform-bucket-level-access", "bool", short="b", negatable=True),
            F("public-access-prevention", "bool", negatable=True),
            F("enable-hierarchical-namespace", "bool"),
            F("soft-delete-duration"),
            F("retention-period"),
        ),
    ),
    GcloudCommand(("storage", "buckets", "describe"), (P("URL"),), (F("raw", "bool"),)),
    GcloudCommand(("storage", "buckets", "list"), (P("URLS", required=False, many=True),), (F("filter"),)),
    # surface/storage/buckets/add_iam_policy_binding.py: iam_util.AddArgsForAddIamPolicyBinding(add_condition=True)
    GcloudCommand(
        ("storage", "buckets", "add-iam-policy-binding"),
        (P("URL"),),
        (F("member", required=True), F("role", required=True), F("condition"), F("condition-from-file")),
    ),
    GcloudCommand(("storage", "buckets", "get-iam-policy"), (P("URL"),), (F("filter"), F("flatten"))),
    GcloudCommand(
        ("storage", "ls"),
        (P("PATH", required=False, many=True),),
        (
            F("long", "bool", short="l"),
            F("recursive", "bool", short="r"),
            F("readable-sizes", "bool"),
            F("all-versions", "bool", short="a"),
        ),
    ),
    GcloudCommand(
        ("storage", "rm"),
        (P("URLS", many=True),),
        (
            F("recursive", "bool", short="r"),
            F("continue-on-error", "bool"),
            F("all-versions", "bool", short="a"),
        ),
    ),
    GcloudCommand(
        ("storage", "cp"),
        (P("SOURCE", many=True),),
        (F("recursive", "bool", short="r"), F("no-clobber", "bool", short="n"), F("content-type")),
    ),
    GcloudCommand(
        ("storage", "rsync"),
        (P("SOURCE", many=True),),
        (
            F("recursive", "bool", short="r"),
            F("delete-unmatched-destination-objects", "bool"),
            F("checksums-only", "bool"),
            F("exclude", short="x"),
        ),
    ),
    GcloudCommand(
        ("auth", "configure-docker"),
        (P("REGISTRIES", required=False),),
        (F("include-artifact-registry", "bool"),),
    ),
    GcloudCommand(("auth", "list"), (), (F("filter"),)),
    GcloudCommand(("config", "get-value"), (P("PROPERTY"),), ()),
    GcloudCommand(("version",), (), ()),
    GcloudCommand(
        ("projects", "add-iam-policy-binding"),
        (P("PROJECT_ID"),),
        (F("member", required=True), F("role", required=True), F("condition"), F("condition-from-file")),
    ),
    GcloudCommand(("projects", "get-iam-policy"), (P("PROJECT_ID"),), (F("flatten"), F("filter"))),
    GcloudCommand(
        ("secrets", "create"),
        (P("SECRET"),),
        (
            F("replication-policy", choices=("automatic", "user-managed")),
            F("locations"),
            F("data-file"),
            F("labels"),
        ),
    ),
    GcloudCommand(("secrets", "describe"), (P("SECRET"),), ()),
    GcloudCommand(("secrets", "delete"), (P("SECRET"),), ()),
    GcloudCommand(("secrets", "versions", "add"), (P("SECRET"),), (F("data-file", required=True),)),
    GcloudCommand(("secrets", "versions", "access"), (P("VERSION"),), (F("secret"), F("out-file"))),
    GcloudCommand(
        ("secrets", "add-iam-policy-binding"),
        (P("SECRET"),),
        (
            F("member", required=True),
            F("role", required=True),
            F("condition"),
            F("condition-from-file"),
            F("location"),
        ),
    ),
    GcloudCommand(("secrets", "get-iam-policy"), (P("SECRET"),), (F("location"), F("filter"), F("flatten"))),
    # surface/secrets/remove_iam_policy_binding.py: iam_util.AddArgsForRemoveIamPolicyBinding(add_condition=True)
    GcloudCommand(
        ("secrets", "remove-iam-policy-binding"),
        (P("SECRET"),),
        (
            F("member", required=True),
            F("role", required=True),
            F("condition"),
            F("condition-from-file"),
            F("all", "bool"),
            F("location"),
        ),
    ),
    # surface/secrets/update.py: labels_util.AddUpdateLabelsFlags, the annotations map flags
    # (map_util: --update-/--remove-/--clear-annotations, one mutex group), --etag, --location
    GcloudCommand(
        ("secrets", "update"),
        (P("SECRET"),),
        (
            F("update-labels"),
            F("remove-labels"),
            F("clear-labels", "bool"),
            F("update-annotations"),
            F("remove-annotations"),
            F("clear-annotations", "bool"),
            F("etag"),
            F("location"),
        ),
    ),
    # surface/secrets/versions/list.py: a base.ListCommand (--filter/--limit/--page-size/--sort-by/--uri)
    GcloudCommand(
        ("secrets", "versions", "list"),
        (P("SECRET"),),
        (F("location"), F("filter"), F("limit"), F("page-size"), F("sort-by"), F("uri", "bool")),
    ),
    # surface/secrets/versions/disable.py: secrets_args.AddVersion (VERSION + --secret), --etag
    GcloudCommand(
        ("secrets", "versions", "disable"), (P("VERSION"),), (F("secret"), F("location"), F("etag"))
    ),
    # surface/services/list.py (GA): --enabled | --available, base.ListCommand's flags
    GcloudCommand(
        ("services", "list"),
        (),
        (
            F("enabled", "bool"),
            F("available", "bool"),
            F("filter"),
            F("limit"),
            F("page-size"),
            F("sort-by"),
        ),
    ),
    GcloudCommand(("compute", "reservations", "describe"), (P("RESERVATION"),), (F("zone"),)),
    GcloudCommand(("compute", "networks", "describe"), (P("NAME"),), ()),
    GcloudCommand(
        ("compute", "firewall-rules", "list"),
        (P("NAME", required=False, many=True),),
        (F("filter"), F("limit"), F("sort-by")),
    ),
    # surface/compute/firewall_rules/create.py + api_lib/compute/firewalls_utils.py AddCommonArgs
    GcloudCommand(
        ("compute", "firewall-rules", "create"),
        (P("NAME"),),
        (
            F("network"),
            F("allow"),
            F("rules"),
            F("action", choices=("ALLOW", "DENY")),
            F("direction", choices=("INGRESS", "EGRESS", "IN", "OUT")),
            F("priority"),
            F("source-ranges"),
            F("source-tags"),
            F("target-tags"),
            F("target-service-accounts"),
            F("description"),
            F("disabled", "bool", negatable=True),
        ),
    ),
    GcloudCommand(("compute", "firewall-rules", "delete"), (P("NAME", many=True),), ()),
    GcloudCommand(("compute", "project-info", "describe"), (), ()),
    GcloudCommand(("compute", "project-info", "add-metadata"), (), (F("metadata"), F("metadata-from-file"))),
    # surface/compute/instances/create.py (gcloud 528): the GA and beta tracks add
    # --provisioning-model without FLEX_START (support_flex_start=False), alpha with it.
    _instances_create(("compute", "instances", "create"), flex_start=False),
    _instances_create(("alpha", "compute", "instances", "create"), flex_start=True),
    GcloudCommand(
        ("compute", "instances", "delete"),
        (P("INSTANCE_NAMES", many=True),),
        (F("zone"), F("delete-disks"), F("keep-disks")),
    ),
    GcloudCommand(("compute", "instances", "describe"), (P("NAME"),), (F("zone"),)),
    # surface/compute/instances/start.py _CommonArgs: INSTANCES_ARG, csek_utils.AddCsekKeyArgs
    # (flags_about_creation=False: --csek-key-file), base.ASYNC_FLAG
    GcloudCommand(
        ("compute", "instances", "start"),
        (P("INSTANCE_NAMES", many=True),),
        (F("zone"), F("csek-key-file"), F("async", "bool")),
    ),
    GcloudCommand(
        ("compute", "instances", "list"),
        (P("NAME", required=False, many=True),),
        (F("filter"), F("zones"), F("limit"), F("sort-by"), F("uri", "bool")),
    ),
    GcloudCommand(
        ("compute", "ssh"),
        (P("USER_AT_INSTANCE", many=True),),
        (
            F("zone"),
            F("command"),
            F("ssh-flag", "append"),
            F("strict-host-key-checking", choices=("yes", "no", "ask")),
            F("tunnel-through-iap", "bool"),
            F("internal-ip", "bool"),
            F("ssh-key-expire-after"),
            F("ssh-key-expiration"),
            F("ssh-key-file"),
            F("force-key-file-overwrite", "bool", negatable=True),
            F("dry-run", "bool"),
            F("plain", "bool"),
            F("troubleshoot", "bool"),
            F("container"),
        ),
    ),
    GcloudCommand(
        ("container", "clusters", "list"),
        (),
        (F("filter"), F("location"), F("region"), F("zone"), F("limit")),
    ),
    GcloudCommand(
        ("container", "clusters", "describe"), (P("NAME"),), (F("location"), F("region"), F("zone"))
    ),
    GcloudCommand(
        ("container", "clusters", "get-credentials"),
        (P("NAME"),),
        (F("location"), F("region"), F("zone"), F("internal-ip", "bool"), F("dns-endpoint", "bool")),
    ),
)


class GcloudError(Exception):
    """An API/tool error: ``ERROR: (gcloud.x) <message>``, exit code 1 (or ``code``)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


# ============================================================================= VM gcloud
VM_COMMANDS = {
    ("storage", "cp"),
    ("storage", "rsync"),
    ("storage", "ls"),
    ("storage", "rm"),
    ("secrets", "versions", "access"),
    ("config", "get-value"),
}


def _cp_from_stdin(
    router: Router, sources: list[str], to_path: Callable[[str], str], data: bytes, err: Write
) -> int:
    """``gcloud storage cp - DST``: ``-`` must be the only source (gcloud's streaming upload)."""
    if len(sources) != 2:
        raise GcloudError(
            "argument DESTINATION: Must be specified."
            if len(sources) < 2
            else "Multiple URL strings are not supported when transferring from stdin.",
            code=2 if len(sources) < 2 else 1,
        )
    storage_ops.cp_stdin(router, data, to_path(sources[1]), err)
    return 0


def api_error_text(problem: str, account: str = "") -> str:
    """How gcloud prints an API error: ``NOT_FOUND: ...`` / ``PERMISSION_DENIED: ...``; for a 403
    it appends who the command ran as (googlecloudsdk/api_lib/util/exceptions.py
    HttpErrorPayload + core/credentials/store.py CredentialInfo.GetInfoString)."""
    message = problem
    if message.startswith("google.api_core.exceptions."):
        message = message.split(": ", 1)[-1].replace("404 ", "NOT_FOUND: ", 1)
    if message.startswith("PERMISSION_DENIED") and account:
        info = f"This command is authenticated as {account} which is the active account specified by the [core/account] property."
        message = message + " " + info if message.endswith(".") else message + ". " + info[:-1]
    return message


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
            _cp_from_stdin(router, list(parsed.positionals["SOURCE"]), to_absolute, stdin.encode(), stderr)
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
