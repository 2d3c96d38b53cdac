"""The TPU VM's baked boot image: Docker and the workload image already on its disk.

Pulling the post-training image (JAX, libtpu, torch, vLLM: over 10 GB) and installing Docker on the
billed TPU VM costs minutes of TPU time every run. Instead a CPU VM booted from the TPU VM's own
image family does it once (:func:`bake_commands`): it is created, installs Docker, pulls the
workload image *by digest*, stops, and its boot disk becomes a custom image
(``gcloud compute images create … --source-disk``) in an image family named after that digest
(:func:`family_of`); then it is deleted. Every later run whose workload image has that digest finds
the family's image (``describe-from-family``) and bakes nothing; the TPU VM boots from the family
(``--image-family`` with ``--image-project`` = the run's project) and its install stage only
checks that Docker and the image are there (:func:`boot_check_script`).

Sources: a custom image is a supported way to boot a TPU VM ("You can use a custom OS image for
your TPU VMs to pre-load software", cloud.google.com/tpu/docs/custom-os-image; states). That page
lists the TPU-specific parts of the TPU images: a udev rule binding the TPU PCI devices (vendor
0x1ae0) to vfio-pci and boot-time tasks; on a machine without those devices the rules match
nothing, and the image is otherwise Ubuntu 22.04 for x86_64: so it boots on an n2 machine type.
That last step is an inference, no source states it (if Compute Engine refused the family on a CPU
machine type, the bake VM's create would fail with the API's message and ``bake_image=false``
skips the bake). A baked image is the TPU image's disk as it was when baked: it is reused until
the workload image's digest changes, not when Google updates the TPU image family.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Final

from airflow_provider_tpu_rl.render import tpu_vm
from airflow_provider_tpu_rl.render.command import Command
from airflow_provider_tpu_rl.render.shell import quote_all
from airflow_provider_tpu_rl.spec.cluster import CpuVmSpec
from airflow_provider_tpu_rl.spec.pipeline import TpuVmPipelineSpec

DIGEST: Final = re.compile(r"^sha256:[0-9a-f]{64}$")
# Image family names follow RFC 1035 (compute v1 ``Image.family``): 63 characters at most. The
# prefix and the digest's first 48 hex digits (192 bits) make 62.
FAMILY_PREFIX: Final = "tpu-rl-sha256-"
FAMILY_DIGITS: Final = 48
FAMILY: Final = re.compile(rf"^{FAMILY_PREFIX}[0-9a-f]{{{FAMILY_DIGITS}}}$")
# What the plan shows for a family known only once a tag is resolved at run time.
PLAN_FAMILY: Final = FAMILY_PREFIX + "<digest>"
# compute images describe-from-family of a family with no image: the API's 404.
NO_IMAGE: Final = ("was not found",)
# A family's image that can boot a VM (compute v1 Image.status: "DELETING, FAILED, PENDING or READY").
READY: Final = "READY"
IMAGE_LABEL: Final = "tpu-rl-baked"


def pinned_digest(image: str) -> str | None:
    """The ``sha256:…`` digest an image reference pins (``…@sha256:…``); None for a tag."""
    _, at, digest = image.rpartition("@")
    return digest if at and DIGEST.fullmatch(digest) else None


def repository(image: str) -> str:
    """The image's repository: the reference without its ``:tag`` and ``@digest``."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    return name.rsplit(":", 1)[0] if ":" in last else name


def family_of(digest: str) -> str:
    """The image family of the boot images holding the workload image ``digest``."""
    if not DIGEST.fullmatch(digest):
        raise ValueError(f"not an image digest: {digest!r}")
    return FAMILY_PREFIX + digest.removeprefix("sha256:")[:FAMILY_DIGITS]


def check_family(family: str) -> str:
    """``family`` if it is a baked image family (:func:`family_of`'s form), else a ValueError."""
    if not FAMILY.fullmatch(family):
        raise ValueError(f"not a baked image family: {family!r} (expected {FAMILY_PREFIX} and 48 hex digits)")
    return family


def image_name(family: str, suffix: str) -> str:
    """The name of the image a run bakes in ``family``: ``tpu-rl-<12 hex>-<run suffix>``."""
    digits = "<digest>" if family == PLAN_FAMILY else check_family(family).removeprefix(FAMILY_PREFIX)[:12]
    return f"tpu-rl-{digits}-{suffix}"


def plan_family(image: str) -> tuple[str, str]:
    """``(family, digest)`` as the plan shows them: a pinned digest's, else placeholders (the tag is
    resolved at run time)."""
    digest = pinned_digest(image)
    return (family_of(digest), digest) if digest else (PLAN_FAMILY, "sha256:<digest>")


def resolve_digest(image: str, why: str = "the boot image family is named after it") -> Command:
    """The digest a tag names now, from the image's registry: gcloud's documented "Find the digest
    for a tag" (surface/container/images/describe.py: ``util.GetDigestFromName`` asks the registry
    for the manifest, the Docker Registry API, with the account's token; it prints a warning that a
    digest is better on stderr)."""
    return Command(
        ("gcloud", "container", "images", "describe", image, "--format=value(image_summary.digest)"),
        description=f"resolve {image} to its digest ({why})",
    )


def parse_digest(lines: Sequence[str]) -> str | None:
    """The digest :func:`resolve_digest` printed (the one line that is a digest)."""
    found = [line.strip() for line in lines if DIGEST.fullmatch(line.strip())]
    return found[-1] if len(set(found)) == 1 else None


def find_image(project: str, family: str) -> Command:
    """The family's newest image (``compute images describe-from-family``: images.getFromFamily,
    "the latest image that is part of an image family and is not deprecated"); a family with no
    image fails with the API's "was not found" (:data:`NO_IMAGE`)."""
    return Command(
        ("gcloud", "compute", "images", "describe-from-family", family, f"--project={project}",
         "--format=json"),
        description=f"look for a boot image in family {family} (there: nothing is baked)",
    )  # fmt: skip


def create_bake_vm(vm: CpuVmSpec, service_account: str | None) -> Command:
    """The bake VM: a CPU machine type booted from the TPU VM's image family (``vm``: the
    pipeline's :attr:`~airflow_provider_tpu_rl.spec.pipeline.TpuVmPipelineSpec.bake_vm`)."""
    return tpu_vm.create_instance(
        vm,
        service_account,
        [],
        f"create the bake VM {vm.vm_name} ({vm.machine_type}, from {vm.image_project}/{vm.image_family})",
    )


def pull_reference(image: str, digest: str) -> str:
    """What the bake pulls: the image by its digest, so the disk holds exactly what the family's
    name says, whatever the tag points to by then."""
    return f"{repository(image)}@{digest}"


def bake_script(image: str, digest: str) -> str:
    """Docker (Ubuntu's ``docker.io`` when the image has none: its service starts at every boot),
    root authenticated to the registry (no token left behind on the disk:
    :func:`~airflow_provider_tpu_rl.render.tpu_vm.registry_pull_lines`), the image pulled by digest
    and, for a tag, tagged as
    the reference training runs (``docker run`` then finds it without asking the registry)."""
    pulled = pull_reference(image, digest)
    tag = [quote_all(["sudo", "docker", "tag", pulled, image])] if pulled != image else []
    return (
        "\n".join(
            [
                "set -euo pipefail",
                *tpu_vm.install_docker_lines(),
                *tpu_vm.registry_pull_lines(image, pulled),
                *tag,
                quote_all(["sudo", "docker", "image", "inspect", "--format={{.Id}}", image]),
            ]
        )
        + "\n"
    )


def stop_vm(vm: CpuVmSpec) -> Command:
    """Stop the bake VM: an image is made from a disk no running VM uses (``images create``
    refuses one attached to a running instance unless ``--force``: command_lib/compute/images/flags.py)."""
    return Command(
        ("gcloud", "compute", "instances", "stop", vm.vm_name, f"--zone={vm.zone}", f"--project={vm.project}"),
        description=f"stop the bake VM {vm.vm_name} (its disk is imaged stopped)",
    )  # fmt: skip


def describe_vm(vm: CpuVmSpec) -> Command:
    """The bake VM's resource: its machine type and ``lastStartTimestamp``/``lastStopTimestamp``,
    the span its vCPUs billed (what the ledger adds to the run's cost)."""
    return Command(
        ("gcloud", "compute", "instances", "describe", vm.vm_name, f"--zone={vm.zone}",
         f"--project={vm.project}", "--format=json"),
        description=f"read when the bake VM {vm.vm_name} started and stopped (its billed span)",
    )  # fmt: skip


def create_image(vm: CpuVmSpec, name: str, family: str, labels: Mapping[str, str]) -> Command:
    """The boot image from the stopped bake VM's boot disk (named after the VM: compute v1
    ``AttachedDiskInitializeParams.diskName``, "If not specified, the default is to use the name of
    the instance"), in ``family``; a retry finds its own image there already."""
    label = ",".join(f"{key}={value}" for key, value in {**labels, IMAGE_LABEL: "true"}.items())
    return Command(
        (
            "gcloud",
            "compute",
            "images",
            "create",
            name,
            f"--source-disk={vm.vm_name}",
            f"--source-disk-zone={vm.zone}",
            f"--family={family}",
            f"--project={vm.project}",
            f"--labels={label}",
        ),
        ok_if_output_contains=tpu_vm.VM_EXISTS,
        description=f"image the bake VM's disk as {name} in family {family}",
    )


def bake_commands(
    pipeline: TpuVmPipelineSpec,
    family: str,
    digest: str,
    labels: Mapping[str, str],
    *,
    ssh_key_file: str | None = None,
) -> list[Command]:
    """The bake, once :func:`find_image` found no image in ``family``: create the VM (with the
    run's ``labels``), Docker and the pull over SSH, stop, its billed span, the image, delete."""
    vm = pipeline.bake_vm
    labelled = replace(vm, labels=dict(labels))
    owner = {key: labels[key] for key in ("tpu-rl-dag", "tpu-rl-run") if key in labels}
    install = f"install Docker and pull {pipeline.workload_image} by digest on {vm.vm_name}"
    return [
        create_bake_vm(labelled, pipeline.service_account),
        tpu_vm.ssh(vm, bake_script(pipeline.workload_image, digest), install, ssh_key_file=ssh_key_file),
        stop_vm(vm),
        describe_vm(vm),
        create_image(vm, image_name(family, pipeline.suffix), family, owner),
        delete_bake_vm(vm),
    ]


def delete_bake_vm(vm: CpuVmSpec) -> Command:
    """Delete the bake VM and its disk (an absent one counts as deleted)."""
    return tpu_vm.delete_vm_named(
        vm.project, vm.zone, vm.vm_name, description=f"delete the bake VM {vm.vm_name} and its disk"
    )
