"""Uniform file access for simulated workloads: ``gs://`` objects and a machine's local disk."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tpu_rl_sandbox.apis.gcs_client import GcsApi, GcsError, split_gs_url

ORBAX_COMMIT_MARKER = "commit_success.txt"
ORBAX_TMP_SUFFIX = ".orbax-checkpoint-tmp"


class StorageError(Exception):
    """A read or write failed; ``str(error)`` is what the workload would print."""


class Store(Protocol):
    """Files addressed by absolute paths (``gs://b/k`` or ``/dev/shm/x``)."""

    def write(self, path: str, data: bytes) -> None: ...

    def read(self, path: str) -> bytes | None: ...

    def exists(self, path: str) -> bool: ...

    def is_dir(self, path: str) -> bool: ...

    def list_files(self, path: str) -> list[str]: ...

    def delete(self, path: str) -> None: ...


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

    def delete(self, path: str) -> None:
        bucket, key = split_gs_url(path)
        if self._can_write is not None and not self._can_write(bucket):
            raise StorageError(
                "google.api_core.exceptions.Forbidden: 403 DELETE "
                f"https://storage.googleapis.com/storage/v1/b/{bucket}/o/{key}: "
                f"{self._denied_detail or 'Permission storage.objects.delete denied.'}"
            )
        try:
            self.api.delete(bucket, key)
        except GcsError as error:
            raise StorageError(f"google.api_core.exceptions.GoogleAPICallError: {error}") from None


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

    def delete(self, path: str) -> None:
        self.host_path(path).unlink(missing_ok=True)

    def make_dir(self, path: str) -> None:
        self.host_path(path).mkdir(parents=True, exist_ok=True)

    def rename_dir(self, src: str, dst: str) -> None:
        target = self.host_path(dst)
        if target.exists():
            import shutil  # here: only a rename onto a folder removes one

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


# What Orbax 0.12 (orbax-checkpoint 0.12.0 / 0.12.2, MaxText 0.2.3 / 0.2.4) names and writes; checked
# against its real output by the real-converter leg (tests/fixtures/maxtext/real_layouts.json).
PYTREE_HANDLER = "orbax.checkpoint._src.handlers.pytree_checkpoint_handler.PyTreeCheckpointHandler"


def commit_text(folder: str) -> bytes:
    """A ``commit_success.txt``'s content (``CommitFileTemporaryPath.finalize``, _src/path/atomicity.py)."""
    return f"Checkpoint commit was successful to {folder.rstrip('/')}".encode()


class CheckpointWriter:
    """Writes one Orbax step directory the way Orbax 0.12 writes and finalizes it.

    The atomicity is picked from the path alone, for the step and for each item
    (``_src/path/atomicity_defaults.py``: ``gs://`` -> ``CommitFileTemporaryPath``, else
    ``AtomicRenameTemporaryPath``):

    * on GCS everything goes straight to ``<step>/``; at the commit each item gets its
      ``<step>/<item>/commit_success.txt``, then the step its own, last;
    * on a local disk the step is written to ``<step>.orbax-checkpoint-tmp/`` (no timestamp:
      ``_get_tmp_directory``, ``TMP_DIR_SUFFIX``) and each item inside it to
      ``<item>.orbax-checkpoint-tmp/``; the commit renames each item, then the step; no markers.

    ``_CHECKPOINT_METADATA`` is the step's first file (``begin``: the init timestamp), written again
    when the items are saved (``saved``: their handlers) and at the commit (its timestamp), before
    the step is finalized.
    """

    def __init__(self, router: Router, step_dir: str, clock: Callable[[], float] = time.time) -> None:
        self.router = router
        self.step_dir = step_dir.rstrip("/")
        self.on_gcs = self.step_dir.startswith("gs://")
        self.work_dir = self.step_dir if self.on_gcs else self.step_dir + ORBAX_TMP_SUFFIX
        self.clock = clock
        self.items: list[str] = []
        self.metadata: dict[str, object] = {}

    def item_dir(self, item: str) -> str:
        return join(self.work_dir, item if self.on_gcs else item + ORBAX_TMP_SUFFIX)

    def _write_metadata(self, **changes: object) -> None:
        self.metadata.update(changes)
        path = join(self.work_dir, "_CHECKPOINT_METADATA")
        self.router.store(path).write(path, json.dumps(self.metadata).encode())

    def begin(self, items: list[str]) -> None:
        """Create the step: its ``_CHECKPOINT_METADATA`` with the init timestamp, then (on a local
        disk) each item's temporary folder (``atomicity.create_all``)."""
        self.items = list(items)
        self.metadata = {
            "item_handlers": None,
            "metrics": {},
            "performance_metrics": {},
            "init_timestamp_nsecs": int(self.clock() * 1e9),
            "commit_timestamp_nsecs": None,
            "custom_metadata": {},
        }
        self._write_metadata()
        if not self.on_gcs:
            local = self.router.local
            assert local is not None
            for item in self.items:
                local.make_dir(self.item_dir(item))

    def write(self, item: str, relative: str, data: bytes) -> None:
        """A file of ``item`` (one of ``begin``'s)."""
        assert item in self.items, item
        path = join(self.item_dir(item), relative)
        self.router.store(path).write(path, data)

    def saved(self) -> None:
        """Every item is written: the step's metadata names their handlers."""
        self._write_metadata(item_handlers=dict.fromkeys(self.items, PYTREE_HANDLER), custom_metadata={})

    def commit(self) -> None:
        """Finalize each item, then the step."""
        local = self.router.local
        for item in self.items:
            if self.on_gcs:
                marker = join(self.step_dir, item, ORBAX_COMMIT_MARKER)
                self.router.gcs.write(marker, commit_text(join(self.step_dir, item)))
            else:
                assert local is not None
                local.rename_dir(self.item_dir(item), join(self.work_dir, item))
        self._write_metadata(commit_timestamp_nsecs=int(self.clock() * 1e9))
        if self.on_gcs:
            self.router.gcs.write(join(self.step_dir, ORBAX_COMMIT_MARKER), commit_text(self.step_dir))
            return
        assert local is not None
        local.rename_dir(self.work_dir, self.step_dir)


def is_finalized(router: Router, directory: str) -> bool:
    """Orbax's ``is_path_finalized``: on GCS the folder's own ``commit_success.txt``
    (``CommitFileTemporaryPath.validate_final``), elsewhere a name without the temporary suffix."""
    directory = directory.rstrip("/")
    if directory.startswith("gs://"):
        return router.gcs.exists(join(directory, ORBAX_COMMIT_MARKER))
    return ORBAX_TMP_SUFFIX not in basename(directory)


def checkpoint_problem(router: Router, items_path: str, *, reads_metadata_first: bool = False) -> str | None:
    """Why MaxText cannot load the Orbax item ``items_path`` (``…/<step>/<item>``), or ``None``.

    Both readers restore with ``ocp.Checkpointer(...).restore(items_path)``, which raises
    ``FileNotFoundError('Checkpoint at … not found.')`` for a missing folder and ``ValueError('Found
    incomplete checkpoint at ….')`` when the folder is not finalized (orbax-checkpoint 0.12.0
    ``_src/checkpointers/checkpointer.py`` l.303-306, 0.12.2 l.311-313): on GCS, when the item has no
    ``commit_success.txt`` of its own (the step's is not checked). ``to_huggingface``
    (``reads_metadata_first``) reads the item's metadata before that, and without a ``_METADATA``
    fails on ``metadata.item_metadata.tree`` (``load_orbax_checkpoint``, maxtext-v0.2.3
    ``checkpoint_conversion/utils/utils.py`` l.857-860, v0.2.4 l.911-912).
    """
    items_path = items_path.rstrip("/")
    store = router.store(items_path)
    has_metadata = store.exists(join(items_path, "_METADATA"))
    if reads_metadata_first and not has_metadata:
        return "AttributeError: 'NoneType' object has no attribute 'tree'"
    if not store.is_dir(items_path):
        return f"FileNotFoundError: Checkpoint at {items_path} not found."
    if not is_finalized(router, items_path):
        return f"ValueError: Found incomplete checkpoint at {items_path}."
    if not has_metadata:
        # The trainer's restore with no item metadata: the sandbox's reading (not from a real run).
        return f"FileNotFoundError: Checkpoint at {items_path} not found."
    return None
