"""The sandbox's container registry: the images it holds, by tag and by digest.

It holds the post-training image of the GKE jobs (its files are ``machines/pod_image.POD_FILES``)
and the copies ``gcloud container images add-tag`` pushed into the project's Artifact Registry
repositories (the state document ``registry``: ``repositories``, keyed
``project/location/repository``, and ``images``, keyed ``host/path`` -> tag -> digest); any other
reference is unknown to it. A reference names an image by tag (``repo:tag``), by digest
(``repo@sha256:…``) or both (``repo:tag@sha256:…``, the digest decides, as Docker's reference rules
say). A copy keeps its source's manifest, so its digest (add-tag pushes the manifest's bytes:
containerregistry ``v2_2/docker_session_.py`` ``put_manifest``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

POST_TRAINING_IMAGE: Final = "us-docker.pkg.dev/cloud-tpu-images/maxtext-images/tpu_post_training:0.2.4"
REGISTRY_IMAGES: Final = {
    POST_TRAINING_IMAGE: "sha256:" + "5d1c0b1a9e3f" * 5 + "2a4c",
}
# An Artifact Registry Docker host: ``LOCATION-docker.pkg.dev`` (gcloud 528
# api_lib/container/images/util.py ``IsInvalidRegistry``: ``^([a-z0-9-]*)-docker.pkg.dev``).
AR_HOST: Final = re.compile(r"(?P<location>[a-z0-9-]+)-docker\.pkg\.dev")
# What the registry document holds of the copies: host/path -> tag -> digest.
Copies = Mapping[str, Mapping[str, str]]


def image_parts(image: str) -> tuple[str, str, str]:
    """``(registry host, repository path, tag or digest)`` of an image reference."""
    host, _, rest = image.partition("/")
    if "@" in rest:
        path, _, ref = rest.partition("@")
        return host, path.rsplit(":", 1)[0], ref
    path, _, tag = rest.rpartition(":") if ":" in rest else (rest, "", "latest")
    return host, path, tag


def digest_of(image: str, copies: Copies | None = None) -> str | None:
    """The digest the registry has for ``image`` (a tag it holds, or the digest of an image it
    holds; ``copies``: the registry document's ``images``), None when it has no such image."""
    host, path, ref = image_parts(image)
    for held, digest in REGISTRY_IMAGES.items():
        held_host, held_path, held_tag = image_parts(held)
        if (held_host, held_path) == (host, path) and ref in (digest, held_tag):
            return digest
    tags = (copies or {}).get(f"{host}/{path}") or {}
    if ref.startswith("sha256:"):
        return ref if ref in tags.values() else None
    return tags.get(ref)


def ar_repository(image: str) -> tuple[str, str, str] | None:
    """``(project, location, repository)`` of an image in an Artifact Registry Docker repository
    (``LOCATION-docker.pkg.dev/PROJECT/REPOSITORY/IMAGE``), None for any other host or path."""
    host, path, _ = image_parts(image)
    match = AR_HOST.fullmatch(host)
    parts = path.split("/")
    if match is None or len(parts) < 3:
        return None
    return parts[0], match["location"], parts[1]
