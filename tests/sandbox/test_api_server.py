"""The sandbox's Resource Manager stand-in: testIamPermissions through the real client library."""

from __future__ import annotations

import datetime
import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.api_core import exceptions as api_exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud.resourcemanager_v3 import ProjectsClient

from tpu_rl_sandbox.apis import oauth
from tpu_rl_sandbox.apis.api_server import api_server_url, start_api_server, stop_api_server
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.settings import update_settings
from tpu_rl_sandbox.world.store import StateStore

WANTED = ["compute.instances.create", "storage.buckets.create", "serviceusage.services.list"]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[SandboxLayout, str]]:
    """A private sandbox folder with a running API server (settings changes stay in it)."""
    layout = SandboxLayout(tmp_path / "sandbox")
    url = start_api_server(layout)
    try:
        yield layout, url
    finally:
        stop_api_server(layout)


def client(url: str) -> ProjectsClient:
    return ProjectsClient(
        credentials=AnonymousCredentials(), transport="rest", client_options={"api_endpoint": url}
    )


def test_start_is_idempotent_and_stop_ends_the_process(tmp_path: Path) -> None:
    layout = SandboxLayout(tmp_path / "sandbox")
    assert api_server_url(layout) is None
    url = start_api_server(layout)
    assert start_api_server(layout) == url
    assert api_server_url(layout) == url
    pid = json.loads((layout.root / "api_server.json").read_text())["pid"]
    assert stop_api_server(layout) is True
    assert api_server_url(layout) is None
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    assert stop_api_server(layout) is False


def test_client_library_gets_every_permission_but_the_denied_ones(server: tuple[SandboxLayout, str]) -> None:
    layout, url = server
    answer = client(url).test_iam_permissions(request={"resource": "projects/p-1", "permissions": WANTED})
    assert list(answer.permissions) == WANTED
    # settings are read per request: no restart needed
    update_settings(layout, denied_permissions=("storage.buckets.create",))
    answer = client(url).test_iam_permissions(request={"resource": "projects/p-1", "permissions": WANTED})
    assert list(answer.permissions) == ["compute.instances.create", "serviceusage.services.list"]
    update_settings(layout, denied_permissions=tuple(WANTED))
    answer = client(url).test_iam_permissions(request={"resource": "projects/p-1", "permissions": WANTED})
    assert list(answer.permissions) == []


def test_google_provider_anonymous_credentials_work(
    server: tuple[SandboxLayout, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow.providers.google.common.hooks.base_google import GoogleBaseHook

    _, url = server
    monkeypatch.setenv(
        "AIRFLOW_CONN_SANDBOX_GCP",
        json.dumps({"conn_type": "google_cloud_platform", "extra": {"is_anonymous": True, "project": "p-2"}}),
    )
    credentials = GoogleBaseHook(gcp_conn_id="sandbox_gcp").get_credentials()
    projects = ProjectsClient(credentials=credentials, transport="rest", client_options={"api_endpoint": url})
    answer = projects.test_iam_permissions(request={"resource": "projects/p-2", "permissions": WANTED[:1]})
    assert list(answer.permissions) == WANTED[:1]


def test_errors_use_googles_format(server: tuple[SandboxLayout, str]) -> None:
    layout, url = server
    request = urllib.request.Request(f"{url}/v3/projects/p-1:getIamPolicy", data=b"{}", method="POST")  # noqa: S310 (the local server)
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(request, timeout=10)  # noqa: S310
    assert missing.value.code == 404
    assert json.loads(missing.value.read())["error"]["status"] == "NOT_FOUND"
    bad = urllib.request.Request(  # noqa: S310
        f"{url}/v1/projects/p-1:testIamPermissions",
        data=json.dumps({"permissions": ["storage.*"]}).encode(),
        method="POST",
        headers={"Authorization": "Bearer whatever", "Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as invalid:
        urllib.request.urlopen(bad, timeout=10)  # noqa: S310
    assert invalid.value.code == 400
    assert json.loads(invalid.value.read())["error"]["status"] == "INVALID_ARGUMENT"
    with pytest.raises(api_exceptions.BadRequest):
        client(url).test_iam_permissions(request={"resource": "projects/p-1", "permissions": ["nope"]})
    update_settings(layout, disabled_services=("cloudresourcemanager.googleapis.com",))
    with pytest.raises(api_exceptions.Forbidden, match="Cloud Resource Manager API has not been used"):
        client(url).test_iam_permissions(request={"resource": "projects/p-1", "permissions": WANTED})


def test_the_server_runs_in_its_own_process(server: tuple[SandboxLayout, str]) -> None:
    layout, _ = server
    pid = json.loads((layout.root / "api_server.json").read_text())["pid"]
    assert pid != os.getpid()
    assert (layout.root / "api_server.log").exists()


TARGET = "deployer@sandbox-project.iam.gserviceaccount.com"
CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"


def _generate(url: str, token: str | None, body: dict[str, Any], account: str = TARGET) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    request = urllib.request.Request(  # noqa: S310 (the local server)
        oauth.iam_credentials_endpoint(url).format(account), data=json.dumps(body).encode(), headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_impersonated_credentials_get_a_token_of_the_target_the_apis_accept(
    server: tuple[SandboxLayout, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from google.auth import iam, impersonated_credentials
    from google.auth.credentials import Credentials
    from google.auth.transport.requests import Request

    layout, url = server
    source_token, _ = oauth.issue(
        layout, "caller@sandbox-project.iam.gserviceaccount.com", CLOUD_PLATFORM, 600
    )

    class Source(Credentials):  # an already valid token, as a refreshed service-account key holds
        def __init__(self) -> None:
            super().__init__()
            self.token = source_token

        def refresh(self, request: Any) -> None:
            del request

    monkeypatch.setattr(iam, "_IAM_ENDPOINT", oauth.iam_credentials_endpoint(url))
    target = impersonated_credentials.Credentials(
        source_credentials=Source(), target_principal=TARGET, target_scopes=[CLOUD_PLATFORM], lifetime=1200
    )
    target.refresh(Request())
    assert target.token.startswith("ya29.sandbox-")
    assert target.token != source_token
    assert oauth.token_valid(layout, target.token)
    records = StateStore(layout).read(oauth.TOKENS_DOC).values()
    assert {"email": TARGET, "scope": CLOUD_PLATFORM} in [
        {k: r[k] for k in ("email", "scope")} for r in records
    ]
    assert target.expiry is not None
    assert (
        1100
        < (target.expiry - datetime.datetime.now(datetime.UTC).replace(tzinfo=None)).total_seconds()
        <= 1200
    )


def test_generate_access_token_refuses_as_iam_credentials_does(server: tuple[SandboxLayout, str]) -> None:
    layout, url = server
    token, _ = oauth.issue(layout, "caller@sandbox-project.iam.gserviceaccount.com", CLOUD_PLATFORM, 600)
    good = {"scope": [CLOUD_PLATFORM], "delegates": [], "lifetime": "3600s"}
    assert _generate(url, None, good)[0] == 401
    assert _generate(url, "ya29.made-up", good)[0] == 401
    for body in ({"delegates": []}, {"scope": []}, {**good, "lifetime": "3601s"}, {**good, "lifetime": "1h"}):
        status, answer = _generate(url, token, body)
        assert (status, answer["error"]["status"]) == (400, "INVALID_ARGUMENT"), body
    status, answer = _generate(url, token, good, account="not-an-account")
    assert (status, answer["error"]["status"]) == (403, "PERMISSION_DENIED")
    status, answer = _generate(url, token, good)
    assert status == 200
    assert set(answer) == {"accessToken", "expireTime"}
    update_settings(layout, denied_permissions=("iam.serviceAccounts.getAccessToken",))
    status, answer = _generate(url, token, good)
    assert status == 403
    assert answer["error"]["message"] == (
        "Permission 'iam.serviceAccounts.getAccessToken' denied on resource (or it may not exist)."
    )
