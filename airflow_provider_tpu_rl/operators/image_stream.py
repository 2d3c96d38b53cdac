"""The GKE training image copied into the run's own Artifact Registry repository, for image streaming."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.providers.common.compat.sdk import Context

from airflow_provider_tpu_rl.exceptions import ConfigurationError
from airflow_provider_tpu_rl.operators.base import GclusterBaseOperator, fail_fast
from airflow_provider_tpu_rl.render import boot_image, image_stream
from airflow_provider_tpu_rl.spec import rules
from airflow_provider_tpu_rl.spec.pipeline import image_repository


class CopyWorkloadImageOperator(GclusterBaseOperator):
    """Copy the training image, by digest, into the run's own Artifact Registry repository (created
    when missing), so the TPU node pool streams it (render/image_stream.py says why and how).

    Once per digest: a copy already there moves nothing. The repository and its copies are shared
    by every run of the project and never deleted by one (like the TPU VM's baked image).

    Returns ``{"image": <the copy, by digest> or None, "digest": ...}``; ``image`` is None when
    ``image_repository`` is empty (no streaming: training runs ``image`` itself).

    :param image: the training image (a tag is resolved to its digest at its registry first).
    :param image_repository: the repository's ID in ``project_id`` and ``location``; empty: no copy.
    """

    template_fields: Sequence[str] = ("project_id", "location", "image", "image_repository")

    def __init__(
        self,
        *,
        project_id: str | None = None,
        location: str,
        image: str,
        image_repository: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.project_id = project_id
        self.location = location
        self.image = image
        self.image_repository = image_repository

    @fail_fast
    def execute(self, context: Context) -> dict[str, Any]:
        repo = image_repository(self.image_repository)
        if not repo:
            self.log.info("image_repository is empty: the TPU node pool pulls %s whole", self.image)
            return {"image": None, "digest": None}
        project = self.resolve_project_id()
        region = rules.region("location", self.location)
        image = rules.image("image", self.image)
        digest = boot_image.pinned_digest(image) or self.resolve_digest(image)
        self.hook.run_checked(image_stream.create_repository(project, region, repo))
        self.hook.run_checked(image_stream.copy_image(image, digest, project, region, repo))
        streamed = image_stream.streamed_image(project, region, repo, image, digest)
        self.log.info("The TPU node pool streams %s (a copy of %s)", streamed, image)
        return {"image": streamed, "digest": digest}

    def resolve_digest(self, image: str) -> str:
        """The digest ``image``'s tag names now, from its registry."""
        result = self.hook.run_checked(
            boot_image.resolve_digest(image, image_stream.DIGEST_PURPOSE), log_output=False
        )
        digest = boot_image.parse_digest(result.output_lines)
        if digest is None:
            raise ConfigurationError(
                f"the registry gave no digest for {image}: {' '.join(result.output_lines[-2:])}"
            )
        return digest
