"""``BucketUsage.check_writable``: a real, harmless write (a fresh marker, never replacing an
object) and its delete, each refusal of Cloud Storage one line naming the bucket."""

from __future__ import annotations

from typing import Any

import pytest
from google.api_core.exceptions import Forbidden, NotFound

from airflow_provider_tpu_rl.exceptions import ConfigurationError
from airflow_provider_tpu_rl.records.bucket_usage import WRITE_CHECK_PREFIX, BucketUsage

BUCKET = "team-tpu-rl-bucket"


class FakeBlob:
    """A blob of the google-cloud-storage client: what the check calls, recorded."""

    def __init__(self, name: str, calls: list[tuple[str, str, dict[str, Any]]], refuse: dict[str, Exception]):
        self.name = name
        self.generation: int | None = None
        self._calls = calls
        self._refuse = refuse

    def upload_from_string(self, data: Any, **kwargs: Any) -> None:
        self._calls.append(("upload", self.name, kwargs))
        if "upload" in self._refuse:
            raise self._refuse["upload"]
        self.generation = 1712345678901234

    def delete(self, **kwargs: Any) -> None:
        self._calls.append(("delete", self.name, kwargs))
        if "delete" in self._refuse:
            raise self._refuse["delete"]


class FakeClient:
    def __init__(self, refuse: dict[str, Exception] | None = None) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.refuse = refuse or {}

    def bucket(self, name: str) -> Any:
        assert name == BUCKET
        client = self

        class _Bucket:
            def blob(self, blob_name: str) -> FakeBlob:
                return FakeBlob(blob_name, client.calls, client.refuse)

        return _Bucket()


def usage_with(client: FakeClient) -> BucketUsage:
    usage = BucketUsage("tpu_rl_gcp")
    usage._client = client
    return usage


def test_a_writable_bucket_gets_a_fresh_marker_written_and_that_marker_deleted() -> None:
    client = FakeClient()
    usage_with(client).check_writable(BUCKET)
    (upload, delete) = client.calls
    assert upload[0] == "upload"
    assert upload[1].startswith(WRITE_CHECK_PREFIX)
    assert upload[2]["if_generation_match"] == 0  # never replaces an object
    assert delete[:2] == ("delete", upload[1])
    assert delete[2]["if_generation_match"] == 1712345678901234  # only the marker just written
    assert all(call[2]["timeout"] > 0 for call in client.calls)
    other = FakeClient()
    usage_with(other).check_writable(BUCKET)
    assert other.calls[0][1] != upload[1]  # a fresh name each time


CREATE_DENIED = Forbidden(
    "POST https://storage.googleapis.com/upload/storage/v1/b/team-tpu-rl-bucket/o?uploadType=multipart"
    "&ifGenerationMatch=0: airflow@p.iam.gserviceaccount.com does not have storage.objects.create access "
    "to the Google Cloud Storage object. Permission 'storage.objects.create' denied on resource (or it "
    "may not exist)."
)
DELETE_DENIED = Forbidden(
    "DELETE https://storage.googleapis.com/storage/v1/b/team-tpu-rl-bucket/o/tpu-rl%2Fwrite-checks%2Fx"
    "?ifGenerationMatch=1: airflow@p.iam.gserviceaccount.com does not have storage.objects.delete access "
    "to the Google Cloud Storage object.\nPermission 'storage.objects.delete' denied on resource."
)


@pytest.mark.parametrize(
    ("refuse", "permission"),
    [
        ({"upload": CREATE_DENIED}, "storage.objects.create"),
        ({"delete": DELETE_DENIED}, "storage.objects.delete"),
    ],
)
def test_a_refused_write_or_delete_is_one_line_naming_the_bucket_and_the_connection(
    refuse: dict[str, Exception], permission: str
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        usage_with(FakeClient(refuse)).check_writable(BUCKET)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        f"gs://{BUCKET}: the bucket is this project's, but connection tpu_rl_gcp cannot write to it "
        "(Cloud Storage: "
    )
    assert f"Permission '{permission}' denied" in message
    assert "roles/storage.objectAdmin" in message


def test_a_marker_someone_else_removed_first_is_no_refusal() -> None:
    usage_with(FakeClient({"delete": NotFound("gone")})).check_writable(BUCKET)
