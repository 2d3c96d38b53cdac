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

The sandbox's settings (conditional bindings, disabled APIs, denied permissions, reservations)
live apart in ``settings.json`` (:mod:`tpu_rl_sandbox.settings`).

Never call :meth:`StateStore.read` or open another transaction inside :meth:`StateStore.txn`:
``flock`` locks belong to the open file, so a nested lock in the same process waits forever.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpu_rl_sandbox.layout import SandboxLayout

FAULT_ENV = "TPU_RL_SANDBOX_FAIL"
FAULT_KINDS = ("deploy", "convert", "train", "export", "destroy", "ssh")


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


# -- fault injection --------------------------------------------------------------------
@dataclass(frozen=True)
class FaultSpec:
    """One entry of ``TPU_RL_SANDBOX_FAIL``."""

    kind: str
    transient: bool


def parse_faults(value: str | None) -> list[FaultSpec]:
    """``"deploy:transient,train"`` -> two specs; unknown names raise :class:`StateError`."""
    specs: list[FaultSpec] = []
    for raw in (value or "").split(","):
        item = raw.strip()
        if not item:
            continue
        kind, _, mode = item.partition(":")
        if kind not in FAULT_KINDS or mode not in ("", "transient"):
            raise StateError(
                f"bad {FAULT_ENV} entry {item!r}: expected one of {', '.join(FAULT_KINDS)}, optional ':transient'"
            )
        specs.append(FaultSpec(kind, mode == "transient"))
    return specs


class FaultGate:
    """Decides whether a step fails, remembering transient faults that already fired."""

    def __init__(self, store: StateStore, specs: Sequence[FaultSpec]) -> None:
        self._store = store
        self._specs = {spec.kind: spec for spec in specs}

    @classmethod
    def from_env(cls, store: StateStore, env: Mapping[str, str]) -> FaultGate:
        return cls(store, parse_faults(env.get(FAULT_ENV)))

    @property
    def specs(self) -> list[FaultSpec]:
        return list(self._specs.values())

    def fire(self, kind: str) -> FaultSpec | None:
        """The fault to inject now for ``kind`` (``None`` = run normally)."""
        spec = self._specs.get(kind)
        if spec is None:
            return None
        if not spec.transient:
            return spec
        with self._store.txn() as txn:
            fired = txn.doc("faults")
            if fired.get(kind):
                return None
            fired[kind] = time.time()
            txn.save("faults")
        return spec


def claim_preemption(
    store: StateStore,
    wanted: tuple[int, int],
    run_dir: str,
    committed: int,
    past: int,
    machine: str,
    at: str,
) -> bool:
    """Whether the machine under a training goes now: ``wanted`` (the settings'
    ``preempt_after_checkpoints`` and ``preempt_steps_after``) committed checkpoints reached in
    ``run_dir`` and that many steps trained past the newest, the first time (remembered in the
    ``preemptions`` document, with the machine that went)."""
    after_checkpoints, steps_after = wanted
    if after_checkpoints <= 0 or committed < after_checkpoints or past < steps_after:
        return False
    with store.txn() as txn:
        fired = txn.doc("preemptions")
        if run_dir in fired:
            return False
        fired[run_dir] = {"job": machine, "committed": committed, "at": at}
        txn.save("preemptions")
    return True


def reset_faults(layout: SandboxLayout) -> None:
    """Forget which transient faults fired (they will fire again once)."""
    with StateStore(layout).txn() as txn:
        txn.doc("faults").clear()
        txn.save("faults")


# -- call log ---------------------------------------------------------------------------
CALL_START_ENV = "TPU_RL_SANDBOX_CALL_START"
_CALL_START_SLACK = 60.0


def call_start(env: Mapping[str, str], now: float) -> float:
    """When the shim started this call (``$TPU_RL_SANDBOX_CALL_START``), else ``now``.

    A value inherited from an older call (a fake run by a fake) is not this call's: only a stamp
    from the last minute, not in the future, counts.
    """
    try:
        stamp = float(env.get(CALL_START_ENV, ""))
    except ValueError:
        return now
    return stamp if now - _CALL_START_SLACK <= stamp <= now else now


def record_call(
    layout: SandboxLayout,
    tool: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    exit_code: int,
    start: float,
    end: float,
) -> None:
    """Append one line to ``<root>/calls.jsonl`` (environment NAMES only, never values)."""
    entry = {
        "tool": tool,
        "argv": list(argv),
        "env_names": sorted(env),
        "cwd": cwd,
        "exit_code": exit_code,
        "start": start,
        "end": end,
    }
    layout.root.mkdir(parents=True, exist_ok=True)
    line = json.dumps(entry, sort_keys=True) + "\n"
    with layout.calls_file.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            handle.write(line)
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def read_calls(layout: SandboxLayout) -> list[dict[str, Any]]:
    """All recorded calls, oldest first."""
    try:
        text = layout.calls_file.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]
