"""The sandbox's container registry: the images it holds, by tag and by digest.

It holds one image, the post-training image of the GKE jobs (its files are
``machines/pod_image.POD_FILES``); any other reference is unknown to it. A reference names an image
by tag (``repo:tag``), by digest (``repo@sha256:…``) or both (``repo:tag@sha256:…``, the digest
decides, as Docker's reference rules say).
"""

from __future__ import annotations

from typing import Final

POST_TRAINING_IMAGE: Final = "us-docker.pkg.dev/cloud-tpu-images/maxtext-images/tpu_post_training:0.2.4"
REGISTRY_IMAGES: Final = {
    POST_TRAINING_IMAGE: "sha256:" + "5d1c0b1a9e3f" * 5 + "2a4c",
}


def image_parts(image: str) -> tuple[str, str, str]:
    """``(registry host, repository path, tag or digest)`` of an image reference."""
    host, _, rest = image.partition("/")
    if "@" in rest:
        path, _, ref = rest.partition("@")
        return host, path.rsplit(":", 1)[0], ref
    path, _, tag = rest.rpartition(":") if ":" in rest else (rest, "", "latest")
    return host, path, tag


def digest_of(image: str) -> str | None:
    """The digest the registry has for ``image`` (a tag it holds, or the digest of an image it
    holds), None when it has no such image."""
    host, path, ref = image_parts(image)
    for held, digest in REGISTRY_IMAGES.items():
        held_host, held_path, held_tag = image_parts(held)
        if (held_host, held_path) == (host, path) and ref in (digest, held_tag):
            return digest
    return None
