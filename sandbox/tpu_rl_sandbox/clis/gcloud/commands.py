"""What ``gcloud`` accepts: the commands and flags the sandbox knows, as gcloud's surface declares
them."""

from __future__ import annotations

from tpu_rl_sandbox.clis.gcloud.parser import GcloudCommand, GFlag, GPositional

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
    # surface/storage/buckets/remove_iam_policy_binding.py: iam_util.AddArgsForRemoveIamPolicyBinding(add_condition=True)
    GcloudCommand(
        ("storage", "buckets", "remove-iam-policy-binding"),
        (P("URL"),),
        (
            F("member", required=True),
            F("role", required=True),
            F("condition"),
            F("condition-from-file"),
            F("all", "bool"),
        ),
    ),
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
    GcloudCommand(("auth", "print-access-token"), (P("ACCOUNT", required=False),), ()),
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
    GcloudCommand(("compute", "regions", "describe"), (P("NAME"),), ()),
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
    # surface/compute/disks/describe.py (GA): disks_flags.MakeDiskArg(plural=False): DISK_NAME, --zone
    # or --region (a regional disk: not simulated)
    GcloudCommand(("compute", "disks", "describe"), (P("DISK_NAME"),), (F("zone"), F("region"))),
    # surface/compute/instances/stop.py (GA): INSTANCES_ARG, --discard-local-ssd, base.ASYNC_FLAG
    GcloudCommand(
        ("compute", "instances", "stop"),
        (P("INSTANCE_NAMES", many=True),),
        (F("zone"), F("discard-local-ssd"), F("async", "bool")),
    ),
    # surface/compute/images/create.py (GA) _Args: the source group (checked by the command), the
    # common args, labels, --force, the CSEK/KMS/shielded-VM keys, --storage-location
    GcloudCommand(
        ("compute", "images", "create"),
        (P("IMAGE_NAME"),),
        (
            F("source-disk"),
            F("source-image"),
            F("source-image-family"),
            F("source-snapshot"),
            F("source-uri"),
            F("source-disk-zone"),
            F("source-disk-project"),
            F("source-image-project"),
            F("description"),
            F("family"),
            F("licenses"),
            F("labels"),
            F("force", "bool"),
            F("guest-os-features"),
            F("architecture", choices=("ARM64", "X86_64")),
            F("storage-location"),
            F("csek-key-file"),
            F("require-csek-key-create", "bool", negatable=True),
            F("kms-key"),
            F("kms-keyring"),
            F("kms-location"),
            F("kms-project"),
            F("platform-key-file"),
            F("key-exchange-key-file"),
            F("signature-database-file"),
            F("forbidden-database-file"),
        ),
    ),
    GcloudCommand(("compute", "images", "describe"), (P("IMAGE_NAME"),), ()),
    # surface/compute/images/describe_from_family.py: the family as IMAGE_NAME, --zone (image family views)
    GcloudCommand(("compute", "images", "describe-from-family"), (P("IMAGE_NAME"),), (F("zone"),)),
    # surface/container/images/describe.py (GA): the image, by tag or digest
    GcloudCommand(("container", "images", "describe"), (P("IMAGE_NAME"),), ()),
    # surface/container/images/add_tag.py Args: flags.AddTagOrDigestPositional twice (command_lib/
    # container/flags.py l.3485-3508): SRC_IMAGE, then DEST_IMAGE nargs='+'; no flags of its own
    GcloudCommand(("container", "images", "add-tag"), (P("SRC_IMAGE"), P("DEST_IMAGE", many=True)), ()),
    # surface/artifacts/repositories/create.yaml (GA): the repository resource (REPOSITORY,
    # --location), its params, labels, --async; util.AddAdditionalArgs: --upstream-policy-file,
    # --repository-format (required); --mode, --immutable-tags and the remote repository flags are not
    # simulated (unknown here)
    GcloudCommand(
        ("artifacts", "repositories", "create"),
        (P("REPOSITORY"),),
        (
            F("location"),
            F("repository-format", required=True),
            F("description"),
            F("kms-key"),
            F("labels"),
            F("allow-vulnerability-scanning", "bool"),
            F("disable-vulnerability-scanning", "bool"),
            F("upstream-policy-file"),
            F("async", "bool"),
        ),
        exclusive=(("allow-vulnerability-scanning", "disable-vulnerability-scanning"),),
    ),
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
    # surface/compute/operations/list.py (GA): lister.AddMultiScopeListerFlags (NAME, --regexp, and
    # one of --zones | --regions | --global), base.ListCommand's --filter, --limit, --page-size,
    # --sort-by, --uri
    GcloudCommand(
        ("compute", "operations", "list"),
        (P("NAME", required=False, many=True),),
        (
            F("zones"),
            F("regions"),
            F("global", "bool"),
            F("regexp", short="r"),
            F("filter"),
            F("limit"),
            F("page-size"),
            F("sort-by"),
            F("uri", "bool"),
        ),
        exclusive=(("zones", "regions", "global"),),
    ),
    GcloudCommand(
        ("compute", "ssh"),
        # [USER@]INSTANCE and the command's trailing args; the command says when it is missing
        (P("USER_AT_INSTANCE", required=False, many=True),),
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
    # surface/container/node_pools/create.py (GA) _Args: the flags the provider renders (of its
    # many), each with gcloud's choices (command_lib/container/flags.py AddReservationAffinityFlags,
    # AddWorkloadMetadataFlag, AddLocationPolicyFlag; the autoscaling flags AddAutoscalerArgs)
    GcloudCommand(
        ("container", "node-pools", "create"),
        (P("NAME"),),
        (
            F("cluster"),
            F("location"),
            F("region"),
            F("zone"),
            F("node-locations"),
            F("machine-type"),
            F("tpu-topology"),
            F("num-nodes"),
            F("reservation-affinity", choices=("any", "none", "specific")),
            F("reservation"),
            F("spot", "bool"),
            F("flex-start", "bool"),
            F("enable-autorepair", "bool", negatable=True),
            F("enable-autoscaling", "bool", negatable=True),
            F("min-nodes"),
            F("max-nodes"),
            F("location-policy", choices=("BALANCED", "ANY")),
            F("workload-metadata", choices=("GCE_METADATA", "GKE_METADATA")),
            F("service-account"),
            F("node-labels"),
            F("labels"),
            F("async", "bool"),
        ),
    ),
    GcloudCommand(
        ("container", "node-pools", "list"),
        (),
        (F("cluster"), F("location"), F("region"), F("zone"), F("filter"), F("limit")),
    ),
    GcloudCommand(
        ("container", "node-pools", "delete"),
        (P("NAME"),),
        (F("cluster"), F("location"), F("region"), F("zone"), F("async", "bool")),
    ),
    GcloudCommand(
        ("container", "clusters", "get-credentials"),
        (P("NAME"),),
        (F("location"), F("region"), F("zone"), F("internal-ip", "bool"), F("dns-endpoint", "bool")),
    ),
)
