"""Facts about the fake cloud derived from the shared state (used by both fakes)."""

from __future__ import annotations

import hashlib
from typing import Any

from tpu_rl_sandbox.state import StateStore

WRITE_ROLES = {
    "roles/storage.admin",
    "roles/storage.objectAdmin",
    "roles/storage.objectCreator",
    "roles/storage.objectUser",
    "roles/owner",
    "roles/editor",
}
SECRET_NOT_FOUND = "google.api_core.exceptions.NotFound: 404 Secret [projects/{number}/secrets/{secret}] not found or has no versions."


def placeholder_token(sha256: str) -> str:
    """What a secret "contains" inside the sandbox: a stand-in derived from its hash."""
    return "hf_sandbox_" + hashlib.sha256(sha256.encode()).hexdigest()[:24]


def project_number(project: str) -> str:
    """A stable 12-digit project number for ``project``."""
    return str(100_000_000_000 + int(hashlib.sha256(project.encode()).hexdigest()[:10], 16) % 900_000_000_000)


def cluster_key(project: str, region: str, name: str) -> str:
    return f"{project}/{region}/{name}"


def job_key(project: str, location: str, cluster: str, name: str) -> str:
    return f"{project}/{location}/{cluster}/{name}"


def cluster_service_accounts(project: str, deployment: str) -> dict[str, str]:
    """E-mails of the service accounts the GKE blueprint creates (``<name>-gke-np-sa`` etc.)."""
    return {
        "node_pool": f"{deployment}-gke-np-sa@{project}.iam.gserviceaccount.com",
        "workload": f"{deployment}-gke-wl-sa@{project}.iam.gserviceaccount.com",
    }


def find_cluster(store: StateStore, project: str, location: str, name: str) -> dict[str, Any] | None:
    """The cluster with ``name`` in ``project`` whose location (region) is ``location``."""
    clusters = store.read("clusters")
    found = clusters.get(cluster_key(project, location, name))
    if found is not None and found.get("exists", True):
        return found
    return None


def secret_value(store: StateStore, project: str, secret: str, version: str) -> tuple[str | None, str]:
    """``(stand-in value, "")`` for an enabled secret version, else ``(None, error text)``."""
    secrets = store.read("secrets")
    record = secrets.get(f"{project}/{secret}")
    number = project_number(project)
    if record is None:
        return None, SECRET_NOT_FOUND.format(number=number, secret=secret)
    versions = [v for v in record.get("versions", []) if v.get("state") == "ENABLED"]
    if version == "latest":
        chosen = versions[-1] if versions else None
    else:
        chosen = next((v for v in versions if str(v.get("version")) == version), None)
    if chosen is None:
        return None, SECRET_NOT_FOUND.format(number=number, secret=secret)
    return placeholder_token(str(chosen["sha256"])), ""


def node_pool_can_write(store: StateStore, cluster: dict[str, Any]) -> bool:
    """Whether pods (running as the node-pool service account) may create GCS objects."""
    roles = {f"roles/{r}" if not r.startswith("roles/") else r for r in cluster.get("node_pool_roles", [])}
    if roles & WRITE_ROLES:
        return True
    member = "serviceAccount:" + cluster.get("service_accounts", {}).get("node_pool", "")
    bindings = store.read("iam").get("project_bindings", {}).get(cluster.get("project", ""), {})
    return any(member in bindings.get(role, []) for role in WRITE_ROLES)
