"""Fixtures for the operator tests: the session sandbox, entered for one test with its own names."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.operators.sandbox_run import SandboxRun, enter_sandbox
from tpu_rl_sandbox.commands.lifecycle import SandboxInfo
from tpu_rl_sandbox.world.faults import reset_faults
from tpu_rl_sandbox.world.settings import update_settings


@pytest.fixture
def sb(sandbox: SandboxInfo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SandboxRun:
    """The sandbox in os.environ (shims on PATH, emulator, connections, fast steps and polls)."""
    return enter_sandbox(sandbox, tmp_path, monkeypatch)


@pytest.fixture
def clean_faults(sb: SandboxRun) -> Iterator[None]:
    """Transient faults fire once per sandbox: forget earlier firings around the test."""
    reset_faults(sb.layout)
    yield
    reset_faults(sb.layout)


@pytest.fixture
def preempt_after_two(sb: SandboxRun) -> Iterator[None]:
    """The sandbox takes the TPU capacity from under a training after its 2nd committed checkpoint."""
    update_settings(sb.layout, preempt_after_checkpoints=2)
    try:
        yield
    finally:
        update_settings(sb.layout, preempt_after_checkpoints=0)
