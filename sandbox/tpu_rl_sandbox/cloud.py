"""Facts about the fake cloud derived from the shared state (used by both fakes)."""

from __future__ import annotations

import hashlib
import time
from typing import Any

from tpu_rl_sandbox.layout import SandboxLayout
from tpu_rl_sandbox.settings import load_settings
from tpu_rl_sandbox.state import StateStore

WRITE_ROLES = {
    "roles/storage.admin",
    "roles/storage.objectAdmin",
    "roles/storage.objectCreator",
    "roles/storage.objectUser",
    "roles/owner",
    "roles/editor",
}
SECRET_VERSION_STATE = (
    "google.api_core.exceptions.FailedPrecondition: 400 Secret Version "
    "[projects/{number}/secrets/{secret}/versions/{version}] is in {state} state."
)
SECRET_NOT_FOUND = "google.api_core.exceptions.NotFound: 404 Secret [projects/{number}/secrets/{secret}] not found or has no versions."
# Secret Manager's answer to a caller without secretmanager.versions.access on the secret or its
# project, whether or not the secret exists (the API's google.rpc status, as the client libraries
# print it, e.g. googleapis/python-secret-manager#389: "403 Permission
# 'secretmanager.versions.access' denied for resource 'projects/…/versions/1' (or it may not exist).").
SECRET_ACCESS_DENIED = (
    "PERMISSION_DENIED: Permission 'secretmanager.versions.access' denied for resource "
    "'projects/{project}/secrets/{secret}/versions/{version}' (or it may not exist)."
)


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
    versions = list(record.get("versions", []))
    # "latest" is the newest version whatever its state (Secret Manager's alias): a disabled one
    # is refused, never skipped for an older enabled one.
    if version == "latest":
        chosen = versions[-1] if versions else None
    else:
        chosen = next((v for v in versions if str(v.get("version")) == version), None)
    if chosen is None:
        return None, SECRET_NOT_FOUND.format(number=number, secret=secret)
    if chosen.get("state", "ENABLED") != "ENABLED":
        return None, SECRET_VERSION_STATE.format(
            number=number, secret=secret, version=chosen["version"], state=chosen.get("state")
        )
    return placeholder_token(str(chosen["sha256"])), ""


def pod_secret_value(
    store: StateStore, identity: str, project: str, secret: str, version: str
) -> tuple[str | None, str]:
    """:func:`secret_value` as a pod reads it: its identity (:func:`pod_identity`: a service
    account e-mail or a Workload Identity principal) needs ``secretmanager.versions.access`` on the
    secret or its project, granted long enough ago to be in effect (:func:`member_has_permission`),
    else Secret Manager's 403 (:data:`SECRET_ACCESS_DENIED`)."""
    member = identity if identity.startswith("principal://") else f"serviceAccount:{identity}"
    resources = [f"projects/{project}/secrets/{secret}", f"projects/{project}"]
    if not member_has_permission(store, resources, member, "secretmanager.versions.access"):
        return None, SECRET_ACCESS_DENIED.format(project=project, secret=secret, version=version)
    return secret_value(store, project, secret, version)


def node_pool_can_write(store: StateStore, cluster: dict[str, Any]) -> bool:
    """Whether pods (running as the node-pool service account) may create GCS objects."""
    return account_can_write(store, cluster, "node_pool")


def account_can_write(store: StateStore, cluster: dict[str, Any], account: str) -> bool:
    """Whether the cluster's ``account`` (``node_pool`` or ``workload``) may create GCS objects: a
    writing role from its blueprint module, or one bound on the project."""
    granted = cluster.get(f"{account}_roles", [])
    roles = {f"roles/{r}" if not r.startswith("roles/") else r for r in granted}
    if roles & WRITE_ROLES:
        return True
    member = "serviceAccount:" + cluster.get("service_accounts", {}).get(account, "")
    bindings = store.read("iam").get("project_bindings", {}).get(cluster.get("project", ""), {})
    return any(member in bindings.get(role, []) for role in WRITE_ROLES)


def pod_identity(cluster: dict[str, Any], job: dict[str, Any]) -> tuple[str, str | None]:
    """Who a job's program is to Google APIs, and which of the cluster's accounts that is.

    TPU pods use the host network, so the node's service account (the TPU pool's); other pods
    get Workload Identity (the cluster's node pools run GKE_METADATA): their Kubernetes service
    account's Google service account, which only ``configure_workload_identity_sa``'s
    ``workload-identity-k8s-sa`` has (bound to the workload account); any other is the bare
    Workload Identity principal, with no role.
    """
    accounts = cluster.get("service_accounts", {})
    if job.get("tpu"):
        return accounts.get("node_pool", ""), "node_pool"
    ksa = str(job.get("service_account") or "default")
    if ksa == cluster.get("workload_identity_ksa"):
        return accounts.get("workload", ""), "workload"
    project = cluster.get("project", "")
    return (
        f"principal://iam.googleapis.com/projects/{project_number(project)}/locations/global/workloadIdentityPools/{project}.svc.id.goog/subject/ns/default/sa/{ksa}",
        None,
    )


# ====================================================================================== IAM
# The conditional binding a project's policy holds when ``settings.conditional_bindings`` is on
# (what makes gcloud refuse a binding without ``--condition`` in non-interactive mode).
PROJECT_CONDITIONAL_BINDING: dict[str, Any] = {
    "role": "roles/compute.viewer",
    "members": ["group:sandbox-auditors@example.com"],
    "condition": {
        "title": "until-2030",
        "expression": 'request.time < timestamp("2030-01-01T00:00:00Z")',
    },
}
# Predefined roles that hold a permission (the subset the fakes check), from Google's IAM roles
# reference: roles/editor has the storage object permissions but not secretmanager.versions.access.
PERMISSION_ROLES: dict[str, frozenset[str]] = {
    "secretmanager.versions.access": frozenset(
        {"roles/secretmanager.secretAccessor", "roles/secretmanager.admin", "roles/owner"}
    ),
    "storage.objects.create": frozenset(WRITE_ROLES),
    "storage.objects.delete": frozenset(
        {
            "roles/storage.admin",
            "roles/storage.objectAdmin",
            "roles/storage.objectUser",
            "roles/owner",
            "roles/editor",
        }
    ),
}


def parse_iam_resource(resource: str) -> tuple[str, str, str]:
    """``"projects/P"`` -> ``("project", "P", "")``, ``"projects/P/secrets/S"`` ->
    ``("secret", "P", "S")``, ``"b/BUCKET"`` -> ``("bucket", "", "BUCKET")``."""
    parts = resource.strip("/").split("/")
    if len(parts) == 2 and parts[0] == "projects":
        return "project", parts[1], ""
    if len(parts) == 4 and parts[0] == "projects" and parts[2] == "secrets":
        return "secret", parts[1], parts[3]
    if len(parts) == 2 and parts[0] == "b":
        return "bucket", "", parts[1]
    raise ValueError(f"unknown IAM resource {resource!r}: use projects/P, projects/P/secrets/S or b/BUCKET")


def policy_from_docs(
    docs: dict[str, dict[str, Any]], resource: str, conditional_project: bool
) -> tuple[dict[str, list[str]], list[dict[str, Any]]]:
    """``(unconditional role -> members, conditional bindings)`` of ``resource`` from the state
    documents ``iam``, ``secrets`` and ``buckets`` (copies; no lock taken here)."""
    kind, project, name = parse_iam_resource(resource)
    if kind == "project":
        iam = docs.get("iam", {})
        plain = iam.get("project_bindings", {}).get(project, {})
        conditional = list(iam.get("project_conditional", {}).get(project, []))
        if conditional_project:
            conditional.insert(0, PROJECT_CONDITIONAL_BINDING)
    else:
        record = (
            docs.get("secrets", {}).get(f"{project}/{name}")
            if kind == "secret"
            else docs.get("buckets", {}).get(name)
        ) or {}
        plain = record.get("bindings", {})
        conditional = list(record.get("conditional_bindings", []))
    return (
        {role: list(members) for role, members in plain.items()},
        [
            {"role": b["role"], "members": list(b["members"]), "condition": dict(b["condition"])}
            for b in conditional
        ],
    )


def iam_bindings(layout: SandboxLayout, resource: str) -> dict[str, list[str]]:
    """The unconditional bindings (role -> members) of an IAM policy in the sandbox.

    ``resource`` is ``"projects/P"`` (the project's policy), ``"projects/P/secrets/S"`` (a Secret
    Manager secret) or ``"b/BUCKET"`` (a bucket). Conditional bindings grant nothing
    unconditionally and are left out (:func:`iam_policy` has them).
    """
    return iam_policy(layout, resource)[0]


def iam_policy(layout: SandboxLayout, resource: str) -> tuple[dict[str, list[str]], list[dict[str, Any]]]:
    """``(unconditional role -> members, conditional bindings)`` of ``resource``."""
    settings = load_settings(layout)
    with StateStore(layout).txn() as txn:
        docs = {name: txn.doc(name) for name in ("iam", "secrets", "buckets")}
        return policy_from_docs(docs, resource, settings.conditional_bindings)


def member_has_permission(store: StateStore, resources: list[str], member: str, permission: str) -> bool:
    """Whether ``member`` holds a role with ``permission`` on any of ``resources`` (a resource and
    its ancestors, e.g. a secret and its project), unconditionally and in effect now: a binding
    with a recorded grant time counts only once ``iam_propagation_seconds`` have passed since it
    was added (IAM is eventually consistent: "Changes to allow or deny policies typically
    propagate in 2 minutes, but could potentially take 7 minutes or longer", Google Cloud IAM docs,
    "Access change propagation"). Only a secret's bindings carry a grant time
    (``gcloud secrets add-iam-policy-binding``), the grant a workload uses right after it is made."""
    roles = PERMISSION_ROLES[permission]
    delay = load_settings(store.layout).iam_propagation_seconds
    now = time.time()
    with store.txn() as txn:
        docs = {name: txn.doc(name) for name in ("iam", "secrets", "buckets")}
        for resource in resources:
            plain, _ = policy_from_docs(docs, resource, conditional_project=False)
            granted_at = grant_times(docs, resource)
            for role in roles:
                if member in plain.get(role, []) and now >= granted_at.get(role, {}).get(member, 0.0) + delay:
                    return True
    return False


def grant_times(docs: dict[str, dict[str, Any]], resource: str) -> dict[str, dict[str, float]]:
    """``role -> member -> time.time()`` of the bindings of ``resource`` whose grant time was
    recorded (a secret's, see :data:`GRANTED_AT`); the others have been in effect all along."""
    kind, project, name = parse_iam_resource(resource)
    if kind != "secret":
        return {}
    record = docs.get("secrets", {}).get(f"{project}/{name}") or {}
    return {role: dict(members) for role, members in (record.get(GRANTED_AT) or {}).items()}


# The key of a secret record that holds when each unconditional binding was added.
GRANTED_AT = "granted_at"


def bucket_project(store: StateStore, bucket: str) -> str | None:
    """The project a bucket was created in (``gcloud storage buckets create``), if known."""
    record = store.read("buckets").get(bucket)
    return None if record is None else record.get("project")


def gke_node_pools(record: dict[str, Any]) -> list[dict[str, Any]]:
    """container v1 ``NodePool`` resources (JSON, camelCase) of a fake cluster record."""
    return [
        {
            "name": pool["name"],
            "config": {
                "machineType": pool["machine_type"],
                "serviceAccount": pool.get("service_account", ""),
            },
            "initialNodeCount": pool.get("nodes", 1),
            "status": ("ERROR" if pool.get("failed") else "RUNNING"),
            **(
                {"placementPolicy": {"tpuTopology": pool["topology"], "type": "COMPACT"}}
                if pool.get("topology")
                else {}
            ),
        }
        for pool in record.get("node_pools", [])
    ]
