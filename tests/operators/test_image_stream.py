"""``copy_workload_image`` (issue 53 item 5): the training image copied once per digest into the
run's repository, or nothing at all when ``image_repository`` is empty; preflight's extra checks."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from airflow_provider_tpu_rl.operators.image_stream import CopyWorkloadImageOperator
from airflow_provider_tpu_rl.operators.preflight import TpuRlPreflightOperator
from airflow_provider_tpu_rl.render.command import Command
from airflow_provider_tpu_rl.spec.presets import Runner

DIGEST = "sha256:" + "cd" * 32
SOURCE = "us-docker.pkg.dev/cloud-tpu-images/maxtext-images/tpu_post_training:0.2.4"


class RecordingHook:
    """The hook's ``run_checked``: each command recorded; a tag's describe prints ``DIGEST``."""

    def __init__(self) -> None:
        self.argvs: list[tuple[str, ...]] = []

    def run_checked(self, command: Command, **_: Any) -> Any:
        self.argvs.append(command.argv)
        lines = [DIGEST] if command.argv[1:4] == ("container", "images", "describe") else []
        return SimpleNamespace(output_lines=lines)


def _copy(repo: str | None) -> tuple[dict[str, Any], RecordingHook]:
    op = CopyWorkloadImageOperator(
        task_id="copy_workload_image", project_id="p-123456", location="us-east5", image=SOURCE,
        image_repository=repo,
    )  # fmt: skip
    hook = RecordingHook()
    op._hook = hook  # type: ignore[assignment]
    return op.execute({}), hook  # type: ignore[arg-type]


def test_a_named_repository_gets_the_copy_by_digest_and_training_runs_it() -> None:
    result, hook = _copy("tpu-rl-images")
    assert [argv[1:4] for argv in hook.argvs] == [
        ("container", "images", "describe"),
        ("artifacts", "repositories", "create"),
        ("container", "images", "add-tag"),
    ]
    assert result == {
        "image": f"us-east5-docker.pkg.dev/p-123456/tpu-rl-images/tpu_post_training@{DIGEST}",
        "digest": DIGEST,
    }


def test_no_repository_copies_nothing() -> None:
    result, hook = _copy("")
    assert hook.argvs == []
    assert result == {"image": None, "digest": None}


def _preflight(repo: str | None) -> TpuRlPreflightOperator:
    return TpuRlPreflightOperator(
        task_id="preflight", runner="gke", zone="us-east5-b", project_id="p-123456", image_repository=repo
    )


def test_preflight_checks_the_container_file_system_api_and_the_copys_permissions_when_streaming() -> None:
    streaming, pulling = _preflight("tpu-rl-images"), _preflight("")
    assert "containerfilesystem.googleapis.com" in streaming._services(Runner.GKE)
    assert "containerfilesystem.googleapis.com" not in pulling._services(Runner.GKE)
    assert "artifactregistry.repositories.create" in streaming._permissions(Runner.GKE)
    assert "artifactregistry.repositories.create" not in pulling._permissions(Runner.GKE)
