"""The fake Kubernetes API served over HTTPS: one server per existing fake GKE cluster.

The objects and what each verb does are :mod:`tpu_rl_sandbox.apis.kube_api`; this module only serves
them (TLS with the sandbox CA's serving certificate, :mod:`tpu_rl_sandbox.apis.tls`; bearer tokens the
sandbox's token endpoint issued, :mod:`tpu_rl_sandbox.apis.oauth`). Only the API server process imports
it, so the fake tools start without the HTTP server and crypto modules.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import sys
import threading
import time
import urllib.parse
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tpu_rl_sandbox.apis import oauth
from tpu_rl_sandbox.apis.kube_api import (
    DEFAULT_NAMESPACE,
    JOBSET_API_VERSION,
    JOBSET_GROUP,
    JOBSET_VERSION,
    KUBE_ENDPOINTS_DOC,
    PATCH_TYPES,
    KubeError,
    LogOptions,
    _resource_version,
    bad_request,
    cluster_jobs,
    collect_garbage,
    container_log_path,
    create_compute_class,
    create_jobset,
    create_pod,
    delete_compute_class,
    delete_jobset,
    delete_pod,
    get_compute_class,
    jobset_object,
    k8s_uid,
    list_compute_classes,
    list_events,
    node_object,
    not_found,
    patch_jobset,
    pod_object,
    read_log,
    selector_matches,
    standalone_pod_object,
    standalone_pods,
    start_worker,
    status_object,
    unsupported_media_type,
)
from tpu_rl_sandbox.apis.tls import server_ssl_context
from tpu_rl_sandbox.world import compute_classes, existing_clusters
from tpu_rl_sandbox.world.layout import SandboxLayout
from tpu_rl_sandbox.world.settings import load_settings
from tpu_rl_sandbox.world.store import StateStore

__all__ = ["KubeServers"]

KUEUE_GROUP, KUEUE_VERSION = existing_clusters.KUEUE_API.split("/")


def discovery(served: tuple[str, ...]) -> dict[str, Any]:
    """``GET /apis``: the ``APIGroupList`` of the served groups (k8s.io/apimachinery
    pkg/apis/meta/v1 types.go APIGroupList / APIGroup / GroupVersionForDiscovery)."""
    groups: dict[str, list[str]] = {}
    for group_version in served:
        group, version = group_version.split("/")
        groups.setdefault(group, []).append(version)
    return {
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": [
            {
                "name": group,
                "versions": [{"groupVersion": f"{group}/{v}", "version": v} for v in versions],
                "preferredVersion": {"groupVersion": f"{group}/{versions[0]}", "version": versions[0]},
            }
            for group, versions in groups.items()
        ],
    }


def local_queue_list(namespace: str, names: list[str]) -> dict[str, Any]:
    """``GET .../namespaces/{ns}/localqueues``: a ``LocalQueueList`` (Kueue v1beta1); the sandbox
    keeps the queues of namespace ``default`` only."""
    items = [
        {
            "apiVersion": existing_clusters.KUEUE_API,
            "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": "cluster-queue"},
        }
        for name in (names if namespace == DEFAULT_NAMESPACE else [])
    ]
    return {
        "apiVersion": existing_clusters.KUEUE_API,
        "kind": "LocalQueueList",
        "items": items,
        "metadata": {},
    }


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "kube-apiserver"
    layout: SandboxLayout
    cluster_key: str
    _raw_body: bytes | None = None

    # -- plumbing -------------------------------------------------------------------------
    def _send_json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache, private")
        self.end_headers()
        self.wfile.write(data)

    def _send_text(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> bytes:
        """The request body (read once, before anything is answered: the connection is kept alive)."""
        cached: bytes | None = getattr(self, "_raw_body", None)
        if cached is None:
            length = int(self.headers.get("Content-Length") or 0)
            cached = self.rfile.read(length) if length else b""
            self._raw_body = cached
        return cached

    def _authorized(self) -> bool:
        if oauth.bearer_valid(self.layout, self.headers.get("Authorization")):
            return True
        self._send_json(401, status_object(401, "Unauthorized", "Unauthorized"))
        return False

    def _store(self) -> StateStore:
        return StateStore(self.layout)

    def _cluster(self) -> dict[str, Any] | None:
        record = self._store().read("clusters").get(self.cluster_key)
        return record if record is not None and record.get("exists", True) else None

    def _jobs(self) -> list[dict[str, Any]]:
        collect_garbage(self._store())
        return sorted(
            cluster_jobs(self._store(), self.cluster_key),
            key=lambda j: (str(j.get("namespace", DEFAULT_NAMESPACE)), str(j["name"])),
        )

    def _find(self, namespace: str, name: str) -> dict[str, Any] | None:
        return next(
            (
                j
                for j in self._jobs()
                if j["name"] == name and j.get("namespace", DEFAULT_NAMESPACE) == namespace
            ),
            None,
        )

    def _route(self, method: str) -> None:
        parsed = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(parsed.query, keep_blank_values=True)
        parts = [urllib.parse.unquote(p) for p in parsed.path.strip("/").split("/")]
        # GKE's autoscaler removes the auto-created pools no pod has used (world/compute_classes.py)
        compute_classes.scale_down(self._store(), self.cluster_key, load_settings(self.layout))
        cluster = self._cluster() or {}
        served = existing_clusters.served_apis(cluster)
        try:
            if parts == ["apis"] and method == "GET":
                self._send_json(200, discovery(served))
            elif parts[:3] == ["apis", JOBSET_GROUP, JOBSET_VERSION]:
                if f"{JOBSET_GROUP}/{JOBSET_VERSION}" not in served:  # no CRD: no such path
                    self._send_text(404, "404 page not found\n")
                    return
                self._jobsets(method, parts[3:], query)
            elif (
                parts[:3] == ["apis", KUEUE_GROUP, KUEUE_VERSION]
                and f"{KUEUE_GROUP}/{KUEUE_VERSION}" in served
                and len(parts) == 6
                and parts[3] == "namespaces"
                and parts[5] == "localqueues"
            ):
                if method != "GET":
                    self._method_not_allowed()
                    return
                self._send_json(200, local_queue_list(parts[4], existing_clusters.local_queues(cluster)))
            elif (
                parts[:2] == ["api", "v1"]
                and len(parts) >= 5
                and parts[2] == "namespaces"
                and parts[4] == "pods"
            ):
                self._pods(method, parts[3], parts[5:], query)
            elif (
                parts[:2] == ["api", "v1"]
                and len(parts) == 5
                and parts[2] == "namespaces"
                and parts[4] == "events"
            ):
                if method != "GET":
                    self._method_not_allowed()
                    return
                items = list_events(
                    self._store(), self.cluster_key, parts[3], (query.get("fieldSelector") or [""])[-1]
                )
                self._send_json(
                    200,
                    {
                        "kind": "EventList",
                        "apiVersion": "v1",
                        "metadata": {"resourceVersion": _resource_version(items)},
                        "items": items,
                    },
                )
            elif (
                parts[:4] == ["apis", compute_classes.GROUP, compute_classes.VERSION, compute_classes.PLURAL]
                and len(parts) in (4, 5)
                and compute_classes.served(cluster)
            ):
                self._compute_classes(method, parts[4:])
            elif parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
                if method != "GET":
                    self._method_not_allowed()
                    return
                node = node_object(self._store(), cluster, parts[3])
                if node is None:
                    raise KubeError(not_found("nodes", parts[3]))
                self._send_json(200, node)
            elif parts == ["api", "v1", "pods"]:
                self._pods(method, None, [], query)  # every namespace's pods (a list only)
            else:
                self._send_text(404, "404 page not found\n")
        except KubeError as error:
            self._send_json(error.code, error.body)

    def _compute_classes(self, method: str, rest: list[str]) -> None:
        """GKE's ComputeClasses (cluster-scoped): create, get, list, delete."""
        store = self._store()
        if method == "POST" and not rest:
            try:
                body = json.loads(self._body() or b"null")
            except ValueError as error:
                raise bad_request(f"error decoding JSON: {error}") from None
            self._send_json(201, create_compute_class(store, self.cluster_key, body))
        elif method == "GET" and rest:
            self._send_json(200, get_compute_class(store, self.cluster_key, rest[0]))
        elif method == "GET":
            items = list_compute_classes(store, self.cluster_key)
            self._send_json(
                200,
                {
                    "apiVersion": compute_classes.API,
                    "kind": "ComputeClassList",
                    "items": items,
                    "metadata": {},
                },
            )
        elif method == "DELETE" and rest:
            self._body()
            self._send_json(200, delete_compute_class(store, self.cluster_key, rest[0]))
        else:
            self._method_not_allowed()

    def _method_not_allowed(self) -> None:
        self._send_json(
            405,
            status_object(
                405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
            ),
        )

    # -- JobSets --------------------------------------------------------------------------
    def _jobsets(self, method: str, rest: list[str], query: Mapping[str, list[str]]) -> None:
        selector = (query.get("labelSelector") or [""])[-1]
        if rest == ["jobsets"] or (len(rest) == 3 and rest[0] == "namespaces" and rest[2] == "jobsets"):
            namespace = rest[1] if len(rest) == 3 else None
            if method == "POST" and namespace is not None:
                self._create(namespace)
                return
            if method != "GET":
                self._method_not_allowed()
                return
            items = [
                jobset_object(j)
                for j in self._jobs()
                if namespace is None or j.get("namespace", DEFAULT_NAMESPACE) == namespace
            ]
            items = [i for i in items if selector_matches(selector, i["metadata"].get("labels") or {})]
            self._send_json(
                200,
                {
                    "apiVersion": JOBSET_API_VERSION,
                    "kind": "JobSetList",
                    "metadata": {"resourceVersion": _resource_version(items)},
                    "items": items,
                },
            )
            return
        if len(rest) == 4 and rest[0] == "namespaces" and rest[2] == "jobsets":
            namespace, name = rest[1], rest[3]
            if method == "PATCH":
                content_type = self.headers.get("Content-Type") or ""
                if content_type.split(";", 1)[0].strip().lower() not in PATCH_TYPES:
                    raise unsupported_media_type()  # checked before the object is looked up
            job = self._find(namespace, name)
            if job is None:
                raise KubeError(not_found("jobsets", name, JOBSET_GROUP))
            if method == "PATCH":
                self._send_json(200, patch_jobset(self._store(), job, content_type, self._body()))
            elif method == "GET":
                self._send_json(200, jobset_object(job))
            elif method == "DELETE":
                self._body()
                delete_jobset(self._store(), job)
                # a custom resource's DELETE answers a Success Status (apiextensions-apiserver)
                self._send_json(
                    200,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Success",
                        "details": {
                            "name": name,
                            "group": JOBSET_GROUP,
                            "kind": "jobsets",
                            "uid": k8s_uid(str(job["uid"])),
                        },
                    },
                )
            else:
                self._method_not_allowed()
            return
        self._send_text(404, "404 page not found\n")

    def _create(self, namespace: str) -> None:
        raw = self._body()
        try:
            body = json.loads(raw or b"null")
        except ValueError as error:
            raise bad_request(f"error decoding JSON: {error}") from None
        cluster = self._cluster()
        if cluster is None:
            self._send_text(503, "service unavailable\n")
            return
        record = create_jobset(self.layout, cluster, namespace, body)
        start_worker(self.layout, record, dict(os.environ))
        self._send_json(201, jobset_object(record))

    # -- pods -----------------------------------------------------------------------------
    def _pods(
        self, method: str, namespace: str | None, rest: list[str], query: Mapping[str, list[str]]
    ) -> None:
        own = standalone_pods(self._store(), self.cluster_key, namespace)
        if method == "POST" and namespace is not None and not rest:
            try:
                body = json.loads(self._body() or b"null")
            except ValueError as error:
                raise bad_request(f"error decoding JSON: {error}") from None
            cluster = self._cluster()
            if cluster is None:
                self._send_text(503, "service unavailable\n")
                return
            self._send_json(
                201,
                create_pod(
                    self._store(), self.cluster_key, cluster, namespace, body, load_settings(self.layout)
                ),
            )
            return
        if method == "DELETE" and namespace is not None and len(rest) == 1:
            self._body()
            deleted = delete_pod(self._store(), self.cluster_key, namespace, rest[0])
            if deleted is None:
                raise KubeError(not_found("pods", rest[0]))
            self._send_json(200, deleted)  # a pod's DELETE answers the pod, now terminating
            return
        if method != "GET":
            self._method_not_allowed()
            return
        if len(rest) == 1 and namespace is not None:
            found_own = next((r for r in own if r["name"] == rest[0]), None)
            if found_own is not None:
                self._send_json(200, standalone_pod_object(found_own))
                return
        pods = [
            (job, pod)
            for job in self._jobs()
            if namespace is None or job.get("namespace", DEFAULT_NAMESPACE) == namespace
            for pod in job.get("pods") or []
        ]
        if not rest:
            selector = (query.get("labelSelector") or [""])[-1]
            items = sorted(
                [*(pod_object(job, pod) for job, pod in pods), *(standalone_pod_object(r) for r in own)],
                key=lambda p: str(p["metadata"]["name"]),
            )
            items = [i for i in items if selector_matches(selector, i["metadata"].get("labels") or {})]
            for item in items:
                item.pop("kind", None)
                item.pop("apiVersion", None)
            self._send_json(
                200,
                {
                    "kind": "PodList",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": _resource_version(items)},
                    "items": items,
                },
            )
            return
        name = rest[0]
        found = next(((job, pod) for job, pod in pods if pod["name"] == name), None)
        if found is None:
            raise KubeError(not_found("pods", name))
        job, pod = found
        if len(rest) == 1:
            self._send_json(200, pod_object(job, pod))
        elif rest[1:] == ["log"]:
            self._log(job, pod, query)
        else:
            self._send_text(404, "404 page not found\n")

    def _log(self, job: dict[str, Any], pod: dict[str, Any], query: Mapping[str, list[str]]) -> None:
        name = str(pod["name"])
        options = LogOptions(name, query)
        init_names = [c["name"] for c in pod.get("init") or []]
        names = [c["name"] for c in pod.get("containers") or []]
        container = options.container
        # pkg/registry/core/pod/strategy.go LogLocation
        if not container:
            if len(names) == 1:
                container = names[0]
            elif not names:
                raise bad_request(f"a container name must be specified for pod {name}")
            else:
                message = (
                    f"a container name must be specified for pod {name}, choose one of: [{' '.join(names)}]"
                )
                if init_names:
                    message += f" or one of the init containers: [{' '.join(init_names)}]"
                raise bad_request(message)
        elif container not in names and container not in init_names:
            raise bad_request(f"container {container} is not valid for pod {name}")
        # pkg/kubelet/kubelet_pods.go validateContainerLogStatus
        state = next(
            c for c in (pod.get("init") or []) + (pod.get("containers") or []) if c["name"] == container
        )
        if options.previous:
            raise bad_request(f'previous terminated container "{container}" in pod "{name}" not found')
        if state.get("state") == "waiting":
            raise bad_request(
                f'container "{container}" in pod "{name}" is waiting to start: {state.get("reason", "ContainerCreating")}'
            )
        path = container_log_path(self.layout, str(job["uid"]), name, container)
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        store = self._store()
        last = {"at": 0.0, "running": True}

        def running() -> bool:
            now = time.monotonic()
            if now - last["at"] >= 0.2:
                last["at"] = now
                current = store.read("jobs").get(str(job["key"]))
                alive = False
                if current is not None and current.get("uid") == job["uid"]:
                    for candidate in current.get("pods") or []:
                        if candidate["name"] == name:
                            containers = (candidate.get("init") or []) + (candidate.get("containers") or [])
                            alive = any(
                                c["name"] == container and c.get("state") != "terminated" for c in containers
                            )
                last["running"] = alive
            return bool(last["running"])

        def emit(data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        try:
            read_log(path, options, running, emit)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            self.close_connection = True

    # -- verbs ----------------------------------------------------------------------------
    def _verb(self, method: str) -> None:
        self._raw_body = None
        self._body()
        if self._authorized():
            self._route(method)

    def do_GET(self) -> None:
        self._verb("GET")

    def do_POST(self) -> None:
        self._verb("POST")

    def do_DELETE(self) -> None:
        self._verb("DELETE")

    def do_PATCH(self) -> None:
        self._verb("PATCH")

    def log_message(self, format: str, *args: Any) -> None:
        sys.stderr.write(f"kube[{self.cluster_key}] {self.address_string()} {format % args}\n")


class _TlsServer(ThreadingHTTPServer):
    """Accepts plain sockets and does each TLS handshake in the request's own thread."""

    daemon_threads = True
    ssl_context: ssl.SSLContext

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            request.settimeout(30)
            tls = self.ssl_context.wrap_socket(request, server_side=True)
            tls.settimeout(None)
        except (ssl.SSLError, OSError):
            self.shutdown_request(request)
            return
        super().process_request_thread(tls, client_address)


class KubeServers:
    """One HTTPS Kubernetes API per existing cluster, inside the API server process."""

    def __init__(self, layout: SandboxLayout) -> None:
        self.layout = layout
        self._servers: dict[str, tuple[_TlsServer, threading.Thread]] = {}
        self._lock = threading.Lock()
        self._context = server_ssl_context(layout)

    def _bind(self, cluster_key: str, preferred: int) -> _TlsServer:
        handler = type("KubeHandler", (_Handler,), {"layout": self.layout, "cluster_key": cluster_key})
        for port in ([preferred] if preferred else []) + [0]:
            try:
                server = _TlsServer(("127.0.0.1", port), handler)
            except OSError:
                continue
            server.ssl_context = self._context
            return server
        raise OSError("no free port")

    def ensure(self, cluster_key: str) -> int:
        """The port of ``cluster_key``'s API (started if needed; the same port as before if free)."""
        with self._lock:
            running = self._servers.get(cluster_key)
            if running is not None:
                return int(running[0].server_address[1])
            store = StateStore(self.layout)
            preferred = int(store.read(KUBE_ENDPOINTS_DOC).get(cluster_key) or 0)
            server = self._bind(cluster_key, preferred)
            thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
            thread.start()
            self._servers[cluster_key] = (server, thread)
            port = int(server.server_address[1])
            with store.txn() as txn:
                txn.doc(KUBE_ENDPOINTS_DOC)[cluster_key] = port
                txn.save(KUBE_ENDPOINTS_DOC)
            return port

    def stop(self, cluster_key: str) -> None:
        with self._lock:
            running = self._servers.pop(cluster_key, None)
        if running is not None:
            running[0].shutdown()
            running[0].server_close()

    def reconcile(self) -> None:
        """Serve every existing cluster; stop serving deleted ones."""
        clusters = StateStore(self.layout).read("clusters")
        live = {key for key, record in clusters.items() if record.get("exists", True)}
        for key in live:
            self.ensure(key)
        for key in [k for k in list(self._servers) if k not in live]:
            self.stop(key)

    def run_reconciler(self, stop: threading.Event, interval: float = 0.5) -> None:
        while not stop.wait(interval):
            with contextlib.suppress(Exception):
                self.reconcile()

    def close(self) -> None:
        for key in list(self._servers):
            self.stop(key)
