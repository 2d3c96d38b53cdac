"""The fake GKE API's ``projects.locations.clusters.get``, against the running API server."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from typing import Any

import pytest
from google.api_core import exceptions
from google.cloud import container_v1
from google.oauth2 import service_account

from tests.sandbox.conftest import Cli, deploy_args
from tpu_rl_sandbox.apis import kube_access, oauth
from tpu_rl_sandbox.apis.api_server import api_server_url
from tpu_rl_sandbox.apis.tls import ensure_tls
from tpu_rl_sandbox.commands.lifecycle import SANDBOX_PROJECT
from tpu_rl_sandbox.world.layout import SandboxLayout


@pytest.fixture
def deployed(cli: Cli, names: dict[str, str]) -> dict[str, str]:
    result = cli.gcluster("deploy", str(cli.info.blueprint), *deploy_args(names, backend=False))
    assert result.code == 0, result.text
    return names


def _url(cli: Cli) -> str:
    url = api_server_url(cli.layout)
    assert url is not None
    return url


def _get(url: str, token: str | None) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as answer:  # noqa: S310
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _client(cli: Cli) -> container_v1.ClusterManagerClient:
    layout = SandboxLayout(cli.info.root)
    credentials = service_account.Credentials.from_service_account_info(
        oauth.keyfile_dict(layout, _url(cli), SANDBOX_PROJECT),
        scopes=["https://www.googleapis.com/auth/cloud-platform"],
    )
    return container_v1.ClusterManagerClient(
        credentials=credentials, transport="rest", client_options={"api_endpoint": _url(cli)}
    )


def test_get_cluster_through_the_gapic_rest_client(cli: Cli, deployed: dict[str, str]) -> None:
    name = f"projects/{deployed['project']}/locations/{deployed['region']}/clusters/{deployed['cluster']}"
    cluster = _client(cli).get_cluster(name=name, timeout=30)
    assert cluster.name == deployed["cluster"]
    assert cluster.location == deployed["region"]
    assert cluster.status == container_v1.Cluster.Status.RUNNING
    assert cluster.current_master_version
    host, port = cluster.endpoint.split(":")
    assert host == "127.0.0.1"
    assert int(port) > 0
    ca = base64.b64decode(cluster.master_auth.cluster_ca_certificate)
    assert ca == ensure_tls(cli.layout).ca_cert.read_bytes()
    assert ca.startswith(b"-----BEGIN CERTIFICATE-----")


def test_the_endpoint_serves_the_kubernetes_api_with_the_returned_ca(
    cli: Cli, deployed: dict[str, str]
) -> None:
    access = kube_access.cluster_access(
        cli.layout, deployed["project"], deployed["region"], deployed["cluster"]
    )
    answer = kube_access.request(access, "GET", "/apis/jobset.x-k8s.io/v1alpha2/jobsets")
    assert answer.status == 200
    assert answer.json()["kind"] == "JobSetList"


def test_unknown_cluster_is_404_not_found(cli: Cli, deployed: dict[str, str]) -> None:
    token = oauth.access_token(cli.layout, _url(cli))
    path = f"/v1/projects/{deployed['project']}/locations/{deployed['region']}/clusters/nope"
    assert _get(_url(cli) + path, token) == (
        404,
        {
            "error": {
                "code": 404,
                "message": f"Not found: projects/{deployed['project']}/locations/{deployed['region']}/clusters/nope.",
                "status": "NOT_FOUND",
            }
        },
    )
    with pytest.raises(exceptions.NotFound):
        _client(cli).get_cluster(
            name=f"projects/{deployed['project']}/locations/us-west1/clusters/nope", timeout=30
        )


@pytest.mark.parametrize("token", [None, "ya29.made-up"], ids=["no-token", "unknown-token"])
def test_without_an_issued_token_it_is_401(cli: Cli, deployed: dict[str, str], token: str | None) -> None:
    path = f"/v1/projects/{deployed['project']}/locations/{deployed['region']}/clusters/{deployed['cluster']}"
    status, body = _get(_url(cli) + path, token)
    assert status == 401
    assert body["error"]["status"] == "UNAUTHENTICATED"
    assert body["error"]["code"] == 401
