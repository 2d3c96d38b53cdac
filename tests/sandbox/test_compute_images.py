"""The fake gcloud's custom images (``clis/gcloud/compute_images.py``) and its tag resolution
(``clis/gcloud/container_images.py``), rule by rule from gcloud 528's sources: a VM's stopped disk
imaged, a VM booted from the image with its files, and the errors the real tool gives."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.sandbox.conftest import Cli
from tests.sandbox.test_vm import ssh
from tpu_rl_sandbox.world.registry import POST_TRAINING_IMAGE, REGISTRY_IMAGES

FAMILY = "tpu-rl-sha256-" + "ab" * 24
GCLOUD = shutil.which("gcloud")


def _vm(cli: Cli, names: dict[str, str], vm: str, *image: str) -> None:
    result = cli.gcloud(
        "compute", "instances", "create", vm, f"--zone={names['zone']}", f"--project={names['project']}",
        "--machine-type=n2-standard-8", *(image or ("--image-project=ubuntu-os-cloud", "--image-family=ubuntu-2204-lts")),
    )  # fmt: skip
    assert result.code == 0, result.text


def _image(cli: Cli, names: dict[str, str], name: str, disk: str, *extra: str) -> object:
    return cli.gcloud(
        "compute", "images", "create", name, f"--source-disk={disk}", f"--source-disk-zone={names['zone']}",
        f"--family={FAMILY}", f"--project={names['project']}", *extra,
    )  # fmt: skip


def test_a_stopped_vms_disk_becomes_an_image_a_new_vm_boots_with(cli: Cli, names: dict[str, str]) -> None:
    _vm(cli, names, "bake")
    code, out, err = ssh(cli, names, "bake", "set -e\necho baked > ~/marker\ncat ~/marker\n")
    assert (code, out) == (0, "baked\n"), err
    # images.insert refuses the disk of a running VM (without --force), with the API's text
    running = _image(cli, names, "img-1", "bake")
    assert running.code == 1  # type: ignore[attr-defined]
    assert (
        f"The disk resource 'projects/{names['project']}/zones/{names['zone']}/disks/bake' is already being "
        f"used by 'projects/{names['project']}/zones/{names['zone']}/instances/bake'"
    ) in running.text  # type: ignore[attr-defined]
    stopped = cli.gcloud(
        "compute", "instances", "stop", "bake", f"--zone={names['zone']}", f"--project={names['project']}"
    )
    assert stopped.code == 0, stopped.text
    assert "Stopping instance(s) bake...done." in stopped.err
    made = _image(cli, names, "img-1", "bake", "--labels=tpu-rl-baked=true")
    assert made.code == 0, made.text  # type: ignore[attr-defined]
    again = _image(cli, names, "img-1", "bake")
    assert f"The resource 'projects/{names['project']}/global/images/img-1' already exists" in again.text  # type: ignore[attr-defined]
    found = cli.gcloud(
        "compute", "images", "describe-from-family", FAMILY, f"--project={names['project']}", "--format=json"
    )
    image = json.loads(found.out)
    assert (image["name"], image["family"], image["status"], image["labels"]) == (
        "img-1", FAMILY, "READY", {"tpu-rl-baked": "true"}
    )  # fmt: skip
    # a VM from the family starts with the disk's files; /tmp is not the disk's (cleared at boot)
    _vm(cli, names, "booted", f"--image-family={FAMILY}", f"--image-project={names['project']}")
    code, out, err = ssh(cli, names, "booted", "cat ~/marker\nls /tmp | grep -c sandbox-tool-calls || true\n")
    assert (code, out.splitlines()) == (0, ["baked", "0"]), err


def test_a_missing_family_or_image_is_the_apis_404_and_a_vm_cannot_boot_from_it(
    cli: Cli, names: dict[str, str]
) -> None:
    project = names["project"]
    missing = cli.gcloud("compute", "images", "describe-from-family", FAMILY, f"--project={project}")
    assert missing.code == 1
    assert f"The resource 'projects/{project}/global/images/family/{FAMILY}' was not found" in missing.err
    described = cli.gcloud("compute", "images", "describe", "nope", f"--project={project}")
    assert f"The resource 'projects/{project}/global/images/nope' was not found" in described.err
    booted = cli.gcloud(
        "compute", "instances", "create", "vm", f"--zone={names['zone']}", f"--project={project}",
        f"--image-family={FAMILY}", f"--image-project={project}",
    )  # fmt: skip
    assert booted.code == 1
    assert (
        "Invalid value for field 'resource.disks[0].initializeParams.sourceImage': "
        f"'https://www.googleapis.com/compute/v1/projects/{project}/global/images/family/{FAMILY}'. "
        "The referenced image resource cannot be found."
    ) in booted.err


def test_a_tag_resolves_to_the_registrys_digest(cli: Cli) -> None:
    digest = REGISTRY_IMAGES[POST_TRAINING_IMAGE]
    resolved = cli.gcloud(
        "container", "images", "describe", POST_TRAINING_IMAGE, "--format=value(image_summary.digest)"
    )
    assert (resolved.code, resolved.out) == (0, digest + "\n")
    assert (
        "Successfully resolved tag to sha256, but it is recommended to use sha256 directly." in resolved.err
    )
    by_digest = cli.gcloud(
        "container", "images", "describe", POST_TRAINING_IMAGE.rsplit(":", 1)[0] + "@" + digest,
        "--format=value(image_summary.fully_qualified_digest)",
    )  # fmt: skip
    assert by_digest.out.strip().endswith("@" + digest)
    assert "resolved tag" not in by_digest.err
    unknown = cli.gcloud("container", "images", "describe", "us-docker.pkg.dev/p/r/nope:1")
    assert unknown.code == 1
    assert "[us-docker.pkg.dev/p/r/nope:1] is not found or is not a valid name." in unknown.err


# The argument errors gcloud gives before it loads credentials: the fake's first line is the real
# one's (gcloud 528, empty configuration, no network).
ARGUMENT_ERRORS = [
    ("compute", "images", "create", "img", "--project=p1"),
    ("compute", "images", "create", "img", "--project=p1", "--source-disk=d", "--source-image=i"),
    ("compute", "images", "describe-from-family", "--project=p1"),
    ("container", "images", "describe"),
    ("compute", "instances", "stop", "--zone=z", "--project=p1"),
    ("compute", "ssh", "--zone=z", "--project=p1"),
]


@pytest.mark.skipif(GCLOUD is None, reason="the Google Cloud CLI is not installed")
@pytest.mark.parametrize("argv", ARGUMENT_ERRORS, ids=lambda a: " ".join(a[:3]))
def test_argument_errors_are_the_real_gclouds(cli: Cli, tmp_path: Path, argv: tuple[str, ...]) -> None:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "CLOUDSDK_CONFIG": str(tmp_path / "gcloud"),
        "CLOUDSDK_CORE_DISABLE_PROMPTS": "1",
    }
    real = subprocess.run(
        [str(GCLOUD), *argv], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    fake = cli.gcloud(*argv)
    assert (fake.code, fake.err.splitlines()[0]) == (real.returncode, real.stderr.splitlines()[0])
