"""``gcloud container images describe``: a tag resolved to its digest at the sandbox's registry.

From gcloud 528's sources: surface/container/images/describe.py (GA: the image summary only; the
documented "Find the digest for a tag" is ``--format="value(image_summary.digest)"``) and
api_lib/container/images/util.py ``GetDigestFromName`` (the registry's manifest for the tag; a tag
that resolves prints "Successfully resolved tag to sha256, but it is recommended to use sha256
directly."; one that does not: ``InvalidImageNameError``). It calls the registry, not the
Kubernetes Engine API.
"""

from __future__ import annotations

from tpu_rl_sandbox.clis.gcloud.call import GcloudCall
from tpu_rl_sandbox.clis.gcloud.output import GcloudError, formatted
from tpu_rl_sandbox.clis.gcloud.parser import GcloudParse
from tpu_rl_sandbox.world.registry import digest_of, image_parts


class ContainerImagesCommands(GcloudCall):
    """``gcloud container images``."""

    def cmd_container_images_describe(self, parsed: GcloudParse) -> int:
        name = str(parsed.positionals["IMAGE_NAME"])
        reference = name
        last = name.rsplit("/", 1)[-1]
        if "@" not in name and ":" not in last:
            reference = name + ":latest"  # util.GetDockerImageFromTagOrDigest: an untagged name is :latest
        host, path, ref = image_parts(reference)
        digest = digest_of(reference)
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
