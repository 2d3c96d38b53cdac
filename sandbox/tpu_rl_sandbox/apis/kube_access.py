"""Reach a fake cluster's Kubernetes API the way the provider does (for tests and the demo).

:func:`cluster_access` gets an access token from the sandbox's token endpoint with google-auth
(the JWT-bearer grant a ``keyfile_dict`` connection makes), asks the fake GKE API for the cluster
(``GET /v1/projects/{p}/locations/{l}/clusters/{c}``) and returns ``https://{endpoint}``, the CA
PEM from ``masterAuth.clusterCaCertificate`` and the token. :func:`request` then calls the API with
``urllib`` over TLS verified against that CA.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from tpu_rl_sandbox.apis import oauth
from tpu_rl_sandbox.apis.api_server import api_server_url
from tpu_rl_sandbox.world.layout import SandboxLayout

__all__ = ["ClusterAccess", "Response", "cluster_access", "request"]


@dataclass(frozen=True)
class ClusterAccess:
    """What a client needs: the API's URL, the CA that signed its certificate, a Bearer token."""

    url: str
    ca_pem: str
    token: str
    cluster: dict[str, Any]

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cadata=self.ca_pem)


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    headers: dict[str, str]

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode()


def _api_url(layout: SandboxLayout) -> str:
    url = api_server_url(layout)
    if url is None:
        raise RuntimeError(f"the sandbox API server is not running in {layout.root}")
    return url


def cluster_access(
    layout: SandboxLayout, project: str, location: str, name: str, timeout: float = 30.0
) -> ClusterAccess:
    """Token (from ``/token``), endpoint and CA (from the fake GKE API) of a deployed cluster."""
    api = _api_url(layout)
    token = oauth.access_token(layout, api)
    req = urllib.request.Request(  # noqa: S310 (the sandbox's http://127.0.0.1 API server)
        f"{api}/v1/projects/{project}/locations/{location}/clusters/{name}",
        headers={"Authorization": f"Bearer {token}"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as answer:  # noqa: S310
        cluster = json.loads(answer.read())
    ca_pem = base64.b64decode(cluster["masterAuth"]["clusterCaCertificate"]).decode()
    return ClusterAccess(url=f"https://{cluster['endpoint']}", ca_pem=ca_pem, token=token, cluster=cluster)


def request(
    access: ClusterAccess,
    method: str,
    path: str,
    body: Any = None,
    token: str | None = "",
    timeout: float = 60.0,
    content_type: str = "application/json",
) -> Response:
    """One API call (``token=None``: no ``Authorization`` header; ``""``: the access token);
    ``body`` is sent as JSON with ``content_type`` (``application/merge-patch+json`` for a PATCH)."""
    headers = {"Accept": "application/json"}
    use = access.token if token == "" else token
    if use is not None:
        headers["Authorization"] = f"Bearer {use}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = content_type
    req = urllib.request.Request(access.url + path, data=data, method=method, headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=access.ssl_context()) as answer:  # noqa: S310
            return Response(answer.status, answer.read(), dict(answer.headers))
    except urllib.error.HTTPError as error:
        return Response(error.code, error.read(), dict(error.headers))
