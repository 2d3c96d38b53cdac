"""``gcloud container images describe`` and ``add-tag``: the sandbox's registry, read and copied into.

From gcloud 528's sources: surface/container/images/describe.py (GA: the image summary only; the
documented "Find the digest for a tag" is ``--format="value(image_summary.digest)"``) and
api_lib/container/images/util.py ``GetDigestFromName`` (the registry's manifest for the tag; a tag
that resolves prints "Successfully resolved tag to sha256, but it is recommended to use sha256
directly."; one that does not: ``InvalidImageNameError``). It calls the registry, not the
Kubernetes Engine API.

``add-tag SRC DEST...``: surface/container/images/add_tag.py. SRC by tag or digest
(``util.GetDockerImageFromTagOrDigest``, util.py l.342-368: an unqualified name is ``:latest``, a
digest must be ``sha256:``), each DEST a tag (``docker_name.Tag``, strict: a tag of 1-127 of
``_TAG_CHARS``, third_party/containerregistry/client/docker_name_.py l.31, l.76-77, l.193-208) in a
repository with a ``/`` (add_tag.py l.104-108); the prompt "This will tag ... with:" (l.111-116; off
with ``--quiet``); the source's manifest (list) read from its registry and pushed to each tag with
containerregistry's ``docker_session.Push`` (l.87-91, l.118-135), then ``log.CreatedResource``:
"Created [DEST]." (core/log.py l.1167). The push (v2_2/docker_session_.py ``upload`` l.292-331): a
manifest the destination already has under that tag moves nothing ("Tag points to the right
manifest, skipping push."), one it has under another tag moves no blob, else every blob the
destination lacks is uploaded, one at a time (``threads=1``, l.45-50; ``_upload_one`` l.283-290).
Registry errors: a 401/403 is "Access denied: ...", a 404 "Not found: ..." (util.py
``WrapExpectedDockerlessErrors`` l.482-495); the registry's own diagnostic after it is abbreviated
here. Artifact Registry refuses a push into a repository not created (``name unknown: Repository
... not found``; second-hand: quoted in GoogleCloudPlatform/cloud-builders-community issue 588).
"""

from __future__ import annotations

import time

from tpu_rl_sandbox.clis.gcloud.call import GcloudCall
from tpu_rl_sandbox.clis.gcloud.output import GcloudError, formatted
from tpu_rl_sandbox.clis.gcloud.parser import GcloudParse
from tpu_rl_sandbox.world.registry import ar_repository, digest_of, image_parts
from tpu_rl_sandbox.world.settings import load_settings

# docker_name_.py l.30-31
REPOSITORY_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_-./"
TAG_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_-.ABCDEFGHIJKLMNOPQRSTUVWXYZ"
UPLOAD_PERMISSION = "artifactregistry.repositories.uploadArtifacts"


class ContainerImagesCommands(GcloudCall):
    """``gcloud container images``."""

    def registry_copies(self) -> dict[str, dict[str, str]]:
        """The images ``add-tag`` copied (host/path -> tag -> digest)."""
        images: dict[str, dict[str, str]] = self.store.read("registry").get("images") or {}
        return images

    def cmd_container_images_describe(self, parsed: GcloudParse) -> int:
        name = str(parsed.positionals["IMAGE_NAME"])
        reference = name
        last = name.rsplit("/", 1)[-1]
        if "@" not in name and ":" not in last:
            reference = name + ":latest"  # util.GetDockerImageFromTagOrDigest: an untagged name is :latest
        host, path, ref = image_parts(reference)
        digest = digest_of(reference, self.registry_copies())
        if digest is None:
            raise GcloudError(
                f'[{name}] is not found or is not a valid name. Expected tag in the form "base:tag" or "tag" '
                'or digest in the form "sha256:<digest>"'
            )
        if not ref.startswith("sha256:"):
            self.err(
                "WARNING: Successfully resolved tag to sha256, but it is recommended to use sha256 directly.\n"
            )
        summary = {
            "digest": digest,
            "fully_qualified_digest": f"{host}/{path}@{digest}",
            "registry": host,
            "repository": path,
        }
        self.out(formatted({"image_summary": summary}, parsed.get("format")))
        return 0

    def cmd_container_images_add_tag(self, parsed: GcloudParse) -> int:
        src = str(parsed.positionals["SRC_IMAGE"])
        if ":" not in src and "@" not in src:  # util.py IsFullySpecified l.68-69, l.355-356
            src += ":latest"
        if "@" in src and not src.split("@", 1)[1].startswith("sha256:"):
            raise GcloudError(f'[{src}] digest must be of the form "sha256:<digest>".')
        dests = [_dest_tag(str(dest)) for dest in parsed.positionals["DEST_IMAGE"]]
        if not parsed.get("quiet"):
            # console_io.PromptContinue: no terminal here, so the default (yes) after the message
            self.err(
                f"This will tag {src} with:\n" + "\n".join(dests) + "\n\nDo you want to continue (Y/n)?\n"
            )
        copies = self.registry_copies()
        digest = digest_of(src, copies)
        if digest is None:
            raise GcloudError(f"Not found: MANIFEST_UNKNOWN: Failed to fetch {src}")
        for dest in dests:
            self._push(dest, digest)  # a skipped push is logged at INFO only: nothing shown
            self.err(f"Created [{dest}].\n")
        return 0

    def _push(self, dest: str, digest: str) -> bool:
        """Push ``digest``'s manifest to the tag ``dest``; True when its blobs moved (the
        destination had no manifest of that digest)."""
        target = ar_repository(dest)
        if target is None:
            raise GcloudError(f"sandbox: only Artifact Registry destinations are simulated, not {dest}")
        project, location, repository = target
        if UPLOAD_PERMISSION in load_settings(self.layout).denied_permissions:
            raise GcloudError(f'Access denied: {dest}: Permission "{UPLOAD_PERMISSION}" denied on resource')
        host, path, tag = image_parts(dest)
        with self.store.txn() as txn:
            registry = txn.doc("registry")
            if f"{project}/{location}/{repository}" not in registry.get("repositories", {}):
                raise GcloudError(f'Not found: Repository "{repository}" not found')
            tags = registry.setdefault("images", {}).setdefault(f"{host}/{path}", {})
            if tags.get(tag) == digest:  # "Tag points to the right manifest, skipping push."
                moved = False
            else:
                moved = digest not in tags.values()  # a manifest it has: no blob moves, the tag does
                tags[tag] = digest
            registry.setdefault("pushes", []).append(
                {
                    "dest": dest,
                    "digest": digest,
                    "blobs_moved": moved,
                    "by": self.account(),
                    "ts": time.time(),
                }
            )
            txn.save("registry")
        return moved


def _dest_tag(dest: str) -> str:
    """A destination of ``add-tag``: a tag (``docker_name.Tag`` strict) in a repository with a
    ``/``; the errors as gcloud words them (the module's sources)."""
    base, colon, tag = dest.rpartition(":")
    if not colon or "/" in tag:
        base, tag = dest, ""
    if not tag:
        raise GcloudError(f"Invalid tag: {tag}, must be at least 1 characters")
    if len(tag) > 127:
        raise GcloudError(f"Invalid tag: {tag}, must be at most 127 characters")
    if set(tag) - set(TAG_CHARS):
        raise GcloudError(f"Invalid tag: {tag}, acceptable characters include: {TAG_CHARS}")
    repository = base.partition("/")[2]
    if set(repository) - set(REPOSITORY_CHARS):  # docker_name_.py _check_repository l.72-73
        raise GcloudError(
            f"Invalid repository: {repository}, acceptable characters include: {REPOSITORY_CHARS}"
        )
    if "/" not in repository:
        raise GcloudError(
            "Pushing to project root-level images is disabled. Please designate an image within a project, "
            "e.g. gcr.io/project-id/my-image:tag"
        )
    return dest
