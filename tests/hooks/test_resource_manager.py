"""``ProjectPermissionsHook`` against the sandbox's Resource Manager API server (real client, REST).

The google-cloud-resource-manager client talks HTTP to the sandbox's server; what the caller
lacks comes from the sandbox settings (``denied_permissions``), as a project's IAM policy would.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from airflow_provider_tpu_rl.compat import AirflowNotFoundException
from airflow_provider_tpu_rl.exceptions import CommandError, ConfigurationError
from airflow_provider_tpu_rl.hooks.resource_manager import MAX_PERMISSIONS_PER_CALL, ProjectPermissionsHook
from airflow_provider_tpu_rl.spec.preflight import REQUIRED_PERMISSIONS
from airflow_provider_tpu_rl.spec.presets import Runner
from tests.support.sandbox_run import api_server
from tpu_rl_sandbox.commands.lifecycle import SandboxInfo
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.settings import reset_settings, update_settings

PROJECT = "proj-rm-hook"
ANONYMOUS = json.dumps(
    {"conn_type": "google_cloud_platform", "extra": {"is_anonymous": True, "project": PROJECT}}
)


@pytest.fixture
def endpoint(sandbox: SandboxInfo, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The sandbox's API server; settings back to the defaults around the test."""
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", ANONYMOUS)
    layout = SandboxLayout(sandbox.root)
    reset_settings(layout)
    try:
        with api_server(layout) as url:
            yield url
    finally:
        reset_settings(layout)


def _closed_port() -> int:
    """A port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _hook(endpoint: str) -> ProjectPermissionsHook:
    return ProjectPermissionsHook(api_endpoint=endpoint)


def test_a_caller_with_every_permission_gets_them_all_back(endpoint: str) -> None:
    wanted = list(REQUIRED_PERMISSIONS[Runner.GKE])
    assert _hook(endpoint).test_permissions(PROJECT, wanted) == set(wanted)


def test_denied_permissions_are_left_out(sandbox: SandboxInfo, endpoint: str) -> None:
    denied = ("container.clusters.create", "iam.serviceAccounts.actAs")
    update_settings(SandboxLayout(sandbox.root), denied_permissions=denied)
    wanted = list(REQUIRED_PERMISSIONS[Runner.GKE])
    granted = _hook(endpoint).test_permissions(PROJECT, wanted)
    assert granted == set(wanted) - set(denied)


def test_more_permissions_than_one_call_takes_are_asked_in_chunks(
    sandbox: SandboxInfo, endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Well-formed names (the server checks the form), more than one request may carry.
    wanted = [f"compute.instances.check{i}" for i in range(2 * MAX_PERMISSIONS_PER_CALL + 10)]
    denied = (wanted[0], wanted[MAX_PERMISSIONS_PER_CALL], wanted[-1])
    update_settings(SandboxLayout(sandbox.root), denied_permissions=denied)
    sizes: list[int] = []
    original = ProjectPermissionsHook._test_chunk

    def recording(self: ProjectPermissionsHook, client: Any, resource: str, chunk: list[str]) -> list[str]:
        sizes.append(len(chunk))
        return original(self, client, resource, chunk)

    monkeypatch.setattr(ProjectPermissionsHook, "_test_chunk", recording)
    assert _hook(endpoint).test_permissions(PROJECT, [*wanted, wanted[3]]) == set(wanted) - set(denied)
    assert sizes == [MAX_PERMISSIONS_PER_CALL, MAX_PERMISSIONS_PER_CALL, 10]


def test_nothing_asked_is_nothing_granted_without_a_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", ANONYMOUS)
    assert _hook(f"http://127.0.0.1:{_closed_port()}").test_permissions(PROJECT, []) == set()


def test_a_wildcard_permission_is_refused_as_configuration(endpoint: str) -> None:
    with pytest.raises(ConfigurationError, match="refused"):
        _hook(endpoint).test_permissions(PROJECT, ["compute.*"])


def test_a_disabled_resource_manager_api_is_a_configuration_error(
    sandbox: SandboxInfo, endpoint: str
) -> None:
    update_settings(SandboxLayout(sandbox.root), disabled_services=("cloudresourcemanager.googleapis.com",))
    with pytest.raises(ConfigurationError, match=r"SERVICE_DISABLED|has not been used"):
        _hook(endpoint).test_permissions(PROJECT, ["compute.instances.create"])


def test_an_unreachable_api_is_a_transient_command_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", ANONYMOUS)
    with pytest.raises(CommandError) as raised:
        _hook(f"http://127.0.0.1:{_closed_port()}").test_permissions(PROJECT, ["compute.instances.create"])
    assert raised.value.retryable


def test_an_undefined_connection_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_NO_SUCH_GCP", raising=False)
    with pytest.raises(AirflowNotFoundException, match="no_such_gcp"):
        ProjectPermissionsHook(gcp_conn_id="no_such_gcp")
