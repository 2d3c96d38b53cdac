"""Specs → argv for the multi-host pipeline (Cluster Toolkit ``gcluster`` + ``gcloud``).

The one place these commands are written. Operators, ``tpu-rl plan`` and the DAGs call it.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Sequence

from airflow_provider_tpu_rl.render import maxtext
from airflow_provider_tpu_rl.render.blueprint import BLUEPRINT_FILENAME
from airflow_provider_tpu_rl.render.blueprint import PRIMARY_GROUP as PRIMARY_GROUP
from airflow_provider_tpu_rl.render.blueprint import TPU_GROUP as TPU_GROUP
from airflow_provider_tpu_rl.render.command import Command
from airflow_provider_tpu_rl.render.shell import (
    hf_token_from_secret_manager,
    key_values,
    on_first_pod_only,
    quote_all,
)
from airflow_provider_tpu_rl.spec.cluster import NODE_POOL_LABEL, ClusterSpec, GkeJobTarget
from airflow_provider_tpu_rl.spec.existing_cluster import BUCKET_LABEL as BUCKET_LABEL
from airflow_provider_tpu_rl.spec.existing_cluster import bucket_label_value
from airflow_provider_tpu_rl.spec.presets import ModelPreset
from airflow_provider_tpu_rl.spec.workloads import ConversionSpec, ExportSpec, TrainingSpec

# What Cloud Storage answers (HTTP 409) to creating a bucket name that exists. Only "you already own
# it" means the bucket is ours (in the project of the request): the JSON API's 409 for a bucket you
# own, "Your previous request to create the named bucket succeeded and you already own it."
# (cloud.google.com/storage/docs/json_api/v1/status-codes, "409 Conflict"). A name another project
# holds is "The requested bucket name is not available. The bucket namespace is shared by all users
# of the system. Please select a different name and try again." (the XML API's BucketNameUnavailable,
# and googleapi "Error 409: ..., conflict", GoogleCloudPlatform/mlops-with-vertex-ai issue 26) or,
# in older answers, "Sorry, that name is not available. Please try a different one.": any 409
# without "already own it" is a name that is taken.
BUCKET_OURS = ("already own it",)
BUCKET_TAKEN = ("HTTPError 409:", "name is not available")
SECRET_EXISTS = ("ALREADY_EXISTS", "already exists")
PATHWAYS_ENV = (
    ("GRPC_DNS_RESOLVER", "native"),
    ("FLAGS_pathways_enforce_subset_devices_form_subslice", "false"),
)
TRAINING_TTL = "24h"
_MEMORY = re.compile(r"^[1-9][0-9]*[KMG]$")
# A blueprint deployment group name as this project writes them (``primary``, ``tpu``).
GROUP_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")


# Workarounds from the tutorials, kept verbatim: the stock 0.2.4 image needs them. An image built
# from docker/workload.Dockerfile holds the same edits (docker/workload_patches.py applies them at
# build time; tests/docker checks both give the same files) and skips them (workload_image_patched).
TUNIX_RESHARD_PATCH = (
    "import pathlib, tunix.generate.vllm_sampler as vs; p = pathlib.Path(vs.__file__); "
    "p.write_text(p.read_text().replace('reshard_chunk_size: Optional[int] = None', "
    "'reshard_chunk_size: Optional[int] = 4').replace('reshard_chunk_size=self.config.reshard_chunk_size', "
    "'reshard_chunk_size=4'))"
)
ADAFACTOR_PATCH = (
    "import pathlib, re; p = pathlib.Path('/deps/src/maxtext/trainers/post_train/rl/utils_rl.py'); "
    "p.write_text(re.sub('optax[.]adamw[(][^)]+[)]', 'optax.adafactor(learning_rate=learning_rate)', p.read_text()))"
)
VLLM_HOST_IP = "export VLLM_HOST_IP=$(hostname -I | awk '{print $1}')"


# What ``tpu-rl plan`` shows for a task's work folder (a fresh ``mkdtemp`` folder at run time).
PLAN_WORKDIR = "<tmp>/tpu-rl-{cluster}-XXXXXXXX"


def make_workdir(cluster_name: str, run_suffix: str) -> str:
    """A fresh private folder (``mkdtemp``: mode 0700, unpredictable name, created, never an
    existing path or symlink) for the blueprint and the deployment folder. The Terraform state
    lives in GCS, so the folder is removed at the end of the task (:func:`remove_workdir`)."""
    return tempfile.mkdtemp(prefix=f"tpu-rl-{cluster_name}-{run_suffix}-")


def remove_workdir(workdir: str) -> None:
    """Remove a folder from :func:`make_workdir` (``rmtree`` never follows a symlink inside it)."""
    shutil.rmtree(workdir, ignore_errors=True)


def plan_workdir(cluster_name: str) -> str:
    """The placeholder ``tpu-rl plan`` prints for the work folder."""
    return PLAN_WORKDIR.format(cluster=cluster_name)


# --- cloud set-up -------------------------------------------------------------------------------


def create_bucket(project: str, region: str, bucket: str) -> Command:
    """``gcloud storage buckets create``; a bucket of the same project that exists already is
    success (GCS says "you already own it"), a name another project holds is not."""
    return Command(
        (
            "gcloud",
            "storage",
            "buckets",
            "create",
            f"gs://{bucket}",
            f"--project={project}",
            f"--location={region}",
        ),
        ok_if_output_contains=BUCKET_OURS,
        description="create the bucket (one of this project's that exists is kept as is)",
    )


def delete_bucket(bucket: str) -> Command:
    """Deletes the bucket and EVERYTHING in it, trained model included. Only on explicit request,
    and only a bucket that is provably the run's (see ``records/bucket_usage.py``)."""
    return Command(
        ("gcloud", "storage", "rm", "--recursive", f"gs://{bucket}"),
        description=(
            "delete_bucket=true: delete the bucket with all checkpoints, when it is provably this "
            "run's (created by it, nothing in it names another run); otherwise only this run's own "
            "folders, and nothing while another run still uses the bucket"
        ),
    )


def delete_objects(bucket: str, names: Sequence[str]) -> Command:
    """Deletes the given objects and folders (``…/``) of the bucket, with everything under them."""
    if not names:
        raise ValueError("delete_objects needs at least one object or folder")
    return Command(
        ("gcloud", "storage", "rm", "--recursive", *(f"gs://{bucket}/{name}" for name in names)),
        description="delete_bucket=true: delete this run's own folders and records in the shared bucket",
    )


def state_prefix(blueprint_name: str, cluster_name: str) -> str:
    """The folder of a deployment's Terraform state in its bucket: the GCS backend's default prefix
    ``<blueprint_name>/<deployment_name>/<group>`` (cluster-toolkit ``pkg/config`` expandBackend)."""
    return f"{blueprint_name}/{cluster_name}/"


def _deploy_vars(cluster: ClusterSpec) -> list[str]:
    pairs = [
        ("project_id", cluster.project),
        ("deployment_name", cluster.cluster_name),
        ("region", cluster.region),
        ("zone", cluster.zone),
        ("num_slices", str(cluster.num_slices)),
        ("tpu_topology", cluster.topology),
        ("authorized_cidr", cluster.authorized_cidr),
    ]
    if cluster.reservation:  # none: the blueprint's TPU pool consumes no reservation (customize_blueprint)
        pairs.append(("reservation", cluster.reservation))
    argv: list[str] = []
    for pair in key_values(pairs):
        argv += ["--vars", pair]
    return argv


def blueprint_path(workdir: str) -> str:
    return os.path.join(workdir, BLUEPRINT_FILENAME)


def deployment_dir(cluster: ClusterSpec, workdir: str) -> str:
    return os.path.join(workdir, cluster.cluster_name)


def _group_flags(only: Sequence[str], skip: Sequence[str]) -> list[str]:
    """``--only=a,b`` / ``--skip=a,b`` (cluster-toolkit ``cmd/utils.go`` addGroupSelectionFlags,
    StringSlice flags; both at once: "cannot specify both --only and --skip")."""
    for name in (*only, *skip):
        if not GROUP_NAME.fullmatch(name):
            raise ValueError(f"not a deployment group name: {name!r}")
    if only and skip:
        raise ValueError("cannot specify both --only and --skip")
    if only:
        return [f"--only={','.join(only)}"]
    return [f"--skip={','.join(skip)}"] if skip else []


def _groups_text(only: Sequence[str], skip: Sequence[str]) -> str:
    if only:
        return f" (groups {', '.join(only)} only)"
    return f" (all groups but {', '.join(skip)})" if skip else ""


def deploy(cluster: ClusterSpec, workdir: str, *, skip_groups: Sequence[str] = ()) -> Command:
    """``gcluster deploy`` with the tutorial's vars and flags, Terraform state in the bucket.

    ``skip_groups=("tpu",)``: the network, the cluster, ``cpu-np`` and Kueue, not the TPU pool.
    """
    return Command(
        (
            "gcluster",
            "deploy",
            blueprint_path(workdir),
            *_deploy_vars(cluster),
            "--backend-config",
            f"bucket={cluster.bucket}",
            "-l",
            "IGNORE",
            "--auto-approve",
            "-w",
            f"--out={workdir}",
            *_group_flags((), skip_groups),
        ),
        description=f"deploy GKE cluster {cluster.cluster_name} ({cluster.shape.tpu_type} x{cluster.num_slices})"
        + _groups_text((), skip_groups),
    )


def deploy_groups(cluster: ClusterSpec, workdir: str, only_groups: Sequence[str]) -> Command:
    """``gcluster deploy DEPLOYMENT_DIRECTORY --only=...``: the named groups of a deployment folder
    made by :func:`recreate_deployment_folder` (create flags are refused with a folder)."""
    if not only_groups:
        raise ValueError("deploy_groups needs at least one group")
    return Command(
        (
            "gcluster",
            "deploy",
            deployment_dir(cluster, workdir),
            "--auto-approve",
            *_group_flags(only_groups, ()),
        ),
        description=f"deploy GKE cluster {cluster.cluster_name}'s {', '.join(only_groups)} group "
        f"({cluster.shape.tpu_type} x{cluster.num_slices})",
    )


def export_outputs(cluster: ClusterSpec, workdir: str, group: str) -> Command:
    """``gcluster export-outputs DEPLOYMENT/GROUP``: write the group's outputs (from its state in
    GCS) to ``.ghpc/artifacts/<group>_outputs.tfvars``, where a later group reads them
    (``pkg/shell/terraform.go`` gatherUpstreamOutputs); a group without state writes nothing."""
    if not GROUP_NAME.fullmatch(group):
        raise ValueError(f"not a deployment group name: {group!r}")
    return Command(
        ("gcluster", "export-outputs", os.path.join(deployment_dir(cluster, workdir), group)),
        description=f"read the {group} group's outputs from its state (the later groups' inputs)",
    )


def recreate_deployment_folder(cluster: ClusterSpec, workdir: str) -> Command:
    """``gcluster create`` writes the deployment folder again; its GCS backend finds the state."""
    return Command(
        (
            "gcluster",
            "create",
            blueprint_path(workdir),
            *_deploy_vars(cluster),
            "--backend-config",
            f"bucket={cluster.bucket}",
            "-l",
            "IGNORE",
            "-w",
            f"--out={workdir}",
        ),
        description="recreate the deployment folder on this worker (state is in GCS)",
    )


def destroy(cluster: ClusterSpec, workdir: str, *, only_groups: Sequence[str] = ()) -> Command:
    """``gcluster destroy``; ``only_groups``: those groups alone (the TPU pool), in reverse order."""
    return Command(
        # --robust: gcluster retries the destroy and cleans up firewall rules that block the network.
        (
            "gcluster",
            "destroy",
            deployment_dir(cluster, workdir),
            "--auto-approve",
            "--robust",
            *_group_flags(only_groups, ()),
        ),
        description=(
            f"destroy GKE cluster {cluster.cluster_name}'s {', '.join(only_groups)} group (the cluster is kept)"
            if only_groups
            else f"destroy GKE cluster {cluster.cluster_name} (the bucket is kept)"
        ),
    )


def docker_auth(region: str) -> list[Command]:
    """The tutorial's registry auth, its two registries in one call (``configure-docker`` takes a
    comma-separated list). ``gcluster job submit`` checks it in ``$HOME/.docker`` before it
    submits anything, so it runs in the same HOME as the submit."""
    return [Command(("gcloud", "auth", "configure-docker", f"gcr.io,{region}-docker.pkg.dev", "--quiet"))]


SECRET_ACCESSOR = "roles/secretmanager.secretAccessor"
# The secret's own metadata holds a salted HMAC of the token it stores (never the token): a
# Secret Manager annotation (surface/secrets/update.py: --update-annotations, a map flag whose
# pairs are split on ","; the value is "<salt hex>.<hmac-sha256 hex>").
TOKEN_DIGEST_ANNOTATION = "tpu-rl-hf-token-hmac"
PLAN_TOKEN_DIGEST = "SALT.HMAC_SHA256"
PLAN_OLDER_VERSION = "OLDER_VERSION"
# The binding is already gone (iam_util._RemoveBindingFromIamPolicyWithCondition), or the whole
# secret (surface/secrets/remove_iam_policy_binding.py reports the API's 404 as "Status code: 404").
BINDING_GONE = ("Policy binding with the specified principal", "Status code: 404.")


def create_secret(project: str, secret_id: str) -> Command:
    """``gcloud secrets create``; an existing secret is kept."""
    return Command(
        ("gcloud", "secrets", "create", secret_id, f"--project={project}", "--replication-policy=automatic"),
        ok_if_output_contains=SECRET_EXISTS,
        description="create the HF token secret (kept if it exists)",
    )


def describe_secret(project: str, secret_id: str) -> Command:
    """The secret's metadata as JSON (its annotations hold the stored token's digest)."""
    return Command(
        ("gcloud", "secrets", "describe", secret_id, f"--project={project}", "--format=json"),
        description="read the digest of the stored token (a new version only when the token changed)",
    )


def add_secret_version(project: str, secret_id: str) -> Command:
    """A new version from stdin: the value never appears in argv."""
    return Command(
        ("gcloud", "secrets", "versions", "add", secret_id, f"--project={project}", "--data-file=-"),
        stdin_secret="hf_token",
        description="store the HF token from the Airflow connection (value on stdin)",
    )


def annotate_secret_digest(project: str, secret_id: str, digest: str) -> Command:
    """Record the stored token's salted HMAC in the secret's annotations."""
    return Command(
        (
            "gcloud",
            "secrets",
            "update",
            secret_id,
            f"--project={project}",
            f"--update-annotations={TOKEN_DIGEST_ANNOTATION}={digest}",
        ),
        description="record the salted HMAC of the stored token (never the token)",
    )


def list_secret_versions(project: str, secret_id: str) -> Command:
    """Every version of the secret as JSON (name and state)."""
    return Command(
        ("gcloud", "secrets", "versions", "list", secret_id, f"--project={project}", "--format=json"),
        description="list the secret's versions (the older enabled ones are disabled)",
    )


def disable_secret_version(project: str, secret_id: str, version: str) -> Command:
    """``gcloud secrets versions disable VERSION --secret=SECRET``."""
    return Command(
        (
            "gcloud",
            "secrets",
            "versions",
            "disable",
            version,
            f"--secret={secret_id}",
            f"--project={project}",
        ),
        description="disable an older version of the HF token",
    )


def _accessor_binding(verb: str, project: str, secret_id: str, account: str) -> tuple[str, ...]:
    return iam_binding_argv(verb, "secret", project, secret_id, f"serviceAccount:{account}", SECRET_ACCESSOR)


STORAGE_OBJECT_ADMIN = "roles/storage.objectAdmin"
# A bucket binding already gone (iam_util.RemoveBindingFromIamPolicyWithCondition), or the bucket
# (surface/storage/buckets/remove_iam_policy_binding.py reads the policy first: a 404).
BUCKET_BINDING_GONE = ("Policy binding with the specified principal", "HTTPError 404")


def iam_binding_argv(
    verb: str, kind: str, project: str, name: str, member: str, role: str
) -> tuple[str, ...]:
    """``gcloud secrets|storage buckets <verb>-iam-policy-binding`` of one unconditional binding.

    ``--condition=None``: without it gcloud refuses in non-interactive mode when the policy holds a
    conditional binding (googlecloudsdk/command_lib/iam/iam_util.py).
    """
    tail = (f"--member={member}", f"--role={role}", "--condition=None")
    if kind == "secret":
        return ("gcloud", "secrets", f"{verb}-iam-policy-binding", name, f"--project={project}", *tail)
    return ("gcloud", "storage", "buckets", f"{verb}-iam-policy-binding", f"gs://{name}", *tail)


def iam_policy_command(kind: str, project: str, name: str) -> Command:
    """A secret's or a bucket's IAM policy as JSON (which bindings exist before a run adds one)."""
    if kind == "secret":
        return secret_iam_policy(project, name)
    return Command(
        ("gcloud", "storage", "buckets", "get-iam-policy", f"gs://{name}", "--format=json"),
        description=f"read who may use gs://{name} (the grants a run adds are its own)",
    )


def remove_iam_binding(kind: str, project: str, name: str, member: str, role: str) -> Command:
    """Remove a binding a run added; one (or a secret, a bucket) already gone is success."""
    return Command(
        iam_binding_argv("remove", kind, project, name, member, role),
        ok_if_output_contains=BINDING_GONE if kind == "secret" else BUCKET_BINDING_GONE,
        description=f"remove {role} for {member}: the run that added it no longer needs it",
    )


def secret_iam_policy(project: str, secret_id: str) -> Command:
    """The secret's IAM policy as JSON: which bindings exist before this run adds its own."""
    return Command(
        ("gcloud", "secrets", "get-iam-policy", secret_id, f"--project={project}", "--format=json"),
        description="read who may read the HF token secret (the grants this run adds are its own)",
    )


def grant_secret_accessor(project: str, secret_id: str, account: str) -> Command:
    return Command(_accessor_binding("add", project, secret_id, account))


def revoke_secret_accessor(project: str, secret_id: str, account: str) -> Command:
    """Remove a ``secretAccessor`` binding; a binding (or secret) already gone is success."""
    return Command(
        _accessor_binding("remove", project, secret_id, account),
        ok_if_output_contains=BINDING_GONE,
        description="remove the destroyed cluster's read access to the HF token",
    )


def hf_token_secret(project: str, secret_id: str, readers: tuple[str, ...], *, sync: bool) -> list[Command]:
    """Every command the token sync may run, for ``tpu-rl plan`` (the operator decides at run
    time: no new version when the stored digest matches; only older enabled versions disabled)."""
    commands: list[Command] = []
    if sync:
        commands += [
            create_secret(project, secret_id),
            describe_secret(project, secret_id),
            add_secret_version(project, secret_id),
            annotate_secret_digest(project, secret_id, PLAN_TOKEN_DIGEST),
            list_secret_versions(project, secret_id),
            disable_secret_version(project, secret_id, PLAN_OLDER_VERSION),
        ]
    if readers:
        commands.append(secret_iam_policy(project, secret_id))
    commands += [grant_secret_accessor(project, secret_id, account) for account in readers]
    return commands


# --- workloads --------------------------------------------------------------------------------


JOB_NOT_FOUND = "not found in any namespace"


def job_scope(project: str | None, cluster_name: str | None, location: str | None) -> tuple[str, ...]:
    """``--project/--cluster/--location`` on every job command instead of ``gcluster job config set``."""
    pairs = (("--project", project), ("--cluster", cluster_name), ("--location", location))
    return tuple(f"{flag}={value}" for flag, value in pairs if value)


def to_maxtext_script(conversion: ConversionSpec, token_resource: str, *, machine: str = maxtext.CPU) -> str:
    """``to_maxtext`` on pod 0 of a job on ``machine`` (the CPU pool's: ``cpu``)."""
    argv = maxtext.to_maxtext_argv(conversion, machine=machine)
    return on_first_pod_only(f"{hf_token_from_secret_manager(token_resource)} && " + quote_all(argv))


def train_rl_pairs(training: TrainingSpec) -> list[tuple[str, str]]:
    fixed = [
        ("run_name", training.run_name),
        ("base_output_directory", training.base_output_directory),
        ("model_name", training.model_name),
        ("load_parameters_path", training.load_parameters_path),
        ("num_batches", str(training.num_batches)),
    ]
    return fixed + [(k, v) for k, v in training.overrides if k != "num_batches"]


def startup_patches(preset: ModelPreset, training: TrainingSpec) -> list[tuple[str, str]]:
    """``(name, python code)`` of each file rewrite the train command runs before training.

    The preset's workarounds for the stock image; none when ``training.workload_image_patched``
    (the image built from ``docker/workload.Dockerfile`` holds them already).
    """
    if training.workload_image_patched:
        return []
    patches: list[tuple[str, str]] = []
    if preset.patch_tunix_reshard_chunk_size:
        patches.append(("tunix_reshard_chunk_size", TUNIX_RESHARD_PATCH))
    if preset.patch_adafactor:
        patches.append(("adafactor", ADAFACTOR_PATCH))
    return patches


def train_rl_script(preset: ModelPreset, training: TrainingSpec, token_resource: str) -> str:
    steps: list[str] = []
    if preset.cgroup_memory_limit:
        if not _MEMORY.fullmatch(preset.cgroup_memory_limit):
            raise ValueError(f"cgroup_memory_limit must look like 190G, got {preset.cgroup_memory_limit!r}")
        limit = preset.cgroup_memory_limit
        steps.append(
            f"(echo {limit} > /sys/fs/cgroup/memory.max || echo {limit} > "
            "/sys/fs/cgroup/memory/memory.limit_in_bytes) 2>/dev/null || true"
        )
    steps += [VLLM_HOST_IP, "export VLLM_ENABLE_V1_MULTIPROCESSING=0"]
    steps += [quote_all(["python3", "-c", code]) for _, code in startup_patches(preset, training)]
    steps.append(hf_token_from_secret_manager(token_resource))
    steps.append(
        "JAX_PLATFORMS=proxy,cpu ENABLE_PATHWAYS_PERSISTENCE=1 "
        + quote_all(maxtext.program_argv(maxtext.TRAIN_RL, train_rl_pairs(training), machine=maxtext.TPU))
    )
    return " && ".join(steps)


def to_huggingface_script(export: ExportSpec, token_resource: str, *, machine: str = maxtext.CPU) -> str:
    """``to_huggingface`` on pod 0 of a job on ``machine`` (the CPU pool's: ``cpu``)."""
    argv = maxtext.to_huggingface_argv(export, machine=machine, override_architecture=True)
    return on_first_pod_only(f"{hf_token_from_secret_manager(token_resource)} && " + quote_all(argv))


def _target_flags(target: GkeJobTarget, num_slices: int) -> tuple[str, ...]:
    flags = [f"--num-slices={num_slices}", f"--image={target.image}", f"--compute-type={target.compute_type}"]
    if target.topology:
        flags.append(f"--topology={target.topology}")
    if target.node_pool:
        flags.append(f"--node-constraint={NODE_POOL_LABEL}={target.node_pool}")
    # --node-constraint is a StringToString flag (nodeSelector): repeated flags merge
    # (cluster-toolkit v1.95.0 cmd/job/submit.go; pflag stringToString Set)
    flags += [f"--node-constraint={key}={value}" for key, value in target.node_constraints]
    if target.queue:
        flags.append(f"--queue={target.queue}")  # the Kueue LocalQueue (the same file)
    if target.service_account:
        flags.append(f"--service-account={target.service_account}")
    return tuple(flags)


def _machine(target: GkeJobTarget) -> str:
    """What the target's pods have: TPU chips (a TPU slice) or none (a CPU machine type)."""
    return maxtext.TPU if target.tpu else maxtext.CPU


def _cpu_job(target: GkeJobTarget, name: str, command: str, description: str) -> Command:
    return Command(
        (
            "gcluster",
            "job",
            "submit",
            f"--name={name}",
            *_target_flags(target, 1),
            f"--command={command}",
            *job_scope(target.project, target.cluster_name, target.location),
        ),
        description=description,
    )


def conversion_job(
    target: GkeJobTarget, name: str, conversion: ConversionSpec, token_resource: str
) -> Command:
    """HF→MaxText on pod 0 of a CPU-only job (the tutorials' ``to_maxtext`` job)."""
    return _cpu_job(
        target,
        name,
        to_maxtext_script(conversion, token_resource, machine=_machine(target)),
        f"convert {conversion.hf_model_path or conversion.model_name} to MaxText",
    )


def export_job(target: GkeJobTarget, name: str, export: ExportSpec, token_resource: str) -> Command:
    """MaxText→HF on pod 0 (the tutorials' ``to_huggingface`` job)."""
    return _cpu_job(
        target,
        name,
        to_huggingface_script(export, token_resource, machine=_machine(target)),
        "export the trained actor to Hugging Face format",
    )


def _env_flags(flag: str, pairs: tuple[tuple[str, str], ...]) -> list[str]:
    return [f"{flag}={pair}" for pair in key_values(pairs)]


def training_job(
    target: GkeJobTarget,
    name: str,
    preset: ModelPreset,
    training: TrainingSpec,
    token_resource: str,
    pathways_gcs_location: str,
) -> Command:
    """GRPO training on Pathways (the tutorials' ``train_rl`` job)."""
    return Command(
        (
            "gcluster",
            "job",
            "submit",
            f"--name={name}",
            *_target_flags(target, target.num_slices),
            "--pathways",
            f"--pathways-gcs-location={pathways_gcs_location}",
            # without it gcluster looks for cpu-np or pathways-np (cluster-toolkit v1.95.0
            # gke_job_orchestrator.go autoDetectCPUNodePool): an existing cluster's CPU pool is the run's
            *((f"--pathways-head-np={target.head_node_pool}",) if target.head_node_pool else ()),
            f"--gke-ttl-after-finished={TRAINING_TTL}",
            "--restarts=0",
            *_env_flags("--env", PATHWAYS_ENV),
            *_env_flags("--pathways-proxy-env", PATHWAYS_ENV),
            *_env_flags("--pathways-server-env", PATHWAYS_ENV),
            *_env_flags("--pathways-worker-env", PATHWAYS_ENV),
            f"--command={train_rl_script(preset, training, token_resource)}",
            *job_scope(target.project, target.cluster_name, target.location),
        ),
        description=f"GRPO training on Pathways ({training.num_batches} batches)"
        + ("; the image is patched, no start-up patches" if training.workload_image_patched else ""),
    )


def job_list(
    project: str | None, cluster_name: str | None, location: str | None, *, name_contains: str | None = None
) -> Command:
    filters = (f"--name-contains={name_contains}",) if name_contains else ()
    return Command(
        ("gcluster", "job", "list", *filters, *job_scope(project, cluster_name, location)),
        description="gcluster job list",
    )


def job_cancel(project: str | None, cluster_name: str | None, location: str | None, name: str) -> Command:
    """Deletes the job's JobSet; a job that is already gone counts as done."""
    return Command(
        ("gcluster", "job", "cancel", name, *job_scope(project, cluster_name, location)),
        ok_if_output_contains=(JOB_NOT_FOUND,),
        description="gcluster job cancel",
    )


MANAGED_LABEL = "tpu-rl-managed"
EXPIRES_LABEL = "tpu-rl-expires"
RECORD_PREFIX = "tpu-rl/resources/"


def managed_labels(dag_id: str, suffix: str, bucket: str, expires_at: int) -> dict[str, str]:
    """Labels the janitor reads: who made the resource, where its record is, when it expires.

    The bucket label is left out when the bucket name cannot be a label value (dotted names);
    the janitor then goes by the expiry alone.
    """
    labels = {
        MANAGED_LABEL: "true",
        "tpu-rl-dag": re.sub(r"[^a-z0-9_-]", "-", dag_id.lower())[:63],
        "tpu-rl-run": suffix,
        EXPIRES_LABEL: str(int(expires_at)),
    }
    if bucket_label_value(bucket):
        labels[BUCKET_LABEL] = bucket
    return labels


def resource_record_object(name: str) -> str:
    """Object (in the run's bucket) holding what the janitor needs to destroy ``name``."""
    return f"{RECORD_PREFIX}{name}.json"


def list_managed_clusters(project: str) -> Command:
    return Command(
        (
            "gcloud",
            "container",
            "clusters",
            "list",
            f"--project={project}",
            f"--filter=resourceLabels.{MANAGED_LABEL}=true",
            "--format=json",
        ),
        description="list clusters created by tpu-rl",
    )


# The placeholder pod that proves a flex-start TPU node pool gets its nodes (operators/gke.py
# ``flex_start_refusal``): GKE's own pattern of a pod that asks for capacity to make the cluster
# autoscaler add nodes for it (kubernetes-engine/docs/how-to/capacity-provisioning: "placeholder
# Pods" whose requests GKE creates nodes for). It asks for one VM's TPU chips on a node of the
# slice's accelerator and topology (GKE's TPU node labels; its TPU nodes' ``google.com/tpu`` taint
# tolerated), as the training's pods do; a multi-host TPU slice pool's VMs come whole or not at all
# (kubernetes-engine/docs/concepts/tpus, "atomicity": "If GKE can't deploy one node in the slice, no
# nodes in the TPU slice node are deployed"; direct), so one placed pod proves the slice. With
# several slices (several pools), it proves one. kubernetes' pause image: it never needs to run.
CAPACITY_PROBE_NAMESPACE = "default"
CAPACITY_PROBE_IMAGE = "registry.k8s.io/pause:3.10"
CAPACITY_PROBE_LABEL = "tpu-rl.io/capacity-probe"
TPU_ACCELERATOR_NODE_LABEL = "cloud.google.com/gke-tpu-accelerator"
TPU_TOPOLOGY_NODE_LABEL = "cloud.google.com/gke-tpu-topology"
TPU_RESOURCE = "google.com/tpu"


def capacity_probe_name(cluster_name: str) -> str:
    """The placeholder pod's name: one per cluster (a run's cluster has one TPU pool at a time)."""
    return f"{cluster_name}-capacity-probe"[:63].rstrip("-")


def capacity_probe_pod(cluster: ClusterSpec, accelerator: str) -> dict[str, object]:
    """The placeholder pod's manifest for ``cluster``'s slice (``accelerator``: GKE's node label value)."""
    chips = {TPU_RESOURCE: str(cluster.shape.chips_per_vm)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": capacity_probe_name(cluster.cluster_name),
            "namespace": CAPACITY_PROBE_NAMESPACE,
            "labels": {CAPACITY_PROBE_LABEL: cluster.cluster_name},
        },
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {
                TPU_ACCELERATOR_NODE_LABEL: accelerator,
                TPU_TOPOLOGY_NODE_LABEL: cluster.topology,
            },
            "tolerations": [{"key": TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [
                {
                    "name": "placeholder",
                    "image": CAPACITY_PROBE_IMAGE,
                    "resources": {"requests": dict(chips), "limits": dict(chips)},
                }
            ],
        },
    }
