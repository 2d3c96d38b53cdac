"""Uniform file access for simulated workloads: ``gs://`` objects and a machine's local disk."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tpu_rl_sandbox.apis.gcs_client import GcsApi, GcsError, split_gs_url

ORBAX_COMMIT_MARKER = "commit_success.txt"
ORBAX_TMP_SUFFIX = ".orbax-checkpoint-tmp-"


class StorageError(Exception):
    """A read or write failed; ``str(error)`` is what the workload would print."""


class Store(Protocol):
    """Files addressed by absolute paths (``gs://b/k`` or ``/dev/shm/x``)."""

    def write(self, path: str, data: bytes) -> None: ...

    def read(self, path: str) -> bytes | None: ...

    def exists(self, path: str) -> bool: ...

    def is_dir(self, path: str) -> bool: ...

    def list_files(self, path: str) -> list[str]: ...


def join(base: str, *parts: str) -> str:
    """Join path pieces with single slashes (works for ``gs://`` and POSIX paths)."""
    result = base.rstrip("/")
    for part in parts:
        result += "/" + part.strip("/")
    return result


def parent(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[0]


def basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


class GcsStore:
    """Objects in the emulator; writes can be denied to mimic a missing IAM role."""

    def __init__(
        self,
        api: GcsApi,
        identity: str = "",
        can_write: Callable[[str], bool] | None = None,
        denied_detail: str = "",
    ) -> None:
        self.api = api
        self.identity = identity
        self._can_write = can_write
        self._denied_detail = denied_detail

    def write(self, path: str, data: bytes) -> None:
        bucket, key = split_gs_url(path)
        if self._can_write is not None and not self._can_write(bucket):
            detail = self._denied_detail or (
                f"{self.identity} does not have storage.objects.create access to the Google Cloud Storage "
                "object. Permission 'storage.objects.create' denied on resource (or it may not exist)."
            )
            raise StorageError(
                "google.api_core.exceptions.Forbidden: 403 POST "
                f"https://storage.googleapis.com/upload/storage/v1/b/{bucket}/o?uploadType=resumable: {detail}"
            )
        try:
            self.api.upload(bucket, key, data)
        except GcsError as error:
            if error.status == 404:
                raise StorageError(
                    f"google.api_core.exceptions.NotFound: 404 POST https://storage.googleapis.com/upload/"
                    f"storage/v1/b/{bucket}/o?uploadType=resumable: The specified bucket does not exist."
                ) from None
            raise StorageError(f"google.api_core.exceptions.GoogleAPICallError: {error}") from None

    def read(self, path: str) -> bytes | None:
        bucket, key = split_gs_url(path)
        try:
            return self.api.download(bucket, key)
        except GcsError as error:
            if error.status == 404:
                return None
            raise StorageError(str(error)) from None

    def exists(self, path: str) -> bool:
        bucket, key = split_gs_url(path)
        try:
            return self.api.exists(bucket, key)
        except GcsError:
            return False

    def is_dir(self, path: str) -> bool:
        bucket, key = split_gs_url(path)
        prefix = key.rstrip("/") + "/" if key.strip("/") else ""
        try:
            return next(iter(self.api.iter_objects(bucket, prefix)), None) is not None
        except GcsError:
            return False

    def list_files(self, path: str) -> list[str]:
        bucket, key = split_gs_url(path)
        prefix = key.rstrip("/") + "/" if key.strip("/") else ""
        try:
            return [f"gs://{bucket}/{info.name}" for info in self.api.iter_objects(bucket, prefix)]
        except GcsError:
            return []

    def bucket_exists(self, bucket: str) -> bool:
        return self.api.get_bucket(bucket) is not None


class LocalStore:
    """A machine's file system mapped into a host folder (``/dev/shm/x`` -> ``<root>/dev/shm/x``)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def host_path(self, path: str) -> Path:
        clean = os.path.normpath("/" + path.lstrip("/"))
        return self.root / clean.lstrip("/")

    def write(self, path: str, data: bytes) -> None:
        target = self.host_path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    def read(self, path: str) -> bytes | None:
        target = self.host_path(path)
        return target.read_bytes() if target.is_file() else None

    def exists(self, path: str) -> bool:
        return self.host_path(path).is_file()

    def is_dir(self, path: str) -> bool:
        return self.host_path(path).is_dir()

    def list_files(self, path: str) -> list[str]:
        base = self.host_path(path)
        if not base.is_dir():
            return []
        found: list[str] = []
        for file in sorted(base.rglob("*")):
            if file.is_file():
                found.append("/" + str(file.relative_to(self.root)))
        return found

    def rename_dir(self, src: str, dst: str) -> None:
        target = self.host_path(dst)
        if target.exists():
            shutil.rmtree(target)
        self.host_path(src).rename(target)


@dataclass
class Router:
    """Picks the store for a path: ``gs://`` goes to GCS, anything else to the local machine."""

    gcs: GcsStore
    local: LocalStore | None

    def store(self, path: str) -> Store:
        if path.startswith("gs://"):
            return self.gcs
        if self.local is None:
            raise StorageError(f"local path {path} is not reachable here")
        return self.local


class CheckpointWriter:
    """Writes one Orbax step directory the way Orbax finalizes it.

    On GCS the files go straight to ``<step>/`` and ``commit_success.txt`` is written last. On a
    local disk everything goes to ``<step>.orbax-checkpoint-tmp-<ts>/`` which is renamed to
    ``<step>/`` at the end (so a reader never sees a half-written local step directory).
    """

    def __init__(self, router: Router, step_dir: str) -> None:
        self.router = router
        self.step_dir = step_dir.rstrip("/")
        self.on_gcs = self.step_dir.startswith("gs://")
        self.work_dir = (
            self.step_dir if self.on_gcs else f"{self.step_dir}{ORBAX_TMP_SUFFIX}{int(time.time())}"
        )

    def write(self, relative: str, data: bytes) -> None:
        self.router.store(self.work_dir).write(join(self.work_dir, relative), data)

    def commit(self) -> None:
        if self.on_gcs:
            self.router.gcs.write(
                join(self.step_dir, ORBAX_COMMIT_MARKER), b"Checkpoint commit was successful!"
            )
            return
        local = self.router.local
        assert local is not None
        local.rename_dir(self.work_dir, self.step_dir)


def checkpoint_problem(router: Router, items_path: str) -> str | None:
    """Why ``items_path`` (``.../<step>/<item>``) is not a loadable checkpoint, or ``None``."""
    items_path = items_path.rstrip("/")
    store = router.store(items_path)
    if not store.exists(join(items_path, "_METADATA")):
        return f"FileNotFoundError: Checkpoint at {items_path} not found."
    step_dir = parent(items_path)
    if items_path.startswith("gs://") and not store.exists(join(step_dir, ORBAX_COMMIT_MARKER)):
        return f"ValueError: Found incomplete checkpoint at {step_dir}."
    return None
