"""What ``gcluster`` accepts: the command tree of v1.103 that the fake implements, its flags as
cobra declares them (cmd/*.go)."""

from __future__ import annotations

from tpu_rl_sandbox.clis.gcluster.cobra import CobraCommand, Flag


def _create_flags() -> list[Flag]:
    return [
        Flag(
            "out",
            "string",
            "o",
            usage="Sets the output directory where the HPC deployment directory will be created.",
        ),
        Flag(
            "overwrite-deployment",
            "bool",
            "w",
            usage="If specified, an existing deployment directory is overwritten by the new deployment.",
        ),
        Flag("force", "bool", usage="Forces overwrite of existing deployment directory."),
        Flag(
            "deployment-file",
            "string",
            "d",
            usage="Deployment file to override blueprint variables and backend configuration",
        ),
        Flag(
            "vars",
            "stringSlice",
            usage="Comma-separated list of name=value variables to override YAML configuration. Can be used multiple times.",
        ),
        Flag(
            "backend-config",
            "stringSlice",
            usage="Comma-separated list of name=value variables to set Terraform backend configuration. Can be used multiple times.",
        ),
        Flag(
            "validation-level",
            "string",
            "l",
            default="ERROR",
            usage='Set validation level to one of ("ERROR", "WARNING", "IGNORE")',
        ),
        Flag("skip-validators", "stringSlice", usage="Validators to skip"),
        Flag("add-creator-label", "bool", usage="Add label ghpc_creator to the expanded blueprint."),
    ]


CREATE_FLAG_NAMES = {f.name for f in _create_flags()}


def build_tree() -> CobraCommand:
    """The command tree of gcluster v1.103 that the fake implements."""
    root = CobraCommand(
        "gcluster",
        short="A blueprint and deployment engine for HPC clusters in GCP.",
        persistent_flags=[
            Flag("download-dependencies", "bool", usage="Automatically download missing dependencies."),
            Flag("no-color", "bool", usage="Disable colorized output."),
        ],
        flags=[Flag("version", "bool", "v", usage="version for gcluster")],
    )
    create = CobraCommand(
        "create",
        "Create a new deployment.",
        flags=_create_flags(),
        exact_args=1,
        usage_line="gcluster create <BLUEPRINT_FILE> [flags]",
    )
    deploy = CobraCommand(
        "deploy",
        "deploy all resources in a Toolkit deployment directory.",
        flags=[
            *_create_flags(),
            Flag("artifacts", "string", "a", usage="Artifacts directory (automatically configured if unset)"),
            Flag("auto-approve", "bool", usage="Automatically approve proposed changes"),
            Flag("skip", "stringSlice", usage="Skip groups with the given names"),
            Flag("only", "stringSlice", usage="Only apply to groups with the given names"),
            Flag("json-output", "bool", usage="Write Terraform output to JSON file"),
        ],
        exact_args=1,
        silence_usage=True,
        usage_line="gcluster deploy (<DEPLOYMENT_DIRECTORY> | <BLUEPRINT_FILE>) [flags]",
    )
    destroy = CobraCommand(
        "destroy",
        "destroy all resources in a Toolkit deployment directory.",
        flags=[
            Flag("artifacts", "string", "a", usage="Artifacts directory (automatically configured if unset)"),
            Flag("auto-approve", "bool", usage="Automatically approve proposed changes"),
            Flag("skip", "stringSlice", usage="Skip groups with the given names"),
            Flag("only", "stringSlice", usage="Only apply to groups with the given names"),
            Flag("robust", "bool", usage="Perform a robust destroy, including firewall rule cleanup."),
        ],
        exact_args=1,
        silence_usage=True,
        usage_line="gcluster destroy DEPLOYMENT_DIRECTORY [flags]",
    )
    # cmd/export.go exportCmd (addArtifactsDirFlag): Args cobra.MatchAll(cobra.ExactArgs(1), checkDir)
    export = CobraCommand(
        "export-outputs",
        "Export outputs from deployment group.",
        flags=[
            Flag("artifacts", "string", "a", usage="Artifacts directory (automatically configured if unset)")
        ],
        exact_args=1,
        silence_usage=True,
        usage_line="gcluster export-outputs DEPLOYMENT_GROUP_DIRECTORY [flags]",
    )
    job = CobraCommand(
        "job",
        "[EXPERIMENTAL/ALPHA] Manage jobs on the cluster.",
        runnable=False,
        persistent_flags=[
            Flag("cluster", "string", "c", usage="Name of the GKE cluster."),
            Flag("location", "string", "l", usage="Location (region or zone) of the GKE cluster."),
            Flag("project", "string", "p", usage="Google Cloud Project ID."),
        ],
    )
    submit = CobraCommand(
        "submit",
        "Submits a workload on a GKE cluster using JobSet.",
        silence_usage=True,
        flags=[
            Flag("image", "string", "i"),
            Flag("base-image", "string", "B"),
            Flag("build-context", "string", "b"),
            Flag("command", "string", "e"),
            Flag("compute-type", "string"),
            Flag("dry-run-out", "string", "o"),
            Flag("platform", "string", "f", default="linux/amd64"),
            Flag("mount", "stringSlice"),
            Flag("name", "string", "n"),
            Flag("queue", "string", "q"),
            Flag("num-nodes", "int", default=1),
            Flag("num-slices", "int", default=1),
            Flag("restarts", "int", default=1),
            Flag("gke-ttl-after-finished", "string", default="1h"),
            Flag("grace-period", "string", default="30s"),
            Flag("gke-disable-parallel-containers", "bool"),
            Flag("placement-policy", "string"),
            Flag("node-constraint", "stringToString"),
            Flag("cpu-affinity", "string"),
            Flag("restart-on-exit-codes", "intSlice"),
            Flag("image-pull-secret", "string"),
            Flag("service-account", "string"),
            Flag("topology", "string"),
            Flag("gke-scheduler", "string"),
            Flag("await-job-completion", "bool"),
            Flag("timeout", "string", default="-1s"),
            Flag("priority", "string"),
            Flag("verbose", "bool"),
            Flag("gke-nap-provisioning", "string"),
            Flag("gke-nap-reservation", "string"),
            Flag("env", "stringArray"),
            Flag("pathways", "bool"),
            Flag("pathways-proxy-server-image", "string"),
            Flag("pathways-server-image", "string"),
            Flag("pathways-worker-image", "string"),
            Flag("pathways-headless", "bool"),
            Flag("pathways-gcs-location", "string"),
            Flag("pathways-elastic-slices", "int"),
            Flag("pathways-max-slice-restarts", "int", default=1),
            Flag("pathways-proxy-args", "string"),
            Flag("pathways-server-args", "string"),
            Flag("pathways-worker-args", "string"),
            Flag("pathways-colocated-python-sidecar-image", "string"),
            Flag("pathways-head-np", "string"),
            Flag("pathways-proxy-env", "stringArray"),
            Flag("pathways-server-env", "stringArray"),
            Flag("pathways-worker-env", "stringArray"),
        ],
    )
    list_cmd = CobraCommand(
        "list",
        "List workloads (jobs) in the cluster.",
        silence_usage=True,
        flags=[Flag("status", "string"), Flag("name-contains", "string")],
    )
    logs = CobraCommand(
        "logs",
        "Fetch logs for a job in the cluster.",
        silence_usage=True,
        exact_args=1,
        flags=[Flag("follow", "bool", "f", usage="Stream logs continuously"), Flag("main-only", "bool")],
        usage_line="gcluster job logs [job-name] [flags]",
    )
    cancel = CobraCommand(
        "cancel",
        "Cancel a job in the cluster.",
        silence_usage=True,
        exact_args=1,
        usage_line="gcluster job cancel [job-name] [flags]",
    )
    config = CobraCommand("config", "Manage gcluster job configuration.", runnable=False)
    config.add(
        CobraCommand(
            "set",
            "Set a configuration property.",
            exact_args=2,
            usage_line="gcluster job config set [key] [value] [flags]",
        ),
        CobraCommand("list", "List all configuration properties.", exact_args=0),
    )
    job.add(submit, cancel, list_cmd, logs, config)
    root.add(create, deploy, destroy, export, job)
    return root
