"""The GKE training image copied into the run's own Artifact Registry repository, streamed there.

GKE's image streaming (the toolkit's ``gke-node-pool`` ``enable_gcfs``) needs the image in an
Artifact Registry repository and, for a node pool with a custom service account (the blueprint's
``gke-np-sa``), Service Usage Consumer for that account **in the project hosting the image**
(docs.cloud.google.com/kubernetes-engine/docs/how-to/image-streaming, "Requirements"; states). The
post-training image is in Google's ``cloud-tpu-images`` project, where no user can grant it; so the
image is copied, once per digest, into a Docker repository of the run's own project (created when
missing) and the training job runs the copy by that digest.

The copy is ``gcloud container images add-tag SOURCE@DIGEST DEST:TAG`` on the Airflow worker (gcloud
528, ``surface/container/images/add_tag.py`` l.87-135: it reads the source's manifest (list) from
its registry and pushes it to each destination tag with containerregistry's ``docker_session.Push``,
so the copy keeps the manifest's bytes and its digest; ``upload``, ``v2_2/docker_session_.py``
l.292-331, skips blobs the destination has and returns at once when the tag already names that
manifest: a second run copies nothing). Its blobs pass through the worker one at a time (``Push``'s
default ``threads=1``, l.45-50; ``_upload_one`` l.283-290 -> ``patch_upload`` l.157-187 sends
``_get_blob`` l.119-122, ``image.blob(digest)``: ``v2_2/docker_image_.py`` l.362-371 reads the
whole layer from the source registry into memory, ``_content`` l.250-271): the worker needs memory
for the image's largest compressed layer and moves the image's bytes once per digest.
"""

from __future__ import annotations

from typing import Final

from airflow_provider_tpu_rl.render.boot_image import DIGEST, repository
from airflow_provider_tpu_rl.render.command import Command

# What the plan shows for a digest known only once a tag is resolved at run time.
PLAN_DIGEST: Final = "sha256:<digest>"
# The plan's stand-in where a spec needs a well-formed digest (the training job's image) but the
# tag is resolved only at run time: all zeros, never a real image's.
PLAN_DIGEST_STANDIN: Final = "sha256:" + "0" * 64
# Why the copy resolves a tag (the plan's and the log's words).
DIGEST_PURPOSE: Final = "the copy for image streaming is made and run by digest"
# ``artifacts repositories create`` of an existing repository: the API's 409 (google.rpc.Code
# ALREADY_EXISTS), printed by gcloud as "ALREADY_EXISTS: the repository already exists".
REPOSITORY_EXISTS: Final = ("ALREADY_EXISTS",)
# The copies' tag prefix: a Docker tag is [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}; "sha256-" and the 64
# hex digits make 71 characters.
TAG_PREFIX: Final = "sha256-"


def registry_host(region: str) -> str:
    """The Docker host of an Artifact Registry repository in ``region`` (``REGION-docker.pkg.dev``)."""
    return f"{region}-docker.pkg.dev"


def copy_repository(project: str, region: str, repo: str, image: str) -> str:
    """Where the copy of ``image`` lives: the run's repository, the source's last path element."""
    return f"{registry_host(region)}/{project}/{repo}/{repository(image).rsplit('/', 1)[-1]}"


def copy_tag(digest: str) -> str:
    """The copy's tag: its digest, spelled as a tag (``add-tag`` pushes to tags only)."""
    if digest != PLAN_DIGEST and not DIGEST.fullmatch(digest):
        raise ValueError(f"not an image digest: {digest!r}")
    return TAG_PREFIX + digest.removeprefix("sha256:")


def streamed_image(project: str, region: str, repo: str, image: str, digest: str) -> str:
    """The reference the training job runs: the copy, by digest (the copy keeps the digest)."""
    return f"{copy_repository(project, region, repo, image)}@{digest}"


def create_repository(project: str, region: str, repo: str) -> Command:
    """The run's Docker repository; an existing one (:data:`REPOSITORY_EXISTS`) is kept as it is."""
    return Command(
        ("gcloud", "artifacts", "repositories", "create", repo, "--repository-format=docker",
         f"--location={region}", f"--project={project}",
         "--description=tpu-rl: training images copied for GKE image streaming (kept across runs)"),
        ok_if_output_contains=REPOSITORY_EXISTS,
        description=f"create the Artifact Registry repository {repo} in {region} (an existing one is kept)",
    )  # fmt: skip


def copy_image(image: str, digest: str, project: str, region: str, repo: str) -> Command:
    """Copy the image (by digest) into the run's repository; nothing moves when it is there."""
    source = f"{repository(image)}@{digest}"
    dest = f"{copy_repository(project, region, repo, image)}:{copy_tag(digest)}"
    return Command(
        ("gcloud", "container", "images", "add-tag", source, dest, "--quiet"),
        description=f"copy {source} to {dest} (once per digest: an existing copy is kept)",
    )
