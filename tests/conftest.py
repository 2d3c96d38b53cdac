"""Session-wide fixtures shared by the test packages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tpu_rl_sandbox.control import SandboxInfo, sandbox_down, sandbox_up


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxInfo]:
    """A running sandbox (fake-gcs-server + fake gcluster/gcloud shims) for the whole session.

    ``sandbox.env`` holds the variables a process needs (PATH prefix, STORAGE_EMULATOR_HOST,
    TPU_RL_SANDBOX_DIR, AIRFLOW_CONN_*). Tests must use their own project/cluster/bucket names:
    the state is shared by every test of the session.
    """
    info = sandbox_up(tmp_path_factory.mktemp("sandbox"))
    try:
        yield info
    finally:
        sandbox_down(info.root)
