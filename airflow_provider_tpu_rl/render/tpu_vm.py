"""Specs → argv for the single-host pipeline (seed 002: one v6e-8 TPU VM over SSH, McJAX)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Final

from airflow_provider_tpu_rl.maxtext.layout import run_dir
from airflow_provider_tpu_rl.render import gke, maxtext
from airflow_provider_tpu_rl.render.command import Command
from airflow_provider_tpu_rl.render.shell import hf_token_from_gcloud, quote_all, with_hf_token
from airflow_provider_tpu_rl.spec.cluster import (
    FLEX_START,
    ON_DEMAND,
    RESERVATION,
    SPOT,
    CpuVmSpec,
    TpuVmSpec,
)
from airflow_provider_tpu_rl.spec.pipeline import TpuVmPipelineSpec
from airflow_provider_tpu_rl.spec.presets import MAXTEXT_PIP_SPEC

VM_EXISTS = ("already exists",)
VM_GONE = ("was not found", "not found")
VENV = "maxtext_venv"

STAGES = ("install", "convert", "train", "export")
# The MaxText program of each stage, and so where it runs: the converters' JAX runs on the CPU
# (maxtext.PROGRAM_DEVICE), so they run on the CPU VM; training needs the TPU. With runtime
# ``container`` both VMs run the workload image (the TPU VM from a baked boot image, or pulled),
# with ``install`` both install MAXTEXT_PIP_SPEC: one MaxText release per run either way.
STAGE_PROGRAM = {"convert": maxtext.TO_MAXTEXT, "train": maxtext.TRAIN_RL, "export": maxtext.TO_HUGGINGFACE}
MACHINES = (maxtext.CPU, maxtext.TPU)
STAGE_MACHINE = {stage: maxtext.PROGRAM_DEVICE[program] for stage, program in STAGE_PROGRAM.items()}


def _labels_flag(labels: Mapping[str, str]) -> list[str]:
    return [f"--labels={','.join(f'{k}={v}' for k, v in labels.items())}"] if labels else []


def create_instance(
    vm: TpuVmSpec | CpuVmSpec,
    service_account: str | None,
    capacity: list[str],
    description: str,
    *,
    track: tuple[str, ...] = (),
    boot_family: str | None = None,
) -> Command:
    """``gcloud [track] compute instances create`` of ``vm`` with its image, disk (the type its
    machine series takes, never Compute Engine's pd-standard default: spec/cluster.py
    ``BOOT_DISK_TYPES``), scope and labels;
    ``capacity`` is how it is provisioned. ``boot_family``: an image family of the VM's own project
    it boots from instead of its image family (the baked boot image: render/boot_image.py)."""
    sa = [f"--service-account={service_account}"] if service_account else []
    image_project, image_family = (
        (vm.project, boot_family) if boot_family else (vm.image_project, vm.image_family)
    )
    return Command(
        (
            "gcloud",
            *track,
            "compute",
            "instances",
            "create",
            vm.vm_name,
            f"--zone={vm.zone}",
            f"--project={vm.project}",
            f"--machine-type={vm.machine_type}",
            f"--image-project={image_project}",
            f"--image-family={image_family}",
            f"--boot-disk-size={vm.boot_disk_size}",
            f"--boot-disk-type={vm.boot_disk_type}",
            *capacity,
            *sa,
            "--scopes=cloud-platform",
            *_labels_flag(vm.labels),
        ),
        ok_if_output_contains=VM_EXISTS,
        description=description,
    )


# gcloud 528 offers --provisioning-model=FLEX_START on its alpha track only
# (surface/compute/instances/create.py: support_flex_start=False for GA and beta, True for alpha).
FLEX_START_TRACK = ("alpha",)


def gcloud_components_needed(capacity: str) -> tuple[str, ...]:
    """The gcloud components the TPU VM's create needs beyond gcloud's core: its release track's
    (``alpha`` for flex-start: ``gcloud alpha …`` needs the alpha component installed; without it
    gcloud offers to install it, which a worker that cannot write the SDK cannot do)."""
    return FLEX_START_TRACK if capacity == FLEX_START else ()


def capacity_flags(vm: TpuVmSpec) -> tuple[tuple[str, ...], list[str]]:
    """The release track and the scheduling flags of the TPU VM's ``capacity``.

    TPU VMs cannot live-migrate, so every one has ``--maintenance-policy=TERMINATE``.
    ``on-demand``: the ``STANDARD`` provisioning model (gcloud's default, "full control over your
    VM instances' runtime": ``command_lib/compute/instances/flags.py`` AddProvisioningModelVmArgs),
    consuming no reservation (``--reservation-affinity=none``; gcloud's default ``any`` would take
    a matching reservation of the project's). No termination action: it applies to Spot VMs and VMs
    with a run duration (ValidateInstanceScheduling requires one of those flags with it).
    ``reservation``: the seed's flags, bound to the reservation, deleted on termination.
    ``spot``: preemptible; stopped (not deleted) when preempted, so its boot disk with MaxText
    installed is kept and the VM can be started again. ``flex-start``: DWS capacity, queued until
    it is free, ended (deleted) after ``max_run_hours``, consuming no reservation.
    """
    if vm.capacity == ON_DEMAND:
        return (), [
            "--maintenance-policy=TERMINATE",
            "--provisioning-model=STANDARD",
            "--reservation-affinity=none",
        ]
    if vm.capacity == SPOT:
        return (), [
            "--maintenance-policy=TERMINATE",
            "--provisioning-model=SPOT",
            "--instance-termination-action=STOP",
        ]
    if vm.capacity == FLEX_START:
        return FLEX_START_TRACK, [
            "--maintenance-policy=TERMINATE",
            "--provisioning-model=FLEX_START",
            f"--max-run-duration={vm.max_run_hours}h",
            "--instance-termination-action=DELETE",
            "--reservation-affinity=none",
        ]
    return (), [
        "--maintenance-policy=TERMINATE",
        "--instance-termination-action=DELETE",
        "--provisioning-model=RESERVATION_BOUND",
        "--reservation-affinity=specific",
        f"--reservation={vm.reservation}",
    ]


def create_vm(vm: TpuVmSpec, service_account: str | None = None, boot_family: str | None = None) -> Command:
    """The TPU VM, provisioned as its ``capacity`` says (:func:`capacity_flags`); from the baked
    boot image of ``boot_family`` when there is one."""
    track, capacity = capacity_flags(vm)
    source = f"reservation {vm.reservation}" if vm.capacity == RESERVATION else f"{vm.capacity} capacity"
    booted = f", booted from the baked image family {boot_family}" if boot_family else ""
    return create_instance(
        vm,
        service_account,
        capacity,
        f"create TPU VM {vm.vm_name} ({vm.shape.tpu_type}, {source}{booted})",
        track=track,
        boot_family=boot_family,
    )


def create_cpu_vm(vm: CpuVmSpec, service_account: str | None = None) -> Command:
    """The CPU VM: no reservation, standard provisioning."""
    return create_instance(
        vm,
        service_account,
        [],
        f"create CPU VM {vm.vm_name} ({vm.machine_type}) for the checkpoint conversions",
    )


def delete_vm(vm: TpuVmSpec | CpuVmSpec) -> Command:
    return delete_vm_named(vm.project, vm.zone, vm.vm_name)


def delete_vm_named(project: str, zone: str, name: str, *, description: str = "") -> Command:
    """Delete a VM; one that is already gone counts as deleted."""
    return Command(
        (
            "gcloud",
            "compute",
            "instances",
            "delete",
            name,
            f"--zone={zone}",
            f"--project={project}",
            "--quiet",
        ),
        ok_if_output_contains=VM_GONE,
        description=description or f"delete VM {name} (its outputs are in GCS)",
    )


def list_managed_vms(project: str) -> Command:
    return Command(
        (
            "gcloud",
            "compute",
            "instances",
            "list",
            f"--project={project}",
            f"--filter=labels.{gke.MANAGED_LABEL}=true",
            "--format=json",
        ),
        description="list TPU VMs created by tpu-rl",
    )


SSH_KEY_LIFETIME = "1d"
# A session whose VM stopped answering ends within ~5 minutes instead of hanging until the task's
# execution_timeout: OpenSSH's keepalive (ssh_config(5) ServerAliveInterval/ServerAliveCountMax;
# the client exits with "Timeout, server ... not responding"), and a bounded connect.
SSH_FLAGS = (
    "--ssh-flag=-o ServerAliveInterval=30",
    "--ssh-flag=-o ServerAliveCountMax=10",
    "--ssh-flag=-o ConnectTimeout=60",
)


# A guest still booting: nothing listens on port 22 yet. OpenSSH's connect failure (sshconnect.c
# ssh_connect_direct: "ssh: connect to host %s port %s: %s", strerror(ECONNREFUSED)); gcloud exits
# with ssh's 255, or 1 once its key-propagation poll gave up (compute/ssh_utils.NetworkError).
SSH_REFUSED = re.compile(r"ssh: connect to host \S+ port 22: Connection refused")


def is_ssh(command: Command) -> bool:
    """Whether ``command`` is a ``gcloud compute ssh``."""
    return tuple(command.argv[:3]) == ("gcloud", "compute", "ssh")


def ssh_refused(exit_code: int, lines: Sequence[str]) -> str | None:
    """OpenSSH's refused-connection line of a failed ``gcloud compute ssh`` (no session ran), or None."""
    if exit_code not in (1, 255):
        return None
    return next((line for line in reversed(lines) if SSH_REFUSED.fullmatch(line.strip())), None)


def ssh(
    vm: TpuVmSpec | CpuVmSpec, script: str, description: str = "", *, ssh_key_file: str | None = None
) -> Command:
    """Run a stage script on the VM: ``bash -s`` reads it from stdin, so nothing is on argv.

    ``ssh_key_file`` is a key kept across calls: gcloud adds its public key to the project's
    metadata once (with an expiry) instead of a new key per call from a fresh HOME.
    """
    return ssh_named(vm.project, vm.zone, vm.vm_name, script, description, ssh_key_file=ssh_key_file)


def ssh_named(
    project: str, zone: str, name: str, script: str, description: str = "", *, ssh_key_file: str | None = None
) -> Command:
    """:func:`ssh` to the VM ``name`` of ``project``/``zone`` (one a writer claim names)."""
    key = (
        [f"--ssh-key-file={ssh_key_file}", f"--ssh-key-expire-after={SSH_KEY_LIFETIME}"]
        if ssh_key_file
        else []
    )
    return Command(
        (
            "gcloud",
            "compute",
            "ssh",
            name,
            f"--zone={zone}",
            f"--project={project}",
            *key,
            *SSH_FLAGS,
            "--command=bash -s",
        ),
        stdin_text=script,
        description=description,
    )


def _on_instance(vm: TpuVmSpec | CpuVmSpec, verb: str, *flags: str, description: str) -> Command:
    """``gcloud compute instances VERB`` of the VM in its zone and project."""
    return Command(
        (
            "gcloud",
            "compute",
            "instances",
            verb,
            vm.vm_name,
            f"--zone={vm.zone}",
            f"--project={vm.project}",
            *flags,
        ),
        description=description,
    )


def describe_vm_labels(vm: TpuVmSpec | CpuVmSpec) -> Command:
    """The VM's labels as JSON: whose run created it (``tpu-rl-dag``, ``tpu-rl-run``)."""
    return _on_instance(
        vm,
        "describe",
        "--format=json",
        description=f"read the labels of VM {vm.vm_name} (which run created it)",
    )


# Compute Engine's statuses of a VM that lost its machine: preempted (its termination action STOP,
# or a suspend), on its way there, or stopped; with DELETE it is gone (describe: VM_GONE).
VM_LOST_STATUSES = ("STOPPING", "TERMINATED", "SUSPENDING", "SUSPENDED")


def describe_vm_status(vm: TpuVmSpec | CpuVmSpec) -> Command:
    """The VM's status (``RUNNING``, ``TERMINATED``, ...); a VM that is gone fails with VM_GONE."""
    return describe_vm_status_named(vm.project, vm.zone, vm.vm_name)


def describe_vm_status_named(project: str, zone: str, name: str) -> Command:
    """:func:`describe_vm_status` of the VM ``name`` of ``project``/``zone``."""
    return Command(
        ("gcloud", "compute", "instances", "describe", name, f"--zone={zone}", f"--project={project}",
         "--format=value(status)"),
        description=f"read the status of VM {name}",
    )  # fmt: skip


def start_vm(vm: TpuVmSpec | CpuVmSpec) -> Command:
    """Start a stopped (``TERMINATED``) VM: its boot disk, and what was installed on it, is kept."""
    return _on_instance(vm, "start", description=f"start the stopped VM {vm.vm_name}")


def vm_service_account(vm: TpuVmSpec | CpuVmSpec) -> Command:
    """The e-mail of the service account the VM runs as (the default compute one if none was named)."""
    return _on_instance(
        vm,
        "describe",
        "--format=value(serviceAccounts[0].email)",
        description=f"read the service account of VM {vm.vm_name}",
    )


def service_account_grants(project: str, bucket: str, secret_id: str, account: str) -> list[Command]:
    """What the VM's stages need: read the HF token secret, write outputs to the bucket."""
    member = f"serviceAccount:{account}"
    return [
        Command(
            gke.iam_binding_argv("add", "secret", project, secret_id, member, gke.SECRET_ACCESSOR),
            description=f"let {account} read the HF token secret",
        ),
        Command(
            gke.iam_binding_argv("add", "bucket", project, bucket, member, gke.STORAGE_OBJECT_ADMIN),
            description=f"let {account} write the run's outputs to gs://{bucket}",
        ),
    ]


def service_account_policy_reads(project: str, bucket: str, secret_id: str) -> list[Command]:
    """The policies the first VM to hold the grants reads (a binding already there is nobody's)."""
    return [
        gke.iam_policy_command("secret", project, secret_id),
        gke.iam_policy_command("bucket", project, bucket),
    ]


def service_account_revokes(project: str, bucket: str, secret_id: str, account: str) -> list[Command]:
    """What the last VM to hold the grants removes (one already gone is success)."""
    member = f"serviceAccount:{account}"
    return [
        gke.remove_iam_binding("secret", project, secret_id, member, gke.SECRET_ACCESSOR),
        gke.remove_iam_binding("bucket", project, bucket, member, gke.STORAGE_OBJECT_ADMIN),
    ]


def _preamble(pipeline: TpuVmPipelineSpec, *, with_token: bool) -> list[str]:
    lines = ["set -euo pipefail", 'source "${HOME}/.local/bin/env"', f"source {VENV}/bin/activate"]
    if with_token:
        lines += hf_token_from_gcloud(pipeline.hf_token.secret_id, pipeline.vm.project)
    return lines


# A freshly booted Ubuntu image runs its own apt work first: apt-daily's update (apt's lists lock),
# then unattended-upgrades (dpkg's frontend lock). apt waits for dpkg's lock up to
# DPkg::Lock::Timeout seconds ("Waiting for cache lock: …"), but `apt-get update` takes the lists
# lock without waiting whatever the option says (apt 2.6.1, tried: "E: Could not get lock
# /var/lib/apt/lists/lock. It is held by process …"): that one is retried while the lock is the
# reason, for as long as the upgrade may wait.
APT_LOCK_SECONDS = 600
APT_LOCK_WAIT = f"-o DPkg::Lock::Timeout={APT_LOCK_SECONDS}"
APT_RETRY_SECONDS = 5
APT_UPDATE_AFTER_BOOT = (
    "apt_tries=0",
    "until apt_error=$(sudo apt-get update 2>&1 >/dev/null); do",
    '  if ! grep -q "Could not get lock" <<<"${apt_error}" '
    f"|| [ $((apt_tries += 1)) -ge {APT_LOCK_SECONDS // APT_RETRY_SECONDS} ]; then",
    '    echo "${apt_error}" >&2',
    "    exit 100",
    "  fi",
    f"  sleep {APT_RETRY_SECONDS}",
    "done",
)


def install_script() -> str:
    return (
        "\n".join(
            [
                "set -euo pipefail",
                *APT_UPDATE_AFTER_BOOT,
                f"sudo DEBIAN_FRONTEND=noninteractive apt-get {APT_LOCK_WAIT} upgrade -y --fix-missing",
                f"sudo DEBIAN_FRONTEND=noninteractive apt-get {APT_LOCK_WAIT} install -y build-essential cmake ninja-build",
                "curl -LsSf https://astral.sh/uv/install.sh | sh",
                'source "${HOME}/.local/bin/env"',
                "uv python install 3.12",
                f"uv venv --python 3.12 --seed --allow-existing {VENV}",
                f"source {VENV}/bin/activate",
                "UV_TORCH_BACKEND=cpu "
                + quote_all(["uv", "pip", "install", MAXTEXT_PIP_SPEC, "--resolution=lowest"]),
                "install_tpu_post_train_extra_deps",
            ]
        )
        + "\n"
    )


def cpu_program_argv(pipeline: TpuVmPipelineSpec, stage: str) -> list[str]:
    """``python3 -m …`` of the conversion (``convert``) or the export (``export``) on the CPU VM:
    no TPU there, so MaxText must not look for a JAX cluster (:data:`maxtext.CPU_KEYS`)."""
    if stage == "convert":
        return maxtext.to_maxtext_argv(pipeline.conversion, machine=stage_machine("convert"))
    if stage == "export":
        return maxtext.to_huggingface_argv(
            pipeline.export, machine=stage_machine("export"), override_architecture=False
        )
    raise ValueError(f"not a CPU stage: {stage!r}")


def convert_script(pipeline: TpuVmPipelineSpec) -> str:
    """The conversion in the venv ``install_script`` made (runtime ``install``)."""
    lines = _preamble(pipeline, with_token=True)
    lines.append(with_hf_token(quote_all(cpu_program_argv(pipeline, "convert"))))
    return "\n".join(lines) + "\n"


def tpu_environment(vm: TpuVmSpec) -> list[str]:
    """The seed's TPU_* variables for a single host (TPU_NAME is the VM's hostname)."""
    return ['TPU_NAME="$(hostname)"', "export TPU_NAME"] + [
        f"export {quote_all([f'{k}={v}'])}" for k, v in _tpu_values(vm)
    ]


def tpu_variable_names(vm: TpuVmSpec) -> list[str]:
    """The names :func:`tpu_environment` exports."""
    return ["TPU_NAME", *(name for name, _ in _tpu_values(vm))]


def _tpu_values(vm: TpuVmSpec) -> list[tuple[str, str]]:
    a, b = vm.topology.split("x")
    return [
        ("TPU_ACCELERATOR_TYPE", vm.shape.tpu_type),
        ("TPU_WORKER_ID", "0"),
        ("TPU_SKIP_MDS_QUERY", "1"),
        ("TPU_WORKER_HOSTNAMES", "localhost"),
        ("TPU_TOPOLOGY", vm.topology),
        ("TPU_CHIPS_PER_HOST_BOUNDS", f"{a},{b},1"),
        ("TPU_HOST_BOUNDS", "1,1,1"),
    ]


def train_argv(pipeline: TpuVmPipelineSpec) -> list[str]:
    """``python3 -m …train_rl key=value…`` (the same for both runtimes)."""
    t = pipeline.training
    return maxtext.program_argv(
        STAGE_PROGRAM["train"],
        [
            ("model_name", t.model_name),
            ("load_parameters_path", t.load_parameters_path),
            ("run_name", t.run_name),
            ("base_output_directory", t.base_output_directory),
            ("num_batches", str(t.num_batches)),
            *[(k, v) for k, v in t.overrides if k != "num_batches"],
        ],
        machine=stage_machine("train"),
    )


def train_script(pipeline: TpuVmPipelineSpec) -> str:
    """Training in the venv ``install_script`` made (runtime ``install``)."""
    lines = _preamble(pipeline, with_token=True) + tpu_environment(pipeline.vm)
    lines.append(with_hf_token(quote_all(train_argv(pipeline))))
    return "\n".join(lines) + "\n"


def export_script(pipeline: TpuVmPipelineSpec) -> str:
    """The export in the venv ``install_script`` made (runtime ``install``)."""
    lines = _preamble(pipeline, with_token=True)
    lines.append(with_hf_token(quote_all(cpu_program_argv(pipeline, "export"))))
    return "\n".join(lines) + "\n"


# -- runtime "container": both VMs run the workload image's MaxText ----------------------------
# Cloud TPU's "Run TPU workloads in a Docker container" (https://cloud.google.com/tpu/docs/run-in-container)
# runs its TPU containers with `sudo docker run --net=host --privileged ...`: --privileged gives the
# container the host's devices (the TPU chips, /dev/vfio or /dev/accel*), --net=host the metadata
# server (the VM's service account: GCS, as the install runtime's training) and the other hosts'
# addresses; --ipc=host the host's shared memory (Docker's own /dev/shm is 64 MB).
DOCKER_RUN_FLAGS = ("--rm", "--privileged", "--net=host", "--ipc=host")
# The CPU VM's conversions in the same image: no TPU, so no device and no --privileged (a container
# gets no host device without it); --net=host for the metadata server (the VM's account: GCS).
CPU_DOCKER_RUN_FLAGS = ("--rm", "--net=host")
TRAIN_CONTAINER = "tpu-rl-train"
# Each stage's container, by name: an earlier try's (its SSH session gone, the container not) is
# followed, refused or removed before the stage starts again (_existing_container_lines), and a
# writer probe finds it (records/writers.py).
STAGE_CONTAINERS = {"convert": "tpu-rl-convert", "train": TRAIN_CONTAINER, "export": "tpu-rl-export"}
# What a stage's container is started with (`docker run --label`): the run directory it writes and
# the run that started it, under the reverse DNS of the tool's name, as Docker asks of third-party
# tools' label keys (docs.docker.com/engine/manage-resources/labels/, "Key format recommendations").
RUN_DIR_LABEL: Final = "io.tpu-rl.run-dir"
RUN_ID_LABEL: Final = "io.tpu-rl.run-id"
# What the stage reads of an existing container of its name (`docker inspect --format`, a Go
# template: docs.docker.com/reference/cli/docker/inspect/; `index` of a label it lacks is ""):
# running, since when, and its two labels; the run id last, as `read` gives the last name the rest.
CONTAINER_IDENTITY_FORMAT: Final = (
    "{{.State.Running}} {{.State.StartedAt}} "
    f'{{{{index .Config.Labels "{RUN_DIR_LABEL}"}}}} {{{{index .Config.Labels "{RUN_ID_LABEL}"}}}}'
)
# The line a stage prints when it follows this run's container instead of starting one; the one
# it refuses another run's running container with (the operator fails the task with it, for good);
# the one a followed container that ended before its exit status was read leaves (a retry looks
# at the directory again).
FOLLOWING_CONTAINER: Final = "tpu-rl: following container"
REFUSED_CONTAINER: Final = "tpu-rl: refused:"
UNSEEN_EXIT: Final = "tpu-rl: exit status lost:"


def stage_output_directory(pipeline: TpuVmPipelineSpec, stage: str) -> str | None:
    """The run directory a stage writes in GCS: the model's converted checkpoint, the run's
    training, its export (``install`` writes none)."""
    if stage == "convert":
        return run_dir(pipeline.conversion.output_directory)
    if stage == "train":
        return pipeline.training_run_dir
    if stage == "export":
        return run_dir(pipeline.gcs_export)
    return None


def _existing_container_lines(pipeline: TpuVmPipelineSpec, stage: str, directory: str) -> list[str]:
    """Before ``docker run``: a container of the stage's name that an earlier try left (its SSH
    session gone, the container not: the docker client's end does not stop it).

    Running for this run and directory (its labels): followed, its logs from its start
    (``docker logs --follow``, docs.docker.com/reference/cli/docker/container/logs/) and then its
    exit status as the stage's (``docker wait``, .../container/wait/, asked while it still runs: a
    ``--rm`` container is gone once it ends). Running for another run or directory (or with no
    labels): refused in one line, untouched. Not running: removed (``docker rm`` without
    ``--force`` never stops one), and a new one starts.
    """
    container = STAGE_CONTAINERS[stage]
    run = f"{pipeline.dag_id}/{pipeline.run_id}"
    vm = pipeline.cpu_vm if stage_machine(stage) == "cpu" else pipeline.vm
    inspect = quote_all(["sudo", "docker", "inspect", f"--format={CONTAINER_IDENTITY_FORMAT}", container])
    following = f"{FOLLOWING_CONTAINER} {container} of this run (started "
    refused = f"{REFUSED_CONTAINER} container {container} on VM {vm.vm_name} is running for run "
    stop = quote_all(["sudo", "docker", "rm", "--force", container])
    return [
        f"if found=$({inspect} 2>/dev/null); then",
        '  read -r running started run_dir run_id <<<"${found}"',
        f'  if [ "${{running}}" = true ] && [ "${{run_dir}}" = {shlex.quote(directory)} ] '
        f'&& [ "${{run_id}}" = {shlex.quote(run)} ]; then',
        f'    echo {shlex.quote(following)}"${{started}}"{shlex.quote("): its logs, then its exit status")} >&2',
        f"    {quote_all(['sudo', 'docker', 'logs', '--follow', container])} &",
        "    logs_pid=$!",
        f"    if ! status=$({quote_all(['sudo', 'docker', 'wait', container])}); then",
        '      wait "${logs_pid}" || true',
        f"      echo {shlex.quote(f'{UNSEEN_EXIT} container {container} ended before its exit status could be read; a retry looks at {directory} again')} >&2",
        "      exit 1",
        "    fi",
        '    wait "${logs_pid}" || true',
        '    [[ "${status}" =~ ^[0-9]+$ ]] || status=1',
        '    exit "${status}"',
        "  fi",
        '  if [ "${running}" = true ]; then',
        f'    echo {shlex.quote(refused)}"${{run_id:-(none recorded)}}"{shlex.quote(" writing ")}'
        f'"${{run_dir:-(none recorded)}}"'
        + shlex.quote(
            f", not {directory} of this run: never two jobs on one VM; wait for that run to end, or stop it "
            f"({stop} on {vm.vm_name})"
        )
        + " >&2",
        "    exit 3",
        "  fi",
        f"  {quote_all(['sudo', 'docker', 'rm', container])} >/dev/null 2>&1 || true",
        "fi",
    ]


def image_registry(image: str) -> str:
    """The registry host of ``image`` (``us-docker.pkg.dev``): what ``configure-docker`` is given."""
    return image.split("/", 1)[0]


# Root's Docker finds gcloud's credential helper only on sudo's secure_path: Debian's and Ubuntu's
# google-cloud-cli package links /usr/bin/docker-credential-gcloud (dpkg -S on such a machine), an
# SDK unpacked elsewhere does not. `configure-docker` registers the helper all the same (it only
# warns "docker-credential-gcloud not in system PATH": surface/auth/configure_docker.py), and then
# every pull fails "error getting credentials - err: exec: "docker-credential-gcloud": executable
# file not found in $PATH". Without the helper, root logs in with the VM account's access token
# instead (Artifact Registry's "access token" method: the user oauth2accesstoken, the token on
# stdin, never in argv), pulls, and logs out again, so no token stays in root's Docker config
# (nor in a baked image's disk).
HELPER_ON_ROOTS_PATH = "sudo sh -c 'command -v docker-credential-gcloud' >/dev/null 2>&1"


def registry_pull_lines(image: str, reference: str | None = None) -> list[str]:
    """Root's Docker authenticated to ``image``'s registry, then ``reference`` (default: the image)
    pulled: gcloud's credential helper when root can run it, else an access-token login for the
    pull alone (:data:`HELPER_ON_ROOTS_PATH`)."""
    registry = image_registry(image)
    pull = quote_all(["sudo", "docker", "pull", reference or image])
    logout = quote_all(["sudo", "docker", "logout", registry])
    return [
        f"if {HELPER_ON_ROOTS_PATH}; then",
        "  " + quote_all(["sudo", "gcloud", "auth", "configure-docker", registry, "--quiet"]),
        f"  {pull}",
        "else",
        f"  echo {shlex.quote(f'docker-credential-gcloud is not on root PATH: logging in to {registry} with an access token')} >&2",
        "  gcloud auth print-access-token | "
        + quote_all(
            ["sudo", "docker", "login", "--username=oauth2accesstoken", "--password-stdin", registry]
        ),
        f"  {pull} || {{ {logout}; exit 1; }}",
        f"  {logout}",
        "fi",
    ]


def install_docker_lines() -> list[str]:
    """Ubuntu's ``docker.io`` when the VM's image has no Docker (after the boot's own apt work)."""
    return [
        "if ! command -v docker >/dev/null 2>&1; then",
        *(f"  {line}" for line in APT_UPDATE_AFTER_BOOT),
        f"  sudo DEBIAN_FRONTEND=noninteractive apt-get {APT_LOCK_WAIT} install -y docker.io",
        "fi",
    ]


def container_install_script(pipeline: TpuVmPipelineSpec) -> str:
    """Runtime ``container`` on a VM that did not boot from a baked image: Docker (Ubuntu's
    ``docker.io`` when the image has none), root authenticated to the image's registry, and the
    image pulled (:func:`registry_pull_lines`); nothing is built.

    docker runs as root (``sudo``): the login user is in no ``docker`` group, and a group added now
    would only apply to a later login.
    """
    image = pipeline.workload_image
    return (
        "\n".join(
            [
                "set -euo pipefail",
                *install_docker_lines(),
                *registry_pull_lines(image),
            ]
        )
        + "\n"
    )


# A TPU VM's chips as its guest sees them: VFIO (Cloud TPU's custom OS image page,
# docs.cloud.google.com/tpu/docs/custom-os-image: the TPU images' udev rule binds the TPU's PCI
# devices to vfio-pci), the container /dev/vfio/vfio and one group /dev/vfio/N per device (the paths
# tpu-info opens, tpu_info/device.py). A custom image without that rule boots with neither.
TPU_VFIO_CONTAINER: Final = "/dev/vfio/vfio"
TPU_VFIO_GROUPS: Final = "/dev/vfio/[0-9]*"


def boot_check_script(image: str, family: str) -> str:
    """The TPU VM's install stage when it booted from a baked image: it checks that the TPU's
    devices, Docker and the workload image are there, and installs and pulls nothing; any missing
    fails the stage in one line, in seconds rather than in ``train`` (the image in ``family`` is
    not what its name says: delete it and a run bakes again)."""
    broken = f"the boot image of family {family} lacks"
    no_tpu = (
        f"{broken} the TPU's devices (no {TPU_VFIO_CONTAINER} and {TPU_VFIO_GROUPS}: the TPU images' "
        "udev rule binds the chips to vfio-pci, cloud.google.com/tpu/docs/custom-os-image); "
        "delete the family image or set bake_image=false"
    )
    return (
        "\n".join(
            [
                "set -euo pipefail",
                f"if [ ! -e {TPU_VFIO_CONTAINER} ] || ! compgen -G {quote_all([TPU_VFIO_GROUPS])} >/dev/null; then",
                f"  echo {quote_all([no_tpu])} >&2",
                "  exit 1",
                "fi",
                "if ! command -v docker >/dev/null 2>&1; then",
                f"  echo {quote_all([f'{broken} Docker; delete the family image or set bake_image=false'])} >&2",
                "  exit 1",
                "fi",
                f"if ! {quote_all(['sudo', 'docker', 'image', 'inspect', '--format={{.Id}}', image])} >/dev/null; then",
                f"  echo {quote_all([f'{broken} {image}; delete the family image or set bake_image=false'])} >&2",
                "  exit 1",
                "fi",
                f"echo {quote_all([f'the TPU devices, Docker and {image} are on the boot image ({family}): nothing to install or pull'])}",
            ]
        )
        + "\n"
    )


def _container_script(
    pipeline: TpuVmPipelineSpec,
    stage: str,
    argv: list[str],
    flags: tuple[str, ...],
    names: list[str],
    environment: list[str],
) -> str:
    """``argv`` in ``docker run`` of the workload image, as the stage's container, labelled with
    the run directory it writes and its run; an earlier try's container of this run is followed
    instead (:func:`_existing_container_lines`).

    The variables ``names`` and HF_TOKEN reach the container by name (``-e NAME``: docker copies
    the value from its own environment), never on argv. sudo's env_reset would drop them, so they
    are kept by name with ``--preserve-env=LIST`` (sudoers(5): allowed when the matched command is
    ALL, as the guest environment's sudoers entries are); HF_TOKEN is in the environment of that
    one command only. ``environment``: the lines that set the other names.
    """
    container = STAGE_CONTAINERS[stage]
    directory = stage_output_directory(pipeline, stage)
    if directory is None:
        raise ValueError(f"stage {stage!r} runs no container")
    passed = [*names, "HF_TOKEN"]
    docker = [
        "sudo",
        f"--preserve-env={','.join(passed)}",
        "docker",
        "run",
        f"--name={container}",
        *flags,
        f"--label={RUN_DIR_LABEL}={directory}",
        f"--label={RUN_ID_LABEL}={pipeline.dag_id}/{pipeline.run_id}",
        *[flag for name in passed for flag in ("-e", name)],
        pipeline.workload_image,
        *argv,
    ]
    lines = [
        "set -euo pipefail",
        *_existing_container_lines(pipeline, stage, directory),
        *hf_token_from_gcloud(pipeline.hf_token.secret_id, pipeline.vm.project),
        *environment,
        with_hf_token(quote_all(docker)),
    ]
    return "\n".join(lines) + "\n"


def container_train_script(pipeline: TpuVmPipelineSpec) -> str:
    """Runtime ``container``: ``train_rl`` with ``train_script``'s arguments in ``docker run``, the
    TPU_* variables and the TPU chips (``--privileged``) given to the container."""
    return _container_script(
        pipeline,
        "train",
        train_argv(pipeline),
        DOCKER_RUN_FLAGS,
        tpu_variable_names(pipeline.vm),
        tpu_environment(pipeline.vm),
    )


def container_cpu_script(pipeline: TpuVmPipelineSpec, stage: str) -> str:
    """Runtime ``container`` on the CPU VM: the conversion or the export with the argv of
    :func:`convert_script`/:func:`export_script`, in the workload image training runs: one MaxText
    release per run (the checkpoint never crosses releases)."""
    return _container_script(pipeline, stage, cpu_program_argv(pipeline, stage), CPU_DOCKER_RUN_FLAGS, [], [])


def stage_machine(stage: str, machine: str | None = None) -> str:
    """Which VM runs ``stage``: ``cpu`` or ``tpu`` (install: ``machine``, default the TPU VM).

    A conversion or export on the TPU VM, or training on the CPU VM, is refused.
    """
    if stage not in STAGES:
        raise ValueError(f"stage must be one of {STAGES}, got {stage!r}")
    fixed = STAGE_MACHINE.get(stage)
    chosen = machine or fixed or "tpu"
    if chosen not in MACHINES:
        raise ValueError(f"machine must be one of {MACHINES}, got {machine!r}")
    if fixed is not None and chosen != fixed:
        raise ValueError(f"the {stage} stage runs on the {fixed.upper()} VM, not the {chosen.upper()} VM")
    return chosen


def stage_command(
    pipeline: TpuVmPipelineSpec,
    stage: str,
    *,
    machine: str | None = None,
    ssh_key_file: str | None = None,
    boot_family: str | None = None,
) -> Command:
    """The stage's SSH session on its VM; ``boot_family``: the TPU VM booted from that baked image."""
    on = stage_machine(stage, machine)
    script, description = stage_script(pipeline, stage, on, boot_family=boot_family)
    vm: TpuVmSpec | CpuVmSpec = pipeline.cpu_vm if on == "cpu" else pipeline.vm
    return ssh(vm, script, f"{description} on {vm.vm_name}", ssh_key_file=ssh_key_file)


def stage_script(
    pipeline: TpuVmPipelineSpec, stage: str, machine: str, *, boot_family: str | None = None
) -> tuple[str, str]:
    """The script of ``stage`` on ``machine`` and what it does, by the pipeline's runtime: with
    ``container`` both VMs run the workload image (its MaxText converts, trains and exports; a TPU
    VM booted from the baked image of ``boot_family`` only checks it has Docker and the image), with
    ``install`` both install the same pinned MaxText release."""
    image = pipeline.workload_image
    if pipeline.runtime != "container":
        scripts = {
            "install": (install_script, "install MaxText and its post-training extras"),
            "convert": (convert_script, "convert the HF checkpoint to MaxText (CPU), written to GCS"),
            "train": (train_script, "GRPO training (McJAX) from and to GCS"),
            "export": (export_script, "export the GCS actor checkpoint to Hugging Face format (CPU) in GCS"),
        }
        build, description = scripts[stage]
        return (build() if stage == "install" else build(pipeline)), description  # type: ignore[operator]
    if stage == "install" and machine == "tpu" and boot_family:
        return boot_check_script(image, boot_family), (
            f"check that the baked boot image holds the TPU devices, Docker and {image} (nothing installed or pulled)"
        )
    if stage == "install":
        return container_install_script(pipeline), f"prepare Docker and pull {image}"
    if stage == "train":
        return container_train_script(pipeline), f"GRPO training (McJAX) in {image}, from and to GCS"
    what = {
        "convert": "convert the HF checkpoint to MaxText (CPU), written to GCS",
        "export": "export the GCS actor checkpoint to Hugging Face format (CPU) in GCS",
    }[stage]
    return container_cpu_script(pipeline, stage), f"{what}, in {image}"


def vm_labels(pipeline: TpuVmPipelineSpec, expires_at: int) -> dict[str, str]:
    return gke.managed_labels(pipeline.dag_id, pipeline.suffix, pipeline.vm.bucket, expires_at)
