"""Shared state of the fakes: JSON documents under ``<root>/state`` behind one file lock.

Documents (each a JSON object):

* ``clusters``  -- GKE clusters made by ``gcluster deploy``, keyed ``project/region/name``
* ``jobs``      -- JobSets made by ``gcluster job submit``, keyed ``project/location/cluster/name``
* ``secrets``   -- Secret Manager secrets, keyed ``project/name`` (payload SHA-256 + length only;
  ``bindings`` role -> members and ``conditional_bindings`` of the secret's IAM policy)
* ``iam``       -- ``project_bindings`` (project -> role -> members), ``project_conditional``
  (project -> conditional bindings) and ``service_accounts``
* ``vms``       -- Compute Engine instances, keyed ``project/zone/name``
* ``buckets``   -- bucket metadata the emulator does not keep (project, location, IAM bindings)
* ``project_metadata`` -- Compute Engine project metadata (``ssh-keys`` entries), keyed by project
* ``faults``    -- which transient faults already fired
* ``registry``  -- Artifact Registry ``repositories`` (keyed ``project/location/name``), the images
  ``add-tag`` copied (``images``: ``host/path`` -> tag -> digest) and its ``pushes``
* ``image_pulls`` -- ``pulls``: each TPU pool's pull of a job's image, streamed or whole, and why

The sandbox's settings (conditional bindings, disabled APIs, denied permissions, reservations)
live apart in ``settings.json`` (:mod:`tpu_rl_sandbox.world.settings`).

Never call :meth:`StateStore.read` or open another transaction inside :meth:`StateStore.txn`:
``flock`` locks belong to the open file, so a nested lock in the same process waits forever.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tpu_rl_sandbox.world.layout import SandboxLayout


class StateError(RuntimeError):
    """Bad configuration of the sandbox state (e.g. an unknown fault name)."""


class StateTxn:
    """Documents loaded inside one lock; :meth:`save` marks one for writing back."""

    def __init__(self, state_dir: Path) -> None:
        self._dir = state_dir
        self._docs: dict[str, dict[str, Any]] = {}
        self._dirty: set[str] = set()

    def doc(self, name: str) -> dict[str, Any]:
        """The document ``name`` (empty dict if it does not exist yet)."""
        if name not in self._docs:
            path = self._dir / f"{name}.json"
            try:
                self._docs[name] = json.loads(path.read_text())
            except FileNotFoundError:
                self._docs[name] = {}
        return self._docs[name]

    def save(self, name: str) -> None:
        """Write ``name`` back when the transaction ends."""
        self.doc(name)
        self._dirty.add(name)

    def flush(self) -> None:
        for name in sorted(self._dirty):
            target = self._dir / f"{name}.json"
            import tempfile  # here: a fake call that only reads starts without it

            fd, tmp = tempfile.mkstemp(dir=self._dir, prefix=f".{name}.", suffix=".tmp")
            with os.fdopen(fd, "w") as handle:
                json.dump(self._docs[name], handle, indent=1, sort_keys=True)
            os.replace(tmp, target)
        self._dirty.clear()


class StateStore:
    """Locked access to the state documents of one sandbox."""

    def __init__(self, layout: SandboxLayout) -> None:
        self.layout = layout
        self.layout.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock_path = self.layout.state_dir / ".lock"

    @contextlib.contextmanager
    def txn(self) -> Iterator[StateTxn]:
        """Exclusive transaction over all documents (safe across processes)."""
        with self._lock_path.open("a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                txn = StateTxn(self.layout.state_dir)
                yield txn
                txn.flush()
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def read(self, name: str) -> dict[str, Any]:
        """A snapshot of one document."""
        with self.txn() as txn:
            return json.loads(json.dumps(txn.doc(name)))
