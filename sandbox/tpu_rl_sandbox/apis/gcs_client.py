"""A tiny GCS JSON-API client for the fakes (stdlib only, fast to import).

The fakes run as short-lived CLI processes; importing google-cloud-storage costs about a
second each time, so they talk to fake-gcs-server over its JSON API directly. Tests and the
lead can use :func:`tpu_rl_sandbox.apis.gcs_emulator.gcs_client` for the real client.
"""

from __future__ import annotations

import contextlib
import json
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


class GcsError(Exception):
    """An HTTP error from the emulator, with GCS's status code and message."""

    def __init__(self, status: int, message: str, url: str = "") -> None:
        super().__init__(f"{status} {message}")
        self.status = status
        self.message = message
        self.url = url


@dataclass(frozen=True)
class ObjectInfo:
    """Metadata of one object."""

    bucket: str
    name: str
    size: int
    updated: str


def split_gs_url(url: str) -> tuple[str, str]:
    """``gs://bucket/a/b`` -> ``("bucket", "a/b")``."""
    if not url.startswith("gs://"):
        raise ValueError(f"not a gs:// URL: {url}")
    rest = url[len("gs://") :]
    bucket, _, key = rest.partition("/")
    return bucket, key


class GcsApi:
    """Calls against ``http://host:port`` (fake-gcs-server)."""

    def __init__(self, endpoint: str, timeout: float = 30.0) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.timeout = timeout

    # -- plumbing ---------------------------------------------------------------------
    def _request(
        self,
        method: str,
        path: str,
        query: dict[str, str] | None = None,
        body: bytes | None = None,
        content_type: str = "application/json",
    ) -> bytes:
        import urllib.error  # here, not at the top: the fake tools' commands that touch no bucket
        import urllib.request  # start without the HTTP client (a tenth of a second per call)

        url = self.endpoint + path
        if query:
            url += "?" + urllib.parse.urlencode(query)
        request = urllib.request.Request(url, data=body, method=method)  # noqa: S310 (local emulator)
        if body is not None:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:  # noqa: S310
                return bytes(response.read())
        except urllib.error.HTTPError as error:
            raw = error.read().decode("utf-8", "replace")
            message = raw
            with contextlib.suppress(ValueError, KeyError, TypeError):
                message = json.loads(raw)["error"]["message"]
            raise GcsError(error.code, message.strip(), url) from None

    def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        raw = self._request(method, path, **kwargs)
        return json.loads(raw) if raw else {}

    @staticmethod
    def _obj_path(bucket: str, name: str) -> str:
        return f"/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o/{urllib.parse.quote(name, safe='')}"

    # -- buckets ----------------------------------------------------------------------
    def list_buckets(self) -> list[dict[str, Any]]:
        return list(self._json("GET", "/storage/v1/b", query={"project": "sandbox"}).get("items", []))

    def get_bucket(self, bucket: str) -> dict[str, Any] | None:
        try:
            return self._json("GET", f"/storage/v1/b/{urllib.parse.quote(bucket, safe='')}")
        except GcsError as error:
            if error.status == 404:
                return None
            raise

    def create_bucket(self, bucket: str, location: str | None = None) -> dict[str, Any]:
        payload: dict[str, Any] = {"name": bucket}
        if location:
            payload["location"] = location.upper()
        return self._json(
            "POST", "/storage/v1/b", query={"project": "sandbox"}, body=json.dumps(payload).encode()
        )

    def delete_bucket(self, bucket: str) -> None:
        self._request("DELETE", f"/storage/v1/b/{urllib.parse.quote(bucket, safe='')}")

    # -- objects ----------------------------------------------------------------------
    def iter_objects(self, bucket: str, prefix: str = "") -> Iterator[ObjectInfo]:
        """All objects whose name starts with ``prefix`` (recursive)."""
        token = ""
        while True:
            query = {"prefix": prefix} if prefix else {}
            if token:
                query["pageToken"] = token
            page = self._json("GET", f"/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o", query=query)
            for item in page.get("items", []):
                yield ObjectInfo(bucket, item["name"], int(item.get("size", 0)), item.get("updated", ""))
            token = page.get("nextPageToken", "")
            if not token:
                return

    def list_level(self, bucket: str, prefix: str) -> tuple[list[ObjectInfo], list[str]]:
        """Objects and sub-"folders" directly under ``prefix`` (delimiter ``/``)."""
        objects: list[ObjectInfo] = []
        prefixes: list[str] = []
        token = ""
        while True:
            query = {"delimiter": "/"}
            if prefix:
                query["prefix"] = prefix
            if token:
                query["pageToken"] = token
            page = self._json("GET", f"/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o", query=query)
            for item in page.get("items", []):
                objects.append(
                    ObjectInfo(bucket, item["name"], int(item.get("size", 0)), item.get("updated", ""))
                )
            prefixes.extend(page.get("prefixes", []))
            token = page.get("nextPageToken", "")
            if not token:
                return objects, sorted(set(prefixes))

    def upload(self, bucket: str, name: str, data: bytes) -> None:
        self._request(
            "POST",
            f"/upload/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o",
            query={"uploadType": "media", "name": name},
            body=data,
            content_type="application/octet-stream",
        )

    def download(self, bucket: str, name: str) -> bytes:
        return self._request("GET", self._obj_path(bucket, name), query={"alt": "media"})

    def exists(self, bucket: str, name: str) -> bool:
        try:
            self._request("GET", self._obj_path(bucket, name))
        except GcsError as error:
            if error.status == 404:
                return False
            raise
        return True

    def delete(self, bucket: str, name: str) -> None:
        self._request("DELETE", self._obj_path(bucket, name))
