"""Fault injection: ``TPU_RL_SANDBOX_FAIL`` names the steps that fail, once (transient) or always;
the preemption a training's machine takes once."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.store import StateError, StateStore

FAULT_ENV = "TPU_RL_SANDBOX_FAIL"
FAULT_KINDS = ("deploy", "convert", "train", "export", "destroy", "ssh")


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
