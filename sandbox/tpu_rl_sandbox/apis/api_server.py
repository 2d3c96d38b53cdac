"""A stand-in for the Google APIs the provider calls over HTTP: Resource Manager's
``projects.testIamPermissions`` (v3, and v1 for discovery-based clients), the OAuth 2.0 token
endpoint ``POST /token`` (:mod:`tpu_rl_sandbox.apis.oauth`), GKE's ``projects.locations.clusters.get``
(``GET /v1/projects/{p}/locations/{l}/clusters/{c}``) and, on a port per cluster, each fake
cluster's Kubernetes API (:mod:`tpu_rl_sandbox.apis.kube_api`).

Runs as a background process per sandbox (``python -m tpu_rl_sandbox.apis.api_server --root ROOT``),
recorded in ``<root>/api_server.json`` (pid, port) with its log in ``<root>/api_server.log``,
like the fake-gcs-server emulator. Point a client at :func:`api_server_url`, e.g.
``ProjectsClient(credentials=AnonymousCredentials(), transport="rest",
client_options={"api_endpoint": url})``. Resource Manager accepts any or no ``Authorization``
header; GKE requires a Bearer token the token endpoint issued (or a self-signed JWT of the
sandbox's service account, as google-api-core clients send) and answers 401 otherwise.

``testIamPermissions`` grants every requested permission except ``settings.denied_permissions``
(the settings are read on each request); with ``cloudresourcemanager.googleapis.com`` in
``settings.disabled_services`` it answers 403 SERVICE_DISABLED like the real API.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tpu_rl_sandbox.apis import oauth
from tpu_rl_sandbox.apis.daemons import start_module, stop_pid
from tpu_rl_sandbox.apis.gcs_emulator import pid_alive
from tpu_rl_sandbox.apis.kube_server import KubeServers
from tpu_rl_sandbox.apis.tls import ca_base64
from tpu_rl_sandbox.world import existing_clusters, inventory
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.settings import load_settings
from tpu_rl_sandbox.world.store import StateStore

INFO_FILE = "api_server.json"
LOG_FILE = "api_server.log"
HEALTH_PATH = "/sandbox/health"
RESOURCE_MANAGER = "cloudresourcemanager.googleapis.com"
LAST_PORT_FILE = "api_server.port"
TEST_IAM_RE = re.compile(r"^/v([13])/projects/([^/:]+):testIamPermissions$")
GENERATE_ACCESS_TOKEN_RE = re.compile(r"^/v1/projects/-/serviceAccounts/([^/:]+):generateAccessToken$")
GET_ACCESS_TOKEN = "iam.serviceAccounts.getAccessToken"
SERVICE_ACCOUNT_RE = re.compile(
    r"^[a-z][a-z0-9-]{4,28}[a-z0-9]@[a-z][a-z0-9-]{4,28}[a-z0-9]\.iam\.gserviceaccount\.com$"
)
MAX_TOKEN_LIFETIME_S = 3600  # without the iam.allowServiceAccountCredentialLifetimeExtension policy
GET_CLUSTER_PERMISSION = "container.clusters.get"
GET_CLUSTER_RE = re.compile(r"^/v1/projects/([^/]+)/locations/([^/]+)/clusters/([^/:]+)$")
CONTAINER_AUDIENCES = ("https://container.googleapis.com/",)
GKE_VERSION = "1.35.1-gke.1000"
UNAUTHENTICATED = (
    "Request is missing required authentication credential. Expected OAuth 2 access token, login cookie or other "
    "valid authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project."
)
INVALID_CREDENTIALS = (
    "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid "
    "authentication credential. See https://developers.google.com/identity/sign-in/web/devconsole-project."
)


__all__ = [
    "ApiServerError",
    "answer_generate_access_token",
    "answer_test_iam_permissions",
    "api_server_url",
    "gke_cluster_resource",
    "start_api_server",
    "stop_api_server",
]


class ApiServerError(RuntimeError):
    """The API server could not be started."""


def _info_path(layout: SandboxLayout) -> Path:
    return layout.root / INFO_FILE


def _read_info(layout: SandboxLayout) -> dict[str, int] | None:
    try:
        data = json.loads(_info_path(layout).read_text())
        return {"pid": int(data["pid"]), "port": int(data["port"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _answers(port: int, timeout: float = 0.5) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{HEALTH_PATH}", timeout=timeout) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def api_server_url(layout: SandboxLayout) -> str | None:
    """The URL of the sandbox's running API server, or ``None``."""
    info = _read_info(layout)
    if info is None or not pid_alive(info["pid"]) or not _answers(info["port"]):
        return None
    return f"http://127.0.0.1:{info['port']}"


def start_api_server(layout: SandboxLayout, wait_seconds: float = 15.0) -> str:
    """Start the API server for ``layout`` (or reuse the running one); its URL."""
    running = api_server_url(layout)
    if running is not None:
        return running
    layout.root.mkdir(parents=True, exist_ok=True)
    _info_path(layout).unlink(missing_ok=True)
    try:  # the port it had before, so a token_uri handed out earlier stays valid
        last_port = int((layout.root / LAST_PORT_FILE).read_text().strip())
    except (OSError, ValueError):
        last_port = 0

    def answering(pid: int) -> str | None:
        info = _read_info(layout)
        if info is not None and info["pid"] == pid and _answers(info["port"]):
            return f"http://127.0.0.1:{info['port']}"
        return None

    return start_module(
        "tpu_rl_sandbox.apis.api_server",
        ["--root", str(layout.root), "--port", str(last_port)],
        layout.root / LOG_FILE,
        answering,
        "API server",
        ApiServerError,
        wait_seconds,
    )


def stop_api_server(layout: SandboxLayout, wait_seconds: float = 5.0) -> bool:
    """Stop the recorded API server. True if one was running."""
    info = _read_info(layout)
    if info is None:
        return False
    was_alive = stop_pid(int(info["pid"]), wait_seconds)
    _info_path(layout).unlink(missing_ok=True)
    return was_alive


# =================================================================================== server
def google_error(
    code: int, status: str, message: str, details: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Google's JSON error body (google.rpc.Status as the REST frontends send it)."""
    error: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details:
        error["details"] = details
    return {"error": error}


def _duration_seconds(text: Any) -> float | None:
    """A protobuf JSON ``Duration`` (``"3600s"``, ``"1.5s"``) in seconds, or ``None``."""
    match = re.fullmatch(r"(\d+(?:\.\d{1,9})?)s", text) if isinstance(text, str) else None
    return float(match.group(1)) if match else None


def answer_generate_access_token(
    layout: SandboxLayout, authorization: str | None, account: str, raw: bytes
) -> tuple[int, dict[str, Any]]:
    """``(HTTP status, JSON body)`` of IAM Credentials v1
    ``projects/-/serviceAccounts/{account}:generateAccessToken``, as its REST reference states it:
    the caller's OAuth token (401 without a valid one); a body of ``scope`` (required, one scope at
    least), ``delegates`` and ``lifetime`` (a Duration, default and at most 3600 s); the caller needs
    ``iam.serviceAccounts.getAccessToken`` on the account (``settings.denied_permissions`` takes it
    away: a 403 that, as Google's, does not say whether the account exists). The answer is
    ``{"accessToken", "expireTime"}`` (RFC 3339 UTC, whole seconds: google-auth parses it with
    ``%Y-%m-%dT%H:%M:%SZ`` in ``google/auth/impersonated_credentials.py``
    ``_make_iam_token_request``, which reads nothing else); the token is one the other fake APIs
    accept, issued to the account. The statuses and the 403's text are Google's; the 400s' messages
    are the sandbox's own words (clients read only the status)."""
    if not oauth.bearer_valid(layout, authorization):
        message = INVALID_CREDENTIALS if authorization else UNAUTHENTICATED
        return 401, google_error(401, "UNAUTHENTICATED", message)
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return 400, google_error(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
    if not isinstance(body, dict):
        return 400, google_error(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
    scopes = body.get("scope")
    if not isinstance(scopes, list) or not scopes or not all(isinstance(x, str) and x for x in scopes):
        return 400, google_error(400, "INVALID_ARGUMENT", "Scope required.")
    delegates = body.get("delegates") or []  # proto3 JSON: null is the empty list
    if not isinstance(delegates, list) or not all(isinstance(x, str) for x in delegates):
        return 400, google_error(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
    lifetime = _duration_seconds(body.get("lifetime", f"{MAX_TOKEN_LIFETIME_S}s"))
    if lifetime is None or not 0 < lifetime <= MAX_TOKEN_LIFETIME_S:
        return 400, google_error(
            400,
            "INVALID_ARGUMENT",
            f"The lifetime of the access token must be between 1s and {MAX_TOKEN_LIFETIME_S}s.",
        )
    accounts = [name.rsplit("/", 1)[-1] for name in delegates] + [account]
    denied = GET_ACCESS_TOKEN in load_settings(layout).denied_permissions
    for name in accounts:
        if denied or not SERVICE_ACCOUNT_RE.match(name):
            return 403, google_error(
                403,
                "PERMISSION_DENIED",
                f"Permission '{GET_ACCESS_TOKEN}' denied on resource (or it may not exist).",
            )
    token, expires = oauth.issue(layout, account, " ".join(scopes), lifetime)
    expire_time = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(expires)))
    return 200, {"accessToken": token, "expireTime": expire_time}


def answer_test_iam_permissions(layout: SandboxLayout, project: str, body: Any) -> tuple[int, dict[str, Any]]:
    """``(HTTP status, JSON body)`` of ``projects/{project}:testIamPermissions``."""
    settings = load_settings(layout)
    if RESOURCE_MANAGER in settings.disabled_services:
        number = inventory.project_number(project)
        return 403, google_error(
            403,
            "PERMISSION_DENIED",
            f"Cloud Resource Manager API has not been used in project {number} before or it is disabled. "
            f"Enable it by visiting https://console.developers.google.com/apis/api/{RESOURCE_MANAGER}/"
            f"overview?project={number} then retry. If you enabled this API recently, wait a few minutes "
            "for the action to propagate to our systems and retry.",
            [
                {
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": "SERVICE_DISABLED",
                    "domain": "googleapis.com",
                    "metadata": {"service": RESOURCE_MANAGER, "consumer": f"projects/{number}"},
                }
            ],
        )
    permissions = body.get("permissions", []) if isinstance(body, dict) else None
    if not isinstance(permissions, list) or not all(isinstance(p, str) for p in permissions):
        return 400, google_error(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
    for permission in permissions:
        if "*" in permission or not re.fullmatch(r"[a-zA-Z0-9]+(\.[a-zA-Z0-9]+){2,}", permission):
            return 400, google_error(400, "INVALID_ARGUMENT", f"Permission {permission} is not valid.")
    denied = set(settings.denied_permissions)
    granted = [p for p in dict.fromkeys(permissions) if p not in denied]
    return 200, ({"permissions": granted} if granted else {})


def gke_cluster_resource(
    record: dict[str, Any], port: int, ca_base64: str, enum_int: bool = False
) -> dict[str, Any]:
    """container v1 ``Cluster`` (JSON, camelCase) of a fake cluster whose API listens on ``port``."""
    version = existing_clusters.gke_version(record)
    pools = [{**pool, "version": version} for pool in inventory.gke_node_pools(record)]
    # google/container/v1/cluster_service.proto Cluster.Status: PROVISIONING = 1, RUNNING = 2,
    # RECONCILING = 3, STOPPING = 4, ERROR = 5, DEGRADED = 6
    status: Any = existing_clusters.status(record)
    if enum_int:
        status = {
            "PROVISIONING": 1,
            "RUNNING": 2,
            "RECONCILING": 3,
            "STOPPING": 4,
            "ERROR": 5,
            "DEGRADED": 6,
        }[status]
        for pool in pools:
            pool["status"] = {"RUNNING": 2, "ERROR": 5}[str(pool["status"])]
    endpoint = f"127.0.0.1:{port}"
    project, region, name = record["project"], record["region"], record["name"]
    return {
        "name": name,
        "nodePools": pools,
        "location": region,
        "zone": region,
        "locations": [record.get("zone") or f"{region}-b"],
        "endpoint": endpoint,
        "masterAuth": {"clusterCaCertificate": ca_base64},
        "controlPlaneEndpointsConfig": {
            "ipEndpointsConfig": {"enabled": True, "enablePublicEndpoint": True, "publicEndpoint": endpoint}
        },
        "resourceLabels": dict(record.get("labels", {})),
        "initialClusterVersion": version,
        "currentMasterVersion": version,
        "currentNodeVersion": version,
        **existing_clusters.workload_identity_config(record),
        "currentNodeCount": sum(int(p["initialNodeCount"]) for p in pools),
        "createTime": record.get("created", ""),
        "status": status,
        "network": "default",
        "subnetwork": "default",
        "selfLink": f"https://container.googleapis.com/v1/projects/{project}/locations/{region}/clusters/{name}",
        "id": hashlib.sha256(f"{project}/{region}/{name}".encode()).hexdigest()[:32],
    }


class _Handler(BaseHTTPRequestHandler):
    server_version = "ESF"
    layout: SandboxLayout
    kube: KubeServers

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _not_found(self) -> None:
        self._send(
            404,
            google_error(404, "NOT_FOUND", f"The requested URL {self.path} was not found on this server."),
        )

    def do_GET(self) -> None:
        path, _, query = self.path.partition("?")
        if path == HEALTH_PATH:
            self._send(200, {"status": "ok"})
            return
        match = GET_CLUSTER_RE.match(path)
        if match is not None:
            self._get_cluster(match.group(1), match.group(2), match.group(3), query)
            return
        self._not_found()

    def _own_url(self) -> str:
        address: Any = self.server.server_address
        return f"http://127.0.0.1:{int(address[1])}"

    def _get_cluster(self, project: str, location: str, name: str, query: str) -> None:
        """container v1 ``projects.locations.clusters.get``."""
        authorization = self.headers.get("Authorization")
        if not oauth.bearer_valid(self.layout, authorization, CONTAINER_AUDIENCES):
            message = INVALID_CREDENTIALS if authorization else UNAUTHENTICATED
            self._send(401, google_error(401, "UNAUTHENTICATED", message))
            return
        if GET_CLUSTER_PERMISSION in load_settings(self.layout).denied_permissions:
            # GKE's answer to a caller without container.clusters.get on the cluster (it is
            # checked before the cluster is looked up: a missing one is not revealed either).
            self._send(
                403,
                google_error(
                    403,
                    "PERMISSION_DENIED",
                    f'Required "{GET_CLUSTER_PERMISSION}" permission(s) for '
                    f'"projects/{project}/locations/{location}/clusters/{name}".',
                ),
            )
            return
        record = inventory.find_cluster(StateStore(self.layout), project, location, name)
        if record is None:
            self._send(
                404,
                google_error(
                    404, "NOT_FOUND", f"Not found: projects/{project}/locations/{location}/clusters/{name}."
                ),
            )
            return
        port = self.kube.ensure(inventory.cluster_key(project, location, name))
        # google-api-core REST transports ask for integer enums ($alt=json;enum-encoding=int)
        enum_int = "enum-encoding=int" in urllib.parse.unquote(query)
        self._send(200, gke_cluster_resource(record, port, ca_base64(self.layout), enum_int))

    def _token(self, raw: bytes) -> None:
        """OAuth 2.0 token endpoint (JWT-bearer grant), as https://oauth2.googleapis.com/token."""
        form = {k: v[-1] for k, v in urllib.parse.parse_qs(raw.decode(errors="replace")).items()}
        try:
            answer = oauth.grant(self.layout, form, oauth.token_uri(self._own_url()))
        except oauth.GrantError as error:
            self._send(400, error.body())
            return
        self._send(200, answer)

    def do_POST(self) -> None:
        raw = self._read_body()
        path = self.path.split("?", 1)[0]
        if path == oauth.TOKEN_PATH:
            self._token(raw)
            return
        impersonated = GENERATE_ACCESS_TOKEN_RE.match(path)
        if impersonated is not None:
            account = urllib.parse.unquote(impersonated.group(1))
            self._send(
                *answer_generate_access_token(self.layout, self.headers.get("Authorization"), account, raw)
            )
            return
        match = TEST_IAM_RE.match(path)
        if match is None:
            self._not_found()
            return
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._send(400, google_error(400, "INVALID_ARGUMENT", "Invalid JSON payload received."))
            return
        status, answer = answer_test_iam_permissions(self.layout, match.group(2), body)
        self._send(status, answer)

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"{self.address_string()} {format % args}\n")


def serve(layout: SandboxLayout, port: int = 0) -> None:
    """Serve until SIGTERM; records pid and port in ``<root>/api_server.json``."""
    kube = KubeServers(layout)
    handler = type("Handler", (_Handler,), {"layout": layout, "kube": kube})
    try:
        server = ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError:
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    stop_reconciler = threading.Event()
    threading.Thread(target=kube.run_reconciler, args=(stop_reconciler,), daemon=True).start()
    (layout.root / LAST_PORT_FILE).write_text(str(server.server_address[1]))

    def stop(signum: int, frame: Any) -> None:
        del signum, frame
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    fd, tmp = tempfile.mkstemp(dir=layout.root, prefix=".api_server.", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        json.dump({"pid": os.getpid(), "port": server.server_address[1]}, handle)
    os.replace(tmp, _info_path(layout))
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        stop_reconciler.set()
        kube.close()
        server.server_close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tpu_rl_sandbox.apis.api_server")
    parser.add_argument("--root", required=True, help="sandbox folder")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    serve(SandboxLayout(Path(args.root).resolve()), args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
