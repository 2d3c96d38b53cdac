"""The fake gcloud's Artifact Registry repository and image copy (``clis/gcloud/artifacts.py``,
``container images add-tag`` in ``clis/gcloud/container_images.py``), rule by rule from gcloud 528's
sources, and the copy landing in the sandbox world's registry by digest, once."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from airflow_provider_tpu_rl.render import image_stream
from tests.sandbox.conftest import Cli, Result
from tpu_rl_sandbox.world.registry import POST_TRAINING_IMAGE, REGISTRY_IMAGES
from tpu_rl_sandbox.world.settings import reset_settings, update_settings

DIGEST = REGISTRY_IMAGES[POST_TRAINING_IMAGE]
SOURCE = POST_TRAINING_IMAGE.rsplit(":", 1)[0] + "@" + DIGEST


@pytest.fixture
def settings(cli: Cli) -> Iterator[None]:
    """Tests that change the shared sandbox's settings put the defaults back afterwards."""
    reset_settings(cli.layout)
    yield
    reset_settings(cli.layout)


def _create(cli: Cli, names: dict[str, str], *argv: str) -> Result:
    return cli.gcloud("artifacts", "repositories", "create", *argv, f"--project={names['project']}")


def _dest(names: dict[str, str], repo: str = "images") -> str:
    copy = image_stream.copy_repository(names["project"], names["region"], repo, POST_TRAINING_IMAGE)
    return f"{copy}:{image_stream.copy_tag(DIGEST)}"


def test_a_repository_is_created_once_and_again_is_the_apis_409(cli: Cli, names: dict[str, str]) -> None:
    region = names["region"]
    made = _create(cli, names, "images", "--repository-format=docker", f"--location={region}")
    assert made.code == 0, made.text
    assert "Create request issued for: [images]" in made.err
    assert made.err.endswith("Created repository [images].\n")
    held = cli.state("registry")["repositories"][f"{names['project']}/{region}/images"]
    assert (held["format"], held["name"]) == (
        "DOCKER", f"projects/{names['project']}/locations/{region}/repositories/images"
    )  # fmt: skip
    again = _create(cli, names, "images", "--repository-format=docker", f"--location={region}")
    assert (again.code, again.err) == (
        1, "ERROR: (gcloud.artifacts.repositories.create) ALREADY_EXISTS: the repository already exists\n"
    )  # fmt: skip
    # the provider's render takes that line for "kept as it is"
    assert any(word in again.err for word in image_stream.REPOSITORY_EXISTS)


def test_a_repository_create_refuses_what_gcloud_refuses(cli: Cli, names: dict[str, str]) -> None:
    no_location = _create(cli, names, "images", "--repository-format=docker")
    assert no_location.code == 1
    assert "Failed to find attribute [location]." in no_location.err
    assert "- set the property `artifacts/location`" in no_location.err
    bad = _create(cli, names, "Bad_R", "--repository-format=docker", "--location=us-east5")
    assert bad.err == (
        "ERROR: (gcloud.artifacts.repositories.create) Names may only contain lowercase letters, numbers, "
        "and hyphens, and must begin with a letter and end with a letter or number.\n"
    )
    no_format = _create(cli, names, "images", "--location=us-east5")
    assert no_format.code == 2
    assert "--repository-format" in no_format.err
    crash = _create(cli, names, "images", "--repository-format=foo", "--location=us-east5")
    assert crash.code == 1
    assert "gcloud crashed (TypeError): No such value for FOO in Enum FormatValueValuesEnum" in crash.err
    assert "repositories" not in cli.state("registry") or not any(
        key.startswith(names["project"] + "/") for key in cli.state("registry")["repositories"]
    )


def test_the_copy_lands_by_digest_once_and_a_second_copy_moves_nothing(
    cli: Cli, names: dict[str, str]
) -> None:
    dest = _dest(names)
    missing = cli.gcloud("container", "images", "add-tag", SOURCE, dest, "--quiet")
    assert (missing.code, missing.err) == (  # AR refuses a push into a repository never created
        1, 'ERROR: (gcloud.container.images.add-tag) Not found: Repository "images" not found\n'
    )  # fmt: skip
    assert (
        _create(cli, names, "images", "--repository-format=docker", f"--location={names['region']}").code == 0
    )
    copied = cli.gcloud("container", "images", "add-tag", SOURCE, dest, "--quiet")
    assert (copied.code, copied.err) == (0, f"Created [{dest}].\n"), copied.text
    again = cli.gcloud("container", "images", "add-tag", SOURCE, dest, "--quiet")
    assert (again.code, again.err) == (0, f"Created [{dest}].\n"), again.text
    pushes = [p for p in cli.state("registry")["pushes"] if p["dest"] == dest]
    assert [(p["digest"], p["blobs_moved"]) for p in pushes] == [(DIGEST, True), (DIGEST, False)]
    # the copy keeps the digest: found by it and by its tag, where the training job runs it
    streamed = image_stream.streamed_image(
        names["project"], names["region"], "images", POST_TRAINING_IMAGE, DIGEST
    )
    for reference in (streamed, dest):
        described = cli.gcloud(
            "container", "images", "describe", reference, "--format=value(image_summary.digest)"
        )
        assert (described.code, described.out.strip()) == (0, DIGEST), described.text


def test_add_tag_refuses_what_gcloud_refuses(cli: Cli, names: dict[str, str], settings: None) -> None:
    assert (
        _create(cli, names, "images", "--repository-format=docker", f"--location={names['region']}").code == 0
    )
    dest = _dest(names)
    no_tag = cli.gcloud("container", "images", "add-tag", SOURCE, dest.rsplit(":", 1)[0], "--quiet")
    assert (
        no_tag.err
        == "ERROR: (gcloud.container.images.add-tag) Invalid tag: , must be at least 1 characters\n"
    )
    root = cli.gcloud("container", "images", "add-tag", SOURCE, "us-east5-docker.pkg.dev/img:t", "--quiet")
    assert "Pushing to project root-level images is disabled." in root.err
    short = cli.gcloud("container", "images", "add-tag", POST_TRAINING_IMAGE.rsplit(":", 1)[0] + "@abc", dest)
    assert 'digest must be of the form "sha256:<digest>".' in short.err
    unknown = cli.gcloud(
        "container", "images", "add-tag", POST_TRAINING_IMAGE.replace("0.2.4", "9.9.9"), dest
    )
    assert unknown.code == 1
    assert "(gcloud.container.images.add-tag) Not found: MANIFEST_UNKNOWN" in unknown.err
    prompted = cli.gcloud("container", "images", "add-tag", SOURCE, dest)  # no --quiet, no terminal
    assert prompted.code == 0
    assert f"This will tag {SOURCE} with:\n{dest}\n" in prompted.err
    update_settings(cli.layout, denied_permissions=("artifactregistry.repositories.uploadArtifacts",))
    denied = cli.gcloud(
        "container", "images", "add-tag", SOURCE, _dest(names).replace("sha256-", "x-"), "--quiet"
    )
    assert denied.code == 1
    assert "Access denied:" in denied.err
    update_settings(cli.layout, denied_permissions=("artifactregistry.repositories.create",))
    refused = _create(cli, names, "other", "--repository-format=docker", f"--location={names['region']}")
    assert (
        "PERMISSION_DENIED: Permission 'artifactregistry.repositories.create' denied on resource"
        in refused.err
    )


def test_a_disabled_artifact_registry_api_fails_the_create(
    cli: Cli, names: dict[str, str], settings: None
) -> None:
    update_settings(cli.layout, disabled_services=("artifactregistry.googleapis.com",))
    refused = _create(cli, names, "images", "--repository-format=docker", f"--location={names['region']}")
    assert refused.code == 1
    assert "Artifact Registry API has not been used in project" in refused.err
