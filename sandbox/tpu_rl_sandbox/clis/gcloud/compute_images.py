"""``gcloud compute images create|describe|describe-from-family``: custom images made from a stopped
VM's boot disk, what they hold (the disk's files, copied), and booting a VM from one.

From gcloud 528's sources: surface/compute/images/create.py (exactly one source; ``--source-disk-zone``
only with ``--source-disk``), command_lib/compute/images/flags.py (``--force``: "By default, image
creation fails when it is created from a disk that is attached to a running instance"),
surface/compute/images/describe_from_family.py (images.getFromFamily: "the latest image that is
part of an image family and is not deprecated"), the compute v1 ``Image`` message (name and family
rules, ``status``), and the API's error texts.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import time
from pathlib import Path
from typing import Any

from tpu_rl_sandbox.clis.gcloud.call import GcloudCall
from tpu_rl_sandbox.clis.gcloud.output import GcloudError, formatted, table
from tpu_rl_sandbox.clis.gcloud.parser import GcloudParse, GcloudUsageError
from tpu_rl_sandbox.clis.gcloud.values import parse_labels
from tpu_rl_sandbox.world.settings import load_settings
from tpu_rl_sandbox.world.timescale import capacity_seconds
from tpu_rl_sandbox.world.timestamps import rfc3339

# compute v1 Image.name: "1-63 characters long and match the regular expression
# [a-z]([-a-z0-9]*[a-z0-9])?"; Image.family: "must comply with RFC1035" (the same rule).
IMAGE_NAME = re.compile(r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?")
IMAGE_SOURCES = ("source-disk", "source-image", "source-image-family", "source-snapshot", "source-uri")
# Google's image projects: a VM booted from them gets the bare image (nothing of a sandbox disk).
PUBLIC_IMAGE_PROJECTS = frozenset(
    {"ubuntu-os-cloud", "ubuntu-os-accelerator-images", "debian-cloud", "cos-cloud", "ubuntu-os-pro-cloud"}
)
# Cloud TPU's custom OS image page (cloud.google.com/tpu/docs/custom-os-image) lists what makes the
# TPU VM images TPU images: a udev rule binding the TPU's PCI devices to vfio-pci
# (99-tpu-vfiopci.rules) and boot-time tasks. A TPU VM booted from such an image has /dev/vfio/vfio
# and one /dev/vfio/N group per chip (the paths tpu-info opens, tpu_info/device.py); from an image
# without the rule it has no TPU device. Google's TPU images: Ubuntu's accelerator families for TPUs.
TPU_IMAGE_PROJECT = "ubuntu-os-accelerator-images"
TPU_FAMILY_MARK = "-tpu-"  # ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e
# What of a VM's folder is its boot disk: not /tmp (Ubuntu's tmpfiles.d clears it at boot), not
# /dev/shm, and not the docker daemon's running containers (a stopped VM has none).
NOT_ON_DISK = ("tmp", "dev", ".sandbox-dockerd-containers.json", ".sandbox-dockerd", ".sandbox-dockerd.lock")
GLOBAL = "https://www.googleapis.com/compute/v1/projects/{project}/global"


def image_dir(root: Path, project: str, name: str) -> Path:
    """Where a custom image's files (its source disk's, as imaged) live in the sandbox folder."""
    return root / "images" / project / name


def _copy_disk(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for entry in source.iterdir() if source.is_dir() else ():
        if entry.name in NOT_ON_DISK:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, target / entry.name, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy2(entry, target / entry.name, follow_symlinks=False)


class ImagesCommands(GcloudCall):
    """``gcloud compute images``."""

    def _image_url(self, project: str, name: str) -> str:
        return f"{GLOBAL.format(project=project)}/images/{name}"

    def _image_resource(self, record: dict[str, Any]) -> dict[str, Any]:
        project, name = record["project"], record["name"]
        resource = {
            "kind": "compute#image",
            "id": str(int(hashlib.sha256(f"{project}/{name}".encode()).hexdigest()[:15], 16)),
            "name": name,
            "selfLink": self._image_url(project, name),
            "creationTimestamp": record["created"],
            "status": record["status"],
            "sourceType": "RAW",
            "sourceDisk": record["sourceDisk"],
            "diskSizeGb": record["diskSizeGb"],
            "archiveSizeBytes": record["archiveSizeBytes"],
            "labels": record.get("labels", {}),
            "storageLocations": ["us"],
        }
        if record.get("family"):
            resource["family"] = record["family"]
        return resource

    def _check_image_name(self, name: str, what: str = "resource.name") -> None:
        if not IMAGE_NAME.fullmatch(name):
            raise GcloudError(
                f"Could not fetch resource:\n - Invalid value for field '{what}': '{name}'. Must be a match of "
                "regex '[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?'"
            )

    def newest_in_family(self, project: str, family: str) -> dict[str, Any] | None:
        """images.getFromFamily: the family's newest image that is not deprecated."""
        found = [
            record
            for record in self.store.read("images").values()
            if record["project"] == project
            and record.get("family") == family
            and not record.get("deprecated")
        ]
        return max(found, key=lambda record: record["created_ts"]) if found else None

    def boot_source(self, project: str, image: str | None, family: str | None) -> dict[str, Any] | None:
        """The custom image a VM boots from (``--image``/``--image-family`` of ``--image-project``),
        None for Google's image projects (a bare image); the insert's 400 when there is none."""
        if project in PUBLIC_IMAGE_PROJECTS or not (image or family):
            return None
        record = (
            self.store.read("images").get(f"{project}/{image}")
            if image
            else self.newest_in_family(project, str(family))
        )
        if record is None or record.get("status") != "READY":
            path = f"images/{image}" if image else f"images/family/{family}"
            raise GcloudError(
                "Could not fetch resource:\n - Invalid value for field 'resource.disks[0].initializeParams.sourceImage': "
                f"'{GLOBAL.format(project=project)}/{path}'. The referenced image resource cannot be found."
            )
        return record

    @staticmethod
    def binds_tpu_vfio(project: str, family: str | None, custom: dict[str, Any] | None) -> bool:
        """Whether the boot disk has Cloud TPU's VFIO udev rule: Google's TPU family, or a custom
        image made from a disk that had it (a disk keeps what its image had)."""
        if custom is not None:
            return bool(custom.get("tpuVfio"))
        return project == TPU_IMAGE_PROJECT and TPU_FAMILY_MARK in (family or "")

    def copy_boot_disk(self, record: dict[str, Any], vm_folder: Path) -> None:
        """Give a new VM's boot disk the image's files."""
        _copy_disk(image_dir(self.layout.root, record["project"], record["name"]), vm_folder)

    def cmd_compute_images_create(self, parsed: GcloudParse) -> int:
        dotted = parsed.command.dotted
        given = [source for source in IMAGE_SOURCES if parsed.get(source)]
        if len(given) != 1:
            prefix = f"argument --{given[0]}: " if given else ""
            raise GcloudUsageError(
                dotted,
                f"{prefix}Exactly one of ({' | '.join('--' + s for s in IMAGE_SOURCES)}) must be specified.",
            )
        labels = parse_labels(parsed.get("labels"))
        project = self.project(parsed)
        name = str(parsed.positionals["IMAGE_NAME"])
        # surface/compute/images/create.py: checked in Run, once credentials are loaded
        if parsed.get("source-disk-zone") and not parsed.get("source-disk"):
            raise GcloudError(
                "Invalid value for [--source-disk-zone]: You cannot specify [--source-disk-zone] unless you are "
                "specifying [--source-disk]."
            )
        if given != ["source-disk"]:
            raise GcloudError(f"sandbox: images create --{given[0]} is not simulated")
        disk = str(parsed.get("source-disk"))
        zone = (
            self.zone(parsed, disk)
            if not parsed.get("source-disk-zone")
            else str(parsed.get("source-disk-zone"))
        )
        self._check_image_name(name)
        family = parsed.get("family")
        if family:
            self._check_image_name(str(family), "resource.family")
        self._require_permission("compute.images.create", project, f"projects/{project}/global/images/{name}")
        # the boot disk of a VM is named after it (compute v1 AttachedDiskInitializeParams.diskName)
        vm = self.store.read("vms").get(f"{project}/{zone}/{disk}")
        disk_url = f"projects/{project}/zones/{zone}/disks/{disk}"
        if vm is None:
            raise GcloudError(f"Could not fetch resource:\n - The resource '{disk_url}' was not found")
        if vm["status"] == "RUNNING" and not parsed.get("force"):
            raise GcloudError(
                f"Could not fetch resource:\n - The disk resource '{disk_url}' is already being used by "
                f"'projects/{project}/zones/{zone}/instances/{disk}'"
            )
        key = f"{project}/{name}"
        if key in self.store.read("images"):
            raise GcloudError(
                f"Could not fetch resource:\n - The resource 'projects/{project}/global/images/{name}' already exists"
            )
        target = image_dir(self.layout.root, project, name)
        shutil.rmtree(target, ignore_errors=True)
        _copy_disk(self.layout.vm_dir(disk), target)
        size = sum(path.stat().st_size for path in target.rglob("*") if path.is_file())
        # the insert operation runs while the disk is read (a 200 GB disk: minutes)
        time.sleep(capacity_seconds(load_settings(self.layout).minute_seconds, "image_create"))
        record = {
            "name": name,
            "project": project,
            "family": family,
            "status": "READY",
            "labels": labels,
            "sourceDisk": f"https://www.googleapis.com/compute/v1/{disk_url}",
            "diskSizeGb": re.sub(r"\D", "", str(vm.get("bootDiskSize") or "10")),
            "tpuVfio": bool((vm.get("image") or {}).get("tpuVfio")),
            "archiveSizeBytes": str(size),
            "created": rfc3339(),
            "created_ts": time.time(),
        }
        with self.store.txn() as txn:
            images = txn.doc("images")
            if key in images:
                raise GcloudError(
                    f"Could not fetch resource:\n - The resource 'projects/{project}/global/images/{name}' already exists"
                )
            images[key] = record
            txn.save("images")
        self.err(f"Created [{self._image_url(project, name)}].\n")
        if parsed.get("format"):
            self.out(formatted(self._image_resource(record), parsed.get("format")))
        else:
            # command_lib/compute/images/flags.py LIST_FORMAT
            self.out(
                table(
                    [
                        ["NAME", "PROJECT", "FAMILY", "DEPRECATED", "STATUS"],
                        [name, project, family or "", "", "READY"],
                    ]
                )
            )
        return 0

    def cmd_compute_images_describe(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        name = str(parsed.positionals["IMAGE_NAME"])
        self._require_permission("compute.images.get", project, f"projects/{project}/global/images/{name}")
        record = self.store.read("images").get(f"{project}/{name}")
        if record is None:
            raise GcloudError(
                f"Could not fetch resource:\n - The resource 'projects/{project}/global/images/{name}' was not found"
            )
        self.out(formatted(self._image_resource(record), parsed.get("format")))
        return 0

    def cmd_compute_images_describe_from_family(self, parsed: GcloudParse) -> int:
        project = self.project(parsed)
        family = str(parsed.positionals["IMAGE_NAME"]).removeprefix("family/")
        if parsed.get("zone"):
            raise GcloudError("sandbox: describe-from-family --zone (imageFamilyViews) is not simulated")
        self._require_permission(
            "compute.images.getFromFamily", project, f"projects/{project}/global/images/family/{family}"
        )
        record = self.newest_in_family(project, family)
        if record is None:
            raise GcloudError(
                f"Could not fetch resource:\n - The resource 'projects/{project}/global/images/family/{family}' was not found"
            )
        self.out(formatted(self._image_resource(record), parsed.get("format")))
        return 0
