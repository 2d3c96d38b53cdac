"""``ensure_bucket``: a bucket of the run's project is kept when the connection can write to it; a
name another project holds is refused in one line (Cloud Storage's 409 "not available", as the
fake gcloud answers it), and so is a bucket of ours the connection cannot write to."""

from __future__ import annotations

from typing import Any

import pytest

from airflow_provider_tpu_rl.compat import AirflowFailException
from airflow_provider_tpu_rl.operators.gke import EnsureBucketOperator, bucket_name_taken
from airflow_provider_tpu_rl.records.bucket_usage import BUCKET_OWNER_OBJECT, WRITE_CHECK_PREFIX
from tests.support.compat import capture_task_logs
from tests.support.sandbox_run import SandboxRun

RUN_ID = "manual__2026-03-01T00:00:00+00:00"


def _ensure(sb: SandboxRun, project: str) -> str:
    conf = sb.gke_conf(project=project)
    operator = sb.operator(EnsureBucketOperator, conf=conf, run_id=RUN_ID, task_id="ensure_bucket")
    result: str = operator.execute(sb.context(operator, conf, run_id=RUN_ID))
    return result


def test_a_bucket_name_another_project_holds_is_refused_in_one_line(sb: SandboxRun) -> None:
    other = f"other-{sb.suffix}"
    assert _ensure(sb, other) == f"gs://{sb.bucket}"  # another user's project creates it first
    owner_record = sb.objects(prefix=BUCKET_OWNER_OBJECT)
    with pytest.raises(AirflowFailException) as refused:
        _ensure(sb, sb.project)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"gs://{sb.bucket}: the bucket name is taken by another project")
    assert sb.project in message
    # nothing of this run is written to the other project's bucket
    assert sb.objects(prefix=BUCKET_OWNER_OBJECT) == owner_record


def test_a_bucket_of_the_runs_own_project_is_kept_as_is(sb: SandboxRun) -> None:
    assert _ensure(sb, sb.project) == f"gs://{sb.bucket}"
    with capture_task_logs() as logs:
        assert _ensure(sb, sb.project) == f"gs://{sb.bucket}"
    logged = "\n".join(str(entry.get("event")) for entry in logs)
    assert (
        f"gs://{sb.bucket} exists in project {sb.project} already (Cloud Storage: you own it) and "
        "google_cloud_default can write to it: kept as is"
    ) in logged
    assert sb.objects(prefix=WRITE_CHECK_PREFIX) == []  # the write check's marker is gone


def test_a_bucket_of_ours_the_connection_cannot_write_to_is_refused_in_one_line(
    sb: SandboxRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cloud Storage's "you already own it" is the project's; the connection's object permissions
    are another matter (fake-gcs-server authorizes everything, so its 403 is given here, in the
    real API's words)."""
    from google.api_core.exceptions import Forbidden
    from google.cloud.storage import Blob

    assert _ensure(sb, sb.project) == f"gs://{sb.bucket}"
    upload = Blob.upload_from_string

    def refused(blob: Blob, *args: Any, **kwargs: Any) -> Any:
        if blob.name.startswith(WRITE_CHECK_PREFIX):
            raise Forbidden(
                f"POST https://storage.googleapis.com/upload/storage/v1/b/{sb.bucket}/o?uploadType="
                "multipart&ifGenerationMatch=0: airflow@p.iam.gserviceaccount.com does not have "
                "storage.objects.create access to the Google Cloud Storage object. Permission "
                "'storage.objects.create' denied on resource (or it may not exist)."
            )
        return upload(blob, *args, **kwargs)

    monkeypatch.setattr(Blob, "upload_from_string", refused)
    with pytest.raises(AirflowFailException) as failed:
        _ensure(sb, sb.project)
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith(
        f"gs://{sb.bucket}: the bucket is this project's, but connection google_cloud_default cannot "
        "write to it (Cloud Storage: POST https://"
    )
    assert "Permission 'storage.objects.create' denied" in message
    assert message.endswith(
        "grant it roles/storage.objectAdmin on the bucket, or set bucket to one it can write to"
    )


@pytest.mark.parametrize(
    ("output", "taken"),
    [
        (
            "ERROR: (gcloud.storage.buckets.create) HTTPError 409: The requested bucket name is not "
            "available. The bucket namespace is shared by all users of the system.",
            True,
        ),
        ("ERROR: (gcloud.storage.buckets.create) HTTPError 409: Sorry, that name is not available.", True),
        (
            "ERROR: (gcloud.storage.buckets.create) HTTPError 409: Your previous request to create the "
            "named bucket succeeded and you already own it.",
            False,
        ),
        # a bucket whose name holds "409", refused for another reason
        ("Creating gs://b409/...\nERROR: (gcloud.storage.buckets.create) HTTPError 403: denied", False),
    ],
)
def test_only_a_409_that_is_not_ours_is_a_taken_name(output: str, taken: bool) -> None:
    assert bucket_name_taken(output) is taken
